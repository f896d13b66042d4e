// Buffer: a dense, row-major (C order) tensor value of one dtype -- what programs consume and produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "polytile/ir.h"

namespace polytile {

namespace detail {

// Memory for `bytes` of a buffer's storage, 64-byte aligned; from 2 MiB on, aligned to 2 MiB and, on Linux,
// advised to be backed by transparent huge pages (madvise MADV_HUGEPAGE, which a kernel in the "madvise"
// THP mode needs): a stream through a tensor then crosses no 4 KiB page boundary, where a core's
// prefetchers stop, and misses the TLB 512 times less often. null when there is none.
void* allocate_buffer_memory(size_t bytes);
void free_buffer_memory(void* memory);

// Buffer's allocator (allocate_buffer_memory).
template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = allocate_buffer_memory(n * sizeof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { free_buffer_memory(p); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const { return true; }
};

}  // namespace detail

class Buffer {
 public:
  Buffer() = default;
  // Zero-filled. Every dim must be >= 0.
  Buffer(DType dtype, std::vector<int64_t> shape);
  // Values are converted with set(): f16 and f32 round to nearest, i32 and i64 truncate toward zero (values
  // out of range wrap modulo 2^32 or 2^64), bool is value != 0.
  static Buffer from_values(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t rank() const { return shape_.size(); }
  int64_t size() const { return size_; }
  size_t element_bytes() const;

  // An element as a double: exact for every dtype but i64, whose values beyond 2^53 round to nearest.
  double get(int64_t flat) const;
  void set(int64_t flat, double value);
  // An element of an i32, i64 or bool buffer as an integer, exactly; set_int wraps into i32 (bool: != 0).
  int64_t get_int(int64_t flat) const;
  void set_int(int64_t flat, int64_t value);
  std::vector<double> to_doubles() const;

  void* data() { return lines_.data(); }
  const void* data() const { return lines_.data(); }
  size_t byte_size() const { return static_cast<size_t>(size_) * element_bytes(); }

  // "f32[2, 3]"
  std::string type_str() const;

 private:
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_;
  int64_t size_ = 1;
  // Storage in whole cache lines, each 64-byte aligned: a vector load of 64 bytes at a multiple of 64
  // bytes from the start never straddles two lines (a 2048x2048 sgemm's packed panels, read at 16-byte
  // alignment, ran about 15% slower).
  struct alignas(64) Line {
    uint64_t words[8];
  };
  std::vector<Line, detail::LineAllocator<Line>> lines_;
};

// Converts a double to the value a dtype holds (f16 and f32 rounding, i32 and i64 wrap-around, bool != 0).
double round_to(DType dtype, double value);

// IEEE binary16 (f16): the bits of the half nearest to a value (ties to even; at or beyond 65520 in
// magnitude, infinity; NaN stays NaN), and the value of half bits (exact).
uint16_t half_from_double(double value);
double half_to_double(uint16_t bits);

// How far `got` is from `want` (of one size): ||got - want|| / ||want|| in the 2-norm over the elements
// where `want` is not NaN (the plain norm of the difference where `want` is all zero); for i32, i64 and
// bool 0 when every element is equal and 1 otherwise. `unexpected_nan` counts the elements NaN in `got` but
// not in `want` (an element nothing wrote, in a NaN-poisoned output).
struct Difference {
  double relative = 0;
  int64_t unexpected_nan = 0;
  bool within(double tolerance) const { return unexpected_nan == 0 && relative <= tolerance; }
};
Difference difference(const Buffer& got, const Buffer& want);

}  // namespace polytile
