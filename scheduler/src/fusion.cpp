// Elementwise fusion and its translation validation (scheduler.h): a program pass before scheduling.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "polytile/error.h"
#include "polytile/scheduler.h"
#include "nest_fusion.h"

namespace polytile::sched {

namespace {

size_t expression_nodes(const Expr& e) {
  size_t n = 0;
  std::vector<Expr> stack{e};
  while (!stack.empty()) {
    Expr x = stack.back();
    stack.pop_back();
    ++n;
    for (const auto& a : x.args()) stack.push_back(a);
  }
  return n;
}

// Cheap to compute again in each of a few readers (internal::cheap, and no division per element), with at
// most one leaf of the producer's full shape (the others are broadcasts: row vectors, scalars), so that
// each copy reads about what reading the producer's output back would have cost.
bool duplicable(const Elementwise& e, const ProgramTypes& types) {
  const auto& shape = types.tensors.at(e.output).shape;
  if (!internal::cheap(e.expr) || internal::divides_each_element(e.expr, types, shape)) return false;
  std::vector<std::string> leaves;
  e.expr.collect_tensors(leaves);
  return std::count_if(leaves.begin(), leaves.end(), [&](const std::string& t) { return types.tensors.at(t).shape == shape; }) <= 1;
}

}  // namespace

// One pass in program order: a producer's operands were decided before it. Substituting a producer moves
// its reads into its readers (into several, for a duplicable one, which reads its operands more often);
// every operand comes before the producer and was decided already, so the reader counts of the original
// program are right for every statement still to decide. A fused expression stops growing at
// kMaxFusedNodes nodes, so ten thousand chained statements become nests of bounded size (compile time
// linear, no deep recursion in the emitter) instead of one expression ten thousand levels deep.
Program fuse_elementwise(const Program& program, const ProgramTypes& types) {
  constexpr size_t kMaxFusedNodes = 256;
  Program p = program;
  // Readers of every tensor, with repetition: a producer read twice by one consumer would be computed twice.
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < p.statements.size(); ++i) {
    if (const auto* c = std::get_if<Contraction>(&p.statements[i])) {
      for (const auto& a : c->inputs) readers[a.tensor].push_back(i);
      if (c->init) readers[*c->init].push_back(i);
      continue;
    }
    std::vector<Expr> stack{std::get<Elementwise>(p.statements[i]).expr};
    while (!stack.empty()) {
      Expr x = stack.back();
      stack.pop_back();
      if (x.kind() == Expr::Kind::tensor) readers[x.name()].push_back(i);
      for (const auto& a : x.args()) stack.push_back(a);
    }
  }
  std::vector<bool> erased(p.statements.size(), false);
  std::vector<size_t> nodes(p.statements.size(), 0);
  for (size_t i = 0; i < p.statements.size(); ++i)
    if (const auto* e = std::get_if<Elementwise>(&p.statements[i])) nodes[i] = expression_nodes(e->expr);
  for (size_t i = 0; i < p.statements.size(); ++i) {
    const auto* producer = std::get_if<Elementwise>(&p.statements[i]);
    if (!producer) continue;
    const std::string& name = producer->output;
    if (std::find(p.outputs.begin(), p.outputs.end(), name) != p.outputs.end()) continue;
    // Its readers: one elementwise statement, or a few that each read it once when it is cheap to compute
    // again (a softmax gradient's DE_2 = DO * (1 / S) + DS_1, read by the maxima's adjoint and by DX:
    // computed in both, it is no pass of its own over the rows).
    // A duplicable producer that one contraction reads too (a layer norm's D = X - mean, read by the sum
    // of D * D and by the output) goes into its elementwise readers and stays for the contraction alone,
    // which then evaluates it where it reads it (nest fusion's inlined producers): no pass writes it.
    std::vector<size_t> r;
    std::set<size_t> contractions;
    for (size_t k : readers[name])
      (std::holds_alternative<Elementwise>(p.statements[k]) ? r.push_back(k) : (void)contractions.insert(k));
    // Any producer may be read several times by its one reader (the layer norm gradient's D * DQ_1 + D *
    // DQ_1, the GELU gradient's five reads of its tanh): an elementwise statement reads a tensor at one
    // index wherever it names it, so the copies are the same loads and arithmetic, which LLVM computes
    // once (its libm calls are memory(none)). Only a producer with several readers must be duplicable.
    const size_t distinct = std::set<size_t>(r.begin(), r.end()).size();
    if (r.empty() || distinct + contractions.size() > 3 || contractions.size() > 1) continue;
    if (distinct + contractions.size() > 1 && !duplicable(*producer, types)) continue;
    if (!contractions.empty() && std::get<Contraction>(p.statements[*contractions.begin()]).init == name) continue;
    if (std::any_of(r.begin(), r.end(), [&](size_t k) { return nodes[k] + std::count(r.begin(), r.end(), k) * nodes[i] > kMaxFusedNodes; }))
      continue;
    Expr value = Expr::call(Intrinsic::cast, {producer->expr}, types.tensors.at(name).dtype);
    for (size_t k : r) {
      auto& consumer = std::get<Elementwise>(p.statements[k]);
      consumer.expr = consumer.expr.replace_leaves([&](const Expr& leaf) -> std::optional<Expr> {
        if (leaf.kind() == Expr::Kind::tensor && leaf.name() == name) return value;
        return std::nullopt;
      });
      nodes[k] += nodes[i];
    }
    erased[i] = contractions.empty();
  }
  std::vector<Statement> kept;
  for (size_t i = 0; i < p.statements.size(); ++i)
    if (!erased[i]) kept.push_back(std::move(p.statements[i]));
  p.statements = std::move(kept);
  return p;
}

void verify_fusion(const Program& original, const Program& fused, const ProgramTypes& types) {
  auto fail = [](const std::string& why) { throw InternalError("translation validation failed: fusion " + why); };
  std::map<std::string, const Statement*> before, after;
  for (const auto& st : original.statements) before[statement_output(st)] = &st;
  for (const auto& st : fused.statements) after[statement_output(st)] = &st;
  std::map<std::string, const Elementwise*> absorbed;  // substituted: gone, or kept for a contraction
  for (const auto& [name, st] : before) {
    const auto* e = std::get_if<Elementwise>(st);
    if (after.count(name)) {
      if (e) absorbed[name] = e;
      continue;
    }
    if (!e) fail("dropped contraction " + name);
    if (std::find(original.outputs.begin(), original.outputs.end(), name) != original.outputs.end())
      fail("absorbed the program output " + name);
    absorbed[name] = e;
  }
  // A fused tree matches an original one where a read of an elementwise producer P became cast(P's
  // expression, P's dtype), recursively (every read of P where P is gone); everything else is the same node.
  std::function<bool(const Expr&, const Expr&)> matches = [&](const Expr& f, const Expr& o) {
    if (o.kind() == Expr::Kind::tensor && absorbed.count(o.name()) &&
        (!after.count(o.name()) || (f.kind() == Expr::Kind::call && f.intrinsic() == Intrinsic::cast))) {
      return f.kind() == Expr::Kind::call && f.intrinsic() == Intrinsic::cast &&
             f.cast_type() == types.tensors.at(o.name()).dtype && matches(f.args()[0], absorbed.at(o.name())->expr);
    }
    if (f.kind() != o.kind() || f.args().size() != o.args().size()) return false;
    switch (f.kind()) {
      case Expr::Kind::tensor:
      case Expr::Kind::literal:
      case Expr::Kind::dim: return f.str() == o.str();
      case Expr::Kind::unary: if (f.unary_op() != o.unary_op()) return false; break;
      case Expr::Kind::binary: if (f.binary_op() != o.binary_op()) return false; break;
      case Expr::Kind::call:
        if (f.intrinsic() != o.intrinsic() || (f.intrinsic() == Intrinsic::cast && f.cast_type() != o.cast_type())) return false;
        break;
    }
    for (size_t k = 0; k < f.args().size(); ++k)
      if (!matches(f.args()[k], o.args()[k])) return false;
    return true;
  };
  for (const auto& [name, st] : after) {
    auto it = before.find(name);
    if (it == before.end()) fail("invented statement " + name);
    if (const auto* e = std::get_if<Elementwise>(st)) {
      const auto* orig = std::get_if<Elementwise>(it->second);
      if (!orig || !matches(e->expr, orig->expr))
        fail("changed the meaning of " + name + ": " + e->expr.str() + " does not unfold to " + print(*it->second));
    } else if (print(*st) != print(*it->second)) {
      fail("changed contraction " + name);
    }
  }
}

}  // namespace polytile::sched
