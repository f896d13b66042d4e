// Common-subexpression elimination: merged statements, doubled sums, hoisted transcendental calls and
// subexpressions read back from stored tensors; values bit-identical to the original program under the
// reference interpreter, and the pass is idempotent.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "polytile/cse.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile {
namespace {

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The program after CSE, checked to give exactly the original's values and to need no second pass.
Program cse_checked(const std::string& text, const TensorMap& inputs) {
  Program p = parse_program(text, "cse.tile");
  Program c = eliminate_common_subexpressions(p);
  EXPECT_EQ(print(eliminate_common_subexpressions(c)), print(c)) << "not idempotent";
  TensorMap want = interpret(p, inputs), got = interpret(c, inputs);
  for (const auto& o : p.outputs) {
    EXPECT_EQ(got.at(o).dtype(), want.at(o).dtype()) << o;
    const Buffer &g = got.at(o), &w = want.at(o);
    for (int64_t e = 0; e < w.size(); ++e)
      EXPECT_TRUE(std::isnan(w.get(e)) ? std::isnan(g.get(e)) : g.get(e) == w.get(e)) << o << "[" << e << "]\n" << print(c);
  }
  return c;
}

TEST(CseTest, IdenticalContractionsUpToVariableNamesAreComputedOnce) {
  Buffer a = testing::random_buffer({3, 4}, 1, DType::f32), b = testing::random_buffer({4, 5}, 2, DType::f32);
  Program c = cse_checked(
      "function (A[M, K], B[K, N]) -> (O, P) {"
      "  C[i, j : M, N] = +(A[i, k] * B[k, j]);"
      "  D[x, y : M, N] = +(A[x, z] * B[z, y]);"
      "  O = C + D;"
      "  P = D; }",
      {{"A", a}, {"B", b}});
  EXPECT_EQ(count_of(print(c), "+(A["), 1u) << print(c);
  // O = C + C doubles; P, an output, stays as a copy of C.
  EXPECT_NE(print(c).find("O = 2 * C;"), std::string::npos) << print(c);
  EXPECT_NE(print(c).find("P = C;"), std::string::npos) << print(c);
}

TEST(CseTest, SumsOfEqualTermsDoubleExactlyInEveryDtype) {
  Buffer xf = Buffer::from_values(DType::f32, {3}, {0.1, -3e38, std::numeric_limits<double>::quiet_NaN()});
  Buffer xi = Buffer::from_values(DType::i32, {3}, {1, 2147483647, -7});
  Buffer xb = Buffer::from_values(DType::boolean, {3}, {0, 1, 1});
  for (const auto& x : {xf, xi, xb}) {
    Program c = cse_checked("function (X[N], Y[N]) -> (O) { O = X * Y + X * Y; }", {{"X", x}, {"Y", x}});
    EXPECT_NE(print(c).find("O = 2 * (X * Y);"), std::string::npos) << print(c);
  }
}

TEST(CseTest, RepeatedTranscendentalCallsAreHoistedAndStoredOnesReused) {
  Buffer v = testing::random_buffer({3, 1}, 3), x = testing::random_buffer({3, 4}, 4);
  for (int64_t i = 0; i < v.size(); ++i) v.set(i, std::fabs(v.get(i)));
  Program c = cse_checked(
      "function (V[N, 1], X[N, C]) -> (A, B) {"
      "  A = X / sqrt(V + 1.0) + exp(X) * sqrt(V + 1.0);"
      "  B = exp(X) - sqrt(V + 1.0); }",
      {{"V", v}, {"X", x}});
  EXPECT_EQ(count_of(print(c), "sqrt("), 1u) << print(c);
  EXPECT_EQ(count_of(print(c), "exp("), 1u) << print(c);
  // A subexpression equal to an earlier statement reads it back.
  Program d = cse_checked("function (X[N]) -> (S, T) { S = tanh(X * 2); T = tanh(X * 2) * 3; }", {{"X", testing::random_buffer({5}, 5)}});
  EXPECT_NE(print(d).find("T = S * 3;"), std::string::npos) << print(d);
  // Literal-only subtrees are never replaced by a stored (strongly typed) tensor.
  Program e = cse_checked("function (X[N]) -> (S, T) { S = 0.1 * 3; T = X * (0.1 * 3); }", {{"X", testing::random_buffer({2}, 6)}});
  EXPECT_NE(print(e).find("T = X * (0.1 * 3);"), std::string::npos) << print(e);
}

}  // namespace
}  // namespace polytile
