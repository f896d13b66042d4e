// LLVM IR for scheduled loop nests: the emitter shared by the code generators (the host backend in
// cpu_codegen/, and the PTX code generator in ptx_codegen/). For the host, every nest becomes one function
//   void nest_<k>(ptr buffers, i64 lo, i64 hi)
// over a table of tensor pointers, running the outermost loop's iterations in [lo, hi) when the nest is
// parallel. Target-neutral IR: scalar and vector arithmetic, masked vector loads and stores, llvm
// intrinsics and libm calls; the caller picks the target, optimizes and runs. Only a forward declaration
// of llvm::Module appears here: callers link LLVM 16 themselves.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "polytile/scheduler.h"
#include "polytile/shapes.h"

namespace llvm {
class Module;
}

namespace polytile::llvm_ir {

// Adds `void nest_<k>(ptr buffers, i64 lo, i64 hi)` for every nest k of `schedule`; buffers[buffer_index[t]]
// holds tensor t. InternalError if LLVM's verifier rejects a function.
void emit_nests(llvm::Module& module, const sched::Schedule& schedule, const ProgramTypes& types,
                const std::map<std::string, int>& buffer_index);

// Adds `void <name>(ptr buffers, i64 lo, i64 hi)` for `nest` alone: nests that go to modules of their own
// can be optimized and compiled concurrently. With `outline`, the nest's separate blocks (a micro-kernel's
// uniform and border blocks: LoopNode::separate) are calls of `<name>.part<j>` instead, j = 0, 1, ... in
// order, which emit_nest_part defines: in modules of their own, they too are compiled concurrently.
// InternalError if LLVM's verifier rejects it.
void emit_nest(llvm::Module& module, const sched::Nest& nest, const std::string& name, const ProgramTypes& types,
               const std::map<std::string, int>& buffer_index, bool outline = false);

// How many separate blocks emit_nest with `outline` calls (0 for a nest without them, or a GPU kernel; a
// nest that stores past the caches, Nest::stream, keeps its uniform blocks, only its border ones apart).
size_t separate_parts(const sched::Nest& nest);

// Adds `void <name>.part<j>(ptr tensors..., i64 iterators...)`, separate block j of `nest` (its tensors
// in nest_tensors order, then the values of the loop iterators around it that it reads), as called by
// emit_nest(..., outline = true). InternalError if LLVM's verifier rejects it.
void emit_nest_part(llvm::Module& module, const sched::Nest& nest, const std::string& name, size_t part,
                    const ProgramTypes& types, const std::map<std::string, int>& buffer_index);

// A nest scheduled for a GPU (Nest::kernel) as an NVPTX kernel entry `void <name>(ptr addrspace(1)...)`:
// one noalias global pointer per tensor of nest_tensors(nest), in that order; mapped loops read the block
// and thread index registers; math calls libdevice's __nv_* functions, which the caller links in. The
// module should have the NVPTX triple and data layout. InternalError if LLVM's verifier rejects it.
void emit_kernel(llvm::Module& module, const sched::Nest& nest, const std::string& name, const ProgramTypes& types);

// The function attribute (no value) on host functions that evaluate e^x in f32 inline: vector math whose
// instructions a wider vector halves, for a target that has the width to prefer it.
inline constexpr const char* kVectorMathAttribute = "polytile-vector-math";

// The prefix of the internal, always-inlined functions `polytile.lanes.<fn>.v<W>` (e.g.
// polytile.lanes.tanhf.v16: <16 x float> -> <16 x float>) that apply libm's function <fn> to each lane of a
// vector expression (a micro-kernel's epilogue) with one call per lane: a host code generator may call a
// vector math library's variant of <fn> on W lanes in their place.
inline constexpr const char* kLanesPrefix = "polytile.lanes.";

// The parameter attribute (no value) on the tensor a streaming nest (sched::Nest::stream) writes, in the
// nest's second body, which its entry calls where that tensor's pointer is 64-byte aligned (the parameter
// says `align 64`): a code generator may make that body's aligned vector stores to it non-temporal.
inline constexpr const char* kStreamAttribute = "polytile-stream";

// The tensors a nest's code reads or writes (its buffers).
std::vector<std::string> nest_tensors(const sched::Nest& nest);

}  // namespace polytile::llvm_ir
