// The outer loops of a micro-kernel nest (see step_loops in nest_builder.h): its tree of bands over the
// Step statement (blocks, reduction tiles; tiles of them as floor divisions) scanned by Fourier-Motzkin
// elimination instead of isl's AST build, which took 30-40 M instructions (4-12 ms on a 2-core guest) for
// each of the conv bench's three trees. The domain is one conjunction of integer constraints; each loop's
// bounds are the constraints left once the loops inside it are eliminated, the innermost exact and the
// outer ones the rational shadow (a loop value without steps inside runs an empty loop), bounds that the
// others imply over the outer loops' ranges left out. The steps run are the domain's, in the schedule's
// order: LowerTest.StepLoopsRunIslsSteps runs both on every micro-kernel nest of the examples, their
// gradients, generated contractions, the bench's convolutions and matrix products and compares the
// sequence of steps. Anything else is left to isl.
#include <isl/aff.h>
#include <isl/constraint.h>
#include <isl/set.h>
#include <isl/union_set.h>
#include <isl/val.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "direct_loops.h"
#include "nest_builder.h"

namespace polytile::sched::internal {

namespace {

constexpr int64_t kLarge = int64_t{1} << 24;  // the magnitude of coefficients and constants taken on

// An integer of isl's, when small enough to stay far from overflow in the elimination.
std::optional<int64_t> small_int(isl_val* v) {
  std::optional<int64_t> x = direct::small_int(v);
  if (x && (*x <= -kLarge || *x >= kLarge)) x.reset();
  return x;
}

// a . x + b >= 0 over some variables x.
struct Row {
  std::vector<int64_t> a;
  int64_t b = 0;
};

int64_t floor_div(int64_t x, int64_t y) {  // y > 0
  return x >= 0 ? x / y : -((-x + y - 1) / y);
}

// Divided by the gcd of its coefficients, the constant rounded down: the same integer points.
void normalize(Row& r) {
  int64_t g = 0;
  for (int64_t c : r.a) g = std::gcd(g, c < 0 ? -c : c);
  if (g <= 1) return;
  for (int64_t& c : r.a) c /= g;
  r.b = floor_div(r.b, g);
}

// floor((a . d + b) / T) of the Step statement's variables d, T >= 1.
struct Affine {
  std::vector<int64_t> a;
  int64_t b = 0, T = 1;
};

// The coefficients of `aff` (no division of it used, denominator `scale` applied), or nullopt.
std::optional<Affine> linear_part(isl_aff* aff, int n, bool allow_denominator) {
  Affine out;
  const auto den = small_int(isl_aff_get_denominator_val(aff));
  if (!den || *den < 1 || (*den != 1 && !allow_denominator)) return std::nullopt;
  out.T = *den;
  for (int k = 0; k < static_cast<int>(isl_aff_dim(aff, isl_dim_div)); ++k)
    if (small_int(isl_aff_get_coefficient_val(aff, isl_dim_div, k)) != 0) return std::nullopt;
  for (int k = 0; k < n; ++k) {
    const auto c = small_int(isl_val_mul_ui(isl_aff_get_coefficient_val(aff, isl_dim_in, k), static_cast<unsigned long>(out.T)));
    if (!c) return std::nullopt;
    out.a.push_back(*c);
  }
  const auto b = small_int(isl_val_mul_ui(isl_aff_get_constant_val(aff), static_cast<unsigned long>(out.T)));
  if (!b) return std::nullopt;
  out.b = *b;
  return out;
}

// A band member as floor((a . d + b) / T): an affine function of the variables, or the floor of one
// (alone: coefficient 1, no other term).
std::optional<Affine> member(const isl::union_pw_aff& upa, int n) {
  isl_aff* aff = direct::single_aff(upa);
  if (!aff) return std::nullopt;
  const int used = direct::used_division(aff);
  std::optional<Affine> out;
  if (used == -1) {
    out = linear_part(aff, n, false);
  } else if (used >= 0) {
    bool alone = small_int(isl_aff_get_coefficient_val(aff, isl_dim_div, used)) == 1 &&
                 small_int(isl_aff_get_constant_val(aff)) == 0 && small_int(isl_aff_get_denominator_val(aff)) == 1;
    for (int k = 0; k < n && alone; ++k) alone = small_int(isl_aff_get_coefficient_val(aff, isl_dim_in, k)) == 0;
    if (alone) {
      isl_aff* div = isl_aff_get_div(aff, used);
      if (div) out = linear_part(div, n, true);
      isl_aff_free(div);
    }
  }
  isl_aff_free(aff);
  return out;
}

struct Reader {
  int n = 0;
  std::vector<Row> rows;
  bool ok = true;
};

isl_stat read_constraint(isl_constraint* c, void* user) {
  Reader& r = *static_cast<Reader*>(user);
  Row row;
  for (int k = 0; k < r.n && r.ok; ++k) {
    const auto a = small_int(isl_constraint_get_coefficient_val(c, isl_dim_set, k));
    if (!a) r.ok = false;
    else row.a.push_back(*a);
  }
  const auto b = small_int(isl_constraint_get_constant_val(c));
  if (!b) r.ok = false;
  if (r.ok) {
    row.b = *b;
    const bool equality = isl_constraint_is_equality(c) == isl_bool_true;
    r.rows.push_back(row);
    if (equality) {
      for (int64_t& x : row.a) x = -x;
      row.b = -row.b;
      r.rows.push_back(row);
    }
  }
  isl_constraint_free(c);
  return isl_stat_ok;
}

using direct::constant;
using direct::iterator;
using direct::op;

// A loop's value: its iterator, or, for a loop of one value left out, that value as an affine form of
// the loops outside it that are not left out.
struct Value {
  bool fixed = false;
  std::vector<int64_t> a;  // over the loops outside, zero at those left out
  int64_t b = 0;
  int iterator = -1;
};

// c . values + b with the loops left out replaced by their values.
std::pair<std::vector<int64_t>, int64_t> expand(std::vector<int64_t> c, int64_t b, const std::vector<Value>& values) {
  for (size_t k = c.size(); k-- > 0;) {
    if (c[k] == 0 || !values[k].fixed) continue;
    const int64_t x = c[k];
    c[k] = 0;
    for (size_t i = 0; i < std::min(c.size(), values[k].a.size()); ++i) c[i] += x * values[k].a[i];
    b += x * values[k].b;
  }
  return {c, b};
}

// c . values + b, terms in the loops' order, the constant last.
LoopExpr linear(const std::vector<int64_t>& coefficients, int64_t constant_term, const std::vector<Value>& values) {
  const auto [c, b] = expand(coefficients, constant_term, values);
  std::optional<LoopExpr> sum;
  for (size_t k = 0; k < c.size(); ++k) {
    if (c[k] == 0) continue;
    LoopExpr term = c[k] == 1 ? iterator(values[k].iterator) : op(LoopExpr::Kind::mul, constant(c[k]), iterator(values[k].iterator));
    sum = sum ? op(LoopExpr::Kind::add, std::move(*sum), std::move(term)) : std::move(term);
  }
  if (!sum) return constant(b);
  return b == 0 ? std::move(*sum) : op(LoopExpr::Kind::add, std::move(*sum), constant(b));
}

// C text of the expressions made here (iterators named by `names`).
std::string c_text(const LoopExpr& e, const std::vector<std::string>& names) {
  using K = LoopExpr::Kind;
  auto a = [&](size_t k) { return c_text(e.args[k], names); };
  switch (e.kind) {
    case K::constant: return std::to_string(e.value);
    case K::iterator: return names[static_cast<size_t>(e.iterator)];
    case K::mul:
      if (e.args[0].kind == K::constant && e.args[0].value == -1) return "-" + a(1);
      return a(0) + " * " + a(1);
    case K::add:
      if (e.args[1].kind == K::constant && e.args[1].value < 0) return a(0) + " - " + std::to_string(-e.args[1].value);
      return a(0) + " + " + a(1);
    case K::floordiv: return "floord(" + a(0) + ", " + a(1) + ")";
    case K::min: return "min(" + a(0) + ", " + a(1) + ")";
    case K::max: return "max(" + a(0) + ", " + a(1) + ")";
    default: return "?";
  }
}

// One bound of loop k: c_k >= ceil(num / den) (lower) or c_k <= floor(num / den) (upper), num = a . c + b
// over the loops outside it.
struct Bound {
  std::vector<int64_t> a;
  int64_t b = 0, den = 1;
};

// The range of a . c + b over boxes of the loops' values.
std::pair<int64_t, int64_t> range(const std::vector<int64_t>& a, int64_t b, const std::vector<std::pair<int64_t, int64_t>>& box) {
  int64_t lo = b, hi = b;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k] == 0) continue;
    const int64_t x = a[k] * box[k].first, y = a[k] * box[k].second;
    lo += std::min(x, y);
    hi += std::max(x, y);
  }
  return {lo, hi};
}

int64_t ceil_div(int64_t x, int64_t y) { return -floor_div(-x, y); }

}  // namespace

std::optional<StepLoops> step_loops(const isl::schedule& tree, const StatementIds& ids, const std::set<int>& parallel_dims) {
  const isl::union_set domain = tree.domain();
  if (isl_union_set_n_set(domain.get()) != 1) return std::nullopt;
  const isl::set set = domain.set_list().at(0);
  if (set.n_basic_set() != 1 || isl_set_dim(set.get(), isl_dim_param) != 0 || !isl_set_has_tuple_id(set.get())) return std::nullopt;
  if (isl::manage(isl_set_get_tuple_id(set.get())).get() != ids.block_step.get()) return std::nullopt;
  const int n = static_cast<int>(set.tuple_dim());
  Reader domain_rows;
  domain_rows.n = n;
  isl_basic_set_list* pieces = isl_set_get_basic_set_list(set.get());
  isl_basic_set* piece = isl_basic_set_list_get_at(pieces, 0);
  isl_basic_set_list_free(pieces);
  if (!piece) return std::nullopt;
  if (isl_basic_set_dim(piece, isl_dim_div) != 0 || isl_basic_set_foreach_constraint(piece, read_constraint, &domain_rows) != isl_stat_ok)
    domain_rows.ok = false;
  isl_basic_set_free(piece);
  if (!domain_rows.ok) return std::nullopt;
  // Marks and bands down to the leaf: each member, and the marks above each schedule dimension.
  const std::optional<direct::BandChain> chain = direct::band_chain(tree, ids);
  if (!chain) return std::nullopt;
  std::vector<Affine> members;
  for (const isl::union_pw_aff& upa : chain->members) {
    auto m = member(upa, n);
    if (!m) return std::nullopt;
    members.push_back(*m);
  }
  const size_t L = members.size();
  if (L == 0) return std::nullopt;
  // Each variable is a member of its own (the first one that is the variable alone) or has one value.
  std::vector<int> own(static_cast<size_t>(n), -1);
  std::vector<bool> owns(L, false);
  for (size_t d = 0; d < L; ++d) {
    const Affine& m = members[d];
    if (m.T != 1 || m.b != 0) continue;
    int v = -1;
    bool single = true;
    for (int j = 0; j < n && single; ++j) {
      if (m.a[static_cast<size_t>(j)] == 0) continue;
      single = m.a[static_cast<size_t>(j)] == 1 && v < 0;
      v = j;
    }
    if (single && v >= 0 && own[static_cast<size_t>(v)] < 0) {
      own[static_cast<size_t>(v)] = static_cast<int>(d);
      owns[d] = true;
    }
  }
  std::vector<std::optional<int64_t>> fixed(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    if (own[static_cast<size_t>(j)] >= 0) continue;
    std::optional<int64_t> lo, hi;  // from the rows of this variable alone
    for (const Row& r : domain_rows.rows) {
      bool alone = r.a[static_cast<size_t>(j)] == 1 || r.a[static_cast<size_t>(j)] == -1;
      for (int i = 0; i < n && alone; ++i) alone = i == j || r.a[static_cast<size_t>(i)] == 0;
      if (!alone) continue;
      if (r.a[static_cast<size_t>(j)] == 1) lo = std::max(lo.value_or(INT64_MIN), -r.b);
      else hi = std::min(hi.value_or(INT64_MAX), r.b);
    }
    if (!lo || !hi || *lo != *hi) return std::nullopt;
    fixed[static_cast<size_t>(j)] = *lo;
  }
  // The constraints over the members' values c: the domain's, d replaced by its member or value, and
  // T c = floor(E) as 0 <= E - T c <= T - 1 for every member but the variables' own.
  auto substitute = [&](const std::vector<int64_t>& a, int64_t b) {
    Row r;
    r.a.assign(L, 0);
    r.b = b;
    for (int j = 0; j < n; ++j) {
      const int64_t c = a[static_cast<size_t>(j)];
      if (c == 0) continue;
      if (own[static_cast<size_t>(j)] >= 0) r.a[static_cast<size_t>(own[static_cast<size_t>(j)])] += c;
      else r.b += c * *fixed[static_cast<size_t>(j)];
    }
    return r;
  };
  std::vector<Row> system;
  for (const Row& r : domain_rows.rows) system.push_back(substitute(r.a, r.b));
  for (size_t d = 0; d < L; ++d) {
    if (owns[d]) continue;
    Row low = substitute(members[d].a, members[d].b);  // E - T c >= 0
    low.a[d] -= members[d].T;
    Row high = low;  // T - 1 - (E - T c) >= 0
    for (int64_t& x : high.a) x = -x;
    high.b = members[d].T - 1 - low.b;
    system.push_back(low);
    system.push_back(high);
  }
  // Eliminated innermost first: loop k's bounds are the rows that still hold c_k.
  std::vector<std::vector<Bound>> lowers(L), uppers(L);
  for (size_t k = L; k-- > 0;) {
    std::map<std::vector<int64_t>, int64_t> kept;  // coefficients -> the least constant (the tightest row)
    std::vector<Row> lo, hi;
    for (Row r : system) {
      normalize(r);
      if (r.a[k] > 0) lo.push_back(r);
      else if (r.a[k] < 0) hi.push_back(r);
      else {
        auto [it, added] = kept.emplace(r.a, r.b);
        if (!added) it->second = std::min(it->second, r.b);
      }
    }
    if (lo.empty() || hi.empty() || lo.size() * hi.size() > 4096) return std::nullopt;
    for (const Row& r : lo) {  // a c_k + rest >= 0: c_k >= ceil(-rest / a)
      Bound b{std::vector<int64_t>(r.a.begin(), r.a.begin() + static_cast<long>(k)), -r.b, r.a[k]};
      for (int64_t& x : b.a) x = -x;
      lowers[k].push_back(b);
    }
    for (const Row& r : hi) {  // -a c_k + rest >= 0: c_k <= floor(rest / a)
      Bound b{std::vector<int64_t>(r.a.begin(), r.a.begin() + static_cast<long>(k)), r.b, -r.a[k]};
      uppers[k].push_back(b);
    }
    for (const Row& l : lo)
      for (const Row& h : hi) {
        Row r;
        r.a.resize(L);
        for (size_t i = 0; i < L; ++i) r.a[i] = -h.a[k] * l.a[i] + l.a[k] * h.a[i];
        r.b = -h.a[k] * l.b + l.a[k] * h.b;
        normalize(r);
        if (std::any_of(r.a.begin(), r.a.end(), [](int64_t x) { return x <= -kLarge || x >= kLarge; }) || r.b <= -kLarge * kLarge ||
            r.b >= kLarge * kLarge)
          return std::nullopt;
        auto [it, added] = kept.emplace(r.a, r.b);
        if (!added) it->second = std::min(it->second, r.b);
      }
    system.clear();
    for (const auto& [a, b] : kept) {
      if (std::all_of(a.begin(), a.end(), [](int64_t x) { return x == 0; })) {
        if (b < 0) return std::nullopt;  // no steps at all: left to isl
        continue;
      }
      system.push_back(Row{a, b});
    }
  }
  // Outside in: each loop's range over the ranges outside it, its bounds without those another implies,
  // and a loop of one value left out (its value a constant), as isl leaves it out.
  std::vector<std::pair<int64_t, int64_t>> box(L);
  std::vector<Value> values(L);
  std::vector<std::string> names;
  std::vector<size_t> loop_dims;  // loop -> schedule dimension
  std::vector<std::pair<LoopExpr, LoopExpr>> loop_bounds;
  for (size_t k = 0; k < L; ++k) {
    std::vector<std::pair<int64_t, int64_t>> outer(box.begin(), box.begin() + static_cast<long>(k));
    auto value_range = [&](const Bound& b, bool lower) {
      const auto [lo, hi] = range(b.a, b.b, outer);
      return lower ? std::pair{ceil_div(lo, b.den), ceil_div(hi, b.den)} : std::pair{floor_div(lo, b.den), floor_div(hi, b.den)};
    };
    // Bound i is implied by bound j when j is at least as tight everywhere on the ranges outside.
    auto prune = [&](std::vector<Bound>& bounds, bool lower) {
      std::vector<bool> dropped(bounds.size(), false);
      for (size_t i = 0; i < bounds.size(); ++i)
        for (size_t j = 0; j < bounds.size() && !dropped[i]; ++j) {
          if (i == j || dropped[j]) continue;
          bool tighter;
          if (bounds[i].den == 1 && bounds[j].den == 1) {
            std::vector<int64_t> diff(k);
            for (size_t t = 0; t < k; ++t) diff[t] = bounds[j].a[t] - bounds[i].a[t];
            const auto [lo, hi] = range(diff, bounds[j].b - bounds[i].b, outer);
            tighter = lower ? lo >= 0 : hi <= 0;
          } else {
            const auto ri = value_range(bounds[i], lower), rj = value_range(bounds[j], lower);
            tighter = lower ? rj.first >= ri.second : rj.second <= ri.first;
          }
          if (tighter && (bounds[i].a != bounds[j].a || bounds[i].b != bounds[j].b || bounds[i].den != bounds[j].den || j < i))
            dropped[i] = true;
        }
      std::vector<Bound> kept;
      for (size_t i = 0; i < bounds.size(); ++i)
        if (!dropped[i]) kept.push_back(bounds[i]);
      bounds = std::move(kept);
    };
    prune(lowers[k], true);
    prune(uppers[k], false);
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    for (const Bound& b : lowers[k]) lo = std::max(lo, value_range(b, true).first);
    for (const Bound& b : uppers[k]) hi = std::min(hi, value_range(b, false).second);
    if (lo > hi) return std::nullopt;
    box[k] = {lo, hi};
    // One value: one lower bound and one upper bound, the same affine form (a variable that another
    // member already is, a dimension of one value).
    if (lowers[k].size() == 1 && uppers[k].size() == 1 && lowers[k][0].den == 1 && uppers[k][0].den == 1 &&
        lowers[k][0].a == uppers[k][0].a && lowers[k][0].b == uppers[k][0].b) {
      auto [a, b] = expand(lowers[k][0].a, lowers[k][0].b, values);
      a.resize(L, 0);
      values[k] = Value{true, a, b, -1};
      continue;
    }
    values[k] = Value{false, {}, 0, static_cast<int>(loop_dims.size())};
    auto expr = [&](const Bound& b, bool lower) {
      if (b.den == 1) return linear(b.a, b.b, values);
      return op(LoopExpr::Kind::floordiv, linear(b.a, lower ? b.b + b.den - 1 : b.b, values), constant(b.den));
    };
    auto chain = [&](const std::vector<Bound>& bounds, bool lower) {
      LoopExpr e = expr(bounds[0], lower);
      for (size_t i = 1; i < bounds.size(); ++i) e = op(lower ? LoopExpr::Kind::max : LoopExpr::Kind::min, std::move(e), expr(bounds[i], lower));
      return e;
    };
    loop_bounds.emplace_back(chain(lowers[k], true), chain(uppers[k], false));
    loop_dims.push_back(k);
    names.push_back("c" + std::to_string(k));
  }
  if (loop_dims.empty()) return std::nullopt;
  // Marks go with the next loop; the rest, under the last loop, above the statement.
  std::vector<bool> has_loop(L);
  for (size_t d = 0; d < L; ++d) has_loop[d] = !values[d].fixed;
  const direct::LoopMarks placed = direct::loop_marks(*chain, has_loop);
  StepLoops out;
  out.iterators = static_cast<int>(loop_dims.size());
  // The Step statement's arguments: each variable's member value, or its one value.
  for (int j = 0; j < n; ++j) {
    const int d = own[static_cast<size_t>(j)];
    if (d < 0) {
      out.args.push_back(constant(*fixed[static_cast<size_t>(j)]));
      continue;
    }
    std::vector<int64_t> unit(L, 0);
    unit[static_cast<size_t>(d)] = 1;
    out.args.push_back(linear(unit, 0, values));
  }
  // The C text, as isl writes it: two spaces a level, marks as comments, a loop whose body starts with a
  // mark in braces.
  std::string text;
  std::vector<bool> braced;
  for (size_t k = 0; k < loop_dims.size(); ++k) {
    const std::string indent(2 * k, ' ');
    for (const std::string& name : placed.marks[k]) text += indent + "// " + name + "\n";
    const std::string& c = names[k];
    const bool brace = !(k + 1 < loop_dims.size() ? placed.marks[k + 1] : placed.leaf).empty();
    text += indent + "for (int " + c + " = " + c_text(loop_bounds[k].first, names) + "; " + c + " <= " +
            c_text(loop_bounds[k].second, names) + "; " + c + " += 1)" + (brace ? " {\n" : "\n");
    braced.push_back(brace);
  }
  const std::string indent(2 * loop_dims.size(), ' ');
  for (const std::string& name : placed.leaf) text += indent + "// " + name + "\n";
  text += indent + "Step(";
  for (size_t j = 0; j < out.args.size(); ++j) text += (j ? ", " : "") + c_text(out.args[j], names);
  text += ");\n";
  for (size_t k = loop_dims.size(); k-- > 0;)
    if (braced[k]) text += std::string(2 * k, ' ') + "}\n";
  out.ast = text;
  for (size_t k = 0; k < loop_dims.size(); ++k) {
    LoopNode loop;
    loop.kind = LoopNode::Kind::loop;
    loop.iterator = static_cast<int>(k);
    loop.lower = loop_bounds[k].first;
    loop.condition = op(LoopExpr::Kind::le, iterator(static_cast<int>(k)), loop_bounds[k].second);
    loop.step = 1;
    loop.parallel = placed.parallel[k] && parallel_dims.count(static_cast<int>(loop_dims[k])) != 0;
    out.loops.push_back(std::move(loop));
  }
  return out;
}

}  // namespace polytile::sched::internal
