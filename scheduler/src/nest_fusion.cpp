// Nest fusion decisions (nest_fusion.h).
#include "nest_fusion.h"

#include <algorithm>
#include <vector>

namespace polytile::sched::internal {

bool cheap(const Expr& e) {
  int nodes = 0;
  bool ok = true;
  std::vector<Expr> stack{e};
  while (!stack.empty()) {
    Expr x = stack.back();
    stack.pop_back();
    if (x.kind() != Expr::Kind::call || x.intrinsic() != Intrinsic::cast) ++nodes;
    if (x.kind() == Expr::Kind::call) {
      Intrinsic f = x.intrinsic();
      ok &= f == Intrinsic::relu || f == Intrinsic::max || f == Intrinsic::min || f == Intrinsic::abs ||
            f == Intrinsic::select || f == Intrinsic::cast || f == Intrinsic::ident || f == Intrinsic::sign;
    }
    for (const auto& a : x.args()) stack.push_back(a);
  }
  return ok && nodes <= 12;
}

bool divides_each_element(const Expr& e, const ProgramTypes& types, const std::vector<int64_t>& shape) {
  std::vector<Expr> stack{e};
  while (!stack.empty()) {
    Expr x = stack.back();
    stack.pop_back();
    if (x.kind() == Expr::Kind::binary && (x.binary_op() == BinaryOp::div || x.binary_op() == BinaryOp::mod)) {
      std::vector<std::string> leaves;
      x.collect_tensors(leaves);
      if (std::any_of(leaves.begin(), leaves.end(), [&](const std::string& t) { return types.tensors.at(t).shape == shape; })) return true;
    }
    for (const auto& a : x.args()) stack.push_back(a);
  }
  return false;
}

NestFusion plan_nest_fusion(const Program& program, const ProgramTypes& types) {
  NestFusion out;
  const auto& statements = program.statements;
  std::map<std::string, size_t> produced;           // tensor -> statement
  std::map<std::string, std::set<size_t>> readers;  // tensor -> statements reading it
  std::map<std::string, int> reads;                 // tensor -> reads, with repetition
  for (size_t i = 0; i < statements.size(); ++i) {
    produced[statement_output(statements[i])] = i;
    for (const auto& t : statement_operands(statements[i])) {
      readers[t].insert(i);
      ++reads[t];
    }
  }
  const std::set<std::string> outputs(program.outputs.begin(), program.outputs.end());
  std::set<size_t> consumers;
  for (size_t i = 0; i < statements.size(); ++i) {
    const auto* e = std::get_if<Elementwise>(&statements[i]);
    if (!e) continue;
    std::vector<std::string> leaves;
    e->expr.collect_tensors(leaves);
    for (const auto& o : leaves) {
      auto p = produced.find(o);
      if (p == produced.end() || p->second >= i || !std::holds_alternative<Contraction>(statements[p->second])) continue;
      if (outputs.count(o) || reads[o] != 1 || types.tensors.at(o).shape != types.tensors.at(e->output).shape) continue;
      bool ready = std::all_of(leaves.begin(), leaves.end(), [&](const std::string& l) {
        auto q = produced.find(l);
        return l == o || q == produced.end() || q->second < p->second;
      });
      if (ready && !out.epilogue_of.count(p->second)) {
        out.epilogue_of[p->second] = i;
        consumers.insert(i);
      }
      break;
    }
  }
  for (size_t i = 0; i < statements.size(); ++i) {
    const auto* c = std::get_if<Contraction>(&statements[i]);
    if (!c || c->aggregation != AggregationOp::assign || c->combination != CombinationOp::none || c->inputs.size() != 1 ||
        c->init || !c->constraints.empty())
      continue;
    const std::string& x = c->inputs[0].tensor;
    auto p = produced.find(x);
    if (p == produced.end() || p->second >= i || !std::holds_alternative<Contraction>(statements[p->second]) ||
        outputs.count(x) || reads[x] != 1 || out.epilogue_of.count(p->second) || out.permuted_copy_of.count(p->second))
      continue;
    const TensorType &from = types.tensors.at(x), &to = types.tensors.at(c->output);
    if (from.dtype != to.dtype || (from.dtype != DType::f32 && from.dtype != DType::f64) || from.shape.size() != to.shape.size() ||
        c->output_indices.size() != to.shape.size() || c->inputs[0].indices.size() != from.shape.size())
      continue;
    // Each output index one variable of its own, the input's indices those variables in some order, dims alike.
    std::map<std::string, size_t> dim_of;
    for (size_t q = 0; q < c->output_indices.size(); ++q)
      if (auto v = c->output_indices[q].variable()) dim_of.emplace(*v, q);
    bool permutation = dim_of.size() == to.shape.size();
    std::set<size_t> seen;
    for (size_t d = 0; permutation && d < from.shape.size(); ++d) {
      auto v = c->inputs[0].indices[d].variable();
      auto q = v ? dim_of.find(*v) : dim_of.end();
      permutation = q != dim_of.end() && seen.insert(q->second).second && to.shape[q->second] == from.shape[d];
    }
    if (permutation) out.permuted_copy_of[p->second] = i;
  }
  for (size_t i = 0; i < statements.size(); ++i) {
    const auto* c = std::get_if<Contraction>(&statements[i]);
    if (!c) continue;
    for (const auto& a : c->inputs) {
      auto p = produced.find(a.tensor);
      if (p == produced.end() || !std::holds_alternative<Elementwise>(statements[p->second]) || consumers.count(p->second) ||
          outputs.count(a.tensor) || readers[a.tensor] != std::set<size_t>{i} || (c->init && *c->init == a.tensor) ||
          !cheap(std::get<Elementwise>(statements[p->second]).expr))
        continue;
      // Not into a product's operand, where a micro-kernel may broadcast it, a division per element; a
      // copy (a transposition) computes it in vectors as its own nest would.
      if (c->combination == CombinationOp::mul &&
          divides_each_element(std::get<Elementwise>(statements[p->second]).expr, types, types.tensors.at(a.tensor).shape))
        continue;
      out.inlined_into[i][a.tensor] = p->second;
      out.inlined.insert(p->second);
    }
  }
  return out;
}

}  // namespace polytile::sched::internal
