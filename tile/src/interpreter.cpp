// Reference interpreter. Data model: every tensor is a Buffer; a contraction is lowered, once its dims are
// known, to integer "rows" -- one per index expression and per constraint -- each of the form
//     0 <= (sum_k a_k * x_k + a_0) / D < hi,
// where D is the common denominator of the row's rational coefficients; index-expression rows also
// require (sum_k a_k * x_k + a_0) to be divisible by D (an index must be an integer), constraint rows
// do not (the tutorial asks only 0 <= poly < bound of them). A point of the index variables x is valid
// iff every row holds (the valid-indices rule of the Tile tutorial). Rows are checked at the
// loop depth where their last variable is assigned, so invalid prefixes are pruned early.
#include "polytile/interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>

#include "polytile/error.h"
#include "polytile/shapes.h"

namespace polytile {
namespace {

using i128 = __int128;

// ------------------------------------------------------------------------------------------ contractions

struct Row {
  std::vector<int64_t> coeffs;  // per variable (integer numerators)
  int64_t constant = 0;
  int64_t denom = 1;
  int64_t hi = 0;               // exclusive upper bound of the row's value
  bool integral = true;         // the value must be an integer (index expressions, not constraints)
  int depth = -1;               // deepest variable used; -1 if constant
  std::string what;             // for messages
};

Row make_row(const Polynomial& p, const std::vector<std::string>& vars, int64_t hi, std::string what,
             bool integral = true) {
  Row r;
  r.hi = hi;
  r.integral = integral;
  r.what = std::move(what);
  // The common denominator and the scaled numerators must fit int64 (their sums are taken in 128 bits).
  auto checked_lcm = [&](int64_t a, int64_t b) {
    i128 l = static_cast<i128>(a) / std::gcd(a, b) * b;
    if (l > std::numeric_limits<int64_t>::max())
      user_error("the coefficients of ", r.what, " (", p.str(), ") have denominators too large for the reference interpreter");
    return static_cast<int64_t>(l);
  };
  int64_t d = p.constant().den();
  for (const auto& [name, c] : p.index_terms()) d = checked_lcm(d, c.den());
  r.denom = d;
  r.constant = (p.constant() * Rational(d)).num();
  r.coeffs.assign(vars.size(), 0);
  for (size_t k = 0; k < vars.size(); ++k) {
    Rational c = p.coefficient(vars[k]) * Rational(d);
    r.coeffs[k] = c.num();
    if (c.num() != 0) r.depth = static_cast<int>(k);
  }
  return r;
}

// Value of a row at x if it is valid, else nullopt-like flag.
inline bool row_value(const Row& r, const std::vector<int64_t>& x, int64_t& value) {
  i128 s = r.constant;
  for (size_t k = 0; k < r.coeffs.size(); ++k)
    if (r.coeffs[k]) s += static_cast<i128>(r.coeffs[k]) * x[k];
  if (!r.integral) return s >= 0 && s < static_cast<i128>(r.hi) * r.denom;
  if (s % r.denom != 0) return false;
  s /= r.denom;
  if (s < 0 || s >= r.hi) return false;
  value = static_cast<int64_t>(s);
  return true;
}

i128 floor_div128(i128 a, i128 b) {
  i128 q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
i128 ceil_div128(i128 a, i128 b) { return -floor_div128(-a, b); }

constexpr i128 kInf = static_cast<i128>(1) << 100;

// Interval propagation: tightens [lo, hi] of every variable from the rows until a fixpoint.
// Returns false when some interval becomes empty (no valid point).
bool propagate_bounds(const std::vector<Row>& rows, std::vector<i128>& lo, std::vector<i128>& hi) {
  for (int round = 0; round < 64; ++round) {
    bool changed = false;
    for (const Row& r : rows) {
      // denom*0 - c <= sum a_k x_k <= denom*(hi-1) - c
      i128 L = -static_cast<i128>(r.constant);
      i128 U = (r.integral ? static_cast<i128>(r.denom) * (r.hi - 1) : static_cast<i128>(r.denom) * r.hi - 1) -
               r.constant;
      for (size_t j = 0; j < r.coeffs.size(); ++j) {
        if (!r.coeffs[j]) continue;
        i128 rest_min = 0, rest_max = 0;
        bool bounded = true;
        for (size_t k = 0; k < r.coeffs.size() && bounded; ++k) {
          if (k == j || !r.coeffs[k]) continue;
          if (lo[k] <= -kInf || hi[k] >= kInf) {
            bounded = false;
            break;
          }
          i128 a = static_cast<i128>(r.coeffs[k]) * lo[k], b = static_cast<i128>(r.coeffs[k]) * hi[k];
          rest_min += std::min(a, b);
          rest_max += std::max(a, b);
        }
        if (!bounded) continue;
        i128 a = r.coeffs[j];
        i128 nlo, nhi;
        if (a > 0) {
          nlo = ceil_div128(L - rest_max, a);
          nhi = floor_div128(U - rest_min, a);
        } else {
          nlo = ceil_div128(U - rest_min, a);
          nhi = floor_div128(L - rest_max, a);
        }
        if (nlo > lo[j]) {
          lo[j] = nlo;
          changed = true;
        }
        if (nhi < hi[j]) {
          hi[j] = nhi;
          changed = true;
        }
        if (lo[j] > hi[j]) return false;
      }
    }
    if (!changed) break;
  }
  return true;
}

// Exact bounds by Fourier-Motzkin elimination, for variables that interval propagation leaves unbounded
// (i and j of `A[i - j], i + j < 2` are each bounded only by the two rows together). Every row gives two
// integer inequalities a.x + b >= 0; eliminating every other variable projects the rational polyhedron
// onto one variable, whose bounds contain every integer point (tightened by integer rounding after each
// division by the coefficients' gcd). Returns false when the rows have no point at all.
struct Inequality {
  std::vector<i128> a;
  i128 b = 0;
  bool operator<(const Inequality& o) const { return std::tie(a, b) < std::tie(o.a, o.b); }
};

i128 abs128(i128 v) { return v < 0 ? -v : v; }
i128 gcd128(i128 a, i128 b) {
  a = abs128(a);
  b = abs128(b);
  while (b != 0) {
    i128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// Divides by the gcd of the variable coefficients, rounding the constant down (valid for integer x).
// False when an inequality with no variables is violated.
bool normalize(Inequality& q) {
  i128 g = 0;
  for (i128 c : q.a) g = gcd128(g, c);
  if (g == 0) return q.b >= 0;
  for (i128& c : q.a) c /= g;
  q.b = floor_div128(q.b, g);
  return true;
}

bool eliminate_bounds(const std::vector<Row>& rows, size_t target, const std::string& output, i128& lo, i128& hi) {
  constexpr size_t kMaxInequalities = 20000;
  constexpr i128 kMaxCoefficient = static_cast<i128>(1) << 100;
  std::set<Inequality> current;
  auto insert = [&](Inequality q) {
    if (!normalize(q)) return false;
    bool has_vars = std::any_of(q.a.begin(), q.a.end(), [](i128 c) { return c != 0; });
    if (has_vars) current.insert(std::move(q));
    return true;
  };
  for (const Row& r : rows) {
    Inequality low, high;  // s >= 0 and U - s >= 0, with s = coeffs.x + constant
    i128 U = r.integral ? static_cast<i128>(r.denom) * (r.hi - 1) : static_cast<i128>(r.denom) * r.hi - 1;
    for (int64_t c : r.coeffs) {
      low.a.push_back(c);
      high.a.push_back(-static_cast<i128>(c));
    }
    low.b = r.constant;
    high.b = U - r.constant;
    if (!insert(low) || !insert(high)) return false;
  }
  const size_t n = rows.empty() ? 0 : rows[0].coeffs.size();
  std::vector<bool> gone(n, false);
  gone[target] = true;  // kept, not eliminated
  for (size_t step = 0; step + 1 < n; ++step) {
    // The variable whose elimination makes the fewest new inequalities.
    size_t best = n;
    size_t best_cost = 0;
    for (size_t k = 0; k < n; ++k) {
      if (gone[k]) continue;
      size_t pos = 0, neg = 0;
      for (const auto& q : current) {
        if (q.a[k] > 0) ++pos;
        if (q.a[k] < 0) ++neg;
      }
      size_t cost = pos * neg;
      if (best == n || cost < best_cost) {
        best = k;
        best_cost = cost;
      }
    }
    gone[best] = true;
    std::vector<Inequality> pos, neg;
    std::set<Inequality> next;
    for (const auto& q : current) {
      if (q.a[best] > 0) pos.push_back(q);
      else if (q.a[best] < 0) neg.push_back(q);
      else next.insert(q);
    }
    current.swap(next);
    for (const auto& p : pos)
      for (const auto& q : neg) {
        Inequality c;
        i128 fp = -q.a[best], fq = p.a[best];
        c.a.resize(n);
        for (size_t k = 0; k < n; ++k) {
          c.a[k] = p.a[k] * fp + q.a[k] * fq;
          if (abs128(c.a[k]) > kMaxCoefficient)
            user_error("contraction ", output, " has bounds too complex for the reference interpreter");
        }
        c.b = p.b * fp + q.b * fq;
        if (!insert(std::move(c))) return false;
        if (current.size() > kMaxInequalities)
          user_error("contraction ", output, " has bounds too complex for the reference interpreter");
      }
  }
  for (const auto& q : current) {
    i128 a = q.a[target];
    if (a > 0) lo = std::max(lo, ceil_div128(-q.b, a));
    if (a < 0) hi = std::min(hi, floor_div128(q.b, -a));
  }
  return lo <= hi;
}

// Values. Num holds every value of every dtype exactly: doubles (and so f16 and f32) and i64 alike (a long
// double has a 64-bit significand on the targets polytile builds for). Float arithmetic computes in double
// and rounds to the operation's dtype (f16 and f32 are then exactly IEEE: a double holds their sums,
// products and quotients well enough that rounding once more is exact); integer arithmetic computes in
// int64 and wraps to the dtype's width.
static_assert(std::numeric_limits<long double>::digits >= 64, "the interpreter holds i64 values in a long double");
using Num = long double;

int64_t wrap(DType t, int64_t v) { return t == DType::i32 ? static_cast<int32_t>(static_cast<uint32_t>(v)) : v; }

// buffer.h's round_to, exactly for every dtype.
Num round_num(DType t, Num v) {
  switch (t) {
    case DType::f64: return static_cast<double>(v);
    case DType::f32: return static_cast<float>(v);
    case DType::f16: return round_to(DType::f16, static_cast<double>(v));  // beyond 2^53, both give infinity
    case DType::boolean: return v != 0 ? 1 : 0;
    case DType::i32:
    case DType::i64: {
      // In int64's range the conversion is exact; beyond it a value is a double (integer arithmetic stays
      // in range), which buffer.h's round_to wraps modulo 2^64 (and inf and NaN make 0).
      const Num m = std::trunc(v);
      if (m >= -0x1p63L && m < 0x1p63L) return static_cast<Num>(wrap(t, static_cast<int64_t>(m)));
      return round_to(t, static_cast<double>(v));
    }
  }
  return 0;
}

Num load(const Buffer& b, int64_t flat) {
  return is_float(b.dtype()) ? static_cast<Num>(b.get(flat)) : static_cast<Num>(b.get_int(flat));
}

void store(Buffer& b, int64_t flat, Num v) {
  v = round_num(b.dtype(), v);
  if (is_float(b.dtype())) {
    b.set(flat, static_cast<double>(v));
  } else {
    b.set_int(flat, static_cast<int64_t>(v));
  }
}

// Integer operands are in their dtype's range (rounded by round_num); the unsigned arithmetic wraps.
int64_t as_int(Num v) { return static_cast<int64_t>(v); }
Num int_result(DType t, uint64_t v) { return static_cast<Num>(wrap(t, static_cast<int64_t>(v))); }

Num add_exact(DType t, Num a, Num b) {
  if (is_float(t)) return static_cast<double>(a) + static_cast<double>(b);
  return int_result(t, static_cast<uint64_t>(as_int(a)) + static_cast<uint64_t>(as_int(b)));
}
Num sub_exact(DType t, Num a, Num b) {
  if (is_float(t)) return static_cast<double>(a) - static_cast<double>(b);
  return int_result(t, static_cast<uint64_t>(as_int(a)) - static_cast<uint64_t>(as_int(b)));
}
Num mul_exact(DType t, Num a, Num b) {
  if (is_float(t)) return static_cast<double>(a) * static_cast<double>(b);
  return int_result(t, static_cast<uint64_t>(as_int(a)) * static_cast<uint64_t>(as_int(b)));
}
// Floor division and modulo (Python's); x / 0 = 0, x % 0 = 0; the most negative value / -1 wraps.
Num int_div(DType t, Num a, Num b, bool mod) {
  const int64_t x = as_int(a), y = as_int(b);
  if (y == 0) return 0;
  if (y == -1) return mod ? 0 : int_result(t, 0 - static_cast<uint64_t>(x));
  int64_t q = x / y, r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) {
    --q;
    r += y;
  }
  return static_cast<Num>(mod ? r : q);
}

// The type a contraction combines in: the inputs' promoted type (bool arithmetic in i32), f16 in f32.
DType combination_type(DType t) {
  if (t == DType::boolean) return DType::i32;
  return t == DType::f16 ? DType::f32 : t;
}

Num combine(CombinationOp op, DType t, const Num* v) {
  switch (op) {
    case CombinationOp::none: return v[0];
    case CombinationOp::mul: return round_num(t, mul_exact(t, round_num(t, v[0]), round_num(t, v[1])));
    case CombinationOp::add: return round_num(t, add_exact(t, round_num(t, v[0]), round_num(t, v[1])));
    case CombinationOp::eq: return round_num(t, v[0]) == round_num(t, v[1]) ? 1 : 0;
    case CombinationOp::cond: return v[2];
  }
  return 0;
}

struct Accumulator {
  AggregationOp op;
  DType type;  // sums and products of integers wrap exactly; of floats they are taken in double
  Num identity() const {
    switch (op) {
      case AggregationOp::sum: return 0;
      case AggregationOp::product: return 1;
      case AggregationOp::max: return -std::numeric_limits<Num>::infinity();
      case AggregationOp::min: return std::numeric_limits<Num>::infinity();
      case AggregationOp::assign: return 0;
    }
    return 0;
  }
  Num apply(Num acc, Num v) const {
    const DType t = is_float(type) ? DType::f64 : type;
    switch (op) {
      case AggregationOp::sum: return add_exact(t, acc, v);
      case AggregationOp::product: return mul_exact(t, acc, v);
      case AggregationOp::max:
        if (std::isnan(acc) || std::isnan(v)) return std::numeric_limits<Num>::quiet_NaN();
        return v > acc ? v : acc;
      case AggregationOp::min:
        if (std::isnan(acc) || std::isnan(v)) return std::numeric_limits<Num>::quiet_NaN();
        return v < acc ? v : acc;
      case AggregationOp::assign: return v;
    }
    return v;
  }
};

std::string point_str(const std::vector<std::string>& vars, const std::vector<int64_t>& x) {
  std::string s;
  for (size_t k = 0; k < vars.size(); ++k) s += (k ? ", " : "") + vars[k] + "=" + std::to_string(x[k]);
  return s;
}

std::string element_str(const std::string& name, const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  std::string s = name + "[";
  for (size_t k = 0; k < idx.size(); ++k) s += (k ? ", " : "") + std::to_string(idx[k]);
  return s + "]";
}

class ContractionRunner {
 public:
  ContractionRunner(const Contraction& c, const ProgramTypes& types, const TensorMap& env)
      : c_(c), vars_(c.index_variables()), out_type_(types.tensors.at(c.output)) {
    const auto& dims = types.dims;
    const auto& oshape = out_type_.shape;
    for (size_t k = 0; k < c.output_indices.size(); ++k)
      out_rows_.push_back(make_row(c.output_indices[k].bind_dims(dims), vars_, oshape[k],
                                   "output index " + std::to_string(k) + " of " + c.output));
    for (const auto& a : c.inputs) {
      const Buffer& b = env.at(a.tensor);
      inputs_.push_back(&b);
      std::vector<Row> rows;
      for (size_t k = 0; k < a.indices.size(); ++k)
        rows.push_back(make_row(a.indices[k].bind_dims(dims), vars_, b.shape()[k],
                                "index " + std::to_string(k) + " of " + a.tensor));
      in_rows_.push_back(std::move(rows));
    }
    for (const auto& k : c.constraints)
      constraint_rows_.push_back(
          make_row(k.poly.bind_dims(dims), vars_, k.bound.evaluate(dims), "constraint " + k.str(), /*integral=*/false));
    combo_type_ = out_type_.dtype;
    if (c.combination == CombinationOp::mul || c.combination == CombinationOp::add ||
        c.combination == CombinationOp::eq || c.combination == CombinationOp::cond)
      combo_type_ = combination_type(promote(inputs_[0]->dtype(), inputs_[1]->dtype()));
    if (c.init) init_ = &env.at(*c.init);
  }

  Buffer run() {
    Buffer out(out_type_.dtype, out_type_.shape);
    const int64_t n = out.size();
    acc_.assign(n, Accumulator{c_.aggregation, out_type_.dtype}.identity());
    written_.assign(n, 0);
    if (init_) {
      // The default seeds the accumulator as a value of the output's dtype (an f64 default of a bool min is
      // true or false before anything is compared with it).
      for (int64_t e = 0; e < n; ++e) acc_[e] = round_num(out_type_.dtype, load(*init_, broadcast_index(e, *init_)));
    }
    if (c_.aggregation == AggregationOp::assign) first_writer_.assign(n, {});

    std::vector<const Row*> all;
    for (const auto& r : out_rows_) all.push_back(&r);
    for (const auto& rows : in_rows_)
      for (const auto& r : rows) all.push_back(&r);
    for (const auto& r : constraint_rows_) all.push_back(&r);

    bool feasible = true;
    std::vector<int64_t> x(vars_.size(), 0);
    int64_t dummy;
    for (const Row* r : all)
      if (r->depth < 0 && !row_value(*r, x, dummy)) feasible = false;  // constant rows: all-or-nothing

    std::vector<i128> lo(vars_.size(), -kInf), hi(vars_.size(), kInf);
    std::vector<Row> plain;
    for (const Row* r : all) plain.push_back(*r);
    if (feasible) feasible = propagate_bounds(plain, lo, hi);
    for (size_t k = 0; k < vars_.size() && feasible; ++k)
      if (lo[k] <= -kInf || hi[k] >= kInf) feasible = eliminate_bounds(plain, k, c_.output, lo[k], hi[k]);
    if (feasible) feasible = propagate_bounds(plain, lo, hi);
    if (feasible) {
      for (size_t k = 0; k < vars_.size(); ++k)
        if (lo[k] <= -kInf || hi[k] >= kInf)
          user_error("index variable ", vars_[k], " of contraction ", c_.output,
                     " is unbounded: it must appear in an index expression or a constraint that bounds it");
      i128 box = 1;
      for (size_t k = 0; k < vars_.size(); ++k) {
        box *= (hi[k] - lo[k] + 1);
        if (box > (static_cast<i128>(1) << 36))
          user_error("contraction ", c_.output, " has too many candidate points for the reference interpreter");
      }
      lo_.assign(vars_.size(), 0);
      hi_.assign(vars_.size(), 0);
      for (size_t k = 0; k < vars_.size(); ++k) {
        lo_[k] = static_cast<int64_t>(lo[k]);
        hi_[k] = static_cast<int64_t>(hi[k]);
      }
      rows_at_depth_.assign(vars_.size() + 1, {});
      for (const Row* r : all)
        if (r->depth >= 0) rows_at_depth_[r->depth].push_back(r);
      if (vars_.empty()) {
        visit(x);
      } else {
        loop(0, x);
      }
    }

    for (int64_t e = 0; e < n; ++e) store(out, e, (written_[e] || init_) ? acc_[e] : 0);
    return out;
  }

 private:
  int64_t broadcast_index(int64_t flat_out, const Buffer& b) const {
    const auto& os = out_type_.shape;
    std::vector<int64_t> idx(os.size());
    for (size_t k = os.size(); k-- > 0;) {
      idx[k] = flat_out % os[k];
      flat_out /= os[k];
    }
    int64_t f = 0;
    size_t off = os.size() - b.rank();
    for (size_t k = 0; k < b.rank(); ++k) f = f * b.shape()[k] + (b.shape()[k] == 1 ? 0 : idx[off + k]);
    return f;
  }

  void loop(size_t depth, std::vector<int64_t>& x) {
    for (int64_t v = lo_[depth]; v <= hi_[depth]; ++v) {
      x[depth] = v;
      bool ok = true;
      int64_t dummy;
      for (const Row* r : rows_at_depth_[depth])
        if (!row_value(*r, x, dummy)) {
          ok = false;
          break;
        }
      if (!ok) continue;
      if (depth + 1 == vars_.size()) {
        visit(x);
      } else {
        loop(depth + 1, x);
      }
    }
  }

  void visit(const std::vector<int64_t>& x) {
    int64_t flat = 0, v = 0;
    for (size_t k = 0; k < out_rows_.size(); ++k) {
      row_value(out_rows_[k], x, v);
      flat = flat * out_type_.shape[k] + v;
    }
    Num vals[3];
    for (size_t i = 0; i < inputs_.size(); ++i) {
      int64_t f = 0;
      for (size_t k = 0; k < in_rows_[i].size(); ++k) {
        row_value(in_rows_[i][k], x, v);
        f = f * inputs_[i]->shape()[k] + v;
      }
      vals[i] = load(*inputs_[i], f);
    }
    if (c_.aggregation == AggregationOp::assign) {
      // Two valid points may not target one element, whatever a cond decides at run time: the rule is
      // static, as the compiler's isl proof is (ir.h).
      if (!first_writer_[flat].empty())
        user_error("assign contraction ", c_.output, " writes ", element_str(c_.output, out_type_.shape, flat),
                   " more than once (at ", point_str(vars_, first_writer_[flat]), " and at ", point_str(vars_, x),
                   "); use an aggregation such as + or > if that is intended");
      first_writer_[flat] = x;
    }
    if (c_.combination == CombinationOp::cond && round_num(combo_type_, vals[0]) != round_num(combo_type_, vals[1])) return;
    // The output's dtype holds each term (f16 terms stay f32: the accumulation rounds once, in store()).
    const DType term_type = out_type_.dtype == DType::f16 ? DType::f32 : out_type_.dtype;
    const Num value = round_num(term_type, combine(c_.combination, combo_type_, vals));
    acc_[flat] = Accumulator{c_.aggregation, out_type_.dtype}.apply(acc_[flat], value);
    written_[flat] = 1;
  }

  const Contraction& c_;
  std::vector<std::string> vars_;
  TensorType out_type_;
  DType combo_type_;
  std::vector<Row> out_rows_, constraint_rows_;
  std::vector<std::vector<Row>> in_rows_;
  std::vector<const Buffer*> inputs_;
  const Buffer* init_ = nullptr;
  std::vector<int64_t> lo_, hi_;
  std::vector<std::vector<const Row*>> rows_at_depth_;
  std::vector<Num> acc_;
  std::vector<char> written_;
  std::vector<std::vector<int64_t>> first_writer_;
};

// ------------------------------------------------------------------------------------------ elementwise

Num sign_of(Num v) { return v > 0 ? 1 : (v < 0 ? -1 : (std::isnan(v) ? v : 0)); }

// An elementwise expression annotated with types and resolved tensors, evaluated per output element.
struct TypedExpr {
  Expr expr;
  DType type;          // result type
  DType operand_type;  // type operands are converted to before the operation
  const Buffer* tensor = nullptr;
  Num constant = 0;
  std::vector<TypedExpr> args;
};

TypedExpr annotate(const Expr& e, const ProgramTypes& types, const TensorMap& env) {
  TypedExpr t;
  t.expr = e;
  ExprType et = expr_type(e, types.tensors);
  t.type = et.dtype;
  t.operand_type = et.dtype;
  for (const auto& a : e.args()) t.args.push_back(annotate(a, types, env));
  switch (e.kind()) {
    case Expr::Kind::tensor: t.tensor = &env.at(e.name()); break;
    case Expr::Kind::literal: t.constant = e.value(); break;
    case Expr::Kind::dim: t.constant = static_cast<Num>(types.dims.at(e.name())); break;
    case Expr::Kind::binary:
    case Expr::Kind::call:
      if (e.kind() == Expr::Kind::call && e.intrinsic() == Intrinsic::cast) {
        t.operand_type = expr_type(e.args()[0], types.tensors).dtype;
      } else if (e.kind() == Expr::Kind::call && e.intrinsic() == Intrinsic::select) {
        t.operand_type = t.type;
      } else if (e.args().size() == 2) {
        ExprType c = combine_types(expr_type(e.args()[0], types.tensors), expr_type(e.args()[1], types.tensors));
        t.operand_type = c.dtype;
        if (c.dtype == DType::boolean && e.kind() == Expr::Kind::binary) {
          BinaryOp op = e.binary_op();
          if (op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::mul || op == BinaryOp::div ||
              op == BinaryOp::mod)
            t.operand_type = DType::i32;
        }
        if (e.kind() == Expr::Kind::call && !is_float(t.operand_type) && e.intrinsic() == Intrinsic::pow)
          t.operand_type = DType::f32;
      }
      break;
    case Expr::Kind::unary: t.operand_type = t.type; break;
  }
  return t;
}

Num eval_binary(BinaryOp op, DType t, Num a, Num b) {
  switch (op) {
    case BinaryOp::add: return add_exact(t, a, b);
    case BinaryOp::sub: return sub_exact(t, a, b);
    case BinaryOp::mul: return mul_exact(t, a, b);
    case BinaryOp::div: return is_float(t) ? static_cast<double>(a) / static_cast<double>(b) : int_div(t, a, b, false);
    case BinaryOp::mod:
      return is_float(t) ? std::fmod(static_cast<double>(a), static_cast<double>(b)) : int_div(t, a, b, true);
    case BinaryOp::eq: return a == b;
    case BinaryOp::ne: return a != b;
    case BinaryOp::lt: return a < b;
    case BinaryOp::gt: return a > b;
    case BinaryOp::le: return a <= b;
    case BinaryOp::ge: return a >= b;
    case BinaryOp::logical_and: return (a != 0) && (b != 0);
    case BinaryOp::logical_or: return (a != 0) || (b != 0);
  }
  return 0;
}

// Intrinsics on values of their operand type: exact ones in Num (integers stay exact), the others in double.
Num eval_call(Intrinsic fn, const Num* a) {
  const double x = static_cast<double>(a[0]);
  switch (fn) {
    case Intrinsic::abs: return std::fabs(a[0]);
    case Intrinsic::sign: return sign_of(a[0]);
    case Intrinsic::exp: return std::exp(x);
    case Intrinsic::log: return std::log(x);
    case Intrinsic::sqrt: return std::sqrt(x);
    case Intrinsic::pow: return std::pow(x, static_cast<double>(a[1]));
    case Intrinsic::sin: return std::sin(x);
    case Intrinsic::cos: return std::cos(x);
    case Intrinsic::tan: return std::tan(x);
    case Intrinsic::asin: return std::asin(x);
    case Intrinsic::acos: return std::acos(x);
    case Intrinsic::atan: return std::atan(x);
    case Intrinsic::sinh: return std::sinh(x);
    case Intrinsic::cosh: return std::cosh(x);
    case Intrinsic::tanh: return std::tanh(x);
    case Intrinsic::erf: return std::erf(x);
    case Intrinsic::sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case Intrinsic::relu: return a[0] > 0 ? a[0] : (std::isnan(a[0]) ? a[0] : 0);
    case Intrinsic::floor: return std::floor(a[0]);
    case Intrinsic::ceil: return std::ceil(a[0]);
    case Intrinsic::round: return std::round(a[0]);
    case Intrinsic::max:
      if (std::isnan(a[0]) || std::isnan(a[1])) return std::numeric_limits<Num>::quiet_NaN();
      return std::max(a[0], a[1]);
    case Intrinsic::min:
      if (std::isnan(a[0]) || std::isnan(a[1])) return std::numeric_limits<Num>::quiet_NaN();
      return std::min(a[0], a[1]);
    case Intrinsic::ident:
    case Intrinsic::cast: return a[0];
    case Intrinsic::select: return a[0] != 0 ? a[1] : a[2];
  }
  return 0;
}

Num evaluate(const TypedExpr& t, const std::vector<int64_t>& idx) {
  const Expr& e = t.expr;
  switch (e.kind()) {
    case Expr::Kind::tensor: {
      const Buffer& b = *t.tensor;
      size_t off = idx.size() - b.rank();
      int64_t f = 0;
      for (size_t k = 0; k < b.rank(); ++k) f = f * b.shape()[k] + (b.shape()[k] == 1 ? 0 : idx[off + k]);
      return load(b, f);
    }
    case Expr::Kind::literal:
    case Expr::Kind::dim: return t.constant;  // weak: rounded by the operation that consumes it
    case Expr::Kind::unary: {
      Num a = round_num(t.operand_type, evaluate(t.args[0], idx));
      if (e.unary_op() == UnaryOp::neg)  // -(0.0) is -0.0; the most negative integer wraps to itself
        return round_num(t.type, is_float(t.operand_type) ? -a : sub_exact(t.operand_type, 0, a));
      return a == 0 ? 1 : 0;
    }
    case Expr::Kind::binary: {
      Num a = round_num(t.operand_type, evaluate(t.args[0], idx));
      Num b = round_num(t.operand_type, evaluate(t.args[1], idx));
      return round_num(t.type, eval_binary(e.binary_op(), t.operand_type, a, b));
    }
    case Expr::Kind::call: {
      Num a[3] = {0, 0, 0};
      for (size_t i = 0; i < t.args.size(); ++i) {
        a[i] = evaluate(t.args[i], idx);
        bool is_condition = e.intrinsic() == Intrinsic::select && i == 0;
        if (!is_condition) a[i] = round_num(t.operand_type, a[i]);
      }
      return round_num(t.type, eval_call(e.intrinsic(), a));
    }
  }
  return 0;
}

Buffer run_elementwise(const Elementwise& e, const ProgramTypes& types, const TensorMap& env) {
  const TensorType& tt = types.tensors.at(e.output);
  Buffer out(tt.dtype, tt.shape);
  TypedExpr t = annotate(e.expr, types, env);
  std::vector<int64_t> idx(tt.shape.size(), 0);
  for (int64_t f = 0; f < out.size(); ++f) {
    store(out, f, evaluate(t, idx));
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < tt.shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

}  // namespace

TensorMap interpret(const Program& program, const TensorMap& inputs, const InterpretOptions& options) {
  std::map<std::string, TensorType> in_types;
  for (const auto& [name, b] : inputs) in_types[name] = TensorType{b.dtype(), b.shape()};
  ProgramTypes types = infer_types(program, in_types);
  TensorMap env = inputs;
  for (const auto& st : program.statements) {
    if (const auto* e = std::get_if<Elementwise>(&st)) {
      env[e->output] = run_elementwise(*e, types, env);
    } else {
      const auto& c = std::get<Contraction>(st);
      env[c.output] = ContractionRunner(c, types, env).run();
    }
  }
  if (options.keep_intermediates) return env;
  TensorMap out;
  for (const auto& o : program.outputs) out[o] = env.at(o);
  return out;
}

}  // namespace polytile
