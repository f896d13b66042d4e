// What the host backend's two halves share: the JIT runtime (cpu.cpp) and ahead-of-time export
// (export.cpp) lower, emit and optimize a program the same way; only what happens to the machine code
// differs. Private to cpu_codegen/.
#pragma once

#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Target/TargetMachine.h>
#include <tbb/task_arena.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "polytile/cpu.h"
#include "polytile/error.h"

namespace polytile::cpu {

// A nest's function: void nest_<k>(ptr buffers, i64 lo, i64 hi) (llvm_ir.h).
using NestFn = void (*)(char**, int64_t, int64_t);

// Things a run needs and gives back for the next one (scratch tensors, workspaces): reused memory needs
// no page faults. take() gives a kept one or a default-constructed one; safe from concurrent runs.
template <typename T>
class ReusePool {
 public:
  T take() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (items_.empty()) return T{};
    T item = std::move(items_.back());
    items_.pop_back();
    return item;
  }
  void give(T item) const {
    std::lock_guard<std::mutex> lock(mutex_);
    items_.push_back(std::move(item));
  }

 private:
  mutable std::mutex mutex_;
  mutable std::vector<T> items_;
};

// Whether a nest's outermost loop is split across threads: provably parallel, with more than one iteration
// ([outer_lo, outer_hi], inclusive). The JIT runtime and exported entry points split the same nests.
inline bool splits_outer_loop(const sched::Nest& nest) { return nest.parallel_outer && nest.outer_hi > nest.outer_lo; }

// The buffer of `outputs` a run writes its output `name` into in place: one already there of exactly the
// compiled type (every element is written), else null (the run allocates one).
inline Buffer* reusable_output(TensorMap& outputs, const std::string& name, const TensorType& type) {
  auto it = outputs.find(name);
  return it != outputs.end() && it->second.dtype() == type.dtype && it->second.shape() == type.shape ? &it->second : nullptr;
}

// The input `name` of a compiled program: in `inputs`, of exactly the compiled type (UserError otherwise).
inline const Buffer& compiled_input(const TensorMap& inputs, const std::string& name, const TensorType& type) {
  auto it = inputs.find(name);
  if (it == inputs.end()) user_error("missing input ", name);
  if (it->second.dtype() != type.dtype || it->second.shape() != type.shape)
    user_error("input ", name, " is ", it->second.type_str(), " but the program was compiled for ", type.str());
  return it->second;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A row group's chunk tensor (sched::ChunkTensor) as the runtimes place it: its slot in the buffer table,
// its bytes per outer iteration, and its offset in a chunk's memory (each tensor rows x row_bytes, 64-byte
// aligned). Before running the group's nests on chunk [c, ...), a runtime points the slot at its chunk
// memory + offset - (c - outer_lo) x row_bytes: the nests' addresses of rows c... land in that memory.
struct ChunkSlot {
  size_t slot = 0;
  int64_t row_bytes = 0, offset = 0;
};

// A row group's chunk slots and the memory one chunk needs for them (made by lower_and_emit).
struct GroupChunks {
  std::vector<ChunkSlot> slots;
  int64_t bytes = 0;
};

struct CompiledProgram::Impl {
  Program program;
  ProgramTypes types;
  std::map<std::string, TensorType> inputs;
  sched::Schedule schedule;
  // The optimized modules, printed: by the compile that made them (optimized_llvm_ir, tuning), else on
  // the first llvm_ir() call, which lowers and optimizes `source` again with `options` (the same
  // modules: both are deterministic) -- printing each module as it was compiled cost a compile about 2%
  // of its instructions, most of them in the last modules, after scheduling, for text few callers read.
  std::string ir;
  std::once_flag ir_once;
  bool ir_made = false;
  Program source;
  CompileOptions options;
  CompileTimes times;
  TuningReport tuning;
  std::vector<std::string> buffers;  // index -> tensor
  std::set<std::string> touched;     // tensors some nest reads or writes
  std::vector<GroupChunks> chunks;   // per row group (Schedule::groups), its chunk tensors' places
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::vector<NestFn> nests;
  int threads = 1;
  // The TBB arena of `threads` in which every run's parallel loops run, made with the program. It limits
  // polytile's runs alone: the process-wide global_control limit it replaces also held the embedding
  // application's own TBB work to `threads` while a run was in flight. (The same speed in the bench's
  // memory-bound cases and the small CNN's step, interleaved.)
  std::unique_ptr<tbb::task_arena> arena;
  // Scratch tensors (written and read by nests, not outputs) of finished runs, one set per run that was
  // in flight at once: a run takes a set, or allocates one, and gives it back. Reused memory needs no
  // zeroing either (every nest writes all of its tensor's elements before any read).
  ReusePool<TensorMap> scratch_pool;
};

template <typename T>
T check(llvm::Expected<T> v, const std::string& what) {
  if (!v) throw InternalError("LLVM failed while " + what + ": " + llvm::toString(v.takeError()));
  return std::move(*v);
}

inline void check(llvm::Error e, const std::string& what) {
  if (e) throw InternalError("LLVM failed while " + what + ": " + llvm::toString(std::move(e)));
}

// The object code of module `m` for `tm` (cpu.cpp): without Loop Strength Reduction when every function
// of `m` carries "polytile-no-lsr" (a micro-kernel nest's modules, the brief nests), with it otherwise.
std::unique_ptr<llvm::MemoryBuffer> machine_code(llvm::Module& m, llvm::TargetMachine& tm);

// This machine's CPU, its features and the optimization level of every compilation; with `cpu` (an
// LLVM CPU name, Target::cpu_name), that CPU and its features instead.
llvm::orc::JITTargetMachineBuilder host_machine(const std::string& cpu = "");

// UserError where code for `target`'s CPU (Target::cpu_name) needs instructions this machine lacks.
void check_runs_here(const sched::Target& target);
// A UserError unless CompileOptions::threads is 0 (the target's) or 1 to kMaxThreads.
constexpr int kMaxThreads = 1024;
void check_threads(int threads);

// The target-feature string of CPU `name` over the features LLVM reads from hosts ("+avx2,-avx512f,...").
std::string cpu_feature_string(const std::string& name);

// Once per process: LLVM's native target, and glibc's vector math library where the system has it.
void initialize_llvm();

// A vector version of a libm function or LLVM math intrinsic in glibc's vector math library (libmvec).
struct VectorMathVariant {
  std::string scalar;  // "tanhf", "llvm.sin.f64"
  std::string vector;  // "_ZGVeN16v_tanhf", "_ZGVdN4v_sin"
  unsigned lanes;
};

// The variants `tm`'s instruction sets run (SSE, AVX2, AVX-512 widths) that this process can call: none
// without libmvec, those of glibc 2.22 (sin, cos, exp, log, pow) or also of 2.35 (tanh, erf, tan, asin,
// acos, atan, sinh, cosh) as the system's has them.
const std::vector<VectorMathVariant>& vector_math_variants(const llvm::TargetMachine& tm);

// Calls a variant in place of each call of the emitter's lane-by-lane functions (llvm_ir::kLanesPrefix)
// and of vector math intrinsics (llvm.sin.v16f32, ...) on as many lanes as it takes.
void call_vector_math(llvm::Module& m, const std::vector<VectorMathVariant>& variants);

// An ORC JIT for this machine whose code may call the process's symbols (libm, libmvec, libc).
std::unique_ptr<llvm::orc::LLJIT> make_jit();

// What identifies a compilation: the program's text, the input types, the target and the options.
std::string cache_key(const Program& p, const std::map<std::string, TensorType>& inputs, const CompileOptions& o);

// One nest on its way to machine code, in a context and module of its own: nests are optimized and
// compiled concurrently.
struct NestModule {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
  std::string ir;                              // the optimized module, printed (lower_and_emit's print_ir)
  std::unique_ptr<llvm::MemoryBuffer> object;  // its machine code
  double emit_seconds = 0;                     // spent emitting its LLVM IR
};

// Lowers `source`, emits every nest k as `nest_<k>` into a module of its own and optimizes them (and
// compiles them to objects when `objects`), on up to impl.threads threads; fills impl's program, types,
// schedule, buffer table (inputs in program order, then every statement's output) and touched tensors;
// the printed modules, in nest order, are impl.ir when `print_ir`.
std::vector<NestModule> lower_and_emit(CompiledProgram::Impl& impl, const Program& source,
                                       const std::map<std::string, TensorType>& inputs, const CompileOptions& options,
                                       bool objects, bool print_ir = true);

}  // namespace polytile::cpu
