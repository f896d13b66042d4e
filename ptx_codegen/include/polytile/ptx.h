// The PTX code generator: Program -> the lowering pipeline with a GPU target (sched::gpu_target: kernels
// with block and thread bands) -> LLVM IR kernels (llvm_ir::emit_kernel), each in a module of its own,
// compiled on its own thread while the next nests are scheduled -> libdevice linked for the math (only
// the functions used), nvvm-reflect with IEEE settings (no flush to zero, precise division and square
// root, since the interpreter is the oracle) -> LLVM's NVPTX back end -> the kernels' PTX joined into one
// module -> a kernel bundle (polytile/cuda_runtime.h) that polytile-run-bundle or cuda::Runner runs. LLVM stays inside
// this library; nothing here needs a GPU or the CUDA driver. ptxas from the CUDA toolkit, where present,
// assembles the PTX and reports registers, spills and shared memory per kernel; compile runs it on each
// kernel to give one that spills a register ceiling (sched::GpuModel::fit_registers).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "polytile/cuda_runtime.h"
#include "polytile/ir.h"
#include "polytile/scheduler.h"
#include "polytile/shapes.h"

namespace polytile::ptx {

struct Options {
  std::string arch = "sm_90";  // sm_75 and later
  bool reduce_and_defract = true;
  bool verify = false;         // prove every rewriting pass (see cpu::CompileOptions::verify)
  // libdevice.10.bc; empty: find_libdevice(). Needed only by programs that call math functions.
  std::string libdevice;
  // The GPU model's sizes (threads per block, register tile); the defaults of sched::GpuModel otherwise.
  std::optional<sched::GpuModel> model;
};

struct KernelResources {
  std::string name;
  int registers = 0;
  int64_t spill_stores = 0, spill_loads = 0;  // bytes
  int64_t shared_bytes = 0, stack_bytes = 0;
  // The register ceiling compile gave the kernel (sched::GpuModel::fit_registers) as the blocks per
  // multiprocessor it asked ptxas for (`.minnctapersm`); 0: none, ptxas's own choice.
  int min_blocks_per_sm = 0;
};

struct Compiled {
  cuda::KernelBundle bundle;  // PTX and manifest: what runs
  Program program;            // after the passes
  ProgramTypes types;
  sched::Schedule schedule;   // one nest per kernel, in launch order
  std::string llvm_ir;        // the optimized modules, one per kernel in launch order, before PTX (deterministic)
  double seconds = 0;         // text to PTX: passes, schedule, LLVM (and ptxas where it fits registers)
  // ptxas's report of each kernel in launch order, where compile assembled them (the toolkit's ptxas was
  // found and the model fits registers, sched::GpuModel::fit_registers); empty otherwise.
  std::vector<KernelResources> resources;
};

// UserError for what the inputs make impossible (as cpu::compile), a target that is not sm_XY >= 75,
// and a program that calls a math function when no libdevice can be found (naming where it looked).
Compiled compile(const Program& program, const std::map<std::string, TensorType>& inputs, const Options& options = {});

// Tuning on a GPU (see sched::gpu_tuning_candidates).
struct Tuned {
  Compiled best;                                           // compiled with the fastest candidate
  std::vector<std::pair<std::string, double>> candidates;  // description and milliseconds, the winner first
};

// Compiles `program` with each of sched::gpu_tuning_candidates(options.model) and keeps the one `measure` finds
// fastest (the milliseconds of its kernels, e.g. cuda::LoadedBundle::launch's best on the GPU; a tie
// keeps the earlier candidate, the base first). `progress` is called after each measurement.
Tuned tune(const Program& program, const std::map<std::string, TensorType>& inputs, const Options& options,
           const std::function<double(const Compiled&)>& measure,
           const std::function<void(const std::string& candidate, double ms)>& progress = {});

// libdevice.10.bc: `configured` if not empty, else $POLYTILE_LIBDEVICE, $CUDA_PATH/nvvm/libdevice, the CUDA
// toolkit found when polytile was built, /usr/local/cuda. nullopt when none exists; `looked` receives the
// places tried.
std::optional<std::string> find_libdevice(const std::string& configured = "", std::vector<std::string>* looked = nullptr);

// ptxas of the CUDA toolkit ($CUDA_PATH/bin, the toolkit found at build time, /usr/local/cuda/bin, PATH).
std::optional<std::string> find_ptxas();

struct Assembled {
  std::string arch;
  std::vector<KernelResources> kernels;  // in the order ptxas reports them
  std::string log;                       // ptxas -v's output
};

// Assembles `ptx` for `arch` with `ptxas -v` and reads what it reports per kernel. UserError with ptxas's
// log when it rejects the PTX, or when no ptxas can be found.
Assembled assemble(const std::string& ptx, const std::string& arch);

}  // namespace polytile::ptx
