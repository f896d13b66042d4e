#include "polytile/buffer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "polytile/error.h"

namespace polytile {

void* detail::allocate_buffer_memory(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = bytes >= kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, huge ? kHuge : 64, std::max<size_t>(bytes, 1)) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // advice: where the kernel has none, small pages
#endif
  return p;
}

void detail::free_buffer_memory(void* memory) { free(memory); }

uint16_t half_from_double(double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return 0x7e00;
  double a = std::fabs(v);
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp and beyond round to infinity
  // a = m * 2^e with m in [0.5, 1): the half's ulp is 2^(e - 11) for normal halves (exponent e - 1 >= -14),
  // 2^-24 for subnormals. Scaling by powers of two is exact, and nearbyint rounds ties to even.
  int e = 0;
  std::frexp(a, &e);
  const int ulp = std::max(e - 11, -24);
  const double units = std::nearbyint(std::ldexp(a, -ulp));  // the value in ulps, at most 2048
  if (units == 0) return sign;
  int64_t u = static_cast<int64_t>(units);
  int exponent = ulp + 25;  // biased exponent of a normal half whose ulp is 2^ulp
  if (u >= 2048) {          // rounded up to the next power of two
    u >>= 1;
    ++exponent;
  }
  if (u < 1024) return static_cast<uint16_t>(sign | u);  // subnormal (exponent field 0)
  return static_cast<uint16_t>(sign | (exponent << 10) | (u - 1024));
}

double half_to_double(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::f64: return v;
    case DType::f32: return static_cast<double>(static_cast<float>(v));
    case DType::f16: return half_to_double(half_from_double(v));
    case DType::boolean: return v != 0 ? 1.0 : 0.0;
    case DType::i32:
    case DType::i64: {
      if (!std::isfinite(v)) return 0;
      // fmod is exact; m in (-2^64, 2^64) moves into [-2^63, 2^63) exactly (within a factor of two of 2^64),
      // and wrapping that modulo 2^32 wraps v.
      double m = std::fmod(std::trunc(v), 0x1p64);
      if (m >= 0x1p63) m -= 0x1p64;
      if (m < -0x1p63) m += 0x1p64;
      if (dtype == DType::i64) return m;
      return static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(m)));
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
    lines_.assign((byte_size() + sizeof(Line) - 1) / sizeof(Line), Line{});
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
  const auto* p = reinterpret_cast<const unsigned char*>(lines_.data());
  switch (dtype_) {
    case DType::f64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case DType::f32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return half_to_double(v); }
    case DType::i32:
    case DType::i64:
    case DType::boolean: return static_cast<double>(get_int(i));
  }
  return 0;
}

int64_t Buffer::get_int(int64_t i) const {
  POLYTILE_CHECK(i >= 0 && i < size_, "buffer index ", i, " out of range ", size_);
  const auto* p = reinterpret_cast<const unsigned char*>(lines_.data());
  switch (dtype_) {
    case DType::i64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case DType::i32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::boolean: return p[i] ? 1 : 0;
    default: break;
  }
  POLYTILE_CHECK(false, "get_int of a ", type_str(), " buffer");
}

void Buffer::set_int(int64_t i, int64_t value) {
  POLYTILE_CHECK(i >= 0 && i < size_, "buffer index ", i, " out of range ", size_);
  auto* p = reinterpret_cast<unsigned char*>(lines_.data());
  switch (dtype_) {
    case DType::i64: std::memcpy(p + 8 * i, &value, 8); return;
    case DType::i32: { auto x = static_cast<int32_t>(static_cast<uint32_t>(value)); std::memcpy(p + 4 * i, &x, 4); return; }
    case DType::boolean: p[i] = value != 0; return;
    default: break;
  }
  POLYTILE_CHECK(false, "set_int of a ", type_str(), " buffer");
}

void Buffer::set(int64_t i, double value) {
  POLYTILE_CHECK(i >= 0 && i < size_, "buffer index ", i, " out of range ", size_);
  auto* p = reinterpret_cast<unsigned char*>(lines_.data());
  double v = round_to(dtype_, value);
  switch (dtype_) {
    case DType::f64: std::memcpy(p + 8 * i, &v, 8); break;
    case DType::f32: { float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); break; }
    case DType::f16: { uint16_t h = half_from_double(v); std::memcpy(p + 2 * i, &h, 2); break; }
    case DType::i32:
    case DType::i64:
    case DType::boolean: set_int(i, static_cast<int64_t>(v)); break;  // v is already an in-range integer
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
  if (!is_float(got.dtype()) && !is_float(want.dtype())) {  // integers compare exactly (i64 beyond 2^53 too)
    for (int64_t i = 0; i < want.size() && d.relative == 0; ++i) d.relative = got.get_int(i) != want.get_int(i);
    return d;
  }
  const bool exact = !is_float(got.dtype());
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
