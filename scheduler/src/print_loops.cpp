// The loop IR as text: expressions (LoopExpr::str), the isl renderings a schedule keeps (Schedule::tree/ast),
// and lower.h's print_loops -- what the LLVM IR emitter consumes, one nest after another.
#include <string>

#include "polytile/lower.h"

namespace polytile::sched {

std::string LoopExpr::str() const {
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

const char* statement_name(LoopNode::Statement s) {
  switch (s) {
    case LoopNode::Statement::plain: return "S";
    case LoopNode::Statement::zero: return "Zero";
    case LoopNode::Statement::load: return "Load";
    case LoopNode::Statement::fma: return "Fma";
    case LoopNode::Statement::store: return "Store";
    case LoopNode::Statement::epilogue: return "Epilogue";
    case LoopNode::Statement::copy: return "Copy";
    case LoopNode::Statement::acc_load: return "AccIn";
    case LoopNode::Statement::acc_store: return "AccOut";
  }
  return "?";
}

// `accumulators` (if any): the nest's statements other than copies name their accumulator (acc[position]),
// and its AccIn say where they start at the identity.
void print_node(const LoopNode& n, int depth, const Accumulators* accumulators, std::string& out) {
  const std::string pad(static_cast<size_t>(2 * depth), ' ');
  switch (n.kind) {
    case LoopNode::Kind::block:
      for (const auto& c : n.body) print_node(c, depth, accumulators, out);
      return;
    case LoopNode::Kind::loop: {
      const std::string it = "c" + std::to_string(n.iterator);
      static const char* const axes[] = {"x", "y", "z"};
      std::string head = n.parallel ? "parallel for " : "for ";
      if (n.hardware != LoopNode::Hardware::none)
        head = std::string(n.hardware == LoopNode::Hardware::block ? "block." : "thread.") + axes[n.axis] +
               (n.part_stride > 1 ? " / " + std::to_string(n.part_stride) : "") +
               (n.part_extent > 0 ? " % " + std::to_string(n.part_extent) : "") + " for ";
      out += pad + head + it + " = " + n.lower.str() + " while " + n.condition.str() + " step " + std::to_string(n.step) +
             (n.unroll ? " unroll " + std::to_string(n.unroll) : "") + "\n";
      for (const auto& c : n.body) print_node(c, depth + 1, accumulators, out);
      return;
    }
    case LoopNode::Kind::guard:
      out += pad + "if " + n.condition.str() + "\n";
      for (const auto& c : n.body) print_node(c, depth + 1, accumulators, out);
      if (!n.otherwise.empty()) {
        out += pad + "else\n";
        for (const auto& c : n.otherwise) print_node(c, depth + 1, accumulators, out);
      }
      return;
    case LoopNode::Kind::statement: {
      std::string args;
      for (size_t k = 0; k < n.args.size(); ++k) args += (k ? ", " : "") + n.args[k].str();
      const std::string tile = n.statement == LoopNode::Statement::copy ? std::to_string(n.tile) : "";
      std::string registers;
      for (size_t k = 0; k < n.registers.size(); ++k) registers += (k ? ", " : "") + n.registers[k].str();
      out += pad + statement_name(n.statement) + tile + (n.predicated ? "p" : "") + "(" + args + ")" +
             (accumulators && n.statement != LoopNode::Statement::copy ? " acc[" + registers + "]" : "") +
             (accumulators && accumulators->from_identity && n.statement == LoopNode::Statement::acc_load ? " = identity" : "") + "\n";
      return;
    }
    case LoopNode::Kind::barrier: out += pad + "barrier\n"; return;
  }
}

const char* kind_name(Nest::Kind k) {
  switch (k) {
    case Nest::Kind::init: return "init";
    case Nest::Kind::update: return "update";
    case Nest::Kind::finalize: return "finalize";
    case Nest::Kind::elementwise: return "elementwise";
  }
  return "?";
}

}  // namespace

std::string print_loops(const Schedule& schedule) {
  std::string out;
  auto group = schedule.groups.begin();
  for (size_t k = 0; k < schedule.nests.size(); ++k) {
    const Nest& nest = schedule.nests[k];
    if (group != schedule.groups.end() && group->first == k) {
      out += "row group of nests " + schedule.nests[group->first].name + " .. " + schedule.nests[group->last].name + ": " +
             std::to_string(group->rows) + " outer iterations at a time, every nest in turn";
      for (size_t t = 0; t < group->chunk_tensors.size(); ++t)
        out += (t ? ", " : "; in each chunk's own memory: ") + group->chunk_tensors[t].tensor + " (" +
               std::to_string(group->chunk_tensors[t].row_elements) +
               (group->chunk_tensors[t].row_elements == 1 ? " element" : " elements") + " an iteration)";
      out += "\n";
      ++group;
    }
    std::string vars;
    for (size_t v = 0; v < nest.variables.size(); ++v) vars += (v ? ", " : "") + nest.variables[v];
    out += "nest " + nest.name + " (" + kind_name(nest.kind) + " of " + nest.tensor + "; S(" + vars + ")";
    if (nest.parallel_outer)
      out += "; threads split " + std::to_string(nest.outer_lo) + ".." + std::to_string(nest.outer_hi);
    if (nest.points >= 0) out += "; " + std::to_string(nest.points) + " points in its box";
    if (nest.microkernel)
      out += "; micro-kernel " + std::to_string(nest.microkernel->rows) + "x" + std::to_string(nest.microkernel->chunks) + "x" +
             std::to_string(nest.microkernel->lanes) +
             (nest.microkernel->prefetch_bytes ? ", prefetch +" + std::to_string(nest.microkernel->prefetch_bytes) + " B" : "") +
             (nest.microkernel->prefetch_next_block ? ", prefetch next block" : "") +
             (nest.microkernel->prefetch_epilogue.empty() ? "" : ", prefetch next block's epilogue lines") +
             (nest.microkernel->prefetch_vector_steps ? ", prefetch vector +" + std::to_string(nest.microkernel->prefetch_vector_steps) + " steps" : "");
    if (nest.stores) out += "; each point stores its element";
    if (nest.stream) out += "; stores past the caches";
    if (nest.transpose_lanes)
      out += "; transposed by " + std::to_string(nest.transpose_lanes) + "x" + std::to_string(nest.transpose_lanes) + " squares" +
             (nest.transpose_half_edges ? " (" + std::to_string(nest.transpose_lanes / 2) + "x" + std::to_string(nest.transpose_lanes / 2) + " at the edges)" : "");
    if (nest.reduction) {
      const RowReduction& r = *nest.reduction;
      out += "; row reduction of " + std::to_string(r.lanes) + " lanes";
      if (r.hoisted) {  // "tiles of n (1) outside j, i"
        std::string moved, inside;
        for (size_t q = 0; q < r.hoisted; ++q) moved += (q ? ", " : "") + nest.variables[r.others[q]];
        for (size_t k = r.outer_outputs; k < r.outputs.size(); ++k) inside += (k > r.outer_outputs ? ", " : "") + nest.variables[r.outputs[k]];
        out += ", reduction tiles of " + moved + " (" + std::to_string(r.tile) + ") outside " + inside;
      }
    }
    if (nest.epilogue) out += "; epilogue " + nest.epilogue->output;
    if (nest.permuted_copy) out += "; last tiles stored permuted into " + nest.permuted_copy->output;
    if (nest.kernel) {
      const KernelLaunch& k = *nest.kernel;
      auto dims = [](const auto& d) {  // "AxBxC"
        std::string s;
        for (int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
        return s;
      };
      out += k.sequential ? "; kernel on one thread (nothing mapped to blocks and threads)"
                          : "; kernel grid " + dims(k.grid) + " block " + dims(k.block);
      for (size_t t = 0; t < nest.shared.size(); ++t)
        out += "; shared tile " + std::to_string(t) + " " + nest.shared[t].tensor + " " + dims(nest.shared[t].sizes) +
               (nest.shared[t].storage() > nest.shared[t].elements() ? " pitch " + std::to_string(nest.shared[t].pitch) : "");
      if (nest.accumulators)
        out += "; accumulators " + (nest.accumulators->sizes.empty() ? std::string("1") : dims(nest.accumulators->sizes));
    }
    out += ")\n";
    print_node(nest.root, 1, nest.accumulators ? &*nest.accumulators : nullptr, out);
  }
  return out;
}

}  // namespace polytile::sched
