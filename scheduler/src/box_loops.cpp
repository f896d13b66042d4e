// The loops of the simplest schedule trees, written without isl's AST build (see box_loops in
// nest_builder.h). isl spends about a millisecond of a 2-core guest per loop level even on a box (the weight
// packing of a conv's forward, 5 levels: 6-10 ms; the transposition of its gradient, 8 levels: 10-15 ms),
// most of a gradient's plain nests' scheduling. For a box domain under bands whose members are its
// variables, tiles of them, or two of them merged, the loops isl makes are known in closed form: these
// are they, expression for expression and character for character (LowerTest.BoxLoopsAreIslsLoops
// checks both against isl on every nest of the examples, their gradients, generated contractions and
// the bench's convolutions; 336 of 556 nests there come out here). Anything else is
// left to isl.
#include <isl/aff.h>
#include <isl/constraint.h>
#include <isl/schedule_node.h>
#include <isl/set.h>
#include <isl/union_set.h>
#include <isl/val.h>

#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "direct_loops.h"
#include "nest_builder.h"

namespace polytile::sched::internal {

namespace direct {

std::optional<int64_t> small_int(isl_val* v) {
  std::optional<int64_t> out;
  if (v && isl_val_is_int(v) == isl_bool_true) out = isl_val_get_num_si(v);
  isl_val_free(v);
  return out;
}

LoopExpr constant(int64_t v) {
  LoopExpr e;
  e.value = v;
  return e;
}
LoopExpr iterator(int k) {
  LoopExpr e;
  e.kind = LoopExpr::Kind::iterator;
  e.iterator = k;
  return e;
}
LoopExpr op(LoopExpr::Kind kind, LoopExpr a, LoopExpr b) {
  LoopExpr e;
  e.kind = kind;
  e.args = {std::move(a), std::move(b)};
  return e;
}

isl_aff* single_aff(const isl::union_pw_aff& upa) {
  if (isl_union_pw_aff_n_pw_aff(upa.get()) != 1) return nullptr;
  isl_pw_aff_list* list = isl_union_pw_aff_get_pw_aff_list(upa.get());
  isl_pw_aff* pa = isl_pw_aff_list_get_at(list, 0);
  isl_pw_aff_list_free(list);
  if (!pa) return nullptr;
  if (isl_pw_aff_isa_aff(pa) != isl_bool_true) {
    isl_pw_aff_free(pa);
    return nullptr;
  }
  return isl_pw_aff_as_aff(pa);
}

int used_division(isl_aff* aff) {
  int used = -1;
  for (int k = 0; k < static_cast<int>(isl_aff_dim(aff, isl_dim_div)); ++k)
    if (small_int(isl_aff_get_coefficient_val(aff, isl_dim_div, k)) != 0) {
      if (used >= 0) return -2;
      used = k;
    }
  return used;
}

// `aff` as (a . d + b) / T: its coefficients and constant times its denominator T (1 unless
// `allow_denominator`), when no division of it takes part and it has no parameters.
std::optional<Affine> linear_part(isl_aff* aff, int n, bool allow_denominator) {
  if (isl_aff_dim(aff, isl_dim_param) != 0) return std::nullopt;
  Affine out;
  const auto den = small_int(isl_aff_get_denominator_val(aff));
  if (!den || *den < 1 || (*den != 1 && !allow_denominator)) return std::nullopt;
  out.T = *den;
  for (int k = 0; k < static_cast<int>(isl_aff_dim(aff, isl_dim_div)); ++k)
    if (small_int(isl_aff_get_coefficient_val(aff, isl_dim_div, k)) != 0) return std::nullopt;
  for (int k = 0; k < n; ++k) {
    const auto c = small_int(isl_val_mul_ui(isl_aff_get_coefficient_val(aff, isl_dim_in, k), static_cast<unsigned long>(out.T)));
    if (!c) return std::nullopt;
    out.a.push_back(*c);
  }
  const auto b = small_int(isl_val_mul_ui(isl_aff_get_constant_val(aff), static_cast<unsigned long>(out.T)));
  if (!b) return std::nullopt;
  out.b = *b;
  return out;
}

std::optional<Affine> affine_member(const isl::union_pw_aff& upa, int n) {
  isl_aff* aff = single_aff(upa);
  if (!aff) return std::nullopt;
  const int used = used_division(aff);
  std::optional<Affine> out;
  if (used == -1) {
    out = linear_part(aff, n, false);
  } else if (used >= 0) {
    bool alone = small_int(isl_aff_get_coefficient_val(aff, isl_dim_div, used)) == 1 &&
                 small_int(isl_aff_get_constant_val(aff)) == 0 && small_int(isl_aff_get_denominator_val(aff)) == 1;
    for (int k = 0; k < n && alone; ++k) alone = small_int(isl_aff_get_coefficient_val(aff, isl_dim_in, k)) == 0;
    if (alone) {
      isl_aff* div = isl_aff_get_div(aff, used);
      if (div) out = linear_part(div, n, true);
      isl_aff_free(div);
    }
  }
  isl_aff_free(aff);
  return out;
}

std::optional<BandChain> band_chain(const isl::schedule& tree, const StatementIds& ids) {
  BandChain chain;
  bool parallel_next = false;
  isl::schedule_node node = tree.root().child(0);
  while (!node.isa<isl::schedule_node_leaf>()) {
    if (node.isa<isl::schedule_node_mark>()) {
      const isl::id id = isl_support::mark_id(node);
      chain.marks[chain.members.size()].push_back(id.name());
      parallel_next = parallel_next || id.get() == ids.parallel_mark.get();
    } else if (node.isa<isl::schedule_node_band>()) {
      const isl::schedule_node_band band = node.as<isl::schedule_node_band>();
      if (!band.ast_build_options().is_empty()) return std::nullopt;
      const isl::multi_union_pw_aff schedule = band.get_partial_schedule();
      for (int k = 0; k < static_cast<int>(band.n_member()); ++k) {
        if (isl_schedule_node_band_member_get_ast_loop_type(band.get(), k) != isl_ast_loop_default ||
            isl_schedule_node_band_member_get_isolate_ast_loop_type(band.get(), k) != isl_ast_loop_default)
          return std::nullopt;
        chain.members.push_back(schedule.at(k));
        chain.parallel.push_back(k == 0 && parallel_next);
      }
      parallel_next = false;
    } else {
      return std::nullopt;
    }
    if (node.n_children() != 1) return std::nullopt;
    node = node.child(0);
  }
  return chain;
}

LoopMarks loop_marks(const BandChain& chain, const std::vector<bool>& has_loop) {
  LoopMarks out;
  std::vector<std::string> pending;
  bool pending_parallel = false;
  const size_t n = chain.members.size();
  for (size_t d = 0; d <= n; ++d) {
    if (auto it = chain.marks.find(d); it != chain.marks.end()) pending.insert(pending.end(), it->second.begin(), it->second.end());
    if (d == n) break;
    pending_parallel = pending_parallel || chain.parallel[d];
    if (!has_loop[d]) continue;
    out.marks.push_back(std::move(pending));
    out.parallel.push_back(pending_parallel);
    pending.clear();
    pending_parallel = false;
  }
  out.leaf = std::move(pending);
  return out;
}

}  // namespace direct

namespace {

using direct::constant;
using direct::iterator;
using direct::op;
using direct::small_int;

// One band member over the domain's variables: v, floor(v / size) (a tile), or size * v + w with w in
// [0, size) (two variables merged into one loop).
struct Member {
  enum class Kind { var, tile, merged } kind = Kind::var;
  int v = -1, w = -1;
  int64_t size = 1;
};

// v, floor(v / size) or size * v + w (w with coefficient 1, size > 1); nullopt for any other member.
std::optional<Member> member(const isl::union_pw_aff& upa, int n) {
  const std::optional<direct::Affine> f = direct::affine_member(upa, n);
  if (!f || f->b != 0) return std::nullopt;
  std::vector<int> vars;  // those with a nonzero coefficient
  for (int k = 0; k < n; ++k)
    if (f->a[static_cast<size_t>(k)] != 0) vars.push_back(k);
  auto c = [&f](int k) { return f->a[static_cast<size_t>(k)]; };
  if (vars.size() == 1 && c(vars[0]) == 1) return Member{f->T > 1 ? Member::Kind::tile : Member::Kind::var, vars[0], -1, f->T};
  if (f->T > 1 || vars.size() != 2) return std::nullopt;
  // size * v + w: the first with coefficient 1 is w.
  const int w = c(vars[0]) == 1 ? vars[0] : vars[1], v = w == vars[0] ? vars[1] : vars[0];
  if (c(w) != 1 || c(v) <= 1) return std::nullopt;
  return Member{Member::Kind::merged, v, w, c(v)};
}

// A box's bounds, read constraint by constraint (isl_basic_set_foreach_constraint).
struct Bounds {
  std::vector<int64_t> lo, hi;
  bool ok = true;
};

isl_stat add_bound(isl_constraint* c, void* user) {
  Bounds& b = *static_cast<Bounds*>(user);
  int var = -1;
  int64_t coefficient = 0;
  const int n = static_cast<int>(b.lo.size());
  for (int k = 0; k < n && b.ok; ++k) {
    const auto a = small_int(isl_constraint_get_coefficient_val(c, isl_dim_set, k));
    if (!a) b.ok = false;
    else if (*a != 0) {
      if (var >= 0 || (*a != 1 && *a != -1)) b.ok = false;
      var = k;
      coefficient = *a;
    }
  }
  const auto constant = small_int(isl_constraint_get_constant_val(c));
  if (var < 0 || !constant) b.ok = false;
  if (b.ok) {
    // coefficient * v + constant >= 0 (or == 0)
    const int64_t value = -coefficient * *constant;
    const size_t v = static_cast<size_t>(var);
    if (isl_constraint_is_equality(c) == isl_bool_true) {
      b.lo[v] = std::max(b.lo[v], value);
      b.hi[v] = std::min(b.hi[v], value);
    } else if (coefficient > 0) {
      b.lo[v] = std::max(b.lo[v], value);
    } else {
      b.hi[v] = std::min(b.hi[v], value);
    }
  }
  isl_constraint_free(c);
  return isl_stat_ok;
}

// isl's C rendering of the expressions made here (loop k's iterator is c<dims[k]>): a product with its constant first, a sum with its
// constant last, pdiv_q and pdiv_r as / and %.
std::string c_text(const LoopExpr& e, const std::vector<size_t>& dims) {
  using K = LoopExpr::Kind;
  switch (e.kind) {
    case K::constant: return std::to_string(e.value);
    case K::iterator: return "c" + std::to_string(dims[static_cast<size_t>(e.iterator)]);
    case K::mul: return c_text(e.args[0], dims) + " * " + c_text(e.args[1], dims);
    case K::add: return c_text(e.args[0], dims) + " + " + c_text(e.args[1], dims);
    case K::floordiv: return c_text(e.args[0], dims) + " / " + c_text(e.args[1], dims);
    case K::mod: return c_text(e.args[0], dims) + " % " + c_text(e.args[1], dims);
    default: return "?";
  }
}

}  // namespace

std::optional<BoxLoops> box_loops(const isl::schedule& tree, const StatementIds& ids, const std::set<int>& parallel_dims) {
  // The domain: one set of the plain statement, a box with constant bounds.
  const isl::union_set domain = tree.domain();
  if (isl_union_set_n_set(domain.get()) != 1) return std::nullopt;
  const isl::set set = domain.set_list().at(0);
  if (set.n_basic_set() != 1 || isl_set_dim(set.get(), isl_dim_param) != 0 || !isl_set_has_tuple_id(set.get())) return std::nullopt;
  const auto kind = ids.find(isl::manage(isl_set_get_tuple_id(set.get())));
  if (!kind || kind->first != LoopNode::Statement::plain || kind->second) return std::nullopt;
  const int n = static_cast<int>(set.tuple_dim());
  // Written as a box: no divisions, every constraint a bound of one variable with coefficient +-1 (a
  // set equal to a box but written otherwise may get other expressions, equal in value, from isl).
  Bounds box{std::vector<int64_t>(static_cast<size_t>(n), INT64_MIN), std::vector<int64_t>(static_cast<size_t>(n), INT64_MAX), true};
  isl_basic_set_list* pieces = isl_set_get_basic_set_list(set.get());
  isl_basic_set* piece = isl_basic_set_list_get_at(pieces, 0);
  isl_basic_set_list_free(pieces);
  if (!piece) return std::nullopt;
  if (isl_basic_set_dim(piece, isl_dim_div) != 0 ||
      isl_basic_set_foreach_constraint(piece, add_bound, &box) != isl_stat_ok)
    box.ok = false;
  isl_basic_set_free(piece);
  if (!box.ok) return std::nullopt;
  const std::vector<int64_t>& lo = box.lo;
  const std::vector<int64_t>& hi = box.hi;
  for (int k = 0; k < n; ++k)
    if (lo[static_cast<size_t>(k)] == INT64_MIN || hi[static_cast<size_t>(k)] == INT64_MAX || lo[static_cast<size_t>(k)] > hi[static_cast<size_t>(k)])
      return std::nullopt;
  // Marks and bands down to the leaf: per schedule dimension its member and the marks before it.
  const std::optional<direct::BandChain> chain = direct::band_chain(tree, ids);
  if (!chain) return std::nullopt;
  std::vector<Member> members;
  for (const isl::union_pw_aff& upa : chain->members) {
    auto m = member(upa, n);
    if (!m) return std::nullopt;
    members.push_back(*m);
  }
  // Each variable in one loop (its own, or a merged one's) after its tiles, each tile a multiple of the
  // next, the first dividing the variable's range from 0. A variable of one value (a dimension of size 1)
  // has no loop: isl leaves out a loop of one value, and so do merged and tiled loops here (left to isl).
  std::vector<int> own(static_cast<size_t>(n), -1), merged_as(static_cast<size_t>(n), -1);
  std::vector<std::vector<size_t>> tiles(static_cast<size_t>(n));
  auto extent = [&](int v) { return hi[static_cast<size_t>(v)] - lo[static_cast<size_t>(v)] + 1; };
  std::vector<int> loop_of(members.size(), -1);  // schedule dimension -> its loop (-1: none)
  std::vector<size_t> dims;                        // loop -> its schedule dimension
  for (size_t d = 0; d < members.size(); ++d) {
    const Member& m = members[d];
    const size_t v = static_cast<size_t>(m.v);
    if (own[v] >= 0 || merged_as[v] >= 0) return std::nullopt;
    if (m.kind == Member::Kind::tile) {
      const int64_t outer = tiles[v].empty() ? extent(m.v) : members[tiles[v].back()].size;
      if (lo[v] != 0 || outer % m.size != 0 || outer / m.size < 2) return std::nullopt;
      tiles[v].push_back(d);
    } else if (m.kind == Member::Kind::var) {
      const int64_t values = tiles[v].empty() ? extent(m.v) : members[tiles[v].back()].size;
      if (values < 1) return std::nullopt;
      own[v] = static_cast<int>(d);
      if (values == 1) continue;  // no loop
    } else {
      const size_t w = static_cast<size_t>(m.w);
      if (own[w] >= 0 || merged_as[w] >= 0 || !tiles[v].empty() || !tiles[w].empty()) return std::nullopt;
      if (lo[v] != 0 || lo[w] != 0 || extent(m.w) != m.size || extent(m.v) < 2) return std::nullopt;
      merged_as[v] = merged_as[w] = static_cast<int>(d);
    }
    loop_of[d] = static_cast<int>(dims.size());
    dims.push_back(d);
  }
  for (size_t v = 0; v < own.size(); ++v)
    if (own[v] < 0 && merged_as[v] < 0) return std::nullopt;
  if (dims.empty()) return std::nullopt;
  // Marks go with the next loop; one under the last loop is left to isl.
  std::vector<bool> has_loop(members.size());
  for (size_t d = 0; d < members.size(); ++d) has_loop[d] = loop_of[d] >= 0;
  const direct::LoopMarks placed = direct::loop_marks(*chain, has_loop);
  if (!placed.leaf.empty()) return std::nullopt;
  const std::vector<std::vector<std::string>>& loop_marks = placed.marks;
  const std::vector<bool>& loop_parallel = placed.parallel;
  auto it_of = [&](size_t d) { return iterator(loop_of[d]); };
  // The loops, outermost first; loop k has iterator k (isl's c<its schedule dimension>).
  BoxLoops out;
  out.iterators = static_cast<int>(dims.size());
  std::vector<LoopNode> loops;
  std::vector<std::pair<std::string, std::string>> bounds;  // C text of each loop's lower and upper bound
  for (size_t k = 0; k < dims.size(); ++k) {
    const size_t d = dims[k];
    const Member& m = members[d];
    const size_t v = static_cast<size_t>(m.v);
    // Inside a tile of v (an earlier member), this loop runs over that tile's parts.
    const auto& t = tiles[v];
    const size_t position = static_cast<size_t>(std::find(t.begin(), t.end(), d) - t.begin());
    LoopExpr lower, upper;
    if (m.kind == Member::Kind::merged) {
      lower = constant(0);
      upper = constant(m.size * extent(m.v) - 1);
    } else if ((m.kind == Member::Kind::var && !t.empty()) || (m.kind == Member::Kind::tile && position > 0)) {
      const size_t around = m.kind == Member::Kind::var ? t.back() : t[position - 1];
      const int64_t parts = members[around].size / (m.kind == Member::Kind::tile ? m.size : 1);
      lower = op(LoopExpr::Kind::mul, constant(parts), it_of(around));
      upper = op(LoopExpr::Kind::add, lower, constant(parts - 1));
    } else if (m.kind == Member::Kind::tile) {
      lower = constant(0);
      upper = constant(extent(m.v) / m.size - 1);
    } else {
      lower = constant(lo[v]);
      upper = constant(hi[v]);
    }
    LoopNode loop;
    loop.kind = LoopNode::Kind::loop;
    loop.iterator = static_cast<int>(k);
    loop.lower = lower;
    loop.condition = op(LoopExpr::Kind::le, iterator(static_cast<int>(k)), upper);
    loop.step = 1;
    loop.parallel = loop_parallel[k] && parallel_dims.count(static_cast<int>(d)) != 0;
    loops.push_back(std::move(loop));
    bounds.emplace_back(c_text(lower, dims), c_text(upper, dims));
  }
  LoopNode statement;
  statement.kind = LoopNode::Kind::statement;
  statement.statement = LoopNode::Statement::plain;
  for (size_t v = 0; v < own.size(); ++v) {
    if (own[v] >= 0) {
      const size_t d = static_cast<size_t>(own[v]);
      statement.args.push_back(loop_of[d] >= 0 ? it_of(d) : constant(lo[v]));
      continue;
    }
    const size_t d = static_cast<size_t>(merged_as[v]);
    const Member& m = members[d];
    statement.args.push_back(op(static_cast<int>(v) == m.v ? LoopExpr::Kind::floordiv : LoopExpr::Kind::mod, it_of(d), constant(m.size)));
  }
  // isl's C text: two spaces a level, marks as comments, a loop whose body starts with a mark in braces.
  std::string call = "S(";
  for (size_t k = 0; k < statement.args.size(); ++k) call += (k ? ", " : "") + c_text(statement.args[k], dims);
  call += ");\n";
  std::string text;
  std::vector<bool> braced;
  for (size_t k = 0; k < loops.size(); ++k) {
    const std::string indent(2 * k, ' ');
    for (const std::string& name : loop_marks[k]) text += indent + "// " + name + "\n";
    const std::string c = "c" + std::to_string(dims[k]);
    const bool brace = k + 1 < loops.size() && !loop_marks[k + 1].empty();
    text += indent + "for (int " + c + " = " + bounds[k].first + "; " + c + " <= " + bounds[k].second + "; " + c + " += 1)" +
            (brace ? " {\n" : "\n");
    braced.push_back(brace);
  }
  text += std::string(2 * loops.size(), ' ') + call;
  for (size_t k = loops.size(); k-- > 0;)
    if (braced[k]) text += std::string(2 * k, ' ') + "}\n";
  out.ast = text;
  out.root = std::move(statement);
  for (size_t k = loops.size(); k-- > 0;) {
    loops[k].body.push_back(std::move(out.root));
    out.root = std::move(loops[k]);
  }
  return out;
}

}  // namespace polytile::sched::internal
