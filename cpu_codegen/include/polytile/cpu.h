// The host backend: Program -> reduce/defract -> schedule (isl) -> LLVM IR, one module per nest ->
// optimized (new-PM O3 with loop and SLP vectorization for the host CPU; a short scalar pipeline for
// register-blocked micro-kernels, which are vector code already) and compiled to machine code, nests
// concurrently on the compilation's threads -> ORC LLJIT, run on TBB with the outer loop of every
// provably parallel nest split across threads. Compiled programs are cached per process, keyed by program
// text, input shapes and dtypes, and target.
//
// Numerics: every statement computes in the dtypes of ir.h, like the reference interpreter, except that
// contractions accumulate in the output dtype in schedule order (the interpreter accumulates in double),
// and floating-point accumulation may be reassociated for vectorization, and f32 exp is polytile's own
// (within 0.91 ulp of the correctly rounded value; glibc's expf, about 0.5). Results therefore match the
// interpreter up to rounding that grows with the reduction length.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "polytile/interpreter.h"
#include "polytile/scheduler.h"
#include "polytile/shapes.h"
#include "polytile/view.h"

namespace polytile::cpu {

// The running machine as a target: its thread count, cache sizes and the widest SIMD registers the JIT
// may use (asked at run time, not at build time).
sched::Target host_target();

// This machine as a target, its code made for the x86 CPU `spec` names as LLVM names it ("znver3",
// "haswell", "skylake-avx512", "x86-64-v3"; "host" or empty: host_target()): the named CPU's instruction
// set (vector width and registers, FMA rate) and scheduling model, this machine's threads and caches.
// After the name, comma-separated cache sizes replace this machine's, for a CPU whose caches differ:
// "znver3,l2=512K", "host,l1=32K,l2=1M,l3=32M" (bytes, or K, M, G for KiB, MiB, GiB; each level at least
// the one before). Code for a CPU that has instructions this one lacks can be exported
// (cpu::export_object) but not run here: compile() refuses it, naming what is missing. UserError for a
// name LLVM does not know and for a malformed or shrinking cache size.
sched::Target cpu_target(const std::string& spec);

// The CPU of a target spelled "cpu" (this machine's: "") or "cpu:SPEC" (SPEC, for cpu_target: a name and
// any cache sizes, "cpu:znver3,l2=512K"), as the Python and C interfaces take it; nullopt for any other
// spelling.
std::optional<std::string> cpu_of_target(const std::string& spec);

// The instruction-set features of CPU `name` that compiled code may use ("avx512f", "fma", ...; not
// system instructions such as "pku") and this machine lacks; empty when code for it runs here.
std::vector<std::string> missing_cpu_features(const std::string& name);

struct CompileOptions {
  // A GPU target (sched::gpu_target) compiles its kernels for this machine and runs them with GPU
  // semantics: every block of a kernel's grid runs its threads one after another, blocks split across
  // the host's threads. It checks what the GPU code generator maps, where no GPU is at hand.
  sched::Target target = host_target();
  bool reduce_and_defract = true;
  int threads = 0;  // 0: the target's thread count; else 1 to 1024 (compile throws a UserError otherwise)
  // Tuning: compile a few variants of the target (cache budgets, register budget, loop nests instead of
  // micro-kernels), time each on deterministic inputs in interleaved rounds (time_in_rounds) and keep the
  // fastest; the winner is cached per (program, shapes, target) like any compilation. The default schedule
  // needs no tuning.
  bool tune = false;
  // Called for each tuning variant once its rounds are timed (its description and fastest run in seconds),
  // so that a caller can show progress; not part of the cache key.
  std::function<void(const std::string& variant, double seconds)> tuning_progress;
  // Translation validation: every rewriting pass (reduce, defract, cond-miss lowering, fusion, layouts)
  // proves its result denotes the same computation (poly::verify_rewrite, sched::verify_fusion); a failed
  // proof is an InternalError naming the pass, never a silently different program.
  bool verify = false;
  // Use the process's cache of compiled programs (and keep this one in it); false compiles afresh and
  // keeps nothing (a benchmark of compile time, a caller with a cache of its own).
  bool cache = true;
};

// What tuning tried: each candidate's description and best run time in seconds, the winner first.
struct TuningReport {
  std::vector<std::pair<std::string, double>> candidates;
};

// How tuning times its candidates, for any caller comparing variants on a machine whose speed drifts (a
// shared guest: 2x within minutes). `run(k)` runs candidate k once and returns its seconds. Every candidate
// first runs once untimed (its outputs and scratch allocated and faulted in), then once a round for
// `rounds` rounds, round r starting at candidate r mod n and going on in order, so that a slow stretch of
// the machine slows each candidate alike instead of the ones that happened to be timed in it; a candidate
// slower than `prune` times the fastest in round 0 is not run again. Returns each one's fastest run.
// UserError unless rounds >= 1 and prune >= 1.
std::vector<double> time_in_rounds(size_t candidates, int rounds, const std::function<double(size_t)>& run, double prune = 3);

// Seconds spent in each stage of one compilation, on the compiling thread (optimize_and_jit: optimizing
// and compiling the nests, concurrently, and linking them in the JIT -- what of it was left once the
// schedule was done: the nests placed early are compiled by other threads while the scheduler goes on;
// llvm_ir: emitting every nest's IR, wherever it ran).
struct CompileTimes {
  double passes = 0, schedule = 0, llvm_ir = 0, optimize_and_jit = 0;
};

// One step of a run (CompiledProgram::profile): a row group, its nests chunk by chunk, or a nest.
struct StepTime {
  std::string name;            // the nest's name, or "row group FIRST .. LAST"
  size_t first = 0, last = 0;  // its nests: schedule().nests[first..last]
  double seconds = 0;          // the mean over the timed runs
};

class CompiledProgram {
 public:
  ~CompiledProgram();
  // Runs may be concurrent (several threads calling run on one CompiledProgram): each takes a set of
  // scratch tensors of its own. Scratch tensors are kept between runs and reused, so a program run in a
  // loop allocates (and page-faults) its intermediates once.
  // Runs on inputs of exactly the compiled shapes and dtypes (UserError otherwise).
  TensorMap run(const TensorMap& inputs) const;
  // The same, writing into `outputs`: an output buffer already there with the right dtype and shape is
  // overwritten in place (no allocation, no copy: the way to run a compiled program in a loop); other
  // outputs are allocated and added.
  void run(const TensorMap& inputs, TensorMap& outputs) const;
  // The same on memory the caller owns, nothing copied: every input and every output of the program as a
  // view (view.h) of exactly the compiled dtype and shape, contiguous row-major and aligned to its
  // element size. Inputs are only read; outputs are written in place (an output that is an input of the
  // program is copied into its view). UserError naming the tensor for a missing or unknown view, a wrong
  // type, a layout that is not contiguous (copy such a tensor first), or an output that shares memory with
  // another view. The memory must stay valid during the call; concurrent runs need disjoint outputs.
  void run(const ViewMap& inputs, const ViewMap& outputs) const;
  // Where a run's time goes: runs once untimed (allocating outputs and scratch tensors), then `runs`
  // times, timing each step (row group or nest) as it runs; the steps in the order they run, each with its
  // mean seconds. UserError for runs < 1 and for inputs run() refuses.
  std::vector<StepTime> profile(const TensorMap& inputs, int runs = 10) const;
  const Program& program() const;           // after the passes
  const ProgramTypes& types() const;        // of program(): its inputs, its outputs and every tensor between
  const sched::Schedule& schedule() const;
  // The optimized modules, deterministic; printed on the first call (the program lowered and optimized
  // again, without machine code: optimized_llvm_ir), not by the compile.
  const std::string& llvm_ir() const;
  const CompileTimes& times() const;
  const TuningReport& tuning() const;       // empty unless compiled with CompileOptions::tune

  struct Impl;
  explicit CompiledProgram(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// Compiles (or fetches from the cache) `program` for inputs of the given types. Safe to call from several
// threads at once: every compilation has its own isl and LLVM contexts (one LLVM context per nest, which
// it optimizes and compiles on up to `threads` TBB threads), and the cache is locked (two
// threads compiling the same program at once may both compile it; both get the one kept).
std::shared_ptr<const CompiledProgram> compile(const Program& program, const std::map<std::string, TensorType>& inputs,
                                               const CompileOptions& options = {});

// The process's cache of compiled programs: keyed by the program's text, input types, target and options;
// it keeps the `set_cache_capacity` (default 64) most recently used programs. Programs a caller still
// holds stay valid when the cache lets them go.
void clear_cache();
void set_cache_capacity(size_t programs);
size_t cached_programs();

// The optimized LLVM IR compile() would run, without making machine code (polytile lower --emit llvm).
std::string optimized_llvm_ir(const Program& program, const std::map<std::string, TensorType>& inputs,
                              const CompileOptions& options = {});

// Ahead-of-time export (polytile compile --target cpu): the program compiled for this machine's CPU into
// one relocatable object (ELF, position independent) with a single C entry point, and the C header that
// declares it. The object calls only libm (link with -lm) and, for a workspace it allocates, malloc and
// free: no LLVM, isl, NTL, TBB or polytile library at run time. The entry point is
//   int ENTRY(inputs..., outputs..., void* workspace, polytile_parallel_for parallel_for, void* user);
// the header documents the arguments (order, dtypes, shapes), the workspace and the parallel_for callback.
// ENTRY_argv(void* const* arguments, void* workspace, polytile_parallel_for, void* user) is the same with
// the tensors' pointers in an array (for callers that bind the arguments at run time, e.g. through an FFI).
struct ExportedObject {
  // One argument of the entry point.
  struct Argument {
    std::string tensor;
    std::string parameter;  // its C name: the tensor's; "_out" for an input passed through; '_' added while reserved
    bool output = false;
    TensorType type;
  };
  std::string entry;             // the C function's name; ENTRY_argv takes the arguments as an array
  std::vector<Argument> arguments;  // inputs in program order, then outputs in program order
  std::string header;            // ENTRY.h's text
  std::string object;            // the object file's bytes
  int64_t workspace_bytes = 0;   // scratch the entry point needs (ENTRY_WORKSPACE_BYTES)
  std::string cpu;               // the CPU the code is for, as LLVM names it (e.g. skylake-avx512)
  CompileTimes times;            // optimize_and_jit: optimizing the nests and making the object
  // Writes PREFIX.o and PREFIX.h, creating PREFIX's directory (UserError naming what cannot be written).
  void write(const std::string& prefix) const;
};

// Compiles `program` for inputs of the given types into an ExportedObject named `entry`. UserError for an
// entry that is not a C identifier (or is a C or C++ keyword), a GPU target (polytile compile --target
// sm_XY writes a kernel bundle instead), and every error compile() reports. Deterministic: the same
// program, types and target give the same bytes.
ExportedObject export_object(const Program& program, const std::map<std::string, TensorType>& inputs,
                             const std::string& entry, const CompileOptions& options = {});

// compile() for the inputs' types, then run.
TensorMap run(const Program& program, const TensorMap& inputs, const CompileOptions& options = {});

}  // namespace polytile::cpu
