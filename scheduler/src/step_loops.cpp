// The loops of a micro-kernel nest (see step_loops and fma_loops in nest_builder.h): its tree of bands
// over the Step statement (blocks, reduction tiles; tiles of them as floor divisions) and each block
// step's fma loops over its reduction points (the step's arguments as parameters), scanned by
// Fourier-Motzkin elimination instead of isl's AST build, which took 30-40 M instructions for each of the
// conv bench's three trees and 16 M for each step's fma loops. The domain is one conjunction of integer
// constraints; each loop's bounds are the constraints left once the loops inside it are eliminated, the
// innermost exact and the outer ones the rational shadow (a loop value without points inside runs an
// empty loop), bounds that the others imply over the outer loops' ranges left out. The points run are
// the domain's, in the schedule's order: LowerTest.StepLoopsRunIslsSteps runs both on every micro-kernel
// nest of the examples, their gradients, generated contractions, convolutions and matrix products of the
// bench's kinds and compares the statements run. Anything else is left to isl.
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

using direct::Affine;

// A band member (direct::affine_member) with numbers small enough for the elimination.
std::optional<Affine> member(const isl::union_pw_aff& upa, int n) {
  std::optional<Affine> m = direct::affine_member(upa, n);
  auto small = [](int64_t x) { return x > -kLarge && x < kLarge; };
  if (!m || !small(m->b) || !small(m->T) || !std::all_of(m->a.begin(), m->a.end(), small)) return std::nullopt;
  return m;
}

// A basic set's constraints as rows over [its parameters at `params`, its n variables].
struct Reader {
  int n = 0;
  std::vector<int> params;
  std::vector<Row> rows;
  bool ok = true;
};

isl_stat read_constraint(isl_constraint* c, void* user) {
  Reader& r = *static_cast<Reader*>(user);
  Row row;
  for (size_t k = 0; k < r.params.size() && r.ok; ++k) {
    const auto a = small_int(isl_constraint_get_coefficient_val(c, isl_dim_param, r.params[k]));
    if (!a) r.ok = false;
    else row.a.push_back(*a);
  }
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

// C text of the expressions made here: iterators named by `names`, parameters (kFmaParameter + k) by
// `params`.
std::string c_text(const LoopExpr& e, const std::vector<std::string>& names, const std::vector<std::string>& params) {
  using K = LoopExpr::Kind;
  auto a = [&](size_t k) { return c_text(e.args[k], names, params); };
  switch (e.kind) {
    case K::constant: return std::to_string(e.value);
    case K::iterator:
      return e.iterator >= kFmaParameter ? params.at(static_cast<size_t>(e.iterator - kFmaParameter)) : names.at(static_cast<size_t>(e.iterator));
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

// A set over [parameters P, variables n] (rows: a over both, then b) scanned in the order of `members`
// (over the variables), each variable a member of its own or of one value (an affine form of the
// parameters). `box`: the parameters' ranges.
struct ScanInput {
  size_t P = 0, n = 0;
  std::vector<Row> rows;
  std::vector<Affine> members;
  std::vector<std::pair<int64_t, int64_t>> box;
};

// Per member: a loop (its iterator, its bounds) or one value; per variable: its value at the statement.
struct Scan {
  std::vector<Value> values;  // per column [parameters, members]
  std::vector<size_t> loop_members;
  std::vector<std::pair<LoopExpr, LoopExpr>> bounds;  // per loop: lower, upper
  std::vector<LoopExpr> args;
};

std::optional<Scan> scan(const ScanInput& in) {
  const size_t P = in.P, n = in.n, L = in.members.size(), C = P + L;
  // Each variable is a member of its own (the first one that is the variable alone) or has one value.
  std::vector<int> own(n, -1);
  std::vector<bool> owns(L, false);
  for (size_t d = 0; d < L; ++d) {
    const Affine& m = in.members[d];
    if (m.T != 1 || m.b != 0) continue;
    int v = -1;
    bool single = true;
    for (size_t j = 0; j < n && single; ++j) {
      if (m.a[j] == 0) continue;
      single = m.a[j] == 1 && v < 0;
      v = static_cast<int>(j);
    }
    if (single && v >= 0 && own[static_cast<size_t>(v)] < 0) {
      own[static_cast<size_t>(v)] = static_cast<int>(d);
      owns[d] = true;
    }
  }
  // A variable of one value: a lower and an upper bound of it alone, the same form of the parameters.
  std::vector<std::optional<Row>> fixed(n);  // over the parameters
  for (size_t j = 0; j < n; ++j) {
    if (own[j] >= 0) continue;
    std::vector<Row> lo, hi;
    for (const Row& r : in.rows) {
      bool alone = r.a[P + j] == 1 || r.a[P + j] == -1;
      for (size_t i = 0; i < n && alone; ++i) alone = i == j || r.a[P + i] == 0;
      if (!alone) continue;
      Row form{std::vector<int64_t>(r.a.begin(), r.a.begin() + static_cast<long>(P)), r.b};
      if (r.a[P + j] == 1) {  // d + form >= 0: d >= -form
        for (int64_t& x : form.a) x = -x;
        form.b = -form.b;
        lo.push_back(form);
      } else {
        hi.push_back(form);
      }
    }
    for (const Row& l : lo)
      for (const Row& h : hi)
        if (!fixed[j] && l.a == h.a && l.b == h.b) fixed[j] = l;
    if (!fixed[j]) return std::nullopt;
  }
  // The constraints over the columns: the rows, each variable replaced by its member or value, and
  // T c = floor(E) as 0 <= E - T c <= T - 1 for every member but the variables' own.
  auto substitute = [&](const std::vector<int64_t>& params, const std::vector<int64_t>& a, int64_t b) {
    Row r;
    r.a.assign(C, 0);
    std::copy(params.begin(), params.end(), r.a.begin());
    r.b = b;
    for (size_t j = 0; j < n; ++j) {
      const int64_t c = a[j];
      if (c == 0) continue;
      if (own[j] >= 0) {
        r.a[P + static_cast<size_t>(own[j])] += c;
        continue;
      }
      for (size_t p = 0; p < P; ++p) r.a[p] += c * fixed[j]->a[p];
      r.b += c * fixed[j]->b;
    }
    return r;
  };
  std::vector<Row> system;
  for (const Row& r : in.rows)
    system.push_back(substitute(std::vector<int64_t>(r.a.begin(), r.a.begin() + static_cast<long>(P)),
                                std::vector<int64_t>(r.a.begin() + static_cast<long>(P), r.a.end()), r.b));
  for (size_t d = 0; d < L; ++d) {
    if (owns[d]) continue;
    Row low = substitute(std::vector<int64_t>(P, 0), in.members[d].a, in.members[d].b);  // E - T c >= 0
    low.a[P + d] -= in.members[d].T;
    Row high = low;  // T - 1 - (E - T c) >= 0
    for (int64_t& x : high.a) x = -x;
    high.b = in.members[d].T - 1 - low.b;
    system.push_back(low);
    system.push_back(high);
  }
  auto only_parameters = [P](const std::vector<int64_t>& a) {
    return std::all_of(a.begin() + static_cast<long>(P), a.end(), [](int64_t x) { return x == 0; });
  };
  // Eliminated innermost first: loop k's bounds are the rows that still hold it. Rows of parameters
  // alone hold wherever the set has points: dropped, as isl drops a guard around all of it.
  std::vector<std::vector<Bound>> lowers(L), uppers(L);
  for (size_t k = L; k-- > 0;) {
    const size_t col = P + k;
    std::map<std::vector<int64_t>, int64_t> kept;  // coefficients -> the least constant (the tightest row)
    std::vector<Row> lo, hi;
    for (Row r : system) {
      normalize(r);
      if (r.a[col] > 0) lo.push_back(r);
      else if (r.a[col] < 0) hi.push_back(r);
      else {
        auto [it, added] = kept.emplace(r.a, r.b);
        if (!added) it->second = std::min(it->second, r.b);
      }
    }
    if (lo.empty() || hi.empty() || lo.size() * hi.size() > 4096) return std::nullopt;
    for (const Row& r : lo) {  // a c + rest >= 0: c >= ceil(-rest / a)
      Bound b{std::vector<int64_t>(r.a.begin(), r.a.begin() + static_cast<long>(col)), -r.b, r.a[col]};
      for (int64_t& x : b.a) x = -x;
      lowers[k].push_back(b);
    }
    for (const Row& r : hi) {  // -a c + rest >= 0: c <= floor(rest / a)
      Bound b{std::vector<int64_t>(r.a.begin(), r.a.begin() + static_cast<long>(col)), r.b, -r.a[col]};
      uppers[k].push_back(b);
    }
    for (const Row& l : lo)
      for (const Row& h : hi) {
        Row r;
        r.a.resize(C);
        for (size_t i = 0; i < C; ++i) r.a[i] = -h.a[col] * l.a[i] + l.a[col] * h.a[i];
        r.b = -h.a[col] * l.b + l.a[col] * h.b;
        normalize(r);
        if (std::any_of(r.a.begin(), r.a.end(), [](int64_t x) { return x <= -kLarge || x >= kLarge; }) || r.b <= -kLarge * kLarge ||
            r.b >= kLarge * kLarge)
          return std::nullopt;
        auto [it, added] = kept.emplace(r.a, r.b);
        if (!added) it->second = std::min(it->second, r.b);
      }
    system.clear();
    for (const auto& [a, b] : kept) {
      if (only_parameters(a)) {
        if (std::all_of(a.begin(), a.end(), [](int64_t x) { return x == 0; }) && b < 0) return std::nullopt;  // no points
        continue;
      }
      system.push_back(Row{a, b});
    }
  }
  // Outside in: each loop's range over the ranges outside it, its bounds without those another implies,
  // and a loop of one value left out (its value an affine form of what is outside), as isl leaves it out.
  Scan out;
  std::vector<std::pair<int64_t, int64_t>> box = in.box;
  box.resize(C);
  out.values.resize(C);
  for (size_t p = 0; p < P; ++p) out.values[p] = Value{false, {}, 0, kFmaParameter + static_cast<int>(p)};
  for (size_t k = 0; k < L; ++k) {
    const size_t col = P + k;
    std::vector<std::pair<int64_t, int64_t>> outer(box.begin(), box.begin() + static_cast<long>(col));
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
            std::vector<int64_t> diff(col);
            for (size_t t = 0; t < col; ++t) diff[t] = bounds[j].a[t] - bounds[i].a[t];
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
    box[col] = {lo, hi};
    // One value: one lower bound and one upper bound, the same affine form (a variable that another
    // member already is, a dimension of one value).
    if (lowers[k].size() == 1 && uppers[k].size() == 1 && lowers[k][0].den == 1 && uppers[k][0].den == 1 &&
        lowers[k][0].a == uppers[k][0].a && lowers[k][0].b == uppers[k][0].b) {
      auto [a, b] = expand(lowers[k][0].a, lowers[k][0].b, out.values);
      a.resize(C, 0);
      out.values[col] = Value{true, a, b, -1};
      continue;
    }
    out.values[col] = Value{false, {}, 0, static_cast<int>(out.loop_members.size())};
    auto expr = [&](const Bound& b, bool lower) {
      if (b.den == 1) return linear(b.a, b.b, out.values);
      return op(LoopExpr::Kind::floordiv, linear(b.a, lower ? b.b + b.den - 1 : b.b, out.values), constant(b.den));
    };
    auto chain = [&](const std::vector<Bound>& bounds, bool lower) {
      LoopExpr e = expr(bounds[0], lower);
      for (size_t i = 1; i < bounds.size(); ++i) e = op(lower ? LoopExpr::Kind::max : LoopExpr::Kind::min, std::move(e), expr(bounds[i], lower));
      return e;
    };
    out.bounds.emplace_back(chain(lowers[k], true), chain(uppers[k], false));
    out.loop_members.push_back(k);
  }
  // The statement's arguments: each variable's member value, or its one value.
  for (size_t j = 0; j < n; ++j) {
    std::vector<int64_t> form(C, 0);
    int64_t b = 0;
    if (own[j] >= 0) {
      form[P + static_cast<size_t>(own[j])] = 1;
    } else {
      std::copy(fixed[j]->a.begin(), fixed[j]->a.end(), form.begin());
      b = fixed[j]->b;
    }
    out.args.push_back(linear(form, b, out.values));
  }
  return out;
}

// The rows of `set`'s one basic set over [the parameters `params`, in that order, its variables]; nullopt
// when it has several, divisions, other parameters or large numbers.
std::optional<std::vector<Row>> rows_of(const isl::set& set, const std::vector<isl::id>& params) {
  if (set.n_basic_set() != 1 || isl_set_dim(set.get(), isl_dim_param) != static_cast<isl_size>(params.size())) return std::nullopt;
  Reader reader;
  reader.n = static_cast<int>(set.tuple_dim());
  for (const isl::id& p : params) {
    const int at = isl_set_find_dim_by_id(set.get(), isl_dim_param, p.get());
    if (at < 0) return std::nullopt;
    reader.params.push_back(at);
  }
  isl_basic_set_list* pieces = isl_set_get_basic_set_list(set.get());
  isl_basic_set* piece = isl_basic_set_list_get_at(pieces, 0);
  isl_basic_set_list_free(pieces);
  if (!piece) return std::nullopt;
  if (isl_basic_set_dim(piece, isl_dim_div) != 0 || isl_basic_set_foreach_constraint(piece, read_constraint, &reader) != isl_stat_ok)
    reader.ok = false;
  isl_basic_set_free(piece);
  if (!reader.ok) return std::nullopt;
  return reader.rows;
}

// C text of a scan's loops around `call`, loop k named names[k], marks above loops and the call.
std::string scan_text(const Scan& scan, const std::vector<std::string>& names, const std::vector<std::string>& params,
                      const std::vector<std::vector<std::string>>& marks,
                      const std::vector<std::string>& leaf, const std::string& call) {
  std::string text;
  std::vector<bool> braced;
  const size_t loops = scan.loop_members.size();
  for (size_t k = 0; k < loops; ++k) {
    const std::string indent(2 * k, ' ');
    if (k < marks.size())
      for (const std::string& name : marks[k]) text += indent + "// " + name + "\n";
    const std::string& c = names[k];
    const bool brace = !(k + 1 < loops ? (k + 1 < marks.size() ? marks[k + 1] : std::vector<std::string>{}) : leaf).empty();
    text += indent + "for (int " + c + " = " + c_text(scan.bounds[k].first, names, params) + "; " + c + " <= " +
            c_text(scan.bounds[k].second, names, params) + "; " + c + " += 1)" + (brace ? " {\n" : "\n");
    braced.push_back(brace);
  }
  const std::string indent(2 * loops, ' ');
  for (const std::string& name : leaf) text += indent + "// " + name + "\n";
  text += indent + call + "(";
  for (size_t j = 0; j < scan.args.size(); ++j) text += (j ? ", " : "") + c_text(scan.args[j], names, params);
  text += ");\n";
  for (size_t k = loops; k-- > 0;)
    if (braced[k]) text += std::string(2 * k, ' ') + "}\n";
  return text;
}

std::vector<LoopNode> scan_loops(const Scan& scan) {
  std::vector<LoopNode> loops;
  for (size_t k = 0; k < scan.loop_members.size(); ++k) {
    LoopNode loop;
    loop.kind = LoopNode::Kind::loop;
    loop.iterator = static_cast<int>(k);
    loop.lower = scan.bounds[k].first;
    loop.condition = op(LoopExpr::Kind::le, iterator(static_cast<int>(k)), scan.bounds[k].second);
    loop.step = 1;
    loops.push_back(std::move(loop));
  }
  return loops;
}

}  // namespace

std::optional<StepLoops> step_loops(const isl::schedule& tree, const StatementIds& ids, const std::set<int>& parallel_dims) {
  const isl::union_set domain = tree.domain();
  if (isl_union_set_n_set(domain.get()) != 1) return std::nullopt;
  const isl::set set = domain.set_list().at(0);
  if (!isl_set_has_tuple_id(set.get()) || isl::manage(isl_set_get_tuple_id(set.get())).get() != ids.block_step.get()) return std::nullopt;
  ScanInput in;
  in.n = set.tuple_dim();
  auto rows = rows_of(set, {});
  if (!rows) return std::nullopt;
  in.rows = std::move(*rows);
  // Marks and bands down to the leaf: each member, and the marks above each schedule dimension.
  const std::optional<direct::BandChain> chain = direct::band_chain(tree, ids);
  if (!chain) return std::nullopt;
  for (const isl::union_pw_aff& upa : chain->members) {
    auto m = member(upa, static_cast<int>(in.n));
    if (!m) return std::nullopt;
    in.members.push_back(*m);
  }
  if (in.members.empty()) return std::nullopt;
  std::optional<Scan> scanned = scan(in);
  if (!scanned || scanned->loop_members.empty()) return std::nullopt;
  // Marks go with the next loop; the rest, under the last loop, above the statement.
  std::vector<bool> has_loop(in.members.size(), false);
  for (size_t d : scanned->loop_members) has_loop[d] = true;
  const direct::LoopMarks placed = direct::loop_marks(*chain, has_loop);
  std::vector<std::string> names;  // isl's: c and the schedule dimension
  for (size_t d : scanned->loop_members) names.push_back("c" + std::to_string(d));
  StepLoops out;
  out.iterators = static_cast<int>(scanned->loop_members.size());
  out.args = scanned->args;
  out.ast = scan_text(*scanned, names, {}, placed.marks, placed.leaf, "Step");
  out.loops = scan_loops(*scanned);
  for (size_t k = 0; k < out.loops.size(); ++k)
    out.loops[k].parallel = placed.parallel[k] && parallel_dims.count(static_cast<int>(scanned->loop_members[k])) != 0;
  return out;
}

std::optional<FmaLoops> fma_loops(const isl::set& points, const std::vector<isl::id>& params, size_t reductions,
                                  const std::vector<std::pair<int64_t, int64_t>>& param_ranges) {
  ScanInput in;
  in.P = params.size();
  in.n = points.tuple_dim();
  if (reductions > in.n || param_ranges.size() != in.P) return std::nullopt;
  auto rows = rows_of(points, params);
  if (!rows) return std::nullopt;
  in.rows = std::move(*rows);
  for (size_t k = 0; k < reductions; ++k) {
    Affine m;
    m.a.assign(in.n, 0);
    m.a[in.n - reductions + k] = 1;
    in.members.push_back(m);
  }
  in.box = param_ranges;
  std::optional<Scan> scanned = scan(in);
  if (!scanned) return std::nullopt;
  FmaLoops out;
  std::vector<std::string> names;
  for (size_t d : scanned->loop_members) names.push_back("r" + std::to_string(d));
  std::vector<std::string> param_names;
  for (const isl::id& p : params) param_names.push_back(p.name());
  out.text = scan_text(*scanned, names, param_names, {}, {}, "F");
  out.loops = scan_loops(*scanned);
  out.args = scanned->args;
  return out;
}

}  // namespace polytile::sched::internal
