// The CPU strategy of a plain nest: decisions added to its target-neutral tree (nest_builder.cpp) from the
// CPU model of the target. A band whose leading member is coincident gets the "parallel" mark (the runtime
// splits that loop across threads); a large update is tiled for the caches: a tile band and a point band,
// marked "tile" and "point", whose members keep the coincident flags of the output variables.
#include <algorithm>
#include <string>
#include <vector>

#include "nest_builder.h"
#include "plan.h"

namespace polytile::sched::internal {

namespace {

// Tile sizes for a band ordered (parallel outputs..., reductions..., contiguous innermost): the
// innermost member keeps whole vector registers in long runs, reduction members are blocked so that a
// tile's input blocks stay in L2, and the outer members are blocked so the output block a tile updates
// stays in L1. Members shorter than their tile are left whole.
// Where the innermost member steps through an input by more than a cache line (a transposition reads a
// row of its input per step), a run of it reads as many lines and pages as it has steps, and the outer
// members come back to those lines for their next elements. The innermost member then takes one cache
// line of the output (at least a vector), so that its lines and pages stay in L1 and the TLB's first
// level, and the outer members are blocked so the input lines of a tile fill half of L1: a 2048x2048 f32
// transposition took 19-20 ms on one thread of a Zen 3 with tiles of 32 x 128 (128 pages per run), and
// 4.6-6.0 ms with 256 x 16 (a copy: 3.7-4.6 ms); NHWC to NCHW of 8x56x56x64, 2.3-2.7 ms with runs of 14
// along w, 1.6-1.8 ms with 16.
std::vector<int64_t> tile_sizes(const std::vector<int64_t>& extents, size_t parallel_members, const Target& t,
                                size_t element_bytes, int64_t innermost_input_stride) {
  constexpr int64_t line = 64;
  const int64_t line_elements = line / static_cast<int64_t>(element_bytes);
  const size_t n = extents.size();
  std::vector<int64_t> sizes(extents);
  int64_t lanes = std::max<int64_t>(1, t.cpu.vector_bits / static_cast<int64_t>(8 * element_bytes));
  const bool strided = innermost_input_stride > line;
  int64_t inner = std::min<int64_t>(extents[n - 1], strided ? std::max(lanes, line_elements) : 16 * lanes);
  int64_t l1_elems = t.cpu.l1_bytes / static_cast<int64_t>(element_bytes);
  int64_t l2_elems = t.cpu.l2_bytes / static_cast<int64_t>(element_bytes);
  int64_t outer = std::clamp<int64_t>(l1_elems / (2 * std::max<int64_t>(1, inner)), 1, strided ? 1024 : 64);
  int64_t reduction = std::clamp<int64_t>(l2_elems / (4 * std::max<int64_t>(1, inner)), 8, 256);
  for (size_t k = 0; k < n; ++k) {
    int64_t want = std::max<int64_t>(1, k + 1 == n ? inner : k < parallel_members ? outer : reduction);
    // Long tiles leave the threads few to share: the first member keeps two tiles per thread or more,
    // as long as a tile still reuses a line of the input (its elements along a line).
    if (strided && k == 0 && k + 1 < n)
      want = std::min(want, std::max(line_elements, extents[0] / (2 * std::max(1, t.threads))));
    // A strided innermost tile stays one whole line where the extent allows (56 is 16, 16, 16, 8, not
    // four 14s): each run of it is then whole vectors, not a vector and a scalar remainder of six.
    sizes[k] = strided && k + 1 == n ? std::min(extents[k], want) : equal_tiles(extents[k], want);
  }
  return sizes;
}

}  // namespace

isl::schedule NestBuilder::cpu_plain_nest(const isl::schedule& neutral, const std::optional<NeutralBand>& band,
                                          const std::vector<std::string>& vars, const NestFacts& facts, bool squares) {
  if (!band) return neutral;
  isl::schedule_node root = neutral.root().child(0);
  const size_t parallel = band->parallel;
  const std::vector<std::string>& perm = band->members;
  const std::vector<int64_t>& extents = band->extents;  // for the cost model
  const std::vector<int64_t>& lows = band->lows;
  const int64_t points = band->points();
  // Tiles keep input blocks in cache while the outputs that share them are computed: none when the nest
  // reduces and its outputs share inputs only with outputs computed soon after (a transpose, without
  // reductions, still gains from tiles: both tensors are walked a cache line at a time).
  const bool tile = facts.update && !facts.near_reuse_only && parallel > 0 && perm.size() >= 2 && points > 64 * 64 * 64;
  // Member k's tile index for tiles of `size` from its lowest value.
  auto tile_of = [&](size_t k, int64_t size) {
    std::string shifted = lows[k] == 0 ? perm[k] : "(" + perm[k] + " - (" + std::to_string(lows[k]) + "))";
    return "floor(" + shifted + "/" + std::to_string(size) + ")";
  };
  if (squares) {
    // A transposition: squares of lanes x lanes elements (the input's contiguous variable, then the
    // output's, innermost), each read as `lanes` vectors of the input and written as as many of the
    // output; the squares run in the band's order. With squares narrower than a cache line (8 f32 of 16),
    // the squares that share the input's lines run one after another (a tile of a line along the input's
    // contiguous variable around them), so that every line of the input is read whole at once; the
    // output's lines are completed by the next square along the last member. Squares of whole lines run
    // in tiles of two along the input's contiguous variable, so that each row of the input is read 128
    // bytes at a time, a pair of lines as L2's spatial prefetcher fetches them (a 2048 x 2048
    // transposition on an Emerald Rapids guest: 0.89-0.91 ms against 0.99-1.03 in tiles of one square).
    const size_t t = static_cast<size_t>(std::find(perm.begin(), perm.end(), facts.transpose_variable) - perm.begin());
    const size_t last = perm.size() - 1;
    const int64_t lanes = facts.transpose_lanes, line_elements = 64 / static_cast<int64_t>(facts.element_bytes);
    const int64_t along_t = lanes < line_elements ? line_elements : 2 * lanes;  // a tile's elements along t
    const bool tiled = extents[t] >= along_t;
    std::vector<std::string> tiles;
    for (size_t k = 0; k < perm.size(); ++k) tiles.push_back(k == t ? tile_of(k, tiled ? along_t : lanes) : k == last ? tile_of(k, lanes) : perm[k]);
    root = isl_support::delete_node(root);
    root = insert_band(root, vars, {perm[t], perm[last]}, {true, true});
    root = root.insert_mark(isl::id(ctx.get(), "point"));
    if (tiled) root = insert_band(root, vars, {tile_of(t, lanes)}, {true});
    root = insert_band(root, vars, tiles, std::vector<bool>(tiles.size(), true));
    root = root.insert_mark(isl::id(ctx.get(), "tile")).child(0);
  } else if (facts.column_tile > 0) {  // set only for updates with no coincident member
    // Column tiles (a column sum): the tiles of the last member (an output variable: distinct values write
    // distinct elements) outermost, split across the threads; inside, the band as it was.
    const size_t last = perm.size() - 1;
    std::vector<bool> point_coincident(perm.size(), false);
    point_coincident[last] = true;
    root = isl_support::delete_node(root);
    root = insert_band(root, vars, perm, point_coincident);
    root = root.insert_mark(isl::id(ctx.get(), "point"));
    root = insert_band(root, vars, {tile_of(last, facts.column_tile)}, {true});
    root = root.insert_mark(isl::id(ctx.get(), "tile"));
    return root.insert_mark(statements.parallel_mark).schedule();
  } else if (tile) {
    // The output block is small next to the inputs (a weight gradient): split the leading output variable
    // across the threads, and inside a split run the reductions outermost so each input element is read
    // once per split while the output block stays in cache.
    const bool reduction_outer = parallel < perm.size() - (facts.innermost_contiguous ? 1 : 0) &&
                                 facts.output_bytes * 4 <= target.cpu.l2_bytes;
    std::vector<int64_t> sizes = tile_sizes(extents, parallel, target, facts.element_bytes, facts.innermost_input_stride);
    std::vector<std::string> tiles, point;
    std::vector<bool> tile_coincident, point_coincident;
    if (reduction_outer) {
      int64_t chunk = (extents[0] + target.threads - 1) / std::max(1, target.threads);
      tiles.push_back(tile_of(0, std::max<int64_t>(1, chunk)));
      tile_coincident.push_back(true);
      size_t n_red = perm.size() - parallel - (facts.innermost_contiguous ? 1 : 0);
      for (size_t k = parallel; k < parallel + n_red; ++k) point.push_back(perm[k]);
      for (size_t k = 0; k < parallel; ++k) point.push_back(perm[k]);
      if (facts.innermost_contiguous) point.push_back(perm.back());
      point_coincident.assign(point.size(), false);
      for (size_t k = 0; k < parallel; ++k) point_coincident[n_red + k] = true;
    } else {
      // Tile and point loops keep the band order (parallel outputs, reductions, contiguous innermost).
      // Measured on 1024^3 sgemm: reordering the point loops for register blocking (reductions outside
      // a 4 x 32 output block) ran at half the speed of this order with LLVM 16's vectorizer.
      for (size_t k = 0; k < perm.size(); ++k) {
        tiles.push_back(tile_of(k, sizes[k]));
        point.push_back(perm[k]);
        tile_coincident.push_back(k < parallel);
        point_coincident.push_back(k < parallel);
      }
    }
    root = isl_support::delete_node(root);
    root = insert_band(root, vars, point, point_coincident);
    root = root.insert_mark(isl::id(ctx.get(), "point"));
    root = insert_band(root, vars, tiles, tile_coincident);
    root = root.insert_mark(isl::id(ctx.get(), "tile")).child(0);
  }
  if (parallel > 0) root = root.insert_mark(statements.parallel_mark);
  return root.schedule();
}

}  // namespace polytile::sched::internal
