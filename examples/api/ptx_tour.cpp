// The GPU back end without a GPU: compile a convolution for sm_90 into a kernel bundle (PTX and a
// manifest), check its kernels with GPU semantics on this CPU against the interpreter, assemble the PTX
// with ptxas when the CUDA toolkit is here, and run the bundle on the GPU when there is one.
#include <polytile/cpu.h>
#include <polytile/cuda_runtime.h>
#include <polytile/interpreter.h>
#include <polytile/parser.h>
#include <polytile/ptx.h>

#include <cmath>
#include <iostream>

using namespace polytile;

int main() {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }");
  std::map<std::string, TensorType> types{{"I", {DType::f32, {2, 9, 9, 5}}}, {"K", {DType::f32, {2, 2, 5, 7}}}};

  ptx::Options options;
  options.arch = "sm_90";
  ptx::Compiled compiled = ptx::compile(conv, types, options);
  std::cout << compiled.bundle.manifest();  // buffers and kernels with their grids and blocks

  // The same kernels compiled for this CPU, each block's threads run in turn: the mapping is checked here.
  TensorMap inputs;
  for (const auto& [name, t] : types) {
    Buffer b(t.dtype, t.shape);
    for (int64_t e = 0; e < b.size(); ++e) b.set(e, std::sin(0.1 * static_cast<double>(e)));
    inputs[name] = b;
  }
  cpu::CompileOptions gpu_semantics;
  gpu_semantics.target = sched::gpu_target("sm_90");
  Buffer want = interpret(conv, inputs).at("O"), got = cpu::run(conv, inputs, gpu_semantics).at("O");
  double worst = 0;
  for (int64_t e = 0; e < want.size(); ++e) worst = std::max(worst, std::fabs(want.get(e) - got.get(e)));
  std::cout << "GPU semantics on the host: largest difference from the interpreter " << worst << "\n";

  if (ptx::find_ptxas()) {
    for (const auto& k : ptx::assemble(compiled.bundle.ptx, options.arch).kernels)
      std::cout << "ptxas: " << k.name << " uses " << k.registers << " registers, spills " << k.spill_stores << " bytes\n";
  }
  cuda::DriverStatus status = cuda::driver_status();
  std::cout << status.line << "\n";
  if (status.state == cuda::DriverStatus::State::ready) {
    cuda::Runner gpu;
    Buffer on_gpu = gpu.run(compiled.bundle, inputs).at("O");
    for (int64_t e = 0; e < want.size(); ++e) worst = std::max(worst, std::fabs(want.get(e) - on_gpu.get(e)));
    std::cout << "on the GPU: largest difference from the interpreter " << worst << "\n";
    // Tuning: the kernels of each candidate GPU model timed on this GPU, the fastest kept.
    ptx::Tuned tuned = ptx::tune(conv, types, options, [&](const ptx::Compiled& c) {
      double kernel_ms = 0;
      gpu.run(c.bundle, inputs, &kernel_ms);
      return kernel_ms;
    });
    std::cout << "tuned: kept " << tuned.candidates.front().first << ", " << tuned.candidates.front().second << " ms\n";
  }
  return worst < 1e-4 ? 0 : 1;
}
