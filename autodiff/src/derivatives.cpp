// Derivative rules of every elementwise operator and intrinsic (see autodiff.h for the conventions).
#include "derivatives.h"

#include <set>
#include <vector>

#include "polytile/error.h"

namespace polytile::ad {
namespace {

Expr un(UnaryOp op, const Expr& a) { return Expr::unary(op, a); }
Expr call(Intrinsic fn, std::vector<Expr> args) { return Expr::call(fn, std::move(args)); }
Expr mul(const Expr& a, const Expr& b) { return bin(BinaryOp::mul, a, b); }

bool is_literal(const Expr& e, double v) { return e.kind() == Expr::Kind::literal && e.value() == v; }

}  // namespace

bool piecewise_constant(const Expr& node) {
  switch (node.kind()) {
    case Expr::Kind::unary: return node.unary_op() == UnaryOp::logical_not;
    case Expr::Kind::binary: {
      const BinaryOp op = node.binary_op();
      return op != BinaryOp::add && op != BinaryOp::sub && op != BinaryOp::mul && op != BinaryOp::div &&
             op != BinaryOp::mod;
    }
    case Expr::Kind::call:
      switch (node.intrinsic()) {
        case Intrinsic::sign:
        case Intrinsic::floor:
        case Intrinsic::ceil:
        case Intrinsic::round: return true;
        case Intrinsic::cast: return !is_float(node.cast_type());
        default: return false;
      }
    default: return false;
  }
}

std::optional<Expr> partial(const Expr& node, size_t i) {
  const auto& args = node.args();
  if (piecewise_constant(node)) return std::nullopt;
  switch (node.kind()) {
    case Expr::Kind::tensor:
    case Expr::Kind::literal:
    case Expr::Kind::dim: return std::nullopt;
    case Expr::Kind::unary: return lit(-1);  // neg (logical not is piecewise constant)
    case Expr::Kind::binary: {
      const Expr &a = args[0], &b = args[1];
      switch (node.binary_op()) {
        case BinaryOp::add: return lit(1);
        case BinaryOp::sub: return lit(i == 0 ? 1 : -1);
        case BinaryOp::mul: return i == 0 ? b : a;
        case BinaryOp::div:
          if (i == 0) return bin(BinaryOp::div, lit(1), b);
          // -a * (1 / b^2) rather than -a / b^2: one division either way, and where b is constant along a
          // loop (a softmax's row sum, broadcast) the division leaves the loop and a multiply remains.
          return un(UnaryOp::neg, mul(a, bin(BinaryOp::div, lit(1), mul(b, b))));
        case BinaryOp::mod: {  // fmod(a, b) = a - b * trunc(a / b)
          if (i == 0) return lit(1);
          Expr q = bin(BinaryOp::div, a, b);
          return un(UnaryOp::neg, sel(bin(BinaryOp::lt, q, lit(0)), call(Intrinsic::ceil, {q}), call(Intrinsic::floor, {q})));
        }
        default: return std::nullopt;  // piecewise constant, above
      }
    }
    case Expr::Kind::call: {
      const Expr& a = args[0];
      switch (node.intrinsic()) {
        case Intrinsic::abs: return call(Intrinsic::sign, {a});
        case Intrinsic::sign:
        case Intrinsic::floor:
        case Intrinsic::ceil:
        case Intrinsic::round: return std::nullopt;  // piecewise constant, above
        case Intrinsic::exp: return call(Intrinsic::exp, {a});
        case Intrinsic::log: return bin(BinaryOp::div, lit(1), a);
        case Intrinsic::sqrt: return bin(BinaryOp::div, lit(0.5), call(Intrinsic::sqrt, {a}));
        case Intrinsic::pow: {
          const Expr& b = args[1];
          if (i == 0) return mul(b, call(Intrinsic::pow, {a, bin(BinaryOp::sub, b, lit(1))}));
          // d/db a^b = a^b log a, taken as 0 where a <= 0 (no real logarithm)
          return sel(bin(BinaryOp::gt, a, lit(0)), mul(node, call(Intrinsic::log, {a})), lit(0));
        }
        case Intrinsic::sin: return call(Intrinsic::cos, {a});
        case Intrinsic::cos: return un(UnaryOp::neg, call(Intrinsic::sin, {a}));
        case Intrinsic::tan: return bin(BinaryOp::add, lit(1), mul(node, node));
        case Intrinsic::asin: return bin(BinaryOp::div, lit(1), call(Intrinsic::sqrt, {bin(BinaryOp::sub, lit(1), mul(a, a))}));
        case Intrinsic::acos:
          return un(UnaryOp::neg, bin(BinaryOp::div, lit(1), call(Intrinsic::sqrt, {bin(BinaryOp::sub, lit(1), mul(a, a))})));
        case Intrinsic::atan: return bin(BinaryOp::div, lit(1), bin(BinaryOp::add, lit(1), mul(a, a)));
        case Intrinsic::sinh: return call(Intrinsic::cosh, {a});
        case Intrinsic::cosh: return call(Intrinsic::sinh, {a});
        case Intrinsic::tanh: return bin(BinaryOp::sub, lit(1), mul(node, node));
        case Intrinsic::erf: return mul(lit(1.1283791670955126), call(Intrinsic::exp, {un(UnaryOp::neg, mul(a, a))}));
        case Intrinsic::sigmoid: return mul(node, bin(BinaryOp::sub, lit(1), node));
        case Intrinsic::relu: return sel(bin(BinaryOp::gt, a, lit(0)), lit(1), lit(0));
        case Intrinsic::max:
        case Intrinsic::min: {
          // Ties share the derivative equally, as JAX does.
          BinaryOp wins = node.intrinsic() == Intrinsic::max ? BinaryOp::gt : BinaryOp::lt;
          const Expr& self = args[i];
          const Expr& other = args[1 - i];
          return sel(bin(wins, self, other), lit(1), sel(bin(BinaryOp::eq, self, other), lit(0.5), lit(0)));
        }
        case Intrinsic::ident: return lit(1);
        case Intrinsic::select:
          if (i == 0) return std::nullopt;
          return sel(args[0], lit(i == 1 ? 1 : 0), lit(i == 1 ? 0 : 1));
        case Intrinsic::cast: return lit(1);  // to a float type (to integers: piecewise constant, above)
      }
    }
  }
  POLYTILE_CHECK(false, "bad expression kind");
}

Expr times(const Expr& g, const Expr& p) {
  if (is_literal(g, 0) || is_literal(p, 0)) return lit(0);
  if (is_literal(g, 1)) return p;
  if (is_literal(p, 1)) return g;
  if (is_literal(g, -1)) return un(UnaryOp::neg, p);
  if (is_literal(p, -1)) return un(UnaryOp::neg, g);
  if (p.kind() == Expr::Kind::call && p.intrinsic() == Intrinsic::select)
    return sel(p.args()[0], times(g, p.args()[1]), times(g, p.args()[2]));
  if (g.kind() == Expr::Kind::call && g.intrinsic() == Intrinsic::select)
    return sel(g.args()[0], times(g.args()[1], p), times(g.args()[2], p));
  return mul(g, p);
}

void backprop(const Expr& e, const Expr& g, std::map<std::string, Expr>& contributions) {
  std::vector<std::string> leaves;
  e.collect_tensors(leaves);
  for (const std::string& x : std::set<std::string>(leaves.begin(), leaves.end())) {
    std::optional<Expr> d = tangent(e, [&](const std::string& t) { return t == x ? std::optional<Expr>(lit(1)) : std::nullopt; });
    if (!d) continue;
    Expr part = times(g, *d);
    auto [it, fresh] = contributions.emplace(x, part);
    if (!fresh) it->second = bin(BinaryOp::add, it->second, part);
  }
}

std::optional<Expr> tangent(const Expr& e, const std::function<std::optional<Expr>(const std::string&)>& tangent_of) {
  if (e.kind() == Expr::Kind::tensor) return tangent_of(e.name());
  std::optional<Expr> total;
  for (size_t i = 0; i < e.args().size(); ++i) {
    std::optional<Expr> t = tangent(e.args()[i], tangent_of);
    if (!t) continue;
    std::optional<Expr> p = partial(e, i);
    if (!p) continue;
    Expr term = times(*t, *p);
    total = total ? bin(BinaryOp::add, *total, term) : term;
  }
  return total;
}

}  // namespace polytile::ad
