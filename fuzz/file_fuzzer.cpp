// libFuzzer target: the files a user hands polytile. The first byte picks the reader and the rest is the
// file: a .npy array (parse_npy), an .npz archive (read_npz, through a temporary file, as the CLI reads
// one), or a kernel bundle's manifest (KernelBundle::parse, as polytile-run-bundle reads one, then its
// input checks on the inputs it declares). Each either reads or is a UserError; what reads must write back
// to what reads the same (format_npy, manifest()). Anything else (a crash, another exception, a
// round trip that differs) aborts, and libFuzzer keeps the input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "npz.h"
#include "polytile/cuda_runtime.h"
#include "polytile/error.h"
#include "polytile/npy.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

void npy(const std::string& bytes) {
  polytile::Buffer b;
  try {
    b = polytile::parse_npy(bytes, "fuzz.npy");
  } catch (const polytile::UserError&) {
    return;
  }
  const std::string written = polytile::format_npy(b);
  polytile::Buffer back = polytile::parse_npy(written, "written.npy");  // a UserError here is a bug: it aborts
  if (polytile::format_npy(back) != written) fail("format_npy(parse_npy(format_npy(b))) != format_npy(b)");
}

void npz(const std::string& bytes) {
  static const std::string path = "/tmp/polytile-file-fuzzer-" + std::to_string(getpid()) + ".npz";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  try {
    polytile::read_npz(path);
  } catch (const polytile::UserError&) {
  }
  std::remove(path.c_str());
}

void manifest(const std::string& text) {
  polytile::cuda::KernelBundle b;
  try {
    b = polytile::cuda::KernelBundle::parse(text, "", "fuzz/manifest.txt");
  } catch (const polytile::UserError&) {
    return;
  }
  const std::string written = b.manifest();
  polytile::cuda::KernelBundle back = polytile::cuda::KernelBundle::parse(written, "", "written/manifest.txt");
  if (back.manifest() != written) fail("manifest(parse(manifest(b))) != manifest(b):\n" + written);
  // The inputs it declares, with their dtypes and shapes (up to 4096 elements, to stay small), pass its
  // checks; one with a dim changed does not.
  polytile::TensorMap inputs;
  for (const auto& buffer : b.buffers) {
    if (buffer.role != polytile::cuda::BundleBuffer::Role::input) continue;
    int64_t n = 1;
    for (int64_t d : buffer.type.shape) n = d > 0 && n <= 4096 / d ? n * d : (d == 0 ? 0 : 4097);
    if (n > 4096) return;
    inputs.emplace(buffer.name, polytile::Buffer(buffer.type.dtype, buffer.type.shape));
  }
  b.check_inputs(inputs);  // a UserError here is a bug: it aborts
  for (const auto& [name, value] : inputs) {
    if (value.shape().empty()) continue;
    std::vector<int64_t> other = value.shape();
    other[0] += 1;
    try {
      b.check_input(name, polytile::Buffer(value.dtype(), other));
    } catch (const polytile::UserError&) {
      continue;
    }
    fail("input " + name + " of another shape passed the bundle's checks");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: npy(bytes); break;
      case 1: npz(bytes); break;
      default: manifest(bytes); break;
    }
  } catch (const std::exception& e) {
    fail(std::string("not a user error: ") + e.what());
  }
  return 0;
}
