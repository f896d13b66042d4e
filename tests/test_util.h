// Helpers shared by the tests: deterministic random buffers and element access by multi-index.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "polytile/buffer.h"
#include "polytile/interpreter.h"
#include "polytile/shapes.h"

namespace polytile::testing {

inline Buffer random_buffer(std::vector<int64_t> shape, uint64_t seed, DType dtype = DType::f64) {
  std::mt19937_64 rng(seed);
  Buffer b(dtype, std::move(shape));
  for (int64_t i = 0; i < b.size(); ++i) {
    double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    b.set(i, is_integer(dtype) ? static_cast<double>(static_cast<int64_t>(rng() % 11) - 5) : 2 * u - 1);
  }
  return b;
}

// The types of a set of buffers, as compile() and infer_types() take them.
inline std::map<std::string, TensorType> types_of(const TensorMap& in) {
  std::map<std::string, TensorType> types;
  for (const auto& [name, b] : in) types[name] = TensorType{b.dtype(), b.shape()};
  return types;
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

using Shapes = std::map<std::string, std::vector<int64_t>>;

// "--random A=3x4 --random B=4x5" -> {A: [3, 4], B: [4, 5]}
inline Shapes shapes_from_args(const std::string& line) {
  Shapes s;
  std::stringstream ss(line);
  std::string tok;
  while (ss >> tok) {
    if (tok == "--random") continue;
    auto eq = tok.find('=');
    std::vector<int64_t> shape;
    std::stringstream dims(tok.substr(eq + 1));
    std::string d;
    while (std::getline(dims, d, 'x')) shape.push_back(std::stoll(d));
    s[tok.substr(0, eq)] = shape;
  }
  return s;
}

// The examples/*.tile files in name order, with the input shapes of their first line
// ("// inputs: --random I=2x9x9x5 ...").
inline std::vector<std::pair<std::filesystem::path, Shapes>> examples_with_shapes(const std::string& dir) {
  std::vector<std::pair<std::filesystem::path, Shapes>> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".tile") continue;
    std::ifstream f(entry.path());
    std::string first;
    std::getline(f, first);
    out.emplace_back(entry.path(), shapes_from_args(first.substr(first.find(':') + 1)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace polytile::testing
