// The helpers of the nest builders (nest_builder.h) and the target-neutral tree of a plain nest.
#include <algorithm>
#include <string>
#include <vector>

#include "nest_builder.h"

namespace polytile::sched::internal {

std::string box_text(const std::string& tuple, const std::vector<std::string>& vars, const std::vector<int64_t>& shape) {
  std::vector<std::string> conds;
  for (size_t k = 0; k < vars.size(); ++k) conds.push_back("0 <= " + vars[k] + " < " + std::to_string(shape[k]));
  std::string s = "{ " + tuple + "[" + join(vars) + "]";
  if (!conds.empty()) s += " : " + join(conds, " and ");
  return s + " }";
}

// The target-neutral tree of a plain nest: its domain scheduled by one band over the variables in `order`,
// permutable (distinct points write distinct elements, or aggregate associatively), the first `coincident`
// members proven free of dependences (distinct values write distinct elements).
isl::schedule NestBuilder::neutral_tree(const isl::set& domain, const std::vector<std::string>& vars,
                                        const std::vector<size_t>& order, size_t coincident) {
  isl::schedule tree = isl::schedule::from_domain(isl::union_set(domain));
  if (vars.empty()) return tree;
  std::vector<std::string> perm;
  for (size_t k : order) perm.push_back(vars[k]);
  isl::union_map band_map(ctx.get(), "{ S[" + join(vars) + "] -> [" + join(perm) + "] }");
  isl::schedule_node_band band =
      tree.root().child(0).insert_partial_schedule(isl_support::partial_schedule(band_map)).as<isl::schedule_node_band>();
  band = band.set_permutable(1);
  for (size_t k = 0; k < coincident; ++k) band = band.member_set_coincident(static_cast<int>(k), 1);
  return band.schedule();
}

void NestBuilder::build(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                        const std::vector<size_t>& order, size_t coincident, const NestFacts& facts) {
  nest.parallel_outer = !vars.empty() && coincident > 0;
  generate(nest, cpu_plain_nest(neutral_tree(domain, vars, order, coincident), domain, vars, order, facts));
}

}  // namespace polytile::sched::internal
