// TensorView: a tensor in memory the caller owns -- a pointer, a dtype, a shape and strides in elements
// (empty strides: contiguous row-major, C order). Nothing is copied, allocated or freed: the memory must
// stay valid, and not be written by anyone else, while a run uses the view. Element layout is the one
// Buffer uses: f32, f64, i32 and i64 natively, f16 as IEEE binary16, bool as one byte (0 false, anything
// else true), like numpy.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "polytile/buffer.h"

namespace polytile {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, one per dim; empty: contiguous row-major

  // The memory of `buffer` (which must outlive the view).
  static TensorView of(Buffer& buffer);
  static TensorView of(const Buffer& buffer);  // for inputs: nothing writes through it
  int64_t size() const;                        // elements
  size_t byte_size() const;                    // of the elements, when contiguous
  // Strides empty, or those of row-major order (a dim of extent 1 may have any stride).
  bool contiguous() const;
  std::string type_str() const;  // "f32[2, 3]"
};

using ViewMap = std::map<std::string, TensorView>;

}  // namespace polytile
