// Every example of the C++ Tile eDSL tutorial (seed 001), written with the eDSL as the tutorial writes it,
// run by the reference interpreter and checked against values computed independently here with plain
// loops. Each eDSL program also prints exactly as the corresponding examples/*.tile file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "polytile/edsl.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile {
namespace {

using namespace polytile::edsl;  // NOLINT
using testing::at;
using testing::random_buffer;

std::string example_text(const std::string& name) {
  return print(parse_file(POLYTILE_SOURCE_DIR "/examples/" + name + ".tile"));
}

// ------------------------------------------------------------------------------ the tutorial's functions

Tensor sum_over_axis(const Tensor& I) {
  TensorDim M("M"), N("N");
  TensorIndex m("m"), n("n");
  I.bind_dims(M, N);
  auto O = TensorOutput(N);
  O(n) += I(m, n);
  return O;
}

Tensor max_over_axis(const Tensor& I) {
  TensorDim M("M"), N("N");
  TensorIndex m("m"), n("n");
  I.bind_dims(M, N);
  auto O = TensorOutput(N);
  O(n) >= I(m, n);
  return O;
}

Tensor matmul(const Tensor& A, const Tensor& B) {
  TensorDim I("I"), J("J"), K("K");
  TensorIndex i("i"), j("j"), k("k");
  A.bind_dims(I, K);
  B.bind_dims(K, J);
  auto C = TensorOutput(I, J);
  C(i, j) += A(i, k) * B(k, j);
  return C;
}

Tensor global_min(const Tensor& I) {
  TensorIndex i("i"), j("j"), k("k");
  TensorDim X("X"), Y("Y"), Z("Z");
  I.bind_dims(X, Y, Z);
  auto Neg = (-I).named("Neg");
  auto O_Neg = TensorOutput().named("O_Neg");
  O_Neg() >= Neg(i, j, k);
  auto O = -O_Neg;
  return O;
}

Tensor mean_over_axis(const Tensor& I) {
  TensorDim X("X"), Y("Y");
  TensorIndex x("x"), y("y");
  I.bind_dims(X, Y);
  auto Sum = TensorOutput(Y).named("Sum");
  Sum(y) += I(x, y);
  return Sum / X;
}

Tensor global_mean(const Tensor& I) {
  TensorDim X("X"), Y("Y");
  TensorIndex x("x"), y("y");
  I.bind_dims(X, Y);
  auto Sum = TensorOutput().named("Sum");
  Sum() += I(x, y);
  return Sum / (X * Y);
}

Tensor global_mean_staged(const Tensor& I) {
  TensorDim X, Y;
  TensorIndex x, y;
  I.bind_dims(X, Y);
  auto Sum = TensorOutput();
  Sum() += I(x, y);
  auto PartialMean = Sum / X;
  return PartialMean / Y;
}

Tensor wrong_max_pool_1d(const Tensor& I) {
  TensorDim N("N");
  TensorIndex i("i"), j("j");
  I.bind_dims(N);
  auto O = TensorOutput(N / 2);
  O(i) >= I(2 * i + j);
  return O;
}

Tensor max_pool_1d(const Tensor& I) {
  TensorDim N("N");
  TensorIndex i("i"), j("j");
  I.bind_dims(N);
  auto O = TensorOutput(N / 2);
  O(i) >= I(2 * i + j);
  O.add_constraint(j < 2);
  return O;
}

Tensor max_pool_1d_round_up(const Tensor& I) {
  TensorDim N("N");
  TensorIndex i("i"), j("j");
  I.bind_dims(N);
  auto O = TensorOutput((N + 1) / 2);
  O(i) >= I(2 * i + j);
  O.add_constraint(j < 2);
  return O;
}

Tensor skip(const Tensor& I) {
  TensorDim M("M"), N("N");
  TensorIndex i("i"), j("j");
  I.bind_dims(M, N);
  auto O = TensorOutput(N);
  O(2 * i) += I(2 * i, j);
  return O;
}

Tensor csum(const Tensor& I) {
  TensorDim N("N");
  TensorIndex i("i"), k("k");
  I.bind_dims(N);
  auto O = TensorOutput(N);
  O(i) += I(k);
  O.add_constraint(i - k < N);
  return O;
}

Tensor conv_1d(const Tensor& I, const Tensor& K) {
  TensorDim N("N"), X("X"), KX("KX"), CI("CI"), CO("CO");
  TensorIndex n("n"), x("x"), k("k"), ci("ci"), co("co");
  I.bind_dims(N, X, CI);
  K.bind_dims(KX, CI, CO);
  auto O = TensorOutput(N, X - KX + 1, CO);
  O(n, x, co) += I(n, x + k, ci) * K(k, ci, co);
  return O;
}

Tensor conv_2d(const Tensor& I, const Tensor& K) {
  TensorDim N("N"), X("X"), Y("Y"), KX("KX"), KY("KY"), CI("CI"), CO("CO");
  TensorIndex n("n"), x("x"), y("y"), kx("kx"), ky("ky"), ci("ci"), co("co");
  I.bind_dims(N, X, Y, CI);
  K.bind_dims(KX, KY, CI, CO);
  auto O = TensorOutput(N, X - 2 * (KX - 1), Y - 3 * (KY - 1), CO);
  O(n, x, y, co) += I(n, x + 2 * kx, y + 3 * ky, ci) * K(kx, ky, ci, co);
  return O;
}

Tensor complex_conv_2d(const Tensor& I, const Tensor& K,
                       const std::vector<size_t>& s,  // stride coeffs
                       const std::vector<size_t>& d   // dilation coeffs
) {
  // "same-lower" autopadding will be applied
  TensorDim N("N"), G("G"), GCI("GCI"), GCO("GCO");
  std::vector<TensorDim> X{TensorDim("X0"), TensorDim("X1")};
  std::vector<TensorDim> KD{TensorDim("K0"), TensorDim("K1")};
  TensorIndex n("n"), g("g"), gci("gci"), gco("gco");
  std::vector<TensorIndex> x{TensorIndex("x0"), TensorIndex("x1")};
  std::vector<TensorIndex> k{TensorIndex("k0"), TensorIndex("k1")};
  I.bind_dims(N, X[0], X[1], G, GCI);
  K.bind_dims(KD[0], KD[1], G, GCI, GCO);
  // Compute output spatial dimensions
  std::vector<TensorDim> Y(2);
  for (size_t i = 0; i < Y.size(); ++i) Y[i] = (X[i] + s[i] - 1) / s[i];
  // Compute the effective kernel size after dilation
  std::vector<TensorDim> EK(2);
  for (size_t i = 0; i < EK.size(); ++i) EK[i] = d[i] * (KD[i] - 1) + 1;
  // Compute the padding offset
  std::vector<TensorDim> P(2);
  for (size_t i = 0; i < P.size(); ++i) P[i] = ((Y[i] - 1) * s[i] + EK[i] - X[i]) / 2;
  // Specify the output size
  auto O = TensorOutput(N, Y[0], Y[1], G, GCO);
  // Compute the convolution
  O(n, x[0], x[1], g, gco) += I(n, s[0] * x[0] + d[0] * k[0] - P[0], s[1] * x[1] + d[1] * k[1] - P[1], g, gci) *
                              K(k[0], k[1], g, gci, gco);
  return O;
}

// ------------------------------------------------------------------------------ tests

TEST(TutorialTest, SumAndMaxOverAxis) {
  Tensor I = Placeholder("I", 2);
  Program sum = make_program("sum_over_axis", {I}, {sum_over_axis(I).named("O")});
  Program mx = make_program("max_over_axis", {I}, {max_over_axis(I).named("O")});
  EXPECT_EQ(print(sum), example_text("sum_over_axis"));
  EXPECT_EQ(print(mx), example_text("max_over_axis"));
  Buffer in = random_buffer({4, 3}, 1);
  Buffer s = interpret(sum, {{"I", in}}).at("O"), m = interpret(mx, {{"I", in}}).at("O");
  for (int64_t n = 0; n < 3; ++n) {
    double want_s = 0, want_m = -INFINITY;
    for (int64_t r = 0; r < 4; ++r) {
      want_s += at(in, {r, n});
      want_m = std::max(want_m, at(in, {r, n}));
    }
    EXPECT_NEAR(s.get(n), want_s, 1e-15);
    EXPECT_EQ(m.get(n), want_m);
  }
}

TEST(TutorialTest, Matmul) {
  Tensor A = Placeholder("A", 2), B = Placeholder("B", 2);
  Program p = make_program("matmul", {A, B}, {matmul(A, B).named("C")});
  EXPECT_EQ(print(p), example_text("matmul"));
  Buffer a = random_buffer({3, 4}, 2), b = random_buffer({4, 5}, 3);
  Buffer c = interpret(p, {{"A", a}, {"B", b}}).at("C");
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      double want = 0;
      for (int64_t k = 0; k < 4; ++k) want += at(a, {i, k}) * at(b, {k, j});
      EXPECT_NEAR(at(c, {i, j}), want, 1e-14);
    }
}

TEST(TutorialTest, GlobalMin) {
  Tensor I = Placeholder("I", 3);
  Program p = make_program("global_min", {I}, {global_min(I).named("O")});
  EXPECT_EQ(print(p), example_text("global_min"));
  Buffer in = random_buffer({2, 3, 4}, 4);
  auto v = in.to_doubles();
  EXPECT_EQ(interpret(p, {{"I", in}}).at("O").get(0), *std::min_element(v.begin(), v.end()));
}

TEST(TutorialTest, Averages) {
  Tensor I = Placeholder("I", 2);
  Program axis = make_program("mean_over_axis", {I}, {mean_over_axis(I).named("O")});
  Program global = make_program("global_mean", {I}, {global_mean(I).named("O")});
  Tensor I2 = Placeholder("I", 2);  // fresh: I's dims are already bound to X and Y above
  Program staged = make_program("global_mean_staged", {I2}, {global_mean_staged(I2).named("O")});
  EXPECT_EQ(print(axis), example_text("mean_over_axis"));
  EXPECT_EQ(print(global), example_text("global_mean"));
  // Unnamed dims, indices and tensors get deterministic names; the single-use PartialMean is inlined.
  EXPECT_EQ(print(staged),
            "function global_mean_staged (I[D0, D1]) -> (O) {\n"
            "  T0[] = +(I[x0, x1]);\n"
            "  O = T0 / D0 / D1;\n"
            "}\n");
  Buffer in = random_buffer({4, 3}, 5);
  Buffer m = interpret(axis, {{"I", in}}).at("O");
  double total = 0;
  for (int64_t y = 0; y < 3; ++y) {
    double col = 0;
    for (int64_t x = 0; x < 4; ++x) col += at(in, {x, y});
    total += col;
    EXPECT_NEAR(m.get(y), col / 4, 1e-15);
  }
  EXPECT_NEAR(interpret(global, {{"I", in}}).at("O").get(0), total / 12, 1e-15);
  EXPECT_NEAR(interpret(staged, {{"I", in}}).at("O").get(0), total / 12, 1e-15);
}

TEST(TutorialTest, MaxPools) {
  Tensor I = Placeholder("I", 1);
  Program wrong = make_program("wrong_max_pool_1d", {I}, {wrong_max_pool_1d(I).named("O")});
  Program right = make_program("max_pool_1d", {I}, {max_pool_1d(I).named("O")});
  Program up = make_program("max_pool_1d_round_up", {I}, {max_pool_1d_round_up(I).named("O")});
  EXPECT_EQ(print(wrong), example_text("wrong_max_pool_1d"));
  EXPECT_EQ(print(right), example_text("max_pool_1d"));
  EXPECT_EQ(print(up), example_text("max_pool_1d_round_up"));
  Buffer in = random_buffer({7}, 6);
  auto v = in.to_doubles();
  double global_max = *std::max_element(v.begin(), v.end());
  Buffer w = interpret(wrong, {{"I", in}}).at("O");
  Buffer r = interpret(right, {{"I", in}}).at("O");
  Buffer u = interpret(up, {{"I", in}}).at("O");
  ASSERT_EQ(w.size(), 3);
  ASSERT_EQ(r.size(), 3);
  ASSERT_EQ(u.size(), 4);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(w.get(i), global_max);
    EXPECT_EQ(r.get(i), std::max(v[2 * i], v[2 * i + 1]));
    EXPECT_EQ(u.get(i), std::max(v[2 * i], v[2 * i + 1]));
  }
  EXPECT_EQ(u.get(3), v[6]);  // the clipped last window
}

TEST(TutorialTest, SkipAndCumulativeSum) {
  Tensor I = Placeholder("I", 2), J = Placeholder("I", 1);
  Program sk = make_program("skip", {I}, {skip(I).named("O")});
  Program cs = make_program("cumulative_sum", {J}, {csum(J).named("O")});
  EXPECT_EQ(print(sk), example_text("skip"));
  EXPECT_EQ(print(cs), example_text("cumulative_sum"));
  Buffer in = random_buffer({6, 5}, 7);
  Buffer o = interpret(sk, {{"I", in}}).at("O");
  for (int64_t c = 0; c < 5; ++c) {
    double want = 0;
    if (c % 2 == 0)
      for (int64_t j = 0; j < 5; ++j) want += at(in, {c, j});
    EXPECT_NEAR(o.get(c), want, 1e-15);
  }
  Buffer v = random_buffer({6}, 8);
  Buffer s = interpret(cs, {{"I", v}}).at("O");
  double run = 0;
  for (int64_t i = 0; i < 6; ++i) {
    run += v.get(i);
    EXPECT_NEAR(s.get(i), run, 1e-15);
  }
}

TEST(TutorialTest, Conv1d) {
  Tensor I = Placeholder("I", 3), K = Placeholder("K", 3);
  Program p = make_program("conv_1d", {I, K}, {conv_1d(I, K).named("O")});
  EXPECT_EQ(print(p), example_text("conv_1d"));
  Buffer in = random_buffer({2, 8, 3}, 9), k = random_buffer({3, 3, 4}, 10);
  Buffer o = interpret(p, {{"I", in}, {"K", k}}).at("O");
  ASSERT_EQ(o.shape(), (std::vector<int64_t>{2, 6, 4}));
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t x = 0; x < 6; ++x)
      for (int64_t co = 0; co < 4; ++co) {
        double want = 0;
        for (int64_t kk = 0; kk < 3; ++kk)
          for (int64_t ci = 0; ci < 3; ++ci) want += at(in, {n, x + kk, ci}) * at(k, {kk, ci, co});
        EXPECT_NEAR(at(o, {n, x, co}), want, 1e-14);
      }
}

TEST(TutorialTest, DilatedConv2d) {
  Tensor I = Placeholder("I", 4), K = Placeholder("K", 4);
  Program p = make_program("conv_2d_dilated", {I, K}, {conv_2d(I, K).named("O")});
  EXPECT_EQ(print(p), example_text("conv_2d_dilated"));
  Buffer in = random_buffer({1, 9, 10, 2}, 11), k = random_buffer({2, 3, 2, 3}, 12);
  Buffer o = interpret(p, {{"I", in}, {"K", k}}).at("O");
  ASSERT_EQ(o.shape(), (std::vector<int64_t>{1, 7, 4, 3}));
  for (int64_t x = 0; x < 7; ++x)
    for (int64_t y = 0; y < 4; ++y)
      for (int64_t co = 0; co < 3; ++co) {
        double want = 0;
        for (int64_t kx = 0; kx < 2; ++kx)
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t ci = 0; ci < 2; ++ci) want += at(in, {0, x + 2 * kx, y + 3 * ky, ci}) * at(k, {kx, ky, ci, co});
        EXPECT_NEAR(at(o, {0, x, y, co}), want, 1e-14);
      }
}

TEST(TutorialTest, ComplexStridedDilatedPaddedGroupedConv2d) {
  const std::vector<size_t> s{2, 3}, d{2, 1};
  Tensor I = Placeholder("I", 5), K = Placeholder("K", 5);
  Program p = make_program("complex_conv_2d", {I, K}, {complex_conv_2d(I, K, s, d).named("O")});
  EXPECT_EQ(print(p), example_text("complex_conv_2d"));
  const int64_t N = 2, X[2] = {9, 8}, G = 2, GCI = 3, GCO = 2, KS[2] = {3, 2};
  Buffer in = random_buffer({N, X[0], X[1], G, GCI}, 13), k = random_buffer({KS[0], KS[1], G, GCI, GCO}, 14);
  Buffer o = interpret(p, {{"I", in}, {"K", k}}).at("O");
  int64_t Y[2], P[2];
  for (int i = 0; i < 2; ++i) {
    int64_t si = static_cast<int64_t>(s[i]), di = static_cast<int64_t>(d[i]);
    Y[i] = (X[i] + si - 1) / si;
    int64_t ek = di * (KS[i] - 1) + 1;
    P[i] = ((Y[i] - 1) * si + ek - X[i]) / 2;  // non-negative here, so C division is floor division
  }
  ASSERT_EQ(o.shape(), (std::vector<int64_t>{N, Y[0], Y[1], G, GCO}));
  int nonzero = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t x0 = 0; x0 < Y[0]; ++x0)
      for (int64_t x1 = 0; x1 < Y[1]; ++x1)
        for (int64_t g = 0; g < G; ++g)
          for (int64_t co = 0; co < GCO; ++co) {
            double want = 0;
            for (int64_t k0 = 0; k0 < KS[0]; ++k0)
              for (int64_t k1 = 0; k1 < KS[1]; ++k1)
                for (int64_t ci = 0; ci < GCI; ++ci) {
                  int64_t a = 2 * x0 + 2 * k0 - P[0], b = 3 * x1 + 1 * k1 - P[1];
                  if (a < 0 || a >= X[0] || b < 0 || b >= X[1]) continue;  // zero padding
                  want += at(in, {n, a, b, g, ci}) * at(k, {k0, k1, g, ci, co});
                }
            nonzero += want != 0;
            EXPECT_NEAR(at(o, {n, x0, x1, g, co}), want, 1e-14);
          }
  EXPECT_GT(nonzero, 0);
}

TEST(TutorialTest, SameConstructionPrintsTheSameText) {
  auto build = [] {
    Tensor I = Placeholder("I", 2);
    return print(make_program("f", {I}, {global_mean_staged(I)}));
  };
  EXPECT_EQ(build(), build());
}

}  // namespace
}  // namespace polytile
