// Scheduling with isl (see scheduler.h): the driver over a program's statements. Every nest's domain is an
// isl set in the builder's one isl context; a plain nest gets a target-neutral tree (nest_builder.cpp) that
// the CPU strategy shapes (cpu_strategy.cpp: parallel mark, cache tiles); update nests that qualify are
// built by the strategy as micro-kernels (microkernel.cpp) or row reductions (row_reduction.cpp); ast.cpp
// translates every marked tree into loop IR. Every isl object dies before its IslContext.
#include "polytile/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "polytile/error.h"
#include "polytile/isl_analysis.h"
#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"
#include "affine.h"
#include "nest_builder.h"
#include "nest_fusion.h"
#include "plan.h"

namespace polytile::sched {

using internal::NestBuilder;
using internal::NestFacts;
using internal::join;

namespace {

// The variables of an update in band order: output variables outermost (parallel when distinct values
// write distinct elements), the one with the most values first when the first has too few for the
// threads; then the reduction variables; and innermost the variable with the most unit-stride accesses
// (reads and the write), so the inner loop streams contiguous memory and vectorizes -- ties go to the
// output's last index -- when there is a reduction to put outside it.
struct BandOrder {
  std::vector<size_t> order;  // indices into the update's variables
  size_t outputs = 0;         // how many output variables lead
  bool innermost = false;     // the last member was moved innermost for contiguity
  bool innermost_output = false;  // ... and it is an output variable (no output variable then leads: a column sum)
};

BandOrder band_order(const Contraction& c, const std::vector<std::string>& variables,
                     const std::vector<poly::VariableBounds>& bounds, const std::vector<int64_t>& out_shape, int threads) {
  std::set<std::string> in_output;
  for (const auto& p : c.output_indices)
    for (const auto& [v, coeff] : p.index_terms()) in_output.insert(v);
  std::map<std::string, int> unit;
  auto score = [&unit](const std::vector<Polynomial>& idx, int weight) {
    if (idx.empty()) return;
    for (const auto& [v, coeff] : idx.back().index_terms())
      if (coeff == Rational(1) || coeff == Rational(-1)) unit[v] += weight;
    for (size_t k = 0; k + 1 < idx.size(); ++k)
      for (const auto& [v, coeff] : idx[k].index_terms()) unit[v] -= 1;  // strided elsewhere
  };
  score(c.output_indices, 3);
  for (const auto& a : c.inputs) score(a.indices, 2);
  std::string innermost;
  int best = 0;
  for (const auto& v : variables)
    if (unit[v] > best) {
      best = unit[v];
      innermost = v;
    }
  if (std::all_of(variables.begin(), variables.end(), [&](const std::string& v) { return in_output.count(v) != 0; }))
    innermost.clear();
  auto extent = [&bounds](const std::string& v) {
    for (const auto& b : bounds)
      if (b.name == v) return b.max - b.min + 1;
    return int64_t{1};
  };
  BandOrder band;
  std::vector<size_t>& order = band.order;
  for (size_t k = 0; k < variables.size(); ++k)
    if (in_output.count(variables[k]) && variables[k] != innermost) order.push_back(k);
  // Output variables in the order of their distance in memory, farthest first: the output is walked
  // forward, also where one index holds several (a pooling gradient's v_0 + 2*v_1 is v_1's rows, then v_0's).
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return output_stride(c.output_indices, variables[x], out_shape) > output_stride(c.output_indices, variables[y], out_shape);
  });
  // Too few outer iterations for the threads even with the first two fused (NestBuilder::fuse_leading):
  // the widest variable goes first.
  if (!order.empty()) {
    auto widest = std::max_element(order.begin(), order.end(),
                                   [&](size_t x, size_t y) { return extent(variables[x]) < extent(variables[y]); });
    const int64_t leading = extent(variables[order[0]]) * (order.size() > 1 ? extent(variables[order[1]]) : 1);
    if (leading < 4 * threads) std::rotate(order.begin(), widest, widest + 1);
  }
  band.outputs = order.size();
  for (size_t k = 0; k < variables.size(); ++k)
    if (!in_output.count(variables[k]) && variables[k] != innermost) order.push_back(k);
  for (size_t k = 0; k < variables.size(); ++k)
    if (variables[k] == innermost) order.push_back(k);
  band.innermost = !innermost.empty();
  band.innermost_output = in_output.count(innermost) != 0;
  return band;
}

// The GPU's band order: the output variables in the order of the output's indices (the last, contiguous
// in memory, is mapped to threads x), then the reduction variables.
BandOrder gpu_band_order(const Contraction& c, const std::vector<std::string>& variables) {
  BandOrder band;
  std::vector<bool> taken(variables.size());
  for (const auto& p : c.output_indices)
    for (size_t k = 0; k < variables.size(); ++k)
      if (!taken[k] && p.coefficient(variables[k]) != Rational(0)) {
        band.order.push_back(k);
        taken[k] = true;
      }
  band.outputs = band.order.size();
  for (size_t k = 0; k < variables.size(); ++k)
    if (!taken[k]) band.order.push_back(k);
  return band;
}

// A reduction in which an input element that other output elements read again is read again soon: within
// `near` bytes of output walked (times the reduction points of each output element). No input lacks an
// output variable (a row sum, a comparison count), or only variables close in the output (a pooling
// gradient's v_0 in v_0 + 2*v_1, with one reduction point).
bool near_reuse_only(const Contraction& c, const std::vector<poly::VariableBounds>& bounds, const TensorType& out,
                     double near) {
  std::vector<std::string> outputs, reductions;
  for (const auto& v : c.index_variables()) (uses(c.output_indices, v) ? outputs : reductions).push_back(v);
  if (reductions.empty()) return false;
  double points = 1;
  for (const auto& b : bounds)
    if (std::find(reductions.begin(), reductions.end(), b.name) != reductions.end()) points *= static_cast<double>(b.max - b.min + 1);
  auto distance = [&](const std::string& v) {  // bytes of output between outputs one apart in v
    return output_stride(c.output_indices, v, out.shape) * static_cast<double>(dtype_bytes(out.dtype)) * points;
  };
  return std::all_of(c.inputs.begin(), c.inputs.end(), [&](const TensorAccess& in) {
    return std::all_of(outputs.begin(), outputs.end(), [&](const std::string& v) { return uses(in.indices, v) || distance(v) <= near; });
  });
}

// An empty nest of `kind` writing `tensor`, named after both.
Nest new_nest(Nest::Kind kind, const std::string& tensor, const char* suffix) {
  Nest n;
  n.kind = kind;
  n.name = tensor + suffix;
  n.tensor = tensor;
  return n;
}

std::vector<std::string> element_variables(const TensorType& t) {
  std::vector<std::string> vars;
  for (size_t k = 0; k < t.shape.size(); ++k) vars.push_back("i" + std::to_string(k));
  return vars;
}

// The nests of a program, statement by statement, in one isl context (the builder's).
class ProgramScheduler {
 public:
  ProgramScheduler(const Program& program, const ProgramTypes& types, const Target& target, const NestSink& sink)
      : program_(program), types_(types), target_(target), sink_(sink), builder_(target),
        fusion_(internal::plan_nest_fusion(program, types)), inside_other_nests_(fusion_.inlined) {}

  Schedule run() {
    size_t final = 0;  // nests before it are in their places: a statement only inserts among its own
    for (size_t index = 0; index < program_.statements.size(); ++index) {
      const auto& st = program_.statements[index];
      if (inside_other_nests_.count(index)) continue;
      if (const auto* e = std::get_if<Elementwise>(&st)) {
        elementwise(*e, box(element_variables(types_.tensors.at(e->output)), types_.tensors.at(e->output).shape));
      } else {
        contraction(index, std::get<Contraction>(st));
      }
      for (; final < out_.nests.size(); ++final) {
        out_.nests[final].stream = streams(final, index);
        if (sink_) sink_(final, out_.nests[final]);
      }
    }
    if (!target_.gpu && target_.cpu.row_groups) {
      std::set<std::string> kept(program_.outputs.begin(), program_.outputs.end());
      for (const auto& in : program_.inputs) kept.insert(in.name);
      out_.groups = internal::group_nests(out_.nests, rows_, types_, target_, kept);
    }
    return std::move(out_);
  }

 private:
  // Nest::stream for nest k, of statement `statement`, once that statement's nests are all placed: a CPU
  // nest of plain loops, or a micro-kernel without epilogue whose blocks store their accumulators once
  // (no reduction tile loads them back), writing a program output without reading it, where no later nest
  // of the statement and no later statement touches the output, and the output is at least a quarter of
  // the last-level cache; or a copy into panels (panel_copy). Not a transposition: its squares store half
  // lines (256-bit rows), which past the caches took the 2048 x 2048 one from 1.6 to 3.2 ms.
  bool streams(size_t k, size_t statement) const {
    const Nest& n = out_.nests[k];
    if (target_.gpu || !target_.cpu.stream_stores || n.reduction || n.kernel || n.accumulators || n.transpose_lanes) return false;
    if (n.microkernel) {
      if (n.epilogue || n.permuted_copy || has_statement(n.root, LoopNode::Statement::load)) return false;
    } else if (n.points < 0 ||
               (n.kind == Nest::Kind::update && !n.stores && n.contraction.aggregation != AggregationOp::assign)) {
      return false;
    }
    auto touches = [&](const std::vector<std::string>& tensors) {
      return std::find(tensors.begin(), tensors.end(), n.tensor) != tensors.end();
    };
    for (size_t j = k + 1; j < out_.nests.size(); ++j)
      if (touches(nest_tensors(out_.nests[j]))) return false;
    if (std::find(program_.outputs.begin(), program_.outputs.end(), n.tensor) == program_.outputs.end())
      return panel_copy(n, statement);
    if (types_.tensors.at(n.tensor).bytes() < target_.cpu.l3_bytes / 4) return false;
    for (size_t j = statement + 1; j < program_.statements.size(); ++j)
      if (touches(statement_operands(program_.statements[j]))) return false;
    return true;
  }

  // A copy into a tensor of the program's own of a core's L2 or more, that later statements only read (a
  // micro-kernel's packed panels, plan.h pack_vector_operand) also stores past the caches. Every thread
  // of the consumer reads all of it, so when the next run copies it again its lines sit in both cores'
  // caches, and each store waits for the other core's copy to be dropped. On a 2-core Zen 4 guest whose
  // vCPUs sat far apart (some hours: the host moves them), a C model of that wrote 1.2 MiB per thread in
  // 0.48 ms (2.5 GB/s) and in 0.046 ms past the caches, read back by both threads in 0.085 ms against
  // 0.077; there a 3x3 256->256 conv's packing of its weights took 0.47 ms of 7.7, and the conv ran in
  // 7.62-7.66 ms with its panels past the caches against 7.96-8.00. Where they sat near: 7.82 against
  // 7.94, the packing 0.11 ms either way; sgemm 2000 (16 MiB of panels) 73.7 -> 73.3 ms.
  bool panel_copy(const Nest& n, size_t statement) const {
    if (n.microkernel || n.kind != Nest::Kind::update || n.contraction.aggregation != AggregationOp::assign ||
        n.contraction.inputs.size() != 1 || types_.tensors.at(n.tensor).bytes() < target_.cpu.l2_bytes)
      return false;
    for (size_t j = statement + 1; j < program_.statements.size(); ++j)
      if (std::visit([](const auto& st) { return st.output; }, program_.statements[j]) == n.tensor) return false;
    return true;
  }

  static bool has_statement(const LoopNode& n, LoopNode::Statement statement) {
    if (n.kind == LoopNode::Kind::statement && n.statement == statement) return true;
    auto any = [&](const std::vector<LoopNode>& nodes) {
      return std::any_of(nodes.begin(), nodes.end(), [&](const LoopNode& c) { return has_statement(c, statement); });
    };
    return any(n.body) || any(n.otherwise);
  }

  isl::set box(const std::vector<std::string>& vars, const std::vector<int64_t>& shape) {
    return internal::box(builder_.ctx.get(), "S", vars, shape);
  }

  // Row groups: what each nest of out_.nests reads and writes by outer iteration (rows_[k] for nest k),
  // where it can join a group.
  void add(Nest nest, std::optional<internal::RowAccess> rows, std::optional<size_t> at = std::nullopt) {
    const size_t k = at.value_or(out_.nests.size());
    out_.nests.insert(out_.nests.begin() + static_cast<long>(k), std::move(nest));
    rows_.insert(rows_.begin() + static_cast<long>(k), std::move(rows));
  }

  // The accesses of `nest`, whose tree generate() translated last, by outer iteration: `accesses()` gives
  // the writes and reads over S (only called for a nest that may join a group), `outer` maps S to the outer
  // loop (read from the tree when not given). Nothing for a nest that cannot join a row group.
  template <typename Accesses>
  std::optional<internal::RowAccess> row_access(const Nest& nest, Accesses accesses, std::optional<isl::map> outer = std::nullopt) {
    const bool split = nest.parallel_outer && nest.outer_hi > nest.outer_lo;  // as the runtime splits it
    if (target_.gpu || !target_.cpu.row_groups || !split || nest.microkernel) return std::nullopt;
    if (!outer) outer = internal::outer_loop(*builder_.last_tree);
    if (!outer) return std::nullopt;
    const auto [writes, reads] = accesses();
    if (writes.is_empty()) return std::nullopt;
    const isl::union_map by_row = isl::union_map(*outer).intersect_domain(writes.domain());
    // The map must be the loop the runtime splits: isl emits no loop for a dimension of one value (a tile
    // loop with one tile), and the outermost emitted loop is then a later dimension.
    if (!by_row.isa_map() || !internal::spans(by_row.as_map(), nest.outer_lo, nest.outer_hi)) return std::nullopt;
    return internal::RowAccess{writes.apply_domain(by_row), reads.apply_domain(by_row)};
  }

  // { from[i...] -> tensor[...] }: how an elementwise expression over elements of `shape` reads `tensor`
  // (numpy broadcasting: right-aligned, dims of extent 1 at 0).
  isl::map broadcast_read(const std::string& tensor, const std::vector<int64_t>& shape, const isl::id& from) {
    const std::vector<int64_t>& source = types_.tensors.at(tensor).shape;
    const std::vector<std::string> vars = element_variables(TensorType{DType::f32, shape});
    std::vector<std::string> at;
    for (size_t k = 0; k < source.size(); ++k) at.push_back(source[k] == 1 ? "0" : vars[shape.size() - source.size() + k]);
    return isl::map(builder_.ctx.get(), "{ A[" + join(vars) + "] -> B[" + join(at) + "] }")
        .set_domain_tuple(from)
        .set_range_tuple(isl::id(builder_.ctx.get(), tensor));
  }

  isl::union_map expression_reads(const Expr& e, const std::vector<int64_t>& shape, const isl::id& from) {
    std::vector<std::string> leaves;
    e.collect_tensors(leaves);
    isl::union_map reads = isl::union_map::empty(builder_.ctx.get());
    for (const auto& l : leaves) reads = reads.unite(broadcast_read(l, shape, from));
    return reads;
  }

  // { S[i...] -> tensor[i...] } over `domain`: a nest over output elements writing them (the tensor read
  // at its own shape).
  isl::union_map element_writes(const std::string& tensor, const isl::set& domain) {
    return isl::union_map(broadcast_read(tensor, types_.tensors.at(tensor).shape, statement_id()).intersect_domain(domain));
  }

  // Where the init nest of a contraction without default runs: the output elements no point of the update
  // nest writes (`covered` by it), or nowhere.
  static void init_outside(std::optional<isl::set>& init_domain, const isl::set& elements, const isl::set& covered) {
    const isl::set rest = elements.subtract(covered).coalesce();
    init_domain.reset();
    if (!rest.is_empty()) init_domain = rest;
  }

  const isl::id& statement_id() const { return builder_.statements.id(LoopNode::Statement::plain); }

  // An elementwise statement over `domain` (a part of its output's box).
  void elementwise(const Elementwise& e, const isl::set& domain) {
    const TensorType& t = types_.tensors.at(e.output);
    Nest nest = new_nest(Nest::Kind::elementwise, e.output, ".elementwise");
    nest.elementwise = e;
    nest.variables = element_variables(t);
    build_over_elements(nest, domain, t);
    auto rows = row_access(nest, [&] {
      return std::pair{element_writes(e.output, domain), expression_reads(e.expr, t.shape, statement_id()).intersect_domain(domain)};
    });
    add(std::move(nest), std::move(rows));
  }

  // A nest over output elements (elementwise, init, finalize): one band over them in order, the first
  // coincident (distinct elements), no reductions.
  // `lead_bytes`, where not 0, stands for the output's size in fuse_leading's choice.
  void build_over_elements(Nest& nest, const isl::set& domain, const TensorType& t, bool coincident = true, int64_t lead_bytes = 0) {
    std::vector<size_t> identity(nest.variables.size());
    for (size_t k = 0; k < identity.size(); ++k) identity[k] = k;
    // Distinct points write distinct elements: a GPU kernel maps all of them; the CPU splits the first (or
    // the first two fused, NestBuilder::fuse_leading).
    const size_t members = target_.gpu ? identity.size() : std::min<size_t>(2, identity.size());
    builder_.build(nest, domain, nest.variables, identity, coincident && !identity.empty() ? members : 0,
                   {dtype_bytes(t.dtype), false, false, lead_bytes ? lead_bytes : t.bytes(), {}});
  }

  Nest element_nest(const Contraction& c, Nest::Kind kind, const char* suffix) const {
    Nest n = new_nest(kind, c.output, suffix);
    n.contraction = c;
    n.variables = element_variables(types_.tensors.at(c.output));
    return n;
  }

  // Up to three nests: init (identity or default tensor), update (the valid points), finalize (elements
  // no valid point writes). The init nest is built last, once the update has decided what it must cover.
  void contraction(size_t index, const Contraction& c) {
    const TensorType& t = types_.tensors.at(c.output);
    poly::internal::IslAnalysis analysis = poly::internal::analyze(c, types_, builder_.ctx.get());
    const bool empty = analysis.summary.empty;
    // The elements the valid points write, over S like every statement domain.
    const isl::set written = isl_support::set_tuple_id(analysis.write.range(), builder_.statements.id(LoopNode::Statement::plain));
    const isl::set elements = box(element_variables(t), t.shape);
    // An assign without default writes its elements once: the init nest covers only the others (none for a
    // copy or a transpose, a padded panel's tail).
    std::optional<isl::set> init_domain = elements;
    if (c.aggregation == AggregationOp::assign && !c.init && !empty) init_outside(init_domain, elements, written);
    const size_t init_index = out_.nests.size();
    const bool microkernel = !empty && update(index, c, analysis, elements, written, init_domain);
    if (init_domain) {
      Nest init = element_nest(c, Nest::Kind::init, ".init");
      // The init of rows whose first two output variables run as one (RowReduction::fused_outer) fuses its
      // first two as they do, by the same bytes, so that the two share their outer loop (a row group).
      const bool fused_rows = !microkernel && !out_.nests.empty() && out_.nests.back().reduction &&
                              !out_.nests.back().reduction->fused_outer.empty();
      build_over_elements(init, *init_domain, t, true, fused_rows ? internal::rows_read_bytes(c, types_) : 0);
      auto rows = row_access(init, [&] {
        isl::union_map reads = isl::union_map::empty(builder_.ctx.get());
        if (c.init) reads = expression_reads(Expr::tensor(*c.init), t.shape, statement_id()).intersect_domain(*init_domain);
        return std::pair{element_writes(c.output, *init_domain), reads};
      });
      add(std::move(init), std::move(rows), init_index);
    }
    if (microkernel) return;  // a micro-kernel sums: no finalize
    const bool needs_finalize = !c.init && (c.aggregation == AggregationOp::product || c.aggregation == AggregationOp::max ||
                                            c.aggregation == AggregationOp::min);
    if (!needs_finalize) return;
    // Elements no valid point writes: the box minus the image of the write map.
    isl::set unwritten = empty ? elements : elements.subtract(written).coalesce();
    if (!empty && unwritten.is_empty()) return;
    Nest finalize = element_nest(c, Nest::Kind::finalize, ".finalize");
    build_over_elements(finalize, unwritten, t, /*coincident=*/false);
    auto rows = row_access(finalize, [&] { return std::pair{element_writes(c.output, unwritten), isl::union_map::empty(builder_.ctx.get())}; });
    add(std::move(finalize), std::move(rows));
  }

  // A reduction whose output variables are all the output's contiguous one, innermost in the band (a column
  // sum S[j] = +(X[i, j]), a column maximum), has no outer output loop for the threads: its band leads with
  // the reduction. That variable is cut into column tiles instead, each a whole number of the output's cache
  // lines (no line written by two threads) and at most half of L1 (the tile's elements stay there across the
  // reduction), as many tiles as a multiple of the threads; the tiles' loop goes outermost and the threads
  // split it, so that each thread reads its columns of every row. 0: no tiles (one thread, few columns).
  int64_t column_tile(const std::vector<poly::VariableBounds>& bounds, const std::string& v, const TensorType& t) const {
    const int64_t threads = target_.threads;
    if (threads < 2) return 0;
    int64_t extent = 0;
    for (const auto& b : bounds)
      if (b.name == v) extent = b.max - b.min + 1;
    const int64_t bytes = static_cast<int64_t>(dtype_bytes(t.dtype));
    const int64_t line = std::max<int64_t>(1, 64 / bytes);
    if (extent < 2 * threads * line) return 0;
    const int64_t most = std::max(line, target_.cpu.l1_bytes / (2 * bytes));
    const int64_t tiles = threads * ((extent + threads * most - 1) / (threads * most));
    const int64_t width = (extent + tiles - 1) / tiles;
    return (width + line - 1) / line * line;
  }

  // A copy of 4- or 8-byte elements whose every index is one variable (a permutation of the output's), with
  // the input's contiguous variable not the output's and both at least a square long: the CPU strategy
  // tiles the two by squares (rows of 256 bits, or of a vector where narrower) and the code generator
  // transposes them in registers (Nest::transpose_lanes), so that both tensors are read and written a
  // vector at a time.
  void transposition(const Contraction& c, const Nest& update, const BandOrder& band, NestFacts& facts) {
    const TensorType& out = types_.tensors.at(c.output);
    if (c.aggregation != AggregationOp::assign || c.combination != CombinationOp::none || c.init || c.inputs.size() != 1 ||
        !update.inlined.empty() || band.order.size() < 2 || band.outputs != band.order.size())
      return;
    const TensorType& in = types_.tensors.at(c.inputs[0].tensor);
    const int bytes = static_cast<int>(dtype_bytes(out.dtype));
    if (in.dtype != out.dtype || (bytes != 4 && bytes != 8) || in.shape.empty()) return;
    // A square is `lanes` vectors of the input along its last index, one per value of the output's last
    // variable, and as many of the output along its last index: both last indices are plain variables, the
    // input's in no other index of the input and the output's in no other index of the output. The other
    // indices may be any affine form (a conv gradient's packed weights K_P[tb, j, i, co, tl] = K[j, i,
    // 64*tb + tl, co] read rows of K with the output's last variable): the rows' addresses are computed as
    // the loops' would be.
    const std::vector<Polynomial>& out_indices = c.output_indices;
    const std::vector<Polynomial>& in_indices = c.inputs[0].indices;
    if (out_indices.empty() || !out_indices.back().variable() || !in_indices.back().variable()) return;
    const std::string last = update.variables[band.order.back()];
    const std::string contiguous = *in_indices.back().variable();
    auto mentioned = [](const std::vector<Polynomial>& indices, const std::string& v) {
      return std::any_of(indices.begin(), indices.end() - 1, [&](const Polynomial& p) { return p.index_terms().count(v) > 0; });
    };
    if (mentioned(in_indices, contiguous) || mentioned(out_indices, last)) return;
    // Squares of 256-bit rows even with 512-bit vectors (8 f32, 4 f64): on a Zen 4 (AVX-512 in two
    // 256-bit halves) 8 x 8 f32 squares in tiles of a cache line moved a 2048 x 2048 transposition at
    // 29-30 GB/s against 23-25 with 16 x 16 squares, and NHWC -> NCHW of 8x56x56x64 at 120-154 against 70
    // (56 columns are 7 squares of 8, but three of 16 and an edge); 8 x 8 f64 squares were slower than
    // the strided loops before them.
    // A core that runs 512-bit vectors whole (two 512-bit FMAs a cycle: Intel's AVX-512 cores) moves
    // squares of 512-bit rows, a cache line each, where both contiguous variables' ranges are whole
    // squares: on an Emerald Rapids guest, where 8 x 8 squares write each of the output's lines in two
    // halves and a 2048 x 2048 transposition's half-written lines (8 KiB apart, in one set of L1) were
    // evicted between their halves, it took 0.89-0.91 ms against 1.42-1.52 (in tiles of two squares along
    // the input's contiguous variable, see cpu_plain_nest; 0.99-1.03 ms in tiles of one); 2000 x 2000
    // moved as fast either way (0.71-0.78 ms). Where a range ends in half a square, the edge squares move
    // their quarters as squares of 256-bit rows (Nest::transpose_half_edges), which paid only where a
    // square's rows of the input lie within 4 KiB (NHWC -> NCHW of 8x56x56x64, rows 256 bytes apart:
    // 0.28 ms against 0.33-0.35); with rows pages apart it cost (NCHW -> NHWC of 8x56x56x64: 0.38-0.40
    // against 0.33; 1000 x 4000 1.23-1.30 against 0.97-1.05), as did an edge of 8 in the loops.
    const int narrow = std::min(256, target_.cpu.vector_bits) / (8 * bytes), wide = target_.cpu.vector_bits / (8 * bytes);
    auto whole = [&](int64_t range) { return range % wide == 0; };
    auto half_edge = [&](int64_t range) { return range >= wide && range % wide % narrow == 0; };
    const bool full_width = target_.cpu.vector_bits == 512 && target_.cpu.fma_per_cycle == 2;
    const bool whole_lines = full_width && whole(in.shape.back()) && whole(out.shape.back());
    const bool half_edges = full_width && !whole_lines && half_edge(in.shape.back()) && half_edge(out.shape.back()) &&
                            facts.innermost_input_stride * wide <= 4096;  // a square's input rows: a step of `last` apart
    const int lanes = whole_lines || half_edges ? wide : narrow;
    if (contiguous == last || last != *out_indices.back().variable() || lanes < 4 || in.shape.back() < lanes || out.shape.back() < lanes) return;
    // The builder names the domain's dims positionally (d0, d1, ...).
    for (size_t k = 0; k < update.variables.size(); ++k)
      if (update.variables[k] == contiguous) facts.transpose_variable = "d" + std::to_string(k);
    facts.transpose_lanes = lanes;  // the builder sets update.transpose_lanes where it tiles by squares
    facts.transpose_half_edges = half_edges;
  }

  // The update nest: a micro-kernel or a row reduction when the CPU strategy takes it, else a plain nest.
  // True when it ran as a micro-kernel.
  bool update(size_t index, const Contraction& c, const poly::internal::IslAnalysis& analysis, const isl::set& elements,
              const isl::set& written, std::optional<isl::set>& init_domain) {
    const TensorType& t = types_.tensors.at(c.output);
    Nest update = new_nest(Nest::Kind::update, c.output, ".update");
    update.contraction = c;
    update.variables = c.index_variables();
    if (auto in = fusion_.inlined_into.find(index); in != fusion_.inlined_into.end())
      for (const auto& [tensor, producer] : in->second) update.inlined[tensor] = std::get<Elementwise>(program_.statements[producer]);
    const BandOrder band = target_.gpu ? gpu_band_order(c, update.variables)
                                       : band_order(c, update.variables, analysis.summary.bounds, t.shape, target_.threads);
    // Distinct values of the output variables write distinct elements: their loops may run on different threads.
    const bool injective = (band.outputs > 0 || band.innermost_output) && poly::internal::writes_each_output_once(c, types_, analysis);
    const bool parallel = band.outputs > 0 && injective;
    const isl::set domain = isl_support::set_tuple_id(analysis.domain, builder_.statements.id(LoopNode::Statement::plain));
    // Band maps name dims positionally (isl may print fixed dims as "n = 0" in the tuple).
    std::vector<std::string> positional;
    for (size_t k = 0; k < update.variables.size(); ++k) positional.push_back("d" + std::to_string(k));
    const int64_t out_bytes = t.bytes();
    // A row reduction before the micro-kernel where the micro-kernel's lanes would be thin, after it elsewhere.
    const bool thin = !target_.gpu && thin_microkernel(c, analysis.summary.bounds);
    auto try_rows = [&] { return builder_.try_row_reduction(update, c, types_, analysis.summary, domain, positional, injective); };
    bool row_reduction = thin && try_rows();
    if (!row_reduction && !target_.gpu && parallel && microkernel(index, c, analysis, update, domain, positional, out_bytes, elements, init_domain))
      return true;
    if (!row_reduction && !thin && !target_.gpu) row_reduction = try_rows();
    std::optional<isl::map> outer;  // a row reduction's outer loop: its first output variable
    // A row reduction's rows run on the threads also where its output variable is the output's contiguous one
    // (a row sum: S[i] = +(X[i, j]), whose band leads with no output variable).
    if (row_reduction) {
      const RowReduction& red = *update.reduction;
      if (!red.outputs.empty())
        outer = isl::map(builder_.ctx.get(), "{ S[" + join(positional) + "] -> [" +
                                                 (red.fused_outer.empty() ? positional[red.outputs[0]] : red.fused_outer) + "] }");
    } else {
      if (!target_.gpu && !c.init && c.aggregation == AggregationOp::sum && analysis.write.is_injective()) {
        update.stores = true;
        init_outside(init_domain, elements, written);
      }
      NestFacts facts{dtype_bytes(t.dtype), /*update=*/true, band.innermost, out_bytes, {}};
      facts.near_reuse_only = near_reuse_only(c, analysis.summary.bounds, t, static_cast<double>(target_.cpu.l2_bytes) / 2);
      if (!band.order.empty()) {  // none without variables (a copy of one element)
        const std::string& last = update.variables[band.order.back()];
        for (const auto& a : c.inputs) {
          const TensorType& in = types_.tensors.at(a.tensor);
          const double stride = output_stride(a.indices, last, in.shape) * static_cast<double>(dtype_bytes(in.dtype));
          facts.innermost_input_stride = std::max(facts.innermost_input_stride, static_cast<int64_t>(std::min(stride, 1e15)));
        }
      }
      if (!target_.gpu && parallel) transposition(c, update, band, facts);
      if (!target_.gpu && !parallel && injective && band.innermost_output)
        facts.column_tile = column_tile(analysis.summary.bounds, update.variables[band.order.back()], t);
      if (target_.gpu) {  // for the accumulators and shared-memory promotion
        facts.write = analysis.write.set_domain_tuple(builder_.statements.id(LoopNode::Statement::plain));
        for (size_t k = 0; k < c.inputs.size(); ++k)
          facts.reads.push_back({c.inputs[k].tensor, analysis.reads[k].set_domain_tuple(builder_.statements.id(LoopNode::Statement::plain)),
                                 dtype_bytes(types_.tensors.at(c.inputs[k].tensor).dtype)});
      }
      builder_.build(update, domain, positional, band.order, parallel ? band.outputs : 0, facts);
      if (target_.gpu && update.accumulators && target_.gpu->keep_accumulators && !c.init && c.aggregation != AggregationOp::assign &&
          init_domain && elements.is_subset(written)) {
        update.accumulators->from_identity = true;
        init_domain.reset();
      }
    }
    auto rows = row_access(update, [&] {
      isl::union_map reads = isl::union_map::empty(builder_.ctx.get());
      for (size_t k = 0; k < c.inputs.size(); ++k) {
        isl::union_map read(analysis.reads[k].set_domain_tuple(statement_id()));
        if (auto in = update.inlined.find(c.inputs[k].tensor); in != update.inlined.end())
          read = read.apply_range(expression_reads(in->second.expr, types_.tensors.at(in->first).shape, isl::id(builder_.ctx.get(), in->first)));
        reads = reads.unite(read);
      }
      return std::pair{isl::union_map(analysis.write.set_domain_tuple(statement_id())), reads};
    }, outer);
    add(std::move(update), std::move(rows));
    return false;
  }

  // Whether c's micro-kernel would have a vector variable of a quarter of a vector or less (an NCHW depthwise
  // conv's weight gradient, DK[c, j, i], its 3 values of i in 16 lanes): a row reduction, where one applies,
  // fills its lanes instead (along x there; 8x64x56x56 on 2 threads: 2.8-3.3 ms -> 0.89-0.95).
  bool thin_microkernel(const Contraction& c, const std::vector<poly::VariableBounds>& bounds) const {
    const std::optional<MicroPlan> plan = plan_microkernel(c, types_, bounds, target_, false);
    if (!plan) return false;
    for (const auto& b : bounds)
      if (b.name == plan->vector) return (b.max - b.min + 1) * 4 <= plan->lanes;
    return false;
  }

  // Blocks start from zero, so the init nest shrinks to the elements no block stores (or disappears), and
  // an elementwise consumer runs in the blocks (and as a nest over the unstored elements), as does an assign
  // that permutes the output (Nest::permuted_copy) where the blocks store every element.
  bool microkernel(size_t index, const Contraction& c, const poly::internal::IslAnalysis& analysis, Nest& update,
                   const isl::set& domain, const std::vector<std::string>& positional, int64_t out_bytes,
                   const isl::set& elements, std::optional<isl::set>& init_domain) {
    auto consumer = fusion_.epilogue_of.find(index);
    const Elementwise* epilogue =
        consumer == fusion_.epilogue_of.end() || c.init ? nullptr : &std::get<Elementwise>(program_.statements[consumer->second]);
    auto copy = fusion_.permuted_copy_of.find(index);
    const Contraction* permuted =
        copy == fusion_.permuted_copy_of.end() ? nullptr : &std::get<Contraction>(program_.statements[copy->second]);
    const std::optional<Nest> before = permuted ? std::optional(update) : std::nullopt;
    isl::set stored;
    if (!builder_.try_microkernel(update, c, types_, analysis, domain, positional, out_bytes, c.init ? nullptr : &stored, epilogue,
                                  permuted))
      return false;
    if (!c.init) init_outside(init_domain, elements, stored);
    if (update.permuted_copy && init_domain) {
      // Elements no block stores hold the identity in the contraction's output, and the assign would have
      // to move them too: it keeps a nest of its own, and the blocks store as usual.
      update = *before;
      if (!builder_.try_microkernel(update, c, types_, analysis, domain, positional, out_bytes, &stored, epilogue))
        throw InternalError("micro-kernel of " + c.output + " refused without its permuted copy");
      init_outside(init_domain, elements, stored);
    }
    if (update.permuted_copy) inside_other_nests_.insert(copy->second);
    add(std::move(update), std::nullopt);
    if (epilogue) {
      inside_other_nests_.insert(consumer->second);
      if (init_domain) elementwise(*epilogue, *init_domain);  // the elements no block stores
    }
    return true;
  }

  const Program& program_;
  const ProgramTypes& types_;
  const Target& target_;
  const NestSink& sink_;
  NestBuilder builder_;  // the isl context: every isl object above lives and dies inside its calls
  internal::NestFusion fusion_;
  std::set<size_t> inside_other_nests_;  // statements computed in another statement's nest
  Schedule out_;
  std::vector<std::optional<internal::RowAccess>> rows_;  // one per nest of out_
};

}  // namespace

Schedule schedule(const Program& program, const ProgramTypes& types, const Target& target, const NestSink& sink) {
  try {
    return ProgramScheduler(program, types, target, sink).run();
  } catch (const isl::exception& e) {
    throw InternalError(std::string("isl failed while scheduling: ") + e.what());
  }
}

}  // namespace polytile::sched
