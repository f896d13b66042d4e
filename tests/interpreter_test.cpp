// The reference interpreter against independently computed expectations: the valid-indices rule,
// rational indices, aggregations, defaults, combinations, broadcasting, dtypes, and run-time user errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile {
namespace {

using testing::at;
using testing::random_buffer;

Buffer run1(const std::string& text, const TensorMap& inputs, const std::string& out = "O") {
  return interpret(parse_program(text, "t.tile"), inputs).at(out);
}

Buffer vec(std::vector<double> v, DType t = DType::f64) {
  int64_t n = static_cast<int64_t>(v.size());
  return Buffer::from_values(t, {n}, v);
}

std::string run_error(const std::string& text, const TensorMap& inputs) {
  try {
    interpret(parse_program(text, "t.tile"), inputs);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(InterpreterTest, WrongMaxPoolSeesTheGlobalMax) {
  Buffer i = vec({3, -1, 7, 2, 5, 0, 1});
  Buffer o = run1("function (I[N]) -> (O) { O[i : N/2] = >(I[2*i + j]); }", {{"I", i}});
  EXPECT_EQ(o.to_doubles(), (std::vector<double>{7, 7, 7}));
}

TEST(InterpreterTest, MaxPoolConstraintAndRoundUp) {
  Buffer i = vec({3, -1, 7, 2, 5, 0, 1});
  EXPECT_EQ(run1("function (I[N]) -> (O) { O[i : N/2] = >(I[2*i + j]), j < 2; }", {{"I", i}}).to_doubles(),
            (std::vector<double>{3, 7, 5}));
  EXPECT_EQ(run1("function (I[N]) -> (O) { O[i : (N + 1)/2] = >(I[2*i + j]), j < 2; }", {{"I", i}}).to_doubles(),
            (std::vector<double>{3, 7, 5, 1}));
}

TEST(InterpreterTest, RationalIndicesContributeOnlyWhereIntegral) {
  Buffer i = random_buffer({5}, 1);
  Buffer o = run1("function (I[N]) -> (O) { O[i : 2*N - 1] = +(I[(i + j)/2]), j < 2; }", {{"I", i}});
  ASSERT_EQ(o.size(), 9);
  for (int64_t k = 0; k < 9; ++k) EXPECT_EQ(o.get(k), i.get((k + 1) / 2)) << k;
}

TEST(InterpreterTest, ConstraintsNeedNotBeIntegral) {
  // 0 <= (i + j)/2 < 2 holds for (i + j) in [0, 3], whether or not i + j is even.
  Buffer i = random_buffer({4}, 9);
  Buffer o = run1("function (I[N]) -> (O) { O[i : N] = +(I[j]), (i + j)/2 < 2; }", {{"I", i}});
  for (int64_t k = 0; k < 4; ++k) {
    double want = 0;
    for (int64_t j = 0; j < 4; ++j)
      if (k + j <= 3) want += i.get(j);
    EXPECT_NEAR(o.get(k), want, 1e-15) << k;
  }
}

TEST(InterpreterTest, SkipLeavesUnwrittenElementsZero) {
  Buffer i = random_buffer({4, 5}, 2);
  Buffer o = run1("function (I[M, N]) -> (O) { O[2*i : N] = +(I[2*i, j]); }", {{"I", i}});
  for (int64_t k = 0; k < 5; ++k) {
    double want = 0;
    if (k % 2 == 0 && k < 4)
      for (int64_t j = 0; j < 5; ++j) want += at(i, {k, j});
    EXPECT_DOUBLE_EQ(o.get(k), want) << k;
  }
}

TEST(InterpreterTest, ConstantOutputIndices) {
  Buffer i = random_buffer({3}, 3);
  Buffer o = run1("function (I[N]) -> (O) { O[i, 1 : N, 3] = =(I[i]); }", {{"I", i}});
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(at(o, {r, c}), c == 1 ? i.get(r) : 0.0);
}

TEST(InterpreterTest, NegativeIndexVariablesAreValid) {
  // O[i] = sum over j of I[i - j] with 0 <= j < 3: j's range is given, i - j may not be negative.
  Buffer i = random_buffer({6}, 4);
  Buffer o = run1("function (I[N]) -> (O) { O[i : N] = +(I[i - j]), j < 3; }", {{"I", i}});
  for (int64_t k = 0; k < 6; ++k) {
    double want = 0;
    for (int64_t j = 0; j < 3; ++j)
      if (k - j >= 0) want += i.get(k - j);
    EXPECT_NEAR(o.get(k), want, 1e-15);
  }
  // The tutorial's remark: without a constraint, j may be negative (i = 1, j = -1 is valid).
  Buffer p = run1("function (I[N]) -> (O) { O[i : N] = +(I[i + j]), i + j < 2; }", {{"I", i}});
  for (int64_t k = 0; k < 6; ++k) EXPECT_NEAR(p.get(k), i.get(0) + i.get(1), 1e-15) << k;
}

TEST(InterpreterTest, DefaultTensorSeedsTheAccumulator) {
  Buffer a = random_buffer({3, 4}, 5), d = random_buffer({3}, 6), s = random_buffer({}, 7);
  Buffer o = run1("function (A[N, M], D[N]) -> (O) { O[i : N] = +(A[i, j]) default D; }", {{"A", a}, {"D", d}});
  for (int64_t r = 0; r < 3; ++r) {
    double want = d.get(r);
    for (int64_t c = 0; c < 4; ++c) want += at(a, {r, c});
    EXPECT_NEAR(o.get(r), want, 1e-15);
  }
  // assign overwrites written elements and keeps the default elsewhere (broadcast from a scalar).
  Buffer q = run1("function (A[N, M], S[]) -> (O) { O[2*i : N] = =(A[2*i, 0]) default S; }", {{"A", a}, {"S", s}});
  EXPECT_EQ(q.to_doubles(), (std::vector<double>{at(a, {0, 0}), s.get(0), at(a, {2, 0})}));
}

TEST(InterpreterTest, AssignWritingTwiceIsAUserErrorWithAWitness) {
  std::string msg = run_error("function (I[N]) -> (O) { O[i : N] = =(I[i + j]), j < 2; }", {{"I", vec({1, 2, 3})}});
  EXPECT_NE(msg.find("assign contraction O writes O[0] more than once (at i=0, j=0 and at i=0, j=1)"),
            std::string::npos)
      << msg;
}

TEST(InterpreterTest, CombinationsEqCondAddProduct) {
  Buffer a = vec({1, 2, 3}), b = vec({2, 2, 5}), c = vec({10, 20, 30});
  TensorMap in{{"A", a}, {"B", b}};
  Buffer eq = run1("function (A[N], B[N]) -> (O) { O[i : N] = =(A[i] == B[i]); }", in);
  EXPECT_EQ(eq.dtype(), DType::boolean);
  EXPECT_EQ(eq.to_doubles(), (std::vector<double>{0, 1, 0}));
  // cond: contributes C only where A == B; a max over no contribution leaves 0.
  Buffer cond = run1("function (A[N], B[N], C[N]) -> (O) { O[i : N] = >(A[i] == B[j] ? C[j]); }",
                     {{"A", a}, {"B", b}, {"C", c}});
  EXPECT_EQ(cond.to_doubles(), (std::vector<double>{0, 20, 0}));
  Buffer add = run1("function (A[N], B[N]) -> (O) { O[i : N] = +(A[i] + B[j]); }", in);
  EXPECT_EQ(add.to_doubles(), (std::vector<double>{12, 15, 18}));
  Buffer prod = run1("function (A[N], B[N]) -> (O) { O[] = *(A[i] * B[i]); }", in);
  EXPECT_EQ(prod.get(0), 1.0 * 2 * 2 * 2 * 3 * 5);
}

TEST(InterpreterTest, ProductWithAZeroAndMinMaxNaN) {
  EXPECT_EQ(run1("function (A[N]) -> (O) { O[] = *(A[i]); }", {{"A", vec({4, 0, 3})}}).get(0), 0.0);
  double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(run1("function (A[N]) -> (O) { O[] = >(A[i]); }", {{"A", vec({4, nan, 3})}}).get(0)));
  EXPECT_TRUE(std::isnan(run1("function (A[N]) -> (O) { O[] = <(A[i]); }", {{"A", vec({nan, 1, 3})}}).get(0)));
}

TEST(InterpreterTest, EmptyDomainGivesZeros) {
  Buffer o = run1("function (A[N]) -> (O) { O[i : N] = >(A[i + j]), j < N - N; }", {{"A", vec({4, 5})}});
  EXPECT_EQ(o.to_doubles(), (std::vector<double>{0, 0}));
}

TEST(InterpreterTest, UnboundedVariableIsAUserError) {
  std::string msg = run_error("function (A[N]) -> (O) { O[i : N] = +(A[i + j - k]); }", {{"A", vec({1, 2})}});
  EXPECT_NE(msg.find("index variable j of contraction O is unbounded"), std::string::npos) << msg;
}

TEST(InterpreterTest, VariablesBoundedOnlyByRowsTogetherAreBounded) {
  // Neither i nor j is bounded by a row of its own; together i - j in [0, 4) and i + j in [0, 2) bound both.
  Buffer a = vec({1, 10, 100, 1000});
  Buffer o = run1("function (A[N]) -> (O) { O[] = +(A[i - j]), i + j < 2; }", {{"A", a}});
  // (i, j) in {(0, 0), (1, 0), (1, -1), (2, -1)}: every element of A once.
  EXPECT_EQ(o.get(0), 1111);
  // The reduced form of a defracted gradient: i + j_0 and i + 2*j_0 bound i and j_0 only together.
  Buffer b = Buffer::from_values(DType::f64, {3, 4}, {5, 1, 7, 3, 2, 8, 6, 4, 9, 0, 2, 1});
  Buffer m = run1("function (B[N, M]) -> (O) { O[] = <(B[i + j, i + 2*j]); }", {{"B", b}});
  EXPECT_EQ(m.get(0), 0);  // every B[s, t] is read once (i = 2s - t, j = t - s): the minimum of B
}

TEST(InterpreterTest, DefaultSeedsTheAccumulatorInTheOutputsDtype) {
  // A bool min with an f64 default: -0.5 is true, and min(true, false) is false (found by differential fuzzing).
  Buffer t = Buffer::from_values(DType::boolean, {2}, {1, 0});
  Buffer o = run1("function (T[N], A[]) -> (O) { O[i : 1] = <(T[k] == T[0]), k < 2 default A; }",
                  {{"T", t}, {"A", Buffer::from_values(DType::f64, {}, {-0.5})}});
  EXPECT_EQ(o.dtype(), DType::boolean);
  EXPECT_EQ(o.get(0), 0);
}

TEST(InterpreterTest, IntegerArithmeticWrapsExactly) {
  Buffer a = Buffer::from_values(DType::i32, {2}, {2147483647, 65537});
  EXPECT_EQ(run1("function (A[N]) -> (O) { O = A * A; }", {{"A", a}}).to_doubles(), (std::vector<double>{1, 131073}));
  // 3^40 mod 2^32, as a signed 32-bit value.
  Buffer threes = Buffer::from_values(DType::i32, {40}, std::vector<double>(40, 3));
  uint32_t p = 1;
  for (int k = 0; k < 40; ++k) p *= 3u;
  EXPECT_EQ(run1("function (A[N]) -> (O) { O[] = *(A[i]); }", {{"A", threes}}).get(0), static_cast<double>(static_cast<int32_t>(p)));
}

TEST(InterpreterTest, HugeDenominatorsAreExactOrRefused) {
  // i/2^62 is integral only at i = 0.
  Buffer o = run1("function (A[N]) -> (O) { O[i : N] = +(A[i/4611686018427387904 + i]); }", {{"A", vec({1, 2, 3})}});
  EXPECT_EQ(o.to_doubles(), (std::vector<double>{1, 0, 0}));
  // A common denominator beyond 64 bits is a clear error, not a silent overflow.
  std::string msg = run_error("function (A[N]) -> (O) { O[i : N] = +(A[i/4611686018427387904 + j/3]), j < 3; }", {{"A", vec({1, 2, 3})}});
  EXPECT_NE(msg.find("too large for the reference interpreter"), std::string::npos) << msg;
}

TEST(InterpreterTest, BroadcastingFollowsNumpy) {
  Buffer a = Buffer::from_values(DType::f64, {3, 1}, {1, 2, 3});
  Buffer b = vec({10, 20, 30, 40});
  Buffer o = run1("function (A[X, Y], B[Z]) -> (O) { O = A * B + 1; }", {{"A", a}, {"B", b}});
  ASSERT_EQ(o.shape(), (std::vector<int64_t>{3, 4}));
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(at(o, {r, c}), a.get(r) * b.get(c) + 1);
  std::string msg = run_error("function (A[X], B[Z]) -> (O) { O = A + B; }", {{"A", vec({1, 2})}, {"B", vec({1, 2, 3})}});
  EXPECT_NE(msg.find("cannot broadcast shapes (2) and (3) in elementwise statement O"), std::string::npos) << msg;
}

TEST(InterpreterTest, DtypesPromoteAndWeakLiteralsAdopt) {
  Buffer i = vec({-7, 7, 5}, DType::i32);
  Buffer f = vec({1.5, 2.5, -0.5}, DType::f32);
  TensorMap in{{"I", i}, {"F", f}};
  auto run = [&](const std::string& expr) {
    return run1("function (I[N], F[N]) -> (O) { O = " + expr + "; }", in);
  };
  Buffer div = run("I / 2");
  EXPECT_EQ(div.dtype(), DType::i32);
  EXPECT_EQ(div.to_doubles(), (std::vector<double>{-4, 3, 2}));  // floor division
  EXPECT_EQ(run("I % 2").to_doubles(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(run("I / 0").to_doubles(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(run("I * 2.5").dtype(), DType::f32);
  EXPECT_EQ(run("I + F").dtype(), DType::f32);
  EXPECT_EQ(run("cast(F, f64) + 1.1").dtype(), DType::f64);
  EXPECT_DOUBLE_EQ(run("cast(F, f64) + 1.1").get(0), 1.5 + 1.1);
  EXPECT_EQ(run("F + 1.1").get(0), static_cast<double>(1.5f + 1.1f));
  EXPECT_EQ(run("I < F").dtype(), DType::boolean);
  EXPECT_EQ(run("(I > 0) + (I > 0)").dtype(), DType::i32);
  EXPECT_EQ(run("exp(I)").dtype(), DType::f32);
  EXPECT_EQ(run("I + 2147483647").get(1), -2147483642.0);  // i32 wraps
  Buffer c = run1("function (I[N]) -> (O) { O = 0.25; }", {{"I", i}});
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(c.rank(), 0u);
}

TEST(InterpreterTest, Intrinsics) {
  Buffer x = vec({-2.5, -0.5, 0, 0.5, 2.5});
  auto run = [&](const std::string& expr) {
    return run1("function (X[N]) -> (O) { O = " + expr + "; }", {{"X", x}}).to_doubles();
  };
  EXPECT_EQ(run("round(X)"), (std::vector<double>{-3, -1, 0, 1, 3}));  // half away from zero
  EXPECT_EQ(run("sign(X)"), (std::vector<double>{-1, -1, 0, 1, 1}));
  EXPECT_EQ(run("relu(X)"), (std::vector<double>{0, 0, 0, 0.5, 2.5}));
  EXPECT_EQ(run("floor(X)"), (std::vector<double>{-3, -1, 0, 0, 2}));
  EXPECT_EQ(run("ceil(X)"), (std::vector<double>{-2, -0.0, 0, 1, 3}));
  EXPECT_EQ(run("abs(X)"), (std::vector<double>{2.5, 0.5, 0, 0.5, 2.5}));
  EXPECT_EQ(run("select(X > 0, X, -1)"), (std::vector<double>{-1, -1, -1, 0.5, 2.5}));
  EXPECT_EQ(run("max(X, 0.25)"), (std::vector<double>{0.25, 0.25, 0.25, 0.5, 2.5}));
  EXPECT_EQ(run("min(X, 0)"), (std::vector<double>{-2.5, -0.5, 0, 0, 0}));
  std::vector<double> v = run("sigmoid(X)");
  for (size_t k = 0; k < v.size(); ++k) EXPECT_DOUBLE_EQ(v[k], 1 / (1 + std::exp(-x.get(k))));
  struct Fn {
    const char* name;
    double (*f)(double);
  };
  for (Fn fn : {Fn{"exp", std::exp}, Fn{"sin", std::sin}, Fn{"cos", std::cos}, Fn{"tan", std::tan},
                Fn{"atan", std::atan}, Fn{"sinh", std::sinh}, Fn{"cosh", std::cosh}, Fn{"tanh", std::tanh},
                Fn{"erf", std::erf}}) {
    std::vector<double> r = run(std::string(fn.name) + "(X)");
    for (size_t k = 0; k < r.size(); ++k) EXPECT_DOUBLE_EQ(r[k], fn.f(x.get(k))) << fn.name;
  }
  Buffer y = vec({0.25, 0.5, 0.75});
  auto run_y = [&](const std::string& expr) {
    return run1("function (X[N]) -> (O) { O = " + expr + "; }", {{"X", y}}).to_doubles();
  };
  for (Fn fn : {Fn{"log", std::log}, Fn{"sqrt", std::sqrt}, Fn{"asin", std::asin}, Fn{"acos", std::acos}}) {
    std::vector<double> r = run_y(std::string(fn.name) + "(X)");
    for (size_t k = 0; k < r.size(); ++k) EXPECT_DOUBLE_EQ(r[k], fn.f(y.get(k))) << fn.name;
  }
  EXPECT_EQ(run_y("pow(X, 2)"), (std::vector<double>{0.0625, 0.25, 0.5625}));
  EXPECT_EQ(run_y("ident(X)"), y.to_doubles());
}

TEST(InterpreterTest, RunTimeShapeErrorsNameTheObject) {
  const std::string matmul = "function (A[I, K], B[K, J]) -> (C) { C[i, j : I, J] = +(A[i, k] * B[k, j]); }";
  auto a = random_buffer({3, 4}, 1), b = random_buffer({5, 2}, 2);
  std::string msg = run_error(matmul, {{"A", a}, {"B", b}});
  EXPECT_NE(msg.find("dims disagree: axis 0 of input B is 5 but K = 4 (bound by input A)"), std::string::npos) << msg;
  msg = run_error(matmul, {{"A", a}});
  EXPECT_NE(msg.find("missing input B"), std::string::npos) << msg;
  msg = run_error(matmul, {{"A", a}, {"B", random_buffer({4}, 3)}});
  EXPECT_NE(msg.find("input B is declared with rank 2 but got shape (4)"), std::string::npos) << msg;
  msg = run_error(matmul, {{"A", a}, {"B", random_buffer({4, 2}, 3)}, {"Z", a}});
  EXPECT_NE(msg.find("unknown input Z"), std::string::npos) << msg;
  msg = run_error("function (A[N]) -> (O) { O[i : N - 5] = +(A[i]); }", {{"A", vec({1, 2, 3})}});
  EXPECT_NE(msg.find("dim 0 of tensor O evaluates to -2 (N - 5); dims must not be negative"), std::string::npos) << msg;
  msg = run_error("function (A[N], B[N + 1]) -> (O) { O = A; }", {{"A", vec({1, 2})}, {"B", vec({1, 2})}});
  EXPECT_NE(msg.find("axis 0 of input B is 2 but N + 1 = 3"), std::string::npos) << msg;
}

// The post's three forms of the input gradient compute the same values, and the flip is the adjoint of the
// forward convolution: <DO, conv(I, K)> == <DI(DO, K), I>.
TEST(InterpreterTest, SeedGradientFormsAgreeAndFlipIsTheAdjoint) {
  Buffer dout = random_buffer({2, 3, 3, 7}, 11), k = random_buffer({2, 2, 5, 7}, 12), in = random_buffer({2, 9, 9, 5}, 13);
  TensorMap args{{"DO", dout}, {"K", k}};
  auto run_example = [](const std::string& name, const TensorMap& a) {
    return interpret(parse_file(POLYTILE_SOURCE_DIR "/examples/" + name + ".tile"), a);
  };
  Buffer flip = run_example("conv2d_strided_dilated_grad_input", args).at("DI");
  Buffer reduced = run_example("conv2d_grad_input_reduced", args).at("DI");
  Buffer defracted = run_example("conv2d_grad_input_defracted", args).at("DI");
  testing::expect_near_buffers(reduced, flip, 1e-12, "reduced vs flip");
  testing::expect_near_buffers(defracted, flip, 1e-12, "defracted vs flip");
  Buffer out = run_example("conv2d_strided_dilated", {{"I", in}, {"K", k}}).at("O");
  double lhs = 0, rhs = 0;
  for (int64_t e = 0; e < out.size(); ++e) lhs += out.get(e) * dout.get(e);
  for (int64_t e = 0; e < in.size(); ++e) rhs += flip.get(e) * in.get(e);
  EXPECT_NEAR(lhs, rhs, 1e-10);
  // Independent check of the forward convolution at every output element.
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t y = 0; y < 3; ++y)
      for (int64_t x = 0; x < 3; ++x)
        for (int64_t co = 0; co < 7; ++co) {
          double want = 0;
          for (int64_t j = 0; j < 2; ++j)
            for (int64_t i = 0; i < 2; ++i)
              for (int64_t ci = 0; ci < 5; ++ci) want += at(in, {n, 3 * y + 2 * j, 3 * x + 2 * i, ci}) * at(k, {j, i, ci, co});
          EXPECT_NEAR(at(out, {n, y, x, co}), want, 1e-12);
        }
}

TEST(InterpreterTest, PlaidmlGeneratedGradientMatchesTheFlip) {
  Buffer k = random_buffer({2, 2, 5, 7}, 21), in = random_buffer({2, 9, 9, 5}, 22);
  TensorMap r = interpret(parse_file(POLYTILE_SOURCE_DIR "/examples/plaidml_generated_gradient.tile"),
                          {{"X_I_0", k}, {"X_I_1", in}});
  Buffer dout(DType::f64, {2, 3, 3, 7});
  for (int64_t e = 0; e < dout.size(); ++e) dout.set(e, static_cast<float>(0.007936507936507936));
  Buffer flip = interpret(parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated_grad_input.tile"),
                          {{"DO", dout}, {"K", k}})
                    .at("DI");
  testing::expect_near_buffers(r.at("X_T15"), flip, 1e-12, "X_T15");
  const Buffer& dk = r.at("X_T17");
  for (int64_t j = 0; j < 2; ++j)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t ci = 0; ci < 5; ++ci)
        for (int64_t co = 0; co < 7; ++co) {
          double want = 0;
          for (int64_t n = 0; n < 2; ++n)
            for (int64_t y = 0; y < 3; ++y)
              for (int64_t x = 0; x < 3; ++x) want += at(in, {n, 3 * y + 2 * j, 3 * x + 2 * i, ci});
          EXPECT_NEAR(at(dk, {j, i, ci, co}), want * static_cast<float>(0.007936507936507936), 1e-12);
        }
}

TEST(InterpreterTest, KeepIntermediates) {
  Program p = parse_program("function (A[N]) -> (O) { T = A * 2; O = T + 1; }");
  TensorMap all = interpret(p, {{"A", vec({1, 2})}}, InterpretOptions{true});
  EXPECT_EQ(all.at("T").to_doubles(), (std::vector<double>{2, 4}));
  EXPECT_EQ(interpret(p, {{"A", vec({1, 2})}}).count("T"), 0u);
}

}  // namespace
}  // namespace polytile
