// Replays inputs through a libFuzzer target without libFuzzer, so that an ordinary build (any compiler)
// runs a fuzzer's checks on its corpus as a test:
//   REPLAY [--prefix N] FILE...     each FILE's bytes, after the byte N where --prefix came before it
// The target aborts on a finding; the replay says which file it was reading first.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::string prefix;
  int replayed = 0;
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg == "--prefix" && k + 1 < argc) {
      prefix = std::string(1, static_cast<char>(std::atoi(argv[++k])));
      continue;
    }
    std::ifstream in(arg, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", arg.c_str());
      return 2;
    }
    const std::string bytes = prefix + std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s\n", arg.c_str());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++replayed;
  }
  std::printf("replayed %d inputs\n", replayed);
  return replayed > 0 ? 0 : 2;
}
