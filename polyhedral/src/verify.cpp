// Translation validation (verify.h). Data model: the isl sets and maps of isl_text.h for each contraction
// (isl text where sizes are parameters), with the domain tuples named Before and After; every access is a
// map to a tuple E<position>, and the range product of them all is the map from a valid point to the tuple
// of elements it names. The proofs are isl equalities and injectivity tests on those maps and on the pass's
// change of variables.
#include "polytile/verify.h"

#include <functional>
#include <map>
#include <optional>

#include "isl_text.h"

namespace polytile::poly {

using namespace isl_text;  // NOLINT

// ------------------------------------------------------------------------------------- translation validation

namespace {

// ---- general sizes: dims stay isl parameters ([N, H] -> { ... : N >= 0 and ... }).

// isl text of a dim expression, or nullopt when it is not quasi-affine (a product of dims, max, min).
std::optional<std::string> isl_dim_text(const DimExpr& d) {
  using K = DimExpr::Kind;
  switch (d.kind()) {
    case K::constant: return std::to_string(d.value());
    case K::symbol: return isl_name(d.name());
    case K::neg: {
      auto a = isl_dim_text(d.lhs());
      return a ? std::optional<std::string>("-(" + *a + ")") : std::nullopt;
    }
    case K::add:
    case K::sub: {
      auto a = isl_dim_text(d.lhs()), b = isl_dim_text(d.rhs());
      if (!a || !b) return std::nullopt;
      return "(" + *a + (d.kind() == K::add ? " + " : " - ") + *b + ")";
    }
    case K::mul: {
      // isl wants a bare integer before '*': c*(expression).
      if (!d.lhs().is_constant() && !d.rhs().is_constant()) return std::nullopt;
      const DimExpr& factor = d.lhs().is_constant() ? d.lhs() : d.rhs();
      auto other = isl_dim_text(d.lhs().is_constant() ? d.rhs() : d.lhs());
      if (!other) return std::nullopt;
      return "(" + std::to_string(factor.value()) + "*(" + *other + "))";
    }
    case K::div: {
      if (!d.rhs().is_constant() || d.rhs().value() <= 0) return std::nullopt;
      auto a = isl_dim_text(d.lhs());
      return a ? std::optional<std::string>("floor((" + *a + ")/" + std::to_string(d.rhs().value()) + ")") : std::nullopt;
    }
    default: return std::nullopt;
  }
}

// A polynomial as (isl numerator text, denominator): p = numerator / den with dims as parameters.
std::optional<std::pair<std::string, int64_t>> symbolic_form(const Polynomial& p, const std::vector<std::string>& vars) {
  Polynomial index_part;
  for (const auto& [name, c] : p.index_terms()) index_part = index_part + Polynomial::index(name) * c;
  std::optional<DimExpr> dims = (p - index_part - Polynomial(p.constant())).dims_as_expr();
  if (!dims) return std::nullopt;
  std::optional<std::string> dims_text = isl_dim_text(*dims);
  if (!dims_text) return std::nullopt;
  Form f = make_form(index_part + Polynomial(p.constant()), vars);
  return std::make_pair(form_text(f, vars) + " + " + std::to_string(f.den) + "*(" + *dims_text + ")", f.den);
}

// The same fragments as ConcreteContraction, with sizes as parameters; nullopt when some size or index
// is not quasi-affine in the dims or a tensor's shape is unknown.
struct SymbolicContraction {
  std::vector<std::string> vars;
  std::string tuple;
  std::vector<std::string> conditions;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> accesses;  // [0] is the write
};

std::optional<SymbolicContraction> symbolize(const Contraction& c, const std::map<std::string, std::vector<DimExpr>>& shapes,
                                             const std::string& tuple_name) {
  SymbolicContraction sc;
  sc.vars = c.index_variables();
  std::vector<std::string> names;
  for (const auto& v : sc.vars) names.push_back(isl_name(v));
  sc.tuple = tuple_name + "[" + join(names, ", ") + "]";
  int counter = 0;
  auto add_access = [&](const std::string& tensor, const std::vector<Polynomial>& idx, const std::vector<DimExpr>& shape) {
    if (shape.size() != idx.size()) return false;
    std::vector<std::pair<std::string, int64_t>> forms;
    for (size_t k = 0; k < idx.size(); ++k) {
      auto f = symbolic_form(idx[k], sc.vars);
      auto dim = isl_dim_text(shape[k]);
      if (!f || !dim) return false;
      std::string e = "ex" + std::to_string(counter++);
      sc.conditions.push_back("exists (" + e + " : " + std::to_string(f->second) + "*" + e + " = " + f->first + " and 0 <= " + e +
                              " < " + *dim + ")");
      forms.push_back(*f);
    }
    sc.accesses.emplace_back(tensor, forms);
    return true;
  };
  if (!add_access(c.output, c.output_indices, c.output_shape)) return std::nullopt;
  for (const auto& a : c.inputs) {
    auto it = shapes.find(a.tensor);
    if (it == shapes.end() || !add_access(a.tensor, a.indices, it->second)) return std::nullopt;
  }
  for (const auto& k : c.constraints) {
    auto f = symbolic_form(k.poly, sc.vars);
    auto bound = isl_dim_text(k.bound);
    if (!f || !bound) return std::nullopt;
    sc.conditions.push_back("0 <= " + f->first + " < " + std::to_string(f->second) + "*(" + *bound + ")");
  }
  return sc;
}

std::string parameters_text(const std::vector<std::string>& params) {
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(isl_name(p));
  return "[" + join(names, ", ") + "] -> ";
}

std::string nonnegative(const std::vector<std::string>& params) {
  std::vector<std::string> c;
  for (const auto& p : params) c.push_back(isl_name(p) + " >= 0");
  return join(c, " and ");
}

std::string symbolic_domain_text(const SymbolicContraction& sc, const std::vector<std::string>& params) {
  std::vector<std::string> all = sc.conditions;
  if (!params.empty()) all.push_back(nonnegative(params));
  return parameters_text(params) + "{ " + sc.tuple + (all.empty() ? "" : " : " + join(all, " and ")) + " }";
}

std::string symbolic_access_text(const SymbolicContraction& sc, size_t i, const std::vector<std::string>& params) {
  std::vector<std::string> outs, eqs;
  const auto& forms = sc.accesses[i].second;
  for (size_t k = 0; k < forms.size(); ++k) {
    std::string o = "o" + std::to_string(k);
    outs.push_back(o);
    eqs.push_back(std::to_string(forms[k].second) + "*" + o + " = " + forms[k].first);
  }
  return parameters_text(params) + "{ " + sc.tuple + " -> E" + std::to_string(i) + "[" + join(outs, ", ") + "]" +
         (eqs.empty() ? "" : " : " + join(eqs, " and ")) + " }";
}

[[noreturn]] void refute(const std::string& pass, const Contraction& before, const Contraction& after, const std::string& why) {
  throw InternalError("translation validation failed: " + pass + " changed the meaning of contraction " + before.output +
                      ": " + why + "\n  before: " + print(Statement(before)) + "\n  after:  " + print(Statement(after)));
}

// The map from a contraction's valid points to the tuple of elements its accesses name, position by
// position (E0 the output, E1... the inputs); copies are looked through, renamed tensors stand for theirs.
isl::map tuple_map(isl::ctx ctx, const ConcreteContraction& cc, const isl::set& domain, const RewriteContext& rc,
                   const std::vector<std::string>& expected, const std::function<void(const std::string&)>& fail) {
  std::optional<isl::map> tuple;
  for (size_t i = 0; i < cc.accesses.size(); ++i) {
    isl::map access = access_map(ctx, cc, i).intersect_domain(domain);
    const std::string& tensor = cc.accesses[i].first;
    if (tensor != expected[i]) {
      auto copy = rc.copies.find(tensor);
      auto renamed = rc.renamed.find(tensor);
      if (copy != rc.copies.end() && copy->second->inputs.size() == 1 && copy->second->inputs[0].tensor == expected[i] &&
          copy->second->aggregation == AggregationOp::assign && copy->second->combination == CombinationOp::none &&
          !copy->second->init) {
        // P element -> source element: the copy's write reversed, then its read, over its domain.
        ConcreteContraction def = concretize(*copy->second, *rc.types, "Copy");
        isl::set def_domain = domain_set(ctx, def);
        isl::map write = access_map(ctx, def, 0).intersect_domain(def_domain);
        isl::map read = access_map(ctx, def, 1).intersect_domain(def_domain);
        isl::map through = write.reverse().apply_range(read);
        if (!through.is_single_valued()) fail("the copy " + tensor + " does not hold one element of " + expected[i] + " per element");
        isl::map composed = access.apply_range(through);
        // Every point must read an element the copy wrote: otherwise it reads a zero the original never saw.
        if (!composed.domain().is_equal(access.domain()))
          fail("some points read elements of " + tensor + " that its copy of " + expected[i] + " never writes");
        access = composed;
      } else if (!(renamed != rc.renamed.end() && renamed->second == expected[i] &&
                   rc.types->tensors.at(tensor).shape == rc.types->tensors.at(expected[i]).shape)) {
        fail("access " + std::to_string(i) + " reads " + tensor + " where the original reads " + expected[i]);
      }
    }
    access = access.set_range_tuple("E" + std::to_string(i));
    tuple = tuple ? tuple->range_product(access) : access;
  }
  return *tuple;
}

// The proof with a change of variables phi (new valid domain -> old one): phi is injective, its image is the
// old valid domain, and every access of the new contraction reads what the old one reads at phi's image.
void prove_bijection(const isl::map& phi, const isl::set& before_domain, const isl::map& before_tuples,
                     const isl::map& after_tuples, const std::string& qualifier,
                     const std::function<void(const std::string&)>& fail) {
  if (!phi.is_injective()) fail("two valid points of the rewritten contraction stand for one original point" + qualifier);
  if (!phi.range().is_equal(before_domain)) {
    isl::set lost = before_domain.subtract(phi.range()), gained = phi.range().subtract(before_domain);
    fail(!lost.is_empty() ? "original points are lost" + qualifier + ": " + isl_support::text(lost)
                          : "points are added" + qualifier + ": " + isl_support::text(gained));
  }
  if (!phi.apply_range(before_tuples).is_equal(after_tuples))
    fail("a rewritten access reads another element than the original at the same point" + qualifier);
}

}  // namespace

Substitution identity_substitution(const Contraction& c) {
  Substitution s;
  s.old_variables = c.index_variables();
  for (const auto& v : s.old_variables) s.values.push_back(Polynomial::index(v));
  return s;
}

bool verify_rewrite_for_all_sizes(const std::string& pass, const Contraction& before, const Contraction& after,
                                  const std::map<std::string, std::vector<DimExpr>>& shapes, const Substitution& substitution) {
  auto fail = [&](const std::string& why) { refute(pass, before, after, why); };
  if (before.output != after.output || before.aggregation != after.aggregation || before.combination != after.combination ||
      before.init != after.init || before.inputs.size() != after.inputs.size() || before.output_shape != after.output_shape)
    fail("the output, its shape, the aggregation, combination, default or number of inputs differs");
  for (size_t i = 0; i < before.inputs.size(); ++i)
    if (before.inputs[i].tensor != after.inputs[i].tensor)
      fail("access " + std::to_string(i + 1) + " reads " + after.inputs[i].tensor + " where the original reads " + before.inputs[i].tensor);
  auto sb = symbolize(before, shapes, "Before"), sa = symbolize(after, shapes, "After");
  if (!sb || !sa) return false;
  std::vector<std::string> params;
  auto collect = [&](const Contraction& c) {
    for (const auto& d : c.output_shape) d.collect_symbols(params);
    for (const auto& k : c.constraints) {
      k.bound.collect_symbols(params);
      k.poly.collect_dim_symbols(params);
    }
    for (const auto& p : c.output_indices) p.collect_dim_symbols(params);
    for (const auto& a : c.inputs) {
      for (const auto& d : shapes.at(a.tensor)) d.collect_symbols(params);
      for (const auto& p : a.indices) p.collect_dim_symbols(params);
    }
  };
  collect(before);
  collect(after);
  for (const auto& v : substitution.values) v.collect_dim_symbols(params);
  std::sort(params.begin(), params.end());
  params.erase(std::unique(params.begin(), params.end()), params.end());
  IslContext ctx;
  with_isl_errors("validating " + pass + " of " + before.output + " for all sizes", [&] {
    isl::set db(ctx.get(), symbolic_domain_text(*sb, params)), da(ctx.get(), symbolic_domain_text(*sa, params));
    auto tuple = [&](const SymbolicContraction& sc, const isl::set& dom) {
      std::optional<isl::map> t;
      for (size_t i = 0; i < sc.accesses.size(); ++i) {
        isl::map a = isl::map(ctx.get(), symbolic_access_text(sc, i, params)).intersect_domain(dom);
        t = t ? t->range_product(a) : a;
      }
      return *t;
    };
    isl::map tb = tuple(*sb, db), ta = tuple(*sa, da);
    std::vector<std::string> outs, eqs;
    for (size_t k = 0; k < substitution.values.size(); ++k) {
      auto f = symbolic_form(substitution.values[k], sa->vars);
      if (!f) fail("the change of variables is not affine in the sizes");
      std::string o = "o" + std::to_string(k);
      outs.push_back(o);
      eqs.push_back(std::to_string(f->second) + "*" + o + " = " + f->first);
    }
    std::string text = parameters_text(params) + "{ " + sa->tuple + " -> Before[" + join(outs, ", ") + "]" +
                       (eqs.empty() ? "" : " : " + join(eqs, " and ")) + " }";
    prove_bijection(isl::map(ctx.get(), text).intersect_domain(da), db, tb, ta, " for some sizes", fail);
  });
  return true;
}

void verify_rewrite(const std::string& pass, const Contraction& before, const Contraction& after, const RewriteContext& rc,
                    const std::optional<Substitution>& substitution) {
  POLYTILE_CHECK(rc.types, "verify_rewrite needs the tensors' types");
  auto fail = [&](const std::string& why) { refute(pass, before, after, why); };
  if (before.output != after.output || before.aggregation != after.aggregation || before.combination != after.combination ||
      before.init != after.init || before.inputs.size() != after.inputs.size())
    fail("the output, aggregation, combination, default or number of inputs differs");
  for (size_t k = 0; k < before.output_shape.size() && k < after.output_shape.size(); ++k)
    if (before.output_shape[k].evaluate(rc.types->dims) != after.output_shape[k].evaluate(rc.types->dims))
      fail("the output shape differs");
  std::vector<std::string> expected{before.output};
  for (const auto& a : before.inputs) expected.push_back(a.tensor);
  ConcreteContraction cb = concretize(before, *rc.types, "Before"), ca = concretize(after, *rc.types, "After");
  IslContext ctx;
  with_isl_errors("validating " + pass + " of " + before.output, [&] {
    isl::set db = domain_set(ctx.get(), cb), da = domain_set(ctx.get(), ca);
    isl::map tb = tuple_map(ctx.get(), cb, db, rc, expected, fail);
    isl::map ta = tuple_map(ctx.get(), ca, da, rc, expected, fail);
    if (substitution) {
      // phi: After[z] -> Before[x] with x_k = value_k(z); range names o<k> never clash with user names.
      const auto& sub = *substitution;
      POLYTILE_CHECK(sub.old_variables == cb.vars, "substitution of ", pass, " does not list ", before.output, "'s variables");
      std::vector<Form> forms;
      for (const auto& value : sub.values) forms.push_back(make_form(value.bind_dims(rc.types->dims), ca.vars));
      prove_bijection(form_map(ctx.get(), ca, "Before", forms).intersect_domain(da), db, tb, ta, "", fail);
      return;
    }
    if (!tb.is_injective() || !ta.is_injective())
      fail("without a change of variables the proof needs every point to read a distinct tuple of elements");
    if (!tb.range().is_equal(ta.range())) fail("the sets of (output, inputs) tuples differ");
  });
}

}  // namespace polytile::poly
