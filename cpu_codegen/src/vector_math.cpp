// glibc's vector math library (libmvec) for the host: which of its variants this process can call on a
// target, for the loop vectorizer and in place of the emitter's lane-by-lane calls.
#include "internal.h"

#include "polytile/llvm_ir.h"

#include <llvm/IR/Instructions.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Target/TargetMachine.h>

#include <map>
#include <mutex>
#include <string>

namespace polytile::cpu {

namespace {

// The functions of the language that libm computes and libmvec has in vector form: the first five since
// glibc 2.22, the others since 2.35 (so a variant is offered only where the process finds its symbol).
// Two-argument functions take "vv" in the vector ABI's name.
struct MathFunction {
  const char* name;     // libm's double version; f32 appends "f"
  const char* llvm;     // the LLVM intrinsic's base name, or nullptr
  bool two_arguments;
};
constexpr MathFunction kFunctions[] = {
    {"sin", "llvm.sin", false},  {"cos", "llvm.cos", false}, {"exp", "llvm.exp", false}, {"log", "llvm.log", false},
    {"pow", "llvm.pow", true},   {"tanh", nullptr, false},   {"erf", nullptr, false},    {"tan", nullptr, false},
    {"asin", nullptr, false},    {"acos", nullptr, false},   {"atan", nullptr, false},   {"sinh", nullptr, false},
    {"cosh", nullptr, false}};

// The x86 vector ABI's instruction sets: 'b' SSE (128-bit registers), 'd' AVX2 (256), 'e' AVX-512 (512).
struct Isa {
  char letter;
  unsigned bits;
  const char* feature;  // what the target must have, or nullptr
};
constexpr Isa kIsas[] = {{'b', 128, nullptr}, {'d', 256, "+avx2"}, {'e', 512, "+avx512f"}};

std::vector<VectorMathVariant> variants_for(const llvm::StringRef features) {
  std::vector<VectorMathVariant> out;
  for (const Isa& isa : kIsas) {
    if (isa.feature && !features.contains(isa.feature)) continue;
    for (const MathFunction& f : kFunctions)
      for (bool f32 : {true, false}) {
        const unsigned lanes = isa.bits / (f32 ? 32 : 64);
        const std::string scalar = std::string(f.name) + (f32 ? "f" : "");
        const std::string vector = std::string("_ZGV") + isa.letter + "N" + std::to_string(lanes) +
                                   (f.two_arguments ? "vv_" : "v_") + scalar;
        if (!llvm::sys::DynamicLibrary::SearchForAddressOfSymbol(vector)) continue;
        out.push_back({scalar, vector, lanes});
        if (f.llvm) out.push_back({std::string(f.llvm) + (f32 ? ".f32" : ".f64"), vector, lanes});
      }
  }
  return out;
}

}  // namespace

// Once per target feature string: every nest's module asks, and the answer depends on nothing else.
const std::vector<VectorMathVariant>& vector_math_variants(const llvm::TargetMachine& tm) {
  initialize_llvm();  // loads libmvec where the system has it
  static std::mutex mutex;
  static std::map<std::string, std::vector<VectorMathVariant>> known;
  const std::string features = tm.getTargetFeatureString().str();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(features);
  if (it == known.end()) it = known.emplace(features, variants_for(features)).first;
  return it->second;  // std::map: the entry stays where it is
}

void call_vector_math(llvm::Module& m, const std::vector<VectorMathVariant>& variants) {
  std::map<std::pair<std::string, unsigned>, const VectorMathVariant*> by_name;
  for (const VectorMathVariant& v : variants) by_name[{v.scalar, v.lanes}] = &v;
  std::vector<std::pair<llvm::Function*, const VectorMathVariant*>> replace;
  for (llvm::Function& f : m) {
    auto* vty = llvm::dyn_cast<llvm::FixedVectorType>(f.getReturnType());
    if (!vty) continue;
    std::string scalar;  // what f computes on each lane
    const llvm::StringRef name = f.getName();
    if (name.startswith(llvm_ir::kLanesPrefix) && !f.isDeclaration()) {
      scalar = name.drop_front(std::string(llvm_ir::kLanesPrefix).size()).rsplit('.').first.str();
    } else if (f.isIntrinsic()) {
      const llvm::StringRef base = name.rsplit('.').first;  // llvm.sin.v16f32 -> llvm.sin
      const llvm::Type* element = vty->getElementType();
      if (!element->isFloatTy() && !element->isDoubleTy()) continue;
      scalar = base.str() + (element->isFloatTy() ? ".f32" : ".f64");
    } else {
      continue;
    }
    auto it = by_name.find({scalar, vty->getNumElements()});
    if (it != by_name.end()) replace.push_back({&f, it->second});
  }
  for (const auto& [f, variant] : replace) {
    llvm::FunctionCallee callee = m.getOrInsertFunction(variant->vector, f->getFunctionType());
    std::vector<llvm::CallInst*> calls;
    for (llvm::User* u : f->users())
      if (auto* call = llvm::dyn_cast<llvm::CallInst>(u); call && call->getCalledFunction() == f) calls.push_back(call);
    for (llvm::CallInst* call : calls) {
      std::vector<llvm::Value*> args(call->arg_begin(), call->arg_end());
      auto* vector_call = llvm::CallInst::Create(callee, args, "", call);
      vector_call->takeName(call);
      call->replaceAllUsesWith(vector_call);
      call->eraseFromParent();
    }
    if (f->use_empty() && !f->isDeclaration()) f->eraseFromParent();
  }
}

}  // namespace polytile::cpu
