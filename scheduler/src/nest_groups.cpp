// Row groups (NestGroup in scheduler.h): which consecutive nests may run chunk by chunk together, proven
// with isl on each nest's accesses as functions of its outer loop, how many rows a chunk takes, and which
// tensors live in a chunk's own memory.
#include <algorithm>
#include <set>
#include <string>

#include "nest_builder.h"
#include "polytile/error.h"

namespace polytile::sched {

std::vector<std::string> nest_tensors(const Nest& nest) {
  std::vector<std::string> used{nest.tensor};
  auto add = [&used](const std::string& t) {
    if (std::find(used.begin(), used.end(), t) == used.end()) used.push_back(t);
  };
  auto add_leaves = [&add](const Expr& e) {
    std::vector<std::string> leaves;
    e.collect_tensors(leaves);
    for (const auto& t : leaves) add(t);
  };
  if (nest.kind == Nest::Kind::elementwise) {
    add_leaves(nest.elementwise.expr);
    return used;
  }
  for (const auto& a : nest.contraction.inputs) {
    auto in = nest.inlined.find(a.tensor);
    if (in == nest.inlined.end() || nest.kind != Nest::Kind::update) add(a.tensor);
    else add_leaves(in->second.expr);
  }
  if (nest.contraction.init) add(*nest.contraction.init);
  if (nest.epilogue) {
    add(nest.epilogue->output);
    add_leaves(nest.epilogue->expr);
  }
  if (nest.permuted_copy) add(nest.permuted_copy->output);
  return used;
}

std::vector<Polynomial> permuted_indices(const Contraction& c, const Contraction& copy) {
  std::vector<Polynomial> at;
  for (const auto& q : copy.output_indices) {
    size_t d = 0;
    while (d < copy.inputs[0].indices.size() && copy.inputs[0].indices[d].variable() != q.variable()) ++d;
    if (d >= c.output_indices.size()) throw InternalError("the permuted copy " + copy.output + " does not read every dim of " + c.output);
    at.push_back(c.output_indices[d]);
  }
  return at;
}

}  // namespace polytile::sched

namespace polytile::sched::internal {

std::optional<isl::map> outer_loop(const isl::schedule& tree) {
  const isl::union_map all = tree.get_map();
  if (!all.isa_map()) return std::nullopt;  // more than one statement: not a plain nest
  isl::map full = all.as_map();
  const unsigned n = static_cast<unsigned>(isl_map_dim(full.get(), isl_dim_out));
  if (n == 0) return std::nullopt;
  return isl::manage(isl_map_project_out(full.release(), isl_dim_out, 1, n - 1));
}

bool spans(const isl::map& outer, int64_t lo, int64_t hi) {
  const isl::set values = outer.range();
  const isl::val min = values.dim_min_val(0), max = values.dim_max_val(0);
  return min.is_int() && max.is_int() && min.get_num_si() == lo && max.get_num_si() == hi;
}

namespace {

// Whether iteration b of the nest whose accesses are (writes, reads) depends only on iteration b of the
// group before it (`group`), and no iteration of it overwrites what another iteration of the group reads:
// every dependence between them relates equal iterations.
bool row_local(const RowAccess& group, const RowAccess& next) {
  const isl::union_map touched = next.writes.unite(next.reads);
  const isl::union_map flow = group.writes.apply_range(touched.reverse());      // [a] -> [b]: b touches what a wrote
  const isl::union_map anti = group.reads.apply_range(next.writes.reverse());   // [a] -> [b]: b writes what a read
  const isl::union_set same(group.writes.ctx(), "{ [0] }");
  return flow.unite(anti).deltas().is_subset(same);
}

// Rows per chunk: the group's tensors, each spread evenly over the outer range, within L1, so that the
// passes after a chunk's first read it from L1; at least four chunks per thread. (Within half of L2, as
// before 2026-12-07, a layer norm of 8192 x 1024 read each chunk of 127 rows three times from L2: 1.77
// ms against 1.55 within L1, softmax forward 1.13 against 1.04 and backward 1.34 against 1.25, medians of
// 4 alternating runs on the 2-core Xeon guest.)
int64_t chunk_rows(const RowAccess& group, int64_t extent, const ProgramTypes& types, const Target& target) {
  std::set<std::string> tensors;
  group.writes.unite(group.reads).range().foreach_set([&](const isl::set& s) { tensors.insert(isl_set_get_tuple_name(s.get())); });
  double bytes = 0;
  for (const auto& t : tensors) {
    bytes += static_cast<double>(types.tensors.at(t).bytes()) / static_cast<double>(extent);
  }
  const int64_t fit = static_cast<int64_t>(static_cast<double>(target.cpu.l1_bytes) / std::max(bytes, 1.0));
  const int64_t balanced = std::max<int64_t>(1, extent / (4 * std::max(1, target.threads)));
  return std::clamp<int64_t>(fit, 1, balanced);
}

// The group's chunk tensors (NestGroup::chunk_tensors): of the tensors it writes, those that no nest
// outside it touches, that are not in `kept` (the program's inputs and outputs), and that iteration c
// touches only in the c-th run of row_elements elements (from `lo`, the outer loop's first value).
std::vector<ChunkTensor> chunk_tensors(const NestGroup& g, const RowAccess& group, const std::vector<Nest>& nests,
                                       const ProgramTypes& types, const std::set<std::string>& kept, int64_t lo, int64_t extent) {
  std::set<std::string> outside = kept;
  for (size_t k = 0; k < nests.size(); ++k)
    if (k < g.first || k > g.last)
      for (const auto& t : nest_tensors(nests[k])) outside.insert(t);
  const isl::union_map touched = group.writes.unite(group.reads);
  std::vector<ChunkTensor> out;
  for (const auto& [name, type] : types.tensors) {
    if (outside.count(name) || type.shape.empty()) continue;
    int64_t elements = 1;
    for (int64_t d : type.shape) elements *= d;
    if (elements % extent != 0) continue;
    std::vector<std::string> vars;
    for (size_t d = 0; d < type.shape.size(); ++d) vars.push_back("i" + std::to_string(d));
    const isl::union_set universe(touched.ctx(), "{ " + name + "[" + join(vars) + "] }");
    const isl::union_map mine = group.writes.intersect_range(universe);
    if (mine.is_empty()) continue;
    // { T[e] -> [f] }: f the element's offset in row-major storage; iteration c may touch f in
    // [(c - lo) * W, (c - lo + 1) * W).
    std::string offset = "0";
    int64_t stride = 1;
    for (size_t d = type.shape.size(); d-- > 0;) {
      offset += " + " + std::to_string(stride) + "*i" + std::to_string(d);
      stride *= type.shape[d];
    }
    const int64_t row = elements / extent;
    const isl::union_map storage(touched.ctx(), "{ " + name + "[" + join(vars) + "] -> [" + offset + "] }");
    const isl::union_map in_row(touched.ctx(), "{ [c] -> [f] : " + std::to_string(row) + "*(c - " + std::to_string(lo) +
                                                   ") <= f < " + std::to_string(row) + "*(c - " + std::to_string(lo) + " + 1) }");
    if (touched.intersect_range(universe).apply_range(storage).is_subset(in_row)) out.push_back(ChunkTensor{name, row});
  }
  return out;
}

}  // namespace

std::vector<NestGroup> group_nests(const std::vector<Nest>& nests, const std::vector<std::optional<RowAccess>>& rows,
                                   const ProgramTypes& types, const Target& target, const std::set<std::string>& kept) {
  constexpr size_t kMaxNests = 64;  // bounds the union maps the proofs grow
  std::vector<NestGroup> groups;
  std::optional<RowAccess> group;
  NestGroup current;
  auto close = [&] {
    if (group && current.last > current.first) {
      const Nest& first = nests[current.first];
      const int64_t extent = first.outer_hi - first.outer_lo + 1;
      current.rows = chunk_rows(*group, extent, types, target);
      current.chunk_tensors = chunk_tensors(current, *group, nests, types, kept, first.outer_lo, extent);
      groups.push_back(current);
    }
    group.reset();
  };
  for (size_t k = 0; k < nests.size(); ++k) {
    const Nest& n = nests[k];
    if (!rows[k]) {  // no split outer loop, a micro-kernel, a GPU kernel (the scheduler gave it no accesses)
      close();
      continue;
    }
    const Nest& first = nests[current.first];
    if (group && n.outer_lo == first.outer_lo && n.outer_hi == first.outer_hi && k - current.first < kMaxNests &&
        row_local(*group, *rows[k])) {
      group->writes = group->writes.unite(rows[k]->writes);
      group->reads = group->reads.unite(rows[k]->reads);
      current.last = k;
      continue;
    }
    close();
    group = rows[k];
    current = NestGroup{k, k, 1, {}};
  }
  close();
  return groups;
}

}  // namespace polytile::sched::internal
