// isl AST -> LoopNode/Aff (see nest_builder.h). isl's C API is used for the AST walk (the C++ bindings of
// 0.25 do not expose all of it); isl names the loop of schedule dimension k "c<k>", which is how
// "parallel" marks are matched to the dimensions the scheduler proved safe.
#include <isl/ast.h>
#include <isl/ast_build.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "nest_builder.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

using isl_support::text;

namespace {

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
          // Statement names: S (plain nests); micro-kernels and row reductions: Z, L, F, T, E, with a p
          // suffix in predicated blocks.
          static const std::map<std::string, std::pair<St, bool>> kinds{
              {"S", {St::plain, false}},   {"Z", {St::zero, false}},   {"Zp", {St::zero, true}},
              {"L", {St::load, false}},    {"Lp", {St::load, true}},   {"F", {St::fma, false}},
              {"Fp", {St::fma, true}},     {"T", {St::store, false}},  {"Tp", {St::store, true}},
              {"E", {St::epilogue, false}}, {"Ep", {St::epilogue, true}}};
          auto kind = kinds.find(name);
          POLYTILE_CHECK(kind != kinds.end(), "unknown statement ", name, " in the isl AST");
          std::tie(out.statement, out.predicated) = kind->second;
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

}  // namespace

// The runtime splits the outer loop's range: the root must be a parallel loop with constant bounds, or
// a block of such loops (isl splits the outermost dimension when statements cover different parts).
void NestBuilder::finish_parallel(Nest& nest) {
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
void NestBuilder::generate(Nest& nest, const isl::schedule& sched, const std::set<int>& safe) {
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

}  // namespace polytile::sched::internal
