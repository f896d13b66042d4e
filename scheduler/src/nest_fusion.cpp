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
    if (!c) continue;
    for (const auto& a : c->inputs) {
      auto p = produced.find(a.tensor);
      if (p == produced.end() || !std::holds_alternative<Elementwise>(statements[p->second]) || consumers.count(p->second) ||
          outputs.count(a.tensor) || readers[a.tensor] != std::set<size_t>{i} || (c->init && *c->init == a.tensor) ||
          !cheap(std::get<Elementwise>(statements[p->second]).expr))
        continue;
      out.inlined_into[i][a.tensor] = p->second;
      out.inlined.insert(p->second);
    }
  }
  return out;
}

}  // namespace polytile::sched::internal
