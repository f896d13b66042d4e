// Single-term contractions as elementwise broadcasts (lower.h): a pass before fusion, so that what it
// frees fuses into one nest with its readers.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "polytile/error.h"
#include "polytile/isl_analysis.h"
#include "polytile/lower.h"
#include "polytile/polyhedral.h"
#include "polytile/shapes.h"

namespace polytile::sched {
namespace {

// Whether `access` reads, at the output element with variables `out_vars` (one per output dim), the input
// element numpy broadcasting of the input to the output's shape would give: right-aligned, every input
// index is the output variable of its aligned dim (and the dims have the same size) or 0 on a dim of size 1.
bool is_broadcast_read(const TensorAccess& access, const std::vector<std::string>& out_vars,
                       const std::vector<int64_t>& out_shape, const ProgramTypes& types) {
  const std::vector<int64_t>& in_shape = types.tensors.at(access.tensor).shape;
  if (in_shape.size() > out_vars.size()) return false;
  const size_t offset = out_vars.size() - in_shape.size();
  for (size_t k = 0; k < in_shape.size(); ++k) {
    Polynomial index = access.indices[k].bind_dims(types.dims);
    if (index.is_constant() && index.constant() == Rational(0) && in_shape[k] == 1) continue;
    std::optional<std::string> v = index.variable();
    if (!v || *v != out_vars[offset + k] || in_shape[k] != out_shape[offset + k]) return false;
  }
  return true;
}

// The elementwise expression equal, element for element, to `c` when every output element gets exactly
// one term: the term, aggregated with the aggregation's identity exactly as the contraction does (a sum
// adds it to 0, which turns -0 into +0); for a conditional term, the value where the condition holds and
// 0 (an unwritten element) elsewhere. A product or sum of two reads (autodiff's adjoint of D * D broadcast
// along a row: D[n, c] * DQ[n, 0]) is that operation on operands of the output's dtype, which is where the
// contraction computes it.
std::optional<Expr> as_broadcast(const Contraction& c, const ProgramTypes& types) {
  if (c.init || !c.constraints.empty()) return std::nullopt;
  const bool arithmetic = c.combination == CombinationOp::mul || c.combination == CombinationOp::add;
  if (c.combination != CombinationOp::none && c.combination != CombinationOp::cond && !arithmetic) return std::nullopt;
  if (c.combination == CombinationOp::cond && c.aggregation != AggregationOp::sum) return std::nullopt;
  const TensorType& out = types.tensors.at(c.output);
  std::vector<std::string> out_vars;
  std::set<std::string> distinct;
  for (const auto& p : c.output_indices) {
    std::optional<std::string> v = p.bind_dims(types.dims).variable();
    if (!v || !distinct.insert(*v).second) return std::nullopt;
    out_vars.push_back(*v);
  }
  for (const auto& a : c.inputs)
    if (!is_broadcast_read(a, out_vars, out.shape, types)) return std::nullopt;
  // The value read has the output's dtype (a sum of bools is an i32 count); compared operands share one.
  if (types.tensors.at(c.inputs.back().tensor).dtype != out.dtype) return std::nullopt;
  if (c.combination == CombinationOp::cond &&
      types.tensors.at(c.inputs[0].tensor).dtype != types.tensors.at(c.inputs[1].tensor).dtype)
    return std::nullopt;
  if (arithmetic && types.tensors.at(c.inputs[0].tensor).dtype != out.dtype) return std::nullopt;
  Expr term = Expr::tensor(c.inputs.back().tensor);
  if (arithmetic)
    term = Expr::binary(c.combination == CombinationOp::mul ? BinaryOp::mul : BinaryOp::add, Expr::tensor(c.inputs[0].tensor), term);
  if (c.aggregation == AggregationOp::sum) term = Expr::binary(BinaryOp::add, term, Expr::literal(0, true));
  if (c.combination != CombinationOp::cond) return term;
  Expr hit = Expr::binary(BinaryOp::eq, Expr::tensor(c.inputs[0].tensor), Expr::tensor(c.inputs[1].tensor));
  return Expr::call(Intrinsic::select, {hit, term, Expr::literal(0, true)});
}

// The proof, at the program's sizes, that every element of `c`'s output gets exactly one term: isl finds
// each index variable ranging over its whole output dim (every element written) and the write injective.
void verify_single_terms(const Contraction& c, const ProgramTypes& types) {
  poly::ContractionAnalysis a = poly::internal::bounds_of(c, types);
  const std::vector<int64_t>& shape = types.tensors.at(c.output).shape;
  bool covers = !a.empty && a.bounds.size() == shape.size();
  for (size_t k = 0; covers && k < shape.size(); ++k) {
    std::optional<std::string> v = c.output_indices[k].bind_dims(types.dims).variable();
    for (const auto& b : a.bounds)
      if (v && b.name == *v) covers = covers && b.min == 0 && b.max == shape[k] - 1;
  }
  if (!covers || !poly::writes_each_output_once(c, types))
    throw InternalError("broadcast lowering: contraction " + c.output + " does not give every element exactly one term");
}

}  // namespace

Program broadcasts_to_elementwise(const Program& program, const ProgramTypes& types, bool verify) {
  const std::set<std::string> outputs(program.outputs.begin(), program.outputs.end());
  // Candidates: single-term broadcasts, no program output, read only by elementwise statements.
  std::map<std::string, bool> elementwise_readers_only;
  for (const auto& st : program.statements)
    for (const auto& t : statement_operands(st)) {
      auto [it, fresh] = elementwise_readers_only.emplace(t, std::holds_alternative<Elementwise>(st));
      if (!fresh) it->second = it->second && std::holds_alternative<Elementwise>(st);
    }
  std::map<std::string, Expr> broadcast;  // contraction output -> its expression
  for (const auto& st : program.statements) {
    const auto* c = std::get_if<Contraction>(&st);
    auto readers = c ? elementwise_readers_only.find(c->output) : elementwise_readers_only.end();
    if (!c || outputs.count(c->output) || readers == elementwise_readers_only.end() || !readers->second) continue;
    if (std::optional<Expr> e = as_broadcast(*c, types)) {
      broadcast.emplace(c->output, *e);
    }
  }
  // A reader with the contractions replaced by what they broadcast; the cast keeps the contraction's
  // dtype, as fusion does.
  auto substituted = [&](const Expr& expr) {
    return expr.replace_leaves([&](const Expr& leaf) -> std::optional<Expr> {
      auto b = leaf.kind() == Expr::Kind::tensor ? broadcast.find(leaf.name()) : broadcast.end();
      if (b == broadcast.end()) return std::nullopt;
      return Expr::call(Intrinsic::cast, {b->second}, types.tensors.at(leaf.name()).dtype);
    });
  };
  // A reader must keep its shape (the contraction may be what gave it its shape): the contractions read
  // by a reader that would not keep it stay.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& st : program.statements) {
      const auto* e = std::get_if<Elementwise>(&st);
      if (!e || expr_shape(substituted(e->expr), types.tensors, "broadcast lowering") == types.tensors.at(e->output).shape)
        continue;
      std::vector<std::string> read;
      e->expr.collect_tensors(read);
      for (const auto& t : read) changed = broadcast.erase(t) > 0 || changed;
    }
  }
  Program out = program;
  out.statements.clear();
  for (const auto& st : program.statements) {
    if (const auto* c = std::get_if<Contraction>(&st); c && broadcast.count(c->output)) {
      if (verify) verify_single_terms(*c, types);
      continue;
    }
    const auto* e = std::get_if<Elementwise>(&st);
    out.statements.push_back(e ? Statement(Elementwise{e->output, substituted(e->expr)}) : st);
  }
  return out;
}

}  // namespace polytile::sched
