// NestEmitter (nest_emitter.h): a kernel's shared tiles (sched::SharedTile) -- the cooperative copy that
// fills a tile and sets its origin, and the addresses the update reads from.
#include "nest_emitter.h"

namespace polytile::llvm_ir::internal {

std::optional<size_t> NestEmitter::shared_tile(const std::string& tensor) const {
  for (size_t t = 0; t < nest_.shared.size(); ++t)
    if (nest_.shared[t].tensor == tensor) return t;
  return std::nullopt;
}

Value* NestEmitter::shared_address(size_t tile, const std::vector<Value*>& local) {
  std::vector<Value*> idx{ix(0)};
  idx.insert(idx.end(), local.begin(), local.end());
  return b_.CreateGEP(shared_types_.at(tile), shared_.at(tile), idx);
}

Value* NestEmitter::shared_address_clamped(size_t tile, const std::vector<Value*>& local, bool masked) {
  const sched::SharedTile& t = nest_.shared.at(tile);
  Value* offset = ix(0);
  for (size_t d = 0; d < local.size(); ++d) {
    const int64_t extent = d + 1 == local.size() ? t.pitch : t.sizes[d];
    offset = b_.CreateNSWAdd(b_.CreateNSWMul(offset, ix(extent)), local[d]);
  }
  // In 32 bits: a tile holds fewer than 2^31 elements, so an offset in range is exact there, and one out of
  // range still lands in the tile once clamped (and 64-bit minima cost twice the instructions on a GPU).
  offset = b_.CreateTrunc(offset, b_.getInt32Ty());
  if (masked) {
    offset = b_.CreateSelect(register_mask_, offset, b_.getInt32(0));
  } else {
    offset = b_.CreateIntrinsic(llvm::Intrinsic::smax, {b_.getInt32Ty()}, {offset, b_.getInt32(0)});
    offset = b_.CreateIntrinsic(llvm::Intrinsic::smin, {b_.getInt32Ty()}, {offset, b_.getInt32(static_cast<int32_t>(t.storage() - 1))});
  }
  llvm::Type* element = shared_types_.at(tile);
  while (auto* array = llvm::dyn_cast<llvm::ArrayType>(element)) element = array->getElementType();
  return b_.CreateGEP(element, shared_.at(tile), offset);
}

// Box element e (row-major) goes to the thread whose linear index (x fastest) is e modulo the block's
// threads: consecutive threads copy consecutive elements of the box's last dimension. A plain input's tile
// moves in 16-byte vectors where the rows allow (copy_units) and the block's origin and the tensor's
// address are aligned (known or checked below: the same for every thread of the block), else element by
// element.
void NestEmitter::copy_statement(const sched::LoopNode& n) {
  const size_t t = static_cast<size_t>(n.tile);
  const sched::SharedTile& tile = nest_.shared.at(t);
  const TensorType& type = types_.tensors.at(tile.tensor);
  const std::vector<Value*> origin = loop_exprs(n.args);
  for (size_t d = 0; d < origin.size(); ++d) b_.CreateStore(origin[d], origins_[t][d]);
  const sched::KernelLaunch& k = *nest_.kernel;
  auto id = [&](int axis) { return b_.CreateLoad(ix_, hardware_[1][axis]); };
  Value* thread = b_.CreateAdd(id(0), b_.CreateMul(ix(k.block[0]), b_.CreateAdd(id(1), b_.CreateMul(ix(k.block[1]), id(2)))));
  if (nest_.inlined.count(tile.tensor)) {  // an inlined producer: computed where the element is inside, one by one
    const int64_t threads = k.block[0] * k.block[1] * k.block[2];
    auto more = [&] { return b_.CreateICmpSLT(b_.CreateLoad(ix_, copy_element_), ix(tile.elements())); };
    emit_loop(copy_element_, thread, threads, more, [&] {
      std::vector<Value*> local, global;
      Value* inside = copy_position(t, origin, b_.CreateLoad(ix_, copy_element_), 1, local, global);
      auto* copy_bb = llvm::BasicBlock::Create(ctx_, "copy", fn_);
      auto* next_bb = llvm::BasicBlock::Create(ctx_, "copy.next", fn_);
      b_.CreateCondBr(inside, copy_bb, next_bb);
      b_.SetInsertPoint(copy_bb);
      store_address(type.dtype, shared_address(t, local), input(tile.tensor, global));
      b_.CreateBr(next_bb);
      b_.SetInsertPoint(next_bb);
    });
    return;
  }
  const int64_t bytes = static_cast<int64_t>(m_.getDataLayout().getTypeAllocSize(storage_type(type.dtype)));
  // 8-byte elements one by one: copied as pairs, the i64 matmul's kernel spilled registers in ptxas for sm_80.
  const int64_t lanes = bytes < 8 ? 16 / bytes : 1;
  // A rank-0 tile (a scalar input read at every point) is its one element.
  if (!k.vector_copies || lanes == 1 || tile.sizes.empty() || tile.sizes.back() % lanes != 0 || tile.pitch % lanes != 0 ||
      type.shape.back() % lanes != 0) {
    copy_units(t, origin, thread, 1);
    return;
  }
  // Aligned where the origin's last index is a multiple of the lanes -- known here for most tiles (a
  // matmul's 32 * c2), else checked -- and the input's address a multiple of 16 bytes: on the device, the
  // runtime's buffers always are (cuMemAlloc aligns to 256 bytes); on the host, the caller's may not be.
  const bool origin_aligned = multiple_of(n.args.back(), lanes);
  if (origin_aligned && device_) {
    copy_units(t, origin, thread, lanes);
    return;
  }
  Value* aligned = b_.getTrue();
  if (!origin_aligned) aligned = b_.CreateICmpEQ(b_.CreateSRem(origin.back(), ix(lanes)), ix(0));
  if (!device_) {
    Value* low = b_.CreateAnd(b_.CreatePtrToInt(buffer(tile.tensor), b_.getInt32Ty()), b_.getInt32(15));  // the low bits
    aligned = b_.CreateAnd(aligned, b_.CreateICmpEQ(low, b_.getInt32(0)));
  }
  if_else(aligned, "copy.vectors", [&] { copy_units(t, origin, thread, lanes); }, [&] { copy_units(t, origin, thread, 1); });
}

// Whether `e` is a multiple of `m` whatever its iterators' values.
bool NestEmitter::multiple_of(const sched::LoopExpr& e, int64_t m) {
  using K = sched::LoopExpr::Kind;
  switch (e.kind) {
    case K::constant: return e.value % m == 0;
    case K::add:
    case K::sub:
    case K::min:
    case K::max: return std::all_of(e.args.begin(), e.args.end(), [&](const sched::LoopExpr& a) { return multiple_of(a, m); });
    case K::neg: return multiple_of(e.args[0], m);
    case K::mul: return std::any_of(e.args.begin(), e.args.end(), [&](const sched::LoopExpr& a) { return multiple_of(a, m); });
    default: return false;
  }
}

// The local and global index of unit `unit` (row-major, `lanes` elements of the last dimension each) and
// whether it lies inside the input (a unit lies all inside or all outside: the caller's alignment).
Value* NestEmitter::copy_position(size_t t, const std::vector<Value*>& origin, Value* unit, int64_t lanes, std::vector<Value*>& local,
                                  std::vector<Value*>& global) {
  const sched::SharedTile& tile = nest_.shared.at(t);
  const TensorType& type = types_.tensors.at(tile.tensor);
  local.assign(tile.sizes.size(), nullptr);
  global.assign(tile.sizes.size(), nullptr);
  Value* inside = b_.getTrue();
  Value* rest = unit;
  for (size_t d = tile.sizes.size(); d-- > 0;) {
    const int64_t units = d + 1 == tile.sizes.size() ? tile.sizes[d] / lanes : tile.sizes[d];
    local[d] = b_.CreateURem(rest, ix(units));
    rest = b_.CreateUDiv(rest, ix(units));
    if (d + 1 == tile.sizes.size() && lanes > 1) local[d] = b_.CreateNUWMul(local[d], ix(lanes));
    global[d] = b_.CreateAdd(origin[d], local[d]);
    inside = b_.CreateAnd(inside, b_.CreateICmpULT(global[d], ix(type.shape[d])));  // 0 <= g < extent
  }
  return inside;
}

// A plain input's copy in units of `lanes` elements (one load and one store each): each thread takes up to
// kCopyBatch units and 64 bytes at a time, a block's thread count apart, and loads them all before it
// stores any, so that the loads' latencies overlap (one by one, every unit waited for its load). A unit outside the input
// loads the tensor's first element instead (no branch around the loads) and is not stored.
void NestEmitter::copy_units(size_t t, const std::vector<Value*>& origin, Value* thread, int64_t lanes) {
  constexpr int64_t kCopyBatch = 8;
  const sched::SharedTile& tile = nest_.shared.at(t);
  const TensorType& type = types_.tensors.at(tile.tensor);
  const sched::KernelLaunch& k = *nest_.kernel;
  const int64_t threads = k.block[0] * k.block[1] * k.block[2];
  const int64_t units = tile.elements() / lanes;
  llvm::Type* element = storage_type(type.dtype);
  llvm::Type* unit_type = lanes > 1 ? llvm::FixedVectorType::get(element, static_cast<unsigned>(lanes)) : element;
  // At most 64 bytes of loads in flight per thread (16 registers): with 128 bytes the interleaved
  // matmul's update spilled in ptxas for sm_90, which caps its registers for occupancy.
  const int64_t unit_bytes = static_cast<int64_t>(m_.getDataLayout().getTypeAllocSize(unit_type));
  const int64_t batch = k.vector_copies ? std::clamp<int64_t>(std::min(kCopyBatch, 64 / unit_bytes), 1, (units + threads - 1) / threads) : 1;
  const llvm::Align align(static_cast<uint64_t>(m_.getDataLayout().getTypeAllocSize(unit_type)));
  auto more = [&] { return b_.CreateICmpSLT(b_.CreateLoad(ix_, copy_element_), ix(units)); };
  llvm::BranchInst* latch = emit_loop(copy_element_, thread, batch * threads, more, [&] {
    Value* first = b_.CreateLoad(ix_, copy_element_);
    std::vector<Value*> values, insides;
    std::vector<std::vector<Value*>> locals;
    for (int64_t u = 0; u < batch; ++u) {
      Value* unit = b_.CreateNSWAdd(first, ix(u * threads));
      std::vector<Value*> local, global;
      Value* inside = copy_position(t, origin, unit, lanes, local, global);
      if (u > 0) inside = b_.CreateAnd(inside, b_.CreateICmpSLT(unit, ix(units)));
      // Clamped as indices, not addresses (so that ld.global.nc stays); with 32-bit indices as one flat
      // offset (one 64-bit address computation instead of one per dimension).
      Value* from = nullptr;
      if (ix_->getBitWidth() == 32) {
        from = b_.CreateGEP(element, buffer(tile.tensor), b_.CreateSelect(inside, flat_index(tile.tensor, global), ix(0)));
      } else {
        for (Value*& g : global) g = b_.CreateSelect(inside, g, ix(0));
        from = element_address(tile.tensor, global);
      }
      llvm::LoadInst* load = b_.CreateAlignedLoad(unit_type, from, align);
      // The kernel does not write the input (ld.global.nc): where the host's alignment check takes the
      // parameter's address, LLVM no longer infers that it is only read, so the loads say it.
      if (tile.tensor != nest_.tensor) load->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(ctx_, {}));
      values.push_back(load);
      insides.push_back(inside);
      locals.push_back(std::move(local));
    }
    for (int64_t u = 0; u < batch; ++u) {
      auto* store_bb = llvm::BasicBlock::Create(ctx_, "copy.store", fn_);
      auto* next_bb = llvm::BasicBlock::Create(ctx_, "copy.next", fn_);
      b_.CreateCondBr(insides[static_cast<size_t>(u)], store_bb, next_bb);
      b_.SetInsertPoint(store_bb);
      b_.CreateAlignedStore(values[static_cast<size_t>(u)], shared_address(t, locals[static_cast<size_t>(u)]), align);
      b_.CreateBr(next_bb);
      b_.SetInsertPoint(next_bb);
    }
  });
  hint_loop(latch, "llvm.loop.unroll.disable");
}

}  // namespace polytile::llvm_ir::internal
