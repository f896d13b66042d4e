// LLVM IR for scheduled loop nests. Data model: one LLVM function per Nest,
//   void nest_<k>(ptr buffers, i64 lo, i64 hi)
// where buffers[i] points at tensor i's elements (row-major; bool as i8). Loop iterators live in allocas
// (promoted to SSA by the optimizer); the outermost loop of a parallel nest only runs iterator values in
// [lo, hi). Statement bodies follow the dtype rules of ir.h: literals and dims enter as exact f64 values
// converted by the operation that consumes them, integer division floors (x / 0 = 0), i32 wraps,
// max/min propagate NaN.
// This file: the entry function, loops and guards, loop expressions, and the public emit_nest(s).
#include "nest_emitter.h"

#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include <algorithm>
#include <set>

namespace polytile::llvm_ir::internal {

// The body takes one noalias pointer per tensor it touches (they are distinct buffers), so loads and
// stores can be reordered and vectorized; the exported entry unpacks them from the buffer array.
llvm::Function* NestEmitter::emit(const std::string& name) {
  auto* i64 = b_.getInt64Ty();
  auto* ptr = b_.getPtrTy();
  std::vector<std::string> used = tensors_used();
  std::vector<llvm::Type*> params(used.size(), ptr);
  params.push_back(i64);
  params.push_back(i64);
  auto* body_ty = llvm::FunctionType::get(b_.getVoidTy(), params, false);
  fn_ = llvm::Function::Create(body_ty, llvm::Function::InternalLinkage, name + ".body", m_);
  name_ = name;
  prologue(fn_, used);
  lo_ = fn_->getArg(static_cast<unsigned>(used.size()));
  hi_ = fn_->getArg(static_cast<unsigned>(used.size() + 1));
  lo_->setName("lo");
  hi_->setName("hi");
  if (nest_.kernel) {
    // GPU semantics on the host: blocks [lo, hi) of the grid (x fastest); in each, the code mapped to
    // threads runs for every thread (host_threads).
    const sched::KernelLaunch& k = *nest_.kernel;
    auto clamp = [&](Value* v, int64_t a, int64_t z) {
      v = b_.CreateSelect(b_.CreateICmpSLT(v, b_.getInt64(a)), b_.getInt64(a), v);
      return b_.CreateSelect(b_.CreateICmpSGT(v, b_.getInt64(z)), b_.getInt64(z), v);
    };
    llvm::AllocaInst* linear = b_.CreateAlloca(ix_, nullptr, "block");
    auto index = [&](Value* v) { return b_.CreateIntCast(v, ix_, true); };  // the blocks fit ix_ (index32)
    counted_loop(linear, index(clamp(lo_, 0, k.blocks())), index(clamp(hi_, 0, k.blocks())), [&] {
      Value* at = b_.CreateLoad(ix_, linear);
      b_.CreateStore(b_.CreateSRem(at, ix(k.grid[0])), hardware_[0][0]);
      b_.CreateStore(b_.CreateSRem(b_.CreateSDiv(at, ix(k.grid[0])), ix(k.grid[1])), hardware_[0][1]);
      b_.CreateStore(b_.CreateSDiv(at, ix(k.grid[0] * k.grid[1])), hardware_[0][2]);
      // Shared tiles start as NaN (all ones) in every block: an element read before it was copied shows.
      for (size_t t = 0; t < shared_.size(); ++t)
        b_.CreateMemSet(shared_[t], b_.getInt8(0xff), m_.getDataLayout().getTypeAllocSize(shared_types_[t]), llvm::MaybeAlign(16));
      node(nest_.root, false);
    });
  } else {
    node(nest_.root, true);
  }
  b_.CreateRetVoid();
  llvm::Function* stream = nest_.stream ? streaming_body(name) : nullptr;

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
  if (stream) {  // the streaming body where the tensor written (the first) is aligned as it promises
    auto* aligned = llvm::BasicBlock::Create(ctx_, "aligned", outer);
    auto* other = llvm::BasicBlock::Create(ctx_, "unaligned", outer);
    Value* low = ob.CreateAnd(ob.CreatePtrToInt(args[0], i64), ob.getInt64(kStreamAlignment - 1));
    ob.CreateCondBr(ob.CreateICmpEQ(low, ob.getInt64(0)), aligned, other);
    ob.SetInsertPoint(aligned);
    ob.CreateCall(stream, args);
    ob.CreateRetVoid();
    ob.SetInsertPoint(other);
  }
  ob.CreateCall(fn_, args);
  ob.CreateRetVoid();
  return outer;
}

// A copy of the body just emitted whose first parameter (the tensor written) is aligned to
// kStreamAlignment and marked kStreamAttribute, with the alignment also assumed where its code starts (so
// that LLVM carries it to the vector stores its vectorizer makes), and kept a function of its own.
llvm::Function* NestEmitter::streaming_body(const std::string& name) {
  POLYTILE_CHECK(!nest_.kernel, "kernel ", nest_.name, " is marked to store past the caches");  // the scheduler's rule
  llvm::ValueToValueMapTy map;
  llvm::Function* copy = llvm::CloneFunction(fn_, map);
  copy->setName(name + ".stream");
  copy->addFnAttr(llvm::Attribute::NoInline);
  copy->addParamAttr(0, llvm::Attribute::getWithAlignment(ctx_, llvm::Align(kStreamAlignment)));
  copy->addParamAttr(0, llvm::Attribute::get(ctx_, kStreamAttribute));
  llvm::IRBuilder<> cb(&*copy->getEntryBlock().getFirstInsertionPt());
  cb.CreateAlignmentAssumption(m_.getDataLayout(), copy->getArg(0), kStreamAlignment);
  return copy;
}

llvm::Function* NestEmitter::emit_kernel(const std::string& name) {
  POLYTILE_CHECK(nest_.kernel, "nest ", nest_.name, " was not scheduled for a GPU");
  std::vector<std::string> used = tensors_used();
  std::vector<llvm::Type*> params(used.size(), b_.getPtrTy(1));  // global memory
  fn_ = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), params, false), llvm::Function::ExternalLinkage, name, m_);
  prologue(fn_, used);
  static const llvm::Intrinsic::ID index_registers[2][3] = {
      {llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z},
      {llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_y, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_z}};
  for (int h = 0; h < 2; ++h)
    for (int a = 0; a < 3; ++a)
      b_.CreateStore(b_.CreateZExtOrTrunc(b_.CreateIntrinsic(index_registers[h][a], {}, {}), ix_), hardware_[h][a]);
  node(nest_.root, false);
  b_.CreateRetVoid();
  // A kernel entry, with its launch's block size as the most threads it runs with (a register budget).
  llvm::NamedMDNode* annotations = m_.getOrInsertNamedMetadata("nvvm.annotations");
  auto annotate = [&](const char* key, int64_t value) {
    annotations->addOperand(llvm::MDNode::get(ctx_, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, key),
                                                     llvm::ConstantAsMetadata::get(b_.getInt32(static_cast<int32_t>(value)))}));
  };
  annotate("kernel", 1);
  annotate("maxntidx", nest_.kernel->block[0]);
  annotate("maxntidy", nest_.kernel->block[1]);
  annotate("maxntidz", nest_.kernel->block[2]);
  return fn_;
}

// The function of separate block `part` of the nest whose function is `name`.
static std::string part_name(const std::string& name, size_t part) { return name + ".part" + std::to_string(part); }

bool NestEmitter::predicated(const sched::LoopNode& n) {
  if (n.kind == sched::LoopNode::Kind::statement && n.predicated) return true;
  return std::any_of(n.body.begin(), n.body.end(), predicated) || std::any_of(n.otherwise.begin(), n.otherwise.end(), predicated);
}

bool NestEmitter::outlined(const sched::Nest& nest, const sched::LoopNode& n) {
  return n.kind == sched::LoopNode::Kind::block && n.separate && !nest.kernel && (!nest.stream || predicated(n));
}

std::vector<const sched::LoopNode*> NestEmitter::separate_blocks(const sched::Nest& nest) {
  std::vector<const sched::LoopNode*> out;
  std::function<void(const sched::LoopNode&)> walk = [&](const sched::LoopNode& n) {
    if (outlined(nest, n)) {
      out.push_back(&n);
      return;
    }
    for (const auto& c : n.body) walk(c);
    for (const auto& c : n.otherwise) walk(c);
  };
  if (!nest.kernel) walk(nest.root);
  return out;
}

std::vector<int> NestEmitter::free_iterators(const sched::LoopNode& n) {
  std::set<int> read, defined;
  std::function<void(const sched::LoopExpr&)> expr = [&](const sched::LoopExpr& e) {
    if (e.kind == sched::LoopExpr::Kind::iterator) read.insert(e.iterator);
    for (const auto& a : e.args) expr(a);
  };
  std::function<void(const sched::LoopNode&)> walk = [&](const sched::LoopNode& x) {
    if (x.kind == sched::LoopNode::Kind::loop) {
      defined.insert(x.iterator);
      expr(x.lower);
      expr(x.condition);
    }
    if (x.kind == sched::LoopNode::Kind::guard) expr(x.condition);
    for (const auto& a : x.args) expr(a);
    for (const auto& a : x.registers) expr(a);
    for (const auto& c : x.body) walk(c);
    for (const auto& c : x.otherwise) walk(c);
  };
  walk(n);
  std::vector<int> out;
  for (int it : read)
    if (!defined.count(it)) out.push_back(it);
  return out;
}

llvm::FunctionType* NestEmitter::part_type(const std::vector<int>& free) {
  std::vector<llvm::Type*> params(tensors_used().size(), b_.getPtrTy());
  params.insert(params.end(), free.size(), ix_);
  return llvm::FunctionType::get(b_.getVoidTy(), params, false);
}

void NestEmitter::call_part(const sched::LoopNode& n) {
  const std::vector<int> free = free_iterators(n);
  llvm::FunctionCallee part = m_.getOrInsertFunction(part_name(name_, parts_called_++), part_type(free));
  if (auto* f = llvm::dyn_cast<llvm::Function>(part.getCallee())) f->addFnAttr(llvm::Attribute::NoUnwind);
  std::vector<Value*> args;
  for (const auto& t : tensors_used()) args.push_back(ptrs_.at(t));
  for (int it : free) args.push_back(b_.CreateLoad(ix_, iters_.at(static_cast<size_t>(it))));
  b_.CreateCall(part, args);
}

llvm::Function* NestEmitter::emit_part(const std::string& name, size_t part) {
  const std::vector<const sched::LoopNode*> blocks = separate_blocks(nest_);
  POLYTILE_CHECK(part < blocks.size(), "nest ", nest_.name, " has no separate block ", part);
  const sched::LoopNode& n = *blocks[part];
  const std::vector<std::string> used = tensors_used();
  const std::vector<int> free = free_iterators(n);
  fn_ = llvm::Function::Create(part_type(free), llvm::Function::ExternalLinkage, part_name(name, part), m_);
  prologue(fn_, used);
  for (size_t k = 0; k < free.size(); ++k) {
    Value* v = fn_->getArg(static_cast<unsigned>(used.size() + k));
    v->setName("c" + std::to_string(free[k]));
    b_.CreateStore(v, iters_.at(static_cast<size_t>(free[k])));
  }
  for (const auto& c : n.body) node(c, false);
  b_.CreateRetVoid();
  return fn_;
}

void NestEmitter::prologue(llvm::Function* fn, const std::vector<std::string>& used) {
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  for (size_t i = 0; i < used.size(); ++i) {
    fn->getArg(static_cast<unsigned>(i))->setName(used[i]);
    fn->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoAlias);
    ptrs_[used[i]] = fn->getArg(static_cast<unsigned>(i));
  }
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn));
  for (int k = 0; k < nest_.iterators; ++k) iters_.push_back(b_.CreateAlloca(ix_, nullptr, "c" + std::to_string(k)));
  if (nest_.kernel) {
    static const char* const names[2][3] = {{"block.x", "block.y", "block.z"}, {"thread.x", "thread.y", "thread.z"}};
    for (int h = 0; h < 2; ++h)
      for (int a = 0; a < 3; ++a) {
        hardware_[h][a] = b_.CreateAlloca(ix_, nullptr, names[h][a]);
        b_.CreateStore(ix(0), hardware_[h][a]);
      }
    // Shared tiles: static shared memory (addrspace 3) on the device, a stack array on the host.
    for (size_t t = 0; t < nest_.shared.size(); ++t) {
      const sched::SharedTile& tile = nest_.shared[t];
      llvm::Type* type = storage_type(types_.tensors.at(tile.tensor).dtype);
      for (size_t d = tile.sizes.size(); d-- > 0;)
        type = llvm::ArrayType::get(type, static_cast<uint64_t>(d + 1 == tile.sizes.size() ? std::max(tile.pitch, tile.sizes[d]) : tile.sizes[d]));
      shared_types_.push_back(type);
      const std::string name = fn->getName().str() + "_shared_" + tile.tensor;
      if (device_) {
        auto* g = new llvm::GlobalVariable(m_, type, false, llvm::GlobalValue::InternalLinkage, llvm::UndefValue::get(type), name,
                                           nullptr, llvm::GlobalValue::NotThreadLocal, 3);
        g->setAlignment(llvm::Align(16));
        shared_.push_back(g);
      } else {
        auto* a = b_.CreateAlloca(type, nullptr, name);
        a->setAlignment(llvm::Align(16));
        shared_.push_back(a);
      }
      std::vector<llvm::AllocaInst*> origin;
      for (size_t d = 0; d < tile.sizes.size(); ++d)
        origin.push_back(b_.CreateAlloca(ix_, nullptr, "origin." + tile.tensor + "." + std::to_string(d)));
      origins_.push_back(std::move(origin));
    }
    if (!nest_.shared.empty()) copy_element_ = b_.CreateAlloca(ix_, nullptr, "copy.element");
    if (nest_.accumulators) {
      // A thread keeps its accumulators from one step to the next; on the host, where a block's threads
      // run one after another in each step, every thread has its own part of the array.
      const int64_t threads = device_ ? 1 : nest_.kernel->block[0] * nest_.kernel->block[1] * nest_.kernel->block[2];
      auto* type = llvm::ArrayType::get(storage_type(types_.tensors.at(nest_.tensor).dtype),
                                        static_cast<uint64_t>(nest_.accumulators->elements() * threads));
      accumulators_ = b_.CreateAlloca(type, nullptr, "accumulators");
    }
  }
  if (nest_.microkernel || nest_.reduction) {  // the accumulators: one alloca per register, promoted to SSA
    int lanes = nest_.microkernel ? nest_.microkernel->lanes : nest_.reduction->lanes;
    int count = nest_.microkernel ? nest_.microkernel->rows * nest_.microkernel->chunks : nest_.reduction->accumulators;
    auto* vty = llvm::FixedVectorType::get(value_type(types_.tensors.at(nest_.tensor).dtype), static_cast<unsigned>(lanes));
    for (int k = 0; k < count; ++k) acc_.push_back(b_.CreateAlloca(vty, nullptr, "acc" + std::to_string(k)));
  }
}

llvm::BranchInst* NestEmitter::emit_loop(llvm::AllocaInst* it, Value* start, int64_t step, const std::function<Value*()>& condition,
                                         const std::function<void()>& body) {
  b_.CreateStore(start, it);
  auto* cond_bb = llvm::BasicBlock::Create(ctx_, "loop.cond", fn_);
  auto* body_bb = llvm::BasicBlock::Create(ctx_, "loop.body", fn_);
  auto* exit_bb = llvm::BasicBlock::Create(ctx_, "loop.exit", fn_);
  b_.CreateBr(cond_bb);
  b_.SetInsertPoint(cond_bb);
  b_.CreateCondBr(condition(), body_bb, exit_bb);
  b_.SetInsertPoint(body_bb);
  body();
  b_.CreateStore(b_.CreateNSWAdd(b_.CreateLoad(ix_, it), ix(step)), it);
  llvm::BranchInst* latch = b_.CreateBr(cond_bb);
  b_.SetInsertPoint(exit_bb);
  return latch;
}

void NestEmitter::register_loop(const sched::LoopNode& n) {
  llvm::AllocaInst* it = iters_.at(n.iterator);
  auto value = [&] { return b_.CreateLoad(ix_, it); };
  const bool branch_free = branch_free_registers(n);
  llvm::BranchInst* latch = emit_loop(it, ix(0), 1, [&] { return b_.CreateICmpSLT(value(), ix(n.unroll)); }, [&] {
    if (full_registers_) {  // every position in range (the unswitched loop around checked it)
      for (const auto& child : n.body) node(child, false);
      return;
    }
    Value* in_range = b_.CreateAnd(b_.CreateICmpSGE(value(), loop_expr(n.lower)), cond(n.condition));
    if (!branch_free) {
      in_range_body(in_range, n.body, "register");
      return;
    }
    Value* outer = register_mask_;
    const bool guarded = !whole_register_loop(n);
    register_mask_ = outer ? b_.CreateAnd(outer, in_range) : in_range;
    if (guarded) masked_iterators_.insert(n.iterator);
    for (const auto& child : n.body) node(child, false);
    masked_iterators_.erase(n.iterator);
    register_mask_ = outer;
  });
  hint_loop(latch, "llvm.loop.unroll.full");  // unrolled, each copy's position is a constant
}

bool NestEmitter::index32() const {
  if (!nest_.kernel || !nest_.kernel->index32) return false;
  constexpr int64_t limit = int64_t{1} << 30;  // headroom: a bound or a sum of two indices stays below 2^31
  for (const std::string& t : sched::nest_tensors(nest_)) {
    int64_t elements = 1;
    for (int64_t d : types_.tensors.at(t).shape) {
      if (d >= limit) return false;
      elements *= d;
      if (elements >= limit) return false;
    }
  }
  const sched::KernelLaunch& k = *nest_.kernel;
  if (k.blocks() >= limit || k.block[0] * k.block[1] * k.block[2] >= limit) return false;
  bool fits = true;
  std::function<void(const sched::LoopExpr&)> expr = [&](const sched::LoopExpr& e) {
    if (e.kind == sched::LoopExpr::Kind::constant && (e.value >= limit || e.value <= -limit)) fits = false;
    for (const auto& a : e.args) expr(a);
  };
  std::function<void(const sched::LoopNode&)> walk = [&](const sched::LoopNode& x) {
    expr(x.lower);
    expr(x.condition);
    for (const auto& a : x.args) expr(a);
    for (const auto& a : x.registers) expr(a);
    if (x.step >= limit || x.unroll >= limit || x.part_stride >= limit || x.part_extent >= limit) fits = false;
    for (const auto& c : x.body) walk(c);
    for (const auto& c : x.otherwise) walk(c);
  };
  walk(nest_.root);
  return fits;
}

// A register loop whose range is the whole tile (0 to unroll - 1: isl wrote no bound of its own).
bool NestEmitter::whole_register_loop(const sched::LoopNode& x) {
  using E = sched::LoopExpr::Kind;
  const sched::LoopExpr& c = x.condition;
  const bool from_zero = x.lower.kind == E::constant && x.lower.value <= 0;
  const bool to_end = c.args.size() == 2 && c.args[0].kind == E::iterator && c.args[0].iterator == x.iterator &&
                      c.args[1].kind == E::constant &&
                      ((c.kind == E::le && c.args[1].value >= x.unroll - 1) || (c.kind == E::lt && c.args[1].value >= x.unroll));
  return from_zero && to_end;
}

bool NestEmitter::branch_free_registers(const sched::LoopNode& n) const {
  if (!nest_.kernel || !nest_.accumulators || !nest_.accumulators->masked || nest_.kind != sched::Nest::Kind::update || nest_.stores || nest_.microkernel ||
      nest_.reduction)
    return false;
  const Contraction& c = nest_.contraction;
  if (c.aggregation == AggregationOp::assign || c.combination == CombinationOp::cond) return false;
  for (const auto& a : c.inputs)
    if (!shared_tile(a.tensor)) return false;
  bool guarded = false;
  std::function<bool(const sched::LoopNode&)> only_updates = [&](const sched::LoopNode& x) {
    if (x.kind == sched::LoopNode::Kind::statement) return x.statement == sched::LoopNode::Statement::plain;
    if (x.kind != sched::LoopNode::Kind::loop || x.unroll <= 0 || x.step != 1 || x.hardware != sched::LoopNode::Hardware::none)
      return false;
    guarded = guarded || !whole_register_loop(x);
    return std::all_of(x.body.begin(), x.body.end(), only_updates);
  };
  return only_updates(n) && guarded;
}

void NestEmitter::hint_loop(llvm::BranchInst* latch, const char* hint, std::optional<int> value) {
  std::vector<llvm::Metadata*> operands{llvm::MDString::get(ctx_, hint)};
  if (value) operands.push_back(llvm::ConstantAsMetadata::get(b_.getInt32(*value)));
  llvm::MDNode* node = llvm::MDNode::get(ctx_, operands);
  llvm::TempMDTuple self = llvm::MDNode::getTemporary(ctx_, {});
  llvm::MDNode* loop_id = llvm::MDNode::get(ctx_, {self.get(), node});
  loop_id->replaceOperandWith(0, loop_id);
  latch->setMetadata(llvm::LLVMContext::MD_loop, loop_id);
}

void NestEmitter::counted_loop(llvm::AllocaInst* it, Value* from, Value* to, const std::function<void()>& body) {
  emit_loop(it, from, 1, [&] { return b_.CreateICmpSLT(b_.CreateLoad(ix_, it), to); }, body);
}

void NestEmitter::mapped_loop(const sched::LoopNode& n) {
  const int h = n.hardware == sched::LoopNode::Hardware::block ? 0 : 1;
  Value* id = b_.CreateLoad(ix_, hardware_[h][n.axis]);
  if (n.part_stride > 1) id = b_.CreateUDiv(id, ix(n.part_stride));  // a part of the axis
  if (n.part_extent > 0) id = b_.CreateURem(id, ix(n.part_extent));
  b_.CreateStore(id, iters_.at(static_cast<size_t>(n.iterator)));
  Value* start = loop_expr(n.lower);
  Value* in_range = b_.CreateAnd(b_.CreateICmpSGE(id, start), cond(n.condition));
  if (n.step > 1) in_range = b_.CreateAnd(in_range, b_.CreateICmpEQ(b_.CreateSRem(b_.CreateSub(id, start), ix(n.step)), ix(0)));
  in_range_body(in_range, n.body, "mapped");
}

void NestEmitter::if_else(Value* condition, const char* name, const std::function<void()>& then, const std::function<void()>& otherwise) {
  auto* then_bb = llvm::BasicBlock::Create(ctx_, std::string(name) + ".then", fn_);
  auto* else_bb = llvm::BasicBlock::Create(ctx_, std::string(name) + ".else", fn_);
  auto* done_bb = llvm::BasicBlock::Create(ctx_, std::string(name) + ".end", fn_);
  b_.CreateCondBr(condition, then_bb, else_bb);
  b_.SetInsertPoint(then_bb);
  then();
  b_.CreateBr(done_bb);
  b_.SetInsertPoint(else_bb);
  otherwise();
  b_.CreateBr(done_bb);
  b_.SetInsertPoint(done_bb);
}

void NestEmitter::in_range_body(Value* in_range, const std::vector<sched::LoopNode>& body, const char* name) {
  auto* then_bb = llvm::BasicBlock::Create(ctx_, name, fn_);
  auto* cont_bb = llvm::BasicBlock::Create(ctx_, std::string(name) + ".end", fn_);
  b_.CreateCondBr(in_range, then_bb, cont_bb);
  b_.SetInsertPoint(then_bb);
  for (const auto& child : body) node(child, false);
  b_.CreateBr(cont_bb);
  b_.SetInsertPoint(cont_bb);
}

Value* NestEmitter::loop_expr(const sched::LoopExpr& a) {
  using K = sched::LoopExpr::Kind;
  switch (a.kind) {
    case K::constant: return ix(a.value);
    case K::iterator: return b_.CreateLoad(ix_, iters_.at(a.iterator));
    case K::add: return b_.CreateNSWAdd(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::sub: return b_.CreateNSWSub(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::mul: return b_.CreateNSWMul(loop_expr(a.args[0]), loop_expr(a.args[1]));
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
    default: return b_.CreateZExt(cond(a), ix_);
  }
}

std::vector<Value*> NestEmitter::loop_exprs(const std::vector<sched::LoopExpr>& args) {
  std::vector<Value*> vals;
  for (const auto& a : args) vals.push_back(loop_expr(a));
  return vals;
}

Value* NestEmitter::cond(const sched::LoopExpr& a) {
  using K = sched::LoopExpr::Kind;
  switch (a.kind) {
    case K::eq: return b_.CreateICmpEQ(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::le: return b_.CreateICmpSLE(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::lt: return b_.CreateICmpSLT(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::ge: return b_.CreateICmpSGE(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::gt: return b_.CreateICmpSGT(loop_expr(a.args[0]), loop_expr(a.args[1]));
    case K::land: return b_.CreateAnd(cond(a.args[0]), cond(a.args[1]));
    case K::lor: return b_.CreateOr(cond(a.args[0]), cond(a.args[1]));
    default: return b_.CreateICmpNE(loop_expr(a), ix(0));
  }
}

Value* NestEmitter::floor_div(Value* x, Value* y) {
  Value* q = b_.CreateSDiv(x, y);
  Value* r = b_.CreateSRem(x, y);
  Value* zero = llvm::ConstantInt::get(x->getType(), 0);
  Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, zero), b_.CreateICmpNE(b_.CreateICmpSLT(r, zero), b_.CreateICmpSLT(y, zero)));
  return b_.CreateSub(q, b_.CreateZExt(adjust, x->getType()));
}

Value* NestEmitter::floor_mod(Value* x, Value* y) {
  Value* r = b_.CreateSRem(x, y);
  Value* zero = llvm::ConstantInt::get(x->getType(), 0);
  Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, zero), b_.CreateICmpNE(b_.CreateICmpSLT(r, zero), b_.CreateICmpSLT(y, zero)));
  return b_.CreateSelect(adjust, b_.CreateAdd(r, y), r);
}

void NestEmitter::host_threads(const std::function<void()>& body) {
  const sched::KernelLaunch& k = *nest_.kernel;
  in_threads_ = true;
  counted_loop(hardware_[1][2], ix(0), ix(k.block[2]), [&] {
    counted_loop(hardware_[1][1], ix(0), ix(k.block[1]), [&] {
      counted_loop(hardware_[1][0], ix(0), ix(k.block[0]), body);
    });
  });
  in_threads_ = false;
}

void NestEmitter::barrier() {
  if (device_) {
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
    return;
  }
  // On the host the threads of a block have all run up to here: nothing to wait for.
  POLYTILE_CHECK(!in_threads_, "kernel ", nest_.name, ": a barrier inside code mapped to threads");
}

void NestEmitter::node(const sched::LoopNode& n, bool outermost) {
  using K = sched::LoopNode::Kind;
  const bool thread_code = n.kind == K::statement || n.hardware == sched::LoopNode::Hardware::thread;
  if (nest_.kernel && !device_ && !in_threads_ && thread_code) {
    host_threads([&] { node(n, outermost); });
    return;
  }
  switch (n.kind) {
    case K::barrier:
      barrier();
      return;
    case K::block:  // the root block of a parallel nest holds loops over the split dimension
      if (outline_ && outlined(nest_, n)) {
        call_part(n);
        return;
      }
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
      if (n.statement == sched::LoopNode::Statement::copy) copy_statement(n);
      else if (n.statement == sched::LoopNode::Statement::plain) statement(n);
      else if (n.statement == sched::LoopNode::Statement::acc_load || n.statement == sched::LoopNode::Statement::acc_store)
        accumulator_statement(n);
      else if (nest_.reduction) reduction_statement(n);
      else microkernel_statement(n);
      return;
    case K::loop: break;
  }
  if (n.hardware != sched::LoopNode::Hardware::none) {
    POLYTILE_CHECK(nest_.kernel, "a loop mapped to a GPU in nest ", nest_.name, ", which is no kernel");
    mapped_loop(n);
    return;
  }
  if (n.unroll > 0 && n.step == 1) {
    register_loop(n);
    return;
  }
  if (nest_.transpose_lanes > 0 && !square_edge_ && transpose_square(n)) return;
  if (!full_registers_ && nest_.kernel && nest_.kernel->unswitch && innermost_sequential(n)) {
    const std::vector<const sched::LoopNode*> guarded = guarded_register_loops(n);
    if (!guarded.empty()) {  // unswitched: the loop once with every register position in range, once as it is
      Value* full = b_.getTrue();
      for (const sched::LoopNode* r : guarded)
        for (int64_t k = 0; k < r->unroll; ++k) {
          b_.CreateStore(ix(k), iters_.at(static_cast<size_t>(r->iterator)));
          full = b_.CreateAnd(full, b_.CreateAnd(b_.CreateICmpSLE(loop_expr(r->lower), ix(k)), cond(r->condition)));
        }
      if_else(full, "registers", [&] {
        full_registers_ = true;
        sequential_loop(n, outermost);
        full_registers_ = false;
      }, [&] { sequential_loop(n, outermost); });
      return;
    }
  }
  sequential_loop(n, outermost);
}

// Register loops guarded by bounds of their own (a padded convolution's rows at the image's edge) whose
// bounds hold the same in every iteration of the innermost sequential loop `n` around them: they mention
// only their own iterator and iterators outside `n`. Empty where any guarded one depends on `n`'s loops.
std::vector<const sched::LoopNode*> NestEmitter::guarded_register_loops(const sched::LoopNode& n) {
  std::set<int> inside;
  std::function<void(const sched::LoopNode&)> defined = [&](const sched::LoopNode& x) {
    if (x.kind == sched::LoopNode::Kind::loop) inside.insert(x.iterator);
    for (const auto& c : x.body) defined(c);
    for (const auto& c : x.otherwise) defined(c);
  };
  defined(n);
  std::vector<const sched::LoopNode*> guarded;
  bool invariant = true;
  std::function<void(const sched::LoopNode&)> walk = [&](const sched::LoopNode& x) {
    if (x.kind == sched::LoopNode::Kind::loop && x.unroll > 0 && x.step == 1 && x.hardware == sched::LoopNode::Hardware::none &&
        !whole_register_loop(x)) {
      std::function<bool(const sched::LoopExpr&)> outside = [&](const sched::LoopExpr& e) {
        if (e.kind == sched::LoopExpr::Kind::iterator && e.iterator != x.iterator && inside.count(e.iterator)) return false;
        return std::all_of(e.args.begin(), e.args.end(), outside);
      };
      invariant = invariant && outside(x.lower) && outside(x.condition);
      guarded.push_back(&x);
    }
    for (const auto& c : x.body) walk(c);
    for (const auto& c : x.otherwise) walk(c);
  };
  for (const auto& c : n.body) walk(c);
  if (!invariant) guarded.clear();
  return guarded;
}

void NestEmitter::sequential_loop(const sched::LoopNode& n, bool outermost) {
  bool split = outermost && n.parallel;
  llvm::AllocaInst* it = iters_.at(n.iterator);
  Value* start = loop_expr(n.lower);
  if (split) {  // first value >= lo in the progression lower + k*step
    Value* step = ix(n.step);
    Value* distance = b_.CreateSub(lo_, start);
    Value* k = floor_div(b_.CreateAdd(distance, ix(n.step - 1)), step);
    Value* aligned = b_.CreateAdd(start, b_.CreateMul(k, step));
    start = b_.CreateSelect(b_.CreateICmpSGT(aligned, start), aligned, start);
  }
  llvm::BranchInst* latch = emit_loop(it, start, n.step, [&] {
    Value* c = cond(n.condition);
    return split ? b_.CreateAnd(c, b_.CreateICmpSLT(b_.CreateLoad(ix_, it), hi_)) : c;
  }, [&] {
    for (const auto& child : n.body) node(child, false);
  });
  // A copy (a layout pass's panels or transposition, a user's `=` of one tensor) runs at the speed of
  // memory, vectorized but not unrolled. Unrolled, a transposing copy's loop of 32 strided reads became 64
  // address computations in one block, on which LLVM 16's loop strength reduction spent 0.16 s of the
  // 0.2 s that the conv gradient's 3x3x64x64 weight transposition took to compile; it takes 0.03 s now.
  if (copy_) hint_loop(latch, "llvm.loop.unroll.disable");
  // A kernel's innermost sequential loop (a reduction around the register tile) is unrolled
  // KernelLaunch::unroll times on the device, so that one step's shared loads issue while the step before
  // computes (ptxas does not pipeline a loop; with 64-bit indices it unrolled such loops itself, with
  // 32-bit ones it leaves them).
  if (device_ && nest_.kernel && nest_.kernel->unroll > 0 && !copy_ && innermost_sequential(n))
    hint_loop(latch, "llvm.loop.unroll.count", nest_.kernel->unroll);
}

bool NestEmitter::transpose_square(const sched::LoopNode& n) {
  using K = sched::LoopNode::Kind;
  auto plain_loop = [](const sched::LoopNode& x) {
    return x.kind == K::loop && x.step == 1 && x.unroll <= 0 && x.hardware == sched::LoopNode::Hardware::none && x.body.size() == 1;
  };
  if (!plain_loop(n) || !plain_loop(n.body[0])) return false;
  const sched::LoopNode& inner = n.body[0];
  const sched::LoopNode& s = inner.body[0];
  if (s.kind != K::statement || s.statement != sched::LoopNode::Statement::plain) return false;
  // The scheduler chose the nest as a transposition (scheduler.cpp `transposition`): a copy of one tensor
  // of the output's dtype whose last indices are variables, the input's in no other input index and the
  // output's in no other output index (the other indices any affine form: each row's address is computed).
  const Contraction& c = nest_.contraction;
  const DType t = types_.tensors.at(nest_.tensor).dtype;
  POLYTILE_CHECK(nest_.kind == sched::Nest::Kind::update && c.inputs.size() == 1 && c.combination == CombinationOp::none &&
                     c.aggregation == AggregationOp::assign && !c.init && nest_.inlined.empty() &&
                     types_.tensors.at(c.inputs[0].tensor).dtype == t && !c.inputs[0].indices.empty() && !c.output_indices.empty(),
                 "nest ", nest_.name, " has transposition squares but is no copy");
  // This loop is the square's: the input's last index is n's iterator, the output's the inner loop's
  // (each a variable whose statement argument is that iterator).
  auto is_iterator = [&](const Polynomial& p, int iterator) {
    const std::optional<std::string> variable = p.variable();
    if (!variable) return false;
    const auto v = std::find(nest_.variables.begin(), nest_.variables.end(), *variable);
    if (v == nest_.variables.end()) return false;
    const sched::LoopExpr& arg = s.args.at(static_cast<size_t>(v - nest_.variables.begin()));
    return arg.kind == sched::LoopExpr::Kind::iterator && arg.iterator == iterator;
  };
  std::function<bool(const sched::LoopExpr&)> mentions_outer = [&](const sched::LoopExpr& e) {
    if (e.kind == sched::LoopExpr::Kind::iterator && e.iterator == n.iterator) return true;
    return std::any_of(e.args.begin(), e.args.end(), mentions_outer);
  };
  if (!is_iterator(c.inputs[0].indices.back(), n.iterator) || !is_iterator(c.output_indices.back(), inner.iterator) ||
      mentions_outer(inner.lower) || mentions_outer(inner.condition))
    return false;

  const int lanes = nest_.transpose_lanes, half = lanes / 2;
  llvm::AllocaInst* outer_it = iters_.at(static_cast<size_t>(n.iterator));
  llvm::AllocaInst* inner_it = iters_.at(static_cast<size_t>(inner.iterator));
  Value* c0 = loop_expr(n.lower);
  Value* w0 = loop_expr(inner.lower);
  // Whether both loops' conditions hold at the outer c0 + dc and the inner w0 + dw (a loop's condition
  // bounds its iterator above, and the inner loop's does not mention the outer iterator).
  auto within = [&](int dc, int dw) {
    b_.CreateStore(b_.CreateNSWAdd(c0, ix(dc)), outer_it);
    b_.CreateStore(b_.CreateNSWAdd(w0, ix(dw)), inner_it);
    return b_.CreateAnd(cond(n.condition), cond(inner.condition));
  };
  auto* square_bb = llvm::BasicBlock::Create(ctx_, "square", fn_);
  auto* edge_bb = llvm::BasicBlock::Create(ctx_, "square.edge", fn_);
  auto* done_bb = llvm::BasicBlock::Create(ctx_, "square.done", fn_);
  b_.CreateCondBr(within(lanes - 1, lanes - 1), square_bb, edge_bb);

  auto vars_at = [&](Value* outer, Value* in) {
    b_.CreateStore(outer, outer_it);
    b_.CreateStore(in, inner_it);
    const std::vector<Value*> vals = loop_exprs(s.args);
    std::map<std::string, Value*> vars;
    for (size_t k = 0; k < nest_.variables.size(); ++k) vars[nest_.variables[k]] = vals[k];
    return vars;
  };
  // The square of `size` x `size` elements from the outer `co` and the inner `wo`: `size` vector loads of
  // the input's rows, log2(size) rounds of shuffles, `size` vector stores of the output's rows.
  auto move = [&](Value* co, Value* wo, int size) {
    auto* vty = llvm::FixedVectorType::get(storage_type(t), static_cast<unsigned>(size));
    std::vector<Value*> rows;  // rows[m][j]: the input at the inner variable wo + m and the outer co + j
    for (int m = 0; m < size; ++m) {
      const std::map<std::string, Value*> vars = vars_at(co, b_.CreateNSWAdd(wo, ix(m)));
      std::vector<Value*> idx;
      for (const Polynomial& p : c.inputs[0].indices) idx.push_back(poly(p, vars));
      rows.push_back(b_.CreateAlignedLoad(vty, element_address(c.inputs[0].tensor, idx), llvm::Align(4)));
    }
    // Round h swaps bit h of the row and of the column index of every element: after all, rows[k][m] is
    // the element (m, k) of before.
    for (int h = 1; h < size; h <<= 1)
      for (int i = 0; i < size; ++i) {
        if (i & h) continue;
        std::vector<int> low, high;
        for (int j = 0; j < size; ++j) {
          low.push_back((j & h) == 0 ? j : size + j - h);
          high.push_back((j & h) == 0 ? j + h : size + j);
        }
        Value* a = rows[static_cast<size_t>(i)];
        Value* b = rows[static_cast<size_t>(i + h)];
        rows[static_cast<size_t>(i)] = b_.CreateShuffleVector(a, b, low);
        rows[static_cast<size_t>(i + h)] = b_.CreateShuffleVector(a, b, high);
      }
    for (int k = 0; k < size; ++k)
      b_.CreateAlignedStore(rows[static_cast<size_t>(k)], output_address(vars_at(b_.CreateNSWAdd(co, ix(k)), wo)), llvm::Align(4));
  };
  b_.SetInsertPoint(square_bb);
  move(c0, w0, lanes);
  b_.CreateBr(done_bb);

  // Squares with half edges (Nest::transpose_half_edges): an edge square whose valid part along each loop
  // is its first half or all of it (not both all: a whole square) moves its whole quarters as squares of
  // half the size -- the first, and the one after it along the loop that is whole, if one is; the others
  // are empty. Any other edge runs the loops.
  if (nest_.transpose_half_edges) {
    auto* halves_bb = llvm::BasicBlock::Create(ctx_, "square.halves", fn_);
    auto* loops_bb = llvm::BasicBlock::Create(ctx_, "square.loops", fn_);
    b_.SetInsertPoint(edge_bb);
    Value* first_halves = within(half - 1, half - 1);
    // The second half along a loop is whole or empty: its last value in range, or its first one not.
    Value* outer_second = b_.CreateOr(within(lanes - 1, 0), b_.CreateNot(within(half, 0)));
    Value* inner_second = b_.CreateOr(within(0, lanes - 1), b_.CreateNot(within(0, half)));
    b_.CreateCondBr(b_.CreateAnd(first_halves, b_.CreateAnd(outer_second, inner_second)), halves_bb, loops_bb);
    b_.SetInsertPoint(halves_bb);
    move(c0, w0, half);  // in range: first_halves
    for (auto [dc, dw] : {std::pair{half, 0}, std::pair{0, half}}) {
      auto* quarter_bb = llvm::BasicBlock::Create(ctx_, "square.quarter", fn_);
      auto* next_bb = llvm::BasicBlock::Create(ctx_, "square.quarter.done", fn_);
      b_.CreateCondBr(within(dc + half - 1, dw + half - 1), quarter_bb, next_bb);
      b_.SetInsertPoint(quarter_bb);
      move(b_.CreateNSWAdd(c0, ix(dc)), b_.CreateNSWAdd(w0, ix(dw)), half);
      b_.CreateBr(next_bb);
      b_.SetInsertPoint(next_bb);
    }
    b_.CreateBr(done_bb);
    edge_bb = loops_bb;
  }

  b_.SetInsertPoint(edge_bb);
  square_edge_ = true;
  node(n, false);
  square_edge_ = false;
  b_.CreateBr(done_bb);
  b_.SetInsertPoint(done_bb);
  return true;
}

// A sequential loop holding no loop but register loops (LoopNode::unroll) and statements.
bool NestEmitter::innermost_sequential(const sched::LoopNode& n) {
  std::function<bool(const sched::LoopNode&)> plain = [&](const sched::LoopNode& x) {
    if (x.kind == sched::LoopNode::Kind::loop && (x.unroll <= 0 || x.hardware != sched::LoopNode::Hardware::none)) return false;
    if (x.kind == sched::LoopNode::Kind::barrier) return false;
    return std::all_of(x.body.begin(), x.body.end(), plain) && std::all_of(x.otherwise.begin(), x.otherwise.end(), plain);
  };
  return n.kind == sched::LoopNode::Kind::loop && n.unroll <= 0 && n.hardware == sched::LoopNode::Hardware::none &&
         std::all_of(n.body.begin(), n.body.end(), plain);
}

}  // namespace polytile::llvm_ir::internal

namespace polytile::llvm_ir {

using internal::NestEmitter;

std::vector<std::string> nest_tensors(const sched::Nest& nest) { return sched::nest_tensors(nest); }

namespace {

void verify(const llvm::Function& f, const std::string& what) {
  std::string err;
  llvm::raw_string_ostream os(err);
  if (llvm::verifyFunction(f, &os)) throw InternalError("invalid LLVM IR for " + what + ": " + os.str());
}

}  // namespace

void emit_nest(llvm::Module& module, const sched::Nest& nest, const std::string& name, const ProgramTypes& types,
               const std::map<std::string, int>& buffer_index, bool outline) {
  NestEmitter e(module, nest, types, buffer_index);
  e.set_outline(outline);
  verify(*e.emit(name), nest.name);
}

size_t separate_parts(const sched::Nest& nest) { return NestEmitter::separate_blocks(nest).size(); }

void emit_nest_part(llvm::Module& module, const sched::Nest& nest, const std::string& name, size_t part,
                    const ProgramTypes& types, const std::map<std::string, int>& buffer_index) {
  NestEmitter e(module, nest, types, buffer_index);
  verify(*e.emit_part(name, part), nest.name + " part " + std::to_string(part));
}

void emit_kernel(llvm::Module& module, const sched::Nest& nest, const std::string& name, const ProgramTypes& types) {
  const std::map<std::string, int> no_table;
  NestEmitter e(module, nest, types, no_table, /*device=*/true);
  verify(*e.emit_kernel(name), "kernel " + nest.name);
}

void emit_nests(llvm::Module& module, const sched::Schedule& schedule, const ProgramTypes& types,
                const std::map<std::string, int>& buffer_index) {
  for (size_t k = 0; k < schedule.nests.size(); ++k)
    emit_nest(module, schedule.nests[k], "nest_" + std::to_string(k), types, buffer_index);
}

}  // namespace polytile::llvm_ir
