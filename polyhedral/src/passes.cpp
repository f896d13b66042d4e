// reduce and defract (see passes.h and seed 000). Data model: a contraction's index variables x form a
// vector; every polynomial is split into its linear part over x (a rational row) and the rest (dims and
// constants), so a change of variables x = x0 + M z is a substitution into the linear parts. Integrality
// questions go to the lattice library, with the constants of the index expressions; dims inside index
// expressions are integers, so they matter only when their coefficient is fractional, and then the
// passes decline.
#include "polytile/passes.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <set>

#include "polytile/error.h"
#include "polytile/lattice.h"
#include "isl_text.h"

namespace polytile::poly {
namespace {

using RatRow = std::vector<Rational>;

RatRow linear_part(const Polynomial& p, const std::vector<std::string>& vars) {
  RatRow row;
  for (const auto& v : vars) row.push_back(p.coefficient(v));
  return row;
}

// p with its index terms removed (dims and constant).
Polynomial non_index_part(const Polynomial& p) {
  Polynomial rest = p;
  for (const auto& [name, c] : p.index_terms()) rest = rest - Polynomial::index(name) * c;
  return rest;
}

// Substitutes x_k := exprs[k] (polynomials over new variables) into p.
Polynomial substitute(const Polynomial& p, const std::vector<std::string>& vars, const std::vector<Polynomial>& exprs) {
  Polynomial out = non_index_part(p);
  for (size_t k = 0; k < vars.size(); ++k) {
    Rational c = p.coefficient(vars[k]);
    if (!c.is_zero()) out = out + exprs[k] * c;
  }
  return out;
}

Contraction substitute_all(const Contraction& c, const std::vector<std::string>& vars, const std::vector<Polynomial>& exprs) {
  Contraction r = c;
  for (auto& p : r.output_indices) p = substitute(p, vars, exprs);
  for (auto& a : r.inputs)
    for (auto& p : a.indices) p = substitute(p, vars, exprs);
  for (auto& k : r.constraints) k.poly = substitute(k.poly, vars, exprs);
  return r;
}

// Echelon form over the rationals, to select linearly independent rows greedily.
class RowSpace {
 public:
  explicit RowSpace(size_t n) : n_(n) {}
  // Adds the row if it is independent of the rows so far; returns whether it was.
  bool add(RatRow row) {
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Rational f = row[pivots_[i]];  // a copy: row changes below
      if (f.is_zero()) continue;
      for (size_t k = 0; k < n_; ++k) row[k] = row[k] - rows_[i][k] * f;
    }
    for (size_t k = 0; k < n_; ++k) {
      if (row[k].is_zero()) continue;
      Rational inv = Rational(1) / row[k];
      for (auto& x : row) x = x * inv;
      for (size_t i = 0; i < rows_.size(); ++i) {  // keep the basis fully reduced
        const Rational f = rows_[i][k];
        if (f.is_zero()) continue;
        for (size_t j = 0; j < n_; ++j) rows_[i][j] = rows_[i][j] - row[j] * f;
      }
      rows_.push_back(row);
      pivots_.push_back(k);
      return true;
    }
    return false;
  }
  size_t rank() const { return rows_.size(); }

 private:
  size_t n_;
  std::vector<RatRow> rows_;
  std::vector<size_t> pivots_;
};

std::vector<RatRow> invert(std::vector<RatRow> a) {
  const size_t n = a.size();
  std::vector<RatRow> inv(n, RatRow(n, Rational(0)));
  for (size_t i = 0; i < n; ++i) inv[i][i] = Rational(1);
  for (size_t col = 0; col < n; ++col) {
    size_t piv = col;
    while (piv < n && a[piv][col].is_zero()) ++piv;
    POLYTILE_CHECK(piv < n, "singular change of variables");
    std::swap(a[piv], a[col]);
    std::swap(inv[piv], inv[col]);
    Rational f = Rational(1) / a[col][col];
    for (size_t k = 0; k < n; ++k) {
      a[col][k] = a[col][k] * f;
      inv[col][k] = inv[col][k] * f;
    }
    for (size_t r = 0; r < n; ++r) {
      if (r == col || a[r][col].is_zero()) continue;
      Rational g = a[r][col];
      for (size_t k = 0; k < n; ++k) {
        a[r][k] = a[r][k] - a[col][k] * g;
        inv[r][k] = inv[r][k] - inv[col][k] * g;
      }
    }
  }
  return inv;
}

std::set<std::string> dim_symbols(const Contraction& c) {
  std::vector<std::string> used;
  for (const auto& p : c.output_indices) p.collect_dim_symbols(used);
  for (const auto& a : c.inputs)
    for (const auto& p : a.indices) p.collect_dim_symbols(used);
  for (const auto& k : c.constraints) {
    k.poly.collect_dim_symbols(used);
    k.bound.collect_symbols(used);
  }
  for (const auto& d : c.output_shape) d.collect_symbols(used);
  return {used.begin(), used.end()};
}

// Index expressions (they must be integral); constraints are not.
std::vector<Polynomial> index_expressions(const Contraction& c) {
  std::vector<Polynomial> out = c.output_indices;
  for (const auto& a : c.inputs) out.insert(out.end(), a.indices.begin(), a.indices.end());
  return out;
}

// p == +-v + (an integer for every value of the dims)
bool is_unit_variable(const Polynomial& p, const std::string& v) {
  const auto& terms = p.index_terms();
  if (terms.size() != 1 || terms.begin()->first != v) return false;
  const Rational& c = terms.begin()->second;
  if (!(c == Rational(1) || c == Rational(-1)) || !p.constant().is_integer()) return false;
  return (non_index_part(p) - Polynomial(p.constant())).dims_as_expr().has_value();
}

bool has_fraction(const Polynomial& p) {
  if (!p.constant().is_integer()) return true;
  for (const auto& [name, c] : p.index_terms())
    if (!c.is_integer()) return true;
  return false;
}

// The integral points of `polys` over `vars`; nullopt inside the optional when there are none. Returns
// an empty outer optional (with `why`) when the question cannot be answered exactly.
struct LatticeQuery {
  bool ok = false;
  std::optional<lattice::IntegralityLattice> lattice;
  std::string why;
};

LatticeQuery integral_points(const std::vector<Polynomial>& polys, const std::vector<std::string>& vars) {
  LatticeQuery q;
  int64_t den = 1;
  for (const auto& p : polys) {
    den = std::lcm(den, p.constant().den());
    for (const auto& [name, c] : p.index_terms()) den = std::lcm(den, c.den());
    // Dims are integers: only a fractional coefficient on a dim makes integrality depend on sizes.
    Polynomial dims_only = non_index_part(p) - Polynomial(p.constant());
    if (!dims_only.dims_as_expr()) {
      q.why = "an index expression has a fractional coefficient on a dim (" + p.str() + ")";
      return q;
    }
  }
  lattice::RatMatrix R{lattice::IntMatrix(polys.size(), vars.size()), den};
  std::vector<int64_t> c(polys.size());
  for (size_t k = 0; k < polys.size(); ++k) {
    for (size_t i = 0; i < vars.size(); ++i) R.num(k, i) = (polys[k].coefficient(vars[i]) * Rational(den)).num();
    c[k] = (polys[k].constant() * Rational(den)).num();
  }
  try {
    q.lattice = lattice::integrality_lattice(R, c);
    q.ok = true;
  } catch (const lattice::LatticeError& e) {
    q.why = std::string("lattice computation failed: ") + e.what();
  }
  return q;
}

bool same_points(const std::optional<lattice::IntegralityLattice>& a, const std::optional<lattice::IntegralityLattice>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->offset == b->offset && a->basis == b->basis);
}

// Ranking of basis candidates after the outputs: the tightest known range first.
int64_t range_of(const std::string& tensor, size_t axis, const PassContext& ctx) {
  if (!ctx.types) return std::numeric_limits<int64_t>::max();
  auto it = ctx.types->tensors.find(tensor);
  if (it == ctx.types->tensors.end() || axis >= it->second.shape.size()) return std::numeric_limits<int64_t>::max();
  return it->second.shape[axis];
}

int64_t bound_of(const DimExpr& bound, const PassContext& ctx) {
  if (bound.is_constant()) return bound.value();
  if (!ctx.types) return std::numeric_limits<int64_t>::max();
  try {
    return bound.evaluate(ctx.types->dims);
  } catch (const UserError&) {
    return std::numeric_limits<int64_t>::max();
  }
}

}  // namespace

PassResult reduce(const Contraction& c, const PassContext& ctx) {
  PassResult r{c, false, "", std::nullopt};
  bool needed = false;
  for (const auto& p : c.output_indices) needed |= p.index_terms().size() >= 2;
  if (!needed) {
    r.reason = "every output index of " + c.output + " is already a single variable";
    return r;
  }
  const std::vector<std::string> vars = c.index_variables();
  const size_t n = vars.size();

  // Candidate rows: outputs first, then constraints and accesses, tightest first, then unit vectors. Each new
  // variable is z = row . x + offset, where offset is the fractional part of the candidate's constant, so
  // that the candidate becomes z + (an integer): (l + k + 1)/2 becomes v0 + 0 with v0 = (l + k)/2 + 1/2.
  // A new variable must be an integer at every valid point of the original: index expressions are (that
  // is the valid-indices rule), unit vectors are, and a constraint is offered only when the lattice proves
  // it integral wherever the index expressions are (i/2 < 2 is not, and would drop every odd i).
  struct Candidate {
    int64_t range;
    size_t order;
    RatRow row;
    Rational offset;
  };
  const std::vector<Polynomial> polys_before = index_expressions(c);
  std::optional<LatticeQuery> lattice_before;
  auto integral_where_valid = [&](const Polynomial& p) {
    if (!(non_index_part(p) - Polynomial(p.constant())).dims_as_expr()) return false;
    bool integer_coefficients = std::all_of(p.index_terms().begin(), p.index_terms().end(),
                                            [](const auto& t) { return t.second.is_integer(); });
    if (integer_coefficients && p.constant().is_integer()) return true;
    if (!lattice_before) lattice_before = integral_points(polys_before, vars);
    std::vector<Polynomial> with = polys_before;
    with.push_back(p);
    LatticeQuery after = integral_points(with, vars);
    return lattice_before->ok && after.ok && same_points(lattice_before->lattice, after.lattice);
  };
  auto fraction_of = [](const Rational& r) {
    int64_t q = r.num() / r.den();
    if (r.num() % r.den() != 0 && r.num() < 0) --q;
    return r - Rational(q);
  };
  std::vector<Candidate> rest;
  size_t order = 0;
  for (const auto& k : c.constraints) {
    // A constraint's value need not be integral; only its linear part plus an offset can become a variable.
    Polynomial linear = non_index_part(k.poly);
    Polynomial shifted = k.poly - linear + Polynomial(fraction_of(k.poly.constant()));
    if (integral_where_valid(shifted))
      rest.push_back({bound_of(k.bound, ctx), order, linear_part(k.poly, vars), fraction_of(k.poly.constant())});
    ++order;
  }
  for (const auto& a : c.inputs)
    for (size_t axis = 0; axis < a.indices.size(); ++axis)
      rest.push_back({range_of(a.tensor, axis, ctx), order++, linear_part(a.indices[axis], vars),
                      fraction_of(a.indices[axis].constant())});
  std::stable_sort(rest.begin(), rest.end(), [](const Candidate& a, const Candidate& b) { return a.range < b.range; });

  RowSpace space(n);
  std::vector<RatRow> basis;
  std::vector<Rational> offsets;
  auto offer = [&](const RatRow& row, const Rational& offset) {
    if (basis.size() < n && space.add(row)) {
      basis.push_back(row);
      offsets.push_back(offset);
    }
  };
  for (const auto& p : c.output_indices) offer(linear_part(p, vars), fraction_of(p.constant()));
  for (const auto& cand : rest) offer(cand.row, cand.offset);
  for (size_t k = 0; k < n; ++k) {
    RatRow unit(n, Rational(0));
    unit[k] = Rational(1);
    offer(unit, Rational(0));
  }
  POLYTILE_CHECK(basis.size() == n, "basis completion failed");

  std::set<std::string> taken = dim_symbols(c);
  std::vector<std::string> new_vars;
  for (size_t k = 0; k < n; ++k) {
    std::string base = "v";
    base += std::to_string(k);
    new_vars.push_back(fresh_name(base, taken));
  }
  // z = B x + b, so x = B^-1 (z - b).
  std::vector<RatRow> inv = invert(basis);
  std::vector<Polynomial> old_exprs(n);  // x_k as a polynomial of the new variables
  for (size_t k = 0; k < n; ++k)
    for (size_t j = 0; j < n; ++j)
      if (!inv[k][j].is_zero()) old_exprs[k] = old_exprs[k] + (Polynomial::index(new_vars[j]) - Polynomial(offsets[j])) * inv[k][j];

  Contraction out = substitute_all(c, vars, old_exprs);
  // The old variables were integers. If the change of variables is not unimodular, the index expressions
  // must still imply that, or the reduced contraction would admit points the original did not.
  // Fast path: an old variable is surely integral when some original index expression is +-x + integer.
  bool implied = true;
  for (size_t k = 0; k < n && implied; ++k) {
    bool integral_row = std::all_of(inv[k].begin(), inv[k].end(), [](const Rational& x) { return x.is_integer(); }) &&
                        old_exprs[k].constant().is_integer();
    if (integral_row) continue;
    implied = std::any_of(polys_before.begin(), polys_before.end(),
                          [&](const Polynomial& p) { return is_unit_variable(p, vars[k]); });
  }
  if (!implied) {
    std::vector<Polynomial> polys = index_expressions(out);
    LatticeQuery without = integral_points(polys, new_vars);
    polys.insert(polys.end(), old_exprs.begin(), old_exprs.end());
    LatticeQuery with = integral_points(polys, new_vars);
    if (!without.ok || !with.ok) {
      r.reason = "reduce of " + c.output + " declined: " + (without.ok ? with.why : without.why);
      return r;
    }
    if (!same_points(without.lattice, with.lattice)) {
      r.reason = "reduce of " + c.output +
                 " declined: the index expressions would not keep every original index variable integral";
      return r;
    }
  }
  r.contraction = std::move(out);
  r.changed = true;
  r.substitution = Substitution{vars, old_exprs};
  return r;
}

PassResult defract(const Contraction& c, const PassContext& /*ctx*/) {
  PassResult r{c, false, "", std::nullopt};
  std::vector<Polynomial> polys = index_expressions(c);
  bool fractional = std::any_of(polys.begin(), polys.end(), has_fraction);
  bool fractional_constraints =
      std::any_of(c.constraints.begin(), c.constraints.end(), [](const Constraint& k) { return has_fraction(k.poly); });
  if (!fractional && !fractional_constraints) {
    r.reason = "contraction " + c.output + " has no fractional coefficients";
    return r;
  }

  // Output variables first, in order of appearance in the output indices.
  std::vector<std::string> vars;
  for (const auto& p : c.output_indices)
    for (const auto& [v, coeff] : p.index_terms())
      if (std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(v);
  const size_t n_out = vars.size();
  for (const auto& v : c.index_variables())
    if (std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(v);
  const size_t n = vars.size();

  Contraction out = c;
  if (fractional) {
    LatticeQuery q = integral_points(polys, vars);
    if (!q.ok) {
      r.reason = "defract of " + c.output + " declined: " + q.why;
      return r;
    }
    if (!q.lattice) {
      r.reason = "defract of " + c.output + " declined: no point makes every index integral, the contraction writes nothing";
      return r;
    }
    const lattice::IntMatrix& H = q.lattice->basis;
    const std::vector<int64_t>& x0 = q.lattice->offset;

    // Columns of the parametrization x = x0 + P z, with the owner variable of each column.
    struct Column {
      std::vector<int64_t> values;
      size_t owner;
      int kind;  // 0: digit t_i, 1: free part u_i of an output variable, 2: reduction variable
    };
    std::vector<Column> cols;
    std::vector<std::pair<size_t, int64_t>> digits;  // column index, radix
    for (size_t i = 0; i < n; ++i) {
      std::vector<int64_t> h = H.column(i);
      if (i >= n_out) {
        cols.push_back({h, i, 2});
        continue;
      }
      int64_t m = 1;  // smallest m with m e_i in the lattice
      for (const auto& p : polys) m = std::lcm(m, p.coefficient(vars[i]).den());
      POLYTILE_CHECK(m % H(i, i) == 0, "lattice diagonal does not divide the radix");
      int64_t radix = m / H(i, i);
      if (radix > 1) {
        digits.emplace_back(cols.size(), radix);
        cols.push_back({h, i, 0});
      }
      std::vector<int64_t> e(n, 0);
      e[i] = m;
      cols.push_back({e, i, 1});
    }

    // Names: a column keeps its owner's name when the owner becomes exactly that column's variable.
    std::set<std::string> taken = dim_symbols(c);
    std::vector<std::string> names(cols.size());
    for (size_t j = 0; j < cols.size(); ++j) {
      size_t owner = cols[j].owner;
      bool plain = x0[owner] == 0 && cols[j].values[owner] == 1;
      for (size_t l = 0; l < cols.size() && plain; ++l)
        if (l != j && cols[l].values[owner] != 0) plain = false;
      if (plain) names[j] = fresh_name(vars[owner], taken);
    }
    for (size_t j = 0; j < cols.size(); ++j)
      if (names[j].empty()) {
        std::string base = vars[cols[j].owner];
        base.append(cols[j].kind == 1 ? "_1" : "_0");
        names[j] = fresh_name(base, taken);
      }

    std::vector<Polynomial> exprs(n);
    for (size_t k = 0; k < n; ++k) {
      exprs[k] = Polynomial(Rational(x0[k]));
      for (size_t j = 0; j < cols.size(); ++j)
        if (cols[j].values[k] != 0) exprs[k] = exprs[k] + Polynomial::index(names[j]) * Rational(cols[j].values[k]);
    }
    out = substitute_all(c, vars, exprs);
    Substitution sub;
    sub.old_variables = c.index_variables();
    for (const auto& v : sub.old_variables)
      sub.values.push_back(exprs[static_cast<size_t>(std::find(vars.begin(), vars.end(), v) - vars.begin())]);
    r.substitution = std::move(sub);
    for (const auto& [col, radix] : digits) out.constraints.push_back({Polynomial::index(names[col]), DimExpr(radix)});
    for (const auto& p : index_expressions(out))
      POLYTILE_CHECK(!has_fraction(p), "defract left a fractional index expression ", p.str());
  }
  // Constraints only bound their polynomial; scale fractional ones to integer coefficients.
  for (auto& k : out.constraints) {
    if (!has_fraction(k.poly)) continue;
    int64_t d = k.poly.constant().den();
    for (const auto& [name, coeff] : k.poly.index_terms()) d = std::lcm(d, coeff.den());
    k.poly = k.poly * Rational(d);
    k.bound = k.bound * DimExpr(d);
  }
  if (!r.substitution) r.substitution = identity_substitution(c);
  r.contraction = std::move(out);
  r.changed = true;
  return r;
}

static Program map_contractions(const Program& p, const std::function<Contraction(const Contraction&)>& f) {
  Program out = p;
  for (auto& st : out.statements)
    if (auto* c = std::get_if<Contraction>(&st)) *c = f(*c);
  return out;
}

// Symbolic shapes where the program states them: inputs as declared, contractions as written, elementwise
// results where broadcasting pairs equal dims or a constant 1 (unknown otherwise).
static std::map<std::string, std::vector<DimExpr>> symbolic_shapes(const Program& p) {
  std::map<std::string, std::vector<DimExpr>> shapes;
  for (const auto& in : p.inputs) shapes[in.name] = in.dims;
  for (const auto& st : p.statements) {
    if (const auto* c = std::get_if<Contraction>(&st)) {
      shapes[c->output] = c->output_shape;
      continue;
    }
    const auto& e = std::get<Elementwise>(st);
    std::vector<std::string> used;
    e.expr.collect_tensors(used);
    std::vector<DimExpr> shape;
    bool known = true;
    for (const auto& t : used) {
      auto it = shapes.find(t);
      if (it == shapes.end()) {
        known = false;
        break;
      }
      std::vector<DimExpr> a = shape, b = it->second;
      while (a.size() < b.size()) a.insert(a.begin(), DimExpr(1));
      while (b.size() < a.size()) b.insert(b.begin(), DimExpr(1));
      for (size_t k = 0; k < a.size() && known; ++k) {
        if (a[k] == b[k] || (b[k].is_constant() && b[k].value() == 1)) continue;
        if (a[k].is_constant() && a[k].value() == 1) a[k] = b[k];
        else known = false;
      }
      shape = a;
    }
    if (known) shapes[e.output] = shape;
  }
  return shapes;
}

// Whether the index variables can move together along some direction that changes no index expression
// and no constraint (their linear parts have a kernel): every one of them is bounded on both sides by a
// size, so the contraction ranges over an unbounded set wherever it has points, which analyze and the
// interpreter refuse as an unbounded index variable. A rewrite cannot keep such a direction (defract
// dropped one and made the program run, summing over one point of each line, where the interpreter
// refuses it), so a contraction with one is left as written, whatever its sizes.
static bool has_free_direction(const Contraction& c) {
  const std::vector<std::string> vars = c.index_variables();
  std::vector<const Polynomial*> forms;
  for (const Polynomial& p : c.output_indices) forms.push_back(&p);
  for (const TensorAccess& a : c.inputs)
    for (const Polynomial& p : a.indices) forms.push_back(&p);
  for (const Constraint& k : c.constraints) forms.push_back(&k.poly);
  if (vars.empty()) return false;
  if (forms.empty()) return true;
  lattice::IntMatrix linear(forms.size(), vars.size());
  for (size_t r = 0; r < forms.size(); ++r) {
    const isl_text::Form f = isl_text::make_form(*forms[r], vars);  // the row scaled to integers
    for (size_t k = 0; k < vars.size(); ++k) linear(r, k) = f.coeffs[k];
  }
  return lattice::kernel_basis(linear).cols() > 0;
}

// Runs one pass on a contraction, logs a decline, and proves a change when asked to: for every size where
// isl can express the sizes, else at the sizes in ctx.types.
static Contraction run_pass(const char* name, PassResult (*pass)(const Contraction&, const PassContext&), const Contraction& c,
                            const PassContext& ctx, const std::map<std::string, std::vector<DimExpr>>& shapes,
                            std::vector<std::string>* log) {
  if (has_free_direction(c)) {
    if (log) log->push_back(std::string(name) + ": " + c.output + " has index variables that no index or constraint bounds: left as written");
    return c;
  }
  PassResult r = pass(c, ctx);
  if (!r.changed && log) log->push_back(std::string(name) + ": " + r.reason);
  if (r.changed && ctx.verify) {
    if (verify_rewrite_for_all_sizes(name, c, r.contraction, shapes, *r.substitution)) {
      if (log) log->push_back(std::string(name) + ": " + c.output + " proven for all sizes");
      return r.contraction;
    }
    if (!ctx.types)
      user_error("cannot prove ", name, " of ", c.output, " for all sizes (isl cannot express its sizes); give the input shapes");
    RewriteContext rc;
    rc.types = ctx.types;
    verify_rewrite(name, c, r.contraction, rc, r.substitution);
    if (log) log->push_back(std::string(name) + ": " + c.output + " proven at the given sizes");
  }
  return r.contraction;
}

Program reduce_program(const Program& p, const PassContext& ctx, std::vector<std::string>* log) {
  const auto shapes = ctx.verify ? symbolic_shapes(p) : std::map<std::string, std::vector<DimExpr>>{};
  return map_contractions(p, [&](const Contraction& c) { return run_pass("reduce", reduce, c, ctx, shapes, log); });
}

Program reduce_and_defract(const Program& p, const PassContext& ctx, std::vector<std::string>* log) {
  Program reduced = reduce_program(p, ctx, log);
  const auto shapes = ctx.verify ? symbolic_shapes(reduced) : std::map<std::string, std::vector<DimExpr>>{};
  return map_contractions(reduced, [&](const Contraction& c) { return run_pass("defract", defract, c, ctx, shapes, log); });
}

}  // namespace polytile::poly
