// LLVM IR for scheduled loop nests. Data model: one LLVM function per Nest,
//   void nest_<k>(ptr buffers, i64 lo, i64 hi)
// where buffers[i] points at tensor i's elements (row-major; bool as i8). Loop iterators live in allocas
// (promoted to SSA by the optimizer); the outermost loop of a parallel nest only runs iterator values in
// [lo, hi). Statement bodies follow the dtype rules of ir.h: literals and dims enter as exact f64 values
// converted by the operation that consumes them, integer division floors (x / 0 = 0), i32 wraps,
// max/min propagate NaN.
#include "polytile/llvm_ir.h"

#include <llvm/IR/Module.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "polytile/error.h"

namespace polytile::llvm_ir {
namespace {

using llvm::Value;

struct Typed {
  Value* v;
  DType t;
};

class NestEmitter {
 public:
  NestEmitter(llvm::Module& m, const sched::Nest& nest, const ProgramTypes& types,
              const std::map<std::string, int>& buffer_index)
      : m_(m), ctx_(m.getContext()), b_(ctx_), nest_(nest), types_(types), buffer_index_(buffer_index) {}

  // The body takes one noalias pointer per tensor it touches (they are distinct buffers), so loads and
  // stores can be reordered and vectorized; the exported entry unpacks them from the buffer array.
  llvm::Function* emit(const std::string& name) {
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    std::vector<std::string> used = tensors_used();
    std::vector<llvm::Type*> params(used.size(), ptr);
    params.push_back(i64);
    params.push_back(i64);
    auto* body_ty = llvm::FunctionType::get(b_.getVoidTy(), params, false);
    fn_ = llvm::Function::Create(body_ty, llvm::Function::InternalLinkage, name + ".body", m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    for (size_t i = 0; i < used.size(); ++i) {
      fn_->getArg(static_cast<unsigned>(i))->setName(used[i]);
      fn_->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoAlias);
      ptrs_[used[i]] = fn_->getArg(static_cast<unsigned>(i));
    }
    lo_ = fn_->getArg(static_cast<unsigned>(used.size()));
    hi_ = fn_->getArg(static_cast<unsigned>(used.size() + 1));
    lo_->setName("lo");
    hi_->setName("hi");
    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry);
    for (int k = 0; k < nest_.iterators; ++k) iters_.push_back(b_.CreateAlloca(i64, nullptr, "c" + std::to_string(k)));
    if (nest_.microkernel || nest_.reduction) {  // the accumulators: one alloca per register, promoted to SSA
      int lanes = nest_.microkernel ? nest_.microkernel->lanes : nest_.reduction->lanes;
      int count = nest_.microkernel ? nest_.microkernel->rows * nest_.microkernel->chunks : nest_.reduction->accumulators;
      auto* vty = llvm::FixedVectorType::get(value_type(types_.tensors.at(nest_.tensor).dtype), static_cast<unsigned>(lanes));
      for (int k = 0; k < count; ++k) acc_.push_back(b_.CreateAlloca(vty, nullptr, "acc" + std::to_string(k)));
    }
    node(nest_.root, true);
    b_.CreateRetVoid();

    auto* entry_ty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, i64}, false);
    llvm::Function* outer = llvm::Function::Create(entry_ty, llvm::Function::ExternalLinkage, name, m_);
    outer->addFnAttr(llvm::Attribute::NoUnwind);
    llvm::IRBuilder<> ob(llvm::BasicBlock::Create(ctx_, "entry", outer));
    std::vector<Value*> args;
    for (const auto& t : used) {
      Value* slot = ob.CreateGEP(ob.getPtrTy(), outer->getArg(0), ob.getInt64(buffer_index_.at(t)));
      args.push_back(ob.CreateLoad(ob.getPtrTy(), slot, t));
    }
    args.push_back(outer->getArg(1));
    args.push_back(outer->getArg(2));
    ob.CreateCall(fn_, args);
    ob.CreateRetVoid();
    return outer;
  }

  std::vector<std::string> tensors_used() const { return nest_tensors(nest_); }

 public:
  static std::vector<std::string> nest_tensors(const sched::Nest& nest_) {
    std::vector<std::string> used{nest_.tensor};
    auto add = [&used](const std::string& t) {
      if (std::find(used.begin(), used.end(), t) == used.end()) used.push_back(t);
    };
    if (nest_.kind == sched::Nest::Kind::elementwise) {
      std::vector<std::string> leaves;
      nest_.elementwise.expr.collect_tensors(leaves);
      for (const auto& t : leaves) add(t);
    } else {
      for (const auto& a : nest_.contraction.inputs) {
        auto in = nest_.inlined.find(a.tensor);
        if (in == nest_.inlined.end() || nest_.kind != sched::Nest::Kind::update) {
          add(a.tensor);
          continue;
        }
        std::vector<std::string> leaves;
        in->second.expr.collect_tensors(leaves);
        for (const auto& t : leaves) add(t);
      }
      if (nest_.contraction.init) add(*nest_.contraction.init);
      if (nest_.epilogue) {
        add(nest_.epilogue->output);
        std::vector<std::string> leaves;
        nest_.epilogue->expr.collect_tensors(leaves);
        for (const auto& t : leaves) add(t);
      }
    }
    return used;
  }

 private:
  // ------------------------------------------------------------------ loops
  Value* loop_expr(const sched::LoopExpr& a) {
    using K = sched::LoopExpr::Kind;
    auto* i64 = b_.getInt64Ty();
    switch (a.kind) {
      case K::constant: return b_.getInt64(a.value);
      case K::iterator: return b_.CreateLoad(i64, iters_.at(a.iterator));
      case K::add: return b_.CreateAdd(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::sub: return b_.CreateSub(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::mul: return b_.CreateMul(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::floordiv: return floor_div(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::mod: return floor_mod(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::min:
      case K::max: {  // isl's min and max take two or more arguments
        Value* r = loop_expr(a.args[0]);
        for (size_t i = 1; i < a.args.size(); ++i) {
          Value* y = loop_expr(a.args[i]);
          r = b_.CreateSelect(a.kind == K::min ? b_.CreateICmpSLT(r, y) : b_.CreateICmpSGT(r, y), r, y);
        }
        return r;
      }
      case K::neg: return b_.CreateNeg(loop_expr(a.args[0]));
      case K::select: return b_.CreateSelect(cond(a.args[0]), loop_expr(a.args[1]), loop_expr(a.args[2]));
      default: return b_.CreateZExt(cond(a), i64);
    }
  }

  Value* cond(const sched::LoopExpr& a) {
    using K = sched::LoopExpr::Kind;
    switch (a.kind) {
      case K::eq: return b_.CreateICmpEQ(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::le: return b_.CreateICmpSLE(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::lt: return b_.CreateICmpSLT(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::ge: return b_.CreateICmpSGE(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::gt: return b_.CreateICmpSGT(loop_expr(a.args[0]), loop_expr(a.args[1]));
      case K::land: return b_.CreateAnd(cond(a.args[0]), cond(a.args[1]));
      case K::lor: return b_.CreateOr(cond(a.args[0]), cond(a.args[1]));
      default: return b_.CreateICmpNE(loop_expr(a), b_.getInt64(0));
    }
  }

  Value* floor_div(Value* x, Value* y) {
    Value* q = b_.CreateSDiv(x, y);
    Value* r = b_.CreateSRem(x, y);
    Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, b_.getInt64(0)),
                                 b_.CreateICmpNE(b_.CreateICmpSLT(r, b_.getInt64(0)), b_.CreateICmpSLT(y, b_.getInt64(0))));
    return b_.CreateSub(q, b_.CreateZExt(adjust, b_.getInt64Ty()));
  }

  Value* floor_mod(Value* x, Value* y) {
    Value* r = b_.CreateSRem(x, y);
    Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, b_.getInt64(0)),
                                 b_.CreateICmpNE(b_.CreateICmpSLT(r, b_.getInt64(0)), b_.CreateICmpSLT(y, b_.getInt64(0))));
    return b_.CreateSelect(adjust, b_.CreateAdd(r, y), r);
  }

  void node(const sched::LoopNode& n, bool outermost) {
    using K = sched::LoopNode::Kind;
    switch (n.kind) {
      case K::block:  // the root block of a parallel nest holds loops over the split dimension
        for (const auto& c : n.body) node(c, outermost);
        return;
      case K::guard: {
        auto* then_bb = llvm::BasicBlock::Create(ctx_, "then", fn_);
        auto* else_bb = n.otherwise.empty() ? nullptr : llvm::BasicBlock::Create(ctx_, "else", fn_);
        auto* cont_bb = llvm::BasicBlock::Create(ctx_, "endif", fn_);
        b_.CreateCondBr(cond(n.condition), then_bb, else_bb ? else_bb : cont_bb);
        b_.SetInsertPoint(then_bb);
        for (const auto& c : n.body) node(c, false);
        b_.CreateBr(cont_bb);
        if (else_bb) {
          b_.SetInsertPoint(else_bb);
          for (const auto& c : n.otherwise) node(c, false);
          b_.CreateBr(cont_bb);
        }
        b_.SetInsertPoint(cont_bb);
        return;
      }
      case K::statement:
        if (n.statement == sched::LoopNode::Statement::plain) statement(n.args);
        else if (nest_.reduction) reduction_statement(n);
        else microkernel_statement(n);
        return;
      case K::loop: break;
    }
    bool split = outermost && n.parallel;
    llvm::AllocaInst* it = iters_.at(n.iterator);
    Value* start = loop_expr(n.lower);
    if (split) {  // first value >= lo in the progression lower + k*step
      Value* step = b_.getInt64(n.step);
      Value* distance = b_.CreateSub(lo_, start);
      Value* k = floor_div(b_.CreateAdd(distance, b_.getInt64(n.step - 1)), step);
      Value* aligned = b_.CreateAdd(start, b_.CreateMul(k, step));
      start = b_.CreateSelect(b_.CreateICmpSGT(aligned, start), aligned, start);
    }
    b_.CreateStore(start, it);
    auto* cond_bb = llvm::BasicBlock::Create(ctx_, "loop.cond", fn_);
    auto* body_bb = llvm::BasicBlock::Create(ctx_, "loop.body", fn_);
    auto* exit_bb = llvm::BasicBlock::Create(ctx_, "loop.exit", fn_);
    b_.CreateBr(cond_bb);
    b_.SetInsertPoint(cond_bb);
    Value* c = cond(n.condition);
    if (split) c = b_.CreateAnd(c, b_.CreateICmpSLT(b_.CreateLoad(b_.getInt64Ty(), it), hi_));
    b_.CreateCondBr(c, body_bb, exit_bb);
    b_.SetInsertPoint(body_bb);
    for (const auto& child : n.body) node(child, false);
    b_.CreateStore(b_.CreateAdd(b_.CreateLoad(b_.getInt64Ty(), it), b_.getInt64(n.step)), it);
    b_.CreateBr(cond_bb);
    b_.SetInsertPoint(exit_bb);
  }

  // ------------------------------------------------------------------ values
  llvm::Type* storage_type(DType t) {
    switch (t) {
      case DType::f32: return b_.getFloatTy();
      case DType::f64: return b_.getDoubleTy();
      case DType::i32: return b_.getInt32Ty();
      case DType::boolean: return b_.getInt8Ty();
    }
    return nullptr;
  }
  // Expressions are evaluated on scalars, or on vectors of width_ lanes (a micro-kernel's epilogue).
  llvm::Type* widen(llvm::Type* scalar) { return width_ ? llvm::FixedVectorType::get(scalar, width_) : scalar; }
  llvm::Type* value_type(DType t) { return widen(t == DType::boolean ? b_.getInt1Ty() : storage_type(t)); }
  Value* i32(int32_t v) { return llvm::ConstantInt::get(widen(b_.getInt32Ty()), static_cast<uint64_t>(static_cast<int64_t>(v)), true); }

  Value* buffer(const std::string& tensor) { return ptrs_.at(tensor); }

  Typed load(const std::string& tensor, Value* offset) {
    DType t = types_.tensors.at(tensor).dtype;
    Value* addr = b_.CreateGEP(storage_type(t), buffer(tensor), offset);
    Value* v = b_.CreateLoad(storage_type(t), addr);
    if (t == DType::boolean) v = b_.CreateICmpNE(v, b_.getInt8(0));
    return {v, t};
  }

  void store(const std::string& tensor, Value* offset, Typed value) {
    DType t = types_.tensors.at(tensor).dtype;
    Value* v = convert(value, t);
    if (t == DType::boolean) v = b_.CreateZExt(v, b_.getInt8Ty());
    b_.CreateStore(v, b_.CreateGEP(storage_type(t), buffer(tensor), offset));
  }

  // round_to semantics of buffer.h: f32 rounds, i32 truncates and wraps (NaN -> 0), bool is != 0.
  Value* convert(Typed x, DType to) {
    if (x.t == to) return x.v;
    switch (to) {
      case DType::f32:
      case DType::f64: {
        llvm::Type* ty = value_type(to);
        if (is_float(x.t)) return b_.CreateFPCast(x.v, ty);
        if (x.t == DType::boolean) return b_.CreateUIToFP(x.v, ty);
        return b_.CreateSIToFP(x.v, ty);
      }
      case DType::i32:
        if (x.t == DType::boolean) return b_.CreateZExt(x.v, widen(b_.getInt32Ty()));
        {
          // trunc, then wrap modulo 2^32: r = t - 2^32 * round(t / 2^32) lies in [-2^31, 2^31] and is exact
          // in floating point (below 2^31 nothing changes; above, t is a multiple of 2^8 in f32, so r fits
          // the significand), so it converts exactly and truncating to i32 wraps; inf and NaN give 0.
          llvm::Type* fty = x.v->getType();
          Value* t = b_.CreateUnaryIntrinsic(llvm::Intrinsic::trunc, x.v);
          Value* q = b_.CreateUnaryIntrinsic(llvm::Intrinsic::round, b_.CreateFMul(t, llvm::ConstantFP::get(fty, 0x1p-32)));
          Value* r = b_.CreateFSub(t, b_.CreateFMul(q, llvm::ConstantFP::get(fty, 0x1p32)));
          Value* finite = b_.CreateFCmpOLT(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x.v),
                                           llvm::ConstantFP::getInfinity(fty));
          r = b_.CreateSelect(finite, r, llvm::Constant::getNullValue(fty));
          return b_.CreateTrunc(b_.CreateFPToSI(r, widen(b_.getInt64Ty())), widen(b_.getInt32Ty()));
        }
      case DType::boolean:
        if (is_float(x.t)) return b_.CreateFCmpUNE(x.v, llvm::ConstantFP::get(x.v->getType(), 0.0));
        return b_.CreateICmpNE(x.v, llvm::ConstantInt::get(x.v->getType(), 0));
    }
    return nullptr;
  }

  Typed constant(double v, DType t) {
    switch (t) {
      case DType::f32:
      case DType::f64: return {llvm::ConstantFP::get(value_type(t), v), t};
      case DType::i32: return {i32(static_cast<int32_t>(v)), t};
      case DType::boolean: return {llvm::ConstantInt::get(value_type(t), v != 0 ? 1 : 0), t};
    }
    return {nullptr, t};
  }

  Value* fn_call(const char* name, Typed x) {
    bool f32 = x.t == DType::f32;
    llvm::Type* ty = x.v->getType()->getScalarType();
    llvm::FunctionCallee callee = m_.getOrInsertFunction(std::string(name) + (f32 ? "f" : ""), ty, ty);
    if (!width_) return b_.CreateCall(callee, {x.v});
    Value* out = llvm::UndefValue::get(x.v->getType());  // libm has no vector versions: lane by lane
    for (unsigned l = 0; l < width_; ++l)
      out = b_.CreateInsertElement(out, b_.CreateCall(callee, {b_.CreateExtractElement(x.v, l)}), l);
    return out;
  }

  Value* intrinsic(llvm::Intrinsic::ID id, std::vector<Value*> args) {
    return b_.CreateIntrinsic(id, {args[0]->getType()}, args);
  }

  // Floor division / modulo on i32 with x / 0 = 0 and INT_MIN / -1 wrapping, as the interpreter does.
  Value* int_div(Value* x, Value* y, bool mod) {
    Value* zero = i32(0);
    Value* safe_y = b_.CreateSelect(b_.CreateICmpEQ(y, zero), i32(1), y);
    Value* minus_one = b_.CreateICmpEQ(safe_y, i32(-1));
    safe_y = b_.CreateSelect(minus_one, i32(1), safe_y);
    Value* q = b_.CreateSDiv(x, safe_y);
    Value* r = b_.CreateSRem(x, safe_y);
    Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, zero), b_.CreateICmpNE(b_.CreateICmpSLT(r, zero), b_.CreateICmpSLT(safe_y, zero)));
    Value* fq = b_.CreateSub(q, b_.CreateZExt(adjust, widen(b_.getInt32Ty())));
    Value* fr = b_.CreateSelect(adjust, b_.CreateAdd(r, safe_y), r);
    Value* result = mod ? fr : fq;
    Value* by_minus_one = mod ? zero : b_.CreateNeg(x);
    result = b_.CreateSelect(minus_one, by_minus_one, result);
    return b_.CreateSelect(b_.CreateICmpEQ(y, zero), zero, result);
  }

  Typed arith(BinaryOp op, Typed a, Typed b, DType t) {
    Value *x = convert(a, t), *y = convert(b, t);
    if (is_float(t)) {
      switch (op) {
        case BinaryOp::add: return {b_.CreateFAdd(x, y), t};
        case BinaryOp::sub: return {b_.CreateFSub(x, y), t};
        case BinaryOp::mul: return {b_.CreateFMul(x, y), t};
        case BinaryOp::div: return {b_.CreateFDiv(x, y), t};
        case BinaryOp::mod: return {b_.CreateFRem(x, y), t};
        default: break;
      }
    } else {
      switch (op) {
        case BinaryOp::add: return {b_.CreateAdd(x, y), t};
        case BinaryOp::sub: return {b_.CreateSub(x, y), t};
        case BinaryOp::mul: return {b_.CreateMul(x, y), t};
        case BinaryOp::div: return {int_div(x, y, false), t};
        case BinaryOp::mod: return {int_div(x, y, true), t};
        default: break;
      }
    }
    POLYTILE_CHECK(false, "not an arithmetic operator");
  }

  Value* compare(BinaryOp op, Typed a, Typed b, DType t) {
    Value *x = convert(a, t), *y = convert(b, t);
    if (is_float(t)) {
      switch (op) {
        case BinaryOp::eq: return b_.CreateFCmpOEQ(x, y);
        case BinaryOp::ne: return b_.CreateFCmpUNE(x, y);
        case BinaryOp::lt: return b_.CreateFCmpOLT(x, y);
        case BinaryOp::gt: return b_.CreateFCmpOGT(x, y);
        case BinaryOp::le: return b_.CreateFCmpOLE(x, y);
        case BinaryOp::ge: return b_.CreateFCmpOGE(x, y);
        default: break;
      }
    } else if (t == DType::boolean) {  // false < true: i1 compares unsigned (signed, true is -1)
      switch (op) {
        case BinaryOp::eq: return b_.CreateICmpEQ(x, y);
        case BinaryOp::ne: return b_.CreateICmpNE(x, y);
        case BinaryOp::lt: return b_.CreateICmpULT(x, y);
        case BinaryOp::gt: return b_.CreateICmpUGT(x, y);
        case BinaryOp::le: return b_.CreateICmpULE(x, y);
        case BinaryOp::ge: return b_.CreateICmpUGE(x, y);
        default: break;
      }
    } else {
      switch (op) {
        case BinaryOp::eq: return b_.CreateICmpEQ(x, y);
        case BinaryOp::ne: return b_.CreateICmpNE(x, y);
        case BinaryOp::lt: return b_.CreateICmpSLT(x, y);
        case BinaryOp::gt: return b_.CreateICmpSGT(x, y);
        case BinaryOp::le: return b_.CreateICmpSLE(x, y);
        case BinaryOp::ge: return b_.CreateICmpSGE(x, y);
        default: break;
      }
    }
    POLYTILE_CHECK(false, "not a comparison");
  }

  // An elementwise expression at output index `idx` (broadcasting like the interpreter).
  Typed expr(const Expr& e, const std::vector<Value*>& idx) {
    const auto& ts = types_.tensors;
    switch (e.kind()) {
      case Expr::Kind::tensor: {
        auto given = lanes_.find(e.name());
        if (width_ && given != lanes_.end()) return given->second;
        const auto& shape = ts.at(e.name()).shape;
        size_t off = idx.size() - shape.size();
        Value* flat = b_.getInt64(0);
        for (size_t k = 0; k < shape.size(); ++k) {
          Value* i = shape[k] == 1 ? b_.getInt64(0) : idx[off + k];
          flat = b_.CreateAdd(b_.CreateMul(flat, b_.getInt64(shape[k])), i);
        }
        if (!width_) return load(e.name(), flat);
        // Vector lanes run along the last index: contiguous unless broadcast there.
        DType t = ts.at(e.name()).dtype;
        Value* addr = b_.CreateGEP(storage_type(t), buffer(e.name()), flat);
        Value* v = nullptr;
        if (shape.empty() || shape.back() == 1) {
          v = b_.CreateVectorSplat(width_, b_.CreateLoad(storage_type(t), addr));
        } else {
          auto* vty = llvm::FixedVectorType::get(storage_type(t), width_);
          llvm::Align align(dtype_bytes(t));
          v = mask_ ? static_cast<Value*>(b_.CreateMaskedLoad(vty, addr, align, mask_, llvm::Constant::getNullValue(vty)))
                    : b_.CreateAlignedLoad(vty, addr, align);
        }
        if (t == DType::boolean) v = b_.CreateICmpNE(v, llvm::Constant::getNullValue(v->getType()));
        return {v, t};
      }
      case Expr::Kind::literal: return constant(e.value(), DType::f64);  // exact; consumers convert
      case Expr::Kind::dim: return constant(static_cast<double>(types_.dims.at(e.name())), DType::f64);
      default: break;
    }
    const DType result = expr_type(e, ts).dtype;
    std::vector<Typed> args;
    for (const auto& a : e.args()) args.push_back(expr(a, idx));
    if (e.kind() == Expr::Kind::unary) {
      if (e.unary_op() == UnaryOp::logical_not) return {b_.CreateNot(convert(args[0], DType::boolean)), DType::boolean};
      Value* x = convert(args[0], result);
      return {is_float(result) ? b_.CreateFNeg(x) : b_.CreateNeg(x), result};
    }
    if (e.kind() == Expr::Kind::binary) {
      ExprType ct = combine_types(expr_type(e.args()[0], ts), expr_type(e.args()[1], ts));
      BinaryOp op = e.binary_op();
      switch (op) {
        case BinaryOp::add:
        case BinaryOp::sub:
        case BinaryOp::mul:
        case BinaryOp::div:
        case BinaryOp::mod: return arith(op, args[0], args[1], ct.dtype == DType::boolean ? DType::i32 : ct.dtype);
        case BinaryOp::logical_and:
          return {b_.CreateAnd(convert(args[0], DType::boolean), convert(args[1], DType::boolean)), DType::boolean};
        case BinaryOp::logical_or:
          return {b_.CreateOr(convert(args[0], DType::boolean), convert(args[1], DType::boolean)), DType::boolean};
        default: return {compare(op, args[0], args[1], ct.dtype), DType::boolean};
      }
    }
    // Calls.
    Intrinsic fn = e.intrinsic();
    if (fn == Intrinsic::select) {
      Value* c = convert(args[0], DType::boolean);
      return {b_.CreateSelect(c, convert(args[1], result), convert(args[2], result)), result};
    }
    if (fn == Intrinsic::cast) return {convert(args[0], result), result};
    if (fn == Intrinsic::ident) return {convert(args[0], result), result};
    if (fn == Intrinsic::max || fn == Intrinsic::min || fn == Intrinsic::pow) {
      Value *x = convert(args[0], result), *y = convert(args[1], result);
      bool is_max = fn == Intrinsic::max;
      if (fn == Intrinsic::pow) return {intrinsic(llvm::Intrinsic::pow, {x, y}), result};
      if (is_float(result)) return {nan_max_min(is_max, x, y), result};
      if (result == DType::boolean) return {is_max ? b_.CreateOr(x, y) : b_.CreateAnd(x, y), result};
      return {intrinsic(is_max ? llvm::Intrinsic::smax : llvm::Intrinsic::smin, {x, y}), result};
    }
    Typed x{convert(args[0], result), result};
    if (!is_float(result)) {  // integer versions
      Value* v = x.v;
      switch (fn) {
        case Intrinsic::abs: return {b_.CreateIntrinsic(llvm::Intrinsic::abs, {v->getType()}, {v, b_.getFalse()}), result};
        case Intrinsic::sign:
          return {b_.CreateSub(b_.CreateZExt(b_.CreateICmpSGT(v, i32(0)), widen(b_.getInt32Ty())),
                               b_.CreateZExt(b_.CreateICmpSLT(v, i32(0)), widen(b_.getInt32Ty()))),
                  result};
        case Intrinsic::relu: return {intrinsic(llvm::Intrinsic::smax, {v, i32(0)}), result};
        case Intrinsic::floor:
        case Intrinsic::ceil:
        case Intrinsic::round: return x;
        default: POLYTILE_CHECK(false, "integer ", to_string(fn));
      }
    }
    Value* v = x.v;
    llvm::Type* ty = v->getType();
    auto fc = [&](double c) { return llvm::ConstantFP::get(ty, c); };
    switch (fn) {
      case Intrinsic::abs: return {intrinsic(llvm::Intrinsic::fabs, {v}), result};
      case Intrinsic::sign:
        return {b_.CreateSelect(b_.CreateFCmpOGT(v, fc(0)), fc(1), b_.CreateSelect(b_.CreateFCmpOLT(v, fc(0)), fc(-1), v)), result};
      case Intrinsic::exp: return {intrinsic(llvm::Intrinsic::exp, {v}), result};
      case Intrinsic::log: return {intrinsic(llvm::Intrinsic::log, {v}), result};
      case Intrinsic::sqrt: return {intrinsic(llvm::Intrinsic::sqrt, {v}), result};
      case Intrinsic::sin: return {intrinsic(llvm::Intrinsic::sin, {v}), result};
      case Intrinsic::cos: return {intrinsic(llvm::Intrinsic::cos, {v}), result};
      case Intrinsic::floor: return {intrinsic(llvm::Intrinsic::floor, {v}), result};
      case Intrinsic::ceil: return {intrinsic(llvm::Intrinsic::ceil, {v}), result};
      case Intrinsic::round: return {intrinsic(llvm::Intrinsic::round, {v}), result};
      case Intrinsic::tan: return {fn_call("tan", x), result};
      case Intrinsic::asin: return {fn_call("asin", x), result};
      case Intrinsic::acos: return {fn_call("acos", x), result};
      case Intrinsic::atan: return {fn_call("atan", x), result};
      case Intrinsic::sinh: return {fn_call("sinh", x), result};
      case Intrinsic::cosh: return {fn_call("cosh", x), result};
      case Intrinsic::tanh: return {fn_call("tanh", x), result};
      case Intrinsic::erf: return {fn_call("erf", x), result};
      case Intrinsic::sigmoid:
        return {b_.CreateFDiv(fc(1), b_.CreateFAdd(fc(1), intrinsic(llvm::Intrinsic::exp, {b_.CreateFNeg(v)}))), result};
      case Intrinsic::relu:
        return {b_.CreateSelect(b_.CreateFCmpUGT(v, fc(0)), v, fc(0)), result};  // NaN stays NaN
      default: break;
    }
    POLYTILE_CHECK(false, "unhandled intrinsic ", to_string(fn));
  }

  // ------------------------------------------------------------------ statements
  Value* flat_index(const std::string& tensor, const std::vector<Value*>& idx) {
    const auto& shape = types_.tensors.at(tensor).shape;
    Value* flat = b_.getInt64(0);
    for (size_t k = 0; k < shape.size(); ++k) flat = b_.CreateAdd(b_.CreateMul(flat, b_.getInt64(shape[k])), idx[k]);
    return flat;
  }

  // An index polynomial (dims bound) at the statement's variable values; exact division by its
  // denominator (the domain guarantees integrality).
  Value* poly(const Polynomial& p, const std::map<std::string, Value*>& vars) {
    auto [s, den] = scaled_poly(p, vars);
    return den == 1 ? s : b_.CreateExactSDiv(s, b_.getInt64(den));
  }

  // A contraction input at index `idx`: loaded, or computed by its inlined elementwise producer (rounded
  // to the producer's dtype, as the materialized tensor would be). Vector-wide when width_ is set.
  Typed input(const std::string& tensor, const std::vector<Value*>& idx) {
    auto in = nest_.inlined.find(tensor);
    if (in == nest_.inlined.end()) {
      if (!width_) return load(tensor, flat_index(tensor, idx));
      return expr(Expr::tensor(tensor), idx);
    }
    DType t = types_.tensors.at(tensor).dtype;
    return {convert(expr(in->second.expr, idx), t), t};
  }

  // The polynomial times its denominator, at the given variable values, and that denominator.
  std::pair<Value*, int64_t> scaled_poly(const Polynomial& p, const std::map<std::string, Value*>& vars) {
    Polynomial q = p.bind_dims(types_.dims);
    int64_t den = q.constant().den();
    for (const auto& [v, c] : q.index_terms()) den = std::lcm(den, c.den());
    Value* s = b_.getInt64((q.constant() * Rational(den)).num());
    for (const auto& [v, c] : q.index_terms())
      s = b_.CreateAdd(s, b_.CreateMul(vars.at(v), b_.getInt64((c * Rational(den)).num())));
    return {s, den};
  }

  Typed identity(AggregationOp op, DType t) {
    double inf = std::numeric_limits<double>::infinity();
    switch (op) {
      case AggregationOp::sum:
      case AggregationOp::assign: return constant(0, t);
      case AggregationOp::product: return constant(1, t);
      case AggregationOp::max:
        if (t == DType::i32) return constant(std::numeric_limits<int32_t>::min(), t);
        return constant(t == DType::boolean ? 0 : -inf, t);
      case AggregationOp::min:
        if (t == DType::i32) return constant(std::numeric_limits<int32_t>::max(), t);
        return constant(t == DType::boolean ? 1 : inf, t);
    }
    return constant(0, t);
  }

  // max/min that propagate NaN, selecting exactly as the interpreter does (llvm.maximum does not lower
  // on x86 in LLVM 16). Elementwise max(a, b) is std::max: a < b ? b : a.
  Value* nan_max_min(bool is_max, Value* a, Value* b) {
    Value* pick = is_max ? b_.CreateSelect(b_.CreateFCmpOLT(a, b), b, a) : b_.CreateSelect(b_.CreateFCmpOLT(b, a), b, a);
    return b_.CreateSelect(b_.CreateFCmpUNO(a, b), b_.CreateFAdd(a, b), pick);
  }
  // The accumulator takes v when v > acc (max) or v < acc (min); any NaN makes the result NaN.
  Value* nan_accumulate(bool is_max, Value* acc, Value* v) {
    Value* better = is_max ? b_.CreateFCmpOGT(v, acc) : b_.CreateFCmpOLT(v, acc);
    return b_.CreateSelect(b_.CreateFCmpUNO(acc, v), b_.CreateFAdd(acc, v), b_.CreateSelect(better, v, acc));
  }

  Value* accumulate(AggregationOp op, Value* acc, Value* v, DType t) {
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


  void statement(const std::vector<sched::LoopExpr>& args) {
    std::vector<Value*> vals;
    for (const auto& a : args) vals.push_back(loop_expr(a));
    using NK = sched::Nest::Kind;
    const TensorType& out = types_.tensors.at(nest_.tensor);
    switch (nest_.kind) {
      case NK::elementwise: {
        store(nest_.tensor, flat_index(nest_.tensor, vals), expr(nest_.elementwise.expr, vals));
        return;
      }
      case NK::finalize: store(nest_.tensor, flat_index(nest_.tensor, vals), constant(0, out.dtype)); return;
      case NK::init: {
        const Contraction& c = nest_.contraction;
        if (c.init) {
          store(nest_.tensor, flat_index(nest_.tensor, vals), expr(Expr::tensor(*c.init), vals));
        } else {
          store(nest_.tensor, flat_index(nest_.tensor, vals), identity(c.aggregation, out.dtype));
        }
        return;
      }
      case NK::update: break;
    }
    const Contraction& c = nest_.contraction;
    std::map<std::string, Value*> vars;
    for (size_t k = 0; k < nest_.variables.size(); ++k) vars[nest_.variables[k]] = vals[k];
    std::vector<Value*> out_idx;
    for (const auto& p : c.output_indices) out_idx.push_back(poly(p, vars));
    Value* out_off = flat_index(c.output, out_idx);
    std::vector<Typed> in;
    for (const auto& a : c.inputs) {
      std::vector<Value*> idx;
      for (const auto& p : a.indices) idx.push_back(poly(p, vars));
      in.push_back(input(a.tensor, idx));
    }
    llvm::BasicBlock* skip = nullptr;
    Typed value{nullptr, out.dtype};
    switch (c.combination) {
      case CombinationOp::none: value = in[0]; break;
      case CombinationOp::mul:
      case CombinationOp::add: {
        DType t = promote(promote(in[0].t, in[1].t), DType::i32);
        value = arith(c.combination == CombinationOp::mul ? BinaryOp::mul : BinaryOp::add, in[0], in[1], t);
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
      Typed acc = load(c.output, out_off);
      v = accumulate(c.aggregation, acc.v, v, out.dtype);
    }
    store(c.output, out_off, {v, out.dtype});
    if (skip) {
      b_.CreateBr(skip);
      b_.SetInsertPoint(skip);
    }
  }

  // ------------------------------------------------------------------ row reductions
  // zero / step / store of a vectorized row reduction (see RowReduction in scheduler.h).
  void reduction_statement(const sched::LoopNode& n) {
    using St = sched::LoopNode::Statement;
    const auto& rd = *nest_.reduction;
    const Contraction& c = nest_.contraction;
    const DType t = types_.tensors.at(nest_.tensor).dtype;
    const auto& names = nest_.variables;
    const unsigned lanes = static_cast<unsigned>(rd.lanes);
    auto* vty = llvm::FixedVectorType::get(value_type(t), lanes);
    std::vector<Value*> vals;
    for (const auto& a : n.args) vals.push_back(loop_expr(a));
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
        Value* first = b_.CreateAdd(b_.getInt64(rd.lo), b_.CreateMul(vals.back(), b_.getInt64(int64_t{rd.accumulators} * rd.lanes)));
        std::vector<llvm::Constant*> iota;
        for (unsigned l = 0; l < lanes; ++l) iota.push_back(b_.getInt64(l));
        for (int a = 0; a < rd.accumulators; ++a) {
          Value* base = b_.CreateAdd(first, b_.getInt64(int64_t{a} * rd.lanes));
          vars[names[rd.vector]] = base;
          Value* mask = b_.CreateICmpSLE(b_.CreateAdd(b_.CreateVectorSplat(lanes, base), llvm::ConstantVector::get(iota)),
                                         b_.CreateVectorSplat(lanes, b_.getInt64(rd.hi)));
          std::vector<Value*> x;
          for (const auto& in : c.inputs) {
            std::vector<Value*> at;
            for (const auto& p : in.indices) at.push_back(poly(p, vars));
            bool along = !in.indices.empty() && in.indices.back().coefficient(names[rd.vector]) != Rational(0);
            if (along) {
              width_ = lanes;
              mask_ = mask;
              x.push_back(convert(input(in.tensor, at), t));
              width_ = 0;
              mask_ = nullptr;
            } else {
              x.push_back(b_.CreateVectorSplat(lanes, convert(input(in.tensor, at), t)));
            }
          }
          Value* value = c.combination == CombinationOp::mul ? b_.CreateFMul(x[0], x[1]) : x[0];
          value = b_.CreateSelect(mask, value, identity_vector);  // lanes past r's range add nothing
          Value* acc = b_.CreateLoad(vty, acc_[static_cast<size_t>(a)]);
          b_.CreateStore(accumulate(c.aggregation, acc, value, t), acc_[static_cast<size_t>(a)]);
        }
        return;
      }
      case St::store: {
        Value* total = b_.CreateLoad(vty, acc_[0]);
        for (size_t a = 1; a < acc_.size(); ++a) total = accumulate(c.aggregation, total, b_.CreateLoad(vty, acc_[a]), t);
        Value* h = b_.CreateExtractElement(total, uint64_t{0});
        for (unsigned l = 1; l < lanes; ++l) h = accumulate(c.aggregation, h, b_.CreateExtractElement(total, l), t);
        std::vector<Value*> out_idx;
        for (const auto& p : c.output_indices) out_idx.push_back(poly(p, vars));
        Value* off = flat_index(c.output, out_idx);
        Typed old = load(c.output, off);
        store(c.output, off, {accumulate(c.aggregation, old.v, h, t), t});
        return;
      }
      default: POLYTILE_CHECK(false, "unexpected statement in a row reduction");
    }
  }

  // ------------------------------------------------------------------ micro-kernels

  Value* in_range(Value* x, int64_t hi) {  // 0 <= x < hi
    return b_.CreateAnd(b_.CreateICmpSGE(x, b_.getInt64(0)), b_.CreateICmpSLT(x, b_.getInt64(hi)));
  }

  // The valid-point rule of the interpreter (every access in bounds, every constraint holds; the
  // micro-kernel's index polynomials are integral) for one row of a block. Only the conditions on the
  // block variable can differ between rows: the others hold at every point of the block's domain, which
  // is the union of its rows' valid points.
  Value* valid(const std::map<std::string, Value*>& vars, bool output_only) {
    const Contraction& c = nest_.contraction;
    const std::string& b = nest_.variables[nest_.microkernel->block];
    Value* ok = b_.getTrue();
    auto access = [&](const std::string& tensor, const std::vector<Polynomial>& idx) {
      const auto& shape = types_.tensors.at(tensor).shape;
      for (size_t k = 0; k < idx.size(); ++k)
        if (idx[k].coefficient(b) != Rational(0)) ok = b_.CreateAnd(ok, in_range(poly(idx[k], vars), shape[k]));
    };
    access(c.output, c.output_indices);
    if (output_only) return ok;
    for (const auto& a : c.inputs) access(a.tensor, a.indices);
    for (const auto& k : c.constraints) {
      if (k.poly.coefficient(b) == Rational(0)) continue;
      auto [x, den] = scaled_poly(k.poly, vars);
      ok = b_.CreateAnd(ok, in_range(x, k.bound.evaluate(types_.dims) * den));
    }
    return ok;
  }

  // load / fma / store of a micro-kernel block (see Microkernel in scheduler.h).
  void microkernel_statement(const sched::LoopNode& n) {
    using St = sched::LoopNode::Statement;
    const auto& mk = *nest_.microkernel;
    const Contraction& c = nest_.contraction;
    const DType t = types_.tensors.at(nest_.tensor).dtype;
    const auto& names = nest_.variables;
    std::vector<Value*> vals;
    for (const auto& a : n.args) vals.push_back(loop_expr(a));
    const size_t no = mk.others.size();
    std::map<std::string, Value*> vars;
    for (size_t k = 0; k < no; ++k) vars[names[mk.others[k]]] = vals[k];
    if (n.statement == St::fma)
      for (size_t k = 0; k < mk.reductions.size(); ++k) vars[names[mk.reductions[k]]] = vals[no + 2 + k];
    const int64_t lanes = mk.lanes, vl = lanes * mk.chunks;
    Value* b0 = b_.CreateAdd(b_.getInt64(mk.block_lo), b_.CreateMul(vals[no], b_.getInt64(mk.rows)));
    Value* v0 = b_.CreateAdd(b_.getInt64(mk.vector_lo), b_.CreateMul(vals[no + 1], b_.getInt64(vl)));
    auto* ety = value_type(t);
    auto* vty = llvm::FixedVectorType::get(ety, static_cast<unsigned>(lanes));
    const llvm::Align align(dtype_bytes(t));
    // Lanes of chunk k inside the vector variable's range (predicated blocks only).
    std::vector<Value*> lane_mask;
    if (n.predicated) {
      std::vector<llvm::Constant*> iota;
      for (int64_t l = 0; l < lanes; ++l) iota.push_back(b_.getInt64(static_cast<uint64_t>(l)));
      Value* steps = llvm::ConstantVector::get(iota);
      for (int k = 0; k < mk.chunks; ++k) {
        Value* first = b_.CreateVectorSplat(static_cast<unsigned>(lanes), b_.CreateAdd(v0, b_.getInt64(k * lanes)));
        lane_mask.push_back(b_.CreateICmpSLE(b_.CreateAdd(first, steps), b_.CreateVectorSplat(static_cast<unsigned>(lanes), b_.getInt64(mk.vector_hi))));
      }
    }
    auto address = [&](const std::string& tensor, const std::vector<Polynomial>& idx) {
      std::vector<Value*> at;
      for (const auto& p : idx) at.push_back(poly(p, vars));
      return b_.CreateGEP(storage_type(types_.tensors.at(tensor).dtype), buffer(tensor), flat_index(tensor, at));
    };
    // Per input: read along v (a vector operand), and different for every row.
    auto uses = [](const TensorAccess& a, const std::string& v) {
      return std::any_of(a.indices.begin(), a.indices.end(), [&](const Polynomial& p) { return p.coefficient(v) != Rational(0); });
    };
    std::vector<bool> along_v, per_row;
    for (const auto& in : c.inputs) {
      along_v.push_back(uses(in, names[mk.vector]));
      per_row.push_back(uses(in, names[mk.block]));
    }
    for (int d = 0; d < mk.rows; ++d) {
      vars[names[mk.block]] = b_.CreateAdd(b0, b_.getInt64(d));
      vars[names[mk.vector]] = v0;
      Value* row = nullptr;
      if (n.predicated) row = valid(vars, n.statement != St::fma);
      std::vector<Value*> scalars(c.inputs.size(), nullptr);
      if (n.statement == St::fma) {
        for (size_t i = 0; i < c.inputs.size(); ++i) {
          if (along_v[i]) continue;
          std::vector<Value*> at;
          for (const auto& p : c.inputs[i].indices) {
            Value* x = poly(p, vars);
            at.push_back(row ? b_.CreateSelect(row, x, b_.getInt64(0)) : x);  // an invalid row reads element 0
          }
          scalars[i] = b_.CreateVectorSplat(static_cast<unsigned>(lanes), convert(input(c.inputs[i].tensor, at), t));
        }
      }
      for (int k = 0; k < mk.chunks; ++k) {
        vars[names[mk.vector]] = b_.CreateAdd(v0, b_.getInt64(k * lanes));
        llvm::AllocaInst* acc = acc_[static_cast<size_t>(d * mk.chunks + k)];
        Value* mask = row ? b_.CreateAnd(b_.CreateVectorSplat(static_cast<unsigned>(lanes), row), lane_mask[static_cast<size_t>(k)]) : nullptr;
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
                x[i] = vload(address(c.inputs[i].tensor, c.inputs[i].indices), m);
              } else {  // the producer, on the lanes
                std::vector<Value*> at;
                for (const auto& p : c.inputs[i].indices) {
                  Value* x = poly(p, vars);
                  at.push_back(row && per_row[i] ? b_.CreateSelect(row, x, b_.getInt64(0)) : x);
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
            b_.CreateStore(row ? b_.CreateSelect(row, sum, old) : sum, acc);
            break;
          }
          case St::epilogue: {
            // The elementwise consumer, on the finished accumulators; its lanes run along v.
            const Elementwise& e = *nest_.epilogue;
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
            lanes_[c.output] = {b_.CreateLoad(vty, acc), t};
            const DType et = types_.tensors.at(e.output).dtype;
            Typed value = expr(e.expr, at);
            Value* v = convert(value, et);
            if (et == DType::boolean) v = b_.CreateZExt(v, widen(b_.getInt8Ty()));
            Value* addr = b_.CreateGEP(storage_type(et), buffer(e.output), flat_index(e.output, at));
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
          case St::plain: break;
        }
      }
    }
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const sched::Nest& nest_;
  const ProgramTypes& types_;
  const std::map<std::string, int>& buffer_index_;
  llvm::Function* fn_ = nullptr;
  Value* lo_ = nullptr;
  Value* hi_ = nullptr;
  std::vector<llvm::AllocaInst*> iters_;
  std::vector<llvm::AllocaInst*> acc_;  // micro-kernel accumulators, row-major (row, chunk)
  unsigned width_ = 0;                    // 0: scalar expressions; else lanes of vector expressions
  std::map<std::string, Typed> lanes_;    // tensors whose lanes are given (the accumulators in an epilogue)
  Value* mask_ = nullptr;                 // lanes in range, for vector loads of a predicated block
  std::map<std::string, Value*> ptrs_;
};

}  // namespace

std::vector<std::string> nest_tensors(const sched::Nest& nest) { return NestEmitter::nest_tensors(nest); }

void emit_nests(llvm::Module& module, const sched::Schedule& schedule, const ProgramTypes& types,
                const std::map<std::string, int>& buffer_index) {
  for (size_t k = 0; k < schedule.nests.size(); ++k) {
    NestEmitter e(module, schedule.nests[k], types, buffer_index);
    llvm::Function* f = e.emit("nest_" + std::to_string(k));
    std::string err;
    llvm::raw_string_ostream os(err);
    if (llvm::verifyFunction(*f, &os)) throw InternalError("invalid LLVM IR for " + schedule.nests[k].name + ": " + os.str());
  }
}

}  // namespace polytile::llvm_ir
