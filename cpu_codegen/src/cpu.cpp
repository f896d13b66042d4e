// The host backend's driver: passes, scheduling, LLVM IR (a module per nest), optimization and machine
// code (nests concurrently), ORC LLJIT, a per-process cache, and the TBB runtime that runs the nests in
// order, splitting provably parallel outer loops across threads.
#include "polytile/cpu.h"

#include "internal.h"

#include <llvm/Analysis/LoopInfo.h>
#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/Analysis/VectorUtils.h>
#include <llvm/Analysis/ValueTracking.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/PatternMatch.h>
#include <llvm/MC/MCContext.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Transforms/IPO/AlwaysInliner.h>
#include <llvm/Transforms/InstCombine/InstCombine.h>
#include <llvm/Transforms/Scalar.h>
#include <llvm/Transforms/Scalar/AlignmentFromAssumptions.h>
#include <llvm/Transforms/Scalar/EarlyCSE.h>
#include <llvm/Transforms/Scalar/GVN.h>
#include <llvm/Transforms/Scalar/LICM.h>
#include <llvm/Transforms/Scalar/LoopPassManager.h>
#include <llvm/Transforms/Scalar/LoopRotation.h>
#include <llvm/Transforms/Scalar/LoopUnrollPass.h>
#include <llvm/Transforms/Scalar/SROA.h>
#include <llvm/Transforms/Scalar/SimplifyCFG.h>
#include <llvm/Transforms/Utils/BasicBlockUtils.h>
#include <llvm/Transforms/Utils/InjectTLIMappings.h>
#include <llvm/Transforms/Utils/Local.h>
#include <llvm/Transforms/Utils/LoopUtils.h>
#include <llvm/Transforms/Vectorize/LoopVectorize.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/KnownBits.h>
#include <llvm/Support/SmallVectorMemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <set>
#include <system_error>
#include <thread>
#include <mutex>

#include "polytile/llvm_ir.h"
#include "polytile/error.h"
#include "polytile/lower.h"

namespace polytile::cpu {

CompiledProgram::CompiledProgram(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledProgram::~CompiledProgram() = default;
const Program& CompiledProgram::program() const { return impl_->program; }
const sched::Schedule& CompiledProgram::schedule() const { return impl_->schedule; }
const ProgramTypes& CompiledProgram::types() const { return impl_->types; }
const std::string& CompiledProgram::llvm_ir() const {
  Impl& m = *impl_;
  std::call_once(m.ir_once, [&m] {
    if (!m.ir_made) m.ir = optimized_llvm_ir(m.source, m.inputs, m.options);
    m.ir_made = true;
  });
  return m.ir;
}
const CompileTimes& CompiledProgram::times() const { return impl_->times; }
const TuningReport& CompiledProgram::tuning() const { return impl_->tuning; }

namespace {

sched::LowerOptions lower_options(const CompileOptions& options) {
  sched::LowerOptions l;
  l.target = options.target;
  l.reduce_and_defract = options.reduce_and_defract;
  l.verify = options.verify;
  return l;
}

}  // namespace

void initialize_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    // glibc's vector math library, when the system has it (vector_math_variants): the vectorizer then keeps
    // transcendental loops vector instead of calling libm per element.
    llvm::sys::DynamicLibrary::LoadLibraryPermanently("libmvec.so.1");
  });
}

namespace {

// Marks every loop around a vectorized loop `llvm.loop.unroll.disable` (the late unroller then leaves
// it alone; the vectorized loop itself may still be unrolled). Unrolled, the loops around a short vector
// loop become copies of it: that keeps a 2x2 pooling window's maxima in registers across the window (max
// pool forward ran about 8% faster so), but a conv weight gradient's sum of two slices over 64 channels
// (8 vectors) turned into 16 copies of the vector body, 600 lines of IR where 150 did, for 20 ms of
// optimization and 25 ms of machine code instead of 14 and 8, at the end of the gradient's compile, for a
// nest that runs in microseconds. So only small nests keep these loops (see small_nest).
struct KeepLoopsAroundVectorLoops : llvm::PassInfoMixin<KeepLoopsAroundVectorLoops> {
  llvm::PreservedAnalyses run(llvm::Function& f, llvm::FunctionAnalysisManager& fam) {
    std::vector<llvm::Loop*> around;
    for (llvm::Loop* l : fam.getResult<llvm::LoopAnalysis>(f).getLoopsInPreorder())
      if (llvm::findOptionMDForLoop(l, "llvm.loop.isvectorized"))
        for (llvm::Loop* p = l->getParentLoop(); p; p = p->getParentLoop()) around.push_back(p);
    // With the value 1: the unroller reads {"llvm.loop.unroll.disable", i32 0} as "not disabled".
    for (llvm::Loop* l : around)
      if (!llvm::getBooleanLoopAttribute(l, "llvm.loop.unroll.disable")) llvm::addStringMetadataToLoop(l, "llvm.loop.unroll.disable", 1);
    return llvm::PreservedAnalyses::all();  // only loop metadata changed, which no analysis holds
  }
};

// Non-temporal stores in a streaming nest's body (llvm_ir::kStreamAttribute) for an x86 target: its
// vector stores into the marked tensor (the vectorized loops' stores; a scalar rest of a loop stays as it
// is; a memcpy of a constant length becomes vector loads and stores), where every one is aligned to at
// least half its size, write whole lines to memory without reading them first, and an sfence before each
// return orders them before whatever the caller does next (another thread reading the output after the
// parallel loop). Runs after the vectorizer and unroller, when LLVM's alignment from the body's
// assumption has reached the stores.
struct StreamStores : llvm::PassInfoMixin<StreamStores> {
  llvm::PreservedAnalyses run(llvm::Function& f, llvm::FunctionAnalysisManager&) {
    const llvm::Argument* streamed = nullptr;
    for (const llvm::Argument& a : f.args())
      if (f.getAttributes().hasParamAttr(a.getArgNo(), llvm_ir::kStreamAttribute)) streamed = &a;
    if (!streamed || !llvm::Triple(f.getParent()->getTargetTriple()).isX86()) return llvm::PreservedAnalyses::all();
    const llvm::DataLayout& layout = f.getParent()->getDataLayout();
    llvm::LLVMContext& ctx = f.getContext();
    llvm::MDNode* nontemporal = llvm::MDNode::get(ctx, {llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx), 1))});
    std::vector<llvm::ReturnInst*> returns;
    std::vector<llvm::StoreInst*> stores;
    std::vector<llvm::MemCpyInst*> copies;
    // A copy loop that LLVM made a memcpy (a packed operand's panel rows) is moved by vectors as wide as
    // the destination's alignment, up to 32 bytes: where that divides its constant length, vector after
    // vector; otherwise by a loop over its whole vectors, the rest (less than a vector; none where the
    // length's low bits are known to be zero) copied through the caches after it. A panel row's length
    // varies where the last panel is partial: 4 x min(48, 1000 - 48 j) bytes in a 1000-column matmul.
    auto width = [](const llvm::MemCpyInst* copy) { return std::min<uint64_t>(32, copy->getDestAlign().valueOrOne().value()); };
    for (llvm::BasicBlock& block : f)
      for (llvm::Instruction& i : block) {
        if (auto* ret = llvm::dyn_cast<llvm::ReturnInst>(&i)) returns.push_back(ret);
        if (auto* copy = llvm::dyn_cast<llvm::MemCpyInst>(&i)) {
          if (llvm::getUnderlyingObject(copy->getDest(), /*MaxLookup=*/0) != streamed) continue;
          const auto* length = llvm::dyn_cast<llvm::ConstantInt>(copy->getLength());
          if (width(copy) < 16 || (length && length->getZExtValue() % width(copy) != 0)) return llvm::PreservedAnalyses::all();
          copies.push_back(copy);
          continue;
        }
        auto* store = llvm::dyn_cast<llvm::StoreInst>(&i);
        if (!store || !store->getValueOperand()->getType()->isVectorTy()) continue;
        if (llvm::getUnderlyingObject(store->getPointerOperand(), /*MaxLookup=*/0) != streamed) continue;
        // x86 stores a vector past the caches aligned to its size; the code generator splits one aligned
        // to half of it into two. Any other vector store (a partial line cached between streamed ones)
        // keeps the whole body as it was.
        const uint64_t bytes = layout.getTypeStoreSize(store->getValueOperand()->getType()), align = store->getAlign().value();
        if (bytes < 16 || align < 16 || align * 2 < bytes) return llvm::PreservedAnalyses::all();
        stores.push_back(store);
      }
    for (llvm::MemCpyInst* copy : copies) {
      llvm::IRBuilder<> b(copy);
      const uint64_t align = width(copy);
      llvm::Type* vector = llvm::FixedVectorType::get(b.getInt8Ty(), static_cast<unsigned>(align));
      const llvm::Align source_align = llvm::commonAlignment(copy->getSourceAlign().valueOrOne(), align);
      auto move = [&](llvm::Value* at) {  // the vector `at` bytes in, a multiple of align
        llvm::Value* v = b.CreateAlignedLoad(vector, b.CreateInBoundsGEP(b.getInt8Ty(), copy->getSource(), at), source_align);
        stores.push_back(b.CreateAlignedStore(v, b.CreateInBoundsGEP(b.getInt8Ty(), copy->getDest(), at), llvm::Align(align)));
      };
      llvm::Value* length = copy->getLength();
      llvm::Type* type = length->getType();
      if (const auto* bytes = llvm::dyn_cast<llvm::ConstantInt>(length)) {
        for (uint64_t at = 0; at < bytes->getZExtValue(); at += align) move(llvm::ConstantInt::get(type, at));
      } else {
        // for (at = 0; at < whole; at += align), whole = length rounded down to a multiple of align.
        llvm::Value* whole = b.CreateAnd(length, llvm::ConstantInt::get(type, ~(align - 1)));
        llvm::BasicBlock* before = copy->getParent();
        llvm::BasicBlock* after = before->splitBasicBlock(copy, "stream.copied");
        auto* loop = llvm::BasicBlock::Create(ctx, "stream.copy", &f, after);
        before->getTerminator()->eraseFromParent();
        b.SetInsertPoint(before);
        b.CreateCondBr(b.CreateICmpEQ(whole, llvm::ConstantInt::get(type, 0)), after, loop);
        b.SetInsertPoint(loop);
        llvm::PHINode* at = b.CreatePHI(type, 2);
        at->addIncoming(llvm::ConstantInt::get(type, 0), before);
        move(at);
        llvm::Value* next = b.CreateNUWAdd(at, llvm::ConstantInt::get(type, align));
        at->addIncoming(next, loop);
        b.CreateCondBr(b.CreateICmpULT(next, whole), loop, after);
        if (llvm::computeKnownBits(length, layout).countMinTrailingZeros() < llvm::Log2_64(align)) {
          b.SetInsertPoint(copy);
          llvm::Value* rest = b.CreateICmpNE(whole, length);
          b.SetInsertPoint(llvm::SplitBlockAndInsertIfThen(rest, copy, /*Unreachable=*/false));
          b.CreateMemCpy(b.CreateInBoundsGEP(b.getInt8Ty(), copy->getDest(), whole), llvm::Align(align),
                         b.CreateInBoundsGEP(b.getInt8Ty(), copy->getSource(), whole), source_align, b.CreateSub(length, whole));
        }
      }
      copy->eraseFromParent();
    }
    if (stores.empty()) return llvm::PreservedAnalyses::all();
    for (llvm::StoreInst* store : stores) store->setMetadata(llvm::LLVMContext::MD_nontemporal, nontemporal);
    for (llvm::ReturnInst* ret : returns) llvm::IRBuilder<>(ret).CreateIntrinsic(llvm::Intrinsic::x86_sse_sfence, {}, {});
    return llvm::PreservedAnalyses::none();
  }
};

// e^x's last step in vector code, for AVX-512 (AVX512VL for 8 and 4 lanes): llvm_ir's f32 exp ends in
// p x 2^k1 x 2^k2, its two powers of two made from the bits of t = x log2 e + 1.5 x 2^23 (0x4B400000 + k)
// with integer shifts and adds, eight vector instructions; vscalefps makes p x 2^k in one, with
// k = t - 1.5 x 2^23, which the range reduction has computed already. The same single rounding of the
// same exact product (p x 2^k1 is exact, the second product rounds once, into the subnormals too), so
// the same bits. Matched after the vectorizers (llvm_ir emits e^x on scalars that they widen); a scalar
// rest keeps the integer powers.
struct ScaleByPowersOfTwo : llvm::PassInfoMixin<ScaleByPowersOfTwo> {
  explicit ScaleByPowersOfTwo(bool vl) : vl(vl) {}
  llvm::PreservedAnalyses run(llvm::Function& f, llvm::FunctionAnalysisManager&) {
    using namespace llvm::PatternMatch;
    struct Match {
      llvm::Instruction* product;  // p x 2^k1 x 2^k2
      llvm::Value *p, *k;
    };
    std::vector<Match> matched;
    for (llvm::BasicBlock& block : f)
      for (llvm::Instruction& i : block) {
        auto* type = llvm::dyn_cast<llvm::FixedVectorType>(i.getType());
        if (!type || !type->getElementType()->isFloatTy() || intrinsic_for(type->getNumElements()) == llvm::Intrinsic::not_intrinsic) continue;
        llvm::Value *p = nullptr, *a = nullptr, *b = nullptr;
        if (!match(&i, m_FMul(m_FMul(m_Value(p), m_Value(a)), m_Value(b)))) continue;
        llvm::Value *half = power_of(a), *rest = power_of(b);
        llvm::Value* bits = nullptr;
        if (!half || !rest || !match(half, m_AShr(m_Value(bits), m_SpecificInt(1))) || !match(rest, m_Sub(m_Specific(bits), m_Specific(half))))
          continue;
        llvm::Value* t = nullptr;
        if (!match(bits, m_BitCast(m_Value(t))) || t->getType() != type) continue;
        llvm::Value* k = nullptr;  // t - 1.5 x 2^23 (t + -1.5 x 2^23 once combined), before i in its block
        for (llvm::User* u : t->users()) {
          auto* sub = llvm::dyn_cast<llvm::Instruction>(u);
          if (sub && sub->getParent() == &block && sub->comesBefore(&i) &&
              (match(sub, m_FSub(m_Specific(t), m_SpecificFP(0x1.8p23))) || match(sub, m_FAdd(m_Specific(t), m_SpecificFP(-0x1.8p23)))))
            k = sub;
        }
        if (k) matched.push_back({&i, p, k});
      }
    if (matched.empty()) return llvm::PreservedAnalyses::all();
    llvm::SmallVector<llvm::WeakTrackingVH> dead;
    for (const Match& m : matched) {
      llvm::Instruction* i = m.product;
      auto* type = llvm::cast<llvm::FixedVectorType>(i->getType());
      const unsigned lanes = type->getNumElements();
      llvm::IRBuilder<> b(i);
      std::vector<llvm::Value*> args{m.p, m.k, llvm::Constant::getNullValue(type),
                                     lanes == 16 ? b.getInt16(0xFFFF) : b.getInt8(lanes == 8 ? 0xFF : 0x0F)};
      if (lanes == 16) args.push_back(b.getInt32(4));  // the current rounding mode (_MM_FROUND_CUR_DIRECTION)
      llvm::Value* call = b.CreateIntrinsic(intrinsic_for(lanes), {}, args);
      i->replaceAllUsesWith(call);
      dead.push_back(i);
    }
    llvm::RecursivelyDeleteTriviallyDeadInstructionsPermissive(dead);  // the integer powers
    return llvm::PreservedAnalyses::none();
  }

 private:
  bool vl;  // AVX512VL: 256- and 128-bit vscalefps
  llvm::Intrinsic::ID intrinsic_for(unsigned lanes) const {
    if (lanes == 16) return llvm::Intrinsic::x86_avx512_mask_scalef_ps_512;
    if (lanes == 8 && vl) return llvm::Intrinsic::x86_avx512_mask_scalef_ps_256;
    if (lanes == 4 && vl) return llvm::Intrinsic::x86_avx512_mask_scalef_ps_128;
    return llvm::Intrinsic::not_intrinsic;
  }
  // e where v is exp_f32's power 2^(e - 0x25A00000): bitcast((e + 127 - 0x25A00000) << 23), or as
  // instruction combining leaves it, bitcast((e << 23) + (127 << 23)).
  static llvm::Value* power_of(llvm::Value* v) {
    using namespace llvm::PatternMatch;
    llvm::Value *bits = nullptr, *e = nullptr;
    if (!match(v, m_BitCast(m_Value(bits)))) return nullptr;
    if (match(bits, m_Add(m_Shl(m_Value(e), m_SpecificInt(23)), m_SpecificInt(127u << 23)))) return e;
    if (match(bits, m_Shl(m_Add(m_Value(e), m_SpecificInt(static_cast<uint32_t>(127 - 0x25A00000))), m_SpecificInt(23)))) return e;
    return nullptr;
  }
};

// An f32 division by a divisor that stays the same around a loop (a layer norm's rows divided by their
// deviation, softmax's by their sum) as a product in f64: x / d is rounded from double(x) x r, with
// r = 1 / double(d) computed once before the loop. That is x / d's own rounding, bit for bit, for every
// pair of floats: a quotient of two 24-bit significands is never a midpoint between floats, nor nearer to
// one than 2^-49 of its size, and r and the product round twice by at most 2^-53 each; f64's range holds
// every quotient of floats, subnormal divisors included, so zeros, infinities, NaN and overflow come out
// as the division's (1 / 0 = inf, x / inf = x x 0). A brute-force check of 1.3 x 10^9 pairs (random bits,
// and every significand against 9 divisors) found no difference. On AVX-512, 16 lanes take eight
// instructions (four conversions, two products, an extract and an insert) instead of a vdivps that holds
// the divider for about 10 cycles: the bench's layer norm 1.52-1.61 -> 1.45 ms (interleaved, two rounds;
// softmax, which divides once per element too, the same). AVX2 code ran 1-2% slower with it (a layer norm
// for x86-64-v3 on the same core), so it runs for AVX-512 targets only. The reciprocal goes in the loop's
// preheader; in a loop without one only a constant's (which folds: a mean's 1 / 1024, exact), not an f64
// division at every iteration.
struct DivideByInvariants : llvm::PassInfoMixin<DivideByInvariants> {
  llvm::PreservedAnalyses run(llvm::Function& f, llvm::FunctionAnalysisManager& fam) {
    const llvm::LoopInfo& loops = fam.getResult<llvm::LoopAnalysis>(f);
    std::vector<std::pair<llvm::Instruction*, const llvm::Loop*>> divisions;
    for (llvm::BasicBlock& block : f)
      if (const llvm::Loop* loop = loops.getLoopFor(&block))
        for (llvm::Instruction& i : block)
          if (i.getOpcode() == llvm::Instruction::FDiv && i.getType()->getScalarType()->isFloatTy() && loop->isLoopInvariant(i.getOperand(1)) &&
              (loop->getLoopPreheader() || llvm::isa<llvm::Constant>(i.getOperand(1))))
            divisions.push_back({&i, loop});
    if (divisions.empty()) return llvm::PreservedAnalyses::all();
    std::map<std::pair<const llvm::Loop*, llvm::Value*>, llvm::Value*> reciprocals;  // of each divisor, once per loop
    for (auto [division, loop] : divisions) {
      llvm::Value* divisor = division->getOperand(1);
      llvm::Value* scalar = llvm::getSplatValue(divisor);
      llvm::Value* d = scalar ? scalar : divisor;
      llvm::Value*& reciprocal = reciprocals[{loop, d}];
      if (!reciprocal) {
        llvm::BasicBlock* preheader = loop->getLoopPreheader();
        llvm::IRBuilder<> b(preheader ? preheader->getTerminator() : division);
        llvm::Type* type = d->getType()->getWithNewType(b.getDoubleTy());
        reciprocal = b.CreateFDiv(llvm::ConstantFP::get(type, 1.0), b.CreateFPExt(d, type), "reciprocal");
      }
      llvm::IRBuilder<> b(division);
      llvm::Type* wide = division->getType()->getWithNewType(b.getDoubleTy());
      llvm::Value* r = reciprocal;
      if (scalar && wide->isVectorTy()) r = b.CreateVectorSplat(llvm::cast<llvm::FixedVectorType>(wide)->getNumElements(), r);
      llvm::Value* quotient = b.CreateFPTrunc(b.CreateFMul(b.CreateFPExt(division->getOperand(0), wide), r), division->getType());
      quotient->takeName(division);
      division->replaceAllUsesWith(quotient);
      division->eraseFromParent();
    }
    llvm::PreservedAnalyses kept;  // new instructions only: the blocks and loops stand
    kept.preserveSet<llvm::CFGAnalyses>();
    return kept;
  }
};

// How much of the optimizer a nest's module gets (pipeline_for).
enum class Pipeline {
  microkernel,  // register blocks, vector code already: promoted, cleaned up, invariants hoisted
  brief,        // a nest of few points: the same, then the loop vectorizer alone
  full,         // O3, its unrolling after the vectorizers
};

// A nest of at most 2^17 points (a conv's weights packed or transposed, a weight gradient's sum of
// slices) runs in microseconds even unvectorized. O3's loop passes cost it the most: on a 3x3x64x64 weight
// packing's five loops, induction-variable simplification and instruction combining took 11-17 ms
// (scalar evolution on the nested address arithmetic) of a module that becomes one vector copy loop.
constexpr int64_t kBriefPoints = int64_t{1} << 17;

Pipeline pipeline_for(const sched::Nest& nest) {
  if (nest.microkernel) return Pipeline::microkernel;
  if (nest.points >= 0 && nest.points <= kBriefPoints) return Pipeline::brief;
  return Pipeline::full;
}

// A nest whose tensors all have fewer than 2^18 elements (1 MiB of f32) runs in microseconds: the
// optimizer spends less on it (KeepLoopsAroundVectorLoops).
bool small_nest(const sched::Nest& nest, const ProgramTypes& types) {
  const std::vector<std::string> tensors = llvm_ir::nest_tensors(nest);
  return std::all_of(tensors.begin(), tensors.end(), [&](const std::string& t) {
    const auto it = types.tensors.find(t);
    if (it == types.tensors.end()) return false;
    int64_t elements = 1;
    for (int64_t d : it->second.shape) elements *= d;
    return elements < (int64_t{1} << 18);
  });
}

// A function attribute: the module's machine code is made without Loop Strength Reduction (machine_code).
constexpr const char* kNoLoopStrengthReduction = "polytile-no-lsr";

// The code generator's legacy pass manager, which drops the pass `drop` when the code generator adds it
// (LLVM 16 has no per-module switch for a pass of its codegen pipeline, only global options).
class CodegenPasses : public llvm::legacy::PassManager {
 public:
  explicit CodegenPasses(llvm::AnalysisID drop) : drop_(drop) {}
  void add(llvm::Pass* p) override {
    if (drop_ != nullptr && p->getPassID() == drop_) {
      delete p;
      return;
    }
    llvm::legacy::PassManager::add(p);
  }

 private:
  llvm::AnalysisID drop_;
};

// Marks every function of `m` for machine code without Loop Strength Reduction (machine_code).
void without_lsr(llvm::Module& m) {
  for (llvm::Function& f : m)
    if (!f.isDeclaration()) f.addFnAttr(kNoLoopStrengthReduction);
}

}  // namespace

// The object code of `m`, as orc::SimpleCompiler makes it, but without Loop Strength Reduction where every
// function of `m` asks (kNoLoopStrengthReduction, without_lsr): every module of a micro-kernel nest (its
// loops, its uniform and border blocks) and the nests of the brief pipeline. LSR (with the IVUsers
// analysis it needs) was a third of the machine code's time on the conv's modules -- 4-12 ms of a border
// module's 25-40, 30% of the weight transposition's (llc under callgrind), 36.6 M of the 90 M
// instructions of a 3x3 conv's uniform block module -- and in a border block it only turns a few index
// computations into pointer bumps: the border-heavy convs (3x3 256->256 on 14x14, about 40% border
// blocks; the seed's strided dilated conv) ran as fast without it. The uniform blocks' fma loops, where it
// earned its time (3 lea and a shift per 8 FMAs without it, the convs' kernels 3-7% slower on a Zen 4
// guest), now come from the emitter in the form it made of them (NestEmitter::fma_address: one base
// register per operand, invariant in the loop, and the loop counter in the addressing mode), which made
// the machine code without it the same but for a shift in place of a pointer bump, and the kernels as
// fast (one thread, 6 interleaved rounds: LSR's times 0.99-1.17 of these, medians). A brief nest has
// at most 2^17 points. (A module of several nests' functions, as export links them, keeps it.)
std::unique_ptr<llvm::MemoryBuffer> machine_code(llvm::Module& m, llvm::TargetMachine& tm) {
  static const llvm::AnalysisID lsr = [] {  // LLVM 16 exports no ID of the pass: one made and dropped says it
    return std::unique_ptr<llvm::Pass>(llvm::createLoopStrengthReducePass())->getPassID();
  }();
  const bool drop = std::all_of(m.begin(), m.end(), [](const llvm::Function& f) {
    return f.isDeclaration() || f.hasFnAttribute(kNoLoopStrengthReduction);
  });
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream os(object);
  CodegenPasses pm(drop ? lsr : nullptr);
  llvm::MCContext* context = nullptr;
  if (tm.addPassesToEmitMC(pm, context, os)) throw InternalError("LLVM cannot emit machine code for " + m.getName().str());
  pm.run(m);
  return std::make_unique<llvm::SmallVectorMemoryBuffer>(std::move(object), m.getName(), /*RequiresNullTerminator=*/false);
}


// The optimization pipeline of one nest's module. A register-blocked micro-kernel is vector code already:
// it needs its allocas promoted, redundant address arithmetic removed and invariants hoisted, not the
// vectorizers and unrollers of O3 (which took 5x as long on it for no speed). Every other nest gets O3
// with its unrolling moved behind the vectorizers: O3 fully unrolls short constant loops (a nest's
// channels, a pooling window, 7 columns) before the loop vectorizer sees them, and the SLP vectorizer,
// LICM and induction-variable simplification then work through the unrolled copies. A small CNN's
// training step (54 modules) compiled in 690 ms with that order and in 415 ms with this one, and a bias
// gradient's column sums ran 1.6x as fast (its 32 channels stay one vector loop, not 32 scalar copies).
// In a `small` nest, the loops around a vectorized loop are not unrolled (KeepLoopsAroundVectorLoops).
// LICM runs once more after the unroller: a column sum's vector loop over its channels (a bias gradient's
// 32) is then straight code at fixed addresses, whose loads and stores LICM takes out of the rows' loops,
// so the sums stay in registers (they went through memory at every row: the bench's bias gradient 48 ->
// 88-110 GB/s on a Zen 3 with AVX2).
// A nest of few points gets the micro-kernel's passes and then the loop vectorizer alone (with libmvec's
// mappings): its loops stay vector loops, without O3's induction-variable work, unrolling and inlining.
// Every function carries the pipeline it got as "polytile-pipeline" (microkernel, brief, full).
void optimize(llvm::Module& m, llvm::TargetMachine& tm, Pipeline pipeline, bool small) {
  static const char* const names[] = {"microkernel", "brief", "full"};
  for (llvm::Function& f : m)
    if (!f.isDeclaration()) f.addFnAttr("polytile-pipeline", names[static_cast<int>(pipeline)]);
  const bool vector_already = pipeline == Pipeline::microkernel;
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = true;
  pto.SLPVectorization = true;
  pto.LoopUnrolling = false;  // unrolled after vectorization, below
  llvm::PassBuilder pb(&tm, pto);
  const bool avx512 = tm.getTargetFeatureString().contains("+avx512f");
  const bool avx512vl = tm.getTargetFeatureString().contains("+avx512vl");  // ScaleByPowersOfTwo's widths
  pb.registerOptimizerLastEPCallback([small, avx512, avx512vl](llvm::ModulePassManager& mpm, llvm::OptimizationLevel) {
    llvm::FunctionPassManager late;
    if (small) late.addPass(KeepLoopsAroundVectorLoops());
    if (avx512) {  // after the vectorizers
      late.addPass(ScaleByPowersOfTwo(avx512vl));
      late.addPass(DivideByInvariants());
    }
    late.addPass(llvm::LoopUnrollPass(llvm::LoopUnrollOptions(/*OptLevel=*/3).setPartial(true).setRuntime(true)));
    late.addPass(llvm::InstCombinePass());
    late.addPass(llvm::SimplifyCFGPass());
    late.addPass(llvm::createFunctionToLoopPassAdaptor(llvm::LICMPass(llvm::LICMOptions()), /*UseMemorySSA=*/true));
    late.addPass(StreamStores());
    mpm.addPass(llvm::createModuleToFunctionPassAdaptor(std::move(late)));
  });
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  // libmvec's variants on this target's widths: the vectorizer calls them in loops of libm calls and LLVM
  // math intrinsics (LLVM 16's own libmvec table stops at AVX2 widths and at glibc 2.22's functions), and
  // they replace the emitter's lane-by-lane calls in vector code it wrote itself (a micro-kernel's
  // epilogue: tanh in a GELU after a matmul).
  const std::vector<VectorMathVariant>& variants = vector_math_variants(tm);
  call_vector_math(m, variants);
  llvm::TargetLibraryInfoImpl tlii(tm.getTargetTriple());
  std::vector<llvm::VecDesc> descs;
  for (const VectorMathVariant& v : variants)
    descs.push_back({v.scalar, v.vector, llvm::ElementCount::getFixed(v.lanes)});
  tlii.addVectorizableFunctions(descs);
  // On an AVX-512 machine a module that calls a libm function with a 512-bit variant prefers 512-bit
  // vectors, so the vectorizer takes 16 lanes of f32 (8 of f64) and calls the variant: exp on 16 lanes is
  // 1.4x exp on 8 here. So does a module with the emitter's inline f32 exp (llvm_ir::kVectorMathAttribute),
  // whose 13-20 instructions are the loop's cost: softmax forward took 1.34 ms with 8 lanes and 1.12 with 16.
  // Intel's cores from Sapphire Rapids on (AVX512-FP16) run every loop on 512-bit vectors: they clock
  // 512-bit code almost as fast as 256-bit, where Skylake-SP and Cascade Lake slow down for it (LLVM's
  // reason to prefer 256 bits). On a 2-core guest of such a core (bench, interleaved, four rounds): the
  // layer norm's gradient 3.87 -> 3.27 ms (means), its forward 1.63 -> 1.60, max pool's gradient 1.57 ->
  // 1.53; the transpositions, column sums and pools the same; the bench's other cases the same within the
  // guest's noise (two rounds of all of them).
  const bool wide_cores = tm.getTargetFeatureString().contains("+avx512fp16");
  bool wide = avx512 && !vector_already && (wide_cores || std::any_of(m.begin(), m.end(), [&variants](const llvm::Function& f) {
                if (f.hasFnAttribute(llvm_ir::kVectorMathAttribute)) return true;
                return f.isDeclaration() && std::any_of(variants.begin(), variants.end(), [&f](const VectorMathVariant& v) {
                         return v.lanes * (f.getReturnType()->isDoubleTy() ? 64 : 32) == 512 && f.getName() == v.scalar;
                       });
              }));
  if (wide)
    for (llvm::Function& f : m)
      if (!f.isDeclaration()) f.addFnAttr("prefer-vector-width", "512");
  fam.registerPass([&tlii] { return llvm::TargetLibraryAnalysis(tlii); });
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  if (pipeline == Pipeline::full) {
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
    return;
  }
  // One round of instruction combining each time (LLVM's default repeats it until a round changes
  // nothing): the second round only confirmed the first. The optimized IR of the convs, their
  // gradients, softmax and its gradient, max pooling's gradient, matmuls and the small CNN's gradient
  // (25k lines) is the same byte for byte, and the bench's compile of the conv fwd + gradients took 4%
  // less time.
  constexpr unsigned kCombineOnce = 1;
  llvm::FunctionPassManager fpm;
  fpm.addPass(llvm::SROAPass(llvm::SROAOptions::ModifyCFG));
  fpm.addPass(llvm::EarlyCSEPass(true));
  fpm.addPass(llvm::InstCombinePass(kCombineOnce));
  fpm.addPass(llvm::SimplifyCFGPass());
  fpm.addPass(llvm::createFunctionToLoopPassAdaptor(llvm::LICMPass(llvm::LICMOptions()), /*UseMemorySSA=*/true));
  fpm.addPass(llvm::GVNPass());
  fpm.addPass(llvm::InstCombinePass(kCombineOnce));
  fpm.addPass(llvm::SimplifyCFGPass());
  if (pipeline == Pipeline::brief) {
    fpm.addPass(llvm::createFunctionToLoopPassAdaptor(llvm::LoopRotatePass(), /*UseMemorySSA=*/false));
    fpm.addPass(llvm::InjectTLIMappings());  // libmvec's vector variants, for the vectorizer
    fpm.addPass(llvm::LoopVectorizePass());
    fpm.addPass(llvm::InstCombinePass(kCombineOnce));
    fpm.addPass(llvm::SimplifyCFGPass());
  }
  if (avx512) {
    fpm.addPass(ScaleByPowersOfTwo(avx512vl));
    fpm.addPass(DivideByInvariants());
  }
  fpm.addPass(llvm::AlignmentFromAssumptionsPass());  // as O3 does after its vectorizers
  fpm.addPass(StreamStores());
  llvm::ModulePassManager mpm;
  mpm.addPass(llvm::AlwaysInlinerPass());  // lane-by-lane calls no vector library replaced
  mpm.addPass(llvm::createModuleToFunctionPassAdaptor(std::move(fpm)));
  mpm.run(m, mam);
}

llvm::orc::JITTargetMachineBuilder host_machine(const std::string& cpu) {
  auto machine = check(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host");
  if (!cpu.empty()) {
    machine.setCPU(cpu);
    machine.getFeatures() = llvm::SubtargetFeatures(cpu_feature_string(cpu));
  }
  machine.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
  return machine;
}

std::unique_ptr<llvm::orc::LLJIT> make_jit() {
  initialize_llvm();
  auto jit = check(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(host_machine()).create(), "creating the JIT");
  jit->getMainJITDylib().addGenerator(check(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
                                                jit->getDataLayout().getGlobalPrefix()),
                                            "opening the process for libm"));
  return jit;
}

std::string cache_key(const Program& p, const std::map<std::string, TensorType>& inputs, const CompileOptions& o) {
  std::string key = print(p);
  for (const auto& [name, t] : inputs) key += "|" + name + ":" + t.str();
  const sched::CpuModel& m = o.target.cpu;
  key += "|" + o.target.name + "/" + std::to_string(m.vector_bits) + "/" + std::to_string(m.l1_bytes) + "/" +
         std::to_string(m.l2_bytes) + "/" + std::to_string(o.target.threads) + "/" +
         std::to_string(m.microkernel_min_points) + "/" + std::to_string(m.vector_registers) + "/" +
         std::to_string(m.fma_per_cycle) + "fma/" + std::to_string(m.fma_latency) + "latency/" +
         std::to_string(m.microkernel_chunks) + "/" +
         std::to_string(m.reduction_tile_percent) + "%tiles/" +
         std::to_string(m.split_max_outputs) + "/" + std::to_string(m.split_min_points) + "/" +
         std::to_string(m.split_line_min_points) + "/" +
         (m.row_groups ? "groups/" : "alone/") + (m.prefetch ? "" : "noprefetch/") +
         (m.stream_stores ? std::to_string(m.l3_bytes) + "/" : "nostream/") + (m.pack_within_l2 ? "" : "l2unpacked/") +
         std::to_string(o.threads) + (o.tune ? "/tuned" : "") + "/" + std::to_string(o.reduce_and_defract) +
         (o.verify ? "/verified" : "") + (o.target.direct_step_loops ? "" : "/isl_steps");
  if (const auto& gpu = o.target.gpu) key += "|gpu/" + gpu->key();  // GPU semantics: the model shapes the kernels
  return key;
}

namespace {

// The host's target machines, kept between compiles. Making one is cheap; its first modules are not: the
// subtargets it makes for their functions (X86's instruction lowering and register tables) and what it
// caches took 5-10 ms of the first module's optimization and machine code on every thread of every
// compile, when each compile made its own. A machine serves one thread at a time: taken, used, given back.
class HostMachines {
 public:
  // A machine for `cpu` (Target::cpu_name; empty: this machine's CPU).
  std::unique_ptr<llvm::TargetMachine> take(const std::string& cpu) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      std::vector<std::unique_ptr<llvm::TargetMachine>>& free = free_[cpu];
      if (!free.empty()) {
        std::unique_ptr<llvm::TargetMachine> tm = std::move(free.back());
        free.pop_back();
        return tm;
      }
    }
    return check(host_machine(cpu).createTargetMachine(), "creating the target machine");
  }
  void give(const std::string& cpu, std::unique_ptr<llvm::TargetMachine> tm) {
    if (!tm) return;
    std::lock_guard<std::mutex> guard(mutex_);
    free_[cpu].push_back(std::move(tm));
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::vector<std::unique_ptr<llvm::TargetMachine>>> free_;
};

HostMachines& host_machines() {
  static HostMachines* machines = new HostMachines;  // never destroyed: no machine outlives LLVM's statics
  return *machines;
}

// One nest handed over by the scheduler, and what compiling it made: module 0 is the nest's function,
// module 1 + j its separate block j (llvm_ir::emit_nest_part), each compiled on its own.
struct CompiledNest {
  sched::Nest nest;  // a copy: the scheduler's vector grows while this is compiled
  std::vector<NestModule> modules;
};

// Compiles the nests added to it (`compile(nest, index, part, machine)` for each of their modules) on
// threads - 1 worker threads as they come, and on the caller's thread too once it calls finish(). Each
// thread holds a target machine for the target's CPU while it works (`machine`, taken from HostMachines
// for the first module it compiles; given back when the thread is done). Plain threads and one mutex-guarded queue:
// a ThreadSanitizer build follows every handoff (TBB's own, inside an uninstrumented libtbb, it cannot).
// Destroyed unfinished (lowering threw), it starts nothing more and waits for what runs.
class NestCompiler {
 public:
  using Compile = std::function<void(CompiledNest&, size_t, size_t, llvm::TargetMachine&)>;

  NestCompiler(int threads, std::string cpu, Compile compile) : cpu_(std::move(cpu)), compile_(std::move(compile)) {
    const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int w = 1; w < std::min(threads, hardware); ++w) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // no more threads to be had: finish() compiles what they would have
      }
    }
  }
  NestCompiler(const NestCompiler&) = delete;
  NestCompiler& operator=(const NestCompiler&) = delete;
  ~NestCompiler() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      claimed_ = jobs_.size();  // nothing more to start
      closed_ = true;
    }
    ready_.notify_all();
    join();
  }

  void add(const sched::Nest& nest) {
    const size_t parts = 1 + llvm_ir::separate_parts(nest);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      CompiledNest& n = nests_.emplace_back();
      n.nest = nest;
      n.modules.resize(parts);
      // Its separate blocks' modules first, the border blocks' (the largest: masked loads and stores, rows
      // partly valid) before the uniform blocks' and the nest's own loops (the smallest): a thread that
      // finds no more work while another finishes the border blocks is the compile's idle tail. The bench's
      // compile case (a 3x3 conv and its gradient) took 0.94-0.96 of its time in the order the parts are
      // numbered (78.4-78.9 -> 73.9-75.4 ms, 14 interleaved rounds; AVX2 code 79.7 -> 76.1), where the forward
      // conv's border blocks (13 ms) started after its loops (5 ms) while its uniform blocks (11 ms) ran
      // beside them, and the other thread then waited. Ordering every job by an estimate of its size
      // instead (a nest with blocks inline before the others) did no better (76.1).
      for (size_t part = parts; part-- > 0;) jobs_.emplace_back(nests_.size() - 1, part);
    }
    ready_.notify_all();
  }

  // Every nest compiled, in the order added; the first failure of one rethrown.
  std::deque<CompiledNest>& finish() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
    work();  // alongside the workers
    join();
    if (failure_) std::rethrow_exception(failure_);
    return nests_;
  }

 private:
  void join() {
    for (auto& w : workers_)
      if (w.joinable()) w.join();
  }

  void work() {  // until the queue is closed and empty, or a nest failed
    std::unique_ptr<llvm::TargetMachine> machine;  // this thread's while it works
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [&] { return claimed_ < jobs_.size() || closed_; });
      if (claimed_ >= jobs_.size() || failure_) {
        lock.unlock();
        host_machines().give(cpu_, std::move(machine));
        return;
      }
      const auto [k, part] = jobs_[claimed_++];
      CompiledNest& n = nests_[k];  // a deque: the reference survives later additions
      lock.unlock();
      try {
        if (!machine) machine = host_machines().take(cpu_);
        compile_(n, k, part, *machine);
      } catch (...) {
        std::lock_guard<std::mutex> guard(mutex_);
        if (!failure_) failure_ = std::current_exception();
      }
    }
  }

  std::string cpu_;  // the machines' CPU (Target::cpu_name)
  Compile compile_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<CompiledNest> nests_;
  std::vector<std::pair<size_t, size_t>> jobs_;  // (nest, module) in the order added
  size_t claimed_ = 0;          // jobs handed out so far
  bool closed_ = false;         // no more nests will come
  std::exception_ptr failure_;  // the first failure of a nest's compilation
  std::vector<std::thread> workers_;
};

// Group `g`'s chunk tensors placed in one chunk's memory (ChunkSlot), tensor after tensor.
GroupChunks place_chunks(const CompiledProgram::Impl& m, const sched::NestGroup& g) {
  GroupChunks out;
  for (const sched::ChunkTensor& t : g.chunk_tensors) {
    const auto slot = std::find(m.buffers.begin(), m.buffers.end(), t.tensor);
    POLYTILE_CHECK(slot != m.buffers.end(), "chunk tensor ", t.tensor, " has no buffer");
    const int64_t row_bytes = t.row_elements * static_cast<int64_t>(dtype_bytes(m.types.tensors.at(t.tensor).dtype));
    out.slots.push_back(ChunkSlot{static_cast<size_t>(slot - m.buffers.begin()), row_bytes, out.bytes});
    out.bytes += (g.rows * row_bytes + 63) / 64 * 64;
  }
  return out;
}

}  // namespace

std::vector<NestModule> lower_and_emit(CompiledProgram::Impl& impl, const Program& source, const std::map<std::string, TensorType>& inputs,
                                       const CompileOptions& options, bool objects, bool print_ir) {
  impl.inputs = inputs;
  // A GPU target's kernels run here with GPU semantics, their blocks split across the host's threads.
  impl.threads = options.threads > 0 ? options.threads : options.target.gpu ? host_target().threads : options.target.threads;
  impl.arena = std::make_unique<tbb::task_arena>(std::max(1, impl.threads));
  impl.arena->initialize();
  initialize_llvm();
  // Each nest is emitted, optimized and compiled as soon as the scheduler has placed it, by the workers
  // while this thread schedules the next statements, and by this thread too once scheduling is done: the
  // LLVM work of a gradient's first nests overlaps the scheduling of the others.
  std::map<std::string, int> index;
  ProgramTypes types;
  NestCompiler compiler(impl.threads, options.target.cpu_name, [&index, &types, objects, print_ir](CompiledNest& n, size_t k, size_t part,
                                                                                               llvm::TargetMachine& tm) {
    auto t0 = std::chrono::steady_clock::now();
    NestModule& m = n.modules[part];
    const std::string name = "nest_" + std::to_string(k);
    m.context = std::make_unique<llvm::LLVMContext>();
    m.module = std::make_unique<llvm::Module>(part == 0 ? name : name + ".part" + std::to_string(part - 1), *m.context);
    // A micro-kernel's uniform and border blocks (where it has both) are functions of their own, compiled
    // alongside the loops that call them: the forward conv's one nest is three modules on two threads.
    if (part == 0)
      llvm_ir::emit_nest(*m.module, n.nest, name, types, index, /*outline=*/true);
    else
      llvm_ir::emit_nest_part(*m.module, n.nest, name, part - 1, types, index);
    m.emit_seconds = seconds_since(t0);
    m.module->setDataLayout(tm.createDataLayout());
    m.module->setTargetTriple(tm.getTargetTriple().str());
    // Only the full pipeline's nests get Loop Strength Reduction (machine_code): a micro-kernel's blocks
    // come with their addresses in the form it made of them, a brief nest has little index arithmetic.
    const Pipeline pipeline = pipeline_for(n.nest);
    if (pipeline != Pipeline::full) without_lsr(*m.module);
    optimize(*m.module, tm, pipeline, pipeline == Pipeline::full && small_nest(n.nest, types));
    if (print_ir) {
      llvm::raw_string_ostream os(m.ir);
      m.module->print(os, nullptr);
    }
    if (objects) m.object = machine_code(*m.module, tm);
  });
  sched::LowerObserver observer;
  observer.program = [&](const Program& program, const ProgramTypes& t) {
    types = t;
    for (const auto& p : program.inputs) {
      index[p.name] = static_cast<int>(impl.buffers.size());
      impl.buffers.push_back(p.name);
    }
    for (const auto& st : program.statements) {
      index[statement_output(st)] = static_cast<int>(impl.buffers.size());
      impl.buffers.push_back(statement_output(st));
    }
  };
  observer.nest = [&compiler](size_t, const sched::Nest& nest) { compiler.add(nest); };
  sched::Lowered lowered = sched::lower(source, inputs, lower_options(options), observer);
  auto t0 = std::chrono::steady_clock::now();
  std::deque<CompiledNest>& compiled = compiler.finish();
  impl.program = std::move(lowered.program);
  impl.types = std::move(lowered.types);
  impl.schedule = std::move(lowered.schedule);
  impl.times.passes = lowered.times.passes;
  impl.times.schedule = lowered.times.schedule;
  POLYTILE_CHECK(compiled.size() == impl.schedule.nests.size(), "the scheduler reported ", compiled.size(), " of ",
                 impl.schedule.nests.size(), " nests");
  // Emission is timed per nest; optimization and machine code are what was left of them once lowering
  // was done (what ran during it is inside the lowering's time: see CompileTimes).
  impl.times.llvm_ir = 0;
  impl.ir_made = print_ir;
  std::vector<NestModule> modules;
  for (CompiledNest& n : compiled)
    for (NestModule& m : n.modules) {
      impl.times.llvm_ir += m.emit_seconds;
      impl.ir += m.ir;
      modules.push_back(std::move(m));
    }
  for (const auto& nest : impl.schedule.nests)
    for (const auto& t : llvm_ir::nest_tensors(nest)) impl.touched.insert(t);
  for (const auto& g : impl.schedule.groups) impl.chunks.push_back(place_chunks(impl, g));
  impl.times.optimize_and_jit = seconds_since(t0);
  return modules;
}

namespace {

// `print_ir`: the modules printed now (impl.ir), else on the program's first llvm_ir() call.
std::unique_ptr<CompiledProgram::Impl> build(const Program& source, const std::map<std::string, TensorType>& inputs,
                                              const CompileOptions& options, bool print_ir = false) {
  auto impl = std::make_unique<CompiledProgram::Impl>();
  std::vector<NestModule> modules = lower_and_emit(*impl, source, inputs, options, true, print_ir);
  impl->source = source;
  impl->options = options;
  auto t0 = std::chrono::steady_clock::now();
  impl->jit = make_jit();
  for (NestModule& m : modules) check(impl->jit->addObjectFile(std::move(m.object)), "adding the object code");
  for (size_t k = 0; k < impl->schedule.nests.size(); ++k) {
    auto addr = check(impl->jit->lookup("nest_" + std::to_string(k)), "looking up a nest");
    impl->nests.push_back(addr.toPtr<NestFn>());
  }
  impl->times.optimize_and_jit += seconds_since(t0);
  return impl;
}

void execute(const CompiledProgram::Impl& m, const TensorMap& inputs, TensorMap& outputs, std::vector<double>* step_seconds = nullptr);
void execute(const CompiledProgram::Impl& m, const ViewMap& inputs, const ViewMap& outputs);

// Tuning (CompileOptions::tune): variants of the target, each compiled, then all timed on the same
// deterministic inputs in interleaved rounds (time_in_rounds); the fastest wins. Until 2026-12-06 each
// variant was timed right after its compile, best of three runs in a row: on a 2-core guest the default of
// a 3x3 128-channel weight gradient was once timed at 11.8 ms, in a stretch where the other core was busy,
// and the variants after it at 5.6-5.9 ms, its own time when run again. A variant whose loops and LLVM IR
// are an earlier one's (a width of columns the plan chose anyway) is not timed again: it is reported with
// that one's time and name, so that a machine's noise cannot pick between two copies of one program.
constexpr int kTuningRounds = 5;

std::unique_ptr<CompiledProgram::Impl> tune(const Program& program, const std::map<std::string, TensorType>& inputs,
                                             const CompileOptions& options) {
  std::vector<std::pair<std::string, sched::Target>> variants;
  const sched::Target base = options.target;
  variants.emplace_back("default", base);
  sched::Target t = base;
  t.cpu.l1_bytes = base.cpu.l1_bytes / 2;
  variants.emplace_back("half L1 budget", t);
  t = base;
  t.cpu.l1_bytes = base.cpu.l1_bytes * 2;
  variants.emplace_back("double L1 budget", t);
  for (auto [percent, name] : {std::pair{50, "half tile budget"}, std::pair{200, "double tile budget"}}) {
    t = base;  // the micro-kernels' reduction tiles (on a Zen 4 not sized by L1)
    t.cpu.reduction_tile_percent = base.cpu.reduction_tile_percent * percent / 100;
    variants.emplace_back(name, t);
  }
  t = base;
  t.cpu.vector_registers = base.cpu.vector_registers * 3 / 4;
  variants.emplace_back("fewer accumulators", t);
  for (int chunks : {2, 4}) {  // the plan's model does not tell these apart on every layer (README)
    t = base;
    t.cpu.microkernel_chunks = chunks;
    variants.emplace_back("columns of " + std::to_string(chunks) + " vectors", t);
  }
  t = base;
  t.cpu.microkernel_min_points = INT64_MAX;
  variants.emplace_back("loop nests only", t);
  t = base;
  t.cpu.row_groups = false;
  variants.emplace_back("no row groups", t);
  TensorMap data;
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  for (const auto& [name, type] : inputs) {
    Buffer b(type.dtype, type.shape);
    for (int64_t e = 0; e < b.size(); ++e) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      b.set(e, static_cast<double>(state >> 40) / static_cast<double>(1 << 24) - 0.5);
    }
    data[name] = b;
  }
  // Every variant compiled first; `of[v]` is the distinct program variant v runs (an index into `programs`).
  std::vector<std::unique_ptr<CompiledProgram::Impl>> programs;
  std::vector<std::string> codes;  // each distinct program's loops and IR
  std::vector<size_t> of;
  for (const auto& [what, target] : variants) {
    CompileOptions o = options;
    o.target = target;
    auto impl = build(program, inputs, o, true);
    std::string code = sched::print_loops(impl->schedule) + impl->ir;
    const auto same = std::find(codes.begin(), codes.end(), code);
    of.push_back(static_cast<size_t>(same - codes.begin()));
    if (same != codes.end()) continue;
    codes.push_back(std::move(code));
    programs.push_back(std::move(impl));
  }
  TensorMap out;  // every variant computes the same outputs: one set of buffers, overwritten by each run
  const std::vector<double> seconds = time_in_rounds(programs.size(), kTuningRounds, [&](size_t k) {
    const auto t0 = std::chrono::steady_clock::now();
    execute(*programs[k], data, out);
    return seconds_since(t0);
  });
  TuningReport report;
  std::vector<std::string> first_name(programs.size());  // the variant that made each distinct program
  size_t best = 0;
  for (size_t v = 0; v < variants.size(); ++v) {
    const size_t k = of[v];
    std::string name = variants[v].first;
    if (first_name[k].empty()) first_name[k] = name;
    else name += " (the code of " + first_name[k] + ")";
    report.candidates.emplace_back(name, seconds[k]);
    if (options.tuning_progress) options.tuning_progress(name, seconds[k]);
    if (seconds[k] < seconds[best]) best = k;
  }
  std::stable_sort(report.candidates.begin(), report.candidates.end(),
                   [](const auto& x, const auto& y) { return x.second < y.second; });
  programs[best]->tuning = report;
  return std::move(programs[best]);
}

}  // namespace

std::string optimized_llvm_ir(const Program& program, const std::map<std::string, TensorType>& inputs,
                              const CompileOptions& options) {
  CompiledProgram::Impl impl;
  lower_and_emit(impl, program, inputs, options, false);
  return impl.ir;
}

namespace {

// The process's compiled programs, least recently used first out when more than `capacity` are kept.
struct ProgramCache {
  std::mutex mutex;
  size_t capacity = 64;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledProgram>>> entries;  // most recent first

  // The entry of `key`, moved to the front; null when there is none. Call with the mutex held.
  std::shared_ptr<const CompiledProgram> touch(const std::string& key) {
    auto it = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; });
    if (it == entries.end()) return nullptr;
    entries.splice(entries.begin(), entries, it);
    return it->second;
  }
  std::shared_ptr<const CompiledProgram> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex);
    return touch(key);
  }
  std::shared_ptr<const CompiledProgram> add(const std::string& key, std::shared_ptr<const CompiledProgram> compiled) {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto kept = touch(key)) return kept;  // another thread compiled it first: keep one
    entries.emplace_front(key, std::move(compiled));
    trim();
    return entries.front().second;
  }
  void trim() {
    while (entries.size() > capacity) entries.pop_back();
  }
};

ProgramCache& program_cache() {
  static ProgramCache cache;
  return cache;
}

}  // namespace

void check_runs_here(const sched::Target& target) {
  const std::vector<std::string> missing = missing_cpu_features(target.cpu_name);
  if (missing.empty()) return;
  std::string list;
  for (const std::string& f : missing) list += (list.empty() ? "" : ", ") + f;
  user_error("code for CPU ", target.cpu_name, " cannot run on this machine, which lacks ", list,
             ": export it for that CPU instead (polytile compile --target cpu --cpu ", target.cpu_name, ")");
}

void check_threads(int threads) {
  if (threads < 0 || threads > kMaxThreads)
    user_error("threads ", threads, ": give 0 (the target's thread count) or a thread count from 1 to ", kMaxThreads);
}

std::vector<double> time_in_rounds(size_t candidates, int rounds, const std::function<double(size_t)>& run, double prune) {
  if (rounds < 1) throw UserError("time_in_rounds: rounds must be at least 1, not " + std::to_string(rounds));
  if (!(prune >= 1)) throw UserError("time_in_rounds: prune must be at least 1, not " + std::to_string(prune));
  std::vector<double> fastest(candidates, std::numeric_limits<double>::infinity());
  if (candidates == 0) return fastest;
  for (size_t k = 0; k < candidates; ++k) run(k);  // untimed: first runs allocate and fault in their memory
  std::vector<bool> pruned(candidates, false);
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < candidates; ++i) {
      const size_t k = (static_cast<size_t>(r) + i) % candidates;
      if (!pruned[k]) fastest[k] = std::min(fastest[k], run(k));
    }
    if (r == 0) {
      const double best = *std::min_element(fastest.begin(), fastest.end());
      for (size_t k = 0; k < candidates; ++k) pruned[k] = fastest[k] > prune * best;
    }
  }
  return fastest;
}

std::shared_ptr<const CompiledProgram> compile(const Program& program, const std::map<std::string, TensorType>& inputs,
                                               const CompileOptions& options) {
  check_threads(options.threads);
  check_runs_here(options.target);
  auto fresh = [&] {
    return std::make_shared<const CompiledProgram>(options.tune ? tune(program, inputs, options) : build(program, inputs, options));
  };
  if (!options.cache) return fresh();
  ProgramCache& cache = program_cache();
  std::string key = cache_key(program, inputs, options);
  if (auto hit = cache.find(key)) return hit;
  return cache.add(key, fresh());
}

void clear_cache() {
  ProgramCache& cache = program_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.entries.clear();
}

void set_cache_capacity(size_t programs) {
  ProgramCache& cache = program_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.capacity = programs;
  cache.trim();
}

size_t cached_programs() {
  ProgramCache& cache = program_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.entries.size();
}

TensorMap CompiledProgram::run(const TensorMap& inputs) const {
  TensorMap outputs;
  run(inputs, outputs);
  return outputs;
}

void CompiledProgram::run(const TensorMap& inputs, TensorMap& outputs) const { execute(*impl_, inputs, outputs); }

std::vector<StepTime> CompiledProgram::profile(const TensorMap& inputs, int runs) const {
  if (runs < 1) user_error("profile: give a run count of 1 or more, not ", runs);
  const sched::Schedule& schedule = impl_->schedule;
  std::vector<StepTime> steps;
  auto group = schedule.groups.begin();
  for (size_t k = 0; k < schedule.nests.size(); ++k) {
    if (group != schedule.groups.end() && group->first == k) {
      steps.push_back({"row group " + schedule.nests[k].name + " .. " + schedule.nests[group->last].name, k, group->last, 0});
      k = group->last;
      ++group;
      continue;
    }
    steps.push_back({schedule.nests[k].name, k, k, 0});
  }
  TensorMap outputs;
  execute(*impl_, inputs, outputs);  // outputs and scratch tensors allocated, pages faulted in: not timed
  std::vector<double> seconds(steps.size(), 0.0);
  for (int r = 0; r < runs; ++r) execute(*impl_, inputs, outputs, &seconds);
  POLYTILE_CHECK(seconds.size() == steps.size(), "profile: ", seconds.size(), " steps timed, ", steps.size(), " in the schedule");
  for (size_t i = 0; i < steps.size(); ++i) steps[i].seconds = seconds[i] / runs;
  return steps;
}

void CompiledProgram::run(const ViewMap& inputs, const ViewMap& outputs) const { execute(*impl_, inputs, outputs); }

namespace {

// This thread's memory for the chunk tensors of row groups: at least `bytes`, 64-byte aligned, kept for the
// thread's next chunks (the same cache lines, chunk after chunk).
char* chunk_memory(int64_t bytes) {
  struct Memory {
    void* data = nullptr;
    int64_t size = 0;
    ~Memory() { std::free(data); }
  };
  thread_local Memory memory;
  if (memory.size < bytes) {
    std::free(memory.data);
    memory.size = 0;
    memory.data = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    if (!memory.data) throw std::bad_alloc();
    memory.size = bytes;
  }
  return static_cast<char*>(memory.data);
}

void run_nests_in_arena(const CompiledProgram::Impl& m, std::vector<char*>& ptrs, std::vector<double>* step_seconds);

// Runs the nests on the buffer table `ptrs`: inputs and outputs are in place; every other slot a nest
// touches gets a scratch tensor from the pool (returned to it afterwards, also when a nest throws), except
// the row groups' chunk tensors, which live in the memory of the thread that runs a chunk.
// With `step_seconds`, each step's time (a row group's, or a nest's) is added to its entry, in the order
// the steps run.
void run_nests(const CompiledProgram::Impl& m, std::vector<char*>& ptrs, std::vector<double>* step_seconds = nullptr) {
  TensorMap scratch = m.scratch_pool.take();
  struct GiveBack {  // also when a nest throws
    const CompiledProgram::Impl& m;
    TensorMap& scratch;
    ~GiveBack() { m.scratch_pool.give(std::move(scratch)); }
  } give_back{m, scratch};
  std::vector<bool> in_chunks(m.buffers.size(), false);
  for (const GroupChunks& g : m.chunks)
    for (const ChunkSlot& s : g.slots) in_chunks[s.slot] = true;
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const std::string& name = m.buffers[i];
    if (ptrs[i] || in_chunks[i] || !m.touched.count(name) || m.inputs.count(name)) continue;
    const TensorType& t = m.types.tensors.at(name);
    auto kept = scratch.find(name);
    if (kept == scratch.end()) kept = scratch.emplace(name, Buffer(t.dtype, t.shape)).first;
    ptrs[i] = static_cast<char*>(kept->second.data());
  }
  m.arena->execute([&] { run_nests_in_arena(m, ptrs, step_seconds); });
}

// run_nests inside the program's arena.
void run_nests_in_arena(const CompiledProgram::Impl& m, std::vector<char*>& ptrs, std::vector<double>* step_seconds) {
  auto group = m.schedule.groups.begin();
  size_t step = 0;
  std::chrono::steady_clock::time_point started;
  if (step_seconds) started = std::chrono::steady_clock::now();
  auto timed = [&] {  // the step that ran last
    if (!step_seconds) return;
    const auto now = std::chrono::steady_clock::now();
    if (step_seconds->size() <= step) step_seconds->resize(step + 1, 0.0);
    (*step_seconds)[step++] += std::chrono::duration<double>(now - started).count();
    started = now;
  };
  for (size_t k = 0; k < m.nests.size(); ++k, timed()) {
    const sched::Nest& nest = m.schedule.nests[k];
    NestFn fn = m.nests[k];
    if (group != m.schedule.groups.end() && group->first == k) {  // a row group: every nest on a chunk, chunk after chunk
      const GroupChunks& in_memory = m.chunks[static_cast<size_t>(group - m.schedule.groups.begin())];
      const sched::NestGroup& g = *group++;
      auto chunks = [&](int64_t begin, int64_t end) {
        // With chunk tensors, this task's own table: their slots in this thread's chunk memory.
        std::vector<char*> own;
        char** table = ptrs.data();
        char* memory = nullptr;
        if (!in_memory.slots.empty()) {
          own = ptrs;
          table = own.data();
          memory = chunk_memory(in_memory.bytes);
        }
        for (int64_t c = begin; c < end; c += g.rows) {
          for (const ChunkSlot& s : in_memory.slots)  // integer arithmetic: the shifted pointer is outside the memory
            table[s.slot] = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(memory + s.offset) -
                                                    static_cast<uintptr_t>((c - nest.outer_lo) * s.row_bytes));
          for (size_t j = g.first; j <= g.last; ++j) m.nests[j](table, c, std::min(end, c + g.rows));
        }
      };
      if (m.threads <= 1) {
        chunks(nest.outer_lo, nest.outer_hi + 1);
      } else {
        // TBB's auto partitioner: a few ranges a thread, split again only when a thread runs out of work; each
        // range runs chunk after chunk. With the simple partitioner every chunk was a task of its own (a
        // layer norm over 8192 x 1024: 1639 tasks of 5 rows, each with its own copy of the buffer table),
        // and the tasks cost 4-10% (bench, interleaved, three rounds): layer norm 1.77 -> 1.68 ms, its gradient
        // 4.5 -> 4.1, softmax 1.21 -> 1.16, its gradient 1.46 -> 1.37.
        tbb::parallel_for(tbb::blocked_range<int64_t>(nest.outer_lo, nest.outer_hi + 1, static_cast<size_t>(g.rows)),
                          [&](const tbb::blocked_range<int64_t>& r) { chunks(r.begin(), r.end()); });
      }
      k = g.last;
      continue;
    }
    if (nest.kernel && nest.kernel->blocks() > 1 && m.threads > 1) {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, nest.kernel->blocks()),
                        [&](const tbb::blocked_range<int64_t>& r) { fn(ptrs.data(), r.begin(), r.end()); });
      continue;
    }
    if (!splits_outer_loop(nest) || m.threads <= 1) {
      fn(ptrs.data(), INT64_MIN, INT64_MAX);
      continue;
    }
    tbb::parallel_for(tbb::blocked_range<int64_t>(nest.outer_lo, nest.outer_hi + 1),
                      [&](const tbb::blocked_range<int64_t>& r) { fn(ptrs.data(), r.begin(), r.end()); });
  }
}

void execute(const CompiledProgram::Impl& m, const TensorMap& inputs, TensorMap& outputs, std::vector<double>* step_seconds) {
  for (const auto& [name, t] : m.inputs) compiled_input(inputs, name, t);
  // Every nest writes all of its tensor's elements, so outputs of the right type are reused as they are;
  // tensors no nest touches (inlined producers) get no memory.
  std::set<std::string> is_output(m.program.outputs.begin(), m.program.outputs.end());
  TensorMap env;  // outputs allocated by this run
  std::vector<char*> ptrs(m.buffers.size(), nullptr);
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const std::string& name = m.buffers[i];
    if (m.inputs.count(name)) {
      ptrs[i] = static_cast<char*>(const_cast<void*>(inputs.at(name).data()));  // read only
      continue;
    }
    if (!is_output.count(name)) continue;
    const TensorType& t = m.types.tensors.at(name);
    if (Buffer* reuse = reusable_output(outputs, name, t)) {
      ptrs[i] = static_cast<char*>(reuse->data());
      continue;
    }
    env[name] = Buffer(t.dtype, t.shape);
    ptrs[i] = static_cast<char*>(env[name].data());
  }
  run_nests(m, ptrs, step_seconds);
  for (const auto& o : m.program.outputs) {
    auto it = env.find(o);
    if (it != env.end()) outputs[o] = std::move(it->second);
    else if (!m.types.tensors.count(o) || m.inputs.count(o)) outputs[o] = inputs.at(o);
  }
}

// The same on caller memory (see CompiledProgram::run with views).
void execute(const CompiledProgram::Impl& m, const ViewMap& inputs, const ViewMap& outputs) {
  auto check = [&](const std::string& name, const TensorView& v, const TensorType& t, const char* role) {
    if (v.dtype != t.dtype || v.shape != t.shape)
      user_error(role, " ", name, " is a view of ", v.type_str(), " but the program was compiled for ", t.str());
    if (!v.contiguous())
      user_error(role, " ", name, ": the view is not contiguous row-major (polytile runs on the memory in place; copy the tensor "
                 "to a contiguous one first)");
    if (!v.data && v.byte_size() != 0) user_error(role, " ", name, ": the view has no data");
    if (reinterpret_cast<uintptr_t>(v.data) % dtype_bytes(v.dtype) != 0)
      user_error(role, " ", name, ": the view's data is not aligned to its ", dtype_bytes(v.dtype), "-byte elements");
  };
  for (const auto& [name, t] : m.inputs) {
    auto it = inputs.find(name);
    if (it == inputs.end()) user_error("missing input ", name);
    check(name, it->second, t, "input");
  }
  for (const auto& [name, v] : inputs)
    if (!m.inputs.count(name)) user_error("input ", name, " is not an input of the program");
  for (const auto& [name, v] : outputs)
    if (std::find(m.program.outputs.begin(), m.program.outputs.end(), name) == m.program.outputs.end())
      user_error("output ", name, " is not an output of the program");
  for (const std::string& name : m.program.outputs) {
    auto it = outputs.find(name);
    if (it == outputs.end()) user_error("missing output ", name, ": every output needs a view to be written into");
    check(name, it->second, m.types.tensors.count(name) ? m.types.tensors.at(name) : m.inputs.at(name), "output");
  }
  // Outputs are written while inputs are read: no output may share memory with another view.
  auto range = [](const TensorView& v) {
    auto* p = static_cast<const char*>(v.data);
    return std::pair{p, p + v.byte_size()};
  };
  for (const auto& [name, out] : outputs) {
    auto [lo, hi] = range(out);
    if (lo == hi) continue;
    for (const auto* views : {&inputs, &outputs}) {
      for (const auto& [other, v] : *views) {
        if (views == &outputs && other == name) continue;
        auto [olo, ohi] = range(v);
        if (olo < hi && lo < ohi)
          user_error("output ", name, " overlaps ", views == &inputs ? "input " : "output ", other,
                     " in memory: polytile writes outputs while it reads its inputs");
      }
    }
  }
  std::vector<char*> ptrs(m.buffers.size(), nullptr);
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const std::string& name = m.buffers[i];
    if (m.inputs.count(name)) ptrs[i] = static_cast<char*>(inputs.at(name).data);
    else if (auto o = outputs.find(name); o != outputs.end()) ptrs[i] = static_cast<char*>(o->second.data);
  }
  run_nests(m, ptrs);
  // An output that is an input of the program, passed through.
  for (const std::string& name : m.program.outputs)
    if (m.inputs.count(name) && outputs.at(name).byte_size())
      std::memcpy(outputs.at(name).data, inputs.at(name).data, outputs.at(name).byte_size());
}

}  // namespace

TensorMap run(const Program& program, const TensorMap& inputs, const CompileOptions& options) {
  std::map<std::string, TensorType> types;
  for (const auto& [name, b] : inputs) types[name] = TensorType{b.dtype(), b.shape()};
  infer_types(program, types);  // user errors first, before compiling
  return compile(program, types, options)->run(inputs);
}

}  // namespace polytile::cpu
