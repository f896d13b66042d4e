// Private to the scheduler: the builder of loop nests, in three steps. A target-neutral schedule tree
// (nest_builder.cpp: the domain, one permutable band, its coincident members proven by isl); the target's
// strategy adds its decisions as marks and bands (cpu_strategy.cpp for plain nests; microkernel.cpp and
// row_reduction.cpp build update nests for the CPU); one translator turns any marked tree into loop IR
// (ast.cpp). scheduler.cpp drives it over a program. isl stays behind this header's users.
#pragma once

#include <isl/cpp.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "polytile/isl_analysis.h"
#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"
#include "polytile/scheduler.h"

namespace polytile::sched::internal {

using isl_support::join;

// Statement identity in the schedule trees: every statement's tuple id is one of these (the names are
// for printing only: S in plain nests; Z, L, F, T, E with a p suffix in predicated micro-kernel blocks),
// and the AST translator maps ids back to statement kinds. The "parallel" mark is matched by id too.
class StatementIds {
 public:
  explicit StatementIds(const isl::ctx& ctx);
  const isl::id& id(LoopNode::Statement kind, bool predicated = false) const;
  std::optional<std::pair<LoopNode::Statement, bool>> find(const isl::id& id) const;  // (kind, predicated)
  const isl::id parallel_mark;
  const isl::id block_mark, thread_mark;  // GPU kernels: bands mapped to the launch's blocks and threads
  const isl::id block_step;  // a micro-kernel's one statement in its tree (see BlockStep)
  // GPU kernels: the copy of shared tile t (C0, C1, ...; see SharedTile) and the barriers before and after
  // the threads that read the tiles.
  const isl::id& copy(size_t tile) const;
  std::optional<size_t> copy_tile(const isl::id& id) const;
  const isl::id sync_before, sync_after;
  static constexpr size_t max_tiles = 4;
  // GPU update kernels with accumulators (Accumulators): the marks above the bands over register
  // positions, S's and those of the accumulators' loads and stores (AccIn, AccOut: statement kinds
  // acc_load and acc_store).
  const isl::id register_mark, acc_mark;

 private:
  struct Entry {
    isl::id id;
    LoopNode::Statement kind;
    bool predicated;
  };
  std::vector<Entry> table_;
  std::vector<isl::id> copies_;
};

// The statements a GPU strategy adds to a kernel's tree, for the translator.
// The copies of shared tiles: C<t>(prefix) sets tile t's origin to origins[t], isl expressions of
// `params` -- bound to the statement's arguments, the values of the block and reduction tile dimensions.
// The accumulators (Nest::accumulators): AccIn/AccOut(output variables) load and store the element of
// those values. Every statement's position is given by `positions` (S, AccIn, AccOut -> position), and
// the loops over positions -- those of S's register band, from `register_depth` on under the register
// mark, and those of the AccIn and AccOut bands from `acc_depth` on under the accumulator mark -- are
// register loops of the accumulators' sizes.
struct KernelStatements {
  std::vector<isl::id> params;
  std::vector<std::vector<isl::ast_expr>> origins;
  std::optional<isl::union_map> positions;
  int register_depth = 0;        // S's register band
  int acc_depth = 0;             // the AccIn and AccOut bands
  std::vector<int64_t> z_parts;  // the extents of the block band's first members, parts of z (LoopNode::part_stride)
};

// What the driver knows about a plain nest, for the strategy: facts, not decisions.
struct NestFacts {
  size_t element_bytes = 4;           // of the tensor written
  bool update = false;                // the band's members after the coincident ones are reductions
  bool innermost_contiguous = false;  // the band's last member is the variable contiguous in the output
  int64_t output_bytes = 0;           // the size of the tensor written
  // Update nests: the input accesses over S (domain -> element), with the element size of their tensor.
  struct Read {
    std::string tensor;
    isl::map access;
    size_t element_bytes = 4;
  };
  std::vector<Read> reads;
  // GPU update nests: the output access over S (domain -> element), for the accumulators.
  std::optional<isl::map> write = std::nullopt;
  // Update nests that reduce, whose inputs' elements are read again by other outputs soon if at all (a row
  // sum, a pooling gradient; see near_reuse_only in scheduler.cpp): cache tiles have nothing to keep.
  bool near_reuse_only = false;
  // Update nests: the widest step in memory (bytes) that the band's last member takes through an input
  // (a transposition's reads: a row of the input per step).
  int64_t innermost_input_stride = 0;
  // CPU transpositions (Nest::transpose_lanes): the input's contiguous variable, tiled with the band's
  // last member by squares of `transpose_lanes`; empty: not a transposition.
  std::string transpose_variable = {};
  int transpose_lanes = 0;
  bool transpose_half_edges = false;  // Nest::transpose_half_edges
  // CPU reductions with no output variable leading (a column sum): the width of the column tiles of the
  // band's last member that the threads split (scheduler.cpp's column_tile); 0: none.
  int64_t column_tile = 0;
};

// How a micro-kernel nest is laid out, decided by try_microkernel.
struct MicrokernelChoices {
  bool weight_mode = false;   // a small output with long reductions: reduction tiles outside the blocks
  bool zero_init = false;     // blocks start from zero accumulators (no default tensor)
  std::vector<bool> picks_columns;  // per other output variable (Microkernel::others): no broadcast input reads it
  // Per other output variable: with no broadcast input, an input that does not read it is larger than half
  // of L2 (batched products with the batch innermost: C[i, j, b] = +(A[i, k, b] * B[k, j, b]), B for every i).
  std::vector<bool> rereads_large_input;
  // The vector operand is larger than half of L2 and the broadcast operands together fit in half of it:
  // packed panels that every row reads split across the threads and lead, every block row inside (see
  // block_bands).
  bool columns_lead = false;
  bool rows_share_vector = true;  // some input read along the vector variable does not follow the block variable
  bool long_tiles = false;    // reduction tiles sized for L2 (plan.h long_tiles)
  std::vector<double> block_strides;  // per block dimension (others, Bb, Bv): bytes between its values in the output
  isl::set lane_points;       // the domain with the block variable unconstrained: v's range at each reduction point
};

// A block step's fma loops written without isl's AST build (fma_loops, below): loops numbered from 0,
// the step's arguments standing in their bounds and in `args` (F's arguments) as iterators
// kFmaParameter + k.
constexpr int kFmaParameter = 1 << 20;
struct FmaLoops {
  std::vector<LoopNode> loops;
  std::vector<LoopExpr> args;
  std::string text;  // C text of the loops around F(...)
};

// A micro-kernel's block step: its schedule tree ends in one statement, Step(block dims, reduction tiles)
// -- one block over one reduction tile -- and what a step does is decided when it runs: the uniform
// variant where the block is uniform, else the predicated one; in each, zero instead of load at the
// block's first tile (Z/L, Zp/Lp), the fused multiply-adds over the block's points in the tile (F, Fp),
// the epilogue instead of the store at its last tile (E/T, Ep/Tp). isl builds these conditions once,
// over the step's arguments as parameters; the F loops are made once too (fma_loops, else isl's AST
// build). (Separating the ten statements in one AST took isl about six times as long, for code of the
// same speed.)
struct BlockStep {
  struct Condition {
    enum class Kind { never, always, when } kind = Kind::never;
    std::optional<isl::ast_expr> expr;  // when (isl objects cannot be copied while null)
  };
  struct Variant {
    Condition first;  // zero the accumulators instead of loading them
    std::optional<isl::ast_node> fma;  // the predicated variant's may be the uniform one's loops (calls of F, run as Fp)
    std::shared_ptr<const FmaLoops> direct_fma;  // instead of `fma`: the loops scanned without isl (fma_loops)
    Condition last;   // the fused epilogue instead of the store
  };
  std::vector<isl::id> params;  // the step's arguments in order: block dimensions, then reduction tiles
  std::optional<Variant> uniform, predicated;
  // With both variants (each then a separate block, LoopNode::separate), per argument
  // its value where every predicated step has the same one (the one partial block of rows of a weight
  // gradient): the predicated variant's code takes it as a constant.
  std::vector<std::optional<int64_t>> predicated_fixed;
  Condition uniform_block;      // with both variants: where the uniform one runs
  std::string str() const;      // C-like text of a step, for `lower --emit ast`
};

// The loops of a nest whose tree is a box domain under marks and bands of its variables, tiles of them
// (floor(v / T), each tile a multiple of the next, from 0) and pairs merged into one loop (T * v + w, w
// in [0, T)), written directly: the loops and C text isl's AST build makes of such a tree (box_loops.cpp),
// in microseconds instead of about a millisecond a level. nullopt for any other tree. `parallel_dims`:
// the dimensions a parallel mark may make parallel (parallel_dimensions).
struct BoxLoops {
  LoopNode root;
  std::string ast;
  int iterators = 0;
};
std::optional<BoxLoops> box_loops(const isl::schedule& tree, const StatementIds& ids, const std::set<int>& parallel_dims);

// The loops around the Step statement of a micro-kernel nest (a domain of one conjunction of constraints
// under marks and bands of its variables and floor divisions of affine forms of them), scanned by
// Fourier-Motzkin elimination (step_loops.cpp): the same steps in the same order as isl's AST build,
// without its 30-40 M instructions a tree. `loops` outermost first, loop k with iterator k; `args` the
// Step statement's arguments inside the last; `ast` the C text, the Step call included. nullopt for any
// other tree.
struct StepLoops {
  std::vector<LoopNode> loops;
  std::vector<LoopExpr> args;
  std::string ast;
  int iterators = 0;
};
std::optional<StepLoops> step_loops(const isl::schedule& tree, const StatementIds& ids, const std::set<int>& parallel_dims);

// The fma loops of a block step's variant over `points` (a set over F[block dimensions, reductions] with
// the step's arguments `params` as parameters, `param_ranges` their ranges over the variant's steps),
// the last `reductions` variables in order, scanned the same way (isl's AST build took 16 M instructions
// for each). nullopt where the points are not one conjunction of constraints or a block
// dimension is not one affine form of the parameters.
std::optional<FmaLoops> fma_loops(const isl::set& points, const std::vector<isl::id>& params, size_t reductions,
                                  const std::vector<std::pair<int64_t, int64_t>>& param_ranges);

// vars[order[0]], vars[order[1]], ...
std::vector<std::string> ordered(const std::vector<std::string>& vars, const std::vector<size_t>& order);

// The band of a target-neutral tree, as the strategies read it.
struct NeutralBand {
  size_t parallel = 0;                 // the leading coincident members (output variables writing distinct elements)
  std::vector<std::string> members;    // the variables in band order
  std::vector<int64_t> lows, extents;  // each member's range over the domain (0 and 1 where it is unbounded)
  bool bounded = true;                 // every member's range is finite
  // The points of the members' box (the product of the extents, at most 2^62): the band maps the domain's
  // points one to one, so they are at most this many.
  int64_t points() const;
};

struct NestBuilder {
  explicit NestBuilder(const Target& t) : target(t) {}
  const Target& target;
  isl_support::IslContext ctx;
  StatementIds statements{ctx.get()};

  // A plain nest over `domain` (a set over S), its variables `vars` ordered by `order` in the band, the
  // first `coincident` of them proven to write distinct elements: neutral tree, CPU strategy, loop IR.
  void build(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars, const std::vector<size_t>& order,
             size_t coincident, const NestFacts& facts);
  // build's work once the band's members are chosen (the leading pair fused or not).
  void build_members(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars, const std::vector<size_t>& order,
                     const std::vector<std::string>& members, size_t coincident, const NestFacts& facts, bool transposing);
  isl::schedule neutral_tree(const isl::set& domain, const std::vector<std::string>& vars,
                             const std::vector<std::string>& members, size_t coincident);
  std::optional<std::vector<std::string>> fuse_leading(const isl::set& domain, const std::vector<std::string>& vars,
                                                       const std::vector<size_t>& order, size_t coincident,
                                                       int64_t output_bytes);
  // The band under the neutral tree's domain, whose members are `members`; nullopt when there is none (a
  // nest without variables).
  std::optional<NeutralBand> read_band(const isl::schedule& neutral, const std::vector<std::string>& members);
  isl::schedule cpu_plain_nest(const isl::schedule& neutral, const std::optional<NeutralBand>& band,
                               const std::vector<std::string>& vars, const NestFacts& facts, bool squares);
  // The GPU strategy (gpu_strategy.cpp): "block" and "thread" bands over the coincident members, the
  // reductions and a register tile inside; `launch` receives the launch shape (sequential when nothing
  // can be mapped). An update whose inputs are reused across the block's threads gets a band of
  // reduction tiles between blocks and threads, and its reused inputs are promoted to `shared` tiles
  // whose copies (`added`) and barriers are grafted before and after the threads. An update keeps its
  // output in `accumulators` where isl proves a thread's register positions hold distinct elements.
  // With `z_parts`, where a block holds one value of z, the members z linearizes get a loop each.
  isl::schedule gpu_plain_nest(const isl::schedule& neutral, const std::vector<std::string>& vars,
                               const std::vector<size_t>& order, const NestFacts& facts, KernelLaunch& launch,
                               std::vector<SharedTile>& shared, std::optional<Accumulators>& accumulators,
                               KernelStatements& added, bool z_parts);
  // Shared-memory promotion (gpu_strategy.cpp): the inputs worth a tile at the tree's reduction tiles, and
  // the tree with their copies and barriers grafted in.
  struct Promoted {
    SharedTile tile;
    size_t element_bytes = 4;
    isl::multi_aff offset;  // the tile's origin, a function of the block and reduction tile dimensions
    isl::map footprint;     // each step to the elements its points read
  };
  std::optional<std::vector<Promoted>> promote(const isl::union_map& steps, const NestFacts& facts, int64_t per_tile,
                                               int64_t min_reuse, const std::set<std::string>* padded, int64_t budget,
                                               std::string& largest);
  void prove_cover(const Promoted& p);
  isl::schedule_node thread_mark(const isl::schedule& tree);
  isl::schedule graft_copies(const isl::schedule& tree, const isl::union_map& steps, const std::vector<Promoted>& promoted,
                             std::vector<SharedTile>& shared, KernelStatements& added);
  // The accumulators (gpu_strategy.cpp): whether isl proves that a thread's positions and elements match
  // one to one in each step, the `mapping` (block, thread and register members) being functions of the
  // output variables `outs`; AccIn and AccOut over them grafted around the reductions of a tree whose
  // register band (of `registers`, expressions of vars) is marked.
  bool accumulators_proven(const isl::schedule& neutral, const std::vector<std::string>& vars, const std::vector<std::string>& outs,
                           const std::vector<std::string>& mapping, const isl::map& write);
  isl::schedule graft_accumulators(const isl::schedule& tree, const std::vector<std::string>& vars,
                                   const std::vector<std::string>& outs, const std::vector<std::string>& registers,
                                   KernelStatements& added);
  // After translation: launch extents of axes no loop is mapped to become 1; false when an axis is mapped
  // around some statements and not others (the nest must then run sequentially).
  static bool finish_kernel(Nest& nest);
  // A permutable band inserted at `at` over S[vars], with `members` (isl expressions of vars); member k
  // coincident when coincident[k]. `as_written` keeps each member the quasi-affine expression it is (the
  // GPU's floor/mod members); otherwise isl derives the members from the map, as piecewise expressions.
  isl::schedule_node insert_band(const isl::schedule_node& at, const std::vector<std::string>& vars,
                                 const std::vector<std::string>& members, const std::vector<bool>& coincident,
                                 bool as_written = false);
  // The one translator: the AST of a marked tree into the nest. Loops may run in parallel where the tree
  // says so: coincident members of bands under a "parallel" mark.
  void generate(Nest& nest, const isl::schedule& tree, const BlockStep* step = nullptr, const KernelStatements* added = nullptr);
  std::optional<isl::schedule> last_tree;  // the tree generate() translated last
  // The runtime splits the outer loop's range: the root must be a parallel loop with constant bounds, or
  // a block of such loops (isl splits the outermost dimension when statements cover different parts).
  static void finish_parallel(Nest& nest);
  // Schedules `nest` (an update of `c`) as a micro-kernel when the plan and the isl checks allow it; with
  // `stored_elements`, blocks start from zero and it receives the output elements the blocks store (a set
  // over S); `epilogue` and `permuted_copy` (Nest::permuted_copy) are fused when given.
  bool try_microkernel(Nest& nest, const Contraction& c, const ProgramTypes& types, const poly::internal::IslAnalysis& analysis,
                       const isl::set& domain, const std::vector<std::string>& positional, int64_t out_bytes,
                       isl::set* stored_elements, const Elementwise* epilogue, const Contraction* permuted_copy = nullptr);
  // Schedules `nest` (an update of `c`) as a vectorized row reduction when `c` qualifies. Its first two
  // output variables run as one outer loop (RowReduction::fused_outer) where fuse_leading fuses them by
  // rows_read_bytes; the init nest of those rows is built by the same bytes.
  bool try_row_reduction(Nest& nest, const Contraction& c, const ProgramTypes& types, const poly::ContractionAnalysis& a,
                         const isl::set& domain, const std::vector<std::string>& positional, bool parallel);
  // The micro-kernel nest (nest.microkernel says its shape); returns the points of S whose output elements
  // its blocks store.
  isl::set build_microkernel(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                             const std::vector<std::pair<int64_t, int64_t>>& range, size_t element_bytes,
                             const std::vector<isl::map>& reads, const MicrokernelChoices& choices);
};

// The bytes of c's largest input: what a row reduction's rows read, in fuse_leading's choice.
int64_t rows_read_bytes(const Contraction& c, const ProgramTypes& types);

// A nest's accesses as functions of its outer loop (its first schedule dimension): { [c] -> T[element] }
// for the elements iteration c writes and reads (nest_groups.cpp).
struct RowAccess {
  isl::union_map writes, reads;
};

// The outer loop of a plain nest's tree, { S[vars] -> [c] }; nullopt for a tree of several statements or
// no loop.
std::optional<isl::map> outer_loop(const isl::schedule& tree);
// Whether the values of `outer` ({ S[vars] -> [c] }) run from lo to hi.
bool spans(const isl::map& outer, int64_t lo, int64_t hi);

// The row groups of a CPU schedule (NestGroup): runs of consecutive nests with accesses (rows[k]: the
// scheduler gives them only to nests whose outer loop the runtime splits, never to a micro-kernel or a GPU
// kernel), the same outer range, and every dependence between one and the nests before it in the run
// relating equal outer iterations; with their chunk tensors, none of them in `kept` (the program's inputs
// and outputs).
std::vector<NestGroup> group_nests(const std::vector<Nest>& nests, const std::vector<std::optional<RowAccess>>& rows,
                                   const ProgramTypes& types, const Target& target, const std::set<std::string>& kept);

}  // namespace polytile::sched::internal
