// Micro-kernel planning and the layout pass (see plan.h and scheduler.h).
#include "plan.h"

#include "polytile/error.h"
#include "polytile/isl_analysis.h"
#include "polytile/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <set>

namespace polytile::sched {

bool uses(const std::vector<Polynomial>& idx, const std::string& v) {
  return std::any_of(idx.begin(), idx.end(), [&v](const Polynomial& p) { return p.coefficient(v) != Rational(0); });
}

// Rows of an operand this many bytes apart or more, read one after another by a reduction: each step
// touches a new page for the TLB and the prefetchers (the page path of pack_vector_operand and
// far_broadcast_steps).
constexpr int64_t kPagePathBytes = 2048;

double output_stride(const std::vector<Polynomial>& idx, const std::string& v, const std::vector<int64_t>& shape) {
  double at = 0, inner = 1;
  for (size_t d = idx.size(); d-- > 0;) {
    const Rational coeff = idx[d].coefficient(v);
    at += std::fabs(static_cast<double>(coeff.num()) / static_cast<double>(coeff.den())) * inner;
    inner *= d < shape.size() ? static_cast<double>(shape[d]) : 1.0;
  }
  return at;
}

namespace {

bool integral(const Polynomial& p) {
  if (p.constant().den() != 1) return false;
  return std::all_of(p.index_terms().begin(), p.index_terms().end(), [](const auto& t) { return t.second.den() == 1; });
}

// v only in the last index, with coefficient 1: consecutive v read consecutive elements.
bool contiguous_in(const std::vector<Polynomial>& idx, const std::string& v) {
  if (idx.empty() || idx.back().coefficient(v) != Rational(1)) return false;
  for (size_t k = 0; k + 1 < idx.size(); ++k)
    if (idx[k].coefficient(v) != Rational(0)) return false;
  return true;
}

// v in exactly one index, with coefficient 1: in a copy with that dim moved last, v is contiguous.
bool transposable(const std::vector<Polynomial>& idx, const std::string& v) {
  int dims = 0;
  for (const auto& p : idx) {
    Rational c = p.coefficient(v);
    if (c == Rational(0)) continue;
    if (c != Rational(1)) return false;
    ++dims;
  }
  return dims == 1;
}

int64_t elements_of(const TensorType& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

// The reduction variable of a micro-kernel's innermost loop: the last one in the contraction's order.
std::string innermost_reduction(const Contraction& c) {
  std::string r;
  for (const auto& v : c.index_variables())
    if (!uses(c.output_indices, v)) r = v;
  return r;
}

// Each element of a broadcast operand serving this many points or more, the layouts pass copies it with
// the variable its steps cross pages along last (far_broadcast_steps): the innermost reduction variable,
// or the longest one of kServedLongest.
constexpr int64_t kServedInnermost = 16, kServedLongest = 256;
// Each element of a vector operand whose rows lie a page or more apart serving this many points or more,
// the layouts pass copies it into panels where it does not fit in L2 (pack_vector_operand).
constexpr int64_t kServedPagePack = 32;

// The reduction variables along which a broadcast operand's steps cross pages, if any do: the innermost
// one, and the longest one where the variables inside it in the loops take 16 steps or fewer (an NCHW
// conv's input channels, with the 3 x 3 taps inside them). Empty strings where there is no reduction.
std::pair<std::string, std::string> step_variables(const Contraction& c, const std::map<std::string, int64_t>& extent) {
  const std::string innermost = innermost_reduction(c);
  std::vector<std::string> reductions;  // in loop order
  for (const auto& v : c.index_variables())
    if (!uses(c.output_indices, v)) reductions.push_back(v);
  if (reductions.empty()) return {};
  auto at = std::max_element(reductions.begin(), reductions.end(), [&](const auto& a, const auto& b) { return extent.at(a) < extent.at(b); });
  int64_t inside = 1;
  for (auto v = at + 1; v != reductions.end(); ++v) inside *= extent.at(*v);
  return {innermost, extent.at(*at) > extent.at(innermost) && inside <= 16 ? *at : innermost};
}

// Whether operand `idx` of `c`, a tensor of `type`, read as a broadcast operand, steps a page or more
// (kPagePathBytes) along one of its step_variables, and stays so: the layouts pass does not copy it
// (each element serves fewer than kServedInnermost or kServedLongest points of `points`).
bool steps_across_pages(const Contraction& c, const std::vector<Polynomial>& idx, const TensorType& type,
                        const std::map<std::string, int64_t>& extent, int64_t points) {
  const auto [innermost, longest] = step_variables(c, extent);
  for (const std::string& r : {innermost, longest}) {
    if (r.empty() || !uses(idx, r)) continue;
    if (output_stride(idx, r, type.shape) * static_cast<double>(dtype_bytes(type.dtype)) < kPagePathBytes) continue;
    const int64_t served = r == innermost ? kServedInnermost : kServedLongest;
    if (!transposable(idx, r) || elements_of(type) * served > points) return true;
  }
  return false;
}

// The dims of an access in the order a micro-kernel reads them: the dim holding v (transposable or
// contiguous_in: one at most) last, the others in order; empty when no dim holds v.
std::vector<size_t> vector_dim_last(const std::vector<Polynomial>& idx, const std::string& v) {
  std::vector<size_t> order;
  std::optional<size_t> vdim;
  for (size_t k = 0; k < idx.size(); ++k) {
    if (idx[k].coefficient(v) != Rational(0)) vdim = k;
    else order.push_back(k);
  }
  if (!vdim) return {};
  order.push_back(*vdim);
  return order;
}

std::vector<Polynomial> bound(const std::vector<Polynomial>& idx, const std::map<std::string, int64_t>& dims) {
  std::vector<Polynomial> out;
  for (const auto& p : idx) out.push_back(p.bind_dims(dims));
  return out;
}

// Packing: when consecutive reduction steps read the vector operand rows a page or more apart (a wide
// matrix's columns), every step of a block touches a new page and the TLB, not the FMAs, sets the pace
// (unless the whole operand, read as it is, fits in a core's L2: see below). When they read rows wider
// than a block column (128 or 256 output channels of a convolution's weights, 64 at a time), a reduction
// tile's columns fall into a fraction of L1's sets -- 512-byte rows of which 256 bytes are read use half
// of them -- and evict each other before the blocks reuse them. That is
// worth a copy where each element of the operand serves 1024 points or more (a 256x256 matmul's 256 do
// not pay for it), and not in a weight gradient whose reduction is split across the threads
// (weight_split): a panel would give its output a split index, and the split needs plain ones.
// The operand is copied into panels of chunks x lanes columns, P[vb, ..., vl] = B[..., VL*vb + vl] (v's
// dim moved last for an operand that the micro-kernel would read transposed), and the contraction reads P
// with v = VL*vb + vl: each block column reads one contiguous panel. When VL does not divide v's extent
// (a 1000-wide matmul), the last panel is padded (its tail is the copy's zero default, never read by a
// valid point) and its block column runs with v's lanes masked by the output's range.
std::optional<Program> pack_vector_operand(const Contraction& c, const ProgramTypes& types, const MicroPlan& plan,
                                           const std::vector<poly::VariableBounds>& bounds, const Target& target,
                                           std::set<std::string>& names) {
  const int64_t vl_size = int64_t{plan.chunks} * plan.lanes;
  const std::string& v = plan.vector;
  int vector_input = plan.transpose_input;
  for (size_t k = 0; k < c.inputs.size() && vector_input < 0; ++k)
    if (uses(c.inputs[k].indices, v)) vector_input = static_cast<int>(k);
  if (vector_input < 0) return std::nullopt;
  const TensorAccess& access = c.inputs[static_cast<size_t>(vector_input)];
  const TensorType& type = types.tensors.at(access.tensor);
  const int64_t element_bytes = static_cast<int64_t>(dtype_bytes(type.dtype));
  // The operand's dims as the micro-kernel reads them: v's dim last (moved there for a transposed input).
  const std::vector<size_t> order = vector_dim_last(access.indices, v);
  if (order.size() < 2) return std::nullopt;
  const size_t vdim = order.back();
  std::vector<Polynomial> idx;
  std::vector<int64_t> shape;
  for (size_t k : order) {
    idx.push_back(access.indices[k].bind_dims(types.dims));
    shape.push_back(type.shape[k]);
  }
  if (idx.back() != Polynomial::index(v) || shape.back() < 2 * vl_size) return std::nullopt;
  // The smallest distance in memory between the rows read by consecutive values of a reduction variable.
  std::vector<std::string> vars = c.index_variables();
  std::vector<Polynomial> out = bound(c.output_indices, types.dims);
  int64_t nearest = INT64_MAX;
  for (const auto& r : vars) {
    if (uses(out, r) || !uses(idx, r)) continue;
    int64_t stride = 0, inner = 1;
    for (size_t k = idx.size(); k-- > 0;) {
      stride += std::abs(idx[k].coefficient(r).num()) * inner;
      inner *= shape[k];
    }
    nearest = std::min(nearest, stride * element_bytes);
  }
  if (nearest == INT64_MAX || nearest <= vl_size * element_bytes) return std::nullopt;
  const int64_t operand_elements = elements_of(type), operand_bytes = operand_elements * element_bytes;
  // On a Zen core (CpuModel::pack_within_l2 false) an operand that fits in a core's L2 is read from there
  // after its first pass, and its pages are within the TLB's reach: a page per step costs less than the
  // copy, whose panels every thread then reads, half of them written by the other core (sgemm 512 on a
  // 2-core Zen 4 guest: 1.28 -> 1.21 ms unpacked in quiet minutes, 1.46 -> 1.20 in slow ones; at 1024, 4
  // MiB of B, C = A B ran 6% faster unpacked but C = A^T B 3% slower, and at 2000 the copy pays 7%).
  // Intel's cores gain from the copy at every size: on the 2-core Xeon guest with AMX (2026-12-07, medians
  // of 40 runs, two rounds, unpacked against packed) C = A B with A 1024 x 256 and B 256 x 1024 ran in
  // 2.21 / 2.09 against 1.87 / 1.73 ms, B 512 x 1024 4.66 / 4.69 against 3.66 / 3.68, B 128 x 1024 0.95 /
  // 0.98 against 0.82 / 0.86, A 512 x 256 and B 256 x 2048 2.14 / 2.23 against 1.97 / 1.96, A 2048 x 1024
  // and B 1024 x 512 9.15 / 8.74 against 6.58 / 6.68, sgemm 512 0.92-0.96 against 0.86-0.93; sgemm 768
  // (rows 3 KiB apart) the same either way.
  // Nor one whose elements each serve fewer than kServedPagePack points (a skinny matmul's B, read by a
  // few rows of A): the copy reads it and writes it, and the micro-kernel reads the panels again, while
  // the rows' blocks of a column, one after another, read each reduction tile of it from memory once
  // (microkernel.cpp, size_reduction_tiles). C = A B on the 2-core Xeon guest with AMX (2026-12-07,
  // fastest of 10-15 runs, packed against not), B 4096 x 4096: 16 rows of A 9.7 against 3.1-3.9 ms, 24
  // rows 10.0-10.5 against 5.9, 32 rows 11.2-11.5 against 5.7-6.0, 64 rows 14.5-14.9 against 10.2-11.1;
  // B 2048 x 4096: 32 rows 4.0-4.3 against 4.0-4.1, 100 rows 7.8-8.0 against 10.7-12.2; B 4096 x 1024,
  // 31 rows: 2.2-2.3 against 1.1; B 8192 x 512, 200 rows: 6.1-6.7 against 8.8-9.0. Below 32 rows the
  // copy lost in every shape measured; from there on it depends on the shape (more rows share each tile
  // of B from L1 while the accumulators stream through L2 once per tile).
  const bool page_path = nearest >= kPagePathBytes;
  if (page_path && plan.transpose_input < 0 &&
      ((operand_bytes <= target.cpu.l2_bytes && !target.cpu.pack_within_l2) || box_points(bounds) < kServedPagePack * operand_elements))
    return std::nullopt;
  if (!page_path) {  // no page per step: only the sets of L1
    const int64_t out_bytes = elements_of(types.tensors.at(c.output)) * element_bytes;
    int64_t reduction_points = 1;
    for (const auto& b : bounds)
      if (!uses(out, b.name)) reduction_points *= b.max - b.min + 1;
    if (weight_split(out_bytes, reduction_points, target) || box_points(bounds) < 1024 * operand_elements)
      return std::nullopt;
  }

  std::set<std::string> taken(vars.begin(), vars.end());
  const std::string vb = fresh_name(v + "_blk", taken), vl = fresh_name(v + "_lane", taken);
  const std::string panel = fresh_name(access.tensor + "_P", names);
  // P[tb, t0, ..., tl : S_v / VL, S0, ..., VL] = =(B[t0, ..., VL*tb + tl, ...]), v's dim (t_vdim) in
  // the source where it is, in the panel split into tb (first) and tl (last), the other dims in order.
  Contraction copy;
  copy.output = panel;
  copy.aggregation = AggregationOp::assign;
  copy.combination = CombinationOp::none;
  TensorAccess source{access.tensor, {}};
  for (size_t k = 0; k < access.indices.size(); ++k)
    source.indices.push_back(k == vdim ? Polynomial::index("tb") * Rational(vl_size) + Polynomial::index("tl")
                                       : Polynomial::index("t" + std::to_string(k)));
  copy.output_indices.push_back(Polynomial::index("tb"));
  copy.output_shape.push_back(DimExpr((shape.back() + vl_size - 1) / vl_size));  // the last panel padded
  for (size_t k = 0; k + 1 < order.size(); ++k) {
    copy.output_indices.push_back(Polynomial::index("t" + std::to_string(order[k])));
    copy.output_shape.push_back(DimExpr(shape[k]));
  }
  copy.output_indices.push_back(Polynomial::index("tl"));
  copy.output_shape.push_back(DimExpr(vl_size));
  copy.inputs.push_back(source);

  const Polynomial split = Polynomial::index(vb) * Rational(vl_size) + Polynomial::index(vl) - Polynomial::index(v);
  auto substitute = [&](const Polynomial& p) { return p + split * p.coefficient(v); };
  Contraction rewritten = c;
  for (auto& p : rewritten.output_indices) p = substitute(p);
  for (auto& k : rewritten.constraints) k.poly = substitute(k.poly);
  for (size_t k = 0; k < rewritten.inputs.size(); ++k) {
    auto& in = rewritten.inputs[k];
    if (static_cast<int>(k) != vector_input) {
      for (auto& p : in.indices) p = substitute(p);
      continue;
    }
    std::vector<Polynomial> packed{Polynomial::index(vb)};
    for (size_t k = 0; k + 1 < order.size(); ++k) packed.push_back(in.indices[order[k]]);
    packed.push_back(Polynomial::index(vl));
    in.tensor = panel;
    in.indices = packed;
  }
  Program p;
  p.statements.push_back(copy);
  p.statements.push_back(rewritten);
  return p;
}

}  // namespace

namespace {

// A reduction this long runs as many tiles of an L1-sized footprint per output block.
constexpr int64_t kLongReduction = 2048;
// A reduction variable this long, into an output that overflows L2, takes L2-sized tiles (long_tiles).
constexpr int64_t kLongTiles = 768;

// Whether each thread's share of an output of `out_bytes` fits in half of its L2.
bool output_fits_l2(int64_t out_bytes, const Target& target) {
  return out_bytes * 2 <= target.cpu.l2_bytes * std::max(1, target.threads);
}

}  // namespace

int64_t weight_share_max_bytes(const Target& target) { return target.cpu.l2_bytes * 3 / 4; }

bool weight_mode(int64_t out_bytes, int64_t reduction_points, const Target& target) {
  const int64_t threads = std::max(1, target.threads);
  return (out_bytes + threads - 1) / threads <= weight_share_max_bytes(target) && reduction_points >= kLongReduction;
}

bool weight_split(int64_t out_bytes, int64_t reduction_points, const Target& target) {
  // One copy of the output per thread: weight mode's share per thread is then a whole copy.
  return target.threads >= 2 && weight_mode(out_bytes * target.threads, reduction_points / target.threads, target);
}

bool long_tiles(int64_t out_bytes, int64_t longest, const Target& target) {
  return !output_fits_l2(out_bytes, target) && longest >= kLongTiles;
}

int64_t reduction_tile_budget(bool long_tiles, const Target& target) {
  const int64_t bytes = long_tiles                     ? target.cpu.l2_bytes * 3 / 8
                        : target.cpu.fma_per_cycle < 2 ? target.cpu.l2_bytes / 8
                                                       : target.cpu.l1_bytes * 3 / 4;
  return bytes * std::max(1, target.cpu.reduction_tile_percent) / 100;
}

bool broadcast_per_row(const TensorAccess& a, const MicroPlan& plan) {
  return !uses(a.indices, plan.vector) && uses(a.indices, plan.block);
}

int64_t broadcast_prefetch_bytes(const Contraction& c, const ProgramTypes& types, const MicroPlan& plan) {
  constexpr int64_t line = 64;
  int64_t bytes = 0;
  for (const auto& in : c.inputs) {
    if (!broadcast_per_row(in, plan)) continue;
    if (!contiguous_in(in.indices, plan.block)) return 0;
    bytes = std::max(bytes, 2 * plan.rows * static_cast<int64_t>(dtype_bytes(types.tensors.at(in.tensor).dtype)));
  }
  return (bytes + line - 1) / line * line;
}

int64_t idle_values(int64_t count, int64_t threads) {
  threads = std::max<int64_t>(1, threads);
  return (count + threads - 1) / threads * threads - count;
}

int64_t equal_tiles(int64_t extent, int64_t most, int64_t multiple) {
  most = std::max<int64_t>(1, most);
  multiple = std::max<int64_t>(1, multiple);
  int64_t tiles = (extent + most - 1) / most;
  tiles = (tiles + multiple - 1) / multiple * multiple;
  // Each of `multiple` threads takes tiles / multiple of them, the last one the short tile: of up to
  // twice as many tiles, the count that leaves the busiest thread the fewest values (125 row blocks of a
  // 1000-row matmul on 2 threads: 6 tiles of 21, 63 and 62 blocks a thread, not 4 of 32, 64 and 61).
  int64_t best = tiles;
  for (int64_t busiest = INT64_MAX, t = tiles; multiple > 1 && t <= 2 * tiles && t <= extent; t += multiple) {
    const int64_t load = t / multiple * ((extent + t - 1) / t);
    if (load < busiest) best = t, busiest = load;
  }
  return (extent + best - 1) / best;
}

int64_t box_points(const std::vector<poly::VariableBounds>& bounds) {
  int64_t points = 1;
  for (const auto& b : bounds) {
    const int64_t e = b.max - b.min + 1;
    points = points > (int64_t{1} << 50) / e ? int64_t{1} << 50 : points * e;
  }
  return points;
}

int64_t vector_lanes(DType t, const Target& target) {
  return std::max<int64_t>(1, target.cpu.vector_bits / (8 * static_cast<int64_t>(dtype_bytes(t))));
}

std::optional<MicroPlan> plan_microkernel(const Contraction& c, const ProgramTypes& types,
                                          const std::vector<poly::VariableBounds>& bounds, const Target& target,
                                          bool allow_transpose) {
  if (c.aggregation != AggregationOp::sum || c.combination != CombinationOp::mul || c.inputs.size() != 2) return std::nullopt;
  const DType t = types.tensors.at(c.output).dtype;
  if (t != DType::f32 && t != DType::f64) return std::nullopt;
  for (const auto& a : c.inputs)
    if (types.tensors.at(a.tensor).dtype != t) return std::nullopt;
  std::vector<Polynomial> out = bound(c.output_indices, types.dims);
  std::vector<std::vector<Polynomial>> in;
  for (const auto& a : c.inputs) in.push_back(bound(a.indices, types.dims));
  if (out.empty()) return std::nullopt;
  for (const auto& idx : in)
    if (!std::all_of(idx.begin(), idx.end(), integral)) return std::nullopt;
  if (!std::all_of(out.begin(), out.end(), integral)) return std::nullopt;

  std::map<std::string, int64_t> extent;
  const int64_t points = box_points(bounds);
  for (const auto& b : bounds) extent[b.name] = b.max - b.min + 1;
  std::vector<std::string> vars = c.index_variables();
  std::vector<std::string> outputs, reductions;
  for (const auto& v : vars) (uses(out, v) ? outputs : reductions).push_back(v);
  if (reductions.empty() || outputs.size() < 2) return std::nullopt;

  const int64_t element_bytes = static_cast<int64_t>(dtype_bytes(t));
  MicroPlan plan;
  plan.lanes = static_cast<int>(vector_lanes(t, target));
  bool found = false;
  for (const auto& v : outputs) {
    if (!contiguous_in(out, v)) continue;
    int transpose = -1;
    bool ok = true, vector_input = false;
    for (size_t k = 0; k < in.size() && ok; ++k) {
      if (!uses(in[k], v)) continue;
      if (contiguous_in(in[k], v)) {
        vector_input = true;
        continue;
      }
      int64_t elements = 1;
      for (int64_t d : types.tensors.at(c.inputs[k].tensor).shape) elements *= d;
      if (allow_transpose && transpose < 0 && transposable(in[k], v) && elements * 16 <= points) {
        transpose = static_cast<int>(k);
        vector_input = true;
        continue;
      }
      ok = false;
    }
    if (!ok || !vector_input) continue;
    plan.vector = v;
    plan.transpose_input = transpose;
    found = true;
    break;
  }
  if (!found) return std::nullopt;

  // Registers: rows x chunks accumulators, `chunks` vector operands and one broadcast.
  const int64_t lanes = plan.lanes;
  // The block variable and the rows per block, by a small throughput model. A reduction step of a block
  // costs rows x chunks FMAs (CpuModel::fma_per_cycle of them per cycle, and at least one FMA's latency,
  // CpuModel::fma_latency, where they are few), rows + chunks loads (two per cycle) and loop overhead; a
  // predicated block (a border of a variable coupled to the reduction through
  // an index or constraint, or a partial last block) adds a select per FMA and, at borders, a validity
  // test per row. Rows should read distinct broadcast values and share the vector operand; ties go to the
  // later (more contiguous) variable.
  std::vector<std::vector<Polynomial>> coupling = in;
  for (const auto& k : c.constraints) coupling.push_back({k.poly.bind_dims(types.dims)});
  auto coupled = [&](const std::string& b) {  // a reduction variable of one value (a 1x1 conv's) moves nothing
    for (const auto& idx : coupling)
      for (const auto& p : idx)
        if (p.coefficient(b) != Rational(0))
          for (const auto& r : reductions)
            if (p.coefficient(r) != Rational(0) && extent[r] > 1) return true;
    return false;
  };
  // The chunks per block column: up to 6 (at least two rows in the registers), each weighed by the lanes
  // it computes that are in v's range and by its partial column -- 96 channels run as one column of 6
  // chunks or two of 3, not as a column of 4 and a half-empty one. The default, min(registers / 8, v's
  // extent in vectors) -- 4 with AVX-512's 32 registers, 2 with AVX2's 16 (up to 6 rows) -- unless a count
  // is better than it by more than the model's noise: any count where the default's columns leave part
  // of v's range empty; where they fill it, only the wider counts that fill it too. Wider columns read
  // the broadcast operand in fewer passes: with AVX2 on Zen 3, a 3x3 conv's 2 rows of 4 chunks ran 3-11%
  // faster than 4 rows of 2 in both data directions, 4 x 3 beat 4 x 2 by 5-13% on 96 channels, and the
  // model's tie keeps a matmul's (or a weight gradient's) 6 x 2, which was faster (2 x 4: 8-75% slower).
  // Narrower counts are not tried: AVX-512's columns of 4 where 64 f32 channels fill them stay as tuned.
  const int64_t v_extent = extent[plan.vector];
  const int64_t most_chunks = std::clamp<int64_t>((v_extent + lanes - 1) / lanes, 1, 6);
  // What each candidate block variable brings, whatever the chunks: its score (rows reading distinct
  // broadcast values and sharing the vector operand), its extent, borders and the distance of its rows.
  struct Candidate {
    std::string name;
    int score = 0;
    int64_t extent = 1;
    bool border = false, far = false, paged = false;
  };
  std::vector<Candidate> candidates;
  for (const auto& b : outputs) {
    if (b == plan.vector) continue;
    Candidate cand{b, 0, extent[b], coupled(b), false, false};
    for (size_t k = 0; k < in.size(); ++k) {
      bool is_vector = uses(in[k], plan.vector) || static_cast<int>(k) == plan.transpose_input;
      if (!is_vector && uses(in[k], b)) {
        cand.score += 2;
        const TensorType& type = types.tensors.at(c.inputs[k].tensor);
        cand.paged = cand.paged || (output_stride(in[k], b, type.shape) * static_cast<double>(element_bytes) >= kPagePathBytes &&
                                    steps_across_pages(c, in[k], type, extent, points));
      }
      if (is_vector && !uses(in[k], b)) cand.score += 1;
    }
    // Distance between consecutive rows of the output.
    const double stride = output_stride(out, b, types.tensors.at(c.output).shape);
    cand.far = stride * static_cast<double>(element_bytes) > static_cast<double>(target.cpu.l1_bytes);
    candidates.push_back(cand);
  }
  struct Choice {
    double key = -1;
    std::string block;
    int rows = 1, chunks = 1;
  };
  const int64_t default_chunks = std::min<int64_t>(most_chunks, std::max(1, target.cpu.vector_registers / 8));
  const double fma_rate = std::max(1, target.cpu.fma_per_cycle);
  auto choose = [&](int64_t nc) {
    Choice best;
    best.chunks = static_cast<int>(nc);
    const int max_rows = std::clamp((target.cpu.vector_registers - 1 - static_cast<int>(nc)) / static_cast<int>(nc), 1, 14);
    if (nc != default_chunks && nc > 1 && max_rows < 2) return best;  // an alternative needs two rows
    const double chunks = static_cast<double>(nc);
    const int64_t columns = (v_extent + nc * lanes - 1) / (nc * lanes);
    // The lanes computed in v's range, and a partial last column's blocks run predicated (about twice the
    // cost of a uniform block, as `slow` below).
    const bool partial = v_extent % (nc * lanes) != 0;
    const double used = static_cast<double>(v_extent) / static_cast<double>(columns * nc * lanes) *
                        static_cast<double>(columns) / static_cast<double>(columns + (partial ? 1 : 0));
    for (const Candidate& cand : candidates) {
      const int64_t e = cand.extent;
      // Rows that share neither operand (a score of 0: every input reads the block variable and the vector
      // one, as S[c] = +(A[n, c] * B[n, c]), a normalization's scale gradient) reuse nothing in the registers.
      // Where that variable is a split reduction's slices (split_reductions: one per thread), rows over it
      // would put the threads' slices in one block, on one thread: blocks of one row each leave them to
      // the threads. S[c : 1024] over 4096 rows on the 2-core Xeon guest with AMX (2026-12-07): 1.15-1.20 ms
      // in blocks of both slices, 0.57-0.60 in blocks of one (NHWC 8x56x56x64, summed over n, y and x:
      // 0.47-0.48 -> 0.22-0.24).
      const int64_t most_rows = cand.score == 0 ? 1 : std::min<int64_t>(max_rows, e);
      for (int64_t rows = 1; rows <= most_rows; ++rows) {
        int64_t blocks = (e + rows - 1) / rows;
        int64_t predicated = std::min<int64_t>(blocks, (cand.border ? 2 : 0) + (e % rows != 0 && !cand.border ? 1 : 0));
        // The FMAs' cycles, at least the latency of one accumulator's chain (a step's FMAs are independent).
        const double fma_cycles = std::max(static_cast<double>(rows) * chunks / fma_rate, static_cast<double>(target.cpu.fma_latency));
        double fast = fma_cycles + 0.5 * (static_cast<double>(rows) + chunks) + 2;
        double slow = fast + static_cast<double>(rows) * chunks / fma_rate + (cand.border ? static_cast<double>(rows) : 0.0);
        double cost = static_cast<double>(blocks - predicated) * fast + static_cast<double>(predicated) * slow;
        double efficiency = static_cast<double>(e) * chunks / fma_rate / cost * used;
        // Rows in distant pages: each its own stream for the prefetchers and the TLB, 4% a row (4 rows lose
        // 16%; 2 rows, 8%: on Zen 3 a conv's 2 rows of 4 chunks over the batch beat the same over x by 3-10%).
        if (cand.far) efficiency *= 1 - 0.04 * static_cast<double>(rows);
        // Rows a page or more apart in a broadcast operand whose steps cross pages every few steps
        // (steps_across_pages): each step of each row on a page of its own, 6% a row. A stride-2 NCHW conv
        // reading its image as it is (channels a plane apart at every ninth step; 64 -> 64 channels on
        // 56 x 56, 8 images) ran blocks of 4 images (its output moved into place by a nest of its own) at
        // 1.67-1.75 ms against 1.41-1.50 for blocks of 4 columns (stored permuted by their blocks), the
        // seed's stride-3 conv in NCHW 0.40 against 0.34-0.36, and with AVX2 code 3.1-3.7 against 2.6-2.7, on
        // a 2-core Intel Xeon guest with AMX (2 MiB L2 a core), 2026-12-07 (fastest of 30-100 runs, 3
        // alternating rounds).
        if (cand.paged) efficiency *= 1 - 0.06 * static_cast<double>(rows);
        double key = cand.score + 0.99 * efficiency;
        if (key >= best.key - 1e-9) {
          best.key = key;
          best.block = cand.name;
          best.rows = static_cast<int>(rows);
        }
      }
    }
    return best;
  };
  Choice best = choose(default_chunks);
  const bool default_fills = v_extent % (default_chunks * lanes) == 0;
  for (int64_t nc = 1; nc <= most_chunks; ++nc) {
    if (default_fills && (nc <= default_chunks || v_extent % (nc * lanes) != 0)) continue;
    Choice other = choose(nc);
    if (other.key > best.key + 0.01) best = other;
  }
  if (const int64_t wanted = target.cpu.microkernel_chunks; wanted > 0 && wanted != best.chunks && wanted <= most_chunks) {
    Choice other = choose(wanted);  // where it has no block (too few registers for two rows), the model's stays
    if (!other.block.empty()) best = other;
  }
  if (best.block.empty()) return std::nullopt;
  // Rows that share no operand in the registers (every input reads the block variable: an NCHW depthwise
  // conv's channels, each row its own plane and its own weights) gain nothing from the block, and with
  // AVX2's 16 registers they run slower than the loop nest LLVM vectorizes: on the 2-core Zen 3 guest
  // (2026-12-08, `polytile run --tune`, fastest of 30) the padded 3x3 depthwise forward on 8x64x56x56
  // took 2.84 ms as 13 x 1 blocks (2.12 with fewer, 3.36 with columns of 2) against 1.31 as loops, the
  // unpadded one on 64 columns 1.34 as 6 x 2 blocks against 0.95. With AVX-512's 32 registers such
  // blocks ran 1.7x as fast as the loops (0.74-0.82 against 1.30-1.42 ms on an Emerald Rapids guest).
  if (target.cpu.vector_registers < 32 &&
      std::all_of(c.inputs.begin(), c.inputs.end(), [&](const TensorAccess& a) { return uses(a.indices, best.block); }))
    return std::nullopt;
  plan.block = best.block;
  plan.rows = best.rows;
  plan.chunks = best.chunks;
  return plan;
}

namespace {

// A copy of `access`'s tensor with the dim that holds v (transposable) moved last, one assign contraction,
// which `access` then reads with its indices permuted alike.
Contraction transposed_copy(TensorAccess& access, const std::string& v, const ProgramTypes& types, std::set<std::string>& names) {
  const TensorType& type = types.tensors.at(access.tensor);
  const std::vector<size_t> order = vector_dim_last(access.indices, v);
  Contraction copy;
  copy.output = fresh_name(access.tensor + "_T", names);
  copy.aggregation = AggregationOp::assign;
  copy.combination = CombinationOp::none;
  TensorAccess source{access.tensor, {}};
  std::vector<Polynomial> permuted;
  for (size_t k = 0; k < access.indices.size(); ++k) source.indices.push_back(Polynomial::index("t" + std::to_string(k)));
  for (size_t k : order) {
    copy.output_indices.push_back(source.indices[k]);
    copy.output_shape.push_back(DimExpr(type.shape[k]));
    permuted.push_back(access.indices[k]);
  }
  copy.inputs.push_back(source);
  access.tensor = copy.output;
  access.indices = permuted;
  return copy;
}

// The broadcast operand's steps: a micro-kernel's block reads its rows' broadcast values at every step of
// the innermost reduction variable r. Where the operand holds r in a dim a page or more from the next
// step's (A[k, i] of C = A^T B: every step a row of A further), each step touches a new page for every
// block and the TLB sets the pace (a 1024^3 A^T B ran at half the speed of A B, 2048^3 at 0.45). A copy
// with r's dim last (A^T) makes the rows stream along r as in A B; it pays where each element of the
// operand serves 16 points or more, as the vector operand's transposition. The same for the longest
// reduction variable where the copy makes it the innermost one (the contraction's variables in order of
// first appearance: the operand is the first input) and each element serves 256 points or more: an NCHW
// conv's input channels, a plane (3-12 KB) apart at every ninth step. Read from an NHWC copy, the 3x3
// 64-channel forward on 32 columns took 2.0-2.1 ms instead of 2.3-2.9, on 56 columns 6.0 instead of
// 6.3-6.4, the 128-channel one on 28 columns 5.7 instead of 6.6, the stride-2 one from 64 to 128
// channels 3.3-3.8 instead of 3.7-4.5 (medians of 40 runs, 3-5 alternating rounds; 96 channels on 28
// columns 3.4 instead of 3.3).
// A 1x1 conv's elements serve 64 points, the seed conv's fewer: copied, they were 10-40% slower.
// An operand read second whose rows lie apart in it (an NCHW conv's data gradient with its blocks over
// the images: DO[n, co, y, x], the rows 4 images, each step a plane further in every one) goes first in
// the product, which commutes, when only that makes r (co) the innermost reduction: its copy is then read
// as NHWC's is, every row's channels one after another (FarSteps::first). Interleaved on the 2-core
// Emerald Rapids guest, fastest of 20-50 runs: the stride-2 64-channel data gradient on 56x56 2.10-2.14 ->
// 1.64-1.74 ms, the 128-channel one on 28x28 6.77-7.89 -> 5.70-6.43, 96 channels 3.45-4.11 -> 3.32-3.97.
// Rows along the operand's contiguous dim (blocks of x: the 3x3 and 1x1 data gradients on 56 columns)
// share each line of it already; the same copy first there took the same time or longer: not made.
// Rows closer than a page conflict in the caches instead. A block reads a line of the operand at every
// step of its reduction tile, and the next blocks (the next rows) read the same lines again, so those
// should stay in L2; but where every step is a multiple of 64 x 2^z bytes from the others (2^z the largest
// power of two in the gcd of the steps' strides over 64), a cache's set index (the address's bits from 6
// up, as many as it has sets: a power of two) takes only every 2^z-th value, and L2 keeps l2_bytes / (64 x
// 2^z) such lines, whatever its ways (rows 1 KiB apart: a line for each KiB of L2; L1 holds only a few
// dozen). A_T B with A 1024 x 256 (rows 1 KiB apart, 1024 steps in one tile) on the 2-core Zen 3 guest
// (512 KiB L2: 512 such lines) read every line from L3 for every block: by 1024 x 1024 5.4-6.1 -> 3.5-4.1
// ms with the copy (three rounds, medians of 30-40 runs), 512 steps by 1024 columns (tiles of 256 steps)
// 1.87-2.44 -> 1.71-2.08; with tiles of a quarter of what L2 keeps still: 256 x 256 by 256 x 256 0.30-0.34
// -> 0.27-0.30 ms, 1024 x 256 by 1024 x 256 1.29-1.42 -> 1.24-1.43, the 3x3 256 -> 256 conv's weight
// gradient on 14 x 14 (tiles of 196 pixels, 8 images) 0.69-1.00 -> 0.73-0.84 of oneDNN's time (four rounds
// of the bench's pair). Where the lines fit (a 2 MiB L2 keeps 2048) the copy is a pass that saves nothing.
// (Rows 512 bytes apart, 1024 steps: 1024 lines kept, the same time with and without the copy; 2048 steps
// in tiles of 256, rows 1 KiB apart: the same.) `in`: the operand, `plan` the micro-kernel's.
bool overflows_l2_sets(const Contraction& c, const TensorAccess& in, const ProgramTypes& types, const MicroPlan& plan,
                       const std::map<std::string, int64_t>& extent, const Target& target) {
  constexpr int64_t line = 64;
  if (target.gpu) return false;
  const TensorType& type = types.tensors.at(in.tensor);
  std::vector<std::string> reductions;  // in loop order
  for (const auto& v : c.index_variables())
    if (!uses(c.output_indices, v)) reductions.push_back(v);
  int64_t gcd = 0, reduction_points = 1, longest = 0;
  for (const std::string& v : reductions) {
    reduction_points *= extent.at(v);
    longest = std::max(longest, extent.at(v));
    if (extent.at(v) < 2 || !uses(in.indices, v)) continue;
    const double stride = output_stride(in.indices, v, type.shape) * static_cast<double>(dtype_bytes(type.dtype));
    const auto bytes = static_cast<int64_t>(stride);
    if (static_cast<double>(bytes) != stride) return false;
    gcd = std::gcd(gcd, bytes);
  }
  if (gcd < line || gcd % line != 0) return false;  // lines spread over the sets
  // In weight mode the reduction's tiles run outside the blocks, each tile's lines read by every block
  // while they sit in L1 (microkernel.cpp): no block reads the whole reduction.
  const int64_t out_bytes = types.tensors.at(c.output).bytes();
  if (weight_mode(out_bytes, reduction_points, target)) return false;
  // The steps of a block's reduction tile, as the micro-kernel sizes them (its footprint within
  // reduction_tile_budget, the innermost variable filled first), with a step's footprint taken as the
  // block's broadcast values and vectors.
  const int64_t step_bytes = (plan.rows + plan.chunks * plan.lanes) * static_cast<int64_t>(dtype_bytes(type.dtype));
  const int64_t fit = std::max<int64_t>(1, reduction_tile_budget(long_tiles(out_bytes, longest, target), target) / step_bytes);
  int64_t steps = 1;
  for (size_t k = reductions.size(); k-- > 0;) {
    const int64_t e = extent.at(reductions[k]);
    if (steps * e > fit) {
      steps *= equal_tiles(e, std::max<int64_t>(1, fit / steps), 1);
      break;
    }
    steps *= e;
  }
  const int64_t lines = gcd / line;
  const int64_t kept = target.cpu.l2_bytes / (line * (lines & -lines));
  return steps * 4 > kept;
}

struct FarSteps {
  int input = -1;  // the operand to copy with r's dim last
  std::string r;
  bool first = false;  // the copy goes first in the product (the inputs swapped)
};

std::optional<FarSteps> far_broadcast_steps(const Contraction& c, const ProgramTypes& types, const MicroPlan& plan,
                                            const std::vector<poly::VariableBounds>& bounds, const Target& target) {
  // The innermost reduction variable, and the longest, where the ones inside it in the loops take few
  // steps (an NCHW conv's 3 x 3 taps inside its channels; not a weight gradient's rows, with its columns
  // inside).
  std::map<std::string, int64_t> extent;
  for (const auto& b : bounds) extent[b.name] = b.max - b.min + 1;
  const auto [innermost, longest] = step_variables(c, extent);
  if (innermost.empty()) return std::nullopt;
  for (const std::string& r : {innermost, longest}) {
    for (size_t k = 0; k < c.inputs.size(); ++k) {
      const TensorAccess& in = c.inputs[k];
      if (static_cast<int>(k) == plan.transpose_input || uses(in.indices, plan.vector) || !uses(in.indices, plan.block)) continue;
      if (!transposable(in.indices, r)) continue;
      const TensorType& type = types.tensors.at(in.tensor);
      if (output_stride(in.indices, r, type.shape) * static_cast<double>(dtype_bytes(type.dtype)) < kPagePathBytes &&
          !(r == innermost && overflows_l2_sets(c, in, types, plan, extent, target)))
        continue;
      if (elements_of(type) * kServedInnermost > box_points(bounds)) continue;
      // Each element serving no more points than a block's columns: the micro-kernel loads it once (one
      // column block), and a copy adds a pass over it that saves nothing. Attention's dV = P^T dO over 16 x
      // 512 x 512 with 64 columns (P's steps 2 KiB apart): 2.2 -> 1.36 ms without P's copy, on the 2-core
      // Xeon guest with AMX, 2026-12-07.
      if (elements_of(type) * plan.chunks * plan.lanes >= box_points(bounds)) continue;
      if (r != innermost) {  // each element serving 256 points or more, and the copy making r the innermost
        if (elements_of(type) * kServedLongest > box_points(bounds)) continue;
        Contraction copied = c;
        std::set<std::string> scratch = {in.tensor};
        transposed_copy(copied.inputs[k], r, types, scratch);
        const bool first = innermost_reduction(copied) != r && k == 1 && c.inputs.size() == 2 &&
                           c.combination == CombinationOp::mul && !contiguous_in(in.indices, plan.block);
        if (first) std::swap(copied.inputs[0], copied.inputs[1]);
        if (innermost_reduction(copied) != r) continue;
        return FarSteps{static_cast<int>(k), r, first};
      }
      return FarSteps{static_cast<int>(k), r, false};
    }
  }
  return std::nullopt;
}

// An output permuted for its micro-kernel: `inner` computes the output with one dim moved last into a
// tensor of its own (`types` has it), `copy` writes the output from it; `moved` is that dim's position.
struct PermutedOutput {
  Contraction inner, copy;
  ProgramTypes types;
  MicroPlan plan;
  size_t moved = 0;
};

// Whether the range of variable v in `domain` (over c's index variables) depends on the reduction
// variables: a padded NCHW convolution's x, with x + i - 1 in the image. A micro-kernel with such a v as its
// vector variable masks its border blocks' lanes at every reduction point (try_microkernel), and its
// uniform blocks are only the columns that no kernel position takes past the image.
bool lanes_follow_reductions(const Contraction& c, const poly::internal::IslAnalysis& analysis, const std::string& v) {
  const std::vector<poly::VariableBounds>& vars = analysis.summary.bounds;  // the domain's dims, in order
  // Whether the domain is the product of its points without v and v's range over the output variables.
  isl::set others = analysis.domain;
  std::optional<unsigned> at;
  for (size_t k = 0; k < vars.size(); ++k) {
    if (vars[k].name == v) at = static_cast<unsigned>(k);
    if (!uses(c.output_indices, vars[k].name)) others = isl_support::eliminate(others, static_cast<unsigned>(k));
  }
  POLYTILE_CHECK(at.has_value(), "layouts: ", v, " is no variable of ", c.output);
  return !isl_support::eliminate(analysis.domain, *at).intersect(others).is_equal(analysis.domain);
}

// Output permutation: where the output's contiguous variable leaves an eighth or more of its vectors'
// lanes empty (an NCHW convolution's 54 columns x: vectors of 16 at 32 + 22, its image read as the vector
// operand, 64 channels a page apart at every step), or its range follows the reduction variables (a padded
// NCHW convolution's x of any width: without the permutation, 32 columns in two vectors of 16 made it a
// nest of plain loops at 17 GFLOP/s, and now make a micro-kernel whose every block column is a border
// one, 4.4 ms against 2.1 permuted on 8x64x32x32, 3.0 against 2.4 for its data gradient), and another
// output variable u fills two vectors or more
// exactly (its 64 channels), the contraction writes a copy of the output with u's dim last -- the layout
// the micro-kernel wants, an NHWC convolution's -- and one assign contraction moves it into place. Only where the output is small next
// to the work (each element 16 points or more, as the inputs' copies) and the plan of the permuted
// contraction does take u as its vector variable (its inputs read u contiguously, or one small one
// transposed: each element 64 points or more).
std::optional<PermutedOutput> permuted_output(const Contraction& c, const ProgramTypes& types, const std::optional<MicroPlan>& plan,
                                              const poly::internal::IslAnalysis& analysis, const Target& target,
                                              std::set<std::string>& names) {
  if (c.init) return std::nullopt;
  const std::vector<poly::VariableBounds>& bounds = analysis.summary.bounds;
  std::map<std::string, int64_t> extent;
  for (const auto& b : bounds) extent[b.name] = b.max - b.min + 1;
  const TensorType& out = types.tensors.at(c.output);
  const int64_t lanes = plan ? plan->lanes : vector_lanes(out.dtype, target);
  // The vector variable's lanes in its range, of those its vectors hold: 7/8 or less (56 columns in
  // vectors of 16); or lanes whose validity follows the reduction. Without a plan (no input reads the
  // output's contiguous variable contiguously: a stride-2 NCHW conv's 2*x + i - 1), any.
  if (plan) {
    const int64_t v_extent = extent[plan->vector];
    if (v_extent * 8 > (v_extent + lanes - 1) / lanes * lanes * 7 && !lanes_follow_reductions(c, analysis, plan->vector))
      return std::nullopt;
  }
  if (elements_of(out) * 16 > box_points(bounds)) return std::nullopt;
  // The candidates, the longest first (the most vectors filled).
  std::vector<size_t> dims;
  for (size_t d = 0; d + 1 < c.output_indices.size(); ++d) {
    const Polynomial& p = c.output_indices[d];
    const auto terms = p.index_terms();
    if (terms.size() == 1 && p == Polynomial::index(terms.begin()->first) && extent[terms.begin()->first] % lanes == 0 &&
        extent[terms.begin()->first] >= 2 * lanes)
      dims.push_back(d);
  }
  auto variable = [&](size_t d) { return c.output_indices[d].index_terms().begin()->first; };
  std::stable_sort(dims.begin(), dims.end(), [&](size_t a, size_t b) { return extent[variable(a)] > extent[variable(b)]; });
  std::string name = c.output + "_L";  // taken from `names` only when a candidate is kept
  while (names.count(name)) name += "_";
  for (size_t d : dims) {
    const std::string u = variable(d);
    auto moved_last = [d](auto v) {
      std::rotate(v.begin() + static_cast<std::ptrdiff_t>(d), v.begin() + static_cast<std::ptrdiff_t>(d) + 1, v.end());
      return v;
    };
    PermutedOutput r;
    r.moved = d;
    r.inner = c;
    r.inner.output = name;
    r.inner.output_indices = moved_last(c.output_indices);
    r.inner.output_shape = moved_last(c.output_shape);
    r.types = types;
    r.types.tensors[r.inner.output] = TensorType{out.dtype, moved_last(out.shape)};
    std::optional<MicroPlan> inner_plan = plan_microkernel(r.inner, r.types, bounds, target, true);
    if (!inner_plan || inner_plan->vector != u) continue;
    // An input read transposed must be small next to the work: weights, not a skinny matmul's A (whose
    // copy would cost as much as the product).
    if (inner_plan->transpose_input >= 0 &&
        elements_of(types.tensors.at(c.inputs[static_cast<size_t>(inner_plan->transpose_input)].tensor)) * 64 > box_points(bounds))
      continue;
    r.plan = *inner_plan;
    names.insert(name);
    r.copy.output = c.output;
    r.copy.aggregation = AggregationOp::assign;
    r.copy.combination = CombinationOp::none;
    TensorAccess source{r.inner.output, {}};
    for (size_t k = 0; k < c.output_indices.size(); ++k) {
      r.copy.output_indices.push_back(Polynomial::index("t" + std::to_string(k)));
      r.copy.output_shape.push_back(c.output_shape[k]);
    }
    source.indices = moved_last(r.copy.output_indices);
    r.copy.inputs.push_back(source);
    return r;
  }
  return std::nullopt;
}

// The statements that compute `c` with the layouts its micro-kernel `plan` wants: the broadcast operand
// transposed (far_broadcast_steps), the vector operand packed into panels or transposed, then `c` reading them.
// `commuted` (when given) gets c's output where its two inputs were swapped (FarSteps::first).
void lay_out(const Contraction& c, const ProgramTypes& types, MicroPlan plan, const std::vector<poly::VariableBounds>& bounds,
             const Target& target, std::set<std::string>& names, std::vector<Statement>& out, std::set<std::string>* commuted) {
  Contraction rewritten = c;
  if (auto far = far_broadcast_steps(c, types, plan, bounds, target)) {
    out.push_back(transposed_copy(rewritten.inputs[static_cast<size_t>(far->input)], far->r, types, names));
    if (far->first) {
      std::swap(rewritten.inputs[0], rewritten.inputs[1]);
      if (plan.transpose_input >= 0) plan.transpose_input = 1 - plan.transpose_input;
      if (commuted) commuted->insert(c.output);
    }
  }
  if (std::optional<Program> packed = pack_vector_operand(rewritten, types, plan, bounds, target, names)) {
    for (const auto& s : packed->statements) out.push_back(s);
    return;
  }
  if (plan.transpose_input >= 0)
    out.push_back(transposed_copy(rewritten.inputs[static_cast<size_t>(plan.transpose_input)], plan.vector, types, names));
  out.push_back(rewritten);
}

// prepare_layouts without the proof; `permuted` (when given) gets each permuted output's tensor, with the
// original output's name and the position of the dim moved last, and `commuted` the outputs of the
// contractions whose two inputs were swapped.
Program lay_out_program(const Program& program, const ProgramTypes& types, const Target& target,
                        std::map<std::string, std::pair<std::string, size_t>>* permuted, std::set<std::string>* commuted) {
  Program out = program;
  out.statements.clear();
  std::set<std::string> names = tensor_names(program);
  const std::set<std::string> program_tensors = names;
  const isl_support::IslContext ctx;
  // The layout copies made so far, by what they compute (the statement with its output's name left out):
  // three products reading the same operand transposed (a transformer's weight gradients of Q, K and V,
  // each reading the layer's normalized input) read one copy.
  std::map<std::string, std::string> made;
  auto share_copies = [&](size_t from) {
    std::map<std::string, std::string> renamed;
    for (size_t k = from; k < out.statements.size();) {
      auto* c = std::get_if<Contraction>(&out.statements[k]);
      if (!c) {
        ++k;
        continue;
      }
      for (TensorAccess& in : c->inputs)
        if (auto it = renamed.find(in.tensor); it != renamed.end()) in.tensor = it->second;
      const bool copy = !program_tensors.count(c->output) && c->aggregation == AggregationOp::assign && c->inputs.size() == 1;
      if (!copy) {
        ++k;
        continue;
      }
      Contraction unnamed = *c;
      unnamed.output.clear();
      const auto [it, fresh] = made.emplace(print(Statement(unnamed)), c->output);
      if (fresh) {
        ++k;
        continue;
      }
      renamed[c->output] = it->second;
      out.statements.erase(out.statements.begin() + static_cast<std::ptrdiff_t>(k));
    }
  };
  // The statements that compute `st` with its micro-kernel's layouts.
  auto lay_out_statement = [&](const Statement& st) {
    const auto* c = std::get_if<Contraction>(&st);
    if (!c) {
      out.statements.push_back(st);
      return;
    }
    const poly::internal::IslAnalysis analysis = poly::internal::analyze(*c, types, ctx.get(), /*accesses=*/false);
    const poly::ContractionAnalysis& a = analysis.summary;
    if (a.empty) {
      out.statements.push_back(st);
      return;
    }
    const std::optional<MicroPlan> plan = plan_microkernel(*c, types, a.bounds, target, true);
    if (std::optional<PermutedOutput> p = permuted_output(*c, types, plan, analysis, target, names)) {
      lay_out(p->inner, p->types, p->plan, a.bounds, target, names, out.statements, commuted);
      out.statements.push_back(p->copy);
      if (permuted) (*permuted)[p->inner.output] = {c->output, p->moved};
      return;
    }
    if (!plan) {
      out.statements.push_back(st);
      return;
    }
    lay_out(*c, types, *plan, a.bounds, target, names, out.statements, commuted);
  };
  for (const auto& st : program.statements) {
    const size_t from = out.statements.size();
    lay_out_statement(st);
    share_copies(from);
  }
  return out;
}

}  // namespace

Program prepare_layouts(const Program& program, const ProgramTypes& types, const Target& target, bool verify) {
  if (verify) {
    std::map<std::string, std::pair<std::string, size_t>> permuted;
    std::set<std::string> commuted;
    Program out = lay_out_program(program, types, target, &permuted, &commuted);
    ProgramTypes after = infer_types(out, [&] {
      std::map<std::string, TensorType> in;
      for (const auto& param : program.inputs) in[param.name] = types.tensors.at(param.name);
      return in;
    }());
    std::map<std::string, const Contraction*> originals, copies;
    for (const auto& st : program.statements)
      if (const auto* c = std::get_if<Contraction>(&st)) originals[c->output] = c;
    for (const auto& st : out.statements)
      if (const auto* c = std::get_if<Contraction>(&st); c && !originals.count(c->output) && !permuted.count(c->output))
        copies[c->output] = c;
    for (const auto& st : out.statements) {
      const auto* c = std::get_if<Contraction>(&st);
      if (!c) continue;
      // A permuted output's contraction is proven as it would write the output itself (its dim moved back);
      // the assign that writes the output from it moves every element back to where it was taken from.
      // A product whose two inputs were swapped is proven with them in their order again (x y = y x).
      Contraction unpermuted, unswapped;
      if (commuted.count(c->output)) {
        unswapped = *c;
        std::swap(unswapped.inputs[0], unswapped.inputs[1]);
        c = &unswapped;
      }
      if (auto it = permuted.find(c->output); it != permuted.end()) {
        const auto [name, moved] = it->second;
        auto moved_back = [moved = moved](auto v) {
          std::rotate(v.begin() + static_cast<std::ptrdiff_t>(moved), v.end() - 1, v.end());
          return v;
        };
        unpermuted = *c;
        unpermuted.output = name;
        unpermuted.output_indices = moved_back(c->output_indices);
        unpermuted.output_shape = moved_back(c->output_shape);
        c = &unpermuted;
      } else if (!originals.count(c->output) || (c->inputs.size() == 1 && permuted.count(c->inputs[0].tensor))) {
        continue;
      }
      const Contraction& before = *originals.at(c->output);
      poly::RewriteContext rc;
      rc.types = &after;
      rc.copies = copies;
      // The old variables in terms of the new: packing splits v into v_blk, v_lane (v = VL*v_blk + v_lane).
      poly::Substitution sub;
      sub.old_variables = before.index_variables();
      std::vector<std::string> now = c->index_variables();
      for (const auto& v : sub.old_variables) {
        if (std::find(now.begin(), now.end(), v) != now.end()) {
          sub.values.push_back(Polynomial::index(v));
          continue;
        }
        // The split variable: recover VL from the packed tensor's last dim.
        std::string blk, lane;
        for (const auto& n : now) {
          if (n.rfind(v + "_blk", 0) == 0) blk = n;
          if (n.rfind(v + "_lane", 0) == 0) lane = n;
        }
        POLYTILE_CHECK(!blk.empty() && !lane.empty(), "layouts: variable ", v, " of ", c->output, " disappeared");
        int64_t vl = 0;
        for (const auto& a : c->inputs)
          if (copies.count(a.tensor) && !a.indices.empty() && a.indices.back() == Polynomial::index(lane))
            vl = after.tensors.at(a.tensor).shape.back();
        POLYTILE_CHECK(vl > 0, "layouts: no panel of ", c->output, " is read along ", lane);
        sub.values.push_back(Polynomial::index(blk) * Rational(vl) + Polynomial::index(lane));
      }
      poly::verify_rewrite("layouts", before, *c, rc, sub);
    }
    return out;
  }
  return lay_out_program(program, types, target, nullptr, nullptr);
}

}  // namespace polytile::sched
