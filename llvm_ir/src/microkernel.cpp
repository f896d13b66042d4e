// NestEmitter (nest_emitter.h): the statements of a register-blocked micro-kernel (see Microkernel in
// scheduler.h): zero or load the accumulators, broadcast-and-vector fused multiply-adds, predicated rows
// and masked lanes in partial blocks, the store, and a fused epilogue on the accumulators.
#include "nest_emitter.h"

#include <functional>
#include <set>

namespace polytile::llvm_ir::internal {

Value* NestEmitter::in_range(Value* x, int64_t hi) { // 0 <= x < hi
  return b_.CreateAnd(b_.CreateICmpSGE(x, b_.getInt64(0)), b_.CreateICmpSLT(x, b_.getInt64(hi)));
}

void NestEmitter::each_condition(Conditions which, const std::function<void(const Polynomial&, int64_t)>& f) const {
  const Contraction& c = nest_.contraction;
  auto access = [&](const std::string& tensor, const std::vector<Polynomial>& idx) {
    const auto& shape = types_.tensors.at(tensor).shape;
    for (size_t k = 0; k < idx.size(); ++k) f(idx[k], shape[k]);
  };
  if (which != Conditions::inputs) access(c.output, c.output_indices);
  if (which == Conditions::output) return;
  for (const auto& a : c.inputs) access(a.tensor, a.indices);
  for (const auto& k : c.constraints) f(k.poly, k.bound.evaluate(types_.dims));
}

// The valid-point rule of the interpreter (every access in bounds, every constraint holds; the
// micro-kernel's index polynomials are integral) for one row of a block. Only the conditions on the
// block variable can differ between rows: the others hold at every point of the block's domain, which
// is the union of its rows' valid points. Conditions on the vector variable too differ between the
// row's lanes: they are cell_valid's.
Value* NestEmitter::valid(const std::map<std::string, Value*>& vars, Conditions which) {
  const std::string& b = nest_.variables[nest_.microkernel->block];
  const std::string& v = nest_.variables[nest_.microkernel->vector];
  Value* ok = b_.getTrue();
  each_condition(which, [&](const Polynomial& p, int64_t hi) {
    const Polynomial q = p.bind_dims(types_.dims);
    if (q.coefficient(b) == Rational(0) || q.coefficient(v) != Rational(0)) return;
    auto [x, den] = scaled_poly(q, vars);
    ok = b_.CreateAnd(ok, in_range(x, hi * den));
  });
  return ok;
}

Value* NestEmitter::lane_indices(unsigned lanes) {
  std::vector<llvm::Constant*> iota;
  for (unsigned l = 0; l < lanes; ++l) iota.push_back(b_.getInt64(l));
  return llvm::ConstantVector::get(iota);
}

// 0 <= q < hi * den at each of `lanes` lanes, q's value at lane l being its value at `at` (whose vector
// variable is the first lane's) plus l times v's coefficient.
Value* NestEmitter::lanes_in_range(const Polynomial& q, int64_t hi, const std::map<std::string, Value*>& at, unsigned lanes) {
  const std::string& v = nest_.variables[nest_.microkernel->vector];
  Value* steps = lane_indices(lanes);
  auto splat = [&](Value* x) { return b_.CreateVectorSplat(lanes, x); };
  auto [x, den] = scaled_poly(q, at);
  Value* lane = b_.CreateAdd(splat(x), b_.CreateMul(steps, splat(b_.getInt64((q.coefficient(v) * Rational(den)).num()))));
  return b_.CreateAnd(b_.CreateICmpSGE(lane, splat(b_.getInt64(0))), b_.CreateICmpSLT(lane, splat(b_.getInt64(hi * den))));
}

// The conditions on both the block and the vector variable (a strided conv's gradient writing
// DI[..., x0 + 2 * x1] with x1 its rows and x0 its lanes: the row's last column in range for lane 0, not
// for lane 1) at the lanes from `first` of the row at `vars`; null where there are none.
Value* NestEmitter::cell_valid(const std::map<std::string, Value*>& vars, Value* first, unsigned lanes, Conditions which) {
  const std::string& b = nest_.variables[nest_.microkernel->block];
  const std::string& v = nest_.variables[nest_.microkernel->vector];
  std::map<std::string, Value*> at = vars;
  at[v] = first;
  Value* ok = nullptr;
  each_condition(which, [&](const Polynomial& p, int64_t hi) {
    const Polynomial q = p.bind_dims(types_.dims);
    if (q.coefficient(b) == Rational(0) || q.coefficient(v) == Rational(0)) return;
    Value* in = lanes_in_range(q, hi, at, lanes);
    ok = ok ? b_.CreateAnd(ok, in) : in;
  });
  return ok;
}

Value* NestEmitter::lanes_valid(const std::map<std::string, Value*>& vars, Value* first, unsigned lanes) {
  const auto& mk = *nest_.microkernel;
  const std::string& v = nest_.variables[mk.vector];
  std::set<std::string> known{v};
  for (size_t k : mk.others) known.insert(nest_.variables[k]);
  // At a reduction point (an fma statement's), the lanes' conditions with the reductions too: the lanes of
  // a padded conv's border columns that the kernel position takes past the image.
  bool at_point = false;
  for (size_t k : mk.reductions)
    if (vars.count(nest_.variables[k])) {
      known.insert(nest_.variables[k]);
      at_point = true;
    }
  std::map<std::string, Value*> at = vars;
  at[v] = first;
  Value* ok = b_.CreateICmpSLE(b_.CreateAdd(b_.CreateVectorSplat(lanes, first), lane_indices(lanes)),
                               b_.CreateVectorSplat(lanes, b_.getInt64(mk.vector_hi)));
  each_condition(at_point ? Conditions::inputs : Conditions::all, [&](const Polynomial& p, int64_t hi) {
    const Polynomial q = p.bind_dims(types_.dims);
    if (q.coefficient(v) == Rational(0)) return;
    for (const auto& [name, coeff] : q.index_terms())
      if (!known.count(name)) return;  // with the block variable, or a reduction's outside an fma: implied (see Microkernel)
    ok = b_.CreateAnd(ok, lanes_in_range(q, hi, at, lanes));
  });
  return ok;
}

// The line holding `addr`, into all cache levels, for reading (every micro-kernel prefetch).
void NestEmitter::prefetch_line(Value* addr) {
  b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {addr->getType()}, {addr, b_.getInt32(0), b_.getInt32(3), b_.getInt32(1)});
}

// The micro-kernel's prefetches of a broadcast input (see Microkernel in scheduler.h) at a reduction step:
// `vars` are row 0's variables, `row0` the indices of the element it reads.
// With `row0_address` (an unpredicated block: that element's address as fma_address makes it; `row0` then
// unused), the addresses are made as the operands' are.
void NestEmitter::prefetch(const TensorAccess& a, const std::vector<Value*>& row0, const std::map<std::string, Value*>& vars,
                           Value* row0_address) {
  const auto& mk = *nest_.microkernel;
  if (mk.prefetch_bytes > 0)
    prefetch_line(b_.CreateGEP(b_.getInt8Ty(), row0_address ? row0_address : element_address(a.tensor, row0), b_.getInt64(mk.prefetch_bytes)));
  if (mk.prefetch_next_block) {
    // Row r mod rows of the next block, at this reduction point.
    const auto& names = nest_.variables;
    std::map<std::string, Value*> next = vars;
    Value* r = vars.at(names[mk.reductions.back()]);
    Value* rows = b_.getInt64(mk.rows);
    Value* row = b_.CreateSRem(b_.CreateAdd(b_.CreateSRem(r, rows), rows), rows);
    next[names[mk.block]] = b_.CreateAdd(vars.at(names[mk.block]), b_.getInt64(mk.rows));
    if (row0_address) {
      Value* at = fma_address(a.tensor, a.indices, next);
      prefetch_line(b_.CreateGEP(storage_type(types_.tensors.at(a.tensor).dtype), at,
                                 b_.CreateNSWMul(row, ix(flat_step(a.tensor, a.indices, names[mk.block])))));
      return;
    }
    next[names[mk.block]] = b_.CreateAdd(next[names[mk.block]], row);
    std::vector<Value*> at;
    for (const auto& p : a.indices) at.push_back(poly(p, next));
    prefetch_line(element_address(a.tensor, at));
  }
}

// The address of tensor[idx] at `vars`, as the element at the innermost reduction variable r = 0 advanced
// by r times the elements a step of r moves (the index polynomials of a micro-kernel are integral and
// affine). In the innermost fma loop, where r is the loop's counter, the first part is invariant and
// LICM takes it out of the loop: each operand is then a base register and r (scaled) in its addressing
// mode, or a constant stride from the last element, which is what Loop Strength Reduction made of the
// flattened index (3 lea and a shift per step in a 2x4 block without it), now without LSR, whose
// analysis of every address took 40% of a uniform block module's machine code (machine_code).
Value* NestEmitter::fma_address(const std::string& tensor, const std::vector<Polynomial>& idx, std::map<std::string, Value*> vars) {
  const std::string& r = nest_.variables[nest_.microkernel->reductions.back()];
  Value* counter = vars.at(r);
  vars[r] = ix(0);
  std::vector<Value*> at;
  for (const auto& p : idx) at.push_back(poly(p, vars));
  Value* base = element_address(tensor, at);
  const int64_t step = flat_step(tensor, idx, r);
  if (step == 0) return base;
  return b_.CreateGEP(storage_type(types_.tensors.at(tensor).dtype), base, b_.CreateNSWMul(counter, ix(step)));
}

// The elements between tensor[idx] at v and at v + 1 (idx integral and affine in v).
int64_t NestEmitter::flat_step(const std::string& tensor, const std::vector<Polynomial>& idx, const std::string& v) const {
  const auto& shape = types_.tensors.at(tensor).shape;
  int64_t step = 0, stride = 1;
  for (size_t k = idx.size(); k-- > 0;) {
    const Rational c = idx[k].bind_dims(types_.dims).coefficient(v);
    if (c.den() != 1) throw InternalError("a micro-kernel index of " + tensor + " is not integral in " + v);
    step += c.num() * stride;
    stride *= shape[k];
  }
  return step;
}

// load / fma / store of a micro-kernel block (see Microkernel in scheduler.h).
void NestEmitter::microkernel_statement(const sched::LoopNode& n) {
  using St = sched::LoopNode::Statement;
  const auto& mk = *nest_.microkernel;
  const auto& names = nest_.variables;
  const std::vector<Value*> vals = loop_exprs(n.args);
  const size_t no = mk.others.size();
  std::map<std::string, Value*> vars;
  for (size_t k = 0; k < no; ++k) vars[names[mk.others[k]]] = vals[k];
  if (n.statement == St::fma)
    for (size_t k = 0; k < mk.reductions.size(); ++k) vars[names[mk.reductions[k]]] = vals[no + 2 + k];
  const int64_t lanes = mk.lanes, vl = lanes * mk.chunks;
  Value* b0 = b_.CreateAdd(b_.getInt64(mk.block_lo), b_.CreateMul(vals[no], b_.getInt64(mk.rows)));
  Value* v0 = b_.CreateAdd(b_.getInt64(mk.vector_lo), b_.CreateMul(vals[no + 1], b_.getInt64(vl)));
  if (!n.predicated) {
    microkernel_rows(n, vars, b0, v0, nullptr);
    return;
  }
  // A predicated block: each row's validity and each chunk's lanes in range, made once for the statement.
  const Conditions which = n.statement == St::fma ? Conditions::inputs : Conditions::output;
  BlockValidity valid_at;
  for (int d = 0; d < mk.rows; ++d) {
    vars[names[mk.block]] = b_.CreateAdd(b0, b_.getInt64(d));
    vars[names[mk.vector]] = v0;
    valid_at.rows.push_back(valid(vars, which));
  }
  // Lanes the scheduler proved in range in every block (Microkernel::lanes_in_range) need no mask.
  for (int k = 0; k < mk.chunks; ++k)
    valid_at.lanes.push_back(mk.lanes_in_range ? llvm::Constant::getAllOnesValue(llvm::FixedVectorType::get(b_.getInt1Ty(), static_cast<unsigned>(lanes)))
                                               : lanes_valid(vars, b_.CreateAdd(v0, b_.getInt64(k * lanes)), static_cast<unsigned>(lanes)));
  // Conditions that couple rows and lanes are the same kinds in every cell: none at the first, none at all.
  for (int d = 0; d < mk.rows; ++d) {
    vars[names[mk.block]] = b_.CreateAdd(b0, b_.getInt64(d));
    for (int k = 0; k < mk.chunks; ++k)
      if (Value* cell = cell_valid(vars, b_.CreateAdd(v0, b_.getInt64(k * lanes)), static_cast<unsigned>(lanes), which))
        valid_at.cells.push_back(cell);
    if (valid_at.cells.empty()) break;
  }
  if (n.statement != St::fma) {
    microkernel_rows(n, vars, b0, v0, &valid_at);
    return;
  }
  // Its fused multiply-adds at a reduction point that every row has and with every lane in range run as
  // the uniform blocks' do: a branch on the rows' validity (scalar compares, the same at every point of
  // the innermost reduction loop where the border depends on an outer one), instead of a select per FMA.
  // Without AVX-512's merge masking that select is a blend on the FMA ports: the border blocks ran at half
  // speed (a third of a padded 3x3 conv's time on AVX2).
  Value* every = b_.getTrue();
  for (Value* row : valid_at.rows) every = b_.CreateAnd(every, row);
  for (Value* in_range : valid_at.lanes) every = b_.CreateAnd(every, b_.CreateAndReduce(in_range));
  for (Value* in_range : valid_at.cells) every = b_.CreateAnd(every, b_.CreateAndReduce(in_range));
  auto* all_bb = llvm::BasicBlock::Create(ctx_, "fma.all", fn_);
  auto* some_bb = llvm::BasicBlock::Create(ctx_, "fma.some", fn_);
  auto* join_bb = llvm::BasicBlock::Create(ctx_, "fma.join", fn_);
  b_.CreateCondBr(every, all_bb, some_bb);
  b_.SetInsertPoint(all_bb);
  microkernel_rows(n, vars, b0, v0, nullptr);
  b_.CreateBr(join_bb);
  b_.SetInsertPoint(some_bb);
  microkernel_rows(n, vars, b0, v0, &valid_at);
  b_.CreateBr(join_bb);
  b_.SetInsertPoint(join_bb);
}

// The statement on every row of the block: predicated by `valid_at` (rows and lanes), or not (null).
void NestEmitter::microkernel_rows(const sched::LoopNode& n, std::map<std::string, Value*> vars, Value* b0, Value* v0,
                                   const BlockValidity* valid_at) {
  using St = sched::LoopNode::Statement;
  if (n.statement == St::epilogue && nest_.permuted_copy) {
    permuted_store(vars, b0, v0, valid_at);
    return;
  }
  const auto& mk = *nest_.microkernel;
  const Contraction& c = nest_.contraction;
  const DType t = types_.tensors.at(nest_.tensor).dtype;
  const auto& names = nest_.variables;
  const int64_t lanes = mk.lanes;
  auto* ety = value_type(t);
  auto* vty = llvm::FixedVectorType::get(ety, static_cast<unsigned>(lanes));
  const llvm::Align align(dtype_bytes(t));
  // Lanes of chunk k inside the vector variable's range (predicated blocks only).
  const std::vector<Value*> no_mask;
  const std::vector<Value*>& lane_mask = valid_at ? valid_at->lanes : no_mask;
  auto address = [&](const std::string& tensor, const std::vector<Polynomial>& idx) {
    std::vector<Value*> at;
    for (const auto& p : idx) at.push_back(poly(p, vars));
    return element_address(tensor, at);
  };
  // An fma operand's address in an unpredicated block: row 0's and chunk 0's (see fma_address: invariant
  // in the innermost fma loop but for that loop's counter), then a constant offset for row d and chunk k
  // -- one base register for all rows and chunks of an operand, as Loop Strength Reduction made them.
  const bool split = n.statement == St::fma && !mk.reductions.empty() && !valid_at && !nest_.kernel;
  struct Operand {
    Value* base = nullptr;            // row 0, chunk 0
    int64_t row_step = 0, chunk_step = 0;  // elements from one row (chunk) to the next
  };
  std::vector<Operand> operands(c.inputs.size());
  auto operand_address = [&](size_t i, int d, int k) {
    const TensorAccess& a = c.inputs[i];
    Operand& o = operands[i];
    if (!o.base) {
      std::map<std::string, Value*> at = vars;
      at[names[mk.block]] = b0;
      at[names[mk.vector]] = v0;
      o.base = fma_address(a.tensor, a.indices, at);
      o.row_step = flat_step(a.tensor, a.indices, names[mk.block]);
      o.chunk_step = lanes * flat_step(a.tensor, a.indices, names[mk.vector]);
    }
    const int64_t offset = d * o.row_step + k * o.chunk_step;
    return offset == 0 ? o.base : b_.CreateGEP(storage_type(types_.tensors.at(a.tensor).dtype), o.base, ix(offset));
  };
  // Per input: read along v (a vector operand), and different for every row.
  auto depends = [](const Polynomial& p, const std::string& v) { return p.coefficient(v) != Rational(0); };
  auto uses = [&](const TensorAccess& a, const std::string& v) {
    return std::any_of(a.indices.begin(), a.indices.end(), [&](const Polynomial& p) { return depends(p, v); });
  };
  // An invalid row reads index 0 in the dimensions that depend on the block variable; the others are the
  // same in every row of the block, and some row is valid at every point a step runs (the step's points
  // are the block's), so they are in range. The reduction variables then stay out of the select, and the
  // select of a row's address is the same at every reduction point: hoisted out of the fma loop of the
  // border blocks (it was three instructions per row and point there).
  auto by_row = [&](const Polynomial& p) { return depends(p, names[mk.block]); };
  std::vector<bool> along_v, per_row;
  for (const auto& in : c.inputs) {
    along_v.push_back(uses(in, names[mk.vector]));
    per_row.push_back(uses(in, names[mk.block]));
  }
  // Microkernel::prefetch_vector_steps: chunk k of vector input i (at `at`), that many steps of the innermost
  // reduction variable ahead, once per cache line (chunks of 8 floats share one where they are consecutive).
  auto prefetch_vector = [&](size_t i, int k, Value* at) {
    const TensorAccess& a = c.inputs[i];
    const DType dt = types_.tensors.at(a.tensor).dtype;
    const int64_t bytes = k * lanes * static_cast<int64_t>(dtype_bytes(dt));
    if (operands[i].chunk_step == lanes && bytes % 64 != 0) return;
    const int64_t ahead = mk.prefetch_vector_steps * flat_step(a.tensor, a.indices, names[mk.reductions.back()]);
    prefetch_line(b_.CreateGEP(storage_type(dt), at, ix(ahead)));
  };
  for (int d = 0; d < mk.rows; ++d) {
    vars[names[mk.block]] = b_.CreateAdd(b0, b_.getInt64(d));
    vars[names[mk.vector]] = v0;
    Value* row = valid_at ? valid_at->rows[static_cast<size_t>(d)] : nullptr;
    std::vector<Value*> scalars(c.inputs.size(), nullptr);
    if (n.statement == St::fma) {
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        if (along_v[i]) continue;
        const bool loaded = !nest_.inlined.count(c.inputs[i].tensor);
        std::vector<Value*> at;  // the element's indices (a safe one for an invalid row), but for a split address
        if (!split || !loaded)
          for (const auto& p : c.inputs[i].indices) {
            Value* x = poly(p, vars);
            at.push_back(row && by_row(p) ? b_.CreateSelect(row, x, b_.getInt64(0)) : x);
          }
        if (d == 0 && per_row[i] && loaded) prefetch(c.inputs[i], at, vars, split ? operand_address(i, 0, 0) : nullptr);
        const Typed x = split && loaded ? load_address(types_.tensors.at(c.inputs[i].tensor).dtype, operand_address(i, d, 0))
                                        : input(c.inputs[i].tensor, at);
        scalars[i] = b_.CreateVectorSplat(static_cast<unsigned>(lanes), convert(x, t));
      }
    }
    for (int k = 0; k < mk.chunks; ++k) {
      vars[names[mk.vector]] = b_.CreateAdd(v0, b_.getInt64(k * lanes));
      llvm::AllocaInst* acc = acc_[static_cast<size_t>(d * mk.chunks + k)];
      Value* mask = row ? b_.CreateAnd(b_.CreateVectorSplat(static_cast<unsigned>(lanes), row), lane_mask[static_cast<size_t>(k)]) : nullptr;
      if (mask && !valid_at->cells.empty()) mask = b_.CreateAnd(mask, valid_at->cells[static_cast<size_t>(d * mk.chunks + k)]);
      auto vload = [&](Value* addr, Value* m) -> Value* {
        if (!m) return b_.CreateAlignedLoad(vty, addr, align);
        return b_.CreateMaskedLoad(vty, addr, align, m, llvm::Constant::getNullValue(vty));
      };
      switch (n.statement) {
        case St::zero: b_.CreateStore(llvm::Constant::getNullValue(vty), acc); break;
        case St::load: b_.CreateStore(vload(address(c.output, c.output_indices), mask), acc); break;
        case St::store: {
          Value* value = b_.CreateLoad(vty, acc);
          Value* addr = address(c.output, c.output_indices);
          if (mask) b_.CreateMaskedStore(value, addr, align, mask);
          else b_.CreateAlignedStore(value, addr, align);
          break;
        }
        case St::fma: {
          Value* x[2];
          // A vector operand that does not depend on the row is read once for all rows (lanes masked
          // only); an invalid row's product is then discarded by the select below.
          for (size_t i = 0; i < 2; ++i) {
            Value* m = per_row[i] || !mask ? mask : lane_mask[static_cast<size_t>(k)];
            if (scalars[i]) {
              x[i] = scalars[i];
            } else if (!nest_.inlined.count(c.inputs[i].tensor)) {
              Value* at = split ? operand_address(i, d, k) : address(c.inputs[i].tensor, c.inputs[i].indices);
              x[i] = vload(at, m);
              if (split && d == 0 && !per_row[i] && mk.prefetch_vector_steps > 0) prefetch_vector(i, k, at);
            } else {  // the producer, on the lanes
              std::vector<Value*> at;
              for (const auto& p : c.inputs[i].indices) {
                Value* x = poly(p, vars);
                at.push_back(row && by_row(p) ? b_.CreateSelect(row, x, b_.getInt64(0)) : x);
              }
              width_ = static_cast<unsigned>(lanes);
              mask_ = m;
              x[i] = convert(input(c.inputs[i].tensor, at), t);
              width_ = 0;
              mask_ = nullptr;
            }
          }
          Value* old = b_.CreateLoad(vty, acc);
          Value* sum = b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {vty}, {x[0], x[1], old});
          // An invalid row keeps its accumulator, and so does a lane invalid at this point (one that a
          // padded conv's kernel position takes past the image, whose masked load read 0: 0 times an
          // infinite weight would be NaN): selected lane by lane, which x86 makes a merge-masked FMA; a
          // select on the scalar became a branch around every FMA of the border blocks.
          if (row) sum = b_.CreateSelect(mask, sum, old);
          b_.CreateStore(sum, acc);
          break;
        }
        case St::epilogue: {
          // The elementwise consumer, on the finished accumulators; its lanes run along v.
          const Elementwise& e = *nest_.epilogue;
          if (!mk.prefetch_epilogue.empty()) {
            // Microkernel::prefetch_epilogue: this row's and chunk's lines of those inputs in the next block
            // (rows past the tensors' ends are prefetched too, which is harmless: the address is not inbounds).
            std::map<std::string, Value*> next = vars;
            next[names[mk.block]] = b_.CreateAdd(vars.at(names[mk.block]), b_.getInt64(mk.rows));
            std::vector<Value*> ahead;
            for (const auto& p : c.output_indices) ahead.push_back(poly(p, next));
            for (const std::string& t : mk.prefetch_epilogue) prefetch_line(element_address(t, broadcast_indices(t, ahead)));
          }
          llvm::BasicBlock* skip = nullptr;
          if (row) {  // rows whose output is out of range compute nothing
            auto* then_bb = llvm::BasicBlock::Create(ctx_, "epilogue.row", fn_);
            skip = llvm::BasicBlock::Create(ctx_, "epilogue.next", fn_);
            b_.CreateCondBr(row, then_bb, skip);
            b_.SetInsertPoint(then_bb);
          }
          std::vector<Value*> at;
          for (const auto& p : c.output_indices) at.push_back(poly(p, vars));
          width_ = static_cast<unsigned>(lanes);
          mask_ = row ? lane_mask[static_cast<size_t>(k)] : nullptr;
          if (row && !valid_at->cells.empty()) mask_ = b_.CreateAnd(mask_, valid_at->cells[static_cast<size_t>(d * mk.chunks + k)]);
          lanes_[c.output] = {b_.CreateLoad(vty, acc), t};
          const DType et = types_.tensors.at(e.output).dtype;
          Typed value = expr(e.expr, at);
          Value* v = to_storage(et, convert(value, et));
          Value* addr = element_address(e.output, at);
          llvm::Align ealign(dtype_bytes(et));
          if (mask_) b_.CreateMaskedStore(v, addr, ealign, mask_);
          else b_.CreateAlignedStore(v, addr, ealign);
          width_ = 0;
          mask_ = nullptr;
          lanes_.clear();
          if (skip) {
            b_.CreateBr(skip);
            b_.SetInsertPoint(skip);
          }
          break;
        }
        case St::plain:
        case St::copy:
        case St::acc_load:
        case St::acc_store: break;
      }
    }
  }
}

// The block's accumulators into the assign's output P, whose dims are the contraction output's in another
// order, with the block variable contiguous in P (the scheduler's condition: an NCHW conv's columns x,
// with its channels in the lanes). The rows of each lane are then one short vector in P: each chunk's
// rows x lanes are transposed in registers and stored lane by lane, rows wide. A predicated block masks
// its invalid rows and its lanes out of range.
//
// The transposition is a butterfly over groups of G rows (the rows' count rounded up to a power of two,
// at most the lanes; more rows take several groups): log2(G) stages, each combining pairs of vectors by
// two two-source shuffles, each one instruction (vpermt2ps with AVX-512), after which every vector holds
// lanes / G lanes' G rows one after another. A 6-row block of 16 lanes takes 24 shuffles a chunk. Until
// 2026-12-07 one shuffle of all the rows' concatenation made them, which LLVM lowered to 66 a chunk
// (ResNet's NCHW stem, 7x7 stride 2, 6 x 4 blocks: 264 shuffles against 3528 FMAs a block, on the FMAs'
// port).
void NestEmitter::permuted_store(std::map<std::string, Value*> vars, Value* b0, Value* v0, const BlockValidity* valid_at) {
  const auto& mk = *nest_.microkernel;
  const Contraction& c = nest_.contraction;
  const Contraction& copy = *nest_.permuted_copy;
  const auto& names = nest_.variables;
  const DType t = types_.tensors.at(nest_.tensor).dtype;
  const unsigned lanes = static_cast<unsigned>(mk.lanes), rows = static_cast<unsigned>(mk.rows);
  auto* ety = value_type(t);
  auto* vty = llvm::FixedVectorType::get(ety, lanes);
  const llvm::Align align(dtype_bytes(t));
  const std::vector<Polynomial> at = sched::permuted_indices(c, copy);
  const int64_t row_step = flat_step(copy.output, at, names[mk.block]), lane_step = flat_step(copy.output, at, names[mk.vector]);
  if (row_step != 1) throw InternalError("the permuted copy " + copy.output + " of " + c.output + " is not contiguous in its block variable");
  if ((lanes & (lanes - 1)) != 0) throw InternalError("permuted store of " + c.output + ": " + std::to_string(lanes) + " lanes, not a power of two");
  unsigned group = 1;  // G
  while (group < rows && group < lanes) group *= 2;
  vars[names[mk.block]] = b0;
  for (int k = 0; k < mk.chunks; ++k) {
    vars[names[mk.vector]] = b_.CreateAdd(v0, b_.getInt64(k * mk.lanes));
    std::vector<Value*> idx;
    for (const auto& p : at) idx.push_back(poly(p, vars));
    Value* base = element_address(copy.output, idx);  // row 0, lane 0 of the chunk
    Value* lane_mask = valid_at ? valid_at->lanes[static_cast<size_t>(k)] : nullptr;
    for (unsigned first = 0; first < rows; first += group) {
      const unsigned in_group = std::min(group, rows - first);
      // The group's rows, padded with poison to G, each element labelled with its (row, lane).
      std::vector<Value*> v(group);
      std::vector<std::vector<std::pair<unsigned, unsigned>>> label(group, std::vector<std::pair<unsigned, unsigned>>(lanes));
      for (unsigned r = 0; r < group; ++r) {
        v[r] = r < in_group ? static_cast<Value*>(b_.CreateLoad(vty, acc_[(first + r) * static_cast<unsigned>(mk.chunks) + static_cast<unsigned>(k)]))
                            : llvm::PoisonValue::get(vty);
        for (unsigned l = 0; l < lanes; ++l) label[r][l] = {r, l};
      }
      // Stage s pairs the vectors whose indices differ in bit s; output h of a pair takes, at position p,
      // from the pair's vector chosen by bit s of p, the element at p with bit s removed and h on top.
      unsigned log_lanes = 0;
      while ((1u << log_lanes) < lanes) ++log_lanes;
      for (unsigned s = 0; (1u << s) < group; ++s) {
        for (unsigned a = 0; a < group; ++a) {
          if (a & (1u << s)) continue;
          const unsigned b = a | (1u << s);
          Value* out[2];
          std::vector<std::pair<unsigned, unsigned>> out_label[2];
          for (unsigned h = 0; h < 2; ++h) {
            std::vector<int> mask;
            for (unsigned p = 0; p < lanes; ++p) {
              const unsigned from = (p >> s) & 1u;
              const unsigned src = (h << (log_lanes - 1)) | ((p >> (s + 1)) << s) | (p & ((1u << s) - 1));
              mask.push_back(static_cast<int>(from * lanes + src));
              out_label[h].push_back((from ? label[b] : label[a])[src]);
            }
            out[h] = b_.CreateShuffleVector(v[a], v[b], mask);
          }
          v[a] = out[0];
          v[b] = out[1];
          label[a] = out_label[0];
          label[b] = out_label[1];
        }
      }
      // Every vector now holds lanes / G segments, each one lane's G rows in order.
      for (unsigned w = 0; w < group; ++w)
        for (unsigned q = 0; q < lanes / group; ++q) {
          const unsigned l = label[w][q * group].second;
          for (unsigned r = 0; r < group; ++r)
            if (label[w][q * group + r] != std::pair{r, l})
              throw InternalError("permuted store of " + c.output + ": the transposition misplaced a row");
          // The whole segment, masked past the group's rows (one masked store, where a store of 6 rows took
          // three instructions: two pieces and an extract).
          std::vector<int> piece;
          for (unsigned r = 0; r < group; ++r) piece.push_back(static_cast<int>(q * group + r));
          Value* value = b_.CreateShuffleVector(v[w], piece);
          Value* addr = b_.CreateGEP(storage_type(t), base, ix(static_cast<int64_t>(l) * lane_step + first));
          if (!valid_at && in_group == group) {
            b_.CreateAlignedStore(value, addr, align);
            continue;
          }
          Value* mask = llvm::ConstantVector::getSplat(llvm::ElementCount::getFixed(group), b_.getFalse());
          for (unsigned r = 0; r < in_group; ++r) {
            Value* ok = valid_at ? valid_at->rows[first + r] : b_.getTrue();
            if (valid_at && !valid_at->cells.empty())
              ok = b_.CreateAnd(ok, b_.CreateExtractElement(valid_at->cells[(first + r) * static_cast<unsigned>(mk.chunks) + static_cast<unsigned>(k)],
                                                            b_.getInt64(l)));
            mask = b_.CreateInsertElement(mask, ok, b_.getInt64(r));
          }
          if (valid_at) mask = b_.CreateAnd(mask, b_.CreateVectorSplat(group, b_.CreateExtractElement(lane_mask, b_.getInt64(l))));
          b_.CreateMaskedStore(value, addr, align, mask);
        }
    }
  }
}

}  // namespace polytile::llvm_ir::internal
