#include "invariance.h"

#include <cmath>
#include <map>
#include <optional>

#include "derivatives.h"

namespace polytile::ad {
namespace {

// A tensor's element variables in `at`: "#k" for its dim k (no Tile name starts with '#').
std::string element_var(size_t k) { return "#" + std::to_string(k); }

struct Effect {
  enum class Kind { none, shift, scale, unknown };
  Kind kind = Kind::none;
  Rational power;
  std::vector<Polynomial> at;  // over the element variables of the tensor holding the effect

  static Effect none() { return {}; }
  static Effect unknown() { return {Kind::unknown, {}, {}}; }
  static Effect make(Kind kind, Rational power, std::vector<Polynomial> at) {
    if (power.is_zero()) return none();
    return {kind, power, std::move(at)};
  }
  bool is(Kind k) const { return kind == k; }
  bool same(const Effect& o) const { return kind == o.kind && power == o.power && at == o.at; }
};

// `at` with each index variable replaced by its value; nullopt when one has none.
std::optional<std::vector<Polynomial>> substitute(const std::vector<Polynomial>& at,
                                                  const std::map<std::string, Polynomial>& values) {
  std::vector<Polynomial> out;
  for (const auto& p : at) {
    Polynomial q = p;
    for (const auto& [v, c] : p.index_terms()) {
      auto value = values.find(v);
      if (value == values.end()) return std::nullopt;
      q = q - Polynomial::index(v) * c + value->second * c;
    }
    out.push_back(q);
  }
  return out;
}

// The element variables #0, #1, ... of `at` bound to `values`.
std::optional<std::vector<Polynomial>> substitute(const std::vector<Polynomial>& at, const std::vector<Polynomial>& values) {
  std::map<std::string, Polynomial> by_name;
  for (size_t k = 0; k < values.size(); ++k) by_name.emplace(element_var(k), values[k]);
  return substitute(at, by_name);
}

bool is_one(const DimExpr& d) { return d.is_constant() && d.value() == 1; }

// The effect on a tensor of shape `from` read, numpy-broadcast, as an operand of shape `to`.
Effect broadcast_to(const Effect& e, const std::vector<DimExpr>& from, const std::vector<DimExpr>& to) {
  if (e.is(Effect::Kind::none) || e.is(Effect::Kind::unknown)) return e;
  if (from.size() > to.size()) return Effect::unknown();
  const size_t offset = to.size() - from.size();
  std::vector<Polynomial> index;
  for (size_t k = 0; k < from.size(); ++k) {
    if (is_one(to[k + offset])) {
      index.push_back(Polynomial(0));  // the only element along a dim of 1
    } else if (from[k] == to[k + offset]) {
      index.push_back(Polynomial::index(element_var(k + offset)));
    } else if (is_one(from[k])) {
      index.push_back(Polynomial(0));
    } else {
      return Effect::unknown();  // symbolic dims that may or may not broadcast
    }
  }
  auto at = substitute(e.at, index);
  if (!at) return Effect::unknown();
  return Effect::make(e.kind, e.power, *at);
}

// A literal's value as an exact rational when it is a dyadic fraction (2, 0.5, -0.125): a shift times it.
std::optional<Rational> dyadic_literal(const Expr& e) {
  if (e.kind() != Expr::Kind::literal) return std::nullopt;
  const double v = e.value();
  for (int64_t den = 1; den <= (int64_t{1} << 20); den *= 2) {
    const double n = v * static_cast<double>(den);
    if (n == std::floor(n) && std::fabs(n) < 1e15) return Rational(static_cast<int64_t>(n), den);
  }
  return std::nullopt;
}

// Whether `tensor` is read somewhere in `e` outside every piecewise-constant node (an unknown
// perturbation of it then makes e's unknown).
bool read_outside_piecewise_constant(const Expr& e, const std::string& tensor) {
  if (e.is_null() || piecewise_constant(e)) return false;
  if (e.kind() == Expr::Kind::tensor) return e.name() == tensor;
  if (e.kind() == Expr::Kind::literal || e.kind() == Expr::Kind::dim) return false;
  for (const auto& a : e.args())
    if (read_outside_piecewise_constant(a, tensor)) return true;
  return false;
}

// The tensors from which an unknown perturbation reaches an observed output as unknown, whatever else
// moves: every observed output, and every operand that a statement producing one of them reads where
// nothing piecewise constant stands in between. A candidate's proof stops as soon as such a tensor moves
// in an unknown way (the analysis then costs a few statements, not the rest of the program).
std::set<std::string> doomed_tensors(const InvarianceQuery& q) {
  std::set<std::string> doomed;
  for (const auto& o : q.observed)
    if (!q.constant.count(o)) doomed.insert(o);
  const auto& statements = q.program->statements;
  for (auto it = statements.rbegin(); it != statements.rend(); ++it) {
    const std::string& out = statement_output(*it);
    if (!doomed.count(out) || q.constant.count(out)) continue;
    if (q.opaque.count(out)) {
      for (const auto& r : statement_operands(*it)) doomed.insert(r);
      auto d = q.dependencies.find(out);
      if (d != q.dependencies.end()) doomed.insert(d->second.begin(), d->second.end());
    } else if (const auto* e = std::get_if<Elementwise>(&*it)) {
      for (const auto& r : statement_operands(*it))
        if (read_outside_piecewise_constant(e->expr, r)) doomed.insert(r);
    } else {
      const auto& c = std::get<Contraction>(*it);
      if (c.init) doomed.insert(*c.init);
      if (c.combination != CombinationOp::eq || c.init)
        for (const auto& a : c.inputs) doomed.insert(a.tensor);
    }
  }
  return doomed;
}

class Propagation {
 public:
  Propagation(const InvarianceQuery& q, const std::set<std::string>& doomed, const std::string& moved)
      : q_(q), doomed_(doomed) {
    const auto& shape = q.shapes->at(moved);
    std::vector<Polynomial> at;
    for (size_t k = 0; k < shape.size(); ++k) at.push_back(is_one(shape[k]) ? Polynomial(0) : Polynomial::index(element_var(k)));
    effects_[moved] = Effect::make(Effect::Kind::shift, 1, at);
    moved_ = moved;
  }

  bool observed_unchanged() {
    bool past = false;
    for (const auto& st : q_.program->statements) {
      const std::string& out = statement_output(st);
      if (out == moved_) {
        past = true;
        continue;
      }
      if (!past) continue;
      Effect e = statement_effect(st);
      if (q_.constant.count(out)) e = Effect::none();
      if (q_.observed.count(out) && !e.is(Effect::Kind::none)) return false;
      if (e.is(Effect::Kind::unknown) && doomed_.count(out)) return false;
      if (!e.is(Effect::Kind::none)) effects_[out] = e;
    }
    return !q_.observed.count(moved_);
  }

 private:
  Effect of(const std::string& tensor) const {
    auto it = effects_.find(tensor);
    return it == effects_.end() ? Effect::none() : it->second;
  }

  Effect statement_effect(const Statement& st) {
    const std::string& out = statement_output(st);
    if (q_.opaque.count(out)) {
      std::vector<std::string> reads = statement_operands(st);
      auto d = q_.dependencies.find(out);
      if (d != q_.dependencies.end()) reads.insert(reads.end(), d->second.begin(), d->second.end());
      for (const auto& r : reads)
        if (!of(r).is(Effect::Kind::none)) return Effect::unknown();
      return Effect::none();
    }
    if (const auto* e = std::get_if<Elementwise>(&st)) {
      shape_ = &q_.shapes->at(out);
      return expr_effect(e->expr);
    }
    return contraction_effect(std::get<Contraction>(st));
  }

  // ------------------------------------------------------------------------------- elementwise
  Effect expr_effect(const Expr& e) const {
    using K = Effect::Kind;
    if (piecewise_constant(e)) return Effect::none();  // derivative zero: no perturbation passes
    switch (e.kind()) {
      case Expr::Kind::tensor: return broadcast_to(of(e.name()), q_.shapes->at(e.name()), *shape_);
      case Expr::Kind::literal:
      case Expr::Kind::dim: return Effect::none();
      case Expr::Kind::unary: {
        Effect a = expr_effect(e.args()[0]);
        if (a.is(K::none) || a.is(K::unknown)) return a;
        return a.is(K::shift) ? Effect::make(K::shift, -a.power, a.at) : a;  // -(x + p d), -(x) exp(p d)
      }
      case Expr::Kind::binary: return binary_effect(e);
      case Expr::Kind::call: return call_effect(e);
    }
    return Effect::unknown();
  }

  Effect binary_effect(const Expr& e) const {
    using K = Effect::Kind;
    Effect a = expr_effect(e.args()[0]), b = expr_effect(e.args()[1]);
    if (a.is(K::unknown) || b.is(K::unknown)) return Effect::unknown();
    if (a.is(K::none) && b.is(K::none)) return Effect::none();
    const bool same_at = a.is(K::none) || b.is(K::none) || a.at == b.at;
    switch (e.binary_op()) {
      case BinaryOp::add:
      case BinaryOp::sub: {
        const Rational sign = e.binary_op() == BinaryOp::add ? 1 : -1;
        if (a.is(K::scale) || b.is(K::scale)) return a.same(b) ? a : Effect::unknown();  // k x +- k y
        if (!same_at) return Effect::unknown();
        const Rational pa = a.is(K::shift) ? a.power : 0, pb = b.is(K::shift) ? b.power : 0;
        return Effect::make(K::shift, pa + sign * pb, a.is(K::shift) ? a.at : b.at);
      }
      case BinaryOp::mul:
      case BinaryOp::div: {
        // (x + p d) * c = x c + p c d for a literal c, and likewise / c.
        const std::optional<Rational> ca = dyadic_literal(e.args()[0]), cb = dyadic_literal(e.args()[1]);
        if (a.is(K::shift) && cb && !(e.binary_op() == BinaryOp::div && cb->is_zero()))
          return Effect::make(K::shift, e.binary_op() == BinaryOp::mul ? a.power * *cb : a.power / *cb, a.at);
        if (b.is(K::shift) && ca && e.binary_op() == BinaryOp::mul) return Effect::make(K::shift, b.power * *ca, b.at);
        if (a.is(K::shift) || b.is(K::shift) || !same_at) return Effect::unknown();
        const Rational sign = e.binary_op() == BinaryOp::mul ? 1 : -1;
        const Rational pa = a.is(K::scale) ? a.power : 0, pb = b.is(K::scale) ? b.power : 0;
        return Effect::make(K::scale, pa + sign * pb, a.is(K::scale) ? a.at : b.at);
      }
      default: return Effect::unknown();  // mod (comparisons and logical operators: expr_effect)
    }
  }

  Effect call_effect(const Expr& e) const {
    using K = Effect::Kind;
    std::vector<Effect> args;
    bool all_none = true;
    for (const auto& a : e.args()) {
      args.push_back(expr_effect(a));
      if (args.back().is(K::unknown)) return Effect::unknown();
      all_none &= args.back().is(K::none);
    }
    if (all_none) return Effect::none();
    const Effect& a = args[0];
    switch (e.intrinsic()) {
      case Intrinsic::exp: return a.is(K::shift) ? Effect::make(K::scale, a.power, a.at) : Effect::unknown();
      case Intrinsic::log: return a.is(K::scale) ? Effect::make(K::shift, a.power, a.at) : Effect::unknown();
      case Intrinsic::sqrt: return a.is(K::scale) ? Effect::make(K::scale, a.power * Rational(1, 2), a.at) : Effect::unknown();
      case Intrinsic::abs:
      case Intrinsic::relu: return a.is(K::scale) ? a : Effect::unknown();
      case Intrinsic::ident: return a;
      case Intrinsic::max:
      case Intrinsic::min: return args[0].same(args[1]) ? args[0] : Effect::unknown();
      case Intrinsic::select:
        if (!args[0].is(K::none)) return Effect::unknown();
        return args[1].same(args[2]) ? args[1] : Effect::unknown();
      case Intrinsic::cast: return a;  // to a float type (to integers: expr_effect)
      default: return Effect::unknown();
    }
  }

  // ------------------------------------------------------------------------------- contractions
  Effect contraction_effect(const Contraction& c) const {
    using K = Effect::Kind;
    if (c.combination == CombinationOp::eq && !c.init) return Effect::none();  // piecewise constant
    bool all_none = !c.init || of(*c.init).is(K::none);
    for (const auto& a : c.inputs) all_none &= of(a.tensor).is(K::none);
    if (all_none) return Effect::none();
    if (c.aggregation == AggregationOp::product || c.combination == CombinationOp::eq) return Effect::unknown();
    if (c.combination != CombinationOp::none && c.combination != CombinationOp::mul) return Effect::unknown();
    // Each operand's effect at a point of the contraction: `at` over the contraction's variables.
    Effect point = Effect::none();
    for (const auto& a : c.inputs) {
      Effect e = of(a.tensor);
      if (e.is(K::none)) continue;
      if (!e.is(K::scale)) return Effect::unknown();  // a shift does not pass a sum
      auto at = substitute(e.at, a.indices);
      if (!at) return Effect::unknown();
      if (point.is(K::none)) {
        point = Effect::make(K::scale, e.power, *at);
      } else {
        if (point.at != *at) return Effect::unknown();
        point = Effect::make(K::scale, point.power + e.power, *at);
      }
    }
    // The factor leaves the aggregation when the output's indices determine it.
    Effect result = Effect::none();
    if (!point.is(K::none)) {
      // A variable that is an output index is that element variable (0 along a dim of 1).
      std::map<std::string, Polynomial> to_element;
      for (size_t k = 0; k < c.output_indices.size(); ++k) {
        const Polynomial& o = c.output_indices[k];
        if (o.is_constant()) continue;
        auto v = o.variable();
        if (!v) return Effect::unknown();
        to_element.emplace(*v, is_one(c.output_shape[k]) ? Polynomial(0) : Polynomial::index(element_var(k)));
      }
      auto at = substitute(point.at, to_element);
      if (!at) return Effect::unknown();  // varies within an output element
      result = Effect::make(K::scale, point.power, *at);
    }
    if (c.init) {  // the accumulator starts at the default: it must move as the aggregate does
      Effect init = broadcast_to(of(*c.init), q_.shapes->at(*c.init), c.output_shape);
      if (!init.same(result)) return Effect::unknown();
    }
    return result;
  }

  const InvarianceQuery& q_;
  const std::set<std::string>& doomed_;
  std::string moved_;
  std::map<std::string, Effect> effects_;
  const std::vector<DimExpr>* shape_ = nullptr;  // of the elementwise statement being followed
};

}  // namespace

std::set<std::string> tensors_observed_outputs_ignore(const InvarianceQuery& query, const std::set<std::string>& candidates) {
  const std::set<std::string> doomed = doomed_tensors(query);
  std::set<std::string> ignored;
  for (const auto& st : query.program->statements) {
    const std::string& out = statement_output(st);
    if (candidates.count(out) && !query.observed.count(out) && Propagation(query, doomed, out).observed_unchanged())
      ignored.insert(out);
  }
  return ignored;
}

}  // namespace polytile::ad
