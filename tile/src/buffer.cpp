#include "polytile/buffer.h"

#include <cmath>
#include <cstring>
#include <new>

#include <unistd.h>

#include "polytile/error.h"

namespace polytile {

double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::f64: return v;
    case DType::f32: return static_cast<double>(static_cast<float>(v));
    case DType::boolean: return v != 0 ? 1.0 : 0.0;
    case DType::i32: {
      if (!std::isfinite(v)) return 0;
      double t = std::trunc(v);
      double m = std::fmod(t, 4294967296.0);  // wrap modulo 2^32 into (-2^31, 2^31]
      if (m < 0) m += 4294967296.0;
      if (m >= 2147483648.0) m -= 4294967296.0;
      return m;
    }
  }
  POLYTILE_CHECK(false, "bad dtype");
}

Buffer::Buffer(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  size_ = 1;
  for (int64_t d : shape_) {
    if (d < 0) user_error("negative dim ", d, " in a buffer shape");
    if (d != 0 && size_ > (int64_t{1} << 40) / d) user_error("buffer of shape ", type_str(), " is too large");
    size_ *= d;
  }
  // Refused before allocating: a size from a file header or a command line can be anything.
  static const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (memory > 0 && static_cast<double>(byte_size()) > memory)
    user_error("cannot allocate ", byte_size(), " bytes for a buffer of type ", type_str(), ": more than this machine's ",
               static_cast<int64_t>(memory), " bytes of memory");
  try {
    words_.assign((byte_size() + 7) / 8, 0);
  } catch (const std::bad_alloc&) {
    user_error("cannot allocate ", byte_size(), " bytes for a buffer of type ", type_str(), ": out of memory");
  }
}

Buffer Buffer::from_values(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values) {
  Buffer b(dtype, std::move(shape));
  if (static_cast<int64_t>(values.size()) != b.size())
    user_error("buffer ", b.type_str(), " needs ", b.size(), " values, got ", values.size());
  for (int64_t i = 0; i < b.size(); ++i) b.set(i, values[i]);
  return b;
}

size_t Buffer::element_bytes() const { return dtype_bytes(dtype_); }

double Buffer::get(int64_t i) const {
  POLYTILE_CHECK(i >= 0 && i < size_, "buffer index ", i, " out of range ", size_);
  const auto* p = reinterpret_cast<const unsigned char*>(words_.data());
  switch (dtype_) {
    case DType::f64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case DType::f32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::i32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::boolean: return p[i] ? 1.0 : 0.0;
  }
  return 0;
}

void Buffer::set(int64_t i, double value) {
  POLYTILE_CHECK(i >= 0 && i < size_, "buffer index ", i, " out of range ", size_);
  auto* p = reinterpret_cast<unsigned char*>(words_.data());
  double v = round_to(dtype_, value);
  switch (dtype_) {
    case DType::f64: std::memcpy(p + 8 * i, &v, 8); break;
    case DType::f32: { float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); break; }
    case DType::i32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p + 4 * i, &x, 4); break; }
    case DType::boolean: p[i] = v != 0; break;
  }
}

std::vector<double> Buffer::to_doubles() const {
  std::vector<double> out(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) out[i] = get(i);
  return out;
}

std::string Buffer::type_str() const {
  std::string s = to_string(dtype_) + "[";
  for (size_t i = 0; i < shape_.size(); ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
  return s + "]";
}

Difference difference(const Buffer& got, const Buffer& want) {
  POLYTILE_CHECK(got.size() == want.size(), "difference of ", got.type_str(), " and ", want.type_str());
  Difference d;
  const bool exact = got.dtype() != DType::f32 && got.dtype() != DType::f64;
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < want.size(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (std::isnan(w)) continue;
    if (std::isnan(g)) {
      ++d.unexpected_nan;
      continue;
    }
    diff += exact ? (g != w) : (g - w) * (g - w);
    norm += exact ? 1 : w * w;
  }
  d.relative = exact ? (diff > 0 ? 1 : 0) : norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return d;
}

}  // namespace polytile
