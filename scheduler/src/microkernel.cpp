// Register-blocked update nests (see Microkernel in scheduler.h and nest_builder.h): the isl checks of a
// micro-kernel plan, the split of blocks into uniform and predicated ones, the isl footprint cost model,
// zero-initialized first tiles, fused epilogues, and the schedule tree
//   [outer band] -> [reduction tiles] -> [block band] -> sequence(Z/L | F -> [reductions] | T/E).
#include <isl/ast.h>
#include <isl/ast_build.h>
#include <isl/cpp.h>
#include <isl/schedule_node.h>

#include <algorithm>
#include <set>

#include "nest_builder.h"
#include "plan.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

using isl_support::text;

// Schedules `nest` (an update of `c`) as a micro-kernel when the plan and the isl checks allow it.
bool NestBuilder::try_microkernel(Nest& nest, const Contraction& c, const ProgramTypes& types,
                                  const poly::internal::IslAnalysis& analysis, const isl::set& domain,
                                  const std::vector<std::string>& positional, int64_t out_bytes, isl::set* uncovered,
                                  const Elementwise* epilogue) {
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
  // The vector variable must range over the same interval at every other point: then a lane is valid
  // exactly when its row is, and only the last block column can be partial.
  isl::set free_v = isl_support::eliminate(domain, static_cast<unsigned>(mk.vector));
  std::string tuple = "S[" + join(positional) + "]";
  free_v = free_v.intersect(isl::set(ctx.get(), "{ " + tuple + " : " + std::to_string(mk.vector_lo) + " <= " +
                                                     positional[mk.vector] + " <= " + std::to_string(mk.vector_hi) + " }"));
  if (!free_v.is_equal(domain)) return false;
  // Whether the other output variables leave the broadcast operand alone (they only pick columns).
  bool columns_only = true;
  for (const auto& in : c.inputs) {
    bool has_v = false;
    for (const auto& p : in.indices) has_v |= p.coefficient(plan->vector) != Rational(0);
    if (has_v) continue;
    for (size_t k : mk.others)
      for (const auto& p : in.indices) columns_only &= p.coefficient(nest.variables[k]) == Rational(0);
  }
  // The inputs' access functions over S, not restricted to the domain: footprints are then those of
  // interior blocks, where every point of a tile is valid.
  const isl::id& S = statements.id(LoopNode::Statement::plain);
  std::vector<isl::map> reads;
  for (const isl::map& f : analysis.read_functions) reads.push_back(f.set_domain_tuple(S));
  // A small output with long reductions (a weight gradient) runs the reduction tiles outside its blocks.
  int64_t reduction_points = 1;
  for (size_t k : mk.reductions) reduction_points *= range[k].second - range[k].first + 1;
  bool weight_mode = out_bytes * 2 <= target.cpu.l2_bytes && reduction_points >= 2048;
  nest.microkernel = mk;
  if (epilogue && uncovered) nest.epilogue = *epilogue;
  build_microkernel(nest, domain, positional, range, true, weight_mode,
                    dtype_bytes(types.tensors.at(c.output).dtype), reads, uncovered != nullptr, columns_only);
  if (uncovered) {
    // Output elements that no block stores: those still need the init nest.
    std::vector<std::string> dims;
    const auto& shape = types.tensors.at(c.output).shape;
    for (size_t k = 0; k < shape.size(); ++k) dims.push_back("i" + std::to_string(k));
    isl::set box(ctx.get(), box_text("S", dims, shape));
    isl::set stored = blocks_.apply(block_rows_).apply(analysis.write_function.set_domain_tuple(S).set_range_tuple(S));
    *uncovered = box.subtract(stored).coalesce();
  }
  return true;
}

// The micro-kernel nest of an update (see Microkernel in scheduler.h). Statement domains: F (fast
// blocks: every row has the same reduction points, every lane in range) and Fp (the other blocks, over
// the union of their rows' points), both over (others, Bb, Bv, reductions); L/Lp and T/Tp over (others,
// Bb, Bv, reduction tiles), likewise Z/Zp (first tiles) and E/Ep (last tiles, with an epilogue). Tree:
// [outer band] -> [reduction tiles] -> [block band] -> sequence(Z/L | F -> [reductions] | T/E).
void NestBuilder::build_microkernel(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                                    const std::vector<std::pair<int64_t, int64_t>>& range, bool parallel,
                                    bool weight_mode, size_t element_bytes, const std::vector<isl::map>& reads,
                                    bool zero_init, bool columns_only) {
  const Microkernel& mk = *nest.microkernel;
  const int64_t R = mk.rows, VL = int64_t{mk.chunks} * mk.lanes;
  auto s = [](int64_t v) { return std::to_string(v); };
  auto shifted = [&s](const std::string& v, int64_t lo) { return lo == 0 ? v : "(" + v + " - (" + s(lo) + "))"; };
  std::vector<std::string> others, reds, tiles;
  for (size_t k : mk.others) others.push_back(vars[k]);
  for (size_t k : mk.reductions) reds.push_back(vars[k]);
  for (size_t k = 0; k < reds.size(); ++k) tiles.push_back("t" + s(static_cast<int64_t>(k)));
  auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<std::string> block_dims = cat(others, {"bb", "bv"});
  const std::string f_tuple = "[" + join(cat(block_dims, reds)) + "]";
  const std::string l_tuple = "[" + join(cat(block_dims, tiles)) + "]";
  const std::string s_tuple = "S[" + join(vars) + "]";
  auto set = [this](const std::string& t) { return isl::set(ctx.get(), t); };
  auto map = [this](const std::string& t) { return isl::map(ctx.get(), t); };
  using St = LoopNode::Statement;
  auto named = [this](const isl::set& x, St kind, bool predicated = false) {
    return isl::union_set(isl_support::set_tuple_id(x, statements.id(kind, predicated)));
  };

  const std::string bb_expr = "floor(" + shifted(vars[mk.block], mk.block_lo) + "/" + s(R) + ")";
  const std::string bv_expr = "floor(" + shifted(vars[mk.vector], mk.vector_lo) + "/" + s(VL) + ")";
  isl::set hull = domain.apply(map("{ " + s_tuple + " -> F[" + join(cat(cat(others, {bb_expr, bv_expr}), reds)) + "] }"));
  // Rows that differ from row 0 of their block: X = (block dims, reductions, row).
  std::vector<std::string> at_row;
  for (size_t k = 0; k < vars.size(); ++k) {
    if (k == mk.block) at_row.push_back(s(mk.block_lo) + " + " + s(R) + "*bb + dd");
    else if (k == mk.vector) at_row.push_back(s(mk.vector_lo) + " + " + s(VL) + "*bv");
    else at_row.push_back(vars[k]);
  }
  const std::vector<std::string> x_vars = cat(cat(block_dims, reds), {"dd"});
  isl::set rows = domain.apply(map("{ X[" + join(x_vars) + "] -> S[" + join(at_row) + "] : 0 <= dd < " + s(R) + " }").reverse());
  std::vector<std::string> x_row0 = x_vars;
  x_row0.back() = "e";
  isl::set row0 = rows.apply(map("{ X[" + join(x_vars) + "] -> X[" + join(x_row0) + "] : dd = 0 and 0 <= e < " + s(R) + " }"));
  isl::set differ = rows.subtract(row0).unite(row0.subtract(rows));
  isl::set blocks = hull.apply(map("{ F" + f_tuple + " -> B[" + join(block_dims) + "] }"));
  isl::set bad = differ.apply(map("{ X[" + join(x_vars) + "] -> B[" + join(block_dims) + "] }"))
                     .unite(set("{ B[" + join(block_dims) + "] : " + s(mk.vector_lo) + " + " + s(VL) + "*bv + " + s(VL - 1) +
                                " > " + s(mk.vector_hi) + " }"))
                     .intersect(blocks);
  isl::set good = blocks.subtract(bad).coalesce();
  isl::set fast = hull.intersect(good.apply(map("{ B[" + join(block_dims) + "] -> F" + f_tuple + " }"))).coalesce();
  isl::set slow = hull.subtract(fast).coalesce();

  // Cost model: reduction tiles sized by footprints computed with isl. The inputs a block (in a
  // weight-gradient nest, a row of blocks across all columns) reads over one full reduction tile -- the
  // bounding box of the image of the tile's points under each access function -- must fit in three
  // quarters of L1: the vector operand is then reused from L1 by every block row. Filled innermost
  // reduction variable first, each as large as fits (binary search), then balanced.
  const int64_t eb = static_cast<int64_t>(element_bytes);
  const int64_t n_bb = (range[mk.block].second - mk.block_lo + R) / R;
  const int64_t n_bv = (mk.vector_hi - mk.vector_lo + VL) / VL;
  std::vector<int64_t> tile(reds.size(), 1), red_lo(reds.size());
  {
    isl::set representative = blocks.lexmin();
    if (weight_mode) {
      std::vector<std::string> any_column = block_dims;
      any_column.back() = "bv2";
      representative = representative.apply(map("{ B[" + join(block_dims) + "] -> B[" + join(any_column) + "] }")).intersect(blocks);
    }
    std::vector<std::string> at_lane = at_row;
    at_lane[mk.vector] = s(mk.vector_lo) + " + " + s(VL) + "*bv + l";
    const std::string y_tuple = "Y[" + join(cat(block_dims, {"dd", "l"})) + "]";
    isl::set points = representative
                          .apply(map("{ B[" + join(block_dims) + "] -> " + y_tuple + " : 0 <= dd < " + s(R) + " and 0 <= l < " + s(VL) + " }"))
                          .apply(map("{ " + y_tuple + " -> S[" + join(at_lane) + "] }"));
    auto footprint = [&]() {
      std::vector<std::string> in_tile;
      for (size_t k = 0; k < reds.size(); ++k)
        in_tile.push_back(s(red_lo[k]) + " <= " + reds[k] + " < " + s(red_lo[k] + tile[k]));
      isl::set piece = points.intersect(set("{ " + s_tuple + " : " + join(in_tile, " and ") + " }"));
      int64_t bytes = 0;
      for (const auto& access : reads) {
        isl::set image = piece.apply(access);
        if (image.is_empty()) continue;
        int64_t volume = 1;
        for (int d = 0; d < static_cast<int>(image.tuple_dim()); ++d) {
          isl::val lo = image.dim_min_val(d), hi = image.dim_max_val(d);
          if (lo.is_int() && hi.is_int()) volume *= hi.get_num_si() - lo.get_num_si() + 1;
        }
        bytes += volume * eb;
      }
      return bytes;
    };
    for (size_t k = 0; k < reds.size(); ++k) red_lo[k] = range[mk.reductions[k]].first;
    const int64_t budget = target.cpu.l1_bytes * 3 / 4;
    for (size_t k = reds.size(); k-- > 0;) {
      const int64_t e = range[mk.reductions[k]].second - red_lo[k] + 1;
      int64_t lo = 1, hi = e;
      while (lo < hi) {
        tile[k] = (lo + hi + 1) / 2;
        if (footprint() <= budget) lo = tile[k];
        else hi = tile[k] - 1;
      }
      int64_t n = (e + lo - 1) / lo;
      tile[k] = (e + n - 1) / n;  // balanced: equal tiles
      if (tile[k] < e) break;     // the outer reduction variables stay at one value per tile
    }
  }
  int64_t tile_points = 1;
  for (int64_t t : tile) tile_points *= t;
  std::vector<std::string> tile_exprs;
  for (size_t k = 0; k < reds.size(); ++k)
    tile_exprs.push_back("floor(" + shifted(reds[k], red_lo[k]) + "/" + s(tile[k]) + ")");
  isl::map to_tiles = map("{ F" + f_tuple + " -> L[" + join(cat(block_dims, tile_exprs)) + "] }");
  isl::set load = fast.apply(to_tiles), load_p = slow.apply(to_tiles);
  // A block's first reduction tile (lexicographically) starts from zero accumulators.
  std::vector<std::string> earlier_tiles, lexless;
  for (size_t k = 0; k < tiles.size(); ++k) earlier_tiles.push_back("s" + s(static_cast<int64_t>(k)));
  for (size_t k = 0; k < tiles.size(); ++k) {
    std::string term;
    for (size_t j = 0; j < k; ++j) term += earlier_tiles[j] + " = " + tiles[j] + " and ";
    lexless.push_back("(" + term + earlier_tiles[k] + " < " + tiles[k] + ")");
  }
  isl::map later = map("{ L[" + join(cat(block_dims, earlier_tiles)) + "] -> L[" + join(cat(block_dims, tiles)) + "] : " +
                       join(lexless, " or ") + " }");
  load = load.coalesce();
  load_p = load_p.coalesce();
  isl::set store = load, store_p = load_p;
  isl::set zero = load.subtract(load.apply(later)), zero_p = load_p.subtract(load_p.apply(later));
  if (zero_init) {
    zero = zero.coalesce();
    zero_p = zero_p.coalesce();
    load = load.subtract(zero).coalesce();
    load_p = load_p.subtract(zero_p).coalesce();
  } else {
    zero = isl::set::empty(zero.get_space());
    zero_p = isl::set::empty(zero_p.get_space());
  }
  // A fused consumer runs at each block's last reduction tile, in place of the store.
  isl::set last = store.subtract(store.apply(later.reverse())), last_p = store_p.subtract(store_p.apply(later.reverse()));
  if (!nest.epilogue) {
    last = isl::set::empty(last.get_space());
    last_p = isl::set::empty(last_p.get_space());
  }
  // For the init nest: the blocks, and their rows and in-range lanes as points of S.
  blocks_ = blocks;
  {
    std::vector<std::string> at_lane = at_row;
    at_lane[mk.vector] = s(mk.vector_lo) + " + " + s(VL) + "*bv + l";
    const std::string y_tuple = "Y[" + join(cat(block_dims, {"dd", "l"})) + "]";
    block_rows_ = map("{ B[" + join(block_dims) + "] -> " + y_tuple + " : 0 <= dd < " + s(R) + " and 0 <= l < " + s(VL) +
                      " and " + s(mk.vector_lo) + " + " + s(VL) + "*bv + l <= " + s(mk.vector_hi) + " }")
                      .apply_range(map("{ " + y_tuple + " -> S[" + join(at_lane) + "] }"));
  }

  // Outer and block bands over (others, Bb, Bv).
  std::vector<std::string> outer, inner;
  if (weight_mode) {
    // A small output: split its widest block dimension across the threads; every thread then runs the
    // reduction tiles outermost over all of its blocks.
    std::vector<int64_t> counts;
    for (size_t k : mk.others) counts.push_back(range[k].second - range[k].first + 1);
    counts.push_back(n_bb);
    counts.push_back(n_bv);
    size_t widest = static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
    int64_t chunk = (counts[widest] + target.threads - 1) / std::max(1, target.threads);
    int64_t lo = widest < mk.others.size() ? range[mk.others[widest]].first : 0;
    outer.push_back("floor(" + shifted(block_dims[widest], lo) + "/" + s(chunk) + ")");
    inner = cat(others, {"bv", "bb"});
  } else {
    // One block column (Bv) at a time; the rows of a tile of Bb blocks share it while their broadcast
    // operand stays in half of L2. When a column has few blocks, the other output variables are tiled
    // too, so that at least 16 blocks (up to 32 when there are enough) reuse each reduction tile of the
    // vector operand from L1. The parallel dimension is the first with enough values.
    int64_t row_bytes = std::max<int64_t>(1, R * tile_points * eb);
    int64_t tb = std::clamp<int64_t>(target.cpu.l2_bytes / 2 / row_bytes, 1, n_bb);
    const int64_t want = 2 * target.threads;
    std::vector<int64_t> counts;
    for (size_t k : mk.others) counts.push_back(range[k].second - range[k].first + 1);
    counts.push_back(n_bv);
    counts.push_back((n_bb + tb - 1) / tb);
    size_t lead = 0;
    std::vector<int64_t> other_tile(others.size(), 1);
    if (columns_only && !others.empty() && n_bb >= want) {
      // The other output variables only pick columns of the vector operand (a packed matrix's panels):
      // a tile of block rows, split across the threads, stays in L2 while every column reuses it.
      tb = std::min(tb, (n_bb + want - 1) / want);
      lead = counts.size() - 1;
      for (size_t k = 0; k < others.size(); ++k) other_tile[k] = counts[k];
    } else {
      while (lead < counts.size() && counts[lead] < want) ++lead;
      if (lead == counts.size()) {
        // Nothing has enough values: split the row tiles finer, or lead with the dimension with the most.
        tb = std::max<int64_t>(1, std::min(tb, n_bb / want));
        counts.back() = (n_bb + tb - 1) / tb;
        lead = static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
      }
      int64_t per_tile = tb;
      for (size_t k = others.size(); k-- > 0 && per_tile < 16;) {
        if (k == lead) continue;  // the parallel dimension keeps its values
        other_tile[k] = std::min<int64_t>(counts[k], (32 + per_tile - 1) / per_tile);
        per_tile *= other_tile[k];
      }
    }
    for (size_t k = 0; k < others.size(); ++k)
      outer.push_back(other_tile[k] == 1 ? others[k]
                                         : "floor(" + shifted(others[k], range[mk.others[k]].first) + "/" + s(other_tile[k]) + ")");
    outer.push_back("bv");
    outer.push_back("floor(bb/" + s(tb) + ")");
    std::rotate(outer.begin(), outer.begin() + static_cast<long>(lead), outer.begin() + static_cast<long>(lead) + 1);
    for (size_t k = 0; k < others.size(); ++k)
      if (other_tile[k] > 1) inner.push_back(others[k]);
    inner.push_back("bb");
  }

  auto union_map = [&](const std::vector<std::string>& f_exprs, const std::vector<std::string>& l_exprs) {
    std::string t = "{ ";
    for (const char* name : {"F", "Fp"}) t += std::string(name) + f_tuple + " -> [" + join(f_exprs) + "]; ";
    for (const char* name : {"Z", "Zp", "L", "Lp", "T", "Tp", "E", "Ep"}) t += std::string(name) + l_tuple + " -> [" + join(l_exprs) + "]; ";
    t.resize(t.size() - 2);
    return isl::union_map(ctx.get(), t + " }");
  };
  auto band = [](isl::schedule_node node, const isl::union_map& m) {
    return node.insert_partial_schedule(isl_support::partial_schedule(m));
  };
  isl::union_set all = named(fast, St::fma)
                           .unite(named(slow, St::fma, true))
                           .unite(named(load, St::load))
                           .unite(named(load_p, St::load, true))
                           .unite(named(zero, St::zero))
                           .unite(named(zero_p, St::zero, true))
                           .unite(named(store.subtract(last), St::store))
                           .unite(named(store_p.subtract(last_p), St::store, true))
                           .unite(named(last, St::epilogue))
                           .unite(named(last_p, St::epilogue, true));
  isl::schedule sched = isl::schedule::from_domain(all);
  isl::schedule_node node = sched.root().child(0);
  // Distinct output blocks write distinct elements: the leading member of the block band is coincident.
  node = band(node, union_map(outer, outer)).as<isl::schedule_node_band>().member_set_coincident(0, 1);
  if (parallel) node = node.insert_mark(statements.parallel_mark).child(0);
  node = node.insert_mark(isl::id(ctx.get(), weight_mode ? "tile_split" : "tile")).child(0).child(0);
  node = band(node, union_map(tile_exprs, tiles));
  node = node.insert_mark(isl::id(ctx.get(), "reduction_tile")).child(0).child(0);
  node = band(node, union_map(inner, inner));
  node = node.insert_mark(isl::id(ctx.get(), "point")).child(0).child(0);
  isl::union_set_list filters(ctx.get(), 3);
  filters = filters.add(isl::union_set(ctx.get(), "{ Z" + l_tuple + "; Zp" + l_tuple + "; L" + l_tuple + "; Lp" + l_tuple + " }"))
                .add(isl::union_set(ctx.get(), "{ F" + f_tuple + "; Fp" + f_tuple + " }"))
                .add(isl::union_set(ctx.get(), "{ T" + l_tuple + "; Tp" + l_tuple + "; E" + l_tuple + "; Ep" + l_tuple + " }"));
  node = node.insert_sequence(filters);
  node = node.insert_mark(isl::id(ctx.get(), "vector_" + s(R) + "x" + s(mk.chunks) + "x" + s(mk.lanes))).child(0);
  node = node.child(1).child(0);
  node = band(node, isl::union_map(ctx.get(), "{ F" + f_tuple + " -> [" + join(reds) + "]; Fp" + f_tuple + " -> [" + join(reds) + "] }"));
  nest.parallel_outer = parallel;
  generate(nest, node.schedule());
}
}  // namespace polytile::sched::internal
