// Scheduling with isl (see scheduler.h): the driver over a program's statements and the plain nests. Data
// model: a plain nest has one statement S whose domain is an isl set over the statement's variables; its
// schedule tree is domain -> [mark "parallel"] -> band (the variables, output variables first), tiled when
// the cost model asks for it. Update nests that qualify are built as micro-kernels (microkernel.cpp); every
// isl AST is translated into LoopNode/Aff by ast.cpp. Every isl object dies before its IslContext.
#include "polytile/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "polytile/error.h"
#include "polytile/isl_analysis.h"
#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"
#include "nest_builder.h"
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

namespace internal {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}


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


// Builds schedule tree, AST and loop IR for one statement domain. `order` permutes the variables into
// band order; the first `parallel` band members are marked parallel.
void NestBuilder::build(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                        const std::vector<size_t>& order, size_t parallel, size_t element_bytes, bool tiled,
                        bool innermost_last, bool reduction_outer) {
  isl::schedule sched = isl::schedule::from_domain(domain);
  std::set<int> safe;  // schedule dimensions whose loops may run in parallel
  if (!vars.empty()) {
    std::vector<std::string> perm;
    for (size_t k : order) perm.push_back(vars[k]);
    std::string tuple = "S[" + join(vars) + "]";
    isl::union_map band_map(ctx.get(), "{ " + tuple + " -> [" + join(perm) + "] }");
    isl::schedule_node root = sched.root().child(0);
    root = root.insert_partial_schedule(isl_support::partial_schedule(band_map));
    // Extents of the band members, for the cost model.
    isl::space band_space = isl_support::set_space(ctx.get(), static_cast<unsigned>(perm.size()));
    isl::set box = isl::union_set(domain).apply(band_map).extract_set(band_space);
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
      root = isl_support::delete_node(root);
      root = root.insert_partial_schedule(isl_support::partial_schedule(point_map));
      root = root.insert_mark(isl::id(ctx.get(), "point"));
      root = root.insert_partial_schedule(isl_support::partial_schedule(tile_map));
      root = root.insert_mark(isl::id(ctx.get(), "tile")).child(0);
    }
    if (!tile || !reduction_outer)
      for (size_t k = 0; k < parallel; ++k) safe.insert(static_cast<int>(k));
    if (parallel > 0) root = root.insert_mark(statements.parallel_mark);
    sched = root.schedule();
    nest.parallel_outer = parallel > 0;
  }
  generate(nest, sched, safe);
}


}  // namespace internal

namespace {

using internal::NestBuilder;
using internal::box_text;
using internal::join;
using isl_support::text;



}  // namespace

size_t expression_nodes(const Expr& e) {
  size_t n = 0;
  std::vector<Expr> stack{e};
  while (!stack.empty()) {
    Expr x = stack.back();
    stack.pop_back();
    ++n;
    for (const auto& a : x.args()) stack.push_back(a);
  }
  return n;
}

// One pass in program order: a producer's operands were decided before it, and substituting a producer
// into its only reader moves the producer's reads to that reader without changing how often anything is
// read, so the reader counts of the original program stay right. A fused expression stops growing at
// kMaxFusedNodes nodes, so ten thousand chained statements become nests of bounded size (compile time
// linear, no deep recursion in the emitter) instead of one expression ten thousand levels deep.
Program fuse_elementwise(const Program& program, const ProgramTypes& types) {
  constexpr size_t kMaxFusedNodes = 256;
  Program p = program;
  // Readers of every tensor, with repetition: a producer read twice by one consumer would be computed twice.
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < p.statements.size(); ++i) {
    if (const auto* c = std::get_if<Contraction>(&p.statements[i])) {
      for (const auto& a : c->inputs) readers[a.tensor].push_back(i);
      if (c->init) readers[*c->init].push_back(i);
      continue;
    }
    std::vector<Expr> stack{std::get<Elementwise>(p.statements[i]).expr};
    while (!stack.empty()) {
      Expr x = stack.back();
      stack.pop_back();
      if (x.kind() == Expr::Kind::tensor) readers[x.name()].push_back(i);
      for (const auto& a : x.args()) stack.push_back(a);
    }
  }
  std::vector<bool> erased(p.statements.size(), false);
  std::vector<size_t> nodes(p.statements.size(), 0);
  for (size_t i = 0; i < p.statements.size(); ++i)
    if (const auto* e = std::get_if<Elementwise>(&p.statements[i])) nodes[i] = expression_nodes(e->expr);
  for (size_t i = 0; i < p.statements.size(); ++i) {
    const auto* producer = std::get_if<Elementwise>(&p.statements[i]);
    if (!producer) continue;
    const std::string& name = producer->output;
    if (std::find(p.outputs.begin(), p.outputs.end(), name) != p.outputs.end()) continue;
    const auto& r = readers[name];
    if (r.size() != 1 || !std::holds_alternative<Elementwise>(p.statements[r[0]])) continue;
    if (nodes[i] + nodes[r[0]] > kMaxFusedNodes) continue;
    auto& consumer = std::get<Elementwise>(p.statements[r[0]]);
    Expr value = Expr::call(Intrinsic::cast, {producer->expr}, types.tensors.at(name).dtype);
    consumer.expr = consumer.expr.replace_leaves([&](const Expr& leaf) -> std::optional<Expr> {
      if (leaf.kind() == Expr::Kind::tensor && leaf.name() == name) return value;
      return std::nullopt;
    });
    nodes[r[0]] += nodes[i];
    erased[i] = true;
  }
  std::vector<Statement> kept;
  for (size_t i = 0; i < p.statements.size(); ++i)
    if (!erased[i]) kept.push_back(std::move(p.statements[i]));
  p.statements = std::move(kept);
  return p;
}

void verify_fusion(const Program& original, const Program& fused, const ProgramTypes& types) {
  auto fail = [](const std::string& why) { throw InternalError("translation validation failed: fusion " + why); };
  std::map<std::string, const Statement*> before, after;
  for (const auto& st : original.statements) before[statement_output(st)] = &st;
  for (const auto& st : fused.statements) after[statement_output(st)] = &st;
  std::map<std::string, const Elementwise*> absorbed;
  for (const auto& [name, st] : before) {
    if (after.count(name)) continue;
    const auto* e = std::get_if<Elementwise>(st);
    if (!e) fail("dropped contraction " + name);
    if (std::find(original.outputs.begin(), original.outputs.end(), name) != original.outputs.end())
      fail("absorbed the program output " + name);
    absorbed[name] = e;
  }
  // A fused tree matches an original one where every read of an absorbed producer P became
  // cast(P's expression, P's dtype), recursively; everything else is the same node.
  std::function<bool(const Expr&, const Expr&)> matches = [&](const Expr& f, const Expr& o) {
    if (o.kind() == Expr::Kind::tensor && absorbed.count(o.name())) {
      return f.kind() == Expr::Kind::call && f.intrinsic() == Intrinsic::cast &&
             f.cast_type() == types.tensors.at(o.name()).dtype && matches(f.args()[0], absorbed.at(o.name())->expr);
    }
    if (f.kind() != o.kind() || f.args().size() != o.args().size()) return false;
    switch (f.kind()) {
      case Expr::Kind::tensor:
      case Expr::Kind::literal:
      case Expr::Kind::dim: return f.str() == o.str();
      case Expr::Kind::unary: if (f.unary_op() != o.unary_op()) return false; break;
      case Expr::Kind::binary: if (f.binary_op() != o.binary_op()) return false; break;
      case Expr::Kind::call:
        if (f.intrinsic() != o.intrinsic() || (f.intrinsic() == Intrinsic::cast && f.cast_type() != o.cast_type())) return false;
        break;
    }
    for (size_t k = 0; k < f.args().size(); ++k)
      if (!matches(f.args()[k], o.args()[k])) return false;
    return true;
  };
  for (const auto& [name, st] : after) {
    auto it = before.find(name);
    if (it == before.end()) fail("invented statement " + name);
    if (const auto* e = std::get_if<Elementwise>(st)) {
      const auto* orig = std::get_if<Elementwise>(it->second);
      if (!orig || !matches(e->expr, orig->expr))
        fail("changed the meaning of " + name + ": " + e->expr.str() + " does not unfold to " + print(*it->second));
    } else if (print(*st) != print(*it->second)) {
      fail("changed contraction " + name);
    }
  }
}

Schedule schedule(const Program& program, const ProgramTypes& types, const Target& target) {
  Schedule out;
  NestBuilder nb{target};
  try {
    // An elementwise statement over `domain` (its whole box unless given).
    auto box = [&](const std::vector<std::string>& vars, const std::vector<int64_t>& shape) {
      return isl::set(nb.ctx.get(), box_text("S", vars, shape));
    };
    auto elementwise = [&](const Elementwise& e, std::optional<isl::set> domain) {
      const TensorType& t = types.tensors.at(e.output);
      Nest nest;
      nest.kind = Nest::Kind::elementwise;
      nest.name = e.output + ".elementwise";
      nest.tensor = e.output;
      nest.elementwise = e;
      for (size_t k = 0; k < t.shape.size(); ++k) nest.variables.push_back("i" + std::to_string(k));
      std::vector<size_t> order(t.shape.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      if (!domain) domain = box(nest.variables, t.shape);
      nb.build(nest, *domain, nest.variables, order, t.shape.empty() ? 0 : 1, dtype_bytes(t.dtype));
      out.nests.push_back(std::move(nest));
    };
    // Fusion decisions, from one pass over who produces and who reads each tensor.
    std::map<std::string, size_t> produced;           // tensor -> statement
    std::map<std::string, std::set<size_t>> readers;  // tensor -> statements reading it
    std::map<std::string, int> reads;                 // tensor -> reads, with repetition
    for (size_t i = 0; i < program.statements.size(); ++i) {
      const auto& st = program.statements[i];
      produced[statement_output(st)] = i;
      for (const auto& t : statement_operands(st)) {
        readers[t].insert(i);
        ++reads[t];
      }
    }
    const std::set<std::string> outputs(program.outputs.begin(), program.outputs.end());
    // Elementwise consumers that may run as a contraction's epilogue: the contraction's output has the
    // consumer's shape, is no program output and is read by nothing else, and every other tensor the
    // consumer reads exists before the contraction runs.
    std::map<size_t, size_t> epilogue_of;  // contraction statement -> consumer statement
    std::set<size_t> consumers;
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
        if (ready && !epilogue_of.count(p->second)) {
          epilogue_of[p->second] = i;
          consumers.insert(i);
        }
        break;
      }
    }
    // Elementwise producers that an update can evaluate where it reads them: read only by that
    // contraction's inputs, not program outputs, cheap (a few operations, no transcendental calls; an
    // input element is read many times), and not an epilogue candidate -- an epilogue materializes its
    // consumer while the contraction it reads stays scratch, so that consumer must be read, not recomputed.
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
    std::map<size_t, std::map<std::string, size_t>> inlined_into;  // contraction -> input -> producer
    for (size_t i = 0; i < program.statements.size(); ++i) {
      const auto* c = std::get_if<Contraction>(&program.statements[i]);
      if (!c) continue;
      for (const auto& a : c->inputs) {
        auto p = produced.find(a.tensor);
        if (p == produced.end() || !std::holds_alternative<Elementwise>(program.statements[p->second]) ||
            consumers.count(p->second) || outputs.count(a.tensor) || readers[a.tensor] != std::set<size_t>{i} ||
            (c->init && *c->init == a.tensor) || !cheap(std::get<Elementwise>(program.statements[p->second]).expr))
          continue;
        inlined_into[i][a.tensor] = p->second;
      }
    }
    std::set<size_t> fused;
    for (const auto& [c, inputs] : inlined_into)
      for (const auto& [tensor, producer] : inputs) fused.insert(producer);
    for (size_t index = 0; index < program.statements.size(); ++index) {
      const auto& st = program.statements[index];
      if (const auto* e = std::get_if<Elementwise>(&st)) {
        if (!fused.count(index)) elementwise(*e, std::nullopt);
        continue;
      }
      const auto& c = std::get<Contraction>(st);
      const TensorType& t = types.tensors.at(c.output);
      poly::internal::IslAnalysis analysis = poly::internal::analyze(c, types, nb.ctx.get());
      const poly::ContractionAnalysis& a = analysis.summary;
      const isl::id& S = nb.statements.id(LoopNode::Statement::plain);
      // The elements the valid points write, over S like every statement domain.
      isl::set written = isl_support::set_tuple_id(analysis.write.range(), S);
      std::vector<std::string> out_vars;
      for (size_t k = 0; k < t.shape.size(); ++k) out_vars.push_back("i" + std::to_string(k));
      std::vector<size_t> identity(out_vars.size());
      for (size_t k = 0; k < identity.size(); ++k) identity[k] = k;

      // The init and finalize nests run over the output's elements.
      auto element_nest = [&](Nest::Kind kind, const char* suffix) {
        Nest n;
        n.kind = kind;
        n.name = c.output + suffix;
        n.tensor = c.output;
        n.contraction = c;
        n.variables = out_vars;
        return n;
      };
      Nest init = element_nest(Nest::Kind::init, ".init");
      nb.build(init, box(out_vars, t.shape), out_vars, identity, out_vars.empty() ? 0 : 1, dtype_bytes(t.dtype));
      const size_t init_index = out.nests.size();
      out.nests.push_back(std::move(init));
      if (c.aggregation == AggregationOp::assign && !c.init && !a.empty) {
        // An assign that writes every element (a copy, a transpose) needs no init nest.
        if (box(out_vars, t.shape).is_subset(written)) out.nests.pop_back();
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
        bool parallel = n_out > 0 && poly::internal::writes_each_output_once(c, types, nb.ctx.get());
        isl::set dom = isl_support::set_tuple_id(analysis.domain, S);
        // The band map names dims positionally (isl may print fixed dims as "n = 0" in the tuple).
        std::vector<std::string> positional;
        for (size_t k = 0; k < update.variables.size(); ++k) positional.push_back("d" + std::to_string(k));
        int64_t out_bytes = static_cast<int64_t>(dtype_bytes(t.dtype));
        for (int64_t d : t.shape) out_bytes *= d;
        bool reduction_outer = parallel && n_out < order.size() - (innermost.empty() ? 0 : 1) && out_bytes * 4 <= target.l2_bytes;
        isl::set uncovered;
        auto consumer = epilogue_of.find(index);
        const Elementwise* epilogue =
            consumer == epilogue_of.end() || c.init ? nullptr : &std::get<Elementwise>(program.statements[consumer->second]);
        if (parallel && nb.try_microkernel(update, c, types, a, dom, positional, out_bytes, c.init ? nullptr : &uncovered, epilogue)) {
          if (!c.init) {  // the init nest shrinks to the elements no block stores, or disappears
            Nest& init_nest = out.nests[init_index];
            if (uncovered.is_empty()) {
              out.nests.erase(out.nests.begin() + static_cast<long>(init_index));
            } else {
              nb.build(init_nest, uncovered, out_vars, identity, out_vars.empty() ? 0 : 1, dtype_bytes(t.dtype));
            }
          }
          out.nests.push_back(std::move(update));
          if (epilogue) {  // the consumer runs in the blocks; elsewhere (unstored elements) as a nest
            fused.insert(consumer->second);
            if (!uncovered.is_empty()) elementwise(*epilogue, uncovered);
          }
          continue;  // a sum: no finalize nest
        }
        if (!nb.try_row_reduction(update, c, types, a, dom, positional, parallel))
          nb.build(update, dom, positional, order, parallel ? n_out : 0, dtype_bytes(t.dtype), /*tiled=*/parallel,
                   !innermost.empty(), reduction_outer);
        out.nests.push_back(std::move(update));
      }

      bool needs_finalize = !c.init && (c.aggregation == AggregationOp::product || c.aggregation == AggregationOp::max ||
                                        c.aggregation == AggregationOp::min);
      if (needs_finalize) {
        // Elements no valid point writes: the box minus the image of the write map.
        isl::set unwritten = box(out_vars, t.shape);
        if (!a.empty) {
          unwritten = unwritten.subtract(written).coalesce();
          if (unwritten.is_empty()) continue;
        }
        Nest fin = element_nest(Nest::Kind::finalize, ".finalize");
        nb.build(fin, unwritten, out_vars, identity, 0, dtype_bytes(t.dtype));
        out.nests.push_back(std::move(fin));
      }
    }
  } catch (const isl::exception& e) {
    throw InternalError(std::string("isl failed while scheduling: ") + e.what());
  }
  return out;
}

}  // namespace polytile::sched
