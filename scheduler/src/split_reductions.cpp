// Split reductions (scheduler.h): a GPU kernel gets its parallelism from output elements, so a sum with few
// of them and long reductions (a convolution's weight gradient: 3x3x64x64 outputs, 100 000 points each)
// leaves most of the GPU idle; on the CPU a sum with a few outputs (a bias gradient's 32 channels, the
// vectorized inner loop) and long reductions runs on one thread. Such a sum becomes partial sums over S slices of L consecutive values of
// its longest reduction variable, r = L*s + q with 0 <= q < L, the slice s a new leading output index of
// a scratch tensor, and the sum of the slices (r from its least value m: r = m + L*s + q):
//   O_slices[s, o... : S, shape...] = +(A[... L*s + q ...] * B[...]), q < L;   O[o...] = +(O_slices[s, o...]) (default D)
// The slices run as blocks of their own; every slice with no point for an element leaves its partial sum
// at 0, which the second sum adds exactly. On the CPU a column maximum or minimum is split the same way
// (the slices' maximum or minimum into O) where every slice holds a point for every output element.
#include <algorithm>
#include <set>
#include <utility>

#include "plan.h"
#include "polytile/error.h"
#include "polytile/isl_analysis.h"
#include "polytile/polyhedral.h"
#include "polytile/scheduler.h"
#include "polytile/verify.h"

namespace polytile::sched {
namespace {

struct Split {
  std::string variable;
  int64_t least = 0;               // the variable's least value
  int64_t slices = 1, length = 1;  // S slices of L consecutive values
};

// A sum that could be split: its output elements, its longest reduction variable (the one to slice) and
// the reduction points per output element (the product of the reduction variables' extents).
struct Candidate {
  Split split;
  int64_t outputs = 1, reduction = 1, widest = 0;
  std::vector<poly::VariableBounds> bounds;  // every variable's
  std::vector<size_t> reductions;            // the reduction variables, indices into bounds
};

// A sum (or, with `extrema`, a maximum or minimum) with more than `max_outputs` output elements is none:
// that is decided before the isl analysis.
std::optional<Candidate> candidate(const Contraction& c, const ProgramTypes& types, int64_t max_outputs, bool extrema = false) {
  const bool extremum = c.aggregation == AggregationOp::max || c.aggregation == AggregationOp::min;
  if (c.aggregation != AggregationOp::sum && !(extrema && extremum)) return std::nullopt;
  // Outputs indexed by plain variables or constants (a weight gradient, a matmul, a total S[0 : 1]): the
  // slices' kernels stay as simple for isl as the original. (A defracted data gradient's lattice of
  // outputs, with the slice linearized in, costs isl seconds; it has many outputs anyway.)
  for (const auto& p : c.output_indices)
    if (!p.variable() && !p.is_constant()) return std::nullopt;
  Candidate k;
  for (int64_t d : types.tensors.at(c.output).shape) k.outputs *= d;
  if (k.outputs == 0 || k.outputs > max_outputs) return std::nullopt;
  const poly::ContractionAnalysis a = poly::internal::bounds_of(c, types);
  if (a.empty) return std::nullopt;
  std::set<std::string> in_output;
  for (const auto& p : c.output_indices)
    for (const auto& [v, coeff] : p.index_terms()) in_output.insert(v);
  k.bounds = a.bounds;
  for (size_t v = 0; v < a.bounds.size(); ++v) {
    const poly::VariableBounds& b = a.bounds[v];
    if (in_output.count(b.name)) continue;
    k.reductions.push_back(v);
    const int64_t extent = b.max - b.min + 1;
    k.reduction *= extent;
    if (extent > k.widest) {
      k.widest = extent;
      k.split = Split{b.name, b.min};
    }
  }
  if (k.widest < 2) return std::nullopt;
  return k;
}

// Slices of equal length of the candidate's widest variable, at most `slices` of them.
std::optional<Split> sliced(Candidate k, int64_t slices) {
  slices = std::min(slices, k.widest);
  if (slices < 2) return std::nullopt;
  k.split.length = (k.widest + slices - 1) / slices;
  k.split.slices = (k.widest + k.split.length - 1) / k.split.length;
  if (k.split.slices < 2) return std::nullopt;
  return k.split;
}

// The split worth making on a GPU, if any: the model's minimum of blocks not reached by the outputs alone,
// and enough reduction points per output element left in each slice.
std::optional<Split> plan_split(const Contraction& c, const ProgramTypes& types, const GpuModel& gpu) {
  if (gpu.min_blocks <= 1) return std::nullopt;
  // Outputs filling fewer than min_blocks blocks: at most (min_blocks - 1) blocks' worth.
  const int64_t per_block = int64_t{gpu.threads_per_block} * gpu.tile_rows * gpu.tile_cols;
  std::optional<Candidate> k = candidate(c, types, (gpu.min_blocks - 1) * per_block);
  if (!k) return std::nullopt;
  const int64_t blocks = std::max<int64_t>(1, (k->outputs + per_block - 1) / per_block);
  // As many slices as the blocks wanted, each with at least min_slice points.
  const int64_t slices = std::min((gpu.min_blocks + blocks - 1) / blocks, std::max<int64_t>(1, k->reduction / std::max<int64_t>(1, gpu.min_slice)));
  std::optional<Split> s = sliced(*k, slices);
  const int64_t bytes = static_cast<int64_t>(dtype_bytes(types.tensors.at(c.output).dtype));
  if (!s || s->slices * k->outputs * bytes > gpu.max_split_bytes) return std::nullopt;
  return s;
}

// Whether a reduction's threads, splitting its outputs, would each read a part of every line of an input: a
// column sum S[j] = +(X[i, j]) of a 8192x2048 matrix gives each of two threads 1024 columns, 4 KiB of
// every 8 KiB row, and the prefetchers, which stop at page boundaries, start cold on every page (on a
// 2-core Cascade Lake, 23 GB/s in the bench; 59 GB/s split into slices of rows). Such a sum is split when
// its output has one variable index, the last index of an input (the threads would split lines), its widest
// reduction variable is in no input's last index (the slices then split along rows, not within them),
// every slice's partial sums fit in half of L1 together, and each output sums at least
// CpuModel::split_line_min_points points (the slices' sum is then a small part of the work).
bool splits_lines(const Contraction& c, const Candidate& k, int64_t element_bytes, const Target& target) {
  if (k.reduction < target.cpu.split_line_min_points) return false;
  if (int64_t{target.threads} * k.outputs * element_bytes > target.cpu.l1_bytes / 2) return false;
  // The output's one variable (the others constants): the threads split it, the last index of an input.
  std::optional<std::string> last;
  for (const auto& p : c.output_indices) {
    if (p.is_constant()) continue;
    if (last) return false;
    last = p.variable();
  }
  if (!last) return false;
  bool output_lines = false;
  for (const auto& a : c.inputs) {
    if (a.indices.empty()) continue;
    if (!a.indices.back().coefficient(k.split.variable).is_zero()) return false;
    if (!a.indices.back().coefficient(*last).is_zero()) output_lines = true;
  }
  return output_lines;
}

// Whether every slice of a maximum or minimum holds a point for every output element. A slice with no
// point for an element leaves its partial result at 0, which the slices' sum adds exactly but their
// maximum does not ignore; and an element with no point at all must keep its default (or 0), which the
// maximum of the slices' zeros would not. So: no constraints, every index a plain variable or a constant
// (the domain is then the box of the variables' ranges, each the intersection of the dims it indexes),
// and the output's variables range over its whole shape, its constants over dims of 1.
bool every_slice_covers_the_output(const Contraction& c, const Candidate& k, const ProgramTypes& types) {
  if (!c.constraints.empty()) return false;
  for (const auto& a : c.inputs)
    for (const auto& p : a.indices)
      if (!p.variable() && !p.is_constant()) return false;
  const std::vector<int64_t>& shape = types.tensors.at(c.output).shape;
  for (size_t d = 0; d < c.output_indices.size(); ++d) {
    const std::optional<std::string> v = c.output_indices[d].variable();
    if (!v) {
      if (shape[d] != 1) return false;
      continue;
    }
    auto b = std::find_if(k.bounds.begin(), k.bounds.end(), [&](const poly::VariableBounds& x) { return x.name == *v; });
    if (b == k.bounds.end() || b->min != 0 || b->max != shape[d] - 1) return false;
  }
  return true;
}

// The split worth making on the CPU, if any: one slice per thread
// - of a sum with few outputs and long reductions (CpuModel::split_max_outputs, split_min_points);
// - of a weight gradient that runs as a weight-mode micro-kernel (plan.h's weight_mode) and still would
//   with one output per thread: its blocks would otherwise be split across the threads, each reading all
//   of the vector operand, and 11 blocks of 64 channels go 6 + 5. The slices then divide the reduction
//   variable that the threads share most evenly (the widest of those), each thread reads its part of both
//   operands, and the blocks of a slice split evenly; or else
// - of a sum, maximum or minimum whose threads would otherwise each read a part of every line
//   (splits_lines; a maximum or minimum where every slice covers the output).
std::optional<Split> plan_split(const Contraction& c, const ProgramTypes& types, const Target& target) {
  if (target.threads < 2) return std::nullopt;
  const DType t = types.tensors.at(c.output).dtype;
  const int64_t element_bytes = static_cast<int64_t>(dtype_bytes(t));
  const int64_t weight_outputs = weight_share_max_bytes(target) / element_bytes;  // a thread's copy (weight_split)
  std::optional<Candidate> k = candidate(c, types, std::max(target.cpu.split_max_outputs, weight_outputs), true);
  if (!k) return std::nullopt;
  if (c.aggregation != AggregationOp::sum)
    return every_slice_covers_the_output(c, *k, types) && splits_lines(c, *k, element_bytes, target) ? sliced(*k, target.threads) : std::nullopt;
  if (k->outputs <= target.cpu.split_max_outputs && k->reduction >= target.cpu.split_min_points) return sliced(*k, target.threads);
  if (!weight_split(k->outputs * element_bytes, k->reduction, target) ||
      box_points(k->bounds) < target.cpu.microkernel_min_points || !plan_microkernel(c, types, k->bounds, target, false))
    return splits_lines(c, *k, element_bytes, target) ? sliced(*k, target.threads) : std::nullopt;
  // The fewest idle values, then the most values.
  auto rank = [&target](const poly::VariableBounds& b) {
    const int64_t extent = b.max - b.min + 1;
    return std::pair{idle_values(extent, target.threads), -extent};
  };
  const poly::VariableBounds* best = &k->bounds[k->reductions.front()];
  for (size_t v : k->reductions)
    if (rank(k->bounds[v]) < rank(*best)) best = &k->bounds[v];
  k->split = Split{best->name, best->min};
  k->widest = best->max - best->min + 1;
  return sliced(*k, target.threads);
}

struct SplitContraction {
  Contraction partial, total;
  // The partial sums written straight into the output (no slice index, 0 <= s < S a constraint): the
  // original's points under the change of variables r = m + L*s + q, for the proof.
  Contraction flattened;
  poly::Substitution substitution;
};

SplitContraction split(const Contraction& c, const Split& plan, std::set<std::string>& tensors) {
  std::vector<std::string> vars = c.index_variables();
  std::set<std::string> taken(vars.begin(), vars.end());
  const std::string s = fresh_name(plan.variable + "_slice", taken), q = fresh_name(plan.variable + "_step", taken);
  const Polynomial value = Polynomial::index(s) * Rational(plan.length) + Polynomial::index(q) + Rational(plan.least);
  auto substitute = [&](const Polynomial& p) { return p + (value - Polynomial::index(plan.variable)) * p.coefficient(plan.variable); };
  SplitContraction out;
  Contraction& flat = out.flattened;
  flat = c;
  flat.init.reset();
  for (auto& p : flat.output_indices) p = substitute(p);
  for (auto& a : flat.inputs)
    for (auto& p : a.indices) p = substitute(p);
  for (auto& k : flat.constraints) k.poly = substitute(k.poly);
  flat.constraints.push_back({Polynomial::index(q), DimExpr(plan.length)});
  out.partial = flat;
  flat.constraints.push_back({Polynomial::index(s), DimExpr(plan.slices)});
  out.partial.output = fresh_name(c.output + "_slices", tensors);
  out.partial.output_indices.insert(out.partial.output_indices.begin(), Polynomial::index(s));
  out.partial.output_shape.insert(out.partial.output_shape.begin(), DimExpr(plan.slices));
  // O[o...] = +(O_slices[s, o...]) over the output's own indices (> or < for a maximum or minimum).
  Contraction& total = out.total;
  total.output = c.output;
  total.aggregation = c.aggregation;
  total.combination = CombinationOp::none;
  total.output_shape = c.output_shape;
  total.init = c.init;
  TensorAccess slices{out.partial.output, {Polynomial::index("s")}};
  for (size_t k = 0; k < c.output_shape.size(); ++k) {
    const Polynomial o = Polynomial::index("o" + std::to_string(k));
    total.output_indices.push_back(o);
    slices.indices.push_back(o);
  }
  total.inputs.push_back(slices);
  out.substitution.old_variables = vars;
  for (const auto& v : vars) out.substitution.values.push_back(v == plan.variable ? value : Polynomial::index(v));
  return out;
}

}  // namespace

Program split_reductions(const Program& program, const ProgramTypes& types, const Target& target, bool verify) {
  Program out = program;
  out.statements.clear();
  std::set<std::string> tensors = tensor_names(program);
  for (const auto& st : program.statements) {
    const auto* c = std::get_if<Contraction>(&st);
    std::optional<Split> plan;
    if (c) plan = target.gpu ? plan_split(*c, types, *target.gpu) : plan_split(*c, types, target);
    if (!plan) {
      out.statements.push_back(st);
      continue;
    }
    SplitContraction parts = split(*c, *plan, tensors);
    if (verify) {  // the slices hold the original's points, each once, reading the same elements
      Contraction before = *c;
      before.init.reset();
      poly::RewriteContext rc;
      rc.types = &types;
      poly::verify_rewrite("split reductions", before, parts.flattened, rc, parts.substitution);
    }
    out.statements.push_back(parts.partial);
    out.statements.push_back(parts.total);
  }
  return out;
}

}  // namespace polytile::sched
