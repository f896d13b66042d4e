// NestEmitter (nest_emitter.h): the statements of a vectorized row reduction (see RowReduction in
// scheduler.h): identity accumulators, unmasked vector steps and a masked last one, the horizontal reduction.
#include "nest_emitter.h"

namespace polytile::llvm_ir::internal {

// zero / step / store of a vectorized row reduction (see RowReduction in scheduler.h).
void NestEmitter::reduction_statement(const sched::LoopNode& n) {
  using St = sched::LoopNode::Statement;
  const auto& rd = *nest_.reduction;
  const Contraction& c = nest_.contraction;
  const DType t = types_.tensors.at(nest_.tensor).dtype;
  const auto& names = nest_.variables;
  const unsigned lanes = static_cast<unsigned>(rd.lanes);
  auto* vty = llvm::FixedVectorType::get(value_type(t), lanes);
  const std::vector<Value*> vals = loop_exprs(n.args);
  std::map<std::string, Value*> vars;
  for (size_t k = 0; k < rd.outputs.size(); ++k) vars[names[rd.outputs[k]]] = vals[k];
  width_ = lanes;  // constants and identities as vectors
  Value* identity_vector = identity(c.aggregation, t).v;
  width_ = 0;
  switch (n.statement) {
    case St::zero:
      for (auto* acc : acc_) b_.CreateStore(identity_vector, acc);
      return;
    case St::fma: {
      for (size_t k = 0; k < rd.others.size(); ++k) vars[names[rd.others[k]]] = vals[rd.outputs.size() + k];
      const int64_t group = int64_t{rd.accumulators} * rd.lanes;  // r's values per step
      Value* first = b_.CreateNSWAdd(b_.getInt64(rd.lo), b_.CreateNSWMul(vals.back(), b_.getInt64(group)));
      Value* iota = lane_indices(lanes);
      // r's valid values at this point: its range, or, where the range follows the other variables, the
      // interval its conditions leave (every condition is affine in r), whose bounds do not change from
      // step to step (LICM takes them out of the loop over the steps).
      const auto [lo, hi] = rd.ragged ? ragged_range(vars, names[rd.vector]) : std::pair<Value*, Value*>{b_.getInt64(rd.lo), b_.getInt64(rd.hi)};
      auto lanes_in = [&](Value* base) {  // the lanes of base + l in [lo, hi] (from rd.lo on: a step's first is)
        Value* at = b_.CreateAdd(b_.CreateVectorSplat(lanes, base), iota);
        Value* below = b_.CreateICmpSLE(at, b_.CreateVectorSplat(lanes, hi));
        return rd.ragged ? b_.CreateAnd(b_.CreateICmpSGE(at, b_.CreateVectorSplat(lanes, lo)), below) : below;
      };
      // Steps whose lanes all lie in the interval (with a fixed range, every step but the last when the
      // range is no multiple of the step) load and accumulate unmasked; the others mask their lanes.
      auto steps = [&](bool masked) {
        for (int a = 0; a < rd.accumulators; ++a) {
          Value* base = b_.CreateNSWAdd(first, b_.getInt64(int64_t{a} * rd.lanes));
          vars[names[rd.vector]] = base;
          Value* mask = masked ? lanes_in(base) : nullptr;
          std::vector<Value*> x;
          // A conditional term's comparands compare in their common type (as in the plain nests).
          const DType compared = c.combination == CombinationOp::cond
                                     ? promote(types_.tensors.at(c.inputs[0].tensor).dtype, types_.tensors.at(c.inputs[1].tensor).dtype)
                                     : t;
          for (const auto& in : c.inputs) {
            const DType as = x.size() < 2 && c.combination == CombinationOp::cond ? compared : t;
            std::vector<Value*> at;
            for (const auto& p : in.indices) at.push_back(poly(p, vars));
            bool along = !in.indices.empty() && in.indices.back().coefficient(names[rd.vector]) != Rational(0);
            if (along) {
              width_ = lanes;
              mask_ = mask;
              x.push_back(convert(input(in.tensor, at), as));
              width_ = 0;
              mask_ = nullptr;
            } else {
              x.push_back(b_.CreateVectorSplat(lanes, convert(input(in.tensor, at), as)));
            }
          }
          Value* value = x[0];
          if (c.combination == CombinationOp::mul) value = arith(BinaryOp::mul, {x[0], t}, {x[1], t}, t).v;
          if (c.combination == CombinationOp::cond)  // a miss contributes the identity
            value = b_.CreateSelect(compare(BinaryOp::eq, {x[0], compared}, {x[1], compared}, compared), x[2], identity_vector);
          if (mask) value = b_.CreateSelect(mask, value, identity_vector);  // lanes outside r's interval add nothing
          Value* acc = b_.CreateLoad(vty, acc_[static_cast<size_t>(a)]);
          b_.CreateStore(accumulate(c.aggregation, acc, value, t), acc_[static_cast<size_t>(a)]);
        }
      };
      if (!rd.ragged && (rd.hi - rd.lo + 1) % group == 0) {
        steps(false);
        return;
      }
      Value* full = b_.CreateICmpSLE(b_.CreateAdd(first, b_.getInt64(group - 1)), hi);
      if (rd.ragged) full = b_.CreateAnd(b_.CreateICmpSGE(first, lo), full);
      auto* full_bb = llvm::BasicBlock::Create(ctx_, "reduction.full", fn_);
      auto* last_bb = llvm::BasicBlock::Create(ctx_, "reduction.last", fn_);
      auto* next_bb = llvm::BasicBlock::Create(ctx_, "reduction.next", fn_);
      b_.CreateCondBr(full, full_bb, last_bb);
      b_.SetInsertPoint(full_bb);
      steps(false);
      b_.CreateBr(next_bb);
      b_.SetInsertPoint(last_bb);
      steps(true);
      b_.CreateBr(next_bb);
      b_.SetInsertPoint(next_bb);
      return;
    }
    case St::store: {
      Value* total = b_.CreateLoad(vty, acc_[0]);
      for (size_t a = 1; a < acc_.size(); ++a) total = accumulate(c.aggregation, total, b_.CreateLoad(vty, acc_[a]), t);
      // The lanes in halves (a tree of log2(lanes) vector steps, not a chain of lanes - 1 scalar ones: the
      // sum runs once per row and reduction tile, and a chain of 15 adds is 60 cycles of latency).
      unsigned width = lanes;
      for (; width > 1 && width % 2 == 0; width /= 2) {
        std::vector<int> low, high;
        for (unsigned l = 0; l < width / 2; ++l) {
          low.push_back(static_cast<int>(l));
          high.push_back(static_cast<int>(width / 2 + l));
        }
        total = accumulate(c.aggregation, b_.CreateShuffleVector(total, low), b_.CreateShuffleVector(total, high), t);
      }
      Value* h = b_.CreateExtractElement(total, uint64_t{0});
      for (unsigned l = 1; l < width; ++l) h = accumulate(c.aggregation, h, b_.CreateExtractElement(total, l), t);
      Value* addr = output_address(vars);
      Typed old = load_address(t, addr);
      store_address(t, addr, {accumulate(c.aggregation, old.v, h, t), t});
      return;
    }
    default: POLYTILE_CHECK(false, "unexpected statement in a row reduction");
  }
}

// The interval of r's valid values at `vars` (the other variables): the largest of the lower bounds and
// the smallest of the upper bounds that r's range and each condition on r (0 <= a r + b < hi, integral)
// put on it.
std::pair<Value*, Value*> NestEmitter::ragged_range(std::map<std::string, Value*> vars, const std::string& r) {
  const auto& rd = *nest_.reduction;
  Value* lo = b_.getInt64(rd.lo);
  Value* hi = b_.getInt64(rd.hi);
  vars[r] = b_.getInt64(0);
  // floor(x / d) and ceil(x / d) for d > 0.
  auto floor_div = [&](Value* x, int64_t d) {
    if (d == 1) return x;
    Value* q = b_.CreateSDiv(x, b_.getInt64(d));
    return b_.CreateSelect(b_.CreateICmpSGT(b_.CreateMul(q, b_.getInt64(d)), x), b_.CreateSub(q, b_.getInt64(1)), q);
  };
  auto ceil_div = [&](Value* x, int64_t d) { return b_.CreateNeg(floor_div(b_.CreateNeg(x), d)); };
  each_condition(Conditions::all, [&](const Polynomial& p, int64_t bound) {
    const Polynomial q = p.bind_dims(types_.dims);
    const Rational coeff = q.coefficient(r);
    if (coeff == Rational(0)) return;
    const int64_t a = coeff.num();  // integral (try_row_reduction)
    Value* b = poly(q, vars);       // the condition's value at r = 0
    Value* top = b_.CreateSub(b_.getInt64(bound - 1), b);  // a r <= bound - 1 - b
    Value* l = a > 0 ? ceil_div(b_.CreateNeg(b), a) : ceil_div(b_.CreateNeg(top), -a);
    Value* h = a > 0 ? floor_div(top, a) : floor_div(b, -a);
    lo = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, lo, l);
    hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, hi, h);
  });
  return {lo, hi};
}

}  // namespace polytile::llvm_ir::internal
