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
// threads: consecutive threads copy consecutive elements of the box's last dimension.
void NestEmitter::copy_statement(const sched::LoopNode& n) {
  const size_t t = static_cast<size_t>(n.tile);
  const sched::SharedTile& tile = nest_.shared.at(t);
  const TensorType& type = types_.tensors.at(tile.tensor);
  const std::vector<Value*> origin = loop_exprs(n.args);
  for (size_t d = 0; d < origin.size(); ++d) b_.CreateStore(origin[d], origins_[t][d]);
  const sched::KernelLaunch& k = *nest_.kernel;
  auto id = [&](int axis) { return b_.CreateLoad(ix_, hardware_[1][axis]); };
  Value* thread = b_.CreateAdd(id(0), b_.CreateMul(ix(k.block[0]), b_.CreateAdd(id(1), b_.CreateMul(ix(k.block[1]), id(2)))));
  const int64_t threads = k.block[0] * k.block[1] * k.block[2];
  auto more = [&] { return b_.CreateICmpSLT(b_.CreateLoad(ix_, copy_element_), ix(tile.elements())); };
  emit_loop(copy_element_, thread, threads, more, [&] {
    Value* rest = b_.CreateLoad(ix_, copy_element_);
    std::vector<Value*> local(tile.sizes.size()), global(tile.sizes.size());
    Value* inside = b_.getTrue();
    for (size_t d = tile.sizes.size(); d-- > 0;) {
      local[d] = b_.CreateURem(rest, ix(tile.sizes[d]));
      rest = b_.CreateUDiv(rest, ix(tile.sizes[d]));
      global[d] = b_.CreateAdd(origin[d], local[d]);
      inside = b_.CreateAnd(inside, b_.CreateICmpULT(global[d], ix(type.shape[d])));  // 0 <= g < extent
    }
    auto* copy_bb = llvm::BasicBlock::Create(ctx_, "copy", fn_);
    auto* next_bb = llvm::BasicBlock::Create(ctx_, "copy.next", fn_);
    b_.CreateCondBr(inside, copy_bb, next_bb);
    b_.SetInsertPoint(copy_bb);
    store_address(type.dtype, shared_address(t, local), input(tile.tensor, global));
    b_.CreateBr(next_bb);
    b_.SetInsertPoint(next_bb);
  });
}

}  // namespace polytile::llvm_ir::internal
