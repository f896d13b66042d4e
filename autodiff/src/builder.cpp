#include "builder.h"

#include <algorithm>

#include "polytile/error.h"

namespace polytile::ad {

std::vector<DimExpr> broadcast(const std::vector<DimExpr>& a, const std::vector<DimExpr>& b) {
  size_t r = std::max(a.size(), b.size());
  std::vector<DimExpr> out(r);
  for (size_t i = 0; i < r; ++i) {
    bool has_a = i >= r - a.size(), has_b = i >= r - b.size();
    if (!has_a) {
      out[i] = b[i - (r - b.size())];
      continue;
    }
    if (!has_b) {
      out[i] = a[i - (r - a.size())];
      continue;
    }
    const DimExpr& x = a[i - (r - a.size())];
    const DimExpr& y = b[i - (r - b.size())];
    if (x == y || (y.is_constant() && y.value() == 1)) {
      out[i] = x;
    } else if (x.is_constant() && x.value() == 1) {
      out[i] = y;
    } else {
      out[i] = max(x, y);
    }
  }
  return out;
}

Builder::Builder(const Program& forward) : program(forward) {
  for (const auto& p : forward.inputs) {
    names_.insert(p.name);
    shapes[p.name] = p.dims;
    for (const auto& d : p.dims) {
      std::vector<std::string> syms;
      d.collect_symbols(syms);
      names_.insert(syms.begin(), syms.end());
    }
  }
  for (const auto& st : forward.statements) {
    const std::string& out = statement_output(st);
    names_.insert(out);
    if (const auto* c = std::get_if<Contraction>(&st)) {
      shapes[out] = c->output_shape;
    } else {
      shapes[out] = expr_shape(std::get<Elementwise>(st).expr);
    }
  }
}

std::string Builder::fresh(const std::string& base) {
  std::string name = base;
  for (int k = 1; names_.count(name); ++k) name = base + "_" + std::to_string(k);
  names_.insert(name);
  return name;
}

const std::string& Builder::add(Statement s) {
  const std::string& out = statement_output(s);
  names_.insert(out);
  if (const auto* c = std::get_if<Contraction>(&s)) {
    shapes[out] = c->output_shape;
  } else {
    shapes[out] = expr_shape(std::get<Elementwise>(s).expr);
  }
  program.statements.push_back(std::move(s));
  return statement_output(program.statements.back());
}

std::string Builder::elementwise(const std::string& base, const Expr& e) {
  // A bare reference needs no statement of its own.
  if (e.kind() == Expr::Kind::tensor) return e.name();
  std::string name = fresh(base);
  return add(Elementwise{name, e});
}

std::vector<DimExpr> Builder::expr_shape(const Expr& e) const {
  std::vector<std::string> used;
  e.collect_tensors(used);
  std::vector<DimExpr> shape;
  for (const auto& t : used) {
    auto it = shapes.find(t);
    POLYTILE_CHECK(it != shapes.end(), "no shape for tensor ", t);
    shape = broadcast(shape, it->second);
  }
  return shape;
}

std::string Builder::sum(const std::vector<std::string>& parts, const std::string& base) {
  POLYTILE_CHECK(!parts.empty(), "sum of no parts");
  if (parts.size() == 1) return parts[0];
  Expr e = Expr::tensor(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) e = Expr::binary(BinaryOp::add, e, Expr::tensor(parts[i]));
  return elementwise(base, e);
}

std::vector<std::string> Builder::prefix_indices(size_t n, const std::set<std::string>& used) {
  std::vector<std::string> out;
  for (size_t k = 0, i = 0; out.size() < n; ++i) {
    std::string name = "p" + std::to_string(i);
    if (used.count(name)) continue;
    out.push_back(name);
    ++k;
  }
  return out;
}

std::string Builder::zeros(const std::string& like, const std::vector<DimExpr>& prefix, const std::string& base) {
  // An empty sum over `like` itself: zeros of like's dtype, no NaN from 0 * inf.
  const auto& shape = shapes.at(like);
  Contraction c;
  c.output = fresh(base);
  c.aggregation = AggregationOp::sum;
  std::vector<std::string> idx;
  std::set<std::string> used;
  for (size_t k = 0; k < shape.size(); ++k) {
    idx.push_back("i" + std::to_string(k));
    used.insert(idx.back());
  }
  std::vector<std::string> pv = prefix_indices(prefix.size(), used);
  for (size_t k = 0; k < prefix.size(); ++k) {
    c.output_indices.push_back(Polynomial::index(pv[k]));
    c.output_shape.push_back(prefix[k]);
  }
  TensorAccess a{like, {}};
  for (size_t k = 0; k < shape.size(); ++k) {
    c.output_indices.push_back(Polynomial::index(idx[k]));
    c.output_shape.push_back(shape[k]);
    a.indices.push_back(Polynomial::index(idx[k]));
  }
  c.inputs.push_back(a);
  c.constraints.push_back({Polynomial(Rational(0)), DimExpr(0)});  // 0 <= 0 < 0: no point
  return add(std::move(c));
}

std::string Builder::unbroadcast(const std::string& name, const std::vector<DimExpr>& to, size_t prefix_rank,
                                 const std::string& base) {
  const std::vector<DimExpr> from = shapes.at(name);
  if (from.size() == to.size()) {
    bool same = true;
    for (size_t k = 0; k < to.size(); ++k) same &= from[k] == to[k];
    if (same) return name;
  }
  POLYTILE_CHECK(from.size() >= to.size() && to.size() >= prefix_rank, "bad unbroadcast");
  Contraction c;
  c.output = fresh(base);
  c.aggregation = AggregationOp::sum;
  c.output_shape = to;
  TensorAccess a{name, {}};
  size_t lead = from.size() - to.size();  // summed entirely (after the prefix)
  int var = 0;
  auto next_var = [&var] { return "i" + std::to_string(var++); };
  for (size_t k = 0; k < from.size(); ++k) {
    bool in_prefix = k < prefix_rank;
    if (!in_prefix && k < prefix_rank + lead) {
      a.indices.push_back(Polynomial::index(next_var()));
      continue;
    }
    size_t t = in_prefix ? k : k - lead;
    std::string v = next_var();
    c.output_indices.push_back(Polynomial::index(v));
    if (from[k] == to[t]) {
      a.indices.push_back(Polynomial::index(v));
    } else {
      // to[t] is 1 or equal to from[k]: i + j with j < from - to + 1 covers both.
      std::string j = next_var();
      a.indices.push_back(Polynomial::index(v) + Polynomial::index(j));
      c.constraints.push_back({Polynomial::index(j), from[k] - to[t] + 1});
    }
  }
  c.inputs.push_back(a);
  return add(std::move(c));
}

std::string Builder::ones(const std::string& tensor) {
  Expr x = Expr::tensor(tensor), one = Expr::literal(1, false);
  return elementwise("ONES_" + tensor, Expr::call(Intrinsic::select, {Expr::binary(BinaryOp::eq, x, x), one, one}));
}

void Builder::keep_bounds(const TensorAccess& a, std::vector<Constraint>& extra, std::vector<TensorAccess>& body,
                          CombinationOp& comb) {
  // Constraints 0 <= index < dim carry the access's validity when every index is integral and varies; a
  // constant index (C[5] of a two-element C) is valid or not as a whole, which only an access can say.
  bool integral = true;
  for (const auto& p : a.indices) {
    integral &= p.constant().is_integer() && p.has_index_vars();
    for (const auto& [v, c] : p.index_terms()) integral &= c.is_integer();
  }
  if (integral) {
    const auto& shape = shapes.at(a.tensor);
    for (size_t k = 0; k < a.indices.size(); ++k)
      extra.push_back({a.indices[k], shape[k]});
    return;
  }
  body.push_back({ones(a.tensor), a.indices});
  comb = CombinationOp::mul;
}

void Builder::rename(Statement& st, const std::string& name) {
  std::string old = statement_output(st);
  if (old == name) return;
  std::visit([&](auto& s) { s.output = name; }, st);
  shapes[name] = shapes[old];
}

void Builder::bind_name(const std::string& value, const std::string& name) {
  Statement* def = nullptr;
  bool referenced = false;
  for (auto& st : program.statements) {
    if (statement_output(st) == value) def = &st;
    std::vector<std::string> used = statement_operands(st);
    referenced |= std::find(used.begin(), used.end(), value) != used.end();
  }
  bool is_output = std::find(program.outputs.begin(), program.outputs.end(), value) != program.outputs.end();
  if (def && !referenced && !is_output) {
    rename(*def, name);
    return;
  }
  add(Elementwise{name, Expr::call(Intrinsic::ident, {Expr::tensor(value)})});
}

void Builder::eliminate_dead_code() {
  std::set<std::string> live(program.outputs.begin(), program.outputs.end());
  std::vector<Statement> kept;
  for (auto it = program.statements.rbegin(); it != program.statements.rend(); ++it) {
    if (!live.count(statement_output(*it))) continue;
    std::vector<std::string> used = statement_operands(*it);
    live.insert(used.begin(), used.end());
    kept.push_back(*it);
  }
  std::reverse(kept.begin(), kept.end());
  program.statements = std::move(kept);
}

}  // namespace polytile::ad
