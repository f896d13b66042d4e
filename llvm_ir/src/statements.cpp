// NestEmitter (nest_emitter.h): tensor accesses at index polynomials, inlined producers, aggregation with
// NaN-propagating max/min, and the plain statement of init, update, finalize and elementwise nests.
#include "nest_emitter.h"

namespace polytile::llvm_ir::internal {

// Index arithmetic (here, in index polynomials, loop bounds and counters) is `nsw`: its values are
// bounded by tensor sizes far below 2^63. Without the flags, LLVM's induction-variable simplification
// spent its time proving that no step overflows (ScalarEvolution::willNotOverflow: 10% of all the CPU
// time of compiling a small CNN's training step). Integer arithmetic of the program itself wraps around
// and has no flags (values.cpp).
Value* NestEmitter::flat_index(const std::string& tensor, const std::vector<Value*>& idx) {
  const auto& shape = types_.tensors.at(tensor).shape;
  Value* flat = ix(0);
  for (size_t k = 0; k < shape.size(); ++k) flat = b_.CreateNSWAdd(b_.CreateNSWMul(flat, ix(shape[k])), idx[k]);
  return flat;
}

// An index polynomial (dims bound) at the statement's variable values; exact division by its
// denominator (the domain guarantees integrality).
Value* NestEmitter::poly(const Polynomial& p, const std::map<std::string, Value*>& vars) {
  auto [s, den] = scaled_poly(p, vars);
  return den == 1 ? s : b_.CreateExactSDiv(s, ix(den));
}

// A contraction input at index `idx`: loaded, or computed by its inlined elementwise producer (rounded
// to the producer's dtype, as the materialized tensor would be). Vector-wide when width_ is set.
Typed NestEmitter::input(const std::string& tensor, const std::vector<Value*>& idx) {
  auto in = nest_.inlined.find(tensor);
  if (in == nest_.inlined.end()) {
    if (!width_) return load_element(tensor, idx);
    return expr(Expr::tensor(tensor), idx);
  }
  DType t = types_.tensors.at(tensor).dtype;
  return {convert(expr(in->second.expr, idx), t), t};
}

// The polynomial times its denominator, at the given variable values, and that denominator.
std::pair<Value*, int64_t> NestEmitter::scaled_poly(const Polynomial& p, const std::map<std::string, Value*>& vars) {
  Polynomial q = p.bind_dims(types_.dims);
  int64_t den = q.constant().den();
  for (const auto& [v, c] : q.index_terms()) den = std::lcm(den, c.den());
  Value* s = ix((q.constant() * Rational(den)).num());
  for (const auto& [v, c] : q.index_terms())
    s = b_.CreateNSWAdd(s, b_.CreateNSWMul(vars.at(v), ix((c * Rational(den)).num())));
  return {s, den};
}

Typed NestEmitter::identity(AggregationOp op, DType t) {
  double inf = std::numeric_limits<double>::infinity();
  switch (op) {
    case AggregationOp::sum:
    case AggregationOp::assign: return constant(0, t);
    case AggregationOp::product: return constant(1, t);
    case AggregationOp::max:
      if (t == DType::i32) return {integer(std::numeric_limits<int32_t>::min(), t), t};
      if (t == DType::i64) return {integer(std::numeric_limits<int64_t>::min(), t), t};
      return constant(t == DType::boolean ? 0 : -inf, t);
    case AggregationOp::min:
      if (t == DType::i32) return {integer(std::numeric_limits<int32_t>::max(), t), t};
      if (t == DType::i64) return {integer(std::numeric_limits<int64_t>::max(), t), t};
      return constant(t == DType::boolean ? 1 : inf, t);
  }
  return constant(0, t);
}

// max/min that propagate NaN, selecting exactly as the interpreter does (llvm.maximum does not lower
// on x86 in LLVM 16). Elementwise max(a, b) is std::max: a < b ? b : a.
Value* NestEmitter::nan_max_min(bool is_max, Value* a, Value* b) {
  Value* pick = is_max ? b_.CreateSelect(b_.CreateFCmpOLT(a, b), b, a) : b_.CreateSelect(b_.CreateFCmpOLT(b, a), b, a);
  return b_.CreateSelect(b_.CreateFCmpUNO(a, b), b_.CreateFAdd(a, b), pick);
}

// The accumulator takes v when v > acc (max) or v < acc (min); any NaN makes the result NaN.
Value* NestEmitter::nan_accumulate(bool is_max, Value* acc, Value* v) {
  Value* better = is_max ? b_.CreateFCmpOGT(v, acc) : b_.CreateFCmpOLT(v, acc);
  return b_.CreateSelect(b_.CreateFCmpUNO(acc, v), b_.CreateFAdd(acc, v), b_.CreateSelect(better, v, acc));
}

Value* NestEmitter::accumulate(AggregationOp op, Value* acc, Value* v, DType t) {
  // Float sums and products may be reassociated (and contracted to FMA) so reductions vectorize.
  auto reassociable = [](Value* r) {
    llvm::FastMathFlags flags;
    flags.setAllowReassoc();
    flags.setAllowContract();
    llvm::cast<llvm::Instruction>(r)->setFastMathFlags(flags);
    return r;
  };
  bool boolean = t == DType::boolean;
  switch (op) {
    case AggregationOp::sum:
      if (is_float(t)) return reassociable(b_.CreateFAdd(acc, v));
      return boolean ? b_.CreateOr(acc, v) : b_.CreateAdd(acc, v);
    case AggregationOp::product:
      if (is_float(t)) return reassociable(b_.CreateFMul(acc, v));
      return boolean ? b_.CreateAnd(acc, v) : b_.CreateMul(acc, v);
    case AggregationOp::max:
      if (is_float(t)) return nan_accumulate(true, acc, v);
      return boolean ? b_.CreateOr(acc, v) : intrinsic(llvm::Intrinsic::smax, {acc, v});
    case AggregationOp::min:
      if (is_float(t)) return nan_accumulate(false, acc, v);
      return boolean ? b_.CreateAnd(acc, v) : intrinsic(llvm::Intrinsic::smin, {acc, v});
    case AggregationOp::assign: return v;
  }
  return v;
}

Value* NestEmitter::output_address(const std::map<std::string, Value*>& vars) {
  std::vector<Value*> idx;
  for (const auto& p : nest_.contraction.output_indices) idx.push_back(poly(p, vars));
  return element_address(nest_.contraction.output, idx);
}

Value* NestEmitter::accumulator_address(const std::vector<sched::LoopExpr>& position) {
  const std::vector<int64_t>& sizes = nest_.accumulators->sizes;
  POLYTILE_CHECK(accumulators_ && position.size() == sizes.size(), "kernel ", nest_.name, ": an accumulator position of ",
                 position.size(), " dimensions for ", sizes.size());
  Value* at = ix(0);
  if (!device_) {  // the thread's part of the host's array (its threads in turn, x fastest)
    const sched::KernelLaunch& k = *nest_.kernel;
    Value* thread = b_.CreateLoad(ix_, hardware_[1][2]);
    thread = b_.CreateNSWAdd(b_.CreateNSWMul(thread, ix(k.block[1])), b_.CreateLoad(ix_, hardware_[1][1]));
    at = b_.CreateNSWAdd(b_.CreateNSWMul(thread, ix(k.block[0])), b_.CreateLoad(ix_, hardware_[1][0]));
  }
  for (size_t k = 0; k < sizes.size(); ++k) at = b_.CreateNSWAdd(b_.CreateNSWMul(at, ix(sizes[k])), loop_expr(position[k]));
  return b_.CreateGEP(accumulators_->getAllocatedType(), accumulators_, {ix(0), at});
}

void NestEmitter::accumulator_statement(const sched::LoopNode& n) {
  const DType t = types_.tensors.at(nest_.tensor).dtype;
  const std::vector<size_t>& outputs = nest_.accumulators->variables;
  const std::vector<Value*> vals = loop_exprs(n.args);
  POLYTILE_CHECK(vals.size() == outputs.size(), "kernel ", nest_.name, ": an accumulator statement of ", vals.size(),
                 " arguments for ", outputs.size(), " output variables");
  std::map<std::string, Value*> vars;
  for (size_t k = 0; k < outputs.size(); ++k) vars[nest_.variables.at(outputs[k])] = vals[k];
  Value* element = output_address(vars);
  Value* acc = accumulator_address(n.registers);
  if (n.statement == sched::LoopNode::Statement::acc_store) {
    store_address(t, element, load_address(t, acc));
    return;
  }
  store_address(t, acc, nest_.accumulators->from_identity ? identity(nest_.contraction.aggregation, t) : load_address(t, element));
}

void NestEmitter::statement(const sched::LoopNode& n) {
  const std::vector<Value*> vals = loop_exprs(n.args);
  using NK = sched::Nest::Kind;
  const TensorType& out = types_.tensors.at(nest_.tensor);
  switch (nest_.kind) {
    case NK::elementwise: {
      store_element(nest_.tensor, vals, expr(nest_.elementwise.expr, vals));
      return;
    }
    case NK::finalize: store_element(nest_.tensor, vals, constant(0, out.dtype)); return;
    case NK::init: {
      const Contraction& c = nest_.contraction;
      if (c.init) {
        store_element(nest_.tensor, vals, expr(Expr::tensor(*c.init), vals));
      } else {
        store_element(nest_.tensor, vals, identity(c.aggregation, out.dtype));
      }
      return;
    }
    case NK::update: break;
  }
  const Contraction& c = nest_.contraction;
  std::map<std::string, Value*> vars;
  for (size_t k = 0; k < nest_.variables.size(); ++k) vars[nest_.variables[k]] = vals[k];
  Value* out_addr = nest_.accumulators ? accumulator_address(n.registers) : output_address(vars);
  // In a branch-free register tile: the variables whose values depend on a guarded register position.
  std::set<std::string> masked_vars;
  if (register_mask_) {
    std::function<bool(const sched::LoopExpr&)> masked = [&](const sched::LoopExpr& e) {
      if (e.kind == sched::LoopExpr::Kind::iterator && masked_iterators_.count(e.iterator)) return true;
      return std::any_of(e.args.begin(), e.args.end(), masked);
    };
    for (size_t k = 0; k < nest_.variables.size() && k < n.args.size(); ++k)
      if (masked(n.args[k])) masked_vars.insert(nest_.variables[k]);
  }
  std::vector<Typed> in;
  for (const auto& a : c.inputs) {
    std::vector<Value*> idx;
    for (const auto& p : a.indices) idx.push_back(poly(p, vars));
    if (auto tile = shared_tile(a.tensor)) {  // from the tile its copy filled: at index - origin
      for (size_t d = 0; d < idx.size(); ++d) idx[d] = b_.CreateSub(idx[d], b_.CreateLoad(ix_, origins_[*tile][d]));
      bool masked = false;
      for (const auto& p : a.indices)
        for (const auto& [var, coefficient] : p.index_terms()) masked = masked || masked_vars.count(var);
      in.push_back(load_address(types_.tensors.at(a.tensor).dtype,
                                register_mask_ ? shared_address_clamped(*tile, idx, masked) : shared_address(*tile, idx)));
      continue;
    }
    in.push_back(input(a.tensor, idx));
  }
  llvm::BasicBlock* skip = nullptr;
  Typed value{nullptr, out.dtype};
  switch (c.combination) {
    case CombinationOp::none: value = in[0]; break;
    case CombinationOp::mul:
    case CombinationOp::add: {
      DType t = promote(promote(in[0].t, in[1].t), DType::i32);
      POLYTILE_CHECK(t != DType::f16, "contraction ", c.output, " multiplies or adds halves: half widening (lower.h) makes such contractions f32");
      value = arith(c.combination == CombinationOp::mul ? BinaryOp::mul : BinaryOp::add, in[0], in[1], t);
      // In a GPU kernel (on the device, and as the host runs it) a product summed into the accumulator
      // may become one fused multiply-add (the accumulation is contractible too): half the instructions
      // of a reduction step.
      if (nest_.kernel && c.combination == CombinationOp::mul && c.aggregation == AggregationOp::sum)
        if (auto* mul = llvm::dyn_cast<llvm::Instruction>(value.v); mul && mul->getOpcode() == llvm::Instruction::FMul) {
          llvm::FastMathFlags flags;
          flags.setAllowContract();
          mul->setFastMathFlags(flags);
        }
      break;
    }
    case CombinationOp::eq: value = {compare(BinaryOp::eq, in[0], in[1], promote(in[0].t, in[1].t)), DType::boolean}; break;
    case CombinationOp::cond: {
      Value* hit = compare(BinaryOp::eq, in[0], in[1], promote(in[0].t, in[1].t));
      if (c.aggregation != AggregationOp::assign) {
        // A miss contributes the aggregation's identity: branch-free, so the loop can vectorize.
        value = {b_.CreateSelect(hit, convert(in[2], out.dtype), identity(c.aggregation, out.dtype).v), out.dtype};
        break;
      }
      auto* then_bb = llvm::BasicBlock::Create(ctx_, "cond.hit", fn_);
      skip = llvm::BasicBlock::Create(ctx_, "cond.skip", fn_);
      b_.CreateCondBr(hit, then_bb, skip);
      b_.SetInsertPoint(then_bb);
      value = in[2];
      break;
    }
  }
  Value* v = convert(value, out.dtype);
  if (c.aggregation != AggregationOp::assign) {
    // A point that alone writes its element (Nest::stores) adds its term to the identity, not the element.
    Typed acc = nest_.stores ? identity(c.aggregation, out.dtype) : load_address(out.dtype, out_addr);
    auto* mul = llvm::dyn_cast<llvm::Instruction>(v);
    if (register_mask_ && c.aggregation == AggregationOp::sum && mul && mul->getOpcode() == llvm::Instruction::FMul &&
        mul->hasAllowContract() && mul->getType() == acc.v->getType()) {
      // One fused multiply-add, selected whole: a sum selected after the product would keep them apart
      // (InstCombine moves the select between them).
      v = b_.CreateIntrinsic(llvm::Intrinsic::fma, {acc.v->getType()}, {mul->getOperand(0), mul->getOperand(1), acc.v});
      if (mul->use_empty()) mul->eraseFromParent();
    } else {
      v = accumulate(c.aggregation, acc.v, v, out.dtype);
    }
    if (register_mask_) v = b_.CreateSelect(register_mask_, v, acc.v);  // out of range: the accumulator as it was
  }
  store_address(out.dtype, out_addr, {v, out.dtype});
  if (skip) {
    b_.CreateBr(skip);
    b_.SetInsertPoint(skip);
  }
}

}  // namespace polytile::llvm_ir::internal
