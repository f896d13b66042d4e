// Micro-kernel planning and the layout pass (see plan.h and scheduler.h).
#include "plan.h"

#include <algorithm>
#include <map>
#include <set>

namespace polytile::sched {
namespace {

bool integral(const Polynomial& p) {
  if (p.constant().den() != 1) return false;
  return std::all_of(p.index_terms().begin(), p.index_terms().end(), [](const auto& t) { return t.second.den() == 1; });
}

bool uses(const std::vector<Polynomial>& idx, const std::string& v) {
  return std::any_of(idx.begin(), idx.end(), [&v](const Polynomial& p) { return p.coefficient(v) != Rational(0); });
}

// v only in the last index, with coefficient 1: consecutive v read consecutive elements.
bool contiguous_in(const std::vector<Polynomial>& idx, const std::string& v) {
  if (idx.empty() || idx.back().coefficient(v) != Rational(1)) return false;
  for (size_t k = 0; k + 1 < idx.size(); ++k)
    if (idx[k].coefficient(v) != Rational(0)) return false;
  return true;
}

// Every index is a distinct variable with coefficient 1 and no constant: a transposed copy is a
// permutation of the dims.
bool plain_variables(const std::vector<Polynomial>& idx) {
  std::set<std::string> seen;
  for (const auto& p : idx) {
    if (p.constant() != Rational(0) || p.index_terms().size() != 1) return false;
    const auto& [v, c] = *p.index_terms().begin();
    if (c != Rational(1) || !seen.insert(v).second) return false;
  }
  return true;
}

std::vector<Polynomial> bound(const std::vector<Polynomial>& idx, const std::map<std::string, int64_t>& dims) {
  std::vector<Polynomial> out;
  for (const auto& p : idx) out.push_back(p.bind_dims(dims));
  return out;
}

}  // namespace

std::optional<MicroPlan> plan_microkernel(const Contraction& c, const ProgramTypes& types,
                                          const std::vector<poly::VariableBounds>& bounds, const Target& target,
                                          bool allow_transpose) {
  if (c.aggregation != AggregationOp::sum || c.combination != CombinationOp::mul || c.inputs.size() != 2) return std::nullopt;
  const DType t = types.tensors.at(c.output).dtype;
  if (!is_float(t)) return std::nullopt;
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
  int64_t points = 1;
  for (const auto& b : bounds) {
    extent[b.name] = b.max - b.min + 1;
    points = points > (int64_t{1} << 50) / extent[b.name] ? points : points * extent[b.name];
  }
  std::vector<std::string> vars = c.index_variables();
  std::vector<std::string> outputs, reductions;
  for (const auto& v : vars) (uses(out, v) ? outputs : reductions).push_back(v);
  if (reductions.empty() || outputs.size() < 2) return std::nullopt;

  const int64_t element_bytes = t == DType::f64 ? 8 : 4;
  MicroPlan plan;
  plan.lanes = static_cast<int>(std::max<int64_t>(1, target.vector_bits / (8 * element_bytes)));
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
      if (allow_transpose && transpose < 0 && plain_variables(in[k]) && elements * 16 <= points) {
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
  plan.chunks = static_cast<int>(std::clamp<int64_t>((extent[plan.vector] + lanes - 1) / lanes, 1, 4));
  const int max_rows = std::clamp((target.vector_registers - 1 - plan.chunks) / plan.chunks, 1, 14);
  // The block variable: rows should read distinct broadcast values and share the vector operand; among
  // equals the one whose blocks waste the fewest rows, then the later (more contiguous) variable.
  double best = -1;
  for (const auto& b : outputs) {
    if (b == plan.vector) continue;
    int score = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      bool is_vector = uses(in[k], plan.vector) || static_cast<int>(k) == plan.transpose_input;
      if (!is_vector && uses(in[k], b)) score += 2;
      if (is_vector && !uses(in[k], b)) score += 1;
    }
    int64_t e = extent[b];
    int64_t rows = std::min<int64_t>(max_rows, e);
    double used = static_cast<double>(e) / static_cast<double>(rows * ((e + rows - 1) / rows));
    double key = score + 0.9 * used * static_cast<double>(rows) / max_rows;
    if (key >= best) {
      best = key;
      plan.block = b;
      plan.rows = static_cast<int>(rows);
    }
  }
  return plan;
}

Program prepare_layouts(const Program& program, const ProgramTypes& types, const Target& target) {
  Program out = program;
  out.statements.clear();
  std::set<std::string> names;
  for (const auto& in : program.inputs) names.insert(in.name);
  for (const auto& st : program.statements) names.insert(statement_output(st));
  for (const auto& st : program.statements) {
    const auto* c = std::get_if<Contraction>(&st);
    std::optional<MicroPlan> plan;
    if (c) {
      poly::ContractionAnalysis a = poly::analyze(*c, types);
      if (!a.empty) plan = plan_microkernel(*c, types, a.bounds, target, true);
    }
    if (!plan || plan->transpose_input < 0) {
      out.statements.push_back(st);
      continue;
    }
    Contraction rewritten = *c;
    TensorAccess& access = rewritten.inputs[static_cast<size_t>(plan->transpose_input)];
    const TensorType& type = types.tensors.at(access.tensor);
    // The copy's dims: the source's, with the vector variable's dim moved last.
    std::vector<size_t> order;
    size_t vdim = 0;
    for (size_t k = 0; k < access.indices.size(); ++k) {
      if (access.indices[k].coefficient(plan->vector) != Rational(0)) vdim = k;
      else order.push_back(k);
    }
    order.push_back(vdim);
    std::string name = access.tensor + "_T";
    while (names.count(name)) name += "_";
    names.insert(name);
    Contraction copy;
    copy.output = name;
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
    access.tensor = name;
    access.indices = permuted;
    out.statements.push_back(copy);
    out.statements.push_back(rewritten);
  }
  return out;
}

}  // namespace polytile::sched
