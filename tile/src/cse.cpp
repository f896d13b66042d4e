// Common-subexpression elimination (see cse.h). Data model: statements are visited in program order with
// a map from each merged-away tensor to the tensor that replaces it; a statement is first rewritten
// through that map, then keyed by its canonical text (contraction index variables renamed in order of
// appearance, the output name left out), so equal keys mean equal computations.
#include "polytile/cse.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

namespace polytile {
namespace {

std::string canonical_key(const Statement& st) {
  if (const auto* e = std::get_if<Elementwise>(&st)) return "elementwise " + e->expr.str();
  Contraction c = std::get<Contraction>(st);
  std::map<std::string, std::string> renames;
  for (const auto& v : c.index_variables()) renames[v] = "x" + std::to_string(renames.size()) + "_";
  for (auto& p : c.output_indices) p = p.rename_indices(renames);
  for (auto& a : c.inputs)
    for (auto& p : a.indices) p = p.rename_indices(renames);
  for (auto& k : c.constraints) k.poly = k.poly.rename_indices(renames);
  c.output = "_";
  return "contraction " + print(Statement(c));
}

bool reads_a_tensor(const Expr& e) {
  std::vector<std::string> used;
  e.collect_tensors(used);
  return !used.empty();
}

Expr rebuild(const Expr& e, std::vector<Expr> args) {
  switch (e.kind()) {
    case Expr::Kind::unary: return Expr::unary(e.unary_op(), args[0]);
    case Expr::Kind::binary: return Expr::binary(e.binary_op(), args[0], args[1]);
    case Expr::Kind::call:
      return Expr::call(e.intrinsic(), std::move(args), e.intrinsic() == Intrinsic::cast ? e.cast_type() : DType::f32);
    default: return e;
  }
}

bool expensive(Intrinsic fn) {
  switch (fn) {
    case Intrinsic::exp: case Intrinsic::log: case Intrinsic::sqrt: case Intrinsic::pow: case Intrinsic::sin:
    case Intrinsic::cos: case Intrinsic::tan: case Intrinsic::asin: case Intrinsic::acos: case Intrinsic::atan:
    case Intrinsic::sinh: case Intrinsic::cosh: case Intrinsic::tanh: case Intrinsic::erf: case Intrinsic::sigmoid:
      return true;
    default: return false;
  }
}

size_t nodes(const Expr& e) {
  size_t n = 1;
  for (const auto& a : e.args()) n += nodes(a);
  return n;
}

// A call of a transcendental function (with what it reads) that occurs more than once among the
// elementwise statements is computed once, by a statement of its own placed before its first reader:
// the gradient of sqrt(V + eps) / ... reads the square root five times. Largest repeated subtree first.
void hoist_repeated_calls(Program& p) {
  std::set<std::string> names;
  for (const auto& in : p.inputs) {
    names.insert(in.name);
    for (const auto& d : in.dims) {
      std::vector<std::string> syms;
      d.collect_symbols(syms);
      names.insert(syms.begin(), syms.end());
    }
  }
  for (const auto& st : p.statements) names.insert(statement_output(st));
  for (int round = 0; round < 1000; ++round) {
    struct Seen {
      Expr expr;
      size_t count = 0, first = 0;
    };
    std::map<std::string, Seen> seen;
    for (size_t i = 0; i < p.statements.size(); ++i) {
      const auto* e = std::get_if<Elementwise>(&p.statements[i]);
      if (!e) continue;
      std::function<void(const Expr&, bool)> visit = [&](const Expr& x, bool root) {
        for (const auto& a : x.args()) visit(a, false);
        if (root || x.kind() != Expr::Kind::call || !expensive(x.intrinsic()) || !reads_a_tensor(x)) return;
        Seen& s = seen[x.str()];
        if (s.count++ == 0) {
          s.expr = x;
          s.first = i;
        }
      };
      visit(e->expr, true);
    }
    const Seen* best = nullptr;
    for (const auto& [text, s] : seen)
      if (s.count >= 2 && (!best || nodes(s.expr) > nodes(best->expr))) best = &s;
    if (!best) return;
    std::string name = "CSE";
    for (int k = 0; names.count(name); ++k) name = "CSE_" + std::to_string(k);
    names.insert(name);
    const std::string text = best->expr.str();
    Statement hoisted = Elementwise{name, best->expr};
    const size_t first = best->first;
    std::function<Expr(const Expr&)> replace = [&](const Expr& x) -> Expr {
      if (x.str() == text) return Expr::tensor(name);
      if (x.args().empty()) return x;
      std::vector<Expr> args;
      for (const auto& a : x.args()) args.push_back(replace(a));
      return rebuild(x, std::move(args));
    };
    for (auto& st : p.statements)
      if (auto* e = std::get_if<Elementwise>(&st)) e->expr = replace(e->expr);
    p.statements.insert(p.statements.begin() + static_cast<long>(first), std::move(hoisted));
  }
}

}  // namespace

Program eliminate_common_subexpressions(const Program& program) {
  Program out = program;
  out.statements.clear();
  std::map<std::string, std::string> alias;  // merged-away tensor -> the tensor that replaces it
  std::map<std::string, std::string> seen;   // canonical key -> tensor
  std::map<std::string, std::string> stored;  // expression text of an elementwise statement -> its tensor
  const std::set<std::string> outputs(program.outputs.begin(), program.outputs.end());
  auto resolve = [&](const std::string& name) {
    auto it = alias.find(name);
    return it == alias.end() ? name : it->second;
  };
  // Bottom-up: operands resolved, stored subexpressions read back, e + e doubled.
  std::function<Expr(const Expr&, bool)> simplify = [&](const Expr& e, bool root) -> Expr {
    if (e.kind() == Expr::Kind::tensor) return Expr::tensor(resolve(e.name()));
    if (e.args().empty()) return e;
    std::vector<Expr> args;
    for (const auto& a : e.args()) args.push_back(simplify(a, false));
    Expr r = rebuild(e, args);
    if (r.kind() == Expr::Kind::binary && r.binary_op() == BinaryOp::add && args[0].str() == args[1].str())
      r = Expr::binary(BinaryOp::mul, Expr::literal(2, true), args[0]);
    if (!root && reads_a_tensor(r)) {
      auto it = stored.find(r.str());
      if (it != stored.end()) return Expr::tensor(it->second);
    }
    return r;
  };
  for (Statement st : program.statements) {
    if (auto* e = std::get_if<Elementwise>(&st)) {
      e->expr = simplify(e->expr, true);
    } else {
      auto& c = std::get<Contraction>(st);
      for (auto& a : c.inputs) a.tensor = resolve(a.tensor);
      if (c.init) c.init = resolve(*c.init);
    }
    const std::string& name = statement_output(st);
    std::string key = canonical_key(st);
    auto it = seen.find(key);
    if (it != seen.end()) {
      if (outputs.count(name)) {
        out.statements.push_back(Elementwise{name, Expr::call(Intrinsic::ident, {Expr::tensor(it->second)})});
      } else {
        alias[name] = it->second;
      }
      continue;
    }
    seen[key] = name;
    if (const auto* e = std::get_if<Elementwise>(&st); e && e->expr.kind() != Expr::Kind::tensor) stored[e->expr.str()] = name;
    out.statements.push_back(std::move(st));
  }
  hoist_repeated_calls(out);
  // Dead statements: backwards, keeping what an output or a kept statement reads.
  std::set<std::string> live = outputs;
  std::vector<Statement> kept;
  for (auto it = out.statements.rbegin(); it != out.statements.rend(); ++it) {
    if (!live.count(statement_output(*it))) continue;
    for (const auto& t : statement_operands(*it)) live.insert(t);
    kept.push_back(*it);
  }
  std::reverse(kept.begin(), kept.end());
  out.statements = std::move(kept);
  return out;
}

}  // namespace polytile
