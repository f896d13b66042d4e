// Private to polyhedral/: contractions as isl sets and maps, shared by the analysis (polyhedral.cpp) and
// translation validation (verify.cpp). With concrete dims, every index expression and constraint becomes an
// affine form with integer coefficients over a common denominator D; the domain is a set S_<output>[vars]:
// an index expression requires "exists e: D*e = form and 0 <= e < dim", a constraint "0 <= form < D*bound".
// Accesses map the domain tuple to the tensor's tuple with the same equalities. The sets and maps are built
// through isl's API, constraint by constraint: isl's text parser (affine expressions as piecewise
// functions, then intersections and hulls) cost more than the analysis that reads them.
#pragma once

#include <isl/constraint.h>
#include <isl/cpp.h>
#include <isl/point.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "polytile/error.h"
#include "polytile/ir.h"
#include "polytile/isl_support.h"
#include "polytile/shapes.h"

namespace polytile::poly::isl_text {

using isl_support::IslContext;

inline const std::set<std::string>& isl_keywords() {
  static const std::set<std::string> words = {"and", "or", "not", "exists", "mod", "floor", "ceil", "min", "max",
                                              "true", "false", "infty", "NaN", "implies", "xor", "rat", "domain",
                                              "range", "params", "e", "o"};
  return words;
}

// User index names, renamed where they would clash with isl keywords or with the names generated here
// (ex<k> for existentials, o<k> for access outputs).
inline std::string isl_name(const std::string& v) {
  auto generated = [&v](const std::string& prefix) {
    return v.size() > prefix.size() && v.compare(0, prefix.size(), prefix) == 0 &&
           std::all_of(v.begin() + static_cast<long>(prefix.size()), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  return isl_keywords().count(v) || generated("ex") || generated("o") ? v + "_" : v;
}

// An affine form num(x) / den with num = sum coeffs[k] * x_k + constant.
struct Form {
  std::vector<int64_t> coeffs;
  int64_t constant = 0;
  int64_t den = 1;
};

inline Form make_form(const Polynomial& bound, const std::vector<std::string>& vars) {
  Form f;
  int64_t d = bound.constant().den();
  for (const auto& [name, c] : bound.index_terms()) d = std::lcm(d, c.den());
  f.den = d;
  f.constant = (bound.constant() * Rational(d)).num();
  for (const auto& v : vars) f.coeffs.push_back((bound.coefficient(v) * Rational(d)).num());
  return f;
}

inline std::string form_text(const Form& f, const std::vector<std::string>& vars) {
  std::string s;
  for (size_t k = 0; k < vars.size(); ++k) {
    int64_t c = f.coeffs[k];
    if (c == 0) continue;
    std::string term = (c == 1 || c == -1) ? isl_name(vars[k]) : std::to_string(std::llabs(c)) + "*" + isl_name(vars[k]);
    if (s.empty()) {
      s = (c < 0 ? "-" : "") + term;
    } else {
      s += (c < 0 ? " - " : " + ") + term;
    }
  }
  if (f.constant != 0 || s.empty()) {
    if (s.empty()) {
      s = std::to_string(f.constant);
    } else {
      s += (f.constant < 0 ? " - " : " + ") + std::to_string(std::llabs(f.constant));
    }
  }
  return s;
}

using isl_support::join;

// A condition of a contraction's domain: 0 <= num(form) <= hi, or with `strided`, "exists e: form.den * e =
// num(form) and 0 <= e <= hi" (num: the form's numerator, sum coeffs[k] * x_k + constant).
struct Condition {
  Form form;
  int64_t hi = 0;
  bool strided = false;
};

// The contraction with dims bound.
struct ConcreteContraction {
  std::vector<std::string> vars;
  std::string name;                     // the domain's tuple: S_O
  std::vector<Condition> conditions;    // the domain's
  std::vector<std::pair<std::string, std::vector<Form>>> accesses;  // [0] is the write
  std::vector<std::vector<int64_t>> dims;                           // per access
};

inline ConcreteContraction concretize(const Contraction& c, const ProgramTypes& types, const std::string& tuple_name = "") {
  ConcreteContraction cc;
  cc.vars = c.index_variables();
  cc.name = tuple_name.empty() ? "S_" + c.output : tuple_name;
  auto add_access = [&](const std::string& tensor, const std::vector<Polynomial>& idx) {
    const auto& shape = types.tensors.at(tensor).shape;
    std::vector<Form> forms;
    for (size_t k = 0; k < idx.size(); ++k) {
      Form f = make_form(idx[k].bind_dims(types.dims), cc.vars);
      cc.conditions.push_back({f, shape[k] - 1, f.den != 1});
      forms.push_back(f);
    }
    cc.accesses.emplace_back(tensor, forms);
    cc.dims.push_back(shape);
  };
  add_access(c.output, c.output_indices);
  for (const auto& a : c.inputs) add_access(a.tensor, a.indices);
  for (const auto& k : c.constraints) {
    Form f = make_form(k.poly.bind_dims(types.dims), cc.vars);
    cc.conditions.push_back({f, k.bound.evaluate(types.dims) * f.den - 1, false});
  }
  return cc;
}

// `b` with the constraint in . x_in + out . x_out + constant = 0 (`equality`) or >= 0 (a set's dims are its
// output dims; missing coefficients are zero).
template <typename Basic>
Basic add_constraint(Basic b, bool equality, const std::vector<int64_t>& in, const std::vector<int64_t>& out, int64_t constant) {
  isl_ctx* ctx = b.ctx().get();
  isl_local_space* ls = isl_local_space_from_space(b.space().release());
  isl_constraint* c = equality ? isl_constraint_alloc_equality(ls) : isl_constraint_alloc_inequality(ls);
  for (auto [type, coeffs] : {std::pair{isl_dim_in, &in}, std::pair{isl_dim_out, &out}})
    for (size_t k = 0; k < coeffs->size(); ++k)
      if ((*coeffs)[k] != 0)
        c = isl_constraint_set_coefficient_val(c, type, static_cast<int>(k), isl_val_int_from_si(ctx, (*coeffs)[k]));
  c = isl_constraint_set_constant_val(c, isl_val_int_from_si(ctx, constant));
  if constexpr (std::is_same_v<Basic, isl::basic_set>) {
    return isl::manage(isl_basic_set_add_constraint(b.release(), c));
  } else {
    return isl::manage(isl_basic_map_add_constraint(b.release(), c));
  }
}

// The space of the contraction's domain (`extra` unnamed dims after its variables).
inline isl::space domain_space(isl::ctx ctx, const ConcreteContraction& cc, unsigned extra = 0) {
  std::vector<std::string> dims;
  for (const auto& v : cc.vars) dims.push_back(isl_name(v));
  dims.resize(dims.size() + extra);
  return isl_support::set_space(ctx, cc.name, dims);
}

inline std::vector<int64_t> negated(const std::vector<int64_t>& coeffs) {
  std::vector<int64_t> out;
  for (int64_t c : coeffs) out.push_back(-c);
  return out;
}

// The contraction's domain: its points where every access is in bounds and every constraint holds.
inline isl::set domain_set(isl::ctx ctx, const ConcreteContraction& cc) {
  size_t n = cc.vars.size();
  unsigned strided = 0;
  for (const auto& c : cc.conditions) strided += c.strided;
  isl::basic_set b = isl::manage(isl_basic_set_universe(domain_space(ctx, cc, strided).release()));
  size_t e = n;  // the next existential
  for (const auto& c : cc.conditions) {
    const std::vector<int64_t> neg = negated(c.form.coeffs);
    if (!c.strided) {
      b = add_constraint(b, false, {}, c.form.coeffs, c.form.constant);
      b = add_constraint(b, false, {}, neg, c.hi - c.form.constant);
      continue;
    }
    std::vector<int64_t> at_e(e + 1, 0), eq = neg;
    at_e[e] = 1;
    eq.resize(e + 1, 0);
    eq[e] = c.form.den;
    b = add_constraint(b, true, {}, eq, -c.form.constant);
    b = add_constraint(b, false, {}, at_e, 0);
    at_e[e] = -1;
    b = add_constraint(b, false, {}, at_e, c.hi);
    ++e;
  }
  if (!strided) return isl::set(b);
  // Projecting the existentials out drops the tuple's name: set it again.
  isl_basic_set* p = isl_basic_set_project_out(b.release(), isl_dim_set, static_cast<unsigned>(n), strided);
  return isl::manage(isl_set_set_tuple_name(isl_set_from_basic_set(p), cc.name.c_str()));
}

// The map from the contraction's domain tuple to tensor[o0, o1, ...] with den_k * o_k = num(forms[k]).
inline isl::map form_map(isl::ctx ctx, const ConcreteContraction& cc, const std::string& tensor, const std::vector<Form>& forms) {
  isl_space* s = isl_space_map_from_domain_and_range(domain_space(ctx, cc).release(),
                                                     isl_space_set_alloc(ctx.get(), 0, static_cast<unsigned>(forms.size())));
  s = isl_space_set_tuple_name(s, isl_dim_out, tensor.c_str());
  for (size_t k = 0; k < forms.size(); ++k) s = isl_space_set_dim_name(s, isl_dim_out, static_cast<unsigned>(k), ("o" + std::to_string(k)).c_str());
  isl::basic_map b = isl::manage(isl_basic_map_universe(s));
  for (size_t k = 0; k < forms.size(); ++k) {
    std::vector<int64_t> out(k + 1, 0);
    out[k] = forms[k].den;
    b = add_constraint(b, true, negated(forms[k].coeffs), out, -forms[k].constant);
  }
  return isl::map(b);
}

inline isl::map access_map(isl::ctx ctx, const ConcreteContraction& cc, size_t i) {
  return form_map(ctx, cc, cc.accesses[i].first, cc.accesses[i].second);
}

inline int64_t to_int(const isl::val& v, const std::string& what) {
  if (!v.is_int()) user_error(what);
  return v.get_num_si();
}

inline std::vector<int64_t> point_coordinates(const isl::point& p, int n) {
  std::vector<int64_t> out;
  for (int k = 0; k < n; ++k) {
    isl::val v = isl::manage(isl_point_get_coordinate_val(p.get(), isl_dim_set, k));
    out.push_back(v.get_num_si());
  }
  return out;
}

inline std::string point_text(const std::vector<std::string>& vars, const std::vector<int64_t>& x, size_t offset) {
  std::string s;
  for (size_t k = 0; k < vars.size(); ++k) s += (k ? ", " : "") + vars[k] + "=" + std::to_string(x[offset + k]);
  return s;
}

// Drops redundant constraints so printed sets read like the contraction they came from.
inline isl::set simplify(isl::set s) { return isl::manage(isl_set_remove_redundancies(s.release())).coalesce(); }
inline isl::map simplify(isl::map m) { return isl::manage(isl_map_remove_redundancies(m.release())).coalesce(); }

using isl_support::text;

template <typename F>
auto with_isl_errors(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const isl::exception& e) {
    throw InternalError("isl failed while " + what + ": " + e.what());
  }
}


}  // namespace polytile::poly::isl_text
