// Helpers shared by the tests: deterministic random buffers and element access by multi-index.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "polytile/buffer.h"

namespace polytile::testing {

inline Buffer random_buffer(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::f64) {
  std::mt19937_64 rng(seed);
  Buffer b(dtype, std::move(shape));
  for (int64_t i = 0; i < b.size(); ++i) {
    double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    b.set(i, dtype == DType::i32 ? static_cast<double>(static_cast<int64_t>(rng() % 11) - 5) : 2 * u - 1);
  }
  return b;
}

// Row-major flat offset of a multi-index.
inline int64_t offset(const Buffer& b, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t k = 0; k < idx.size(); ++k) f = f * b.shape()[k] + idx[k];
  return f;
}
inline double at(const Buffer& b, const std::vector<int64_t>& idx) { return b.get(offset(b, idx)); }

inline void expect_near_buffers(const Buffer& actual, const Buffer& expected, double tol, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  for (int64_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual.get(i), expected.get(i), tol) << what << " at flat index " << i;
}

}  // namespace polytile::testing
