// Private to polyhedral/: contractions as isl text, shared by the analysis (polyhedral.cpp) and translation
// validation (verify.cpp). With concrete dims, every index expression and constraint becomes an affine
// form with integer coefficients over a common denominator D; the domain is written over a tuple
// S_<output>[vars]: an index expression requires "exists e: D*e = form and 0 <= e < dim", a constraint
// "0 <= form < D*bound". Accesses map the domain tuple to the tensor's tuple with the same equalities.
#pragma once

#include <isl/cpp.h>
#include <isl/point.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
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

// The contraction with dims bound, as text fragments.
struct ConcreteContraction {
  std::vector<std::string> vars;
  std::string tuple;                    // S_O[v0, v1]
  std::vector<std::string> conditions;  // domain conditions
  std::vector<std::pair<std::string, std::vector<Form>>> accesses;  // [0] is the write
  std::vector<std::vector<int64_t>> dims;                           // per access
};

inline ConcreteContraction concretize(const Contraction& c, const ProgramTypes& types, const std::string& tuple_name = "") {
  ConcreteContraction cc;
  cc.vars = c.index_variables();
  std::vector<std::string> names;
  for (const auto& v : cc.vars) names.push_back(isl_name(v));
  cc.tuple = (tuple_name.empty() ? "S_" + c.output : tuple_name) + "[" + join(names, ", ") + "]";
  int exists_counter = 0;
  auto add_access = [&](const std::string& tensor, const std::vector<Polynomial>& idx) {
    const auto& shape = types.tensors.at(tensor).shape;
    std::vector<Form> forms;
    for (size_t k = 0; k < idx.size(); ++k) {
      Form f = make_form(idx[k].bind_dims(types.dims), cc.vars);
      std::string text = form_text(f, cc.vars);
      if (f.den == 1) {
        cc.conditions.push_back("0 <= " + text + " <= " + std::to_string(shape[k] - 1));
      } else {
        std::string e = "ex" + std::to_string(exists_counter++);
        cc.conditions.push_back("exists (" + e + " : " + std::to_string(f.den) + "*" + e + " = " + text + " and 0 <= " +
                                e + " <= " + std::to_string(shape[k] - 1) + ")");
      }
      forms.push_back(f);
    }
    cc.accesses.emplace_back(tensor, forms);
    cc.dims.push_back(shape);
  };
  add_access(c.output, c.output_indices);
  for (const auto& a : c.inputs) add_access(a.tensor, a.indices);
  for (const auto& k : c.constraints) {
    Form f = make_form(k.poly.bind_dims(types.dims), cc.vars);
    int64_t hi = k.bound.evaluate(types.dims);
    cc.conditions.push_back("0 <= " + form_text(f, cc.vars) + " <= " + std::to_string(hi * f.den - 1));
  }
  return cc;
}

inline std::string domain_text(const ConcreteContraction& cc) {
  if (cc.conditions.empty()) return "{ " + cc.tuple + " }";
  return "{ " + cc.tuple + " : " + join(cc.conditions, " and ") + " }";
}

inline std::string access_text(const ConcreteContraction& cc, size_t i) {
  const auto& [tensor, forms] = cc.accesses[i];
  std::vector<std::string> outs, eqs;
  for (size_t k = 0; k < forms.size(); ++k) {
    std::string o = "o";
    o.append(std::to_string(k));
    outs.push_back(o);
    std::string eq = forms[k].den == 1 ? o : std::to_string(forms[k].den) + "*" + o;
    eq.append(" = ").append(form_text(forms[k], cc.vars));
    eqs.push_back(eq);
  }
  std::string s = "{ " + cc.tuple + " -> " + tensor + "[" + join(outs, ", ") + "]";
  if (!eqs.empty()) s += " : " + join(eqs, " and ");
  return s + " }";
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
