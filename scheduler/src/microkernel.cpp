// Register-blocked update nests (see Microkernel in scheduler.h and BlockStep in nest_builder.h): the isl
// checks of a micro-kernel plan, the split of blocks into uniform and predicated ones, the isl footprint
// cost model, zero-initialized first tiles, fused epilogues, and the schedule tree
//   [outer band] -> [reduction tiles] -> [block band] -> Step(block, tile)
// whose one statement isl's AST leaves as a call, expanded by the translator into what a step does.
#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "affine.h"
#include "nest_builder.h"
#include "plan.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

using isl_support::text;

namespace {

constexpr double kPageBytes = 4096;

// Microkernel::prefetch_next_block: one block column; every broadcast input whose rows differ read at
// most once per element over the points without the vector variable (isl: the access restricted to the
// domain, v projected out, is injective), its rows less than a page apart and a page or more per block
// (rows in pages of their own, such as a batch dimension's images, are streams the prefetchers follow).
bool reads_pages_once(const Contraction& c, const ProgramTypes& types, const MicroPlan& plan,
                      const poly::internal::IslAnalysis& analysis, const Microkernel& mk) {
  if (mk.vector_hi - mk.vector_lo + 1 > int64_t{mk.chunks} * mk.lanes) return false;
  bool any = false;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const TensorAccess& in = c.inputs[k];
    if (!broadcast_per_row(in, plan)) continue;
    const TensorType& t = types.tensors.at(in.tensor);
    const double stride = output_stride(in.indices, plan.block, t.shape) * static_cast<double>(dtype_bytes(t.dtype));
    if (stride >= kPageBytes || stride * mk.rows < kPageBytes) return false;
    if (!isl_support::project_out_input(analysis.reads[k], static_cast<unsigned>(mk.vector)).is_injective()) return false;
    any = true;
  }
  return any;
}

// Microkernel::prefetch_epilogue: the tensors epilogue `e` reads with a different element for each row of
// a block (their trailing dims are the output's, as elementwise broadcasting aligns them, and the block
// variable's has more than one element there); not those the rows share (a bias).
std::vector<std::string> epilogue_prefetches(const Contraction& c, const Elementwise& e, const ProgramTypes& types,
                                             const std::string& block) {
  const size_t rank = c.output_indices.size();
  size_t at = rank;  // the output dim that holds the block variable
  for (size_t d = 0; d < rank; ++d)
    if (c.output_indices[d].coefficient(block) != Rational(0)) at = d;
  if (at == rank) return {};
  std::vector<std::string> leaves, out;
  e.expr.collect_tensors(leaves);
  for (const std::string& t : leaves) {
    if (t == c.output || std::find(out.begin(), out.end(), t) != out.end()) continue;
    const std::vector<int64_t>& shape = types.tensors.at(t).shape;
    if (shape.size() <= rank && at + shape.size() >= rank && shape[at + shape.size() - rank] > 1) out.push_back(t);
  }
  return out;
}

// MicrokernelChoices::block_strides: the bytes between consecutive values of each block dimension in the
// output -- the other output variables', a row block's (rows x the block variable's) and a column block's.
std::vector<double> block_strides(const Contraction& c, const ProgramTypes& types, const std::vector<std::string>& vars,
                                  const Microkernel& mk) {
  const TensorType& out = types.tensors.at(c.output);
  std::vector<Polynomial> idx;
  for (const auto& p : c.output_indices) idx.push_back(p.bind_dims(types.dims));
  auto stride = [&](size_t k, int64_t step) {
    return output_stride(idx, vars[k], out.shape) * static_cast<double>(step * static_cast<int64_t>(dtype_bytes(out.dtype)));
  };
  std::vector<double> strides;
  for (size_t k : mk.others) strides.push_back(stride(k, 1));
  strides.push_back(stride(mk.block, mk.rows));
  strides.push_back(stride(mk.vector, int64_t{mk.chunks} * mk.lanes));
  return strides;
}

}  // namespace

// Schedules `nest` (an update of `c`) as a micro-kernel when the plan and the isl checks allow it.
bool NestBuilder::try_microkernel(Nest& nest, const Contraction& c, const ProgramTypes& types,
                                  const poly::internal::IslAnalysis& analysis, const isl::set& domain,
                                  const std::vector<std::string>& positional, int64_t out_bytes, isl::set* stored_elements,
                                  const Elementwise* epilogue, const Contraction* permuted_copy) {
  const poly::ContractionAnalysis& a = analysis.summary;
  if (box_points(a.bounds) < target.cpu.microkernel_min_points) return false;
  std::optional<MicroPlan> plan = plan_microkernel(c, types, a.bounds, target, false);
  if (!plan) return false;
  auto index = [&nest](const std::string& v) {
    return static_cast<size_t>(std::find(nest.variables.begin(), nest.variables.end(), v) - nest.variables.begin());
  };
  std::vector<std::pair<int64_t, int64_t>> range(nest.variables.size());
  for (const auto& b : a.bounds) range[index(b.name)] = {b.min, b.max};
  Microkernel mk;
  mk.block = index(plan->block);
  mk.vector = index(plan->vector);
  mk.rows = plan->rows;
  mk.chunks = plan->chunks;
  mk.lanes = plan->lanes;
  mk.block_lo = range[mk.block].first;
  mk.vector_lo = range[mk.vector].first;
  mk.vector_hi = range[mk.vector].second;
  std::set<std::string> in_output;
  for (const auto& p : c.output_indices)
    for (const auto& [v, coeff] : p.index_terms()) in_output.insert(v);
  for (size_t k = 0; k < nest.variables.size(); ++k) {
    if (k == mk.block || k == mk.vector) continue;
    (in_output.count(nest.variables[k]) ? mk.others : mk.reductions).push_back(k);
  }
  // The vector variable's range may depend on the other output variables (a padded panel's last block
  // column) and on the reductions (a padded NCHW conv's x, with x + i - 1 in the image), never on the
  // block variable: then a point is valid exactly when its row is and its lane is, and a lane's validity
  // is the same in every row (border blocks mask their lanes at each reduction point).
  const isl::set lane_points = isl_support::eliminate(domain, static_cast<unsigned>(mk.block));
  if (!isl_support::eliminate(domain, static_cast<unsigned>(mk.vector)).intersect(lane_points).is_equal(domain)) return false;
  // Which other output variables leave the broadcast operands alone (they only pick columns of the
  // vector operand: a conv's output channel blocks, a packed matrix's panels). Without a broadcast operand
  // (a depthwise conv's image and weights both read the channels), none: they pick rows of the operands.
  // Also whether the rows of a block share a vector operand (sgemm's B panel, a conv's weights), or each
  // reads its own (an NCHW depthwise conv's image planes, one per channel row).
  // And the bytes of the vector and of the broadcast operands (MicrokernelChoices::columns_lead).
  std::vector<bool> picks_columns(mk.others.size(), true);
  bool broadcast = false, shared_vector = false;
  int64_t vector_bytes = 0, broadcast_bytes = 0;
  for (const auto& in : c.inputs) {
    if (uses(in.indices, plan->vector)) {
      shared_vector |= !uses(in.indices, plan->block);
      vector_bytes += types.tensors.at(in.tensor).bytes();
      continue;
    }
    broadcast = true;
    broadcast_bytes += types.tensors.at(in.tensor).bytes();
    for (size_t j = 0; j < mk.others.size(); ++j) picks_columns[j] = picks_columns[j] && !uses(in.indices, nest.variables[mk.others[j]]);
  }
  if (!broadcast) picks_columns.assign(mk.others.size(), false);
  // The inputs' access functions over S, not restricted to the domain: footprints are then those of
  // interior blocks, where every point of a tile is valid.
  const isl::id& S = statements.id(LoopNode::Statement::plain);
  std::vector<isl::map> reads;
  for (const isl::map& f : analysis.read_functions) reads.push_back(f.set_domain_tuple(S));
  // A small output with long reductions (a weight gradient) runs the reduction tiles outside its blocks.
  int64_t reduction_points = 1, longest = 0;
  for (size_t k : mk.reductions) {
    reduction_points *= range[k].second - range[k].first + 1;
    longest = std::max(longest, range[k].second - range[k].first + 1);
  }
  const bool weights = weight_mode(out_bytes, reduction_points, target);
  const bool l2_tiles = long_tiles(out_bytes, longest, target);
  if (target.cpu.prefetch) {
    mk.prefetch_bytes = broadcast_prefetch_bytes(c, types, *plan);
    if (!mk.prefetch_bytes && !mk.reductions.empty()) mk.prefetch_next_block = reads_pages_once(c, types, *plan, analysis, mk);
    // The vector operand 8 steps ahead where its tiles stream from L2: sgemm 2048 on one core of an
    // Emerald Rapids guest 1.02-1.03x (the bench's prefetch/sgemm/2048 pair, 8 interleaved repetitions).
    if (l2_tiles) mk.prefetch_vector_steps = 8;
    // The epilogue's rows for the next block (Microkernel::prefetch_epilogue). A transformer's training step
    // on the 2-core Xeon guest (old and new code in turns): its GELU-gradient product, whose epilogue reads
    // U and tanh(...) of the forward pass (4 MiB each) in 6 rows of 4 lines 4 KiB apart, 2.22-2.52 ->
    // 2.12-2.15 ms in a slow hour (the step 21.0 -> 20.6 ms, means of five), 2.02-2.14 -> 1.97-2.16 in a
    // faster one (the step 18.3 -> 18.1). Prefetching the output's lines for writing too gained nothing
    // more in the step and cost the product alone, its inputs in cache, 5% (1.83-1.97 -> 1.92-2.10 ms;
    // reads only 1.88-1.95, as before). A 3x3 conv with a residual add, whose next block's pixels follow
    // its own, ran the same (5.24-5.31 -> 5.12-5.26 ms).
    if (epilogue && stored_elements && !target.gpu) mk.prefetch_epilogue = epilogue_prefetches(c, *epilogue, types, nest.variables[mk.block]);
  }
  nest.microkernel = mk;
  if (epilogue && stored_elements) nest.epilogue = *epilogue;
  // The permuted copy where the block variable is contiguous in its output (the emitter stores each lane's
  // rows as one vector there); elsewhere the copy keeps a nest of its own.
  if (permuted_copy && stored_elements) {
    const std::vector<Polynomial> at = permuted_indices(c, *permuted_copy);
    bool contiguous = !at.empty() && at.back().coefficient(plan->block) == Rational(1);
    for (size_t d = 0; d + 1 < at.size(); ++d) contiguous = contiguous && at[d].coefficient(plan->block) == Rational(0);
    if (contiguous) nest.permuted_copy = *permuted_copy;
  }
  MicrokernelChoices choices;
  choices.weight_mode = weights;
  choices.zero_init = stored_elements != nullptr;
  choices.rereads_large_input.assign(mk.others.size(), false);
  for (size_t j = 0; j < mk.others.size() && !broadcast; ++j)
    for (const auto& in : c.inputs)
      if (!uses(in.indices, nest.variables[mk.others[j]]) && 2 * types.tensors.at(in.tensor).bytes() > target.cpu.l2_bytes)
        choices.rereads_large_input[j] = true;
  choices.columns_lead = 2 * vector_bytes > target.cpu.l2_bytes && 2 * broadcast_bytes <= target.cpu.l2_bytes;
  choices.picks_columns = std::move(picks_columns);
  choices.rows_share_vector = shared_vector;
  choices.long_tiles = l2_tiles;
  choices.block_strides = block_strides(c, types, nest.variables, mk);
  choices.lane_points = lane_points;
  isl::set stored = build_microkernel(nest, domain, positional, range, dtype_bytes(types.tensors.at(c.output).dtype), reads, choices);
  if (stored_elements) *stored_elements = stored.apply(analysis.write_function.set_domain_tuple(S).set_range_tuple(S));
  return true;
}

namespace {

// One micro-kernel nest under construction: the names of its isl tuples, and its steps in order. The
// points over F[others, Bb, Bv, reductions]; the blocks over B[others, Bb, Bv], the uniform ones (every
// row has the reduction points of row 0, every lane in range) apart; the tree's statement is
// Step[others, Bb, Bv, reduction tiles] (see BlockStep).
class MicrokernelNest {
 public:
  MicrokernelNest(NestBuilder& nb, const Microkernel& mk, const std::vector<std::string>& vars,
                  const std::vector<std::pair<int64_t, int64_t>>& range, size_t element_bytes)
      : nb_(nb), mk_(mk), vars_(vars), range_(range), eb_(static_cast<int64_t>(element_bytes)), R_(mk.rows),
        VL_(int64_t{mk.chunks} * mk.lanes) {
    for (size_t k : mk.others) others_.push_back(vars[k]);
    for (size_t k : mk.reductions) reds_.push_back(vars[k]);
    for (size_t k = 0; k < reds_.size(); ++k) tiles_.push_back("t" + s(static_cast<int64_t>(k)));
    block_dims_ = cat(others_, {"bb", "bv"});
    n_bb_ = (range[mk.block].second - mk.block_lo + R_) / R_;
    n_bv_ = (mk.vector_hi - mk.vector_lo + VL_) / VL_;
  }

  // The blocks, split into uniform ones (every row has the reduction points of row 0, every lane is in
  // range: they run unpredicated) and the others.
  void classify_blocks(const isl::set& domain, const isl::set& lane_points) {
    const Tuple S = named("S", vars_);
    std::vector<isl::aff> to_f = S.vars(others_);
    to_f.push_back(floor_div(S.var(vars_[mk_.block]), mk_.block_lo, R_));
    to_f.push_back(floor_div(S.var(vars_[mk_.vector]), mk_.vector_lo, VL_));
    for (const isl::aff& r : S.vars(reds_)) to_f.push_back(r);
    hull_ = domain.apply(S.to(unnamed("F", to_f.size()), to_f));
    // Rows that differ from row 0 of their block: X = (block dims, reductions, row).
    const Tuple X = named("X", cat(cat(block_dims_, reds_), {"dd"}));
    isl::set rows = domain.apply(X.to(unnamed("S", vars_.size()), at(X, false)).intersect_domain(X.where("dd", 0, R_ - 1)).reverse());
    // { X[.., dd = 0] -> X[.., e] : 0 <= e < R }
    std::vector<std::string> e_vars = X.dims();
    e_vars.back() = "e";
    const Tuple E = named("X", e_vars);
    std::vector<isl::aff> at_row0 = E.vars(cat(block_dims_, reds_));
    at_row0.push_back(E.constant(0));
    isl::set row0 = rows.apply(E.to(unnamed("X", at_row0.size()), at_row0).intersect_domain(E.where("e", 0, R_ - 1)).reverse());
    isl::set differ = rows.subtract(row0).unite(row0.subtract(rows));
    blocks_ = hull_.apply(to_blocks(named("F", cat(block_dims_, reds_))));
    // Blocks with a lane outside v's range at one of their reduction points (past v's end, past a padded
    // panel's columns, or past an image's border at a padded conv's kernel position): the lanes of row 0
    // (any row: `lane_points` has no block variable) at the block's points of the hull not in `lane_points`.
    const Tuple YR = named("Y", cat(cat(block_dims_, {"dd", "l"}), reds_));
    const isl::set row0_lanes =
        YR.to(unnamed("F", block_dims_.size() + reds_.size()), YR.vars(cat(block_dims_, reds_)))
            .intersect_domain(YR.where("dd", 0, 0).intersect(YR.where("l", 0, VL_ - 1)))
            .intersect_range(hull_)
            .domain();
    const isl::map lane_at = YR.to(unnamed("S", vars_.size()), at(YR, true)).intersect_domain(row0_lanes);
    const isl::set bad_lanes = row0_lanes.subtract(lane_at.intersect_range(lane_points).domain()).apply(to_blocks(YR)).intersect(blocks_);
    lanes_in_range_ = bad_lanes.is_empty();
    good_ = blocks_.subtract(differ.apply(to_blocks(X)).intersect(blocks_).unite(bad_lanes)).coalesce();
  }
  // After classify_blocks: no block has a lane outside v's range (Microkernel::lanes_in_range).
  bool lanes_in_range() const { return lanes_in_range_; }

  // Cost model: reduction tiles sized by footprints computed with isl. The inputs a block (in a
  // weight-gradient nest, a row of blocks across all columns) reads over one full reduction tile -- the
  // bounding box of the image of the tile's points under each access function -- must fit in three
  // quarters of L1: the vector operand is then reused from L1 by every block row; with long_tiles in
  // three eighths of L2, on a core of one FMA a cycle in an eighth (plan.h, reduction_tile_budget). Filled
  // innermost reduction variable first, each as large as fits (binary search), then balanced.
  // A weight-mode row whose columns fill that budget in fewer than kFewestTilePoints reduction points (a
  // skinny matmul's B read by a few rows of A, unpacked: 64 columns of 64 floats, 16 KiB a step of k) is
  // sized by one block instead, whose column's part the next blocks of the column reuse (they run one
  // after another, block_bands): tiles of 2 steps loaded and stored the accumulators every 48 FMAs. C =
  // A B, 16 x 4096 times 4096 x 4096 split into slices of k, on the 2-core Xeon guest with AMX
  // (2026-12-07, fastest of 15): 7.5-7.6 -> 3.3 ms (tiles of 128 steps), 6 rows 2.1-2.2 -> 1.4-1.6. Not
  // for rows that fill a tile's worth: the 3x3 128->128 weight gradient's rows (2 columns) took tiles of
  // 2 x 28 pixels, sized by one block 4 x 28, and ran 3-8% slower (NHWC 5.18-5.30 against 4.93-5.13 ms,
  // NCHW 5.10-5.45 against 4.96-5.06).
  static constexpr int64_t kFewestTilePoints = 16;
  void size_reduction_tiles(const std::vector<isl::map>& reads, bool weight_mode, bool long_tiles) {
    const isl::set block = blocks_.lexmin();
    if (!weight_mode) {
      fill_reduction_tiles(reads, block, long_tiles);
      return;
    }
    // The blocks of the representative's row in every column: { B[.., bv] -> B[.., bv2] }.
    const Tuple B = named("B", block_dims_);
    const isl::map row = B.to(unnamed("Row", block_dims_.size() - 1), B.vars(cat(others_, {"bb"})));
    fill_reduction_tiles(reads, block.apply(row.apply_range(row.reverse())).intersect(blocks_), long_tiles);
    int64_t points = 1;
    for (int64_t t : tile_) points *= t;
    if (points < kFewestTilePoints) fill_reduction_tiles(reads, block, long_tiles);
  }

  // tile_ and red_lo_ for the blocks `representative`, whose footprint fills the budget.
  void fill_reduction_tiles(const std::vector<isl::map>& reads, const isl::set& representative, bool long_tiles) {
    tile_.assign(reds_.size(), 1);
    red_lo_.assign(reds_.size(), 0);
    isl::set points = representative.apply(block_lanes());
    auto footprint = [&]() {
      isl::set piece = points;  // bounded by the tile (not through isl text: this runs ~10 times a nest)
      for (size_t k = 0; k < reds_.size(); ++k)
        piece = isl_support::bound(piece, static_cast<unsigned>(mk_.reductions[k]), red_lo_[k], red_lo_[k] + tile_[k] - 1);
      int64_t bytes = 0;
      for (const auto& access : reads) {
        isl::set image = piece.apply(access);
        if (image.is_empty()) continue;
        int64_t volume = 1;
        for (int d = 0; d < static_cast<int>(image.tuple_dim()); ++d) {
          isl::val lo = image.dim_min_val(d), hi = image.dim_max_val(d);
          if (lo.is_int() && hi.is_int()) volume *= hi.get_num_si() - lo.get_num_si() + 1;
        }
        bytes += volume * eb_;
      }
      return bytes;
    };
    for (size_t k = 0; k < reds_.size(); ++k) red_lo_[k] = range_[mk_.reductions[k]].first;
    const int64_t budget = reduction_tile_budget(long_tiles, nb_.target);
    for (size_t k = reds_.size(); k-- > 0;) {
      const int64_t e = range_[mk_.reductions[k]].second - red_lo_[k] + 1;
      int64_t lo = 1, hi = e;
      if (e > 1) {  // the whole range first: a conv's channels, a short kernel row often fit at once
        tile_[k] = e;
        if (footprint() <= budget) lo = e;
        else hi = e - 1;
      }
      while (lo < hi) {
        tile_[k] = (lo + hi + 1) / 2;
        if (footprint() <= budget) lo = tile_[k];
        else hi = tile_[k] - 1;
      }
      tile_[k] = equal_tiles(e, lo);
      if (tile_[k] < e) break;     // the outer reduction variables stay at one value per tile
    }
  }

  // The steps (every block and reduction tile with points, over Step[block dims, tiles]) and what each
  // does (see BlockStep): conditions and F loops that isl builds over the step's arguments as parameters.
  // A block's first tile (lexicographically) starts from zero accumulators when `zero_init`; its last
  // runs the epilogue when there is one.
  BlockStep block_step(bool zero_init, bool epilogue) {
    using Kind = BlockStep::Condition::Kind;
    const std::vector<std::string> step_dims = cat(block_dims_, tiles_);
    // Each reduction point with its step: { F[...] -> [Step[block dims, tiles] -> F[...]] }.
    const Tuple F = named("F", cat(block_dims_, reds_));
    std::vector<isl::aff> to_step = F.vars(block_dims_);
    for (size_t k = 0; k < reds_.size(); ++k) to_step.push_back(floor_div(F.var(reds_[k]), red_lo_[k], tile_[k]));
    std::vector<std::string> step_names(block_dims_.size(), "");
    step_names.insert(step_names.end(), tiles_.begin(), tiles_.end());
    const isl::map by_step = F.to(named("Step", step_names), to_step).range_product(F.to(unnamed("F", F.dims().size()), F.vars(F.dims())));
    const isl::map step_points = hull_.apply(by_step).unwrap();
    steps_ = step_points.domain().coalesce();
    BlockStep step;
    for (const std::string& d : step_dims) step.params.emplace_back(nb_.ctx.get(), d);
    auto first_params = [&](size_t n) {  // the first n of the step's parameter ids
      isl::id_list ids(nb_.ctx.get(), static_cast<int>(n));
      for (size_t k = 0; k < n; ++k) ids = ids.add(step.params[k]);
      return ids;
    };
    auto bind = [&](const isl::set& x, size_t n) { return x.bind(isl::multi_id(x.space(), first_params(n))); };
    // Tiles of the same block, the later on the right: lexicographically later steps of the same block.
    // (Each made only where a variant asks: without an epilogue no step needs to know it is the last.)
    const Tuple L = step_tuple();
    std::optional<isl::map> later;
    if (zero_init || epilogue) {
      const isl::map block = L.to(unnamed("B", block_dims_.size()), L.vars(block_dims_));
      later = isl::manage(isl_map_lex_lt(L.space().copy())).intersect(block.apply_range(block.reverse()));
    }
    const std::optional<isl::set> first =
        zero_init ? std::optional(bind(steps_.subtract(steps_.apply(*later)), step_dims.size())) : std::nullopt;
    const std::optional<isl::set> last =
        epilogue ? std::optional(bind(steps_.subtract(steps_.apply(later->reverse())), step_dims.size())) : std::nullopt;
    std::vector<isl::id> iterators;
    for (size_t k = 0; k < reds_.size(); ++k) iterators.emplace_back(nb_.ctx.get(), "r" + s(static_cast<int64_t>(k)));
    // Every step, and a condition of a step (its block's first tile, last tile, a uniform block) in one
    // variant's steps: never, always, or when an expression of its arguments holds. The expression is made
    // once, over all steps: valid in both variants, and without the terms that only tell them apart.
    const isl::set all = bind(steps_, step_dims.size());
    const isl::ast_build over_all = isl::ast_build::from_context(all);
    auto condition = [&](const isl::set& context, const isl::set& holds, std::optional<isl::ast_expr>& made) {
      BlockStep::Condition c;
      isl::set in = holds.intersect(context);
      if (in.is_empty()) return c;
      if (context.is_subset(in)) {
        c.kind = Kind::always;
        return c;
      }
      c.kind = Kind::when;
      if (!made) made = over_all.expr_from(holds.gist(all));
      c.expr = made;
      return c;
    };
    std::optional<isl::ast_expr> first_expr, last_expr, uniform_expr;
    // The points of every step as a set over F with the step's arguments as parameters.
    const isl::set points = step_points.bind_domain(isl::multi_id(step_points.domain().space(), first_params(step.params.size())));
    // The fma loops of the variant built last, over the points they were built for (any step's points,
    // whatever its arguments): the other variant takes the same loops when those points are its steps'
    // points, where it runs (the translator marks its fmas predicated).
    struct Built {
      isl::set points;
      std::optional<isl::ast_node> fma;
      std::shared_ptr<const FmaLoops> direct_fma;
    };
    std::optional<Built> loops;
    // The steps' arguments' ranges (over all steps: a box around either variant's), for the direct loops.
    std::vector<std::pair<int64_t, int64_t>> step_box;
    for (size_t k = 0; k < mk_.others.size(); ++k) step_box.push_back(range_[mk_.others[k]]);
    step_box.emplace_back(0, n_bb_ - 1);
    step_box.emplace_back(0, n_bv_ - 1);
    for (size_t k = 0; k < reds_.size(); ++k) step_box.emplace_back(0, (range_[mk_.reductions[k]].second - red_lo_[k]) / tile_[k]);
    auto variant = [&](const isl::set& context, bool predicated) {
      BlockStep::Variant v;
      if (zero_init) v.first = condition(context, *first, first_expr);
      if (epilogue) v.last = condition(context, *last, last_expr);
      if (loops && loops->points.intersect_params(context).is_equal(points.intersect_params(context))) {
        v.fma = loops->fma;
        v.direct_fma = loops->direct_fma;
        return v;
      }
      // The points simplified by the context, not intersected with it: they are the same where the step
      // runs, and a context that is a union (the border blocks: bb = 0 or bb = 13) would split the domain
      // into one piece per disjunct, with the block fixed in each, which isl then takes 2.5x as long to
      // turn into the same loops. Built without the context (isl takes several times as long with it).
      const isl::set domain = points.gist_params(context).coalesce();
      if (nb_.target.direct_step_loops) {
        if (std::optional<FmaLoops> direct = fma_loops(domain, step.params, reds_.size(), step_box)) {
          v.direct_fma = std::make_shared<const FmaLoops>(std::move(*direct));
          loops = Built{domain, std::nullopt, v.direct_fma};
          return v;
        }
      }
      const isl::id& fma = nb_.statements.id(LoopNode::Statement::fma, predicated);
      isl::schedule tree = isl::schedule::from_domain(isl::union_set(isl_support::set_tuple_id(domain, fma)));
      if (!reds_.empty()) {
        const Tuple points_of_fma = named(fma.name(), cat(block_dims_, reds_));
        isl::union_map order(points_of_fma.to(unnamed("", reds_.size()), points_of_fma.vars(reds_)));
        tree = tree.root().child(0).insert_partial_schedule(isl_support::partial_schedule(order)).schedule();
      }
      isl::ast_node built = isl_support::with_iterators(isl::ast_build(nb_.ctx.get()), iterators).node_from(tree);
      // A guard around all of it (with no else) holds wherever the domain has points, so at every step.
      if (built.isa<isl::ast_node_if>() && !built.as<isl::ast_node_if>().has_else_node()) built = built.as<isl::ast_node_if>().then_node();
      v.fma = built;
      loops = Built{domain, v.fma, nullptr};
      return v;
    };
    // Uniform blocks' steps and the others'.
    const isl::set uniform = all.intersect(bind(good_, block_dims_.size()));
    const isl::set predicated = all.subtract(uniform);
    if (!uniform.is_empty()) step.uniform = variant(uniform, false);
    if (!predicated.is_empty()) step.predicated = variant(predicated, true);
    if (step.uniform && step.predicated) {
      step.uniform_block = condition(all, uniform, uniform_expr);
      const isl::set at = predicated.unbind_params(isl::multi_id(steps_.space(), first_params(step.params.size())));
      for (size_t k = 0; k < step.params.size(); ++k) {
        const isl::val lo = at.dim_min_val(static_cast<int>(k)), hi = at.dim_max_val(static_cast<int>(k));
        step.predicated_fixed.push_back(lo.is_int() && lo.eq(hi) ? std::optional<int64_t>(lo.get_num_si()) : std::nullopt);
      }
    }
    return step;
  }

  // The points of S whose output elements the blocks store: their rows and the lanes in v's range, those
  // that some reduction point has (`lane_points` with the reductions unconstrained).
  isl::set stored_points(const isl::set& lane_points) {
    isl::set lanes = lane_points;
    for (size_t k : mk_.reductions) lanes = isl_support::eliminate(lanes, static_cast<unsigned>(k));
    return blocks_.apply(block_lanes()).intersect(lanes);
  }

  // The outer band (over which the threads split) and the block band inside the reduction tiles.
  // block_strides: bytes between consecutive values of each block dimension (others, Bb, Bv) in the output.
  void block_bands(bool weight_mode, const std::vector<bool>& picks_columns, bool rows_share_vector, const std::vector<double>& block_strides,
                   const std::vector<bool>& rereads_large_input, bool columns_lead) {
    int64_t tile_points = 1;
    for (int64_t t : tile_) tile_points *= t;
    if (weight_mode) {
      // A small output: split a block dimension across the threads, the first whose values the threads
      // share evenly (a split reduction's slices come first), else the one that leaves the fewest threads
      // idle at the end (3x3x64x64 weights: 11 blocks of 6 channels go 6 + 5, one thread idle for a block);
      // every thread then runs the reduction tiles outermost over all of its blocks.
      std::vector<int64_t> counts;
      for (size_t k : mk_.others) counts.push_back(range_[k].second - range_[k].first + 1);
      counts.push_back(n_bb_);
      counts.push_back(n_bv_);
      const int64_t threads = std::max(1, nb_.target.threads);
      auto idle = [threads](int64_t count) { return idle_values(count, threads); };
      // Not one whose values lie less than a page apart in the output per thread (a 128-channel weight
      // gradient's two 64-channel column blocks: each thread's 256 bytes of every 512-byte row): the
      // prefetchers of each core then fetch the other's lines, and the two pass the accumulators' lines
      // back and forth (that gradient on a 2-core Cascade Lake: 10.4-10.6 ms split by column blocks,
      // 7.8-7.9 ms by its 22 row blocks). Unless every dimension is like that.
      std::vector<bool> allowed(counts.size());
      for (size_t k = 0; k < counts.size(); ++k)
        allowed[k] = block_strides[k] * static_cast<double>((counts[k] + threads - 1) / threads) >= kPageBytes;
      if (std::find(allowed.begin(), allowed.end(), true) == allowed.end()) allowed.assign(counts.size(), true);
      size_t split = 0;  // the first allowed, until an even one: fewer idle values per value
      while (!allowed[split]) ++split;
      for (size_t k = split + 1; k < counts.size(); ++k)
        if (allowed[k] && idle(counts[split]) > 0 && idle(counts[k]) * counts[split] < idle(counts[split]) * counts[k]) split = k;
      int64_t chunk = (counts[split] + threads - 1) / threads;
      int64_t lo = split < mk_.others.size() ? range_[mk_.others[split]].first : 0;
      const Tuple L = step_tuple();
      outer_.push_back(floor_div(L.var(block_dims_[split]), lo, chunk));
      // The blocks of one column of the vector operand (the other variables that pick columns, then Bv)
      // run one after another: the column's part of the reduction tile stays in L1 for all of them. (A
      // 3x3 256->256 14x14 conv's four 64-channel column blocks, inside its rows, took their 32 KiB
      // tiles of the weights from L2 at every block: forward and data gradient 0.97 and 0.91 of oneDNN,
      // 0.99 and 0.99 this way.)
      for (size_t k = 0; k < others_.size(); ++k)
        if (picks_columns[k]) inner_.push_back(L.var(others_[k]));
      inner_.push_back(L.var("bv"));
      for (size_t k = 0; k < others_.size(); ++k)
        if (!picks_columns[k]) inner_.push_back(L.var(others_[k]));
      inner_.push_back(L.var("bb"));
      return;
    }
    // One block column (Bv) at a time; the rows of a tile of Bb blocks share it while their broadcast
    // operand stays in half of L2. When a column has few blocks, the other output variables that pick
    // rows are tiled too, so that at least 16 blocks (up to 32 when there are enough) reuse each reduction
    // tile of the vector operand from L1; those that pick columns stay outside, like Bv (a 3x3 128->128
    // conv's two column blocks inside its tiles of blocks ran 5% slower forward and backward-data). The
    // parallel dimension is the first with enough values.
    const int64_t row_bytes = std::max<int64_t>(1, R_ * tile_points * eb_);
    const int64_t l2_tb = std::clamp<int64_t>(nb_.target.cpu.l2_bytes / 2 / row_bytes, 1, n_bb_);
    const int64_t want = 2 * nb_.target.threads;
    const bool columns_only = std::all_of(picks_columns.begin(), picks_columns.end(), [](bool b) { return b; });
    const bool panels = columns_only && !others_.empty() && n_bb_ >= want;
    // Panels that overflow L2 while the broadcast operands fit in half of it (columns_lead): the first
    // variable picking panels with enough values for the threads leads, split across them, and every block
    // row runs inside each panel, so each panel comes from memory once while the rows are read from L2.
    // With tiles of block rows leading, every tile read all of the panels: a transformer's DW1 = N2^T DU
    // (N2 1 MiB, DU's panels 4 MiB; 4 tiles, 16 MiB) on the 2-core Xeon guest with AMX (interleaved, three
    // rounds): 2.13-2.17 -> 1.83-1.89 ms; C = A B of 256 x 1024 by 1024 x 1024 2.28 -> 1.94-2.04, 256 x 512
    // by 512 x 2048 2.25-2.29 -> 1.96-1.98. Not where each row reads its own vector operand (below: an
    // NCHW depthwise conv's planes, nothing shared along a column), whose forward ran 30% slower so
    // (8x64x56x56: 0.51 -> 0.67 ms).
    size_t column = others_.size();
    if (panels && rows_share_vector && columns_lead)
      for (size_t k = others_.size(); k-- > 0;)
        if (picks_columns[k] && range_[mk_.others[k]].second - range_[mk_.others[k]].first + 1 >= want) column = k;
    // The outer band for tiles of tb blocks; whether the threads share its parallel dimension evenly.
    std::vector<int64_t> other_tile;
    auto band = [&](int64_t tb) {
      outer_.clear();
      std::vector<int64_t> counts;
      for (size_t k : mk_.others) counts.push_back(range_[k].second - range_[k].first + 1);
      counts.push_back(n_bv_);
      counts.push_back((n_bb_ + tb - 1) / tb);
      size_t lead = 0;
      other_tile.assign(others_.size(), 1);
      if (column < others_.size()) {  // the panels lead (above)
        tb = n_bb_;
        lead = column;
      } else if (panels) {
        // The other output variables only pick columns of the vector operand (a packed matrix's panels):
        // a tile of block rows, split across the threads, stays in L2 while every column reuses it.
        // Equal tiles, as many as a multiple of the threads: each thread gets the same rows.
        tb = equal_tiles(n_bb_, std::min(tb, (n_bb_ + want - 1) / want), nb_.target.threads);
        lead = counts.size() - 1;
        for (size_t k = 0; k < others_.size(); ++k) other_tile[k] = counts[k];
      } else {
        while (lead < counts.size() && counts[lead] < want) ++lead;
        // An input larger than half of L2 that the leading variable does not read would be read whole at
        // each of its values: the block columns lead instead, each column's part of it reused by every
        // value inside (a batched product with the batch innermost, C[i, j, b] = +(A[i, k, b] * B[k, j, b])
        // on 64 x 64 x 256: B, 4 MiB, for each i; by columns of b, 1 MiB each for all of them).
        if (lead < others_.size() && rereads_large_input[lead] && n_bv_ >= want) lead = others_.size();
        if (lead == counts.size()) {
          // Nothing has enough values: split the row tiles finer, or lead with the dimension with the most.
          tb = std::max<int64_t>(1, std::min(tb, n_bb_ / want));
          counts.back() = (n_bb_ + tb - 1) / tb;
          lead = static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
        }
        int64_t per_tile = tb;
        for (size_t k = others_.size(); k-- > 0 && per_tile < 16;) {
          if (k == lead) continue;  // the parallel dimension keeps its values
          if (picks_columns[k]) continue;  // a tile of blocks shares one column (as Bv)
          other_tile[k] = std::min<int64_t>(counts[k], (32 + per_tile - 1) / per_tile);
          per_tile *= other_tile[k];
        }
      }
      const Tuple L = step_tuple();
      for (size_t k = 0; k < others_.size(); ++k)
        outer_.push_back(other_tile[k] == 1 ? L.var(others_[k]) : floor_div(L.var(others_[k]), range_[mk_.others[k]].first, other_tile[k]));
      outer_.push_back(L.var("bv"));
      outer_.push_back(floor_div(L.var("bb"), 0, tb));
      std::rotate(outer_.begin(), outer_.begin() + static_cast<long>(lead), outer_.begin() + static_cast<long>(lead) + 1);
      return share_evenly();
    };
    // Tiles of one block where the L2's tiles leave threads idle and those share evenly: the seed conv
    // forward's 19 rows, 10 + 9 on two threads, go with its two blocks of 4 images (38 values, 19 + 19),
    // its columns, all 19 of them, then reuse each reduction tile of the weights instead of two blocks
    // times 16 columns (0.438 -> 0.417-0.421 ms on a 2-core Zen 4).
    if (!band(l2_tb) && !panels && l2_tb > 1) {
      const auto kept = std::pair{outer_, other_tile};
      if (!band(1)) std::tie(outer_, other_tile) = kept;
    }
    const Tuple L = step_tuple();
    for (size_t k = 0; k < others_.size(); ++k)
      if (other_tile[k] > 1) inner_.push_back(L.var(others_[k]));
    // Panels whose rows each read their own vector operand (an NCHW depthwise conv: its row blocks are
    // channels, the weights its broadcast operand, its images and rows pick columns of the planes) share
    // nothing along a column: the block columns then run inside the other variables, so that a row of
    // the image serves both column blocks while it is in L1 (8x64x56x56 on one thread: 1.03-1.04 ->
    // 0.94-0.95 ms; with the columns outside it was read once per column block).
    if (panels && !rows_share_vector) {
      outer_.pop_back();  // Bv, which the rotation left last
      inner_.push_back(L.var("bv"));
    }
    inner_.push_back(L.var("bb"));
  }

  // A parallel member whose values the threads cannot share evenly (a seed conv's data gradient's 19 rows
  // on 2 threads: 10 and 9, one thread idle for a twentieth of the nest) takes in the next member that
  // orders anything, as lead x its values + next: the threads then share (row, residue) pairs, each a
  // smaller part of the work, where that leaves fewer idle. The loop order stays the same. Both must be
  // plain variables: with a tile's floor division in either, isl recovers the tile from the merged value
  // with a loop over all of its points and a modulo guard. (That data gradient on a 2-core Zen 4: 0.52-0.53
  // -> 0.49 ms. The forward's rows merged with its 2 tiles of columns: 0.45 -> 0.44, not worth those loops.)
  // Returns whether the threads then share the parallel member evenly.
  bool share_evenly() {
    const int64_t threads = std::max(1, nb_.target.threads);
    if (threads == 1 || outer_.empty()) return true;
    const Tuple L = step_tuple();
    auto range = [&](const isl::aff& a) {
      const isl::set v = steps_.apply(L.to(unnamed("", 1), {a}));
      return std::pair{v.dim_min_val(0).get_num_si(), v.dim_max_val(0).get_num_si()};
    };
    const auto [lead_lo, lead_hi] = range(outer_[0]);
    const int64_t a = lead_hi - lead_lo + 1;
    if (idle_values(a, threads) == 0) return true;
    if (!plain(outer_[0])) return false;
    for (size_t next = 1; next < outer_.size(); ++next) {
      const auto [lo, hi] = range(outer_[next]);
      if (lo == hi) continue;  // one value: it orders nothing
      if (!plain(outer_[next])) return false;
      const int64_t b = hi - lo + 1;
      if (idle_values(a * b, threads) >= idle_values(a, threads) * b) return false;
      outer_[0] = times(outer_[0], b).add(plus(outer_[next], -lo));
      outer_.erase(outer_.begin() + static_cast<long>(next));
      return idle_values(a * b, threads) == 0;
    }
    return false;
  }

  static bool plain(const isl::aff& a) { return isl_aff_dim(a.get(), isl_dim_div) == 0; }

  // The marked tree over the steps: parallel outer band, reduction tiles, block band, the vector mark.
  isl::schedule tree(bool weight_mode) {
    // A band without its members that take one value over all steps (a single column of blocks, a tile
    // of all the rows, a whole reduction range): they order nothing, and each would cost isl a loop
    // level of AST generation (about 0.6 ms) to find that out. The first member stays where `lead` says
    // so (the parallel one) and a band keeps at least one.
    const Tuple L = step_tuple();
    auto band = [this, &L](isl::schedule_node node, const std::vector<isl::aff>& members, bool lead) {
      isl::map m = L.to(unnamed("", members.size()), members);
      const isl::set values = steps_.apply(m);
      for (int k = static_cast<int>(members.size()); k-- > (lead ? 1 : 0);) {
        if (m.range_tuple_dim() == 1) break;
        if (values.dim_min_val(k).eq(values.dim_max_val(k))) m = isl_support::project_out_output(m, static_cast<unsigned>(k));
      }
      return node.insert_partial_schedule(isl_support::partial_schedule(isl::union_map(m)));
    };
    auto mark = [this](isl::schedule_node node, const std::string& name) { return node.insert_mark(isl::id(nb_.ctx.get(), name)); };
    isl::set steps = isl_support::set_tuple_id(steps_, nb_.statements.block_step);
    isl::schedule_node node = isl::schedule::from_domain(isl::union_set(steps)).root().child(0);
    // Distinct output blocks write distinct elements: the leading member of the block band is coincident.
    node = band(node, outer_, true).as<isl::schedule_node_band>().member_set_coincident(0, 1);
    node = node.insert_mark(nb_.statements.parallel_mark).child(0);
    node = mark(node, weight_mode ? "tile_split" : "tile").child(0).child(0);
    node = band(node, L.vars(tiles_), false);
    node = mark(node, "reduction_tile").child(0).child(0);
    node = band(node, inner_, false);
    node = mark(node, "point").child(0).child(0);
    return mark(node, "vector_" + s(R_) + "x" + s(mk_.chunks) + "x" + s(mk_.lanes)).schedule();
  }

 private:
  static std::string s(int64_t v) { return std::to_string(v); }
  static std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  Tuple named(const std::string& name, const std::vector<std::string>& dims) const { return Tuple(nb_.ctx.get(), name, dims); }
  // A tuple of n unnamed dimensions: the target of a map whose positions are expressions.
  Tuple unnamed(const std::string& name, size_t n) const { return Tuple(nb_.ctx.get(), name, std::vector<std::string>(n, "")); }
  // Step[block dims, tiles].
  Tuple step_tuple() const { return named("Step", cat(block_dims_, tiles_)); }
  // Y[block dims, dd, l]: a block's row dd and lane l.
  Tuple lane_tuple() const { return named("Y", cat(block_dims_, {"dd", "l"})); }
  // { t[..] -> B[block dims] } for a tuple t with the block dimensions.
  isl::map to_blocks(const Tuple& t) const { return t.to(unnamed("B", block_dims_.size()), t.vars(block_dims_)); }
  // The point of S at row dd (and with `lane`, lane l) of block (bb, bv), over a tuple with those dims.
  std::vector<isl::aff> at(const Tuple& t, bool lane) const {
    std::vector<isl::aff> out;
    for (size_t k = 0; k < vars_.size(); ++k) {
      if (k == mk_.block) {
        out.push_back(plus(times(t.var("bb"), R_), mk_.block_lo).add(t.var("dd")));
      } else if (k == mk_.vector) {
        isl::aff column = plus(times(t.var("bv"), VL_), mk_.vector_lo);
        out.push_back(lane ? column.add(t.var("l")) : column);
      } else {
        out.push_back(t.var(vars_[k]));
      }
    }
    return out;
  }
  // { B[block dims] -> S[..] }: every row and lane of a block.
  isl::map block_lanes() const {
    const Tuple Y = lane_tuple();
    const isl::set in_block = Y.where("dd", 0, R_ - 1).intersect(Y.where("l", 0, VL_ - 1));
    return to_blocks(Y).intersect_domain(in_block).reverse().apply_range(lane_points_of());
  }
  // { Y[block dims, dd, l] -> S[..] }: the points of a row's lane, at any reduction point.
  isl::map lane_points_of() const {
    const Tuple YR = named("Y", cat(cat(block_dims_, {"dd", "l"}), reds_));
    isl_map* m = isl_map_project_out(YR.to(unnamed("S", vars_.size()), at(YR, true)).release(), isl_dim_in,
                                     static_cast<unsigned>(block_dims_.size() + 2), static_cast<unsigned>(reds_.size()));
    return isl::manage(isl_map_set_tuple_name(m, isl_dim_in, "Y"));
  }

  NestBuilder& nb_;
  const Microkernel& mk_;
  const std::vector<std::string>& vars_;
  const std::vector<std::pair<int64_t, int64_t>>& range_;
  const int64_t eb_, R_, VL_;
  std::vector<std::string> others_, reds_, tiles_, block_dims_;
  int64_t n_bb_ = 0, n_bv_ = 0;
  bool lanes_in_range_ = false;
  isl::set hull_, blocks_, good_, steps_;
  std::vector<int64_t> tile_, red_lo_;
  std::vector<isl::aff> outer_, inner_;  // over step_tuple()
};

}  // namespace

isl::set NestBuilder::build_microkernel(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                                        const std::vector<std::pair<int64_t, int64_t>>& range, size_t element_bytes,
                                        const std::vector<isl::map>& reads, const MicrokernelChoices& choices) {
  MicrokernelNest mk(*this, *nest.microkernel, vars, range, element_bytes);
  mk.classify_blocks(domain, choices.lane_points);
  nest.microkernel->lanes_in_range = mk.lanes_in_range();
  mk.size_reduction_tiles(reads, choices.weight_mode, choices.long_tiles);
  BlockStep step = mk.block_step(choices.zero_init, nest.epilogue.has_value() || nest.permuted_copy.has_value());
  mk.block_bands(choices.weight_mode, choices.picks_columns, choices.rows_share_vector, choices.block_strides, choices.rereads_large_input, choices.columns_lead);
  nest.parallel_outer = true;
  generate(nest, mk.tree(choices.weight_mode), &step);
  return mk.stored_points(choices.lane_points);
}

}  // namespace polytile::sched::internal
