// polytile-run-bundle: runs a kernel bundle on the GPU with .npy inputs and outputs. It links only the
// front end and the CUDA runtime, so it builds on a GPU machine without LLVM, isl or NTL
// (-DPOLYTILE_RUNTIME_ONLY=ON).
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "polytile/cuda_runtime.h"
#include "polytile/error.h"
#include "polytile/npy.h"

namespace {

const char* kUsage =
    "usage: polytile-run-bundle DIR [--input NAME=FILE.npy]... [--output NAME=FILE.npy]... [--repeat N]\n"
    "       polytile-run-bundle --status\n"
    "\n"
    "Runs the kernel bundle in DIR (manifest.txt and kernels.ptx) on GPU 0: every input buffer from its .npy\n"
    "file, outputs written where --output says (others are summarized), the kernels' time measured with\n"
    "CUDA events (the best of --repeat runs). --status says in one line whether this machine can run\n"
    "bundles (exit 0) or why not (exit 1): no driver library, the toolkit's stub library, no device.\n";

std::pair<std::string, std::string> name_and_file(const std::string& arg, const char* flag) {
  size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size()) polytile::user_error(flag, " expects NAME=FILE.npy, not '", arg, "'");
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

int run(const std::vector<std::string>& args) {
  using namespace polytile;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 1 : 0;
  }
  if (args[0] == "--status") {
    cuda::DriverStatus s = cuda::driver_status();
    std::cout << s.line << "\n";
    return s.state == cuda::DriverStatus::State::ready ? 0 : 1;
  }
  std::string dir = args[0];
  TensorMap inputs;
  std::vector<std::pair<std::string, std::string>> outputs;
  int repeat = 1;
  for (size_t k = 1; k < args.size(); ++k) {
    const std::string& a = args[k];
    if (k + 1 >= args.size()) user_error(a, " needs a value");
    if (a == "--input") {
      auto [name, file] = name_and_file(args[++k], "--input");
      inputs[name] = read_npy(file);
    } else if (a == "--output") {
      outputs.push_back(name_and_file(args[++k], "--output"));
    } else if (a == "--repeat") {
      repeat = std::atoi(args[++k].c_str());
      if (repeat < 1 || repeat > 100000) user_error("--repeat expects a count from 1 to 100000");
    } else {
      user_error("unknown option ", a, " (see --help)");
    }
  }
  cuda::KernelBundle bundle = cuda::KernelBundle::read(dir);
  cuda::Runner runner;
  std::cerr << runner.status().line << "\n";
  TensorMap result;
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    double ms = 0;
    result = runner.run(bundle, inputs, &ms);
    best = std::min(best, ms);
  }
  for (const auto& [name, file] : outputs) {
    auto it = result.find(name);
    if (it == result.end()) user_error("the bundle has no output ", name);
    write_npy(file, it->second);
  }
  for (const auto& [name, b] : result) std::cout << name << ": " << TensorType{b.dtype(), b.shape()}.str() << "\n";
  std::cerr << "kernels: " << best << " ms (best of " << repeat << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const polytile::UserError& e) {
    std::cerr << "polytile-run-bundle: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "polytile-run-bundle: internal error: " << e.what() << "\n";
    return 2;
  }
}
