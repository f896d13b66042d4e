// Scheduling with isl (see scheduler.h): the driver over a program's statements. Every nest's domain is an
// isl set in the builder's one isl context; a plain nest gets a target-neutral tree (nest_builder.cpp) that
// the CPU strategy shapes (cpu_strategy.cpp: parallel mark, cache tiles); update nests that qualify are
// built by the strategy as micro-kernels (microkernel.cpp) or row reductions (row_reduction.cpp); ast.cpp
// translates every marked tree into loop IR. Every isl object dies before its IslContext.
#include "polytile/scheduler.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "polytile/error.h"
#include "polytile/isl_analysis.h"
#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"
#include "nest_builder.h"
#include "plan.h"

namespace polytile::sched {

using internal::NestBuilder;
using internal::NestFacts;
using internal::box_text;
using internal::join;

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
      nb.build(nest, *domain, nest.variables, order, t.shape.empty() ? 0 : 1, {dtype_bytes(t.dtype)});
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
      nb.build(init, box(out_vars, t.shape), out_vars, identity, out_vars.empty() ? 0 : 1, {dtype_bytes(t.dtype)});
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
        isl::set uncovered;
        auto consumer = epilogue_of.find(index);
        const Elementwise* epilogue =
            consumer == epilogue_of.end() || c.init ? nullptr : &std::get<Elementwise>(program.statements[consumer->second]);
        if (parallel && nb.try_microkernel(update, c, types, analysis, dom, positional, out_bytes, c.init ? nullptr : &uncovered, epilogue)) {
          if (!c.init) {  // the init nest shrinks to the elements no block stores, or disappears
            Nest& init_nest = out.nests[init_index];
            if (uncovered.is_empty()) {
              out.nests.erase(out.nests.begin() + static_cast<long>(init_index));
            } else {
              nb.build(init_nest, uncovered, out_vars, identity, out_vars.empty() ? 0 : 1, {dtype_bytes(t.dtype)});
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
          nb.build(update, dom, positional, order, parallel ? n_out : 0,
                   NestFacts{dtype_bytes(t.dtype), /*update=*/true, !innermost.empty(), out_bytes});
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
        nb.build(fin, unwritten, out_vars, identity, 0, {dtype_bytes(t.dtype)});
        out.nests.push_back(std::move(fin));
      }
    }
  } catch (const isl::exception& e) {
    throw InternalError(std::string("isl failed while scheduling: ") + e.what());
  }
  return out;
}

}  // namespace polytile::sched
