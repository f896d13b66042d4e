// Value semantics, constant folding and deterministic printing of the Tile IR nodes declared in ir.h.
#include "polytile/ir.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <set>

#include "polytile/error.h"

namespace polytile {

// ----------------------------------------------------------------------------------------------------
// DType

std::string to_string(DType t) {
  switch (t) {
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  POLYTILE_CHECK(false, "bad dtype");
}

std::optional<DType> parse_dtype(const std::string& s) {
  for (DType t : kDTypes)
    if (s == to_string(t)) return t;
  return std::nullopt;
}

std::string dtype_list() {
  std::string names;
  for (DType t : kDTypes) names += (names.empty() ? "" : ", ") + to_string(t);
  return names;
}

static int dtype_rank(DType t) {
  switch (t) {
    case DType::boolean: return 0;
    case DType::i32: return 1;
    case DType::i64: return 2;
    case DType::f16: return 3;
    case DType::f32: return 4;
    case DType::f64: return 5;
  }
  return 0;
}

DType promote(DType a, DType b) { return dtype_rank(a) >= dtype_rank(b) ? a : b; }
bool is_float(DType t) { return t == DType::f16 || t == DType::f32 || t == DType::f64; }
bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }
size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16: return 2;
    case DType::boolean: return 1;
  }
  return 1;
}

// ----------------------------------------------------------------------------------------------------
// Rational

namespace {
int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) user_error("integer overflow in index arithmetic (", a, " + ", b, ")");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) user_error("integer overflow in index arithmetic (", a, " * ", b, ")");
  return r;
}
int64_t checked_neg(int64_t a) { return checked_mul(a, -1); }
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
}  // namespace

Rational::Rational(int64_t n, int64_t d) {
  if (d == 0) user_error("division by zero in an index expression");
  if (d < 0) {
    n = checked_neg(n);
    d = checked_neg(d);
  }
  int64_t g = std::gcd(n, d);
  if (g == 0) g = 1;
  num_ = n / g;
  den_ = d / g;
}

Rational Rational::operator+(const Rational& o) const {
  int64_t g = std::gcd(den_, o.den_);
  int64_t l = checked_mul(den_ / g, o.den_);
  return Rational(checked_add(checked_mul(num_, l / den_), checked_mul(o.num_, l / o.den_)), l);
}
Rational Rational::operator-(const Rational& o) const { return *this + (-o); }
Rational Rational::operator*(const Rational& o) const {
  int64_t g1 = std::gcd(num_, o.den_), g2 = std::gcd(o.num_, den_);
  if (g1 == 0) g1 = 1;
  if (g2 == 0) g2 = 1;
  return Rational(checked_mul(num_ / g1, o.num_ / g2), checked_mul(den_ / g2, o.den_ / g1));
}
Rational Rational::operator/(const Rational& o) const {
  if (o.num_ == 0) user_error("division by zero in an index expression");
  return *this * Rational(o.den_, o.num_);
}
Rational Rational::operator-() const { return Rational(checked_neg(num_), den_); }
bool Rational::operator<(const Rational& o) const {
  return static_cast<__int128>(num_) * o.den_ < static_cast<__int128>(o.num_) * den_;
}
std::string Rational::str() const {
  return den_ == 1 ? std::to_string(num_) : std::to_string(num_) + "/" + std::to_string(den_);
}

// ----------------------------------------------------------------------------------------------------
// DimExpr

struct DimExpr::Node {
  Kind kind;
  int64_t value = 0;
  std::string name;
  DimExpr a, b;
};

DimExpr::DimExpr(int64_t value) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::constant;
  n->value = value;
  node_ = n;
}

DimExpr DimExpr::symbol(const std::string& name) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::symbol;
  n->name = name;
  DimExpr e;
  e.node_ = n;
  return e;
}

DimExpr DimExpr::binary(Kind k, const DimExpr& a, const DimExpr& b) {
  POLYTILE_CHECK(!a.is_null() && (k == Kind::neg || !b.is_null()), "null DimExpr operand");
  if (k == Kind::neg) {
    if (a.is_constant()) return DimExpr(checked_neg(a.value()));
    if (a.kind() == Kind::neg) return a.lhs();
  } else if (a.is_constant() && b.is_constant()) {
    int64_t x = a.value(), y = b.value();
    switch (k) {
      case Kind::add: return DimExpr(checked_add(x, y));
      case Kind::sub: return DimExpr(checked_add(x, checked_neg(y)));
      case Kind::mul: return DimExpr(checked_mul(x, y));
      case Kind::div:
        if (y == 0) user_error("division by zero in dim expression ", x, "/0");
        return DimExpr(floor_div(x, y));
      case Kind::max: return DimExpr(std::max(x, y));
      case Kind::min: return DimExpr(std::min(x, y));
      default: break;
    }
  } else if (k == Kind::div && b.is_constant() && b.value() == 0) {
    user_error("division by zero in dim expression (", a.str(), ")/0");
  } else if (k == Kind::mul && ((a.is_constant() && a.value() == -1) || (b.is_constant() && b.value() == -1))) {
    // One form for a negation, whichever way it was written (-X, -1*X, X*-1): printing is stable.
    return binary(Kind::neg, a.is_constant() ? b : a, DimExpr());
  } else if ((k == Kind::add || k == Kind::sub) && b.kind() == Kind::neg) {
    if (a.is_constant() && a.value() == 0) return k == Kind::add ? b : b.lhs();
    return binary(k == Kind::add ? Kind::sub : Kind::add, a, b.lhs());
  } else if (k == Kind::sub && a.is_constant() && a.value() == 0) {
    return binary(Kind::neg, b, DimExpr());
  } else if ((k == Kind::add || k == Kind::sub) && (b.kind() == Kind::add || b.kind() == Kind::sub)) {
    // Left-associate sums: a + (b - c) == (a + b) - c, a - (b + c) == (a - b) - c, ...
    Kind outer = (k == Kind::add) == (b.kind() == Kind::add) ? Kind::add : Kind::sub;
    return binary(outer, binary(k, a, b.lhs()), b.rhs());
  } else if (k == Kind::mul && b.kind() == Kind::mul) {
    return binary(Kind::mul, binary(Kind::mul, a, b.lhs()), b.rhs());
  } else if (b.is_constant()) {
    int64_t y = b.value();
    if ((k == Kind::add || k == Kind::sub) && (a.kind() == Kind::add || a.kind() == Kind::sub) &&
        a.rhs().is_constant()) {
      // Merge constants: (x + c1) - c2 == x + (c1 - c2).
      int64_t c = checked_add(a.kind() == Kind::add ? a.rhs().value() : checked_neg(a.rhs().value()),
                              k == Kind::add ? y : checked_neg(y));
      return binary(Kind::add, a.lhs(), DimExpr(c));
    }
    if ((k == Kind::add || k == Kind::sub) && y == 0) return a;
    if ((k == Kind::mul || k == Kind::div) && y == 1) return a;
    if (k == Kind::add && y < 0) return binary(Kind::sub, a, DimExpr(checked_neg(y)));
    if (k == Kind::sub && y < 0) return binary(Kind::add, a, DimExpr(checked_neg(y)));
  } else if (a.is_constant()) {
    if (k == Kind::add && a.value() == 0) return b;
    if (k == Kind::mul && a.value() == 1) return b;
  }
  auto n = std::make_shared<Node>();
  n->kind = k;
  n->a = a;
  n->b = b;
  DimExpr e;
  e.node_ = n;
  return e;
}

DimExpr::Kind DimExpr::kind() const {
  POLYTILE_CHECK(node_, "null DimExpr");
  return node_->kind;
}
int64_t DimExpr::value() const {
  POLYTILE_CHECK(kind() == Kind::constant);
  return node_->value;
}
const std::string& DimExpr::name() const {
  POLYTILE_CHECK(kind() == Kind::symbol);
  return node_->name;
}
const DimExpr& DimExpr::lhs() const {
  POLYTILE_CHECK(node_ && !node_->a.is_null());
  return node_->a;
}
const DimExpr& DimExpr::rhs() const {
  POLYTILE_CHECK(node_ && !node_->b.is_null());
  return node_->b;
}

int64_t DimExpr::evaluate(const std::map<std::string, int64_t>& dims) const {
  switch (kind()) {
    case Kind::constant: return value();
    case Kind::symbol: {
      auto it = dims.find(name());
      if (it == dims.end()) user_error("dim ", name(), " is not bound");
      return it->second;
    }
    case Kind::neg: return checked_neg(lhs().evaluate(dims));
    default: break;
  }
  int64_t x = lhs().evaluate(dims), y = rhs().evaluate(dims);
  switch (kind()) {
    case Kind::add: return checked_add(x, y);
    case Kind::sub: return checked_add(x, checked_neg(y));
    case Kind::mul: return checked_mul(x, y);
    case Kind::div:
      if (y == 0) user_error("division by zero evaluating dim expression ", str());
      return floor_div(x, y);
    case Kind::max: return std::max(x, y);
    case Kind::min: return std::min(x, y);
    default: break;
  }
  POLYTILE_CHECK(false, "bad DimExpr kind");
}

void DimExpr::collect_symbols(std::vector<std::string>& out) const {
  switch (kind()) {
    case Kind::constant: return;
    case Kind::symbol:
      if (std::find(out.begin(), out.end(), name()) == out.end()) out.push_back(name());
      return;
    case Kind::neg: lhs().collect_symbols(out); return;
    default:
      lhs().collect_symbols(out);
      rhs().collect_symbols(out);
  }
}

DimExpr DimExpr::substitute(const std::map<std::string, DimExpr>& subst) const {
  switch (kind()) {
    case Kind::constant: return *this;
    case Kind::symbol: {
      auto it = subst.find(name());
      return it == subst.end() ? *this : it->second;
    }
    case Kind::neg: return -lhs().substitute(subst);
    default: return binary(kind(), lhs().substitute(subst), rhs().substitute(subst));
  }
}

namespace {
int dim_precedence(const DimExpr& e, bool div_as_call) {
  switch (e.kind()) {
    case DimExpr::Kind::add:
    case DimExpr::Kind::sub: return 1;
    case DimExpr::Kind::mul: return 2;
    case DimExpr::Kind::div: return div_as_call ? 4 : 2;
    case DimExpr::Kind::neg: return 3;
    case DimExpr::Kind::constant: return e.value() < 0 ? 3 : 4;
    default: return 4;
  }
}

// Shape-context text, where `/` is floor division; with `div_as_call`, floor divisions print as div(a, b),
// the form an index expression reads back as a floor division (there `/` is rational).
std::string dim_text(const DimExpr& e, bool div_as_call) {
  using K = DimExpr::Kind;
  auto operand = [div_as_call](const DimExpr& x, int min_prec) {
    std::string s = dim_text(x, div_as_call);
    return dim_precedence(x, div_as_call) < min_prec ? "(" + s + ")" : s;
  };
  switch (e.kind()) {
    case K::constant: return std::to_string(e.value());
    case K::symbol: return e.name();
    case K::neg: return "-" + operand(e.lhs(), 3);
    case K::max: return "max(" + e.lhs().str() + ", " + e.rhs().str() + ")";
    case K::min: return "min(" + e.lhs().str() + ", " + e.rhs().str() + ")";
    case K::div:
      if (div_as_call) return "div(" + e.lhs().str() + ", " + e.rhs().str() + ")";
      break;
    default: break;
  }
  int p = dim_precedence(e, div_as_call);
  const char* op = e.kind() == K::add ? " + " : e.kind() == K::sub ? " - " : e.kind() == K::mul ? "*" : "/";
  return operand(e.lhs(), p) + op + operand(e.rhs(), p + 1);
}
}  // namespace

std::string DimExpr::str() const {
  if (is_null()) return "<null>";
  return dim_text(*this, false);
}

bool DimExpr::operator==(const DimExpr& o) const {
  if (is_null() || o.is_null()) return is_null() == o.is_null();
  if (kind() != o.kind()) return false;
  switch (kind()) {
    case Kind::constant: return value() == o.value();
    case Kind::symbol: return name() == o.name();
    case Kind::neg: return lhs() == o.lhs();
    default: return lhs() == o.lhs() && rhs() == o.rhs();
  }
}

DimExpr operator+(const DimExpr& a, const DimExpr& b) { return DimExpr::binary(DimExpr::Kind::add, a, b); }
DimExpr operator-(const DimExpr& a, const DimExpr& b) { return DimExpr::binary(DimExpr::Kind::sub, a, b); }
DimExpr operator*(const DimExpr& a, const DimExpr& b) { return DimExpr::binary(DimExpr::Kind::mul, a, b); }
DimExpr operator/(const DimExpr& a, const DimExpr& b) { return DimExpr::binary(DimExpr::Kind::div, a, b); }
DimExpr operator-(const DimExpr& a) { return DimExpr::binary(DimExpr::Kind::neg, a, DimExpr()); }
DimExpr max(const DimExpr& a, const DimExpr& b) { return DimExpr::binary(DimExpr::Kind::max, a, b); }
DimExpr min(const DimExpr& a, const DimExpr& b) { return DimExpr::binary(DimExpr::Kind::min, a, b); }

// ----------------------------------------------------------------------------------------------------
// Polynomial

namespace {
template <typename Map, typename Key>
void add_term(Map& m, const Key& k, const Rational& c) {
  auto it = m.find(k);
  if (it == m.end()) {
    if (!c.is_zero()) m.emplace(k, c);
    return;
  }
  it->second = it->second + c;
  if (it->second.is_zero()) m.erase(it);
}

bool product_of_atoms(const DimExpr& d) {
  switch (d.kind()) {
    case DimExpr::Kind::symbol:
    case DimExpr::Kind::constant:
    case DimExpr::Kind::max:
    case DimExpr::Kind::min: return true;
    case DimExpr::Kind::neg: return product_of_atoms(d.lhs());
    case DimExpr::Kind::mul: return product_of_atoms(d.lhs()) && product_of_atoms(d.rhs());
    default: return false;
  }
}

std::string atom_text(const DimExpr& d) {
  switch (d.kind()) {
    case DimExpr::Kind::symbol: return d.name();
    case DimExpr::Kind::div: return "div(" + d.lhs().str() + ", " + d.rhs().str() + ")";
    case DimExpr::Kind::max:
    case DimExpr::Kind::min: return d.str();
    // A product of symbols and calls reads back as written: (N*M), (K1*-X1). A product with a sum or a
    // floor division among its factors would come back distributed or rational in an index expression,
    // which reads `div(X, 1)` as the dim expression X node for node (div's arguments are dims).
    default: return product_of_atoms(d) ? "(" + dim_text(d, /*div_as_call=*/true) + ")" : "div(" + d.str() + ", 1)";
  }
}
}  // namespace

Polynomial Polynomial::index(const std::string& name) {
  Polynomial p;
  p.index_terms_.emplace(name, Rational(1));
  return p;
}

Polynomial Polynomial::dim(const DimExpr& d) {
  using K = DimExpr::Kind;
  switch (d.kind()) {
    case K::constant: return Polynomial(Rational(d.value()));
    case K::add: return dim(d.lhs()) + dim(d.rhs());
    case K::sub: return dim(d.lhs()) - dim(d.rhs());
    case K::neg: return -dim(d.lhs());
    case K::mul:
      if (d.lhs().is_constant()) return dim(d.rhs()) * Rational(d.lhs().value());
      if (d.rhs().is_constant()) return dim(d.lhs()) * Rational(d.rhs().value());
      break;
    default: break;
  }
  Polynomial p;
  p.dim_terms_.emplace(atom_text(d), std::make_pair(d, Rational(1)));
  return p;
}

Polynomial Polynomial::operator+(const Polynomial& o) const {
  Polynomial r = *this;
  for (const auto& [k, c] : o.index_terms_) add_term(r.index_terms_, k, c);
  for (const auto& [k, t] : o.dim_terms_) {
    auto it = r.dim_terms_.find(k);
    if (it == r.dim_terms_.end()) {
      r.dim_terms_.emplace(k, t);
    } else {
      it->second.second = it->second.second + t.second;
      if (it->second.second.is_zero()) r.dim_terms_.erase(it);
    }
  }
  r.constant_ = r.constant_ + o.constant_;
  return r;
}

Polynomial Polynomial::operator-(const Polynomial& o) const { return *this + (-o); }

Polynomial Polynomial::operator*(const Rational& s) const {
  Polynomial r;
  if (s.is_zero()) return r;
  for (const auto& [k, c] : index_terms_) r.index_terms_.emplace(k, c * s);
  for (const auto& [k, t] : dim_terms_) r.dim_terms_.emplace(k, std::make_pair(t.first, t.second * s));
  r.constant_ = constant_ * s;
  return r;
}

std::optional<std::string> Polynomial::variable() const {
  if (index_terms_.size() != 1 || !dim_terms_.empty() || constant_ != Rational(0) || index_terms_.begin()->second != Rational(1))
    return std::nullopt;
  return index_terms_.begin()->first;
}

Rational Polynomial::coefficient(const std::string& index) const {
  auto it = index_terms_.find(index);
  return it == index_terms_.end() ? Rational(0) : it->second;
}

std::optional<DimExpr> Polynomial::dims_as_expr() const {
  if (!index_terms_.empty() || !constant_.is_integer()) return std::nullopt;
  DimExpr e(0);
  for (const auto& [k, t] : dim_terms_) {
    if (!t.second.is_integer()) return std::nullopt;
    e = e + DimExpr(t.second.num()) * t.first;
  }
  return e + DimExpr(constant_.num());
}

Polynomial Polynomial::bind_dims(const std::map<std::string, int64_t>& dims) const {
  Polynomial r;
  r.index_terms_ = index_terms_;
  r.constant_ = constant_;
  for (const auto& [k, t] : dim_terms_) r.constant_ = r.constant_ + t.second * Rational(t.first.evaluate(dims));
  return r;
}

Polynomial Polynomial::rename_indices(const std::map<std::string, std::string>& renames) const {
  Polynomial r;
  r.dim_terms_ = dim_terms_;
  r.constant_ = constant_;
  for (const auto& [k, c] : index_terms_) {
    auto it = renames.find(k);
    add_term(r.index_terms_, it == renames.end() ? k : it->second, c);
  }
  return r;
}

Polynomial Polynomial::substitute_dims(const std::map<std::string, DimExpr>& subst) const {
  Polynomial r;
  r.index_terms_ = index_terms_;
  r.constant_ = constant_;
  for (const auto& [k, t] : dim_terms_) r = r + dim(t.first.substitute(subst)) * t.second;
  return r;
}

void Polynomial::collect_dim_symbols(std::vector<std::string>& out) const {
  for (const auto& [k, t] : dim_terms_) t.first.collect_symbols(out);
}

std::string Polynomial::str() const {
  std::string s;
  auto append = [&s](const Rational& c, const std::string& atom) {
    bool neg = c < Rational(0);
    Rational a = neg ? -c : c;
    std::string body = atom.empty() ? a.str() : (a == Rational(1) ? atom : a.str() + "*" + atom);
    if (s.empty()) {
      s = (neg ? "-" : "") + body;
    } else {
      s += (neg ? " - " : " + ") + body;
    }
  };
  for (const auto& [k, c] : index_terms_) append(c, k);
  for (const auto& [k, t] : dim_terms_) append(t.second, k);
  if (!constant_.is_zero() || s.empty()) append(constant_, "");
  return s;
}

bool Polynomial::operator==(const Polynomial& o) const {
  if (index_terms_ != o.index_terms_ || !(constant_ == o.constant_)) return false;
  if (dim_terms_.size() != o.dim_terms_.size()) return false;
  for (const auto& [k, t] : dim_terms_) {
    auto it = o.dim_terms_.find(k);
    if (it == o.dim_terms_.end() || !(it->second.second == t.second)) return false;
  }
  return true;
}

// ----------------------------------------------------------------------------------------------------
// Expr

struct Expr::Node {
  Kind kind;
  std::string name;
  double value = 0;
  bool is_integer = false;
  UnaryOp unary = UnaryOp::neg;
  BinaryOp binary = BinaryOp::add;
  Intrinsic fn = Intrinsic::ident;
  DType cast_to = DType::f32;
  std::vector<Expr> args;
};

namespace {
struct IntrinsicInfo {
  Intrinsic fn;
  const char* name;
  int arity;
};
constexpr IntrinsicInfo kIntrinsics[] = {
    {Intrinsic::abs, "abs", 1},     {Intrinsic::sign, "sign", 1},     {Intrinsic::exp, "exp", 1},
    {Intrinsic::log, "log", 1},     {Intrinsic::sqrt, "sqrt", 1},     {Intrinsic::pow, "pow", 2},
    {Intrinsic::sin, "sin", 1},     {Intrinsic::cos, "cos", 1},       {Intrinsic::tan, "tan", 1},
    {Intrinsic::asin, "asin", 1},   {Intrinsic::acos, "acos", 1},     {Intrinsic::atan, "atan", 1},
    {Intrinsic::sinh, "sinh", 1},   {Intrinsic::cosh, "cosh", 1},     {Intrinsic::tanh, "tanh", 1},
    {Intrinsic::erf, "erf", 1},     {Intrinsic::sigmoid, "sigmoid", 1}, {Intrinsic::relu, "relu", 1},
    {Intrinsic::floor, "floor", 1}, {Intrinsic::ceil, "ceil", 1},     {Intrinsic::round, "round", 1},
    {Intrinsic::max, "max", 2},     {Intrinsic::min, "min", 2},       {Intrinsic::ident, "ident", 1},
    {Intrinsic::select, "select", 3}, {Intrinsic::cast, "cast", 1},
};
const IntrinsicInfo& info(Intrinsic fn) {
  for (const auto& i : kIntrinsics)
    if (i.fn == fn) return i;
  POLYTILE_CHECK(false, "unknown intrinsic");
}

int expr_precedence(const Expr& e) {
  switch (e.kind()) {
    case Expr::Kind::binary:
      switch (e.binary_op()) {
        case BinaryOp::logical_or: return 1;
        case BinaryOp::logical_and: return 2;
        case BinaryOp::eq:
        case BinaryOp::ne: return 3;
        case BinaryOp::lt:
        case BinaryOp::gt:
        case BinaryOp::le:
        case BinaryOp::ge: return 4;
        case BinaryOp::add:
        case BinaryOp::sub: return 5;
        default: return 6;
      }
    case Expr::Kind::unary: return 7;
    case Expr::Kind::literal: return e.value() < 0 || std::signbit(e.value()) ? 7 : 8;
    default: return 8;
  }
}

std::string format_literal(double v, bool is_integer) {
  if (is_integer) return std::to_string(static_cast<long long>(v));
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a float literal when re-parsed
  return s;
}
}  // namespace

std::string to_string(UnaryOp op) { return op == UnaryOp::neg ? "-" : "!"; }
std::string to_string(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "+";
    case BinaryOp::sub: return "-";
    case BinaryOp::mul: return "*";
    case BinaryOp::div: return "/";
    case BinaryOp::mod: return "%";
    case BinaryOp::eq: return "==";
    case BinaryOp::ne: return "!=";
    case BinaryOp::lt: return "<";
    case BinaryOp::gt: return ">";
    case BinaryOp::le: return "<=";
    case BinaryOp::ge: return ">=";
    case BinaryOp::logical_and: return "&&";
    case BinaryOp::logical_or: return "||";
  }
  POLYTILE_CHECK(false, "bad binary op");
}
std::string to_string(Intrinsic fn) { return info(fn).name; }
std::optional<Intrinsic> parse_intrinsic(const std::string& name) {
  for (const auto& i : kIntrinsics)
    if (name == i.name) return i.fn;
  return std::nullopt;
}
int intrinsic_arity(Intrinsic fn) { return info(fn).arity; }

Expr Expr::tensor(const std::string& name) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::tensor;
  n->name = name;
  Expr e;
  e.node_ = n;
  return e;
}
Expr Expr::literal(double value, bool is_integer) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::literal;
  n->value = value;
  n->is_integer = is_integer;
  Expr e;
  e.node_ = n;
  return e;
}
Expr Expr::dim(const std::string& name) {
  Expr e = tensor(name);
  std::const_pointer_cast<Node>(e.node_)->kind = Kind::dim;
  return e;
}
Expr Expr::unary(UnaryOp op, const Expr& a) {
  POLYTILE_CHECK(!a.is_null());
  if (op == UnaryOp::neg && a.kind() == Kind::literal) return literal(-a.value(), a.literal_is_integer());
  auto n = std::make_shared<Node>();
  n->kind = Kind::unary;
  n->unary = op;
  n->args = {a};
  Expr e;
  e.node_ = n;
  return e;
}
Expr Expr::binary(BinaryOp op, const Expr& a, const Expr& b) {
  POLYTILE_CHECK(!a.is_null() && !b.is_null());
  auto n = std::make_shared<Node>();
  n->kind = Kind::binary;
  n->binary = op;
  n->args = {a, b};
  Expr e;
  e.node_ = n;
  return e;
}
Expr Expr::call(Intrinsic fn, std::vector<Expr> args, DType cast_to) {
  if (static_cast<int>(args.size()) != intrinsic_arity(fn))
    user_error("intrinsic ", to_string(fn), " takes ", intrinsic_arity(fn), " argument(s), got ", args.size());
  auto n = std::make_shared<Node>();
  n->kind = Kind::call;
  n->fn = fn;
  n->cast_to = cast_to;
  n->args = std::move(args);
  Expr e;
  e.node_ = n;
  return e;
}

Expr::Kind Expr::kind() const {
  POLYTILE_CHECK(node_, "null Expr");
  return node_->kind;
}
const std::string& Expr::name() const {
  POLYTILE_CHECK(kind() == Kind::tensor || kind() == Kind::dim);
  return node_->name;
}
double Expr::value() const {
  POLYTILE_CHECK(kind() == Kind::literal);
  return node_->value;
}
bool Expr::literal_is_integer() const {
  POLYTILE_CHECK(kind() == Kind::literal);
  return node_->is_integer;
}
UnaryOp Expr::unary_op() const {
  POLYTILE_CHECK(kind() == Kind::unary);
  return node_->unary;
}
BinaryOp Expr::binary_op() const {
  POLYTILE_CHECK(kind() == Kind::binary);
  return node_->binary;
}
Intrinsic Expr::intrinsic() const {
  POLYTILE_CHECK(kind() == Kind::call);
  return node_->fn;
}
DType Expr::cast_type() const {
  POLYTILE_CHECK(kind() == Kind::call && node_->fn == Intrinsic::cast);
  return node_->cast_to;
}
const std::vector<Expr>& Expr::args() const {
  POLYTILE_CHECK(node_);
  return node_->args;
}

void Expr::collect_tensors(std::vector<std::string>& out) const {
  if (kind() == Kind::tensor) {
    if (std::find(out.begin(), out.end(), name()) == out.end()) out.push_back(name());
    return;
  }
  for (const auto& a : args()) a.collect_tensors(out);
}

Expr Expr::replace_leaves(const std::function<std::optional<Expr>(const Expr& leaf)>& fn) const {
  switch (kind()) {
    case Kind::tensor:
    case Kind::dim: {
      std::optional<Expr> r = fn(*this);
      return r ? *r : *this;
    }
    case Kind::literal: return *this;
    case Kind::unary: return unary(unary_op(), args()[0].replace_leaves(fn));
    case Kind::binary: return binary(binary_op(), args()[0].replace_leaves(fn), args()[1].replace_leaves(fn));
    case Kind::call: {
      std::vector<Expr> a;
      for (const auto& x : args()) a.push_back(x.replace_leaves(fn));
      return call(intrinsic(), std::move(a), node_->cast_to);
    }
  }
  POLYTILE_CHECK(false, "bad Expr kind");
}

std::string Expr::str() const {
  auto operand = [](const Expr& e, int min_prec) {
    std::string s = e.str();
    return expr_precedence(e) < min_prec ? "(" + s + ")" : s;
  };
  switch (kind()) {
    case Kind::tensor:
    case Kind::dim: return name();
    case Kind::literal: return format_literal(value(), literal_is_integer());
    case Kind::unary: return to_string(unary_op()) + operand(args()[0], 7);
    case Kind::binary: {
      int p = expr_precedence(*this);
      return operand(args()[0], p) + " " + to_string(binary_op()) + " " + operand(args()[1], p + 1);
    }
    case Kind::call: {
      std::string s = to_string(intrinsic()) + "(";
      for (size_t i = 0; i < args().size(); ++i) s += (i ? ", " : "") + args()[i].str();
      if (intrinsic() == Intrinsic::cast) s += ", " + to_string(cast_type());
      return s + ")";
    }
  }
  POLYTILE_CHECK(false, "bad Expr kind");
}

// ----------------------------------------------------------------------------------------------------
// Statements

std::string to_string(AggregationOp op) {
  switch (op) {
    case AggregationOp::sum: return "sum";
    case AggregationOp::product: return "product";
    case AggregationOp::max: return "max";
    case AggregationOp::min: return "min";
    case AggregationOp::assign: return "assign";
  }
  POLYTILE_CHECK(false, "bad aggregation");
}
std::string to_string(CombinationOp op) {
  switch (op) {
    case CombinationOp::none: return "none";
    case CombinationOp::mul: return "mul";
    case CombinationOp::add: return "add";
    case CombinationOp::eq: return "eq";
    case CombinationOp::cond: return "cond";
  }
  POLYTILE_CHECK(false, "bad combination");
}
char aggregation_marker(AggregationOp op) {
  switch (op) {
    case AggregationOp::sum: return '+';
    case AggregationOp::product: return '*';
    case AggregationOp::max: return '>';
    case AggregationOp::min: return '<';
    case AggregationOp::assign: return '=';
  }
  POLYTILE_CHECK(false, "bad aggregation");
}
int combination_arity(CombinationOp op) {
  switch (op) {
    case CombinationOp::none: return 1;
    case CombinationOp::cond: return 3;
    default: return 2;
  }
}

static std::string join_polys(const std::vector<Polynomial>& ps) {
  std::string s;
  for (size_t i = 0; i < ps.size(); ++i) s += (i ? ", " : "") + ps[i].str();
  return s;
}

std::string TensorAccess::str() const { return tensor + "[" + join_polys(indices) + "]"; }
std::string Constraint::str() const { return poly.str() + " < " + bound.str(); }

std::vector<std::string> Contraction::index_variables() const {
  std::vector<std::string> vars;
  auto add = [&vars](const Polynomial& p) {
    for (const auto& [name, c] : p.index_terms())
      if (std::find(vars.begin(), vars.end(), name) == vars.end()) vars.push_back(name);
  };
  for (const auto& p : output_indices) add(p);
  for (const auto& a : inputs)
    for (const auto& p : a.indices) add(p);
  for (const auto& c : constraints) add(c.poly);
  return vars;
}

const std::string& statement_output(const Statement& s) {
  return std::visit([](const auto& st) -> const std::string& { return st.output; }, s);
}

std::string fresh_name(std::string base, std::set<std::string>& taken) {
  while (taken.count(base)) base += "_";
  taken.insert(base);
  return base;
}

std::set<std::string> tensor_names(const Program& p) {
  std::set<std::string> names;
  for (const auto& in : p.inputs) names.insert(in.name);
  for (const auto& st : p.statements) names.insert(statement_output(st));
  return names;
}

std::vector<std::string> statement_operands(const Statement& s) {
  std::vector<std::string> used;
  if (const auto* c = std::get_if<Contraction>(&s)) {
    for (const auto& a : c->inputs) used.push_back(a.tensor);
    if (c->init) used.push_back(*c->init);
  } else {
    std::get<Elementwise>(s).expr.collect_tensors(used);
  }
  return used;
}

std::string print(const Statement& statement) {
  if (const auto* e = std::get_if<Elementwise>(&statement)) return e->output + " = " + e->expr.str() + ";";
  const auto& c = std::get<Contraction>(statement);
  std::string s = c.output + "[" + join_polys(c.output_indices);
  if (!c.output_shape.empty()) {
    s += " : ";
    for (size_t i = 0; i < c.output_shape.size(); ++i) s += (i ? ", " : "") + c.output_shape[i].str();
  }
  s += "] = ";
  s += aggregation_marker(c.aggregation);
  s += "(";
  switch (c.combination) {
    case CombinationOp::none: s += c.inputs[0].str(); break;
    case CombinationOp::mul: s += c.inputs[0].str() + " * " + c.inputs[1].str(); break;
    case CombinationOp::add: s += c.inputs[0].str() + " + " + c.inputs[1].str(); break;
    case CombinationOp::eq: s += c.inputs[0].str() + " == " + c.inputs[1].str(); break;
    case CombinationOp::cond:
      s += c.inputs[0].str() + " == " + c.inputs[1].str() + " ? " + c.inputs[2].str();
      break;
  }
  s += ")";
  for (const auto& k : c.constraints) s += ", " + k.str();
  if (c.init) s += " default " + *c.init;
  return s + ";";
}

std::string print(const Program& program) {
  std::string s = "function ";
  if (!program.name.empty()) s += program.name + " ";
  s += "(";
  for (size_t i = 0; i < program.inputs.size(); ++i) {
    const auto& p = program.inputs[i];
    s += (i ? ", " : "") + p.name + "[";
    for (size_t d = 0; d < p.dims.size(); ++d) s += (d ? ", " : "") + p.dims[d].str();
    s += "]";
  }
  s += ") -> (";
  for (size_t i = 0; i < program.outputs.size(); ++i) s += (i ? ", " : "") + program.outputs[i];
  s += ") {\n";
  for (const auto& st : program.statements) s += "  " + print(st) + "\n";
  return s + "}\n";
}

// ----------------------------------------------------------------------------------------------------
// validate

void validate(const Program& program) {
  std::set<std::string> dims;
  std::map<std::string, size_t> rank;  // tensor -> rank
  auto require_dims = [&dims](const std::vector<std::string>& used, const std::string& where) {
    for (const auto& d : used)
      if (!dims.count(d)) user_error("dim ", d, " used in ", where, " is not bound by any input");
  };

  for (const auto& p : program.inputs) {
    if (rank.count(p.name)) user_error("input ", p.name, " is declared twice");
    rank[p.name] = p.dims.size();
    for (const auto& d : p.dims) {
      if (d.is_null()) user_error("input ", p.name, " has an unbound dim");
      if (d.kind() == DimExpr::Kind::symbol && !dims.count(d.name())) {
        dims.insert(d.name());
        continue;
      }
      std::vector<std::string> used;
      d.collect_symbols(used);
      require_dims(used, "the shape of input " + p.name);
    }
  }
  for (const auto& d : dims)
    if (rank.count(d)) user_error("name ", d, " is used both as a dim and as a tensor");

  auto define = [&](const std::string& name, size_t r) {
    if (dims.count(name)) user_error("tensor ", name, " has the name of a dim");
    if (rank.count(name)) user_error("tensor ", name, " is assigned more than once");
    rank[name] = r;
  };
  auto tensor_rank = [&rank](const std::string& name, const std::string& user) {
    auto it = rank.find(name);
    if (it == rank.end()) user_error("undefined tensor ", name, " used in ", user);
    return it->second;
  };

  for (const auto& st : program.statements) {
    if (const auto* e = std::get_if<Elementwise>(&st)) {
      std::vector<std::string> used;
      e->expr.collect_tensors(used);
      size_t r = 0;
      for (const auto& t : used) r = std::max(r, tensor_rank(t, e->output));
      // Dims used as values.
      std::vector<Expr> stack{e->expr};
      while (!stack.empty()) {
        Expr x = stack.back();
        stack.pop_back();
        if (x.kind() == Expr::Kind::dim && !dims.count(x.name()))
          user_error("undefined name ", x.name(), " used in ", e->output);
        for (const auto& a : x.args()) stack.push_back(a);
      }
      define(e->output, r);
      continue;
    }
    const auto& c = std::get<Contraction>(st);
    const std::string where = "contraction " + c.output;
    if (c.output_indices.size() != c.output_shape.size())
      user_error(where, " has ", c.output_indices.size(), " output indices but ", c.output_shape.size(), " dims");
    if (static_cast<int>(c.inputs.size()) != combination_arity(c.combination))
      user_error(where, ": combination ", to_string(c.combination), " needs ", combination_arity(c.combination),
                 " input tensor(s), got ", c.inputs.size());
    std::vector<std::string> used;
    for (const auto& d : c.output_shape) d.collect_symbols(used);
    for (const auto& p : c.output_indices) p.collect_dim_symbols(used);
    for (const auto& a : c.inputs) {
      size_t r = tensor_rank(a.tensor, where);
      if (r != a.indices.size())
        user_error(where, ": tensor ", a.tensor, " has rank ", r, " but is indexed with ", a.indices.size(),
                   " index expression(s)");
      for (const auto& p : a.indices) p.collect_dim_symbols(used);
    }
    for (const auto& k : c.constraints) {
      k.bound.collect_symbols(used);
      k.poly.collect_dim_symbols(used);
    }
    require_dims(used, where);
    if (c.init) {
      size_t r = tensor_rank(*c.init, where);
      if (r > c.output_shape.size())
        user_error(where, ": default tensor ", *c.init, " has rank ", r, ", more than the output's ",
                   c.output_shape.size());
    }
    define(c.output, c.output_indices.size());
  }

  if (program.outputs.empty()) user_error("program ", program.name.empty() ? "" : program.name + " ", "has no outputs");
  std::set<std::string> seen;
  for (const auto& o : program.outputs) {
    if (!rank.count(o)) user_error("output ", o, " is never defined");
    if (!seen.insert(o).second) user_error("output ", o, " is listed twice");
  }
}

}  // namespace polytile
