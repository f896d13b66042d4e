// NestEmitter (nest_emitter.h): dtypes and their LLVM types, loads and stores, conversions with the
// rounding of buffer.h, literals, arithmetic and comparisons as the interpreter defines them, and
// elementwise expressions, on scalars or vectors.
#include "nest_emitter.h"

#include "polytile/buffer.h"

namespace polytile::llvm_ir::internal {

llvm::Type* NestEmitter::storage_type(DType t) {
  switch (t) {
    case DType::f16: return b_.getHalfTy();
    case DType::f32: return b_.getFloatTy();
    case DType::f64: return b_.getDoubleTy();
    case DType::i32: return b_.getInt32Ty();
    case DType::i64: return b_.getInt64Ty();
    case DType::boolean: return b_.getInt8Ty();
  }
  return nullptr;
}

Value* NestEmitter::from_storage(DType t, Value* v) {
  if (t == DType::boolean) return b_.CreateICmpNE(v, llvm::Constant::getNullValue(v->getType()));
  if (t == DType::f16) return b_.CreateFPExt(v, v->getType()->getWithNewType(b_.getFloatTy()));
  return v;
}

Value* NestEmitter::to_storage(DType t, Value* v) {
  if (t == DType::boolean) return b_.CreateZExt(v, v->getType()->getWithNewType(b_.getInt8Ty()));
  if (t == DType::f16) return b_.CreateFPTrunc(v, v->getType()->getWithNewType(b_.getHalfTy()));  // exact: v is a half
  return v;
}

Typed NestEmitter::load_address(DType t, Value* addr) { return {from_storage(t, b_.CreateLoad(storage_type(t), addr)), t}; }

void NestEmitter::store_address(DType t, Value* addr, Typed value) { b_.CreateStore(to_storage(t, convert(value, t)), addr); }

// The nearest half to each f32 value, as an f32 (F16C's vcvtps2ph and back on x86; cvt.rn.f16.f32 on NVPTX).
Value* NestEmitter::round_half(Value* v) {
  return b_.CreateFPExt(b_.CreateFPTrunc(v, v->getType()->getWithNewType(b_.getHalfTy())), v->getType());
}

// f64 -> f32 rounding to odd: truncate toward zero and set the last bit when inexact. Rounding that to a
// half then rounds the f64 value correctly (f32 has more than 11 + 2 bits), where rounding to nearest
// twice would not.
Value* NestEmitter::round_to_odd_f32(Value* d) {
  llvm::Type* fty = d->getType()->getWithNewType(b_.getFloatTy());
  llvm::Type* ity = d->getType()->getWithNewType(b_.getInt32Ty());
  Value* f = b_.CreateFPTrunc(d, fty);
  Value* back = b_.CreateFPExt(f, d->getType());
  Value* over = b_.CreateFCmpOGT(intrinsic(llvm::Intrinsic::fabs, {back}), intrinsic(llvm::Intrinsic::fabs, {d}));
  Value* bits = b_.CreateSub(b_.CreateBitCast(f, ity), b_.CreateZExt(over, ity));
  bits = b_.CreateOr(bits, b_.CreateZExt(b_.CreateFCmpONE(back, d), ity));
  return b_.CreateBitCast(bits, fty);
}

Value* NestEmitter::element_address(const std::string& tensor, const std::vector<Value*>& idx) {
  const TensorType& type = types_.tensors.at(tensor);
  llvm::Type* et = storage_type(type.dtype);
  if (!nest_.kernel) return b_.CreateGEP(et, buffer(tensor), flat_index(tensor, idx));
  Value* addr = buffer(tensor);
  int64_t stride = 1;
  for (size_t k = type.shape.size(); k-- > 0;) {
    addr = b_.CreateGEP(et, addr, stride == 1 ? idx[k] : b_.CreateNSWMul(idx[k], ix(stride)));
    stride *= type.shape[k];
  }
  return addr;
}

std::vector<Value*> NestEmitter::broadcast_indices(const std::string& tensor, const std::vector<Value*>& idx) {
  const auto& shape = types_.tensors.at(tensor).shape;
  std::vector<Value*> at(idx.end() - static_cast<std::ptrdiff_t>(shape.size()), idx.end());
  for (size_t k = 0; k < shape.size(); ++k)
    if (shape[k] == 1) at[k] = ix(0);
  return at;
}

Typed NestEmitter::load_element(const std::string& tensor, const std::vector<Value*>& idx) {
  return load_address(types_.tensors.at(tensor).dtype, element_address(tensor, idx));
}

void NestEmitter::store_element(const std::string& tensor, const std::vector<Value*>& idx, Typed value) {
  store_address(types_.tensors.at(tensor).dtype, element_address(tensor, idx), value);
}

// round_to semantics of buffer.h: f16 and f32 round, i32 and i64 truncate and wrap (NaN -> 0), bool is != 0.
Value* NestEmitter::convert(Typed x, DType to) {
  if (x.t == to) return x.v;
  switch (to) {
    case DType::f16:  // an f16 value is an f32 that holds a half
      if (x.t == DType::f64) return round_half(round_to_odd_f32(x.v));
      // Integers convert to f32 exactly up to 2^24, and beyond 65520 both roundings give infinity.
      return round_half(convert(x, DType::f32));
    case DType::f32:
    case DType::f64: {
      llvm::Type* ty = value_type(to);
      if (is_float(x.t)) return b_.CreateFPCast(x.v, ty);
      if (x.t == DType::boolean) return b_.CreateUIToFP(x.v, ty);
      return b_.CreateSIToFP(x.v, ty);
    }
    case DType::i64:
      if (x.t == DType::boolean) return b_.CreateZExt(x.v, value_type(to));
      if (x.t == DType::i32) return b_.CreateSExt(x.v, value_type(to));
      {
        // trunc, then wrap modulo 2^64: r = t - 2^64 * round(t / 2^64) lies in [-2^63, 2^63] and is exact in
        // floating point (below 2^63 nothing changes; at and above 2^64 a float is a multiple of 2^11, so r
        // fits the significand); 2^63 wraps to -2^63 before the conversion, which would not take it; inf
        // and NaN give 0.
        llvm::Type* fty = x.v->getType();
        Value* t = intrinsic(llvm::Intrinsic::trunc, {x.v});
        Value* q = intrinsic(llvm::Intrinsic::round, {b_.CreateFMul(t, llvm::ConstantFP::get(fty, 0x1p-64))});
        Value* r = b_.CreateFSub(t, b_.CreateFMul(q, llvm::ConstantFP::get(fty, 0x1p64)));
        r = b_.CreateSelect(b_.CreateFCmpOGE(r, llvm::ConstantFP::get(fty, 0x1p63)), llvm::ConstantFP::get(fty, -0x1p63), r);
        Value* finite = b_.CreateFCmpOLT(intrinsic(llvm::Intrinsic::fabs, {x.v}), llvm::ConstantFP::getInfinity(fty));
        r = b_.CreateSelect(finite, r, llvm::Constant::getNullValue(fty));
        return b_.CreateFPToSI(r, value_type(to));
      }
    case DType::i32:  // wrapping modulo 2^64, then to 32 bits, wraps modulo 2^32
      if (x.t == DType::boolean) return b_.CreateZExt(x.v, value_type(to));
      return b_.CreateTrunc(x.t == DType::i64 ? x.v : convert(x, DType::i64), value_type(to));
    case DType::boolean:
      if (is_float(x.t)) return b_.CreateFCmpUNE(x.v, llvm::ConstantFP::get(x.v->getType(), 0.0));
      return b_.CreateICmpNE(x.v, llvm::ConstantInt::get(x.v->getType(), 0));
  }
  return nullptr;
}

Typed NestEmitter::constant(double v, DType t) {
  switch (t) {
    case DType::f16:
    case DType::f32:
    case DType::f64: return {llvm::ConstantFP::get(value_type(t), round_to(t, v)), t};
    case DType::i32:
    case DType::i64: return {integer(static_cast<int64_t>(round_to(t, v)), t), t};
    case DType::boolean: return {llvm::ConstantInt::get(value_type(t), v != 0 ? 1 : 0), t};
  }
  return {nullptr, t};
}

Value* NestEmitter::fn_call(const char* name, Typed x) {
  if (device_) return device_call(name, {x.v});  // no libm on the device (kernels are scalar code)
  bool f32 = x.t == DType::f32 || x.t == DType::f16;  // f16 values are f32s
  llvm::Type* ty = x.v->getType()->getScalarType();
  const std::string scalar = std::string(name) + (f32 ? "f" : "");
  llvm::FunctionCallee callee = m_.getOrInsertFunction(scalar, ty, ty);
  // errno, the only memory libm's functions touch, is nothing a program reads: without memory effects
  // the calls can be vectorized (a vector library's variants) and hoisted like any arithmetic.
  if (auto* f = llvm::dyn_cast<llvm::Function>(callee.getCallee())) {
    f->setDoesNotAccessMemory();
    f->setDoesNotThrow();
    f->setWillReturn();
  }
  if (!width_) return b_.CreateCall(callee, {x.v});
  // libm has no vector versions: `polytile.lanes.<fn>.v<W>` (kLanesPrefix) calls it lane by lane, where a
  // host code generator may call a vector library's variant instead.
  auto* vty = llvm::FixedVectorType::get(ty, width_);
  const std::string lanes_name = std::string(kLanesPrefix) + scalar + ".v" + std::to_string(width_);
  llvm::Function* lanes = m_.getFunction(lanes_name);
  if (!lanes) {
    lanes = llvm::Function::Create(llvm::FunctionType::get(vty, {vty}, false), llvm::GlobalValue::InternalLinkage,
                                   lanes_name, m_);
    lanes->addFnAttr(llvm::Attribute::AlwaysInline);
    lanes->addFnAttr(llvm::Attribute::NoUnwind);
    llvm::IRBuilder<> lb(llvm::BasicBlock::Create(ctx_, "entry", lanes));
    Value* out = llvm::UndefValue::get(vty);
    for (unsigned l = 0; l < width_; ++l)
      out = lb.CreateInsertElement(out, lb.CreateCall(callee, {lb.CreateExtractElement(lanes->getArg(0), l)}), l);
    lb.CreateRet(out);
  }
  return b_.CreateCall(lanes, {x.v});
}

Value* NestEmitter::intrinsic(llvm::Intrinsic::ID id, std::vector<Value*> args) {
  if (device_ && args[0]->getType()->isFloatingPointTy()) {
    // LLVM 16's NVPTX selects none of sin, cos, pow and turns exp and log into calls of missing libm
    // functions: every floating-point intrinsic goes to libdevice, whose functions are IEEE-exact where
    // the interpreter's libm is (sqrt, floor, trunc, ...).
    static const std::pair<llvm::Intrinsic::ID, const char*> libdevice[] = {
        {llvm::Intrinsic::exp, "exp"},     {llvm::Intrinsic::log, "log"},     {llvm::Intrinsic::sqrt, "sqrt"},
        {llvm::Intrinsic::sin, "sin"},     {llvm::Intrinsic::cos, "cos"},     {llvm::Intrinsic::floor, "floor"},
        {llvm::Intrinsic::ceil, "ceil"},   {llvm::Intrinsic::round, "round"}, {llvm::Intrinsic::trunc, "trunc"},
        {llvm::Intrinsic::fabs, "fabs"},   {llvm::Intrinsic::pow, "pow"}};
    for (const auto& [known, name] : libdevice)
      if (known == id) return device_call(name, args);
    POLYTILE_CHECK(false, "no libdevice function for LLVM intrinsic ", llvm::Intrinsic::getBaseName(id).str());
  }
  return b_.CreateIntrinsic(id, {args[0]->getType()}, args);
}

Value* NestEmitter::exp(Value* x) {
  if (!device_ && x->getType()->getScalarType()->isFloatTy()) return exp_f32(x);
  return intrinsic(llvm::Intrinsic::exp, {x});
}

// e^x on f32 lanes as straight-line arithmetic (20 instructions; 13 on AVX-512, where the CPU backend
// makes the last step's two scalings one vscalefps after vectorizing, bit for bit the same: cpu.cpp
// ScaleByPowersOfTwo), so that a vectorized loop keeps it in registers: a call of libmvec's vector expf
// clobbers every vector register.
//   x is clamped to [-104, 89] (e^x rounds to 0 below, overflows above; NaN passes the compares);
//   t = x log2 e + 1.5 * 2^23 in one FMA rounds x log2 e to the nearest integer k, which then sits in
//   t's low mantissa bits: bits(t) = 0x4B400000 + k;
//   r = x - k ln2 (Cody-Waite with FMA, ln2 in two parts), |r| <= ln2 / 2 + tiny;
//   e^r = 1 + r + r^2 q(r), q of degree 4, minimax for the relative error with the first two terms
//   fixed (error 2^-28.3, coefficients rounded to f32), in Horner form with FMA;
//   e^x = e^r 2^k1 2^k2 with k1 = floor(k / 2), k2 = k - k1 (both in the normal range for k in
//   [-150, 129], read off bits(t) with a shift and a subtraction): the first product is exact, the
//   second rounds once, also into the subnormals.
// Against the correctly rounded e^x of every f32 in [-104, 89]: at most 0.91 ulp, 99.5% correctly
// rounded (cpu_test ExpF32IsWithinOneUlp checks a stride of them and the special values).
Value* NestEmitter::exp_f32(Value* x) {
  b_.GetInsertBlock()->getParent()->addFnAttr(kVectorMathAttribute);
  llvm::Type* ty = x->getType();
  llvm::Type* ity = ty->isVectorTy() ? llvm::VectorType::get(b_.getInt32Ty(), llvm::cast<llvm::VectorType>(ty)->getElementCount())
                                     : static_cast<llvm::Type*>(b_.getInt32Ty());
  auto fc = [&](float c) { return llvm::ConstantFP::get(ty, static_cast<double>(c)); };
  auto ic = [&](int32_t c) { return llvm::ConstantInt::get(ity, static_cast<uint64_t>(static_cast<int64_t>(c)), true); };
  auto fma = [&](Value* a, Value* b, Value* c) { return intrinsic(llvm::Intrinsic::fma, {a, b, c}); };
  Value* xc = b_.CreateSelect(b_.CreateFCmpOGT(x, fc(89.0f)), fc(89.0f), x);
  xc = b_.CreateSelect(b_.CreateFCmpOLT(xc, fc(-104.0f)), fc(-104.0f), xc);
  const float magic = 0x1.8p23f;
  Value* t = fma(xc, fc(0x1.715476p+0f), fc(magic));
  Value* k = b_.CreateFSub(t, fc(magic));
  Value* r = fma(k, fc(-0x1.62e4p-1f), xc);
  r = fma(k, fc(-0x1.7f7d1cp-20f), r);
  Value* p = fc(0x1.6a233ep-10f);
  for (float c : {0x1.123a76p-7f, 0x1.5558f6p-5f, 0x1.55549p-3f, 0x1.fffffcp-2f, 1.0f, 1.0f}) p = fma(p, r, fc(c));
  Value* bits = b_.CreateBitCast(t, ity);          // 0x4B400000 + k
  Value* half = b_.CreateAShr(bits, ic(1));         // 0x25A00000 + k1
  Value* rest = b_.CreateSub(bits, half);           // 0x25A00000 + k2
  auto power = [&](Value* biased) {                 // 2^(biased - 0x25A00000)
    return b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(biased, ic(127 - 0x25A00000)), ic(23)), ty);
  };
  return b_.CreateFMul(b_.CreateFMul(p, power(half)), power(rest));
}

// libdevice's __nv_<name>f (f32) or __nv_<name> (f64) of scalar arguments.
Value* NestEmitter::device_call(const char* name, const std::vector<Value*>& args) {
  llvm::Type* ty = args[0]->getType();
  const std::string symbol = "__nv_" + std::string(name) + (ty->isFloatTy() ? "f" : "");
  std::vector<llvm::Type*> params(args.size(), ty);
  llvm::FunctionCallee callee = m_.getOrInsertFunction(symbol, llvm::FunctionType::get(ty, params, false));
  return b_.CreateCall(callee, args);
}

// Floor division / modulo on i32 or i64 with x / 0 = 0 and MIN / -1 wrapping, as the interpreter does.
Value* NestEmitter::int_div(Value* x, Value* y, bool mod) {
  auto c = [&](int64_t v) { return llvm::ConstantInt::get(x->getType(), static_cast<uint64_t>(v), true); };
  Value* zero = c(0);
  Value* safe_y = b_.CreateSelect(b_.CreateICmpEQ(y, zero), c(1), y);
  Value* minus_one = b_.CreateICmpEQ(safe_y, c(-1));
  safe_y = b_.CreateSelect(minus_one, c(1), safe_y);
  Value* q = b_.CreateSDiv(x, safe_y);
  Value* r = b_.CreateSRem(x, safe_y);
  Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, zero), b_.CreateICmpNE(b_.CreateICmpSLT(r, zero), b_.CreateICmpSLT(safe_y, zero)));
  Value* fq = b_.CreateSub(q, b_.CreateZExt(adjust, x->getType()));
  Value* fr = b_.CreateSelect(adjust, b_.CreateAdd(r, safe_y), r);
  Value* result = mod ? fr : fq;
  Value* by_minus_one = mod ? zero : b_.CreateNeg(x);
  result = b_.CreateSelect(minus_one, by_minus_one, result);
  return b_.CreateSelect(b_.CreateICmpEQ(y, zero), zero, result);
}

Typed NestEmitter::arith(BinaryOp op, Typed a, Typed b, DType t) {
  Value *x = convert(a, t), *y = convert(b, t);
  if (is_float(t)) {
    switch (op) {
      case BinaryOp::add: return {b_.CreateFAdd(x, y), t};
      case BinaryOp::sub: return {b_.CreateFSub(x, y), t};
      case BinaryOp::mul: return {b_.CreateFMul(x, y), t};
      case BinaryOp::div: return {b_.CreateFDiv(x, y), t};
      case BinaryOp::mod: return {device_ ? device_call("fmod", {x, y}) : b_.CreateFRem(x, y), t};
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

Value* NestEmitter::compare(BinaryOp op, Typed a, Typed b, DType t) {
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

// An elementwise expression at output index `idx` (broadcasting like the interpreter). An operation whose
// result is f16 computes in f32 and rounds to the nearest half (ir.h).
Typed NestEmitter::expr(const Expr& e, const std::vector<Value*>& idx) {
  Typed r = operation(e, idx);
  const bool computed = e.kind() == Expr::Kind::unary || e.kind() == Expr::Kind::binary || e.kind() == Expr::Kind::call;
  if (r.t == DType::f16 && computed) r.v = round_half(r.v);
  return r;
}

Typed NestEmitter::operation(const Expr& e, const std::vector<Value*>& idx) {
  const auto& ts = types_.tensors;
  switch (e.kind()) {
    case Expr::Kind::tensor: {
      auto given = lanes_.find(e.name());
      if (width_ && given != lanes_.end()) return given->second;
      const auto& shape = ts.at(e.name()).shape;
      const std::vector<Value*> at = broadcast_indices(e.name(), idx);
      if (!width_) return load_element(e.name(), at);
      // Vector lanes run along the last index: contiguous unless broadcast there.
      DType t = ts.at(e.name()).dtype;
      Value* addr = element_address(e.name(), at);
      Value* v = nullptr;
      if (shape.empty() || shape.back() == 1) {
        v = b_.CreateVectorSplat(width_, b_.CreateLoad(storage_type(t), addr));
      } else {
        auto* vty = llvm::FixedVectorType::get(storage_type(t), width_);
        llvm::Align align(dtype_bytes(t));
        v = mask_ ? static_cast<Value*>(b_.CreateMaskedLoad(vty, addr, align, mask_, llvm::Constant::getNullValue(vty)))
                  : b_.CreateAlignedLoad(vty, addr, align);
      }
      return {from_storage(t, v), t};
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
    Value* zero = llvm::Constant::getNullValue(v->getType());
    switch (fn) {
      case Intrinsic::abs: return {b_.CreateIntrinsic(llvm::Intrinsic::abs, {v->getType()}, {v, b_.getFalse()}), result};
      case Intrinsic::sign:
        return {b_.CreateSub(b_.CreateZExt(b_.CreateICmpSGT(v, zero), v->getType()),
                             b_.CreateZExt(b_.CreateICmpSLT(v, zero), v->getType())),
                result};
      case Intrinsic::relu: return {intrinsic(llvm::Intrinsic::smax, {v, zero}), result};
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
    case Intrinsic::exp: return {exp(v), result};
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
      return {b_.CreateFDiv(fc(1), b_.CreateFAdd(fc(1), exp(b_.CreateFNeg(v)))), result};
    case Intrinsic::relu:
      return {b_.CreateSelect(b_.CreateFCmpUGT(v, fc(0)), v, fc(0)), result};  // NaN stays NaN
    default: break;
  }
  POLYTILE_CHECK(false, "unhandled intrinsic ", to_string(fn));
}

}  // namespace polytile::llvm_ir::internal
