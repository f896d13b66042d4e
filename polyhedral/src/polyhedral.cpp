// Contractions as isl sets and maps: the analysis (domain, accesses, exact bounds, the assign proof) and the
// single-write proof behind defract, on the isl sets and maps of isl_text.h. The internal entries (isl_analysis.h)
// work in the caller's isl context; the public ones allocate a context per call.
#include "polytile/polyhedral.h"

#include <algorithm>
#include <string>
#include <vector>

#include "isl_text.h"
#include "polytile/error.h"
#include "polytile/isl_analysis.h"

namespace polytile::poly {

using namespace isl_text;  // NOLINT: this file is the analysis the helpers exist for

namespace internal {

IslAnalysis analyze(const Contraction& c, const ProgramTypes& types, const isl::ctx& ctx, bool accesses) {
  ConcreteContraction cc = concretize(c, types);
  return with_isl_errors("analyzing contraction " + c.output, [&] {
    IslAnalysis out;
    ContractionAnalysis& a = out.summary;
    a.output = c.output;
    isl::set domain = out.domain = simplify(domain_set(ctx, cc));
    if (accesses) {
      out.write_function = access_map(ctx, cc, 0);
      out.write = simplify(out.write_function.intersect_domain(domain));
      for (size_t i = 1; i < cc.accesses.size(); ++i) {
        out.read_functions.push_back(access_map(ctx, cc, i));
        out.reads.push_back(simplify(out.read_functions.back().intersect_domain(domain)));
      }
    }
    a.empty = domain.is_empty();
    if (a.empty) return out;
    for (size_t k = 0; k < cc.vars.size(); ++k) {
      std::string unbounded = "index variable " + cc.vars[k] + " of contraction " + c.output +
                              " is unbounded: it must appear in an index expression or a constraint that bounds it";
      int64_t lo = to_int(domain.dim_min_val(static_cast<int>(k)), unbounded);
      int64_t hi = to_int(domain.dim_max_val(static_cast<int>(k)), unbounded);
      a.bounds.push_back({cc.vars[k], lo, hi});
    }
    // A bound of 2^62 is well-formed but would run practically forever: refuse it before code is made.
    constexpr double kMaxBoxPoints = 17592186044416.0;  // 2^44
    double box = 1;
    for (const auto& b : a.bounds) box *= static_cast<double>(b.max) - static_cast<double>(b.min) + 1;
    if (box > kMaxBoxPoints)
      user_error("contraction ", c.output, " ranges over a box of about ", box,
                 " index points (more than 2^44); check its constraints and shapes");
    if (accesses && c.aggregation == AggregationOp::assign && !out.write.is_injective()) {
      isl::map same = out.write.apply_range(out.write.reverse()).subtract(domain.identity());
      isl::point p = same.wrap().lexmin().sample_point();
      int n = static_cast<int>(cc.vars.size());
      std::vector<int64_t> x = point_coordinates(p, 2 * n);
      std::string element = c.output + "[";
      const auto& forms = cc.accesses[0].second;
      for (size_t k = 0; k < forms.size(); ++k) {
        int64_t s = forms[k].constant;
        for (int v = 0; v < n; ++v) s += forms[k].coeffs[v] * x[v];
        element += (k ? ", " : "") + std::to_string(s / forms[k].den);
      }
      element += "]";
      user_error("assign contraction ", c.output, " can write an element more than once: ", element, " is written at ",
                 point_text(cc.vars, x, 0), " and at ", point_text(cc.vars, x, n),
                 "; use an aggregation such as + or > if that is intended");
    }
    return out;
  });
}

ContractionAnalysis bounds_of(const Contraction& c, const ProgramTypes& types) {
  IslContext ctx;
  return analyze(c, types, ctx.get(), /*accesses=*/false).summary;
}

namespace {

// The single-write proof on `domain`, the contraction's domain (tuple S_<output>).
bool writes_each_output_once_on(const Contraction& c, const ProgramTypes& types, const ConcreteContraction& cc,
                                const isl::set& domain) {
  std::vector<std::string> out_vars;
  for (const auto& p : c.output_indices)
    for (const auto& [v, coeff] : p.index_terms())
      if (std::find(out_vars.begin(), out_vars.end(), v) == out_vars.end()) out_vars.push_back(v);
  // T[out vars] from the domain's points; the write map from T (the output forms only involve out_vars).
  std::vector<Form> pick;
  for (const auto& v : out_vars) {
    Form f;
    f.coeffs.assign(cc.vars.size(), 0);
    f.coeffs[static_cast<size_t>(std::find(cc.vars.begin(), cc.vars.end(), v) - cc.vars.begin())] = 1;
    pick.push_back(f);
  }
  ConcreteContraction on_out = cc;
  on_out.vars = out_vars;
  on_out.name = "T";
  std::vector<Form> forms;
  for (const auto& p : c.output_indices) forms.push_back(make_form(p.bind_dims(types.dims), out_vars));
  return with_isl_errors("proving single writes of " + c.output, [&] {
    isl::ctx ctx = domain.ctx();
    isl::set projected = domain.apply(form_map(ctx, cc, "T", pick));
    isl::map write = form_map(ctx, on_out, c.output, forms).intersect_domain(projected);
    return write.is_injective();
  });
}

}  // namespace

bool writes_each_output_once(const Contraction& c, const ProgramTypes& types, const IslAnalysis& analysis) {
  return writes_each_output_once_on(c, types, concretize(c, types), analysis.domain);
}

}  // namespace internal

ContractionAnalysis analyze(const Contraction& c, const ProgramTypes& types) {
  IslContext ctx;
  internal::IslAnalysis analysis = internal::analyze(c, types, ctx.get());
  ContractionAnalysis& a = analysis.summary;
  a.domain = text(analysis.domain);
  a.write = text(analysis.write);
  for (const isl::map& r : analysis.reads) a.reads.push_back(text(r));
  return a;
}

std::vector<ContractionAnalysis> analyze_program(const Program& p, const ProgramTypes& types) {
  std::vector<ContractionAnalysis> out;
  for (const auto& st : p.statements)
    if (const auto* c = std::get_if<Contraction>(&st)) out.push_back(analyze(*c, types));
  return out;
}

std::string print_analyses(const std::vector<ContractionAnalysis>& analyses) {
  std::string s;
  for (const auto& a : analyses) {
    s += "// contraction " + a.output + (a.empty ? " (empty domain: writes nothing)" : "") + "\n";
    s += "domain: " + a.domain + "\n";
    s += "write: " + a.write + "\n";
    for (const auto& r : a.reads) s += "read: " + r + "\n";
    for (const auto& b : a.bounds) s += "bounds: " + std::to_string(b.min) + " <= " + b.name + " <= " + std::to_string(b.max) + "\n";
  }
  return s;
}

bool writes_each_output_once(const Contraction& c, const ProgramTypes& types) {
  ConcreteContraction cc = concretize(c, types);
  IslContext ctx;
  return with_isl_errors("proving single writes of " + c.output,
                         [&] { return internal::writes_each_output_once_on(c, types, cc, domain_set(ctx.get(), cc)); });
}

}  // namespace polytile::poly
