// Cond-miss lowering (lower.h). Data model: a contraction whose cond combination may miss at every point
// of an element is split into the same contraction (raw), a count of its hits over the same tuples, and a
// select that writes 0 where nothing hit -- the aggregations' identities (-inf, +inf, 1) never leak out.
#include <set>
#include <tuple>

#include "polytile/lower.h"
#include "polytile/verify.h"

namespace polytile::sched {

Program lower_cond_misses(const Program& p, const std::map<std::string, TensorType>* verify_with) {
  Program out = p;
  out.statements.clear();
  std::set<std::string> names = tensor_names(p);
  auto fresh = [&names](const std::string& base) { return fresh_name(base, names); };
  std::vector<std::tuple<Contraction, Contraction, Contraction>> rewritten;  // original, raw, hits
  for (const auto& st : p.statements) {
    const auto* c = std::get_if<Contraction>(&st);
    bool needs = c && c->combination == CombinationOp::cond && !c->init &&
                 (c->aggregation == AggregationOp::max || c->aggregation == AggregationOp::min ||
                  c->aggregation == AggregationOp::product);
    if (!needs) {
      out.statements.push_back(st);
      continue;
    }
    Contraction raw = *c;
    raw.output = fresh(c->output + "_raw");
    const std::string& third = c->inputs[2].tensor;
    Expr t = Expr::tensor(third), one = Expr::literal(1, true);
    std::string ones = fresh("ONES_" + third);
    Contraction hits = *c;
    hits.output = fresh(c->output + "_hits");
    hits.aggregation = AggregationOp::sum;
    hits.inputs[2].tensor = ones;
    out.statements.push_back(Elementwise{ones, Expr::call(Intrinsic::select, {Expr::binary(BinaryOp::eq, t, t), one, one})});
    out.statements.push_back(raw);
    out.statements.push_back(hits);
    Expr missed = Expr::binary(BinaryOp::eq, Expr::tensor(hits.output), Expr::literal(0, true));
    out.statements.push_back(Elementwise{c->output, Expr::call(Intrinsic::select, {missed, Expr::literal(0, true), Expr::tensor(raw.output)})});
    rewritten.emplace_back(*c, raw, hits);
  }
  if (verify_with) {
    // raw is the contraction itself; hits is its sum over the same tuples with the ones tensor standing
    // for the conditional operand.
    ProgramTypes types = infer_types(out, *verify_with);
    for (const auto& [c, raw, hits] : rewritten) {
      poly::RewriteContext rc;
      rc.types = &types;
      rc.renamed[hits.inputs[2].tensor] = c.inputs[2].tensor;
      Contraction renamed_raw = raw, as_count = c;
      renamed_raw.output = c.output;
      as_count.aggregation = AggregationOp::sum;
      Contraction renamed_hits = hits;
      renamed_hits.output = c.output;
      poly::verify_rewrite("cond-miss lowering", c, renamed_raw, rc, poly::identity_substitution(c));
      poly::verify_rewrite("cond-miss lowering", as_count, renamed_hits, rc, poly::identity_substitution(c));
    }
  }
  return out;
}

}  // namespace polytile::sched
