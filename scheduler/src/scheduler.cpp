// Scheduling with isl (see scheduler.h). Data model: each nest has one statement S_<k> whose domain is an
// isl set over the statement's variables. Its schedule tree is domain -> [mark "parallel"] -> band (the
// variables, output variables first) with the band tiled when the cost model asks for it; the isl AST
// built from that tree is translated node by node into LoopNode/Aff. isl's C API is used for the AST walk
// (the C++ bindings of 0.25 do not expose all of it); every isl object dies before its IslContext.
#include "polytile/scheduler.h"

#include <isl/ast.h>
#include <isl/ast_build.h>
#include <isl/cpp.h>
#include <isl/options.h>
#include <isl/schedule_node.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "polytile/error.h"
#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"
#include "plan.h"

namespace polytile::sched {

Target host_target() {
  Target t;
  long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l1 > 0) t.l1_bytes = l1;
  if (l2 > 0) t.l2_bytes = l2;
  t.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The JIT targets the running CPU, not the one this file was compiled for: ask at run time.
  t.vector_bits = __builtin_cpu_supports("avx512f") ? 512 : __builtin_cpu_supports("avx2") ? 256 : 128;
  return t;
}

std::string Aff::str() const {
  auto a = [this](size_t i) { return args[i].str(); };
  switch (kind) {
    case Kind::constant: return std::to_string(value);
    case Kind::iterator: return "c" + std::to_string(iterator);
    case Kind::add: return "(" + a(0) + " + " + a(1) + ")";
    case Kind::sub: return "(" + a(0) + " - " + a(1) + ")";
    case Kind::mul: return "(" + a(0) + " * " + a(1) + ")";
    case Kind::floordiv: return "floord(" + a(0) + ", " + a(1) + ")";
    case Kind::mod: return "mod(" + a(0) + ", " + a(1) + ")";
    case Kind::min:
    case Kind::max: {
      std::string s = kind == Kind::min ? "min(" : "max(";
      for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + a(i);
      return s + ")";
    }
    case Kind::neg: return "-" + a(0);
    case Kind::select: return "(" + a(0) + " ? " + a(1) + " : " + a(2) + ")";
    case Kind::eq: return "(" + a(0) + " == " + a(1) + ")";
    case Kind::le: return "(" + a(0) + " <= " + a(1) + ")";
    case Kind::lt: return "(" + a(0) + " < " + a(1) + ")";
    case Kind::ge: return "(" + a(0) + " >= " + a(1) + ")";
    case Kind::gt: return "(" + a(0) + " > " + a(1) + ")";
    case Kind::land: return "(" + a(0) + " && " + a(1) + ")";
    case Kind::lor: return "(" + a(0) + " || " + a(1) + ")";
  }
  return "?";
}

std::string Schedule::tree() const {
  std::string s;
  for (const auto& n : nests) s += "// " + n.name + "\n" + n.tree + "\n";
  return s;
}

std::string Schedule::ast() const {
  std::string s;
  for (const auto& n : nests) s += "// " + n.name + "\n" + n.ast;
  return s;
}

namespace {

using isl_support::IslContext;
using isl_support::text;


std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// Translates an isl AST into LoopNodes.
class AstTranslator {
 public:
  std::map<std::string, int> iterators;
  // isl names the loop of schedule dimension k "c<k>"; only the dimensions over output variables (the
  // scheduler lists them) may run in parallel under a "parallel" mark.
  std::set<int> parallel_dims;
  bool parallel_dim(int k) const { return parallel_dims.count(k) != 0; }

  Aff expr(isl_ast_expr* e) {
    Aff a;
    switch (isl_ast_expr_get_type(e)) {
      case isl_ast_expr_int: {
        isl_val* v = isl_ast_expr_get_val(e);
        a.kind = Aff::Kind::constant;
        a.value = isl_val_get_num_si(v);
        isl_val_free(v);
        return a;
      }
      case isl_ast_expr_id: {
        isl_id* id = isl_ast_expr_get_id(e);
        std::string name = isl_id_get_name(id);
        isl_id_free(id);
        auto it = iterators.find(name);
        POLYTILE_CHECK(it != iterators.end(), "unknown isl AST identifier ", name);
        a.kind = Aff::Kind::iterator;
        a.iterator = it->second;
        return a;
      }
      case isl_ast_expr_op: break;
      default: POLYTILE_CHECK(false, "unexpected isl AST expression");
    }
    int n = isl_ast_expr_get_op_n_arg(e);
    for (int i = 0; i < n; ++i) {
      isl_ast_expr* arg = isl_ast_expr_get_op_arg(e, i);
      a.args.push_back(expr(arg));
      isl_ast_expr_free(arg);
    }
    switch (isl_ast_expr_get_op_type(e)) {
      case isl_ast_expr_op_and:
      case isl_ast_expr_op_and_then: a.kind = Aff::Kind::land; break;
      case isl_ast_expr_op_or:
      case isl_ast_expr_op_or_else: a.kind = Aff::Kind::lor; break;
      case isl_ast_expr_op_max: a.kind = Aff::Kind::max; break;
      case isl_ast_expr_op_min: a.kind = Aff::Kind::min; break;
      case isl_ast_expr_op_minus: a.kind = Aff::Kind::neg; break;
      case isl_ast_expr_op_add: a.kind = Aff::Kind::add; break;
      case isl_ast_expr_op_sub: a.kind = Aff::Kind::sub; break;
      case isl_ast_expr_op_mul: a.kind = Aff::Kind::mul; break;
      case isl_ast_expr_op_div:      // exact
      case isl_ast_expr_op_fdiv_q:
      case isl_ast_expr_op_pdiv_q: a.kind = Aff::Kind::floordiv; break;
      case isl_ast_expr_op_pdiv_r:
      case isl_ast_expr_op_zdiv_r: a.kind = Aff::Kind::mod; break;
      case isl_ast_expr_op_cond:
      case isl_ast_expr_op_select: a.kind = Aff::Kind::select; break;
      case isl_ast_expr_op_eq: a.kind = Aff::Kind::eq; break;
      case isl_ast_expr_op_le: a.kind = Aff::Kind::le; break;
      case isl_ast_expr_op_lt: a.kind = Aff::Kind::lt; break;
      case isl_ast_expr_op_ge: a.kind = Aff::Kind::ge; break;
      case isl_ast_expr_op_gt: a.kind = Aff::Kind::gt; break;
      default: POLYTILE_CHECK(false, "unsupported isl AST operation");
    }
    return a;
  }

  LoopNode node(isl_ast_node* n, bool parallel_mark) {
    LoopNode out;
    switch (isl_ast_node_get_type(n)) {
      case isl_ast_node_block: {
        out.kind = LoopNode::Kind::block;
        isl_ast_node_list* list = isl_ast_node_block_get_children(n);
        for (int i = 0; i < isl_ast_node_list_n_ast_node(list); ++i) {
          isl_ast_node* child = isl_ast_node_list_get_ast_node(list, i);
          out.body.push_back(node(child, false));
          isl_ast_node_free(child);
        }
        isl_ast_node_list_free(list);
        return out;
      }
      case isl_ast_node_mark: {
        isl_id* id = isl_ast_node_mark_get_id(n);
        bool parallel = std::string(isl_id_get_name(id)) == "parallel";
        isl_id_free(id);
        isl_ast_node* child = isl_ast_node_mark_get_node(n);
        out = node(child, parallel || parallel_mark);
        isl_ast_node_free(child);
        return out;
      }
      case isl_ast_node_for: {
        out.kind = LoopNode::Kind::loop;
        isl_ast_expr* it = isl_ast_node_for_get_iterator(n);
        isl_id* id = isl_ast_expr_get_id(it);
        std::string name = isl_id_get_name(id);
        isl_id_free(id);
        isl_ast_expr_free(it);
        // Sibling loops may reuse a name (c0 for each piece of a split dimension): one iterator per name.
        int index = iterators.emplace(name, static_cast<int>(iterators.size())).first->second;
        out.iterator = index;
        isl_ast_expr* init = isl_ast_node_for_get_init(n);
        isl_ast_expr* cond = isl_ast_node_for_get_cond(n);
        isl_ast_expr* inc = isl_ast_node_for_get_inc(n);
        out.lower = expr(init);
        out.condition = expr(cond);
        Aff step = expr(inc);
        POLYTILE_CHECK(step.kind == Aff::Kind::constant && step.value > 0, "non-constant loop step");
        out.step = step.value;
        isl_ast_expr_free(init);
        isl_ast_expr_free(cond);
        isl_ast_expr_free(inc);
        out.parallel = parallel_mark && name.size() > 1 && name[0] == 'c' &&
                       std::all_of(name.begin() + 1, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
                       parallel_dim(std::stoi(name.substr(1)));
        isl_ast_node* body = isl_ast_node_for_get_body(n);
        out.body.push_back(node(body, false));
        isl_ast_node_free(body);
        return out;
      }
      case isl_ast_node_if: {
        out.kind = LoopNode::Kind::guard;
        isl_ast_expr* cond = isl_ast_node_if_get_cond(n);
        out.condition = expr(cond);
        isl_ast_expr_free(cond);
        isl_ast_node* then = isl_ast_node_if_get_then_node(n);
        out.body.push_back(node(then, false));
        isl_ast_node_free(then);
        if (isl_ast_node_if_has_else_node(n)) {
          isl_ast_node* other = isl_ast_node_if_get_else_node(n);
          out.otherwise.push_back(node(other, false));
          isl_ast_node_free(other);
        }
        return out;
      }
      case isl_ast_node_user: {
        out.kind = LoopNode::Kind::statement;
        isl_ast_expr* call = isl_ast_node_user_get_expr(n);
        {
          isl_ast_expr* callee = isl_ast_expr_get_op_arg(call, 0);
          isl_id* id = isl_ast_expr_get_id(callee);
          std::string name = isl_id_get_name(id);
          isl_id_free(id);
          isl_ast_expr_free(callee);
          using St = LoopNode::Statement;
          static const std::map<std::string, St> kinds{{"S", St::plain}, {"Z", St::zero}, {"Zp", St::zero},
                                                       {"L", St::load},  {"Lp", St::load},
                                                       {"F", St::fma},   {"Fp", St::fma}, {"T", St::store},
                                                       {"Tp", St::store}, {"E", St::epilogue}, {"Ep", St::epilogue}};
          auto kind = kinds.find(name);
          POLYTILE_CHECK(kind != kinds.end(), "unknown statement ", name, " in the isl AST");
          out.statement = kind->second;
          out.predicated = name.size() == 2;
        }
        int args = isl_ast_expr_get_op_n_arg(call);
        for (int i = 1; i < args; ++i) {
          isl_ast_expr* arg = isl_ast_expr_get_op_arg(call, i);
          out.args.push_back(expr(arg));
          isl_ast_expr_free(arg);
        }
        isl_ast_expr_free(call);
        return out;
      }
      default: POLYTILE_CHECK(false, "unexpected isl AST node");
    }
  }
};

std::string box_text(const std::string& tuple, const std::vector<std::string>& vars, const std::vector<int64_t>& shape) {
  std::vector<std::string> conds;
  for (size_t k = 0; k < vars.size(); ++k) conds.push_back("0 <= " + vars[k] + " < " + std::to_string(shape[k]));
  std::string s = "{ " + tuple + "[" + join(vars) + "]";
  if (!conds.empty()) s += " : " + join(conds, " and ");
  return s + " }";
}

// Tile sizes for a band ordered (parallel outputs..., reductions..., contiguous innermost): the
// innermost member keeps whole vector registers in long runs, reduction members are blocked so that a
// tile's input blocks stay in L2, and the outer members are blocked so the output block a tile updates
// stays in L1. Members shorter than their tile are left whole.
std::vector<int64_t> tile_sizes(const std::vector<int64_t>& extents, size_t parallel_members, const Target& t,
                                size_t element_bytes) {
  const size_t n = extents.size();
  std::vector<int64_t> sizes(extents);
  int64_t lanes = std::max<int64_t>(1, t.vector_bits / static_cast<int64_t>(8 * element_bytes));
  int64_t inner = std::min<int64_t>(extents[n - 1], 16 * lanes);
  int64_t l1_elems = t.l1_bytes / static_cast<int64_t>(element_bytes);
  int64_t l2_elems = t.l2_bytes / static_cast<int64_t>(element_bytes);
  int64_t outer = std::clamp<int64_t>(l1_elems / (2 * std::max<int64_t>(1, inner)), 1, 64);
  int64_t reduction = std::clamp<int64_t>(l2_elems / (4 * std::max<int64_t>(1, inner)), 8, 256);
  for (size_t k = 0; k < n; ++k) {
    int64_t want = std::max<int64_t>(1, k + 1 == n ? inner : k < parallel_members ? outer : reduction);
    int64_t tiles = (extents[k] + want - 1) / want;
    sizes[k] = (extents[k] + tiles - 1) / tiles;  // balanced: equal tiles, no sliver at the end
  }
  return sizes;
}

// An integral polynomial (dims bound) as isl affine text over positional variable names.
std::string affine_text(const Polynomial& p, const std::vector<std::string>& vars, const std::vector<std::string>& positional) {
  std::string t = std::to_string(p.constant().num());
  for (const auto& [v, c] : p.index_terms()) {
    size_t k = static_cast<size_t>(std::find(vars.begin(), vars.end(), v) - vars.begin());
    int64_t n = c.num();
    t += (n < 0 ? " - " : " + ") + std::to_string(n < 0 ? -n : n) + "*" + positional.at(k);
  }
  return t;
}

struct NestBuilder {
  const Target& target;
  IslContext ctx;
  isl::set blocks_;         // the last micro-kernel's blocks, B[others, Bb, Bv]
  isl::map block_rows_;     // from a block to the points of S its rows and in-range lanes store

  // Builds schedule tree, AST and loop IR for one statement domain. `order` permutes the variables into
  // band order; the first `parallel` band members are marked parallel.
  void build(Nest& nest, const std::string& domain_text, const std::vector<std::string>& vars,
             const std::vector<size_t>& order, size_t parallel, size_t element_bytes, bool tiled = false,
             bool innermost_last = false, bool reduction_outer = false) {
    isl::union_set domain(ctx.get(), domain_text);
    isl::schedule sched = isl::schedule::from_domain(domain);
    std::set<int> safe;  // schedule dimensions whose loops may run in parallel
    if (!vars.empty()) {
      std::vector<std::string> perm;
      for (size_t k : order) perm.push_back(vars[k]);
      std::string tuple = "S[" + join(vars) + "]";
      isl::union_map band_map(ctx.get(), "{ " + tuple + " -> [" + join(perm) + "] }");
      isl::schedule_node root = sched.root().child(0);
      root = root.insert_partial_schedule(isl::manage(isl_multi_union_pw_aff_from_union_map(band_map.copy())));
      // Extents of the band members, for the cost model.
      isl::space band_space = isl::manage(isl_space_set_alloc(ctx.get().get(), 0, static_cast<unsigned>(perm.size())));
      isl::set box = domain.apply(band_map).extract_set(band_space);
      std::vector<int64_t> extents, lows;
      for (size_t k = 0; k < perm.size(); ++k) {
        isl::val lo = box.dim_min_val(static_cast<int>(k)), hi = box.dim_max_val(static_cast<int>(k));
        bool known = lo.is_int() && hi.is_int();
        extents.push_back(known ? hi.get_num_si() - lo.get_num_si() + 1 : 1);
        lows.push_back(known ? lo.get_num_si() : 0);
      }
      int64_t points = 1;
      for (int64_t e : extents) points = points > (int64_t{1} << 40) / std::max<int64_t>(e, 1) ? points : points * e;
      bool tile = tiled && perm.size() >= 2 && points > 64 * 64 * 64;
      if (tile) {
        std::vector<int64_t> sizes = tile_sizes(extents, parallel, target, element_bytes);
        auto tile_of = [&](size_t k, int64_t size) {
          std::string shifted = lows[k] == 0 ? perm[k] : "(" + perm[k] + " - (" + std::to_string(lows[k]) + "))";
          return "floor(" + shifted + "/" + std::to_string(size) + ")";
        };
        std::vector<std::string> tiles, point;
        if (reduction_outer) {
          // The output block is small next to the inputs (a weight gradient): split the leading output
          // variable across the threads, and inside a split run the reductions outermost so each input
          // element is read once per split while the output block stays in cache.
          int64_t chunk = (extents[0] + target.threads - 1) / std::max(1, target.threads);
          tiles.push_back(tile_of(0, std::max<int64_t>(1, chunk)));
          size_t n_red = perm.size() - parallel - (innermost_last ? 1 : 0);
          for (size_t k = parallel; k < parallel + n_red; ++k) point.push_back(perm[k]);
          for (size_t k = 0; k < parallel; ++k) point.push_back(perm[k]);
          if (innermost_last) point.push_back(perm.back());
          safe.insert(0);
          for (size_t k = 0; k < parallel; ++k) safe.insert(static_cast<int>(1 + n_red + k));
        } else {
          // Tile and point loops keep the band order (parallel outputs, reductions, contiguous innermost).
          // Measured on 1024^3 sgemm: reordering the point loops for register blocking (reductions outside
          // a 4 x 32 output block) ran at half the speed of this order with LLVM 16's vectorizer.
          for (size_t k = 0; k < perm.size(); ++k) {
            tiles.push_back(tile_of(k, sizes[k]));
            point.push_back(perm[k]);
          }
          for (size_t k = 0; k < parallel; ++k) safe.insert(static_cast<int>(perm.size() + k));
        }
        std::string tuple_text = "{ S[" + join(vars) + "] -> ";
        isl::union_map tile_map(ctx.get(), tuple_text + "[" + join(tiles) + "] }");
        isl::union_map point_map(ctx.get(), tuple_text + "[" + join(point) + "] }");
        root = isl::manage(isl_schedule_node_delete(root.release()));
        root = root.insert_partial_schedule(isl::manage(isl_multi_union_pw_aff_from_union_map(point_map.copy())));
        root = root.insert_mark(isl::id(ctx.get(), "point"));
        root = root.insert_partial_schedule(isl::manage(isl_multi_union_pw_aff_from_union_map(tile_map.copy())));
        root = root.insert_mark(isl::id(ctx.get(), "tile")).child(0);
      }
      if (!tile || !reduction_outer)
        for (size_t k = 0; k < parallel; ++k) safe.insert(static_cast<int>(k));
      if (parallel > 0) root = root.insert_mark(isl::id(ctx.get(), "parallel"));
      sched = root.schedule();
      nest.parallel_outer = parallel > 0;
    }
    generate(nest, sched, safe);
  }

  // The runtime splits the outer loop's range: the root must be a parallel loop with constant bounds, or
  // a block of such loops (isl splits the outermost dimension when statements cover different parts).
  static void finish_parallel(Nest& nest) {
    if (!nest.parallel_outer) return;
    std::vector<LoopNode*> loops;
    if (nest.root.kind == LoopNode::Kind::block) {
      for (auto& child : nest.root.body) loops.push_back(&child);
    } else {
      loops.push_back(&nest.root);
    }
    bool simple = !loops.empty();
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (LoopNode* r : loops) {
      const Aff& c = r->condition;
      bool ok = r->kind == LoopNode::Kind::loop && r->parallel && r->lower.kind == Aff::Kind::constant &&
                (c.kind == Aff::Kind::le || c.kind == Aff::Kind::lt) && c.args[0].kind == Aff::Kind::iterator &&
                c.args[1].kind == Aff::Kind::constant;
      simple = simple && ok;
      if (!ok) continue;
      lo = std::min(lo, r->lower.value);
      hi = std::max(hi, c.args[1].value - (c.kind == Aff::Kind::lt ? 1 : 0));
    }
    nest.parallel_outer = simple;
    if (simple) {
      nest.outer_lo = lo;
      nest.outer_hi = hi;
    } else {
      for (LoopNode* r : loops) r->parallel = false;
      nest.root.parallel = false;
    }
  }

  // Generates the AST of `sched` into the nest; `safe`: schedule dims whose loops may run in parallel.
  void generate(Nest& nest, const isl::schedule& sched, const std::set<int>& safe) {
    nest.tree = text(sched);
    isl_ast_build* build = isl_ast_build_alloc(ctx.get().get());
    isl_ast_node* ast = isl_ast_build_node_from_schedule(build, sched.copy());
    isl_ast_build_free(build);
    POLYTILE_CHECK(ast != nullptr, "isl failed to generate the AST of ", nest.name);
    char* c = isl_ast_node_to_C_str(ast);
    nest.ast = c;
    free(c);
    AstTranslator tr;
    tr.parallel_dims = safe;
    nest.root = tr.node(ast, false);
    nest.iterators = static_cast<int>(tr.iterators.size());
    isl_ast_node_free(ast);
    finish_parallel(nest);
  }

  // Schedules `nest` (an update of `c`) as a micro-kernel when the plan and the isl checks allow it.
  bool try_microkernel(Nest& nest, const Contraction& c, const ProgramTypes& types, const poly::ContractionAnalysis& a,
                       const std::string& domain_text, const std::vector<std::string>& positional, int64_t out_bytes,
                       std::string* uncovered, const Elementwise* epilogue) {
    int64_t points = 1;
    for (const auto& b : a.bounds) points = points > (int64_t{1} << 50) / (b.max - b.min + 1) ? points : points * (b.max - b.min + 1);
    if (points < target.microkernel_min_points) return false;
    std::optional<MicroPlan> plan = plan_microkernel(c, types, a.bounds, target, false);
    if (!plan) return false;
    auto index = [&nest](const std::string& v) {
      return static_cast<size_t>(std::find(nest.variables.begin(), nest.variables.end(), v) - nest.variables.begin());
    };
    std::vector<std::pair<int64_t, int64_t>> range(nest.variables.size());
    for (const auto& b : a.bounds) range[index(b.name)] = {b.min, b.max};
    Microkernel mk;
    mk.block = index(plan->block);
    mk.vector = index(plan->vector);
    mk.rows = plan->rows;
    mk.chunks = plan->chunks;
    mk.lanes = plan->lanes;
    mk.block_lo = range[mk.block].first;
    mk.vector_lo = range[mk.vector].first;
    mk.vector_hi = range[mk.vector].second;
    std::set<std::string> in_output;
    for (const auto& p : c.output_indices)
      for (const auto& [v, coeff] : p.index_terms()) in_output.insert(v);
    for (size_t k = 0; k < nest.variables.size(); ++k) {
      if (k == mk.block || k == mk.vector) continue;
      (in_output.count(nest.variables[k]) ? mk.others : mk.reductions).push_back(k);
    }
    // The vector variable must range over the same interval at every other point: then a lane is valid
    // exactly when its row is, and only the last block column can be partial.
    isl::set domain(ctx.get(), domain_text);
    isl::set free_v = isl::manage(isl_set_eliminate(domain.copy(), isl_dim_set, static_cast<unsigned>(mk.vector), 1));
    std::string tuple = "S[" + join(positional) + "]";
    free_v = free_v.intersect(isl::set(ctx.get(), "{ " + tuple + " : " + std::to_string(mk.vector_lo) + " <= " +
                                                       positional[mk.vector] + " <= " + std::to_string(mk.vector_hi) + " }"));
    if (!free_v.is_equal(domain)) return false;
    // Whether the other output variables leave the broadcast operand alone (they only pick columns).
    bool columns_only = true;
    for (const auto& in : c.inputs) {
      bool has_v = false;
      for (const auto& p : in.indices) has_v |= p.coefficient(plan->vector) != Rational(0);
      if (has_v) continue;
      for (size_t k : mk.others)
        for (const auto& p : in.indices) columns_only &= p.coefficient(nest.variables[k]) == Rational(0);
    }
    // The inputs' access functions over S, not restricted to the domain: footprints are then those of
    // interior blocks, where every point of a tile is valid.
    std::vector<std::string> reads;
    for (const auto& in : c.inputs) {
      std::vector<std::string> idx;
      for (const auto& p : in.indices) idx.push_back(affine_text(p.bind_dims(types.dims), nest.variables, positional));
      reads.push_back("{ S[" + join(positional) + "] -> " + in.tensor + "[" + join(idx) + "] }");
    }
    // A small output with long reductions (a weight gradient) runs the reduction tiles outside its blocks.
    int64_t reduction_points = 1;
    for (size_t k : mk.reductions) reduction_points *= range[k].second - range[k].first + 1;
    bool weight_mode = out_bytes * 2 <= target.l2_bytes && reduction_points >= 2048;
    nest.microkernel = mk;
    if (epilogue && uncovered) nest.epilogue = *epilogue;
    build_microkernel(nest, domain_text, positional, range, true, weight_mode,
                      types.tensors.at(c.output).dtype == DType::f64 ? 8 : 4, reads, uncovered != nullptr, columns_only);
    if (uncovered) {
      // Output elements that no block stores: those still need the init nest.
      std::vector<std::string> polys;
      for (const auto& p : c.output_indices) polys.push_back(affine_text(p.bind_dims(types.dims), nest.variables, positional));
      std::vector<std::string> dims;
      const auto& shape = types.tensors.at(c.output).shape;
      for (size_t k = 0; k < shape.size(); ++k) dims.push_back("i" + std::to_string(k));
      isl::set box(ctx.get(), box_text("S", dims, shape));
      isl::set stored = blocks_.apply(block_rows_)
                            .apply(isl::map(ctx.get(), "{ S[" + join(positional) + "] -> S[" + join(polys) + "] }"));
      *uncovered = text(box.subtract(stored).coalesce());
    }
    return true;
  }

  // The micro-kernel nest of an update (see Microkernel in scheduler.h). Statement domains: F (fast
  // blocks: every row has the same reduction points, every lane in range) and Fp (the other blocks, over
  // the union of their rows' points), both over (others, Bb, Bv, reductions); L/Lp and T/Tp over (others,
  // Bb, Bv, reduction tiles). Tree: [outer band] -> [reduction tiles] -> [block band] ->
  // sequence(L | F -> [reductions] | T).
  void build_microkernel(Nest& nest, const std::string& domain_text, const std::vector<std::string>& vars,
                         const std::vector<std::pair<int64_t, int64_t>>& range, bool parallel, bool weight_mode,
                         size_t element_bytes, const std::vector<std::string>& reads, bool zero_init, bool columns_only) {
    const Microkernel& mk = *nest.microkernel;
    const int64_t R = mk.rows, VL = int64_t{mk.chunks} * mk.lanes;
    auto s = [](int64_t v) { return std::to_string(v); };
    auto shifted = [&s](const std::string& v, int64_t lo) { return lo == 0 ? v : "(" + v + " - (" + s(lo) + "))"; };
    std::vector<std::string> others, reds, tiles;
    for (size_t k : mk.others) others.push_back(vars[k]);
    for (size_t k : mk.reductions) reds.push_back(vars[k]);
    for (size_t k = 0; k < reds.size(); ++k) tiles.push_back("t" + s(static_cast<int64_t>(k)));
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const std::vector<std::string> block_dims = cat(others, {"bb", "bv"});
    const std::string f_tuple = "[" + join(cat(block_dims, reds)) + "]";
    const std::string l_tuple = "[" + join(cat(block_dims, tiles)) + "]";
    const std::string s_tuple = "S[" + join(vars) + "]";
    auto set = [this](const std::string& t) { return isl::set(ctx.get(), t); };
    auto map = [this](const std::string& t) { return isl::map(ctx.get(), t); };
    auto named = [](isl::set x, const char* name) { return isl::manage(isl_set_set_tuple_name(x.release(), name)); };

    isl::set domain = set(domain_text);
    const std::string bb_expr = "floor(" + shifted(vars[mk.block], mk.block_lo) + "/" + s(R) + ")";
    const std::string bv_expr = "floor(" + shifted(vars[mk.vector], mk.vector_lo) + "/" + s(VL) + ")";
    isl::set hull = domain.apply(map("{ " + s_tuple + " -> F[" + join(cat(cat(others, {bb_expr, bv_expr}), reds)) + "] }"));
    // Rows that differ from row 0 of their block: X = (block dims, reductions, row).
    std::vector<std::string> at_row;
    for (size_t k = 0; k < vars.size(); ++k) {
      if (k == mk.block) at_row.push_back(s(mk.block_lo) + " + " + s(R) + "*bb + dd");
      else if (k == mk.vector) at_row.push_back(s(mk.vector_lo) + " + " + s(VL) + "*bv");
      else at_row.push_back(vars[k]);
    }
    const std::vector<std::string> x_vars = cat(cat(block_dims, reds), {"dd"});
    isl::set rows = domain.apply(map("{ X[" + join(x_vars) + "] -> S[" + join(at_row) + "] : 0 <= dd < " + s(R) + " }").reverse());
    std::vector<std::string> x_row0 = x_vars;
    x_row0.back() = "e";
    isl::set row0 = rows.apply(map("{ X[" + join(x_vars) + "] -> X[" + join(x_row0) + "] : dd = 0 and 0 <= e < " + s(R) + " }"));
    isl::set differ = rows.subtract(row0).unite(row0.subtract(rows));
    isl::set blocks = hull.apply(map("{ F" + f_tuple + " -> B[" + join(block_dims) + "] }"));
    isl::set bad = differ.apply(map("{ X[" + join(x_vars) + "] -> B[" + join(block_dims) + "] }"))
                       .unite(set("{ B[" + join(block_dims) + "] : " + s(mk.vector_lo) + " + " + s(VL) + "*bv + " + s(VL - 1) +
                                  " > " + s(mk.vector_hi) + " }"))
                       .intersect(blocks);
    isl::set good = blocks.subtract(bad).coalesce();
    isl::set fast = hull.intersect(good.apply(map("{ B[" + join(block_dims) + "] -> F" + f_tuple + " }"))).coalesce();
    isl::set slow = hull.subtract(fast).coalesce();

    // Cost model: reduction tiles sized by footprints computed with isl. The inputs a block (in a
    // weight-gradient nest, a row of blocks across all columns) reads over one full reduction tile -- the
    // bounding box of the image of the tile's points under each access function -- must fit in three
    // quarters of L1: the vector operand is then reused from L1 by every block row. Filled innermost
    // reduction variable first, each as large as fits (binary search), then balanced.
    const int64_t eb = static_cast<int64_t>(element_bytes);
    const int64_t n_bb = (range[mk.block].second - mk.block_lo + R) / R;
    const int64_t n_bv = (mk.vector_hi - mk.vector_lo + VL) / VL;
    std::vector<int64_t> tile(reds.size(), 1), red_lo(reds.size());
    {
      isl::set representative = blocks.lexmin();
      if (weight_mode) {
        std::vector<std::string> any_column = block_dims;
        any_column.back() = "bv2";
        representative = representative.apply(map("{ B[" + join(block_dims) + "] -> B[" + join(any_column) + "] }")).intersect(blocks);
      }
      std::vector<std::string> at_lane = at_row;
      at_lane[mk.vector] = s(mk.vector_lo) + " + " + s(VL) + "*bv + l";
      const std::string y_tuple = "Y[" + join(cat(block_dims, {"dd", "l"})) + "]";
      isl::set points = representative
                            .apply(map("{ B[" + join(block_dims) + "] -> " + y_tuple + " : 0 <= dd < " + s(R) + " and 0 <= l < " + s(VL) + " }"))
                            .apply(map("{ " + y_tuple + " -> S[" + join(at_lane) + "] }"));
      std::vector<isl::map> accesses;
      for (const auto& r : reads) accesses.push_back(map(r));
      auto footprint = [&]() {
        std::vector<std::string> in_tile;
        for (size_t k = 0; k < reds.size(); ++k)
          in_tile.push_back(s(red_lo[k]) + " <= " + reds[k] + " < " + s(red_lo[k] + tile[k]));
        isl::set piece = points.intersect(set("{ " + s_tuple + " : " + join(in_tile, " and ") + " }"));
        int64_t bytes = 0;
        for (const auto& access : accesses) {
          isl::set image = piece.apply(access);
          if (image.is_empty()) continue;
          int64_t volume = 1;
          for (int d = 0; d < static_cast<int>(image.tuple_dim()); ++d) {
            isl::val lo = image.dim_min_val(d), hi = image.dim_max_val(d);
            if (lo.is_int() && hi.is_int()) volume *= hi.get_num_si() - lo.get_num_si() + 1;
          }
          bytes += volume * eb;
        }
        return bytes;
      };
      for (size_t k = 0; k < reds.size(); ++k) red_lo[k] = range[mk.reductions[k]].first;
      const int64_t budget = target.l1_bytes * 3 / 4;
      for (size_t k = reds.size(); k-- > 0;) {
        const int64_t e = range[mk.reductions[k]].second - red_lo[k] + 1;
        int64_t lo = 1, hi = e;
        while (lo < hi) {
          tile[k] = (lo + hi + 1) / 2;
          if (footprint() <= budget) lo = tile[k];
          else hi = tile[k] - 1;
        }
        int64_t n = (e + lo - 1) / lo;
        tile[k] = (e + n - 1) / n;  // balanced: equal tiles
        if (tile[k] < e) break;     // the outer reduction variables stay at one value per tile
      }
    }
    int64_t tile_points = 1;
    for (int64_t t : tile) tile_points *= t;
    std::vector<std::string> tile_exprs;
    for (size_t k = 0; k < reds.size(); ++k)
      tile_exprs.push_back("floor(" + shifted(reds[k], red_lo[k]) + "/" + s(tile[k]) + ")");
    isl::map to_tiles = map("{ F" + f_tuple + " -> L[" + join(cat(block_dims, tile_exprs)) + "] }");
    isl::set load = fast.apply(to_tiles), load_p = slow.apply(to_tiles);
    // A block's first reduction tile (lexicographically) starts from zero accumulators.
    std::vector<std::string> earlier_tiles, lexless;
    for (size_t k = 0; k < tiles.size(); ++k) earlier_tiles.push_back("s" + s(static_cast<int64_t>(k)));
    for (size_t k = 0; k < tiles.size(); ++k) {
      std::string term;
      for (size_t j = 0; j < k; ++j) term += earlier_tiles[j] + " = " + tiles[j] + " and ";
      lexless.push_back("(" + term + earlier_tiles[k] + " < " + tiles[k] + ")");
    }
    isl::map later = map("{ L[" + join(cat(block_dims, earlier_tiles)) + "] -> L[" + join(cat(block_dims, tiles)) + "] : " +
                         join(lexless, " or ") + " }");
    load = load.coalesce();
    load_p = load_p.coalesce();
    isl::set store = load, store_p = load_p;
    isl::set zero = load.subtract(load.apply(later)), zero_p = load_p.subtract(load_p.apply(later));
    if (zero_init) {
      zero = zero.coalesce();
      zero_p = zero_p.coalesce();
      load = load.subtract(zero).coalesce();
      load_p = load_p.subtract(zero_p).coalesce();
    } else {
      zero = isl::set::empty(zero.get_space());
      zero_p = isl::set::empty(zero_p.get_space());
    }
    // A fused consumer runs at each block's last reduction tile, in place of the store.
    isl::set last = store.subtract(store.apply(later.reverse())), last_p = store_p.subtract(store_p.apply(later.reverse()));
    if (!nest.epilogue) {
      last = isl::set::empty(last.get_space());
      last_p = isl::set::empty(last_p.get_space());
    }
    // For the init nest: the blocks, and their rows and in-range lanes as points of S.
    blocks_ = blocks;
    {
      std::vector<std::string> at_lane = at_row;
      at_lane[mk.vector] = s(mk.vector_lo) + " + " + s(VL) + "*bv + l";
      const std::string y_tuple = "Y[" + join(cat(block_dims, {"dd", "l"})) + "]";
      block_rows_ = map("{ B[" + join(block_dims) + "] -> " + y_tuple + " : 0 <= dd < " + s(R) + " and 0 <= l < " + s(VL) +
                        " and " + s(mk.vector_lo) + " + " + s(VL) + "*bv + l <= " + s(mk.vector_hi) + " }")
                        .apply_range(map("{ " + y_tuple + " -> S[" + join(at_lane) + "] }"));
    }

    // Outer and block bands over (others, Bb, Bv).
    std::vector<std::string> outer, inner;
    std::set<int> safe;
    if (weight_mode) {
      // A small output: split its widest block dimension across the threads; every thread then runs the
      // reduction tiles outermost over all of its blocks.
      std::vector<int64_t> counts;
      for (size_t k : mk.others) counts.push_back(range[k].second - range[k].first + 1);
      counts.push_back(n_bb);
      counts.push_back(n_bv);
      size_t widest = static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
      int64_t chunk = (counts[widest] + target.threads - 1) / std::max(1, target.threads);
      int64_t lo = widest < mk.others.size() ? range[mk.others[widest]].first : 0;
      outer.push_back("floor(" + shifted(block_dims[widest], lo) + "/" + s(chunk) + ")");
      inner = cat(others, {"bv", "bb"});
    } else {
      // One block column (Bv) at a time; the rows of a tile of Bb blocks share it while their broadcast
      // operand stays in half of L2. When a column has few blocks, the other output variables are tiled
      // too, so that at least 16 blocks (up to 32 when there are enough) reuse each reduction tile of the
      // vector operand from L1. The parallel dimension is the first with enough values.
      int64_t row_bytes = std::max<int64_t>(1, R * tile_points * eb);
      int64_t tb = std::clamp<int64_t>(target.l2_bytes / 2 / row_bytes, 1, n_bb);
      const int64_t want = 2 * target.threads;
      std::vector<int64_t> counts;
      for (size_t k : mk.others) counts.push_back(range[k].second - range[k].first + 1);
      counts.push_back(n_bv);
      counts.push_back((n_bb + tb - 1) / tb);
      size_t lead = 0;
      std::vector<int64_t> other_tile(others.size(), 1);
      if (columns_only && !others.empty() && n_bb >= want) {
        // The other output variables only pick columns of the vector operand (a packed matrix's panels):
        // a tile of block rows, split across the threads, stays in L2 while every column reuses it.
        tb = std::min(tb, (n_bb + want - 1) / want);
        lead = counts.size() - 1;
        for (size_t k = 0; k < others.size(); ++k) other_tile[k] = counts[k];
      } else {
        while (lead < counts.size() && counts[lead] < want) ++lead;
        if (lead == counts.size()) {
          // Nothing has enough values: split the row tiles finer, or lead with the dimension with the most.
          tb = std::max<int64_t>(1, std::min(tb, n_bb / want));
          counts.back() = (n_bb + tb - 1) / tb;
          lead = static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
        }
        int64_t per_tile = tb;
        for (size_t k = others.size(); k-- > 0 && per_tile < 16;) {
          if (k == lead) continue;  // the parallel dimension keeps its values
          other_tile[k] = std::min<int64_t>(counts[k], (32 + per_tile - 1) / per_tile);
          per_tile *= other_tile[k];
        }
      }
      for (size_t k = 0; k < others.size(); ++k)
        outer.push_back(other_tile[k] == 1 ? others[k]
                                           : "floor(" + shifted(others[k], range[mk.others[k]].first) + "/" + s(other_tile[k]) + ")");
      outer.push_back("bv");
      outer.push_back("floor(bb/" + s(tb) + ")");
      std::rotate(outer.begin(), outer.begin() + static_cast<long>(lead), outer.begin() + static_cast<long>(lead) + 1);
      for (size_t k = 0; k < others.size(); ++k)
        if (other_tile[k] > 1) inner.push_back(others[k]);
      inner.push_back("bb");
    }
    safe.insert(0);

    auto union_map = [&](const std::vector<std::string>& f_exprs, const std::vector<std::string>& l_exprs) {
      std::string t = "{ ";
      for (const char* name : {"F", "Fp"}) t += std::string(name) + f_tuple + " -> [" + join(f_exprs) + "]; ";
      for (const char* name : {"Z", "Zp", "L", "Lp", "T", "Tp", "E", "Ep"}) t += std::string(name) + l_tuple + " -> [" + join(l_exprs) + "]; ";
      t.resize(t.size() - 2);
      return isl::union_map(ctx.get(), t + " }");
    };
    auto band = [](isl::schedule_node node, const isl::union_map& m) {
      return node.insert_partial_schedule(isl::manage(isl_multi_union_pw_aff_from_union_map(m.copy())));
    };
    isl::union_set all = isl::union_set(named(fast, "F"))
                             .unite(isl::union_set(named(slow, "Fp")))
                             .unite(isl::union_set(named(load, "L")))
                             .unite(isl::union_set(named(load_p, "Lp")))
                             .unite(isl::union_set(named(zero, "Z")))
                             .unite(isl::union_set(named(zero_p, "Zp")))
                             .unite(isl::union_set(named(store.subtract(last), "T")))
                             .unite(isl::union_set(named(store_p.subtract(last_p), "Tp")))
                             .unite(isl::union_set(named(last, "E")))
                             .unite(isl::union_set(named(last_p, "Ep")));
    isl::schedule sched = isl::schedule::from_domain(all);
    isl::schedule_node node = sched.root().child(0);
    node = band(node, union_map(outer, outer));
    if (parallel) node = node.insert_mark(isl::id(ctx.get(), "parallel")).child(0);
    node = node.insert_mark(isl::id(ctx.get(), weight_mode ? "tile_split" : "tile")).child(0).child(0);
    node = band(node, union_map(tile_exprs, tiles));
    node = node.insert_mark(isl::id(ctx.get(), "reduction_tile")).child(0).child(0);
    node = band(node, union_map(inner, inner));
    node = node.insert_mark(isl::id(ctx.get(), "point")).child(0).child(0);
    isl::union_set_list filters(ctx.get(), 3);
    filters = filters.add(isl::union_set(ctx.get(), "{ Z" + l_tuple + "; Zp" + l_tuple + "; L" + l_tuple + "; Lp" + l_tuple + " }"))
                  .add(isl::union_set(ctx.get(), "{ F" + f_tuple + "; Fp" + f_tuple + " }"))
                  .add(isl::union_set(ctx.get(), "{ T" + l_tuple + "; Tp" + l_tuple + "; E" + l_tuple + "; Ep" + l_tuple + " }"));
    node = node.insert_sequence(filters);
    node = node.insert_mark(isl::id(ctx.get(), "vector_" + s(R) + "x" + s(mk.chunks) + "x" + s(mk.lanes))).child(0);
    node = node.child(1).child(0);
    node = band(node, isl::union_map(ctx.get(), "{ F" + f_tuple + " -> [" + join(reds) + "]; Fp" + f_tuple + " -> [" + join(reds) + "] }"));
    nest.parallel_outer = parallel;
    generate(nest, node.schedule(), parallel ? safe : std::set<int>{});
  }
};

size_t dtype_bytes(DType t) { return t == DType::f64 ? 8 : t == DType::boolean ? 1 : 4; }

}  // namespace

Program fuse_elementwise(const Program& program, const ProgramTypes& types) {
  Program p = program;
  bool changed = true;
  while (changed) {
    changed = false;
    // Readers of every tensor: (statement index, leaf count).
    std::map<std::string, std::vector<size_t>> readers;
    for (size_t i = 0; i < p.statements.size(); ++i) {
      std::vector<std::string> used;
      if (const auto* c = std::get_if<Contraction>(&p.statements[i])) {
        for (const auto& a : c->inputs) used.push_back(a.tensor);
        if (c->init) used.push_back(*c->init);
        for (const auto& t : used) readers[t].push_back(i);
        continue;
      }
      // Count every occurrence: a producer read twice by one consumer would be computed twice.
      std::vector<Expr> stack{std::get<Elementwise>(p.statements[i]).expr};
      while (!stack.empty()) {
        Expr x = stack.back();
        stack.pop_back();
        if (x.kind() == Expr::Kind::tensor) readers[x.name()].push_back(i);
        for (const auto& a : x.args()) stack.push_back(a);
      }
    }
    for (size_t i = 0; i < p.statements.size() && !changed; ++i) {
      const auto* producer = std::get_if<Elementwise>(&p.statements[i]);
      if (!producer) continue;
      const std::string& name = producer->output;
      if (std::find(p.outputs.begin(), p.outputs.end(), name) != p.outputs.end()) continue;
      const auto& r = readers[name];
      if (r.size() != 1 || !std::holds_alternative<Elementwise>(p.statements[r[0]])) continue;
      auto& consumer = std::get<Elementwise>(p.statements[r[0]]);
      Expr value = Expr::call(Intrinsic::cast, {producer->expr}, types.tensors.at(name).dtype);
      consumer.expr = consumer.expr.replace_leaves([&](const Expr& leaf) -> std::optional<Expr> {
        if (leaf.kind() == Expr::Kind::tensor && leaf.name() == name) return value;
        return std::nullopt;
      });
      p.statements.erase(p.statements.begin() + static_cast<long>(i));
      changed = true;
    }
  }
  return p;
}

Schedule schedule(const Program& program, const ProgramTypes& types, const Target& target) {
  Schedule out;
  NestBuilder nb{target, {}, {}, {}};
  try {
    // An elementwise statement over `domain` (its whole box unless given).
    auto elementwise = [&](const Elementwise& e, std::string domain) {
      const TensorType& t = types.tensors.at(e.output);
      Nest nest;
      nest.kind = Nest::Kind::elementwise;
      nest.name = e.output + ".elementwise";
      nest.tensor = e.output;
      nest.elementwise = e;
      for (size_t k = 0; k < t.shape.size(); ++k) nest.variables.push_back("i" + std::to_string(k));
      std::vector<size_t> order(t.shape.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      if (domain.empty()) domain = box_text("S", nest.variables, t.shape);
      nb.build(nest, domain, nest.variables, order, t.shape.empty() ? 0 : 1, dtype_bytes(t.dtype));
      out.nests.push_back(std::move(nest));
    };
    // Elementwise consumers that may run as a contraction's epilogue: the contraction's output has the
    // consumer's shape, is no program output and is read by nothing else, and every other tensor the
    // consumer reads exists before the contraction runs.
    std::map<size_t, size_t> epilogue_of;  // contraction statement -> consumer statement
    {
      std::map<std::string, size_t> produced;
      std::map<std::string, int> reads;
      for (size_t i = 0; i < program.statements.size(); ++i) {
        const auto& st = program.statements[i];
        produced[statement_output(st)] = i;
        if (const auto* c = std::get_if<Contraction>(&st)) {
          for (const auto& a : c->inputs) ++reads[a.tensor];
          if (c->init) ++reads[*c->init];
        } else {
          std::vector<std::string> leaves;
          std::get<Elementwise>(st).expr.collect_tensors(leaves);
          for (const auto& l : leaves) ++reads[l];
        }
      }
      std::set<std::string> outputs(program.outputs.begin(), program.outputs.end());
      for (size_t i = 0; i < program.statements.size(); ++i) {
        const auto* e = std::get_if<Elementwise>(&program.statements[i]);
        if (!e) continue;
        std::vector<std::string> leaves;
        e->expr.collect_tensors(leaves);
        for (const auto& o : leaves) {
          auto p = produced.find(o);
          if (p == produced.end() || p->second >= i || !std::holds_alternative<Contraction>(program.statements[p->second])) continue;
          if (outputs.count(o) || reads[o] != 1 || types.tensors.at(o).shape != types.tensors.at(e->output).shape) continue;
          bool ready = std::all_of(leaves.begin(), leaves.end(), [&](const std::string& l) {
            auto q = produced.find(l);
            return l == o || q == produced.end() || q->second < p->second;
          });
          if (ready && !epilogue_of.count(p->second)) epilogue_of[p->second] = i;
          break;
        }
      }
    }
    // Elementwise producers that an update can evaluate where it reads them: read only by that
    // contraction's inputs, not program outputs, and cheap (a few operations, no transcendental calls),
    // since an input element is read many times.
    std::map<size_t, std::map<std::string, size_t>> inlined_into;  // contraction -> input -> producer
    {
      std::map<std::string, size_t> producer;
      std::map<std::string, std::set<size_t>> readers;
      for (size_t i = 0; i < program.statements.size(); ++i) {
        const auto& st = program.statements[i];
        if (std::holds_alternative<Elementwise>(st)) producer[statement_output(st)] = i;
        std::vector<std::string> used;
        if (const auto* c = std::get_if<Contraction>(&st)) {
          for (const auto& a : c->inputs) used.push_back(a.tensor);
          if (c->init) used.push_back(*c->init);
        } else {
          std::get<Elementwise>(st).expr.collect_tensors(used);
        }
        for (const auto& t : used) readers[t].insert(i);
      }
      std::set<std::string> outputs(program.outputs.begin(), program.outputs.end());
      auto cheap = [](const Expr& e) {
        int nodes = 0;
        bool ok = true;
        std::vector<Expr> stack{e};
        while (!stack.empty()) {
          Expr x = stack.back();
          stack.pop_back();
          ++nodes;
          if (x.kind() == Expr::Kind::call) {
            Intrinsic f = x.intrinsic();
            ok &= f == Intrinsic::relu || f == Intrinsic::max || f == Intrinsic::min || f == Intrinsic::abs ||
                  f == Intrinsic::select || f == Intrinsic::cast || f == Intrinsic::ident || f == Intrinsic::sign;
          }
          for (const auto& a : x.args()) stack.push_back(a);
        }
        return ok && nodes <= 12;
      };
      for (size_t i = 0; i < program.statements.size(); ++i) {
        const auto* c = std::get_if<Contraction>(&program.statements[i]);
        if (!c) continue;
        for (const auto& a : c->inputs) {
          auto p = producer.find(a.tensor);
          if (p == producer.end() || outputs.count(a.tensor) || readers[a.tensor] != std::set<size_t>{i} ||
              (c->init && *c->init == a.tensor) || !cheap(std::get<Elementwise>(program.statements[p->second]).expr))
            continue;
          inlined_into[i][a.tensor] = p->second;
        }
      }
    }
    std::set<size_t> fused;
    for (const auto& [c, inputs] : inlined_into)
      for (const auto& [tensor, producer] : inputs) fused.insert(producer);
    for (size_t index = 0; index < program.statements.size(); ++index) {
      const auto& st = program.statements[index];
      if (const auto* e = std::get_if<Elementwise>(&st)) {
        if (!fused.count(index)) elementwise(*e, "");
        continue;
      }
      const auto& c = std::get<Contraction>(st);
      const TensorType& t = types.tensors.at(c.output);
      poly::ContractionAnalysis a = poly::analyze(c, types);
      std::vector<std::string> out_vars;
      for (size_t k = 0; k < t.shape.size(); ++k) out_vars.push_back("i" + std::to_string(k));
      std::vector<size_t> identity(out_vars.size());
      for (size_t k = 0; k < identity.size(); ++k) identity[k] = k;

      Nest init;
      init.kind = Nest::Kind::init;
      init.name = c.output + ".init";
      init.tensor = c.output;
      init.contraction = c;
      init.variables = out_vars;
      nb.build(init, box_text("S", out_vars, t.shape), out_vars, identity, out_vars.empty() ? 0 : 1, dtype_bytes(t.dtype));
      const size_t init_index = out.nests.size();
      out.nests.push_back(std::move(init));
      if (c.aggregation == AggregationOp::assign && !c.init && !a.empty) {
        // An assign that writes every element (a copy, a transpose) needs no init nest.
        isl::set box(nb.ctx.get(), box_text("O", out_vars, t.shape));
        isl::set image = isl::manage(isl_set_set_tuple_name(isl::map(nb.ctx.get(), a.write).range().release(), "O"));
        if (box.is_subset(image)) out.nests.pop_back();
      }

      if (!a.empty) {
        Nest update;
        update.kind = Nest::Kind::update;
        update.name = c.output + ".update";
        update.tensor = c.output;
        update.contraction = c;
        update.variables = c.index_variables();
        if (auto in = inlined_into.find(index); in != inlined_into.end())
          for (const auto& [tensor, producer] : in->second)
            update.inlined[tensor] = std::get<Elementwise>(program.statements[producer]);
        // Output variables first; they are parallel when distinct values write distinct elements.
        // Output variables outermost (parallel), then the reduction variables, except that a variable
        // that alone indexes the output's contiguous last dim goes innermost: the inner loop then runs
        // along contiguous output elements and vectorizes, with the reduction outside it.
        std::vector<size_t> order;
        std::set<std::string> in_output;
        for (const auto& p : c.output_indices)
          for (const auto& [v, coeff] : p.index_terms()) in_output.insert(v);
        // The innermost variable: the one with the most unit-stride accesses (reads and the write), so the
        // inner loop streams contiguous memory and vectorizes; ties go to the output's last index.
        std::string innermost;
        {
          std::map<std::string, int> unit;
          auto score = [&unit](const std::vector<Polynomial>& idx, int weight) {
            if (idx.empty()) return;
            const auto& terms = idx.back().index_terms();
            for (const auto& [v, coeff] : terms)
              if (coeff == Rational(1) || coeff == Rational(-1)) unit[v] += weight;
            for (size_t k = 0; k + 1 < idx.size(); ++k)
              for (const auto& [v, coeff] : idx[k].index_terms()) unit[v] -= 1;  // strided elsewhere
          };
          score(c.output_indices, 3);
          for (const auto& a : c.inputs) score(a.indices, 2);
          int best = 0;
          for (const auto& v : update.variables)
            if (unit[v] > best) {
              best = unit[v];
              innermost = v;
            }
        }
        bool has_reduction = false;
        for (const auto& v : update.variables) has_reduction |= !in_output.count(v);
        if (!has_reduction) innermost.clear();
        for (size_t k = 0; k < update.variables.size(); ++k)
          if (in_output.count(update.variables[k]) && update.variables[k] != innermost) order.push_back(k);
        // The outermost (parallel) loop gets the output variable with the most values, so the threads
        // have enough iterations to share.
        auto extent = [&a](const std::string& v) {
          for (const auto& b : a.bounds)
            if (b.name == v) return b.max - b.min + 1;
          return int64_t{1};
        };
        if (!order.empty()) {
          auto widest = std::max_element(order.begin(), order.end(), [&](size_t x, size_t y) {
            return extent(update.variables[x]) < extent(update.variables[y]);
          });
          if (extent(update.variables[order.front()]) < 4 * target.threads) std::rotate(order.begin(), widest, widest + 1);
        }
        size_t n_out = order.size();
        for (size_t k = 0; k < update.variables.size(); ++k)
          if (!in_output.count(update.variables[k]) && update.variables[k] != innermost) order.push_back(k);
        for (size_t k = 0; k < update.variables.size(); ++k)
          if (update.variables[k] == innermost) order.push_back(k);
        bool parallel = n_out > 0 && poly::writes_each_output_once(c, types);
        // The analysis' domain is over S_<output>; rename the tuple.
        std::string dom = a.domain;
        std::string from = "S_" + c.output + "[";
        for (size_t pos = dom.find(from); pos != std::string::npos; pos = dom.find(from, pos)) dom.replace(pos, from.size(), "S[");
        // The band map names dims positionally (isl may print fixed dims as "n = 0" in the tuple).
        std::vector<std::string> positional;
        for (size_t k = 0; k < update.variables.size(); ++k) positional.push_back("d" + std::to_string(k));
        int64_t out_bytes = static_cast<int64_t>(dtype_bytes(t.dtype));
        for (int64_t d : t.shape) out_bytes *= d;
        bool reduction_outer = parallel && n_out < order.size() - (innermost.empty() ? 0 : 1) && out_bytes * 4 <= target.l2_bytes;
        std::string uncovered;
        auto consumer = epilogue_of.find(index);
        const Elementwise* epilogue =
            consumer == epilogue_of.end() || c.init ? nullptr : &std::get<Elementwise>(program.statements[consumer->second]);
        if (parallel && nb.try_microkernel(update, c, types, a, dom, positional, out_bytes, c.init ? nullptr : &uncovered, epilogue)) {
          if (!c.init) {  // the init nest shrinks to the elements no block stores, or disappears
            Nest& init_nest = out.nests[init_index];
            if (isl::set(nb.ctx.get(), uncovered).is_empty()) {
              out.nests.erase(out.nests.begin() + static_cast<long>(init_index));
            } else {
              nb.build(init_nest, uncovered, out_vars, identity, out_vars.empty() ? 0 : 1, dtype_bytes(t.dtype));
            }
          }
          out.nests.push_back(std::move(update));
          if (epilogue) {  // the consumer runs in the blocks; elsewhere (unstored elements) as a nest
            fused.insert(consumer->second);
            if (!isl::set(nb.ctx.get(), uncovered).is_empty()) elementwise(*epilogue, uncovered);
          }
          continue;  // a sum: no finalize nest
        }
        nb.build(update, dom, positional, order, parallel ? n_out : 0, dtype_bytes(t.dtype), /*tiled=*/parallel,
                 !innermost.empty(), reduction_outer);
        out.nests.push_back(std::move(update));
      }

      bool needs_finalize = !c.init && (c.aggregation == AggregationOp::product || c.aggregation == AggregationOp::max ||
                                        c.aggregation == AggregationOp::min);
      if (needs_finalize) {
        // Elements no valid point writes: the box minus the image of the write map.
        isl::set box(nb.ctx.get(), box_text("O", out_vars, t.shape));
        std::string unwritten_text;
        if (a.empty) {
          unwritten_text = text(box);
        } else {
          std::string write = a.write;
          isl::map w(nb.ctx.get(), write);
          isl::set image = isl::manage(isl_set_set_tuple_name(w.range().release(), "O"));
          isl::set rest = box.subtract(image).coalesce();
          if (rest.is_empty()) continue;
          unwritten_text = text(rest);
        }
        std::string from = "O[";
        for (size_t pos = unwritten_text.find(from); pos != std::string::npos; pos = unwritten_text.find(from, pos))
          unwritten_text.replace(pos, from.size(), "S[");
        Nest fin;
        fin.kind = Nest::Kind::finalize;
        fin.name = c.output + ".finalize";
        fin.tensor = c.output;
        fin.contraction = c;
        fin.variables = out_vars;
        nb.build(fin, unwritten_text, out_vars, identity, 0, dtype_bytes(t.dtype));
        out.nests.push_back(std::move(fin));
      }
    }
  } catch (const isl::exception& e) {
    throw InternalError(std::string("isl failed while scheduling: ") + e.what());
  }
  return out;
}

}  // namespace polytile::sched
