#include "polytile/view.h"

#include "polytile/shapes.h"

namespace polytile {

TensorView TensorView::of(Buffer& buffer) { return TensorView{buffer.data(), buffer.dtype(), buffer.shape(), {}}; }

TensorView TensorView::of(const Buffer& buffer) {
  return TensorView{const_cast<void*>(buffer.data()), buffer.dtype(), buffer.shape(), {}};
}

int64_t TensorView::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorView::byte_size() const { return static_cast<size_t>(size()) * dtype_bytes(dtype); }

bool TensorView::contiguous() const {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  if (size() == 0) return true;  // no elements, no layout (DLPack exporters give empty arrays any strides)
  int64_t expected = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && strides[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

std::string TensorView::type_str() const { return TensorType{dtype, shape}.str(); }

}  // namespace polytile
