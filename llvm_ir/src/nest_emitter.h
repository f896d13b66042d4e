// Private to llvm_ir: the emitter of one loop nest as LLVM IR functions, one class whose parts live in one
// file each: emitter.cpp (the entry function, loops, guards and loop expressions), values.cpp (dtypes,
// conversions, arithmetic, elementwise expressions), statements.cpp (accesses, aggregation, the plain
// statement), row_reduction.cpp and microkernel.cpp (the vectorized update statements).
#pragma once

#include <llvm/Analysis/InstSimplifyFolder.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "polytile/error.h"
#include "polytile/llvm_ir.h"

namespace polytile::llvm_ir::internal {

using llvm::Value;

struct Typed {
  Value* v;
  DType t;
};

class NestEmitter {
 public:
  // `device`: code for the GPU (emit_kernel); otherwise for the host (emit).
  NestEmitter(llvm::Module& m, const sched::Nest& nest, const ProgramTypes& types,
              const std::map<std::string, int>& buffer_index, bool device = false)
      : m_(m), ctx_(m.getContext()), b_(ctx_, llvm::InstSimplifyFolder(m.getDataLayout())), nest_(nest), types_(types),
        buffer_index_(buffer_index), device_(device),
        copy_(nest.kind == sched::Nest::Kind::update && nest.contraction.aggregation == AggregationOp::assign &&
              nest.contraction.combination == CombinationOp::none && !nest.microkernel),
        ix_(index32() ? b_.getInt32Ty() : b_.getInt64Ty()) {}

  // The body takes one noalias pointer per tensor it touches (they are distinct buffers), so loads and
  // stores can be reordered and vectorized; the exported entry unpacks them from the buffer array. A
  // kernel nest (Nest::kernel) runs with GPU semantics on the host: the entry's [lo, hi) is a range of
  // blocks, and each block runs its threads one after another (valid while no barrier is needed).
  llvm::Function* emit(const std::string& name);
  // A GPU kernel: one global (addrspace 1) noalias pointer per tensor in nest_tensors order, the mapped
  // loops' iterators read from the block and thread index registers, marked as a kernel entry.
  llvm::Function* emit_kernel(const std::string& name);
  // With outlining (emit), each separate block (LoopNode::separate, in emission order) becomes a call of
  // `<name>.part<j>`; emit_part(name, j) defines that function: the block's code, taking the tensors'
  // pointers and the values of the iterators of the loops around it that it reads.
  void set_outline(bool outline) { outline_ = outline && !nest_.kernel; }  // a GPU kernel has no parts
  llvm::Function* emit_part(const std::string& name, size_t part);
  // The separate blocks of a nest's loop IR that become functions of their own, in emission order: every
  // one but, in a nest that stores past the caches (Nest::stream), the uniform blocks, which stay in the
  // nest's body and its streaming copy, whose stores into the output are non-temporal.
  static std::vector<const sched::LoopNode*> separate_blocks(const sched::Nest& nest);
  static bool outlined(const sched::Nest& nest, const sched::LoopNode& n);
  static bool predicated(const sched::LoopNode& n);  // whether any statement of `n` is predicated
  std::vector<std::string> tensors_used() const { return sched::nest_tensors(nest_); }

 private:
  // ------------------------------------------------------------------ loops
  Value* loop_expr(const sched::LoopExpr& a);
  // A statement's arguments (its domain variables' values) at the current loop iteration.
  std::vector<Value*> loop_exprs(const std::vector<sched::LoopExpr>& args);
  Value* cond(const sched::LoopExpr& a);
  Value* floor_div(Value* x, Value* y);
  Value* floor_mod(Value* x, Value* y);
  void node(const sched::LoopNode& n, bool outermost);
  // A separate block's call of its function (see set_outline), and that function's type: the tensors'
  // pointers, then the values of the iterators `free`.
  void call_part(const sched::LoopNode& n);
  llvm::FunctionType* part_type(const std::vector<int>& free);
  // The iterators a node's code reads that no loop inside it defines, in increasing order.
  static std::vector<int> free_iterators(const sched::LoopNode& n);
  // A streaming nest's second body (see kStreamAttribute), called where the output is this aligned.
  static constexpr uint64_t kStreamAlignment = 64;
  llvm::Function* streaming_body(const std::string& name);
  // The allocas of the tensor pointers' parameters, iterators, accumulators and hardware indices.
  void prologue(llvm::Function* fn, const std::vector<std::string>& used);
  // for (*it = start; condition(); *it += step) body(); returns the branch back to the condition
  llvm::BranchInst* emit_loop(llvm::AllocaInst* it, Value* start, int64_t step, const std::function<Value*()>& condition,
                 const std::function<void()>& body);
  // Marks the loop whose back edge is `latch` with the loop hint `hint` (llvm.loop.unroll.full, ...).
  void hint_loop(llvm::BranchInst* latch, const char* hint, std::optional<int> value = std::nullopt);
  // A register loop (LoopNode::unroll): over [0, unroll), the body where the loop's own range holds, fully
  // unrolled (llvm.loop.unroll.full), so that accumulator positions become constants.
  void register_loop(const sched::LoopNode& n);
  // Whether a register loop runs without branches (register_mask_): in a kernel whose update aggregates
  // into accumulators and reads every input from a shared tile, a register loop holding only register
  // loops and update statements. Its points outside the range then read a clamped element of each tile
  // (shared_address_clamped) and leave their accumulator as it was, so that operands independent of the
  // guarded position (a convolution's filter across the rows of the tile) are loaded once, not once per row.
  bool branch_free_registers(const sched::LoopNode& n) const;
  static bool whole_register_loop(const sched::LoopNode& n);
  // A kernel's innermost sequential loop around register loops with guards of their own that it does not
  // change (a padded convolution's rows at the image's edge) is unswitched: where every position of those
  // register loops is in range (most threads: those away from the edge), a copy of the loop without the
  // guards (full_registers_), in which a thread's operands load as vectors along the reduction and once per
  // position; elsewhere the loop as it is.
  static std::vector<const sched::LoopNode*> guarded_register_loops(const sched::LoopNode& n);
  // A sequential loop (not mapped, not a register loop), unrolled on the device if innermost (see node).
  void sequential_loop(const sched::LoopNode& n, bool outermost);
  static bool innermost_sequential(const sched::LoopNode& n);
  // A transposition's square (Nest::transpose_lanes): `n` the loop over the input's contiguous variable
  // around the one over the output's, with the copy statement inside. Where both loops run all their
  // lanes, the square moves as lanes vector loads, a transposition in registers and lanes vector stores;
  // at the edges, the loops as they are. False (nothing emitted) when `n` is not such a loop.
  bool transpose_square(const sched::LoopNode& n);
  // for (*it = from; *it < to; ++*it) body()
  void counted_loop(llvm::AllocaInst* it, Value* from, Value* to, const std::function<void()>& body);
  // A loop mapped to blocks or threads: its body where the index lies in the loop's range.
  void mapped_loop(const sched::LoopNode& n);
  // then() where `condition` holds, otherwise() where not (blocks named `name`.then, .else, .end).
  void if_else(Value* condition, const char* name, const std::function<void()>& then, const std::function<void()>& otherwise);
  // The nodes of `body` where `in_range` holds (blocks named `name`).
  void in_range_body(Value* in_range, const std::vector<sched::LoopNode>& body, const char* name);
  // On the host, a kernel's code that threads run (a loop mapped to threads, a statement) runs once per
  // thread of the block, in order: threads run one after another between barriers.
  void host_threads(const std::function<void()>& body);

  // ------------------------------------------------------------------ shared tiles (sched::SharedTile)
  // A shared tile's element at `local` (its index in the tile): one GEP into the tile's array of arrays.
  Value* shared_address(size_t tile, const std::vector<Value*>& local);
  // The same element, safe to load at any index: the offset in the tile's storage clamped into it, or,
  // for an index that depends on a guarded register position (`masked`), 0 where the position is out of
  // range (one select instead of two bounds; an index independent of the positions stays one value, loaded once).
  Value* shared_address_clamped(size_t tile, const std::vector<Value*>& local, bool masked);
  // The tile's copy by the threads of the block: sets its origin and copies box element e to e's thread.
  void copy_statement(const sched::LoopNode& n);
  // A copy's unit `unit` (`lanes` elements of the box's last dimension): its index in the tile and in the
  // input, and whether it lies inside the input.
  Value* copy_position(size_t t, const std::vector<Value*>& origin, Value* unit, int64_t lanes, std::vector<Value*>& local,
                       std::vector<Value*>& global);
  static bool multiple_of(const sched::LoopExpr& e, int64_t m);
  // The copy of a plain input's tile in units of `lanes` elements, each thread's loads batched.
  void copy_units(size_t t, const std::vector<Value*>& origin, Value* thread, int64_t lanes);
  // The tile of an input the update reads from shared memory, if any.
  std::optional<size_t> shared_tile(const std::string& tensor) const;
  void barrier();

  // ------------------------------------------------------------------ values
  llvm::Type* storage_type(DType t);
  // Expressions are evaluated on scalars, or on vectors of width_ lanes (a micro-kernel's epilogue).
  llvm::Type* widen(llvm::Type* scalar) { return width_ ? llvm::FixedVectorType::get(scalar, width_) : scalar; }
  // Values: bool is i1, f16 is an f32 that holds a half (loads widen it, stores narrow it exactly).
  llvm::Type* value_type(DType t) {
    return widen(t == DType::boolean ? b_.getInt1Ty() : t == DType::f16 ? b_.getFloatTy() : storage_type(t));
  }
  Value* integer(int64_t v, DType t) { return llvm::ConstantInt::get(value_type(t), static_cast<uint64_t>(v), true); }
  Value* buffer(const std::string& tensor) { return ptrs_.at(tensor); }
  // tensor[idx]. In a GPU kernel (on the device, and as the host runs it) the address is one GEP per
  // dimension, so that alias analysis sees each index's constant part (a register tile's rows and
  // columns) and tells a thread's elements apart: LLVM then keeps an update's accumulators in registers
  // across its reduction loop. Elsewhere one flat offset, as the vectorizer expects.
  Typed load_element(const std::string& tensor, const std::vector<Value*>& idx);
  void store_element(const std::string& tensor, const std::vector<Value*>& idx, Typed value);
  Value* element_address(const std::string& tensor, const std::vector<Value*>& idx);
  // The indices of an elementwise operand at the result's `idx`: the trailing ones, 0 along its dims of
  // extent 1 (broadcasting).
  std::vector<Value*> broadcast_indices(const std::string& tensor, const std::vector<Value*>& idx);
  Typed load_address(DType t, Value* addr);
  void store_address(DType t, Value* addr, Typed value);
  // A loaded storage value (scalar or vector) as a value of dtype t, and back.
  Value* from_storage(DType t, Value* v);
  Value* to_storage(DType t, Value* v);

  // round_to semantics of buffer.h: f16 and f32 round, i32 and i64 truncate and wrap (NaN -> 0), bool is != 0.
  Value* convert(Typed x, DType to);
  Value* round_half(Value* f32);
  Value* round_to_odd_f32(Value* f64);
  Typed constant(double v, DType t);
  Value* fn_call(const char* name, Typed x);
  Value* intrinsic(llvm::Intrinsic::ID id, std::vector<Value*> args);
  // e^x: on the host, f32 inline (exp_f32 in values.cpp); f64 and the device through intrinsic().
  Value* exp(Value* x);
  Value* exp_f32(Value* x);
  Value* device_call(const char* name, const std::vector<Value*>& args);

  // Floor division / modulo on i32 or i64 with x / 0 = 0 and MIN / -1 wrapping, as the interpreter does.
  Value* int_div(Value* x, Value* y, bool mod);
  Typed arith(BinaryOp op, Typed a, Typed b, DType t);
  Value* compare(BinaryOp op, Typed a, Typed b, DType t);

  // An elementwise expression at output index `idx` (broadcasting like the interpreter); f16 results of
  // operations rounded to halves.
  Typed expr(const Expr& e, const std::vector<Value*>& idx);
  Typed operation(const Expr& e, const std::vector<Value*>& idx);  // expr before that rounding

  // ------------------------------------------------------------------ statements
  Value* flat_index(const std::string& tensor, const std::vector<Value*>& idx);

  // An index polynomial (dims bound) at the statement's variable values; exact division by its
  // denominator (the domain guarantees integrality).
  Value* poly(const Polynomial& p, const std::map<std::string, Value*>& vars);

  // A contraction input at index `idx`: loaded, or computed by its inlined elementwise producer (rounded
  // to the producer's dtype, as the materialized tensor would be). Vector-wide when width_ is set.
  Typed input(const std::string& tensor, const std::vector<Value*>& idx);

  // The polynomial times its denominator, at the given variable values, and that denominator.
  std::pair<Value*, int64_t> scaled_poly(const Polynomial& p, const std::map<std::string, Value*>& vars);
  Typed identity(AggregationOp op, DType t);

  // max/min that propagate NaN, selecting exactly as the interpreter does (llvm.maximum does not lower
  // on x86 in LLVM 16). Elementwise max(a, b) is std::max: a < b ? b : a.
  Value* nan_max_min(bool is_max, Value* a, Value* b);
  // The accumulator takes v when v > acc (max) or v < acc (min); any NaN makes the result NaN.
  Value* nan_accumulate(bool is_max, Value* acc, Value* v);
  Value* accumulate(AggregationOp op, Value* acc, Value* v, DType t);
  // The plain statement of every nest but micro-kernels and row reductions; in a kernel with
  // accumulators, an update aggregates into its accumulator (n.registers) instead of the output.
  void statement(const sched::LoopNode& n);
  // The contraction's output element at the variables' values (those in its index at least).
  Value* output_address(const std::map<std::string, Value*>& vars);
  // AccIn and AccOut of a kernel's accumulators (sched::Accumulators).
  Value* accumulator_address(const std::vector<sched::LoopExpr>& position);
  void accumulator_statement(const sched::LoopNode& n);

  // ------------------------------------------------------------------ row reductions
  // zero / step / store of a vectorized row reduction (see RowReduction in scheduler.h).
  void reduction_statement(const sched::LoopNode& n);
  // A ragged row reduction's interval [lo, hi] of r's valid values at `vars` (RowReduction::ragged).
  std::pair<Value*, Value*> ragged_range(std::map<std::string, Value*> vars, const std::string& r);

  // ------------------------------------------------------------------ micro-kernels
  Value* in_range(Value* x, int64_t hi);  // 0 <= x < hi
  Value* lane_indices(unsigned lanes);    // <0, 1, ..., lanes - 1> in i64

  // Which conditions of the valid-point rule: the output's indices, the inputs' and the constraints, or all.
  // A micro-kernel's fused multiply-adds need only the inputs' and the constraints: an accumulator whose
  // output element is out of range is never stored (the store's masks are the output's), so it may add
  // anything, provided what it reads is in its tensor (a padded panel's last columns of zeros).
  enum class Conditions { output, inputs, all };
  // Calls f(p, hi) for every condition 0 <= p < hi of the valid-point rule among `which`: each access index
  // (dims not bound) in its dim's range and each constraint.
  void each_condition(Conditions which, const std::function<void(const Polynomial&, int64_t)>& f) const;
  // The valid-point rule of the interpreter (every access in bounds, every constraint holds; the
  // micro-kernel's index polynomials are integral), `which` of its conditions, for one row of a block.
  // Only the conditions on the block variable can differ between rows: the others hold at every point of
  // the block's domain, which is the union of its rows' valid points.
  Value* valid(const std::map<std::string, Value*>& vars, Conditions which);
  // Which of the `lanes` lanes from v = first are valid: v within its range (up to Microkernel::vector_hi)
  // and every access index and constraint on v and the other output variables in `vars` holding (a padded
  // panel's last block column: the output's index VL*vb + vl in range), and, where `vars` has the
  // reductions (an fma statement), those of the inputs and constraints on v and them instead (a padded
  // NCHW conv's x + i - 1 in the image; not the panel's output index, see Conditions). A vector of i1.
  Value* lanes_in_range(const Polynomial& q, int64_t hi, const std::map<std::string, Value*>& at, unsigned lanes);
  Value* lanes_valid(const std::map<std::string, Value*>& vars, Value* first, unsigned lanes);
  Value* cell_valid(const std::map<std::string, Value*>& vars, Value* first, unsigned lanes, Conditions which);

  // load / fma / store of a micro-kernel block (see Microkernel in scheduler.h).
  void microkernel_statement(const sched::LoopNode& n);
  // A predicated block's validity at a statement: per row (its accesses and constraints hold), per chunk
  // (the lanes in the vector variable's range), and per row and chunk (row-major) where conditions
  // couple the two (cell_valid; empty where none do).
  struct BlockValidity {
    std::vector<Value*> rows, lanes, cells;
  };
  void microkernel_rows(const sched::LoopNode& n, std::map<std::string, Value*> vars, Value* b0, Value* v0,
                        const BlockValidity* valid_at);
  // Sched::Nest::permuted_copy: a block's accumulators stored into the permuted tensor (the epilogue step).
  void permuted_store(std::map<std::string, Value*> vars, Value* b0, Value* v0, const BlockValidity* valid_at);
  Value* fma_address(const std::string& tensor, const std::vector<Polynomial>& idx, std::map<std::string, Value*> vars);
  int64_t flat_step(const std::string& tensor, const std::vector<Polynomial>& idx, const std::string& v) const;
  void prefetch_line(Value* addr);
  void prefetch(const TensorAccess& a, const std::vector<Value*>& row0, const std::map<std::string, Value*>& vars,
                Value* row0_address);
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  // Folds as it builds (x * 1, x + 0, constants): the optimizer has less to clean up.
  llvm::IRBuilder<llvm::InstSimplifyFolder> b_;
  const sched::Nest& nest_;
  const ProgramTypes& types_;
  const std::map<std::string, int>& buffer_index_;
  llvm::Function* fn_ = nullptr;
  bool outline_ = false;
  std::string name_;       // the nest's function name (emit), which its parts' names extend
  size_t parts_called_ = 0;
  Value* lo_ = nullptr;
  Value* hi_ = nullptr;
  std::vector<llvm::AllocaInst*> iters_;
  std::vector<llvm::AllocaInst*> acc_;  // micro-kernel accumulators, row-major (row, chunk)
  unsigned width_ = 0;                    // 0: scalar expressions; else lanes of vector expressions
  std::map<std::string, Typed> lanes_;    // tensors whose lanes are given (the accumulators in an epilogue)
  Value* mask_ = nullptr;                 // lanes in range, for vector loads of a predicated block
  // The type of index arithmetic (iterators, loop bounds, index polynomials, offsets): i32 in a kernel whose
  // tensors, launch and loop constants all fit in 30 bits (KernelLaunch::index32; a 64-bit operation is
  // two instructions on a GPU), else i64.
  bool index32() const;
  Value* ix(int64_t v) const { return llvm::ConstantInt::get(ix_, static_cast<uint64_t>(v), true); }
  Value* register_mask_ = nullptr;        // in a branch-free register loop: whether its position is in range
  bool full_registers_ = false;           // in an unswitched loop's copy whose register positions are all in range
  std::set<int> masked_iterators_;        // ... the iterators of the guarded register loops around
  std::map<std::string, Value*> ptrs_;
  const bool device_;
  const bool copy_;  // an update that copies one tensor: its loops are not unrolled (see node)
  llvm::AllocaInst* hardware_[2][3] = {};  // block and thread indices (x, y, z) of kernel nests
  bool in_threads_ = false;                // host: inside the loop over a block's threads
  bool square_edge_ = false;               // emitting a transposition square's loops as they are
  std::vector<Value*> shared_;             // each shared tile's array (addrspace 3 on the device)
  std::vector<llvm::Type*> shared_types_;  // ... its type, [s0 x [s1 x ... x element]]
  std::vector<std::vector<llvm::AllocaInst*>> origins_;  // each tile's origin, set by its copy
  llvm::AllocaInst* copy_element_ = nullptr;              // the element a thread copies
  llvm::AllocaInst* accumulators_ = nullptr;  // a kernel's accumulators: the thread's own (registers once unrolled)
  llvm::IntegerType* const ix_;               // see index32()
};

}  // namespace polytile::llvm_ir::internal
