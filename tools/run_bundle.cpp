// polytile-run-bundle: runs a kernel bundle on the GPU with .npy inputs and outputs. It links only the
// front end and the CUDA runtime, so it builds on a GPU machine without LLVM, isl or NTL
// (-DPOLYTILE_RUNTIME_ONLY=ON).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "polytile/cuda_runtime.h"
#include "polytile/error.h"
#include "polytile/npy.h"

namespace {

const char* kUsage =
    "usage: polytile-run-bundle DIR [--input NAME=FILE.npy]... [--output NAME=FILE.npy]...\n"
    "                           [--expect NAME=FILE.npy]... [--tolerance REL] [--poison] [--repeat N]\n"
    "       polytile-run-bundle --status\n"
    "\n"
    "Runs the kernel bundle in DIR (manifest.txt and kernels.ptx) on GPU 0: every input buffer from its .npy\n"
    "file, outputs written where --output says (others are summarized), the kernels' time measured with\n"
    "CUDA events (the median and the best of --repeat launches; the bundle is loaded once).\n"
    "  --expect NAME=FILE.npy  compare output NAME with FILE: ||out - expected|| / ||expected|| (2-norms)\n"
    "                          must be at most --tolerance (default 1e-5; integers and bools must be equal),\n"
    "                          and NaN only where FILE has NaN; exit 1 otherwise\n"
    "  --poison                fill outputs and scratch with NaN bytes (0xff) before every launch instead of\n"
    "                          zeros, so that an element no kernel writes fails --expect\n"
    "--status says in one line whether this machine can run bundles (exit 0) or why not (exit 1): no driver\n"
    "library, the toolkit's stub library, no device.\n";

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
  TensorMap inputs, expected;
  std::vector<std::pair<std::string, std::string>> outputs;
  int repeat = 1;
  double tolerance = 1e-5;
  bool poison = false;
  for (size_t k = 1; k < args.size(); ++k) {
    const std::string& a = args[k];
    if (a == "--poison") {
      poison = true;
      continue;
    }
    // The option's value, asked for only once the option is known (an unknown last option is named as such).
    auto value = [&]() -> const std::string& {
      if (k + 1 >= args.size()) user_error(a, " needs a value");
      return args[++k];
    };
    if (a == "--input") {
      auto [name, file] = name_and_file(value(), "--input");
      inputs[name] = read_npy(file);
    } else if (a == "--output") {
      outputs.push_back(name_and_file(value(), "--output"));
    } else if (a == "--expect") {
      auto [name, file] = name_and_file(value(), "--expect");
      expected[name] = read_npy(file);
    } else if (a == "--tolerance") {
      char* end = nullptr;
      const std::string& v = value();
      tolerance = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(tolerance >= 0)) user_error("--tolerance expects a number >= 0, not '", v, "'");
    } else if (a == "--repeat") {
      char* end = nullptr;
      const std::string& v = value();
      const long count = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || count < 1 || count > 100000) user_error("--repeat expects a count from 1 to 100000, not '", v, "'");
      repeat = static_cast<int>(count);
    } else {
      user_error("unknown option ", a, " (see --help)");
    }
  }
  cuda::KernelBundle bundle = cuda::KernelBundle::read(dir);
  for (const auto& [name, file] : outputs) bundle.buffer(name, cuda::BundleBuffer::Role::output);
  for (const auto& [name, want] : expected) {
    const TensorType& type = bundle.buffer(name, cuda::BundleBuffer::Role::output).type;
    if (want.dtype() != type.dtype || want.shape() != type.shape)
      user_error("--expect ", name, ": the output is ", type.str(), ", the file holds ", TensorType{want.dtype(), want.shape()}.str());
  }
  for (const auto& b : bundle.buffers)
    if (b.role == cuda::BundleBuffer::Role::input && !inputs.count(b.name))
      user_error("missing input ", b.name, " (", b.type.str(), "): give --input ", b.name, "=FILE.npy");
  bundle.check_inputs(inputs);
  cuda::Runner runner;
  std::cerr << runner.status().line << "\n";
  std::unique_ptr<cuda::LoadedBundle> loaded = runner.load(bundle);
  for (const auto& [name, value] : inputs) loaded->upload(name, value);
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    loaded->fill(poison ? 0xff : 0);
    times.push_back(loaded->launch());
  }
  TensorMap result;
  for (const auto& b : bundle.buffers)
    if (b.role == cuda::BundleBuffer::Role::output) result[b.name] = loaded->download(b.name);
  for (const auto& [name, file] : outputs) write_npy(file, result.at(name));
  for (const auto& [name, b] : result) std::cout << name << ": " << TensorType{b.dtype(), b.shape()}.str() << "\n";
  std::sort(times.begin(), times.end());
  std::cerr << "kernels: median " << times[times.size() / 2] << " ms, best " << times.front() << " ms (" << repeat
            << " launch" << (repeat == 1 ? "" : "es") << ")\n";
  bool ok = true;
  for (const auto& [name, want] : expected) {
    const Buffer& got = result.at(name);
    const Difference d = difference(got, want);
    const bool pass = d.within(tolerance);
    ok &= pass;
    std::cout << (pass ? "ok   " : "FAIL ") << name << ": relative error " << d.relative << " (tolerance " << tolerance << ")";
    if (d.unexpected_nan) std::cout << ", " << d.unexpected_nan << " of " << got.size() << " elements NaN (not written?)";
    std::cout << "\n";
  }
  return ok ? 0 : 1;
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
