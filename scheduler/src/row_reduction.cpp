// Vectorized row reductions (see RowReduction in scheduler.h): the eligibility checks (dtypes, contiguous
// reads, a reduction variable whose range isl proves independent of the other variables, or whose lanes are
// masked per step) and the schedule
// tree  [outputs] -> sequence(Z | F -> [other reductions, groups] | T), or, with reduction tiles
// (RowReduction::hoisted),  [outer outputs] -> [tiles] -> [sharing outputs] -> sequence(Z | F -> ... | T).
#include <isl/ast.h>
#include <isl/ast_build.h>
#include <isl/cpp.h>
#include <isl/schedule_node.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "nest_builder.h"
#include "plan.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

namespace {

// Reduction tiles of a row reduction (RowReduction::outer_outputs, hoisted, tile: set in `red`, left 0 for
// none). Its rows are its output variables' points, each the whole reduction over the other reduction
// variables and r. Where rows read the same elements (an NCHW depthwise conv's weight gradient DK[c, j, i]:
// the 9 rows of a channel read the same planes of I and DO) and one row reads more than `budget` bytes,
// every row read them from L2 again (8 images of a channel, 100 KB, 9 times). The other reduction
// variables then move, from the first, outside the rows that share (the output variables after the
// longest prefix that every input follows), the last moved in tiles of the most values whose reads by all
// those rows fit the budget: one image of a channel there, 13 KB read 9 times from L1. Each row's
// accumulators are then summed into the output once a tile.
void plan_row_tiles(RowReduction& red, const std::vector<std::string>& names, const Contraction& c, const ProgramTypes& types,
                    const std::vector<poly::VariableBounds>& bounds, int64_t budget) {
  if (red.outputs.empty() || red.others.empty()) return;
  std::map<std::string, int64_t> extent;
  for (const auto& b : bounds) extent[b.name] = b.max - b.min + 1;
  size_t outer = 0;
  while (outer < red.outputs.size() &&
         std::all_of(c.inputs.begin(), c.inputs.end(), [&](const TensorAccess& in) { return uses(in.indices, names[red.outputs[outer]]); }))
    ++outer;
  if (outer == 0 || outer == red.outputs.size()) return;  // the threads split the outer rows; some rows must share
  // The bytes that the points of `vars` (each over its extent, or `sizes`) read, at fixed other variables: per
  // dim of each input the values its index takes, at most the dim.
  auto bytes = [&](const std::map<std::string, int64_t>& sizes) {
    double total = 0;
    for (const auto& in : c.inputs) {
      const TensorType& type = types.tensors.at(in.tensor);
      double elements = 1;
      for (size_t d = 0; d < in.indices.size(); ++d) {
        const Polynomial p = in.indices[d].bind_dims(types.dims);
        double span = 1;
        for (const auto& [v, size] : sizes) {
          const Rational coeff = p.coefficient(v);
          span += std::abs(static_cast<double>(coeff.num()) / static_cast<double>(coeff.den())) * static_cast<double>(size - 1);
        }
        elements *= std::min(span, static_cast<double>(type.shape[d]));
      }
      total += elements * static_cast<double>(dtype_bytes(type.dtype));
    }
    return total;
  };
  std::map<std::string, int64_t> row{{names[red.vector], red.hi - red.lo + 1}};
  for (size_t k : red.others) row[names[k]] = extent[names[k]];
  if (bytes(row) <= static_cast<double>(budget)) return;
  for (size_t k = outer; k < red.outputs.size(); ++k) row[names[red.outputs[k]]] = extent[names[red.outputs[k]]];
  for (size_t q = 0; q < red.others.size(); ++q) {
    const std::string& e = names[red.others[q]];
    for (int64_t size = extent[e] - 1; size >= 1; --size) {
      row[e] = size;
      if (bytes(row) <= static_cast<double>(budget)) {
        red.outer_outputs = outer;
        red.hoisted = q + 1;
        red.tile = size;
        return;
      }
    }
    row.erase(e);  // moved out whole: one value a tile
  }
}

}  // namespace

int64_t rows_read_bytes(const Contraction& c, const ProgramTypes& types) {
  int64_t bytes = 0;
  for (const auto& in : c.inputs) bytes = std::max(bytes, types.tensors.at(in.tensor).bytes());
  return bytes;
}

bool NestBuilder::try_row_reduction(Nest& nest, const Contraction& c, const ProgramTypes& types,
                                    const poly::ContractionAnalysis& a, const isl::set& domain,
                                    const std::vector<std::string>& positional, bool parallel) {
  if (c.aggregation != AggregationOp::sum && c.aggregation != AggregationOp::max && c.aggregation != AggregationOp::min)
    return false;
  if (c.combination != CombinationOp::none && c.combination != CombinationOp::mul && c.combination != CombinationOp::cond)
    return false;
  // Floats, and integers, whose wrapping sums (of products too) and whose maxima are exact in any order; a
  // count (the sum of bools, an i32) converts each vector of them. A conditional term (an argmax's
  // X[n, c] == M[n] ? Idx[c]) compares two numbers of any of these types.
  const DType t = types.tensors.at(c.output).dtype;
  auto number = [](DType d) { return d == DType::f32 || d == DType::f64 || d == DType::i32 || d == DType::i64; };
  if (!number(t)) return false;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const DType from = types.tensors.at(c.inputs[k].tensor).dtype;
    const bool count = from == DType::boolean && t == DType::i32 && c.combination == CombinationOp::none;
    const bool compared = c.combination == CombinationOp::cond && k < 2 && number(from);
    if (from != t && !count && !compared) return false;
  }
  if (box_points(a.bounds) < target.cpu.microkernel_min_points) return false;
  std::set<std::string> in_output;
  for (const auto& p : c.output_indices)
    for (const auto& [v, coeff] : p.index_terms()) in_output.insert(v);
  const int lanes = std::max(1, target.cpu.vector_bits / static_cast<int>(8 * dtype_bytes(t)));
  // r: the reduction variable every input reads contiguously or not at all; at least one reads it.
  auto contiguous = [](const TensorAccess& in, const std::string& r) {
    for (size_t k = 0; k < in.indices.size(); ++k) {
      Rational coeff = in.indices[k].coefficient(r);
      if (k + 1 < in.indices.size() ? coeff != Rational(0) : coeff != Rational(1) && coeff != Rational(0)) return false;
    }
    return true;
  };
  std::string r;
  for (const auto& v : nest.variables) {
    if (in_output.count(v)) continue;
    bool ok = true, read = false;
    for (const auto& in : c.inputs) {
      ok &= contiguous(in, v);
      read |= !in.indices.empty() && in.indices.back().coefficient(v) == Rational(1);
    }
    if (ok && read) r = v;  // the last such variable: the innermost of the contraction's order
  }
  if (r.empty()) return false;
  RowReduction red;
  red.lanes = lanes;
  for (size_t k = 0; k < nest.variables.size(); ++k) {
    const std::string& v = nest.variables[k];
    if (v == r) red.vector = k;
    else (in_output.count(v) ? red.outputs : red.others).push_back(k);
  }
  for (const auto& b : a.bounds)
    if (b.name == r) {
      red.lo = b.min;
      red.hi = b.max;
    }
  // At least one vector's lanes: rows of 16-31 f32 with AVX-512 run as a vector and a masked one, instead
  // of as a plain nest vectorized along an output variable that the input holds a row apart (2026-12-07,
  // 2-core Xeon guest with AMX, median of 20 runs: a row sum of 100000 x 20, 0.55 -> 0.19 ms; of 100000 x
  // 31, 0.82 -> 0.25; an NCHW global average pool of 64 x 256 x 28 x 28, 28 columns a row, 2.7-2.8 -> 0.93-0.97,
  // its global maximum alike; softmax over 20 columns 2.05 -> 1.72; a maximum over 17 and a dot product of
  // 24 the same). Shorter rows, one masked vector each, where the other reduction variables make each
  // output element a sum of two vectors' worth of points or more: the accumulators then carry across them
  // and the lanes are reduced once an element (an NCHW global average pool over 7 x 7, 64 x 2048 images:
  // 1.57-1.67 -> 0.55 ms, as fast as NHWC's; over 14 x 14 1.15 -> 0.52; its maximum over 7 x 7 1.58 ->
  // 0.88). Not below that: over 3 x 3 the sum went 0.21 -> 0.32 ms and the maximum 0.09 -> 0.27, a maximum
  // over rows of 8 with nothing else 1.6 -> 3.6. Nor where the row's range follows the other variables
  // (ragged, below): an NCHW depthwise weight gradient over 7 x 7 images went 0.50 -> 1.16 ms (over 10 x
  // 10 and 14 x 14 it ran 1.5-2x faster, not taken).
  const int64_t row = red.hi - red.lo + 1;
  int64_t points = 1;  // per output element: r's and the other reduction variables'
  for (const auto& b : a.bounds)
    if (!in_output.count(b.name)) points *= b.max - b.min + 1;
  if (row < 2 || (row < lanes && points < 2 * lanes)) return false;
  // Where r's range does not depend on the other variables, every lane in range is a valid point. Where it
  // does (an NCHW depthwise conv's weight gradient: x + i - 1 in the image), each step masks its lanes by
  // the valid-point rule, which the emitter evaluates per lane from the index polynomials: they must then
  // be integral (no lane is valid only for divisibility).
  const std::string tuple = "S[" + join(positional) + "]";
  isl::set free_r = isl_support::eliminate(domain, static_cast<unsigned>(red.vector));
  free_r = free_r.intersect(isl::set(ctx.get(), "{ " + tuple + " : " + std::to_string(red.lo) + " <= " +
                                                      positional[red.vector] + " <= " + std::to_string(red.hi) + " }"));
  if (!free_r.is_equal(domain)) {
    auto integral = [&types](const Polynomial& p) {
      const Polynomial q = p.bind_dims(types.dims);
      if (q.constant().den() != 1) return false;
      return std::all_of(q.index_terms().begin(), q.index_terms().end(), [](const auto& t) { return t.second.den() == 1; });
    };
    std::vector<Polynomial> polys = c.output_indices;
    for (const auto& in : c.inputs) polys.insert(polys.end(), in.indices.begin(), in.indices.end());
    for (const auto& k : c.constraints) polys.push_back(k.poly);
    if (!std::all_of(polys.begin(), polys.end(), integral) || row < lanes) return false;
    red.ragged = true;
  }
  plan_row_tiles(red, nest.variables, c, types, a.bounds, target.cpu.l1_bytes / 2);
  // The first two output variables as one outer loop where an elementwise nest over what the rows read
  // would fuse them (few values of the first, or each more than a quarter of L2: a batched softmax's
  // reductions over 16 x 512 rows of 512): the rows then share their outer loop with the elementwise nests
  // around them and run with them as one row group, rows in L1 (16 x 512 x 512: 1.76 -> 0.95 ms, as the
  // same rows as one matrix).
  std::vector<std::string> outer_members;
  if (parallel && !red.hoisted && red.outputs.size() >= 2) {
    if (auto fused = fuse_leading(domain, positional, red.outputs, red.outputs.size(), rows_read_bytes(c, types))) {
      outer_members = *fused;
      red.fused_outer = outer_members[0];
    }
  }
  nest.reduction = red;

  auto pick = [&positional](const std::vector<size_t>& ks) {
    std::vector<std::string> out;
    for (size_t k : ks) out.push_back(positional[k]);
    return out;
  };
  const std::vector<std::string> outs = pick(red.outputs), others = pick(red.others);
  const int64_t group = int64_t{red.accumulators} * lanes;
  std::vector<std::string> f_vars = outs;
  f_vars.insert(f_vars.end(), others.begin(), others.end());
  std::vector<std::string> f_image = f_vars;
  f_image.push_back("floor((" + positional[red.vector] + " - (" + std::to_string(red.lo) + "))/" + std::to_string(group) + ")");
  f_vars.push_back("g");
  isl::set steps = domain.apply(isl::map(ctx.get(), "{ " + tuple + " -> F[" + join(f_image) + "] }")).coalesce();
  // The tiles' coordinates (RowReduction::hoisted): the hoisted variables, the last one's tile.
  std::vector<std::string> tile_names, tile_of;
  for (size_t q = 0; q < red.hoisted; ++q) {
    const size_t k = red.others[q];
    tile_names.push_back("h" + std::to_string(q));
    if (q + 1 < red.hoisted) {
      tile_of.push_back(positional[k]);
      continue;
    }
    int64_t lo = 0;
    for (const auto& b : a.bounds)
      if (b.name == nest.variables[k]) lo = b.min;
    tile_of.push_back("floor((" + positional[k] + " - (" + std::to_string(lo) + "))/" + std::to_string(red.tile) + ")");
  }
  std::vector<std::string> row_image = outs, row_vars = outs;
  row_image.insert(row_image.end(), tile_of.begin(), tile_of.end());
  row_vars.insert(row_vars.end(), tile_names.begin(), tile_names.end());
  isl::set rows = domain.apply(isl::map(ctx.get(), "{ " + tuple + " -> Z[" + join(row_image) + "] }")).coalesce();
  isl::set stores = isl_support::set_tuple_id(rows, statements.id(LoopNode::Statement::store));
  const std::string z = "Z[" + join(row_vars) + "]", f = "F[" + join(f_vars) + "]", st = "T[" + join(row_vars) + "]";
  isl::union_set all = isl::union_set(rows).unite(isl::union_set(steps)).unite(isl::union_set(stores));
  isl::schedule sched = isl::schedule::from_domain(all);
  isl::schedule_node node = sched.root().child(0);
  auto band = [](isl::schedule_node n, const isl::union_map& m) {
    return n.insert_partial_schedule(isl_support::partial_schedule(m));
  };
  // Z, F and T at the same values of `row` (for F, of `steps`).
  auto rows_band = [&](isl::schedule_node n, const std::vector<std::string>& row, const std::vector<std::string>& step) {
    return band(n, isl::union_map(ctx.get(), "{ " + z + " -> [" + join(row) + "]; " + f + " -> [" + join(step) + "]; " + st + " -> [" +
                                                 join(row) + "] }"));
  };
  if (!outs.empty()) {
    const std::vector<std::string> outer = !outer_members.empty() ? outer_members
        : std::vector<std::string>(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(red.hoisted ? red.outer_outputs : outs.size()));
    node = rows_band(node, outer, outer);
    if (parallel) {  // proven: distinct rows write distinct elements
      node = node.as<isl::schedule_node_band>().member_set_coincident(0, 1);
      node = node.insert_mark(statements.parallel_mark).child(0);
    }
    node = node.child(0);
    if (red.hoisted) {
      node = rows_band(node, tile_names, tile_of).child(0);
      const std::vector<std::string> shared(outs.begin() + static_cast<std::ptrdiff_t>(red.outer_outputs), outs.end());
      node = rows_band(node, shared, shared).child(0);
    }
  }
  isl::union_set_list filters(ctx.get(), 3);
  filters = filters.add(isl::union_set(ctx.get(), "{ " + z + " }"))
                .add(isl::union_set(ctx.get(), "{ " + f + " }"))
                .add(isl::union_set(ctx.get(), "{ " + st + " }"));
  node = node.insert_sequence(filters);
  node = node.insert_mark(isl::id(ctx.get(), "vector_reduction_" + std::to_string(red.accumulators) + "x" +
                                                 std::to_string(lanes))).child(0);
  std::vector<std::string> inner = others;
  inner.push_back("g");
  node = band(node.child(1).child(0), isl::union_map(ctx.get(), "{ " + f + " -> [" + join(inner) + "] }"));
  nest.parallel_outer = parallel && !outs.empty();
  generate(nest, node.schedule());
  return true;
}

}  // namespace polytile::sched::internal
