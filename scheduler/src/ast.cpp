// isl AST -> LoopNode/LoopExpr (see nest_builder.h), through the isl C++ bindings: every isl object is owned by
// RAII, so an error thrown anywhere in the walk leaks nothing. Identity travels as isl::id, never as a
// parsed name: statements by their tuple ids (StatementIds), loops by the iterator ids the AST build is
// given (one per schedule dimension, which is how "parallel" marks are matched to the dimensions the
// scheduler proved safe), marks by their ids. A micro-kernel's Step statements are expanded here (see
// BlockStep): the pieces isl built over the step's parameters, translated with the parameters bound to
// the call's arguments.
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <tuple>

#include "nest_builder.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

using isl_support::text;

StatementIds::StatementIds(const isl::ctx& ctx)
    : parallel_mark(ctx, "parallel"), block_mark(ctx, "block"), thread_mark(ctx, "thread"), block_step(ctx, "Step"),
      sync_before(ctx, "SyncIn"), sync_after(ctx, "SyncOut"), register_mark(ctx, "registers"), acc_mark(ctx, "accumulators") {
  for (size_t t = 0; t < max_tiles; ++t) copies_.emplace_back(ctx, "C" + std::to_string(t));
  using St = LoopNode::Statement;
  // Plain nests: S; micro-kernels and row reductions: Z, L, F, T, E, with a p suffix in predicated blocks;
  // GPU kernels with accumulators: AccIn, AccOut.
  const std::tuple<const char*, St, bool> kinds[] = {
      {"AccIn", St::acc_load, false}, {"AccOut", St::acc_store, false},
      {"S", St::plain, false},  {"Z", St::zero, false},      {"Zp", St::zero, true},     {"L", St::load, false},
      {"Lp", St::load, true},   {"F", St::fma, false},       {"Fp", St::fma, true},      {"T", St::store, false},
      {"Tp", St::store, true},  {"E", St::epilogue, false},  {"Ep", St::epilogue, true}};
  for (const auto& [name, kind, predicated] : kinds) table_.push_back({isl::id(ctx, name), kind, predicated});
}

const isl::id& StatementIds::id(LoopNode::Statement kind, bool predicated) const {
  for (const Entry& e : table_)
    if (e.kind == kind && e.predicated == predicated) return e.id;
  POLYTILE_CHECK(false, "no statement id for this kind");
}

const isl::id& StatementIds::copy(size_t tile) const {
  POLYTILE_CHECK(tile < copies_.size(), "shared tile ", tile, " of at most ", copies_.size());
  return copies_[tile];
}

std::optional<size_t> StatementIds::copy_tile(const isl::id& id) const {
  for (size_t t = 0; t < copies_.size(); ++t)
    if (copies_[t].get() == id.get()) return t;
  return std::nullopt;
}

std::optional<std::pair<LoopNode::Statement, bool>> StatementIds::find(const isl::id& id) const {
  for (const Entry& e : table_)
    if (e.id.get() == id.get()) return std::pair{e.kind, e.predicated};
  return std::nullopt;
}

namespace {

template <typename Op>
bool is(const isl::ast_expr_op& e) {
  return e.isa<Op>();
}

// A schedule dimension mapped to the launch: blocks or threads, the axis, and the part of it (LoopNode).
struct Mapping {
  LoopNode::Hardware hardware = LoopNode::Hardware::none;
  int axis = 0;
  int64_t part_stride = 1, part_extent = 0;
};

class AstTranslator {
 public:
  AstTranslator(const StatementIds& statements, const std::vector<isl::id>& schedule_iterators,
                const std::set<int>& parallel_dims, const std::map<int, Mapping>& hardware_dims,
                const BlockStep* step, const KernelStatements* added, const std::vector<int64_t>* sizes)
      : statements_(statements), parallel_dims_(parallel_dims), hardware_dims_(hardware_dims), step_(step), added_(added),
        sizes_(sizes) {
    for (size_t k = 0; k < schedule_iterators.size(); ++k) dimension_of_[schedule_iterators[k].get()] = static_cast<int>(k);
  }

  int iterators() const { return next_; }

  // Iterators 0 to n - 1 are loops made without isl (step_loops): isl's loops are numbered from n.
  void first_iterators(int n) { next_ = n; }

  // The Step statement at `args` (a micro-kernel nest's loops written by step_loops).
  LoopNode step(const std::vector<LoopExpr>& args) {
    POLYTILE_CHECK(step_ != nullptr, "a Step statement outside a micro-kernel nest");
    return expand(*step_, args);
  }

  LoopExpr expr(const isl::ast_expr& e) {
    LoopExpr a;
    if (e.isa<isl::ast_expr_int>()) {
      a.kind = LoopExpr::Kind::constant;
      a.value = e.as<isl::ast_expr_int>().val().num_si();
      return a;
    }
    if (e.isa<isl::ast_expr_id>()) {
      isl::id id = e.as<isl::ast_expr_id>().id();
      if (auto bound = bound_.find(id.get()); bound != bound_.end()) return bound->second;
      auto it = index_of_.find(id.get());
      POLYTILE_CHECK(it != index_of_.end(), "unknown isl AST identifier ", id.name());
      a.kind = LoopExpr::Kind::iterator;
      a.iterator = it->second;
      return a;
    }
    POLYTILE_CHECK(e.isa<isl::ast_expr_op>(), "unexpected isl AST expression");
    isl::ast_expr_op op = e.as<isl::ast_expr_op>();
    for (unsigned i = 0; i < op.n_arg(); ++i) a.args.push_back(expr(op.arg(static_cast<int>(i))));
    using K = LoopExpr::Kind;
    // fdiv_q, pdiv_q and the exact div are all floor divisions here; pdiv_r and zdiv_r are taken with a
    // positive divisor.
    static const std::pair<bool (*)(const isl::ast_expr_op&), K> kinds[] = {
        {is<isl::ast_expr_op_and>, K::land},      {is<isl::ast_expr_op_and_then>, K::land},
        {is<isl::ast_expr_op_or>, K::lor},        {is<isl::ast_expr_op_or_else>, K::lor},
        {is<isl::ast_expr_op_max>, K::max},       {is<isl::ast_expr_op_min>, K::min},
        {is<isl::ast_expr_op_minus>, K::neg},     {is<isl::ast_expr_op_add>, K::add},
        {is<isl::ast_expr_op_sub>, K::sub},       {is<isl::ast_expr_op_mul>, K::mul},
        {is<isl::ast_expr_op_div>, K::floordiv},  {is<isl::ast_expr_op_fdiv_q>, K::floordiv},
        {is<isl::ast_expr_op_pdiv_q>, K::floordiv}, {is<isl::ast_expr_op_pdiv_r>, K::mod},
        {is<isl::ast_expr_op_zdiv_r>, K::mod},    {is<isl::ast_expr_op_cond>, K::select},
        {is<isl::ast_expr_op_select>, K::select}, {is<isl::ast_expr_op_eq>, K::eq},
        {is<isl::ast_expr_op_le>, K::le},         {is<isl::ast_expr_op_lt>, K::lt},
        {is<isl::ast_expr_op_ge>, K::ge},         {is<isl::ast_expr_op_gt>, K::gt}};
    for (const auto& [matches, kind] : kinds) {
      if (matches(op)) {
        a.kind = kind;
        return a;
      }
    }
    POLYTILE_CHECK(false, "unsupported isl AST operation ", e.to_C_str());
  }

  LoopNode node(const isl::ast_node& n, bool parallel_mark) {
    if (n.isa<isl::ast_node_block>()) {
      LoopNode out;
      out.kind = LoopNode::Kind::block;
      n.as<isl::ast_node_block>().children().foreach([&](isl::ast_node child) { out.body.push_back(node(child, false)); });
      return out;
    }
    if (n.isa<isl::ast_node_mark>()) {
      isl::ast_node_mark mark = n.as<isl::ast_node_mark>();
      const isl::id id = mark.id();
      if (sizes_ && (id.get() == statements_.register_mark.get() || id.get() == statements_.acc_mark.get())) {
        // Loops over register positions, from this depth on.
        const int outer = register_base_;
        register_base_ = id.get() == statements_.register_mark.get() ? added_->register_depth : added_->acc_depth;
        LoopNode out = node(mark.node(), parallel_mark);
        register_base_ = outer;
        return out;
      }
      return node(mark.node(), parallel_mark || id.get() == statements_.parallel_mark.get());
    }
    if (n.isa<isl::ast_node_for>()) return loop(n.as<isl::ast_node_for>(), parallel_mark);
    if (n.isa<isl::ast_node_if>()) {
      isl::ast_node_if guard = n.as<isl::ast_node_if>();
      LoopNode out;
      out.kind = LoopNode::Kind::guard;
      out.condition = expr(guard.cond());
      out.body.push_back(node(guard.then_node(), false));
      if (guard.has_else_node()) out.otherwise.push_back(node(guard.else_node(), false));
      return out;
    }
    POLYTILE_CHECK(n.isa<isl::ast_node_user>(), "unexpected isl AST node");
    return statement(n.as<isl::ast_node_user>());
  }

 private:
  LoopNode loop(const isl::ast_node_for& f, bool parallel_mark) {
    LoopNode out;
    out.kind = LoopNode::Kind::loop;
    isl::id id = f.iterator().as<isl::ast_expr_id>().id();
    // Sibling loops may reuse an iterator (c0 for each piece of a split dimension): one index per id.
    const auto [at, added] = index_of_.emplace(id.get(), next_);
    if (added) ++next_;
    out.iterator = at->second;
    out.lower = expr(f.init());
    out.condition = expr(f.cond());
    LoopExpr step = expr(f.inc());
    POLYTILE_CHECK(step.kind == LoopExpr::Kind::constant && step.value > 0, "non-constant loop step");
    out.step = step.value;
    // A micro-kernel step's loops (over its parameters' points) are over no schedule dimension.
    auto dimension = dimension_of_.find(id.get());
    POLYTILE_CHECK(!parallel_mark || dimension != dimension_of_.end(), "isl AST loop ", id.name(), " is over no schedule dimension");
    if (dimension != dimension_of_.end()) {
      out.parallel = parallel_mark && parallel_dims_.count(dimension->second) != 0;
      if (auto hw = hardware_dims_.find(dimension->second); hw != hardware_dims_.end()) {
        out.hardware = hw->second.hardware;
        out.axis = hw->second.axis;
        out.part_stride = hw->second.part_stride;
        out.part_extent = hw->second.part_extent;
      }
      const int position = dimension->second - register_base_;
      if (register_base_ >= 0 && position >= 0 && position < static_cast<int>(sizes_->size()))
        out.unroll = (*sizes_)[static_cast<size_t>(position)];
    }
    out.body.push_back(node(f.body(), false));
    return out;
  }

  LoopNode statement(const isl::ast_node_user& user) {
    LoopNode out;
    out.kind = LoopNode::Kind::statement;
    isl::ast_expr_op call = user.expr().as<isl::ast_expr_op>();
    isl::id id = call.arg(0).as<isl::ast_expr_id>().id();
    std::vector<LoopExpr> args;
    for (unsigned i = 1; i < call.n_arg(); ++i) args.push_back(expr(call.arg(static_cast<int>(i))));
    if (step_ && id.get() == statements_.block_step.get()) return expand(*step_, args);
    if (id.get() == statements_.sync_before.get() || id.get() == statements_.sync_after.get()) {
      out.kind = LoopNode::Kind::barrier;
      return out;
    }
    if (auto tile = statements_.copy_tile(id)) return copy(*tile, args);
    auto kind = statements_.find(id);
    POLYTILE_CHECK(kind.has_value(), "unknown statement ", id.name(), " in the isl AST");
    std::tie(out.statement, out.predicated) = *kind;
    // The predicated variant of a block step may share the uniform one's loops (BlockStep::Variant).
    if (out.statement == LoopNode::Statement::fma) out.predicated = out.predicated || predicated_fmas_;
    out.args = std::move(args);
    if (sizes_) {  // with accumulators: the position generate() noted on the node
      const isl::id note = isl::manage(isl_ast_node_get_annotation(user.get()));
      const auto* position = note.is_null() ? nullptr : static_cast<const std::vector<isl::ast_expr>*>(isl_id_get_user(note.get()));
      POLYTILE_CHECK(position != nullptr, "statement ", id.name(), " without its accumulator's position");
      for (const isl::ast_expr& e : *position) out.registers.push_back(expr(e));
    }
    return out;
  }

  // One block step (see BlockStep) at the arguments `args`: its parameters are bound to them while its
  // pieces are translated.
  LoopNode expand(const BlockStep& step, const std::vector<LoopExpr>& args) {
    POLYTILE_CHECK(args.size() == step.params.size(), "block step with ", args.size(), " arguments for ", step.params.size(),
                   " parameters");
    POLYTILE_CHECK(step.uniform || step.predicated, "a block step without a variant");
    for (size_t k = 0; k < args.size(); ++k) bound_[step.params[k].get()] = args[k];
    LoopNode out;
    if (!step.predicated) out = variant(*step.uniform, false, args);
    else if (!step.uniform) out = variant(*step.predicated, true, args);
    else {
      // The predicated variant where its steps share an argument's value: that value, a constant.
      std::vector<LoopExpr> at = args;
      for (size_t k = 0; k < step.predicated_fixed.size(); ++k)
        if (step.predicated_fixed[k]) {
          at[k] = LoopExpr{};
          at[k].value = *step.predicated_fixed[k];
          bound_[step.params[k].get()] = at[k];
        }
      LoopNode border = variant(*step.predicated, true, at);
      for (size_t k = 0; k < args.size(); ++k) bound_[step.params[k].get()] = args[k];
      border.separate = true;
      LoopNode uniform = variant(*step.uniform, false, args);
      uniform.separate = true;  // the nest's function is then only the loops around the steps
      out = choose(step.uniform_block, std::move(uniform), std::move(border));
    }
    for (const isl::id& p : step.params) bound_.erase(p.get());
    return out;
  }

  // The copy of shared tile `tile` at the block and reduction tile `args`: its arguments are the tile's
  // origin there.
  LoopNode copy(size_t tile, const std::vector<LoopExpr>& args) {
    POLYTILE_CHECK(added_ && tile < added_->origins.size() && args.size() == added_->params.size(),
                   "a copy of shared tile ", tile, " that the kernel does not have");
    for (size_t k = 0; k < args.size(); ++k) bound_[added_->params[k].get()] = args[k];
    LoopNode out;
    out.kind = LoopNode::Kind::statement;
    out.statement = LoopNode::Statement::copy;
    out.tile = static_cast<int>(tile);
    for (const isl::ast_expr& e : added_->origins[tile]) out.args.push_back(expr(e));
    for (const isl::id& p : added_->params) bound_.erase(p.get());
    return out;
  }

  // Open (zero or load), the fused multiply-adds, close (epilogue or store).
  LoopNode variant(const BlockStep::Variant& v, bool predicated, const std::vector<LoopExpr>& args) {
    using St = LoopNode::Statement;
    auto call = [&](St kind) {
      LoopNode out;
      out.kind = LoopNode::Kind::statement;
      out.statement = kind;
      out.predicated = predicated;
      out.args = args;
      return out;
    };
    LoopNode out;
    out.kind = LoopNode::Kind::block;
    out.body.push_back(choose(v.first, call(St::zero), call(St::load)));
    predicated_fmas_ = predicated;
    out.body.push_back(v.direct_fma ? direct_fma(*v.direct_fma, predicated, args) : node(*v.fma, false));
    predicated_fmas_ = false;
    out.body.push_back(choose(v.last, call(St::epilogue), call(St::store)));
    return out;
  }

  // Fma loops written without isl (fma_loops): their iterators numbered here once, the step's
  // parameters replaced by `args`.
  LoopNode direct_fma(const FmaLoops& f, bool predicated, const std::vector<LoopExpr>& args) {
    const auto [at, added] = fma_base_.emplace(&f, next_);
    if (added) next_ += static_cast<int>(f.loops.size());
    const int base = at->second;
    std::function<LoopExpr(const LoopExpr&)> remap = [&](const LoopExpr& e) {
      if (e.kind == LoopExpr::Kind::iterator) {
        if (e.iterator >= kFmaParameter) return args.at(static_cast<size_t>(e.iterator - kFmaParameter));
        LoopExpr i = e;
        i.iterator = base + e.iterator;
        return i;
      }
      LoopExpr out = e;
      for (LoopExpr& a : out.args) a = remap(a);
      return out;
    };
    LoopNode body;
    body.kind = LoopNode::Kind::statement;
    body.statement = LoopNode::Statement::fma;
    body.predicated = predicated;
    for (const LoopExpr& a : f.args) body.args.push_back(remap(a));
    for (size_t k = f.loops.size(); k-- > 0;) {
      LoopNode loop = f.loops[k];
      loop.iterator = base + loop.iterator;
      loop.lower = remap(loop.lower);
      loop.condition = remap(loop.condition);
      loop.body.push_back(std::move(body));
      body = std::move(loop);
    }
    return body;
  }

  LoopNode choose(const BlockStep::Condition& c, LoopNode then, LoopNode otherwise) {
    using K = BlockStep::Condition::Kind;
    if (c.kind == K::always) return then;
    if (c.kind == K::never) return otherwise;
    return guard(*c.expr, std::move(then), std::move(otherwise));
  }

  LoopNode guard(const isl::ast_expr& condition, LoopNode then, LoopNode otherwise) {
    LoopNode out;
    out.kind = LoopNode::Kind::guard;
    out.condition = expr(condition);
    out.body.push_back(std::move(then));
    out.otherwise.push_back(std::move(otherwise));
    return out;
  }

  const StatementIds& statements_;
  const std::set<int>& parallel_dims_;   // schedule dimensions whose loops may run in parallel
  const std::map<int, Mapping>& hardware_dims_;  // schedule dimension -> where the launch maps it
  std::map<isl_id*, int> dimension_of_;  // iterator id -> schedule dimension (isl ids are unique per context)
  std::map<isl_id*, int> index_of_;      // iterator id -> LoopNode iterator index, in order of appearance
  const BlockStep* step_;                // the Step statement's expansion, in micro-kernel nests
  const KernelStatements* added_;        // what a GPU strategy added: copies, accumulators
  const std::vector<int64_t>* sizes_;    // with accumulators, their sizes (Accumulators::sizes)
  std::map<isl_id*, LoopExpr> bound_;    // parameter id -> its value, inside a block step
  int register_base_ = -1;               // under a register or accumulator mark: its band's first dimension
  int next_ = 0;                         // the next iterator number to give a loop
  std::map<const FmaLoops*, int> fma_base_;  // direct fma loops -> their first iterator (shared by variants)
  bool predicated_fmas_ = false;         // inside a predicated block step's fma loops
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
    const LoopExpr& c = r->condition;
    bool ok = r->kind == LoopNode::Kind::loop && r->parallel && r->lower.kind == LoopExpr::Kind::constant &&
              (c.kind == LoopExpr::Kind::le || c.kind == LoopExpr::Kind::lt) && c.args[0].kind == LoopExpr::Kind::iterator &&
              c.args[1].kind == LoopExpr::Kind::constant;
    simple = simple && ok;
    if (!ok) continue;
    lo = std::min(lo, r->lower.value);
    hi = std::max(hi, c.args[1].value - (c.kind == LoopExpr::Kind::lt ? 1 : 0));
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

namespace {

// The schedule dimensions whose loops may run in parallel: the coincident members of the bands under a
// "parallel" mark.
std::set<int> parallel_dimensions(const isl::schedule& tree, const isl::id& parallel_mark) {
  std::set<int> dims;
  tree.root().foreach_descendant_top_down([&](const isl::schedule_node& node) {
    if (!node.isa<isl::schedule_node_mark>() || isl_support::mark_id(node).get() != parallel_mark.get())
      return true;
    node.foreach_descendant_top_down([&](const isl::schedule_node& inner) {
      if (inner.isa<isl::schedule_node_band>()) {
        isl::schedule_node_band band = inner.as<isl::schedule_node_band>();
        for (unsigned k = 0; k < band.n_member(); ++k)
          if (band.member_get_coincident(static_cast<int>(k))) dims.insert(isl_support::schedule_depth(inner) + static_cast<int>(k));
      }
      return true;
    });
    return false;
  });
  return dims;
}

// GPU kernels: the schedule dimensions of the bands under "block" and "thread" marks, with their axes (a
// band's last member is x, the one before y, the first of three z). A block band may start with the parts
// of z (KernelStatements::z_parts), the first the slowest.
std::map<int, Mapping> hardware_dimensions(const isl::schedule& tree, const StatementIds& ids, const std::vector<int64_t>& z_parts) {
  std::map<int, Mapping> dims;
  tree.root().foreach_descendant_top_down([&](const isl::schedule_node& node) {
    if (!node.isa<isl::schedule_node_mark>()) return true;
    const isl::id mark = isl_support::mark_id(node);
    const bool block = mark.get() == ids.block_mark.get(), thread = mark.get() == ids.thread_mark.get();
    if (!block && !thread) return true;
    isl::schedule_node child = node.child(0);
    POLYTILE_CHECK(child.isa<isl::schedule_node_band>(), "a GPU mapping mark above no band");
    const auto hardware = block ? LoopNode::Hardware::block : LoopNode::Hardware::thread;
    const int members = static_cast<int>(child.as<isl::schedule_node_band>().n_member());
    const int parts = block ? static_cast<int>(z_parts.size()) : 0;
    POLYTILE_CHECK(members - parts <= (parts ? 2 : 3), "a GPU band of ", members, " members, ", parts, " of them parts of z");
    const int depth = isl_support::schedule_depth(child);
    int64_t stride = 1;
    for (int k = parts; k-- > 0;) {
      dims[depth + k] = Mapping{hardware, 2, stride, z_parts[static_cast<size_t>(k)]};
      stride *= z_parts[static_cast<size_t>(k)];
    }
    for (int k = parts; k < members; ++k) dims[depth + k] = Mapping{hardware, members - 1 - k};
    return true;
  });
  return dims;
}

}  // namespace

std::string BlockStep::str() const {
  std::vector<std::string> names;
  for (const isl::id& p : params) names.push_back(p.name());
  const std::string args = "(" + join(names) + ")";
  auto choose = [&](const Condition& c, const std::string& then, const std::string& otherwise) {
    if (c.kind == Condition::Kind::always) return then + args + ";\n";
    if (c.kind == Condition::Kind::never) return otherwise + args + ";\n";
    return "if (" + c.expr->to_C_str() + ")\n  " + then + args + ";\nelse\n  " + otherwise + args + ";\n";
  };
  auto variant = [&](const Variant& v, const std::string& p) {
    std::string fma = v.direct_fma ? v.direct_fma->text : v.fma->to_C_str();  // shared loops call F: run as Fp
    for (size_t at = 0; !p.empty() && (at = fma.find("F(", at)) != std::string::npos; at += 3) fma.replace(at, 2, "Fp(");
    return choose(v.first, "Z" + p, "L" + p) + fma + choose(v.last, "E" + p, "T" + p);
  };
  auto indented = [](const std::string& text) {
    std::string out;
    for (size_t at = 0; at < text.size();) {
      size_t end = std::min(text.find('\n', at), text.size());
      out += "  " + text.substr(at, end - at) + "\n";
      at = end + 1;
    }
    return out;
  };
  std::string out = "// Step" + args + ": one block, one reduction tile\n";
  if (!predicated) return out + variant(*uniform, "");
  if (!uniform) return out + variant(*predicated, "p");
  return out + "if (" + uniform_block.expr->to_C_str() + ") {\n" + indented(variant(*uniform, "")) + "} else {\n" +
         indented(variant(*predicated, "p")) + "}\n";
}

void NestBuilder::generate(Nest& nest, const isl::schedule& sched, const BlockStep* step, const KernelStatements* added) {
  nest.tree = text(sched);
  last_tree = sched;
  int depth = 0;  // schedule dimensions: the deepest band's depth plus its members
  sched.root().foreach_descendant_top_down([&](const isl::schedule_node& node) {
    if (node.isa<isl::schedule_node_band>())
      depth = std::max(depth, isl_support::schedule_depth(node) + static_cast<int>(node.as<isl::schedule_node_band>().n_member()));
    return true;
  });
  const std::set<int> safe = parallel_dimensions(sched, statements.parallel_mark);
  const auto hardware = hardware_dimensions(sched, statements, added ? added->z_parts : std::vector<int64_t>{});
  if (target.direct_box_loops && !step && !added && !nest.accumulators && hardware.empty()) {
    if (std::optional<BoxLoops> box = box_loops(sched, statements, safe)) {
      nest.root = std::move(box->root);
      nest.ast = std::move(box->ast);
      nest.iterators = box->iterators;
      nest.direct_loops = true;
      finish_parallel(nest);
      return;
    }
  }
  if (target.direct_step_loops && step && !added && !nest.accumulators && hardware.empty()) {
    if (std::optional<StepLoops> loops = step_loops(sched, statements, safe)) {
      AstTranslator translator(statements, {}, safe, hardware, step, nullptr, nullptr);
      translator.first_iterators(loops->iterators);
      LoopNode body = translator.step(loops->args);
      for (size_t k = loops->loops.size(); k-- > 0;) {
        loops->loops[k].body.push_back(std::move(body));
        body = std::move(loops->loops[k]);
      }
      nest.root = std::move(body);
      nest.ast = std::move(loops->ast) + step->str();
      nest.iterators = translator.iterators();
      nest.direct_loops = true;
      finish_parallel(nest);
      return;
    }
  }
  // isl's own names for the loops (c0, c1, ...), as ids the translator can look up.
  std::vector<isl::id> iterators;
  for (int k = 0; k < depth; ++k) iterators.emplace_back(ctx.get(), "c" + std::to_string(k));
  isl::ast_build build = isl_support::with_iterators(isl::ast_build(ctx.get()), iterators);
  // With accumulators, each update statement notes its position, as expressions of the loops around it.
  std::deque<std::vector<isl::ast_expr>> positions;
  const std::vector<int64_t>* sizes = nest.accumulators ? &nest.accumulators->sizes : nullptr;
  if (sizes) {
    POLYTILE_CHECK(added && added->positions, "nest ", nest.name, " has accumulators but no positions");
    build = build.set_at_each_domain([&](isl::ast_node node, isl::ast_build at) {
      const isl::id id = node.as<isl::ast_node_user>().expr().as<isl::ast_expr_op>().arg(0).as<isl::ast_expr_id>().id();
      const auto kind = statements.find(id);
      using St = LoopNode::Statement;
      if (!kind || (kind->first != St::plain && kind->first != St::acc_load && kind->first != St::acc_store)) return node;
      std::vector<isl::ast_expr>& position = positions.emplace_back();
      const isl::map here = at.get_schedule().reverse().apply_range(*added->positions).as_map();  // schedule -> position
      const isl::pw_multi_aff of = isl::manage(isl_pw_multi_aff_from_map(here.copy()));
      for (size_t k = 0; k < sizes->size(); ++k) position.push_back(at.expr_from(of.at(static_cast<int>(k))));
      isl::id note = isl::manage(isl_id_alloc(ctx.get().get(), "position", &position));
      return isl::manage(isl_ast_node_set_annotation(node.release(), note.release()));
    });
  }
  isl::ast_node ast = build.node_from(sched);
  nest.ast = ast.to_C_str();
  if (step) nest.ast += step->str();
  AstTranslator translator(statements, iterators, safe, hardware, step, added, sizes);
  nest.root = translator.node(ast, false);
  nest.iterators = translator.iterators();
  finish_parallel(nest);
}

}  // namespace polytile::sched::internal
