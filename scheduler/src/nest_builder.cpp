// The helpers of the nest builders (nest_builder.h) and the target-neutral tree of a plain nest.
#include <algorithm>
#include <string>
#include <vector>

#include "nest_builder.h"

namespace polytile::sched::internal {

// The target-neutral tree of a plain nest: its domain scheduled by one band of `members` (isl expressions
// of vars; the variables in band order, or a fused leading pair), permutable (distinct points write
// distinct elements, or aggregate associatively), the first `coincident` members proven free of
// dependences (distinct values write distinct elements).
isl::schedule NestBuilder::neutral_tree(const isl::set& domain, const std::vector<std::string>& vars,
                                        const std::vector<std::string>& members, size_t coincident) {
  isl::schedule tree = isl::schedule::from_domain(isl::union_set(domain));
  if (vars.empty()) return tree;
  std::vector<bool> flags;
  for (size_t k = 0; k < members.size(); ++k) flags.push_back(k < coincident);
  return insert_band(tree.root().child(0), vars, members, flags).schedule();
}

std::vector<std::string> ordered(const std::vector<std::string>& vars, const std::vector<size_t>& order) {
  std::vector<std::string> out;
  for (size_t k : order) out.push_back(vars[k]);
  return out;
}

isl::schedule_node NestBuilder::insert_band(const isl::schedule_node& at, const std::vector<std::string>& vars,
                                            const std::vector<std::string>& members, const std::vector<bool>& coincident,
                                            bool as_written) {
  isl::multi_union_pw_aff partial;
  if (as_written) {
    std::vector<std::string> pieces;
    for (const auto& m : members) pieces.push_back("{ S[" + join(vars) + "] -> [(" + m + ")] }");
    partial = isl::multi_union_pw_aff(ctx.get(), "[" + join(pieces) + "]");
  } else {
    partial = isl_support::partial_schedule(isl::union_map(ctx.get(), "{ S[" + join(vars) + "] -> [" + join(members) + "] }"));
  }
  isl::schedule_node_band band = at.insert_partial_schedule(partial).as<isl::schedule_node_band>();
  band = band.set_permutable(1);
  for (size_t k = 0; k < coincident.size(); ++k)
    if (coincident[k]) band = band.member_set_coincident(static_cast<int>(k), 1);
  return band;
}

int64_t NeutralBand::points() const {
  int64_t points = 1;
  for (int64_t e : extents) points = e > 0 && points > (int64_t{1} << 62) / e ? int64_t{1} << 62 : points * e;
  return points;
}

std::optional<NeutralBand> NestBuilder::read_band(const isl::schedule& neutral, const std::vector<std::string>& members) {
  isl::schedule_node root = neutral.root().child(0);
  if (!root.isa<isl::schedule_node_band>()) return std::nullopt;
  isl::schedule_node_band band = root.as<isl::schedule_node_band>();
  NeutralBand out;
  while (out.parallel < band.n_member() && band.member_get_coincident(static_cast<int>(out.parallel))) ++out.parallel;
  out.members = members;
  isl::set box = neutral.get_domain().apply(isl::union_map::from(band.partial_schedule()))
                     .extract_set(isl_support::set_space(ctx.get(), static_cast<unsigned>(out.members.size())));
  for (size_t k = 0; k < out.members.size(); ++k) {
    isl::val lo = box.dim_min_val(static_cast<int>(k)), hi = box.dim_max_val(static_cast<int>(k));
    const bool known = lo.is_int() && hi.is_int();
    out.bounded = out.bounded && known;
    out.extents.push_back(known ? hi.get_num_si() - lo.get_num_si() + 1 : 1);
    out.lows.push_back(known ? lo.get_num_si() : 0);
  }
  return out;
}

// The CPU splits a nest's outer loop into chunks (threads, row groups): when the leading variable has too
// few values for the threads, or one value covers more than a quarter of L2 of the output (a batch of a few
// large images), the leading two coincident variables become one member, e1 * v0 + v1 (v1's extent e1:
// distinct pairs, distinct values), so a chunk is a few rows of one image.
std::optional<std::vector<std::string>> NestBuilder::fuse_leading(const isl::set& domain, const std::vector<std::string>& vars,
                                                                  const std::vector<size_t>& order, size_t coincident,
                                                                  int64_t output_bytes) {
  if (target.gpu || coincident < 2) return std::nullopt;
  auto extent = [&](size_t k) -> std::optional<std::pair<int64_t, int64_t>> {
    isl::val lo = domain.dim_min_val(static_cast<int>(k)), hi = domain.dim_max_val(static_cast<int>(k));
    if (!lo.is_int() || !hi.is_int()) return std::nullopt;
    return std::pair{lo.get_num_si(), hi.get_num_si() - lo.get_num_si() + 1};
  };
  const auto first = extent(order[0]), second = extent(order[1]);
  if (!first || !second || first->second < 1 || second->second < 2) return std::nullopt;
  if (first->second >= 4 * target.threads && output_bytes / first->second <= target.cpu.l2_bytes / 4) return std::nullopt;
  std::vector<std::string> members = ordered(vars, order);
  members[0] = "(" + std::to_string(second->second) + "*" + vars[order[0]] + " + " + vars[order[1]] + ")";
  members.erase(members.begin() + 1);
  return members;
}

void NestBuilder::build(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                        const std::vector<size_t>& order, size_t coincident, const NestFacts& facts) {
  std::vector<std::string> members = ordered(vars, order);
  // A transposition's squares need the input's contiguous variable as a member of its own: the leading
  // pair is not fused when it holds it.
  const auto at = std::find(members.begin(), members.end(), facts.transpose_variable);
  const bool transposing = !facts.transpose_variable.empty() && at != members.end();
  if (auto fused = transposing && at - members.begin() < 2 ? std::nullopt
                                                            : fuse_leading(domain, vars, order, coincident, facts.output_bytes)) {
    // isl 0.25's AST build can fail on the fused loop's bounds where the domain ties the pair to a later
    // variable with other coefficients ("input involves unknown divs": a div of the pair's values that it
    // made and has no expression for; a gradient's DA[v0, v1, 3] = +(D[]), ..., v0 - 2*v1 + 2*v2 + 1 < 4
    // found by the differential fuzzer). The pair then runs as two loops, as where it is not fused.
    const Nest before = nest;
    try {
      build_members(nest, domain, vars, order, *fused, coincident - 1, facts, transposing);
      return;
    } catch (const isl::exception&) {
      nest = before;
    }
  }
  build_members(nest, domain, vars, order, members, coincident, facts, transposing);
}

void NestBuilder::build_members(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                                const std::vector<size_t>& order, const std::vector<std::string>& members, size_t coincident, const NestFacts& facts,
                                bool transposing) {
  const isl::schedule neutral = neutral_tree(domain, vars, members, coincident);
  if (target.gpu) {
    // z in parts first; where isl fixes a part by others (a diagonal), z linearized; else one thread.
    for (const bool z_parts : {true, false}) {
      nest.kernel.emplace();
      nest.shared.clear();
      nest.accumulators.reset();
      KernelStatements added;
      const isl::schedule tree =
          gpu_plain_nest(neutral, vars, order, facts, *nest.kernel, nest.shared, nest.accumulators, added, z_parts);
      generate(nest, tree, nullptr, &added);
      if (finish_kernel(nest)) {
        check_barriers(nest);
        return;
      }
      if (added.z_parts.empty()) break;  // the same tree again
    }
    nest.kernel = KernelLaunch::of(*target.gpu);  // mapped around some statements only: one thread runs the nest
    nest.shared.clear();
    nest.accumulators.reset();
    generate(nest, neutral);
    return;
  }
  nest.parallel_outer = !vars.empty() && (coincident > 0 || facts.column_tile > 0);
  const std::optional<NeutralBand> band = read_band(neutral, members);
  nest.points = !band ? 1 : band->bounded ? band->points() : domain.is_empty() ? 0 : -1;
  const bool squares = transposing && band && band->members.size() >= 2 && band->parallel == band->members.size();
  nest.transpose_lanes = squares ? facts.transpose_lanes : 0;
  nest.transpose_half_edges = squares && facts.transpose_half_edges;
  generate(nest, cpu_plain_nest(neutral, band, vars, facts, squares));
}

}  // namespace polytile::sched::internal
