// f16 and i64 through every room: the half conversions against the compiler's own _Float16 and a
// nearest-value search, i64 exactness beyond 2^53 and wrap-around against uint64 arithmetic in the test,
// and the CPU backend (native and under GPU semantics) against the interpreter -- bit for bit where the
// semantics are exact (f16 elementwise operations are IEEE half arithmetic; integers are exact), with
// f16 contractions accumulating in f32 and rounding once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "polytile/cpu.h"
#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/kernel_cache.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Every finite half, ascending (bits 0x0000-0x7bff and their negatives).
std::vector<double> finite_halves() {
  std::vector<double> v;
  for (uint32_t b = 0; b <= 0x7bff; ++b) {
    v.push_back(half_to_double(static_cast<uint16_t>(b)));
    if (b) v.push_back(-half_to_double(static_cast<uint16_t>(b)));
  }
  std::sort(v.begin(), v.end());
  return v;
}

// The half nearest to x by search: ties go to the even significand; beyond 65504 + half an ulp, infinity.
double nearest_half(const std::vector<double>& halves, double x) {
  if (std::fabs(x) >= 65520) return std::copysign(kInf, x);
  auto hi = std::lower_bound(halves.begin(), halves.end(), x);
  if (hi != halves.end() && *hi == x) return x;
  double above = *hi, below = *(hi - 1);
  if (x - below != above - x) return x - below < above - x ? below : above;
  return (half_from_double(below) & 1) == 0 ? below : above;
}

TEST(HalfTest, BitsAndValues) {
  EXPECT_EQ(half_from_double(1.0), 0x3c00);
  EXPECT_EQ(half_from_double(-2.0), 0xc000);
  EXPECT_EQ(half_from_double(65504.0), 0x7bff);
  EXPECT_EQ(half_from_double(0x1p-24), 0x0001);  // the smallest subnormal
  EXPECT_EQ(half_from_double(0x1p-14), 0x0400);  // the smallest normal
  EXPECT_EQ(half_from_double(0x1p-26), 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(half_from_double(-0.0), 0x8000);
  EXPECT_EQ(half_from_double(65519.99), 0x7bff);
  EXPECT_EQ(half_from_double(65520.0), 0x7c00);
  EXPECT_EQ(half_from_double(-kInf), 0xfc00);
  EXPECT_TRUE(std::isnan(half_to_double(half_from_double(kNaN))));
  EXPECT_EQ(half_to_double(0x3555), 0x1.554p-2);
  // Every half round-trips, and the values ascend with the bits.
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const double v = half_to_double(static_cast<uint16_t>(b));
    ASSERT_EQ(half_from_double(v), b);
    ASSERT_EQ(half_from_double(-v), b | 0x8000);
    if (b) {
      ASSERT_LT(half_to_double(static_cast<uint16_t>(b - 1)), v);
    }
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  const std::vector<double> halves = finite_halves();
  std::mt19937_64 rng(16);
  std::vector<double> xs;
  for (size_t i = 1; i + 1 < halves.size(); i += 7) {  // midpoints and their neighbours, every magnitude
    const double mid = (halves[i] + halves[i + 1]) / 2;
    for (double x : {mid, std::nextafter(mid, kInf), std::nextafter(mid, -kInf), halves[i]}) xs.push_back(x);
  }
  for (int i = 0; i < 20000; ++i) xs.push_back(std::ldexp(static_cast<double>(rng() >> 11) * 0x1p-53 - 0.5, static_cast<int>(rng() % 44) - 28));
  for (double x : xs) {
    ASSERT_EQ(half_to_double(half_from_double(x)), nearest_half(halves, x)) << std::hexfloat << x;
#ifdef __FLT16_MAX__  // the compiler's conversion (GCC 12 and Clang on x86-64 and AArch64)
    ASSERT_EQ(round_to(DType::f16, x), static_cast<double>(static_cast<_Float16>(x))) << std::hexfloat << x;
#endif
  }
}

TEST(I64Test, BuffersHoldEveryValueAndWrap) {
  Buffer b(DType::i64, {4});
  const int64_t big = (int64_t{1} << 62) + 12345;  // not a double
  b.set_int(0, big);
  b.set_int(1, std::numeric_limits<int64_t>::min());
  b.set(2, 0x1p64 + 0x1p12);  // wraps modulo 2^64
  b.set(3, -0x1p63);
  EXPECT_EQ(b.get_int(0), big);
  EXPECT_EQ(b.get_int(1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(b.get_int(2), 4096);
  EXPECT_EQ(b.get_int(3), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(round_to(DType::i64, 0x1p63), -0x1p63);
  EXPECT_EQ(round_to(DType::i64, -0x1p63 - 0x1p11 * 2), 0x1p63 - 4096);
  EXPECT_EQ(round_to(DType::i64, kNaN), 0);
  EXPECT_EQ(round_to(DType::i64, -kInf), 0);
  EXPECT_EQ(round_to(DType::i64, -7.9), -7);
  Buffer c = b;
  c.set_int(0, big + 1);
  EXPECT_FALSE(difference(c, b).within(0)) << "integers compare exactly, not as doubles";
  EXPECT_TRUE(difference(b, b).within(0));
}

// Bit-for-bit agreement (NaNs agree as NaNs), or within `tolerance` relatively for floats.
void expect_agree(const Buffer& got, const Buffer& want, const std::string& what, double tolerance = 0) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t e = 0; e < want.size(); ++e) {
    if (!is_float(want.dtype())) {
      ASSERT_EQ(got.get_int(e), want.get_int(e)) << what << " at " << e;
    } else if (std::isnan(want.get(e))) {
      ASSERT_TRUE(std::isnan(got.get(e))) << what << " at " << e;
    } else if (tolerance == 0 || std::isinf(want.get(e))) {
      ASSERT_EQ(got.get(e), want.get(e)) << what << " at " << e;
    } else {
      ASSERT_NEAR(got.get(e), want.get(e), tolerance * std::max(1.0, std::fabs(want.get(e)))) << what << " at " << e;
    }
  }
}

std::vector<std::pair<std::string, cpu::CompileOptions>> backends() {
  cpu::CompileOptions native, gpu;
  native.verify = true;
  gpu.target = sched::gpu_target("sm_90");
  return {{"cpu", native}, {"gpu semantics", gpu}};
}

// The interpreter's `output` of the program `text`, once the CPU backend (every proof on) and GPU semantics
// have computed the same: bit for bit, or within `tolerance` relatively.
Buffer interpreted_and_compiled(const std::string& text, const TensorMap& in, const std::string& output = "O",
                                double tolerance = 0) {
  Program p = parse_program(text);
  Buffer want = interpret(p, in).at(output);
  for (const auto& [what, options] : backends())
    expect_agree(cpu::run(p, in, options).at(output), want, text + " on " + what, tolerance);
  return want;
}

TEST(I64Test, ArithmeticIsExactAndWrapsLikeUint64) {
  const int64_t m = std::numeric_limits<int64_t>::min(), M = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> a = {(int64_t{1} << 62) + 3, M, m, -7, 7, (int64_t{1} << 53) + 1, 0, -(int64_t{1} << 40)};
  const std::vector<int64_t> b = {5, 2, -1, 2, -2, 3, 9, 0};
  Buffer A(DType::i64, {8}), B(DType::i64, {8});
  for (int64_t i = 0; i < 8; ++i) {
    A.set_int(i, a[i]);
    B.set_int(i, b[i]);
  }
  TensorMap in{{"A", A}, {"B", B}};
  // The oracle: uint64 arithmetic (wraps), Python's floor division and modulo with x / 0 = 0.
  auto wrap = [](uint64_t v) { return static_cast<int64_t>(v); };
  auto floor_div = [](int64_t x, int64_t y, bool mod) -> int64_t {
    if (y == 0) return 0;
    if (y == -1) return mod ? 0 : static_cast<int64_t>(0 - static_cast<uint64_t>(x));
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) return mod ? r + y : q - 1;
    return mod ? r : q;
  };
  struct Case {
    const char* expr;
    std::function<int64_t(int64_t, int64_t)> want;
  };
  const std::vector<Case> cases = {
      {"A * B + A", [&](int64_t x, int64_t y) { return wrap(static_cast<uint64_t>(x) * static_cast<uint64_t>(y) + static_cast<uint64_t>(x)); }},
      {"A - B", [&](int64_t x, int64_t y) { return wrap(static_cast<uint64_t>(x) - static_cast<uint64_t>(y)); }},
      {"A / B", [&](int64_t x, int64_t y) { return floor_div(x, y, false); }},
      {"A % B", [&](int64_t x, int64_t y) { return floor_div(x, y, true); }},
      {"-A", [&](int64_t x, int64_t) { return wrap(0 - static_cast<uint64_t>(x)); }},
      {"abs(A)", [&](int64_t x, int64_t) { return x < 0 ? wrap(0 - static_cast<uint64_t>(x)) : x; }},
      {"max(A, B) + min(A, B)", [&](int64_t x, int64_t y) { return wrap(static_cast<uint64_t>(x) + static_cast<uint64_t>(y)); }},
      {"A + cast(B, i32)", [&](int64_t x, int64_t y) { return wrap(static_cast<uint64_t>(x) + static_cast<uint64_t>(y)); }},
      {"cast(A, i32)", [&](int64_t x, int64_t) { return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(x))); }},
      {"cast(A > B, i64) * 3", [&](int64_t x, int64_t y) { return x > y ? 3 : 0; }},
  };
  for (const auto& [expr, want] : cases) {
    const Buffer o = interpreted_and_compiled(std::string("function (A[N], B[N]) -> (O) { O = ") + expr + "; }", in);
    ASSERT_EQ(o.dtype(), std::string(expr).rfind("cast(A, i32)", 0) == 0 ? DType::i32 : DType::i64) << expr;
    for (int64_t i = 0; i < 8; ++i) ASSERT_EQ(o.get_int(i), want(a[i], b[i])) << expr << " at " << i;
  }
  // Contractions: a wrapping sum, max, min and product of values beyond 2^53.
  for (const char* agg : {"+", ">", "<", "*"}) {
    const std::string text = std::string("function (A[N], B[N]) -> (O) { O[] = ") + agg + "(A[i] * B[i]); }";
    uint64_t sum = 0, prod = 1;
    int64_t hi = m, lo = M;
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t t = wrap(static_cast<uint64_t>(a[i]) * static_cast<uint64_t>(b[i]));
      sum += static_cast<uint64_t>(t);
      prod *= static_cast<uint64_t>(t);
      hi = std::max(hi, t);
      lo = std::min(lo, t);
    }
    const int64_t want = agg[0] == '+' ? wrap(sum) : agg[0] == '*' ? wrap(prod) : agg[0] == '>' ? hi : lo;
    EXPECT_EQ(interpreted_and_compiled(text, in).get_int(0), want) << agg;
  }
  // Casts from floats beyond 2^63 wrap modulo 2^64; NaN and infinity give 0.
  Buffer F = Buffer::from_values(DType::f64, {6}, {0x1p64 + 0x1p13, -0x1p63, 0x1p63 + 0x1p11, kNaN, -kInf, -2.75});
  const Buffer cast = interpreted_and_compiled("function (F[N]) -> (O) { O = cast(F, i64); }", {{"F", F}});
  const std::vector<int64_t> want = {8192, m, m + 2048, 0, 0, -2};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(cast.get_int(i), want[i]) << i;
}

TEST(HalfTest, ElementwiseOperationsAreIeeeHalfArithmetic) {
  std::mt19937_64 rng(61);
  Buffer X(DType::f16, {64}), Y(DType::f16, {64});
  for (int64_t i = 0; i < 64; ++i) {
    X.set(i, std::ldexp(static_cast<double>(rng() >> 11) * 0x1p-53 - 0.5, static_cast<int>(rng() % 20) - 8));
    Y.set(i, std::ldexp(static_cast<double>(rng() >> 11) * 0x1p-53 - 0.5, static_cast<int>(rng() % 20) - 8));
  }
  Y.set(0, 0);
  X.set(1, 60000);
  Y.set(1, 60000);  // overflows to infinity in half
  TensorMap in{{"X", X}, {"Y", Y}};
  // Each operation rounds its f32 result to a half, so a chain rounds at every step: the oracle is
  // round_to(f16, ...) of the double result of each step (exact: a double holds the exact result).
  struct Case {
    const char* expr;
    std::function<double(double, double)> want;
  };
  auto h = [](double v) { return round_to(DType::f16, v); };
  const std::vector<Case> cases = {
      {"X + Y", [&](double x, double y) { return h(x + y); }},
      {"X * Y - X", [&](double x, double y) { return h(h(x * y) - x); }},
      {"X / Y", [&](double x, double y) { return h(x / y); }},
      {"sqrt(abs(X))", [&](double x, double) { return h(std::sqrt(std::fabs(x))); }},
      {"X * 0.1", [&](double x, double) { return h(x * h(0.1)); }},
      {"max(X, Y) - min(X, Y)", [&](double x, double y) { return h(std::max(x, y) - std::min(x, y)); }},
      {"cast(cast(X, f64) * 3.0000001, f16)", [&](double x, double) { return h(x * 3.0000001); }},
      {"cast(X > Y, f16) + X", [&](double x, double y) { return h((x > y ? 1.0 : 0.0) + x); }},
  };
  for (const auto& [expr, want] : cases) {
    const Buffer o = interpreted_and_compiled(std::string("function (X[N], Y[N]) -> (O) { O = ") + expr + "; }", in);
    ASSERT_EQ(o.dtype(), DType::f16) << expr;
    for (int64_t i = 0; i < 64; ++i) {
      const double w = want(X.get(i), Y.get(i));
      if (std::isnan(w)) {
        ASSERT_TRUE(std::isnan(o.get(i))) << expr << " at " << i;
      } else {
        ASSERT_EQ(o.get(i), w) << expr << " at " << i << ": X=" << X.get(i) << " Y=" << Y.get(i);
      }
    }
  }
  // f64 -> f16 rounds once: 1 + 2^-11 + 2^-40 is above the midpoint of 1 and 1 + 2^-10, though rounding
  // it to f32 first would land on the midpoint and then on 1 (ties to even).
  Buffer D = Buffer::from_values(DType::f64, {3}, {1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11, -(1 + 0x1p-11 + 0x1p-40)});
  const Buffer rounded = interpreted_and_compiled("function (D[N]) -> (O) { O = cast(D, f16); }", {{"D", D}});
  EXPECT_EQ(rounded.get(0), 1 + 0x1p-10);
  EXPECT_EQ(rounded.get(1), 1.0);
  EXPECT_EQ(rounded.get(2), -(1 + 0x1p-10));
}

TEST(HalfTest, ContractionsAccumulateInF32AndRoundOnce) {
  // 1 + 1024 * 2^-12: each 2^-12 is a quarter of the half ulp at 1, so summing in half stays at 1;
  // in f32 the sum is 1.25, a half.
  Buffer A(DType::f16, {1025});
  A.set(0, 1);
  for (int64_t i = 1; i < 1025; ++i) A.set(i, 0x1p-12);
  // Both backends agree with the interpreter bit for bit, so they give 1.25 too.
  EXPECT_EQ(interpreted_and_compiled("function (A[N]) -> (O) { O[] = +(A[i]); }", {{"A", A}}).get(0), 1.25);
  // A matmul: within the f32 accumulation's error of the interpreter's (double) sum, rounded to half.
  std::mt19937_64 rng(12);
  Buffer M(DType::f16, {33, 70}), N(DType::f16, {70, 17});
  for (Buffer* b : {&M, &N})
    for (int64_t i = 0; i < b->size(); ++i) b->set(i, static_cast<double>(rng() >> 11) * 0x1p-53 * 2 - 1);
  const std::string mm = "function (A[I, K], B[K, J]) -> (C) { C[i, j : I, J] = +(A[i, k] * B[k, j]); }";
  EXPECT_EQ(interpreted_and_compiled(mm, {{"A", M}, {"B", N}}, "C", 0x1p-10).dtype(), DType::f16);
  // Mixed: an i32 and an f16 operand promote to f16 (computed in f32); max stays in half.
  Buffer I = Buffer::from_values(DType::i32, {4}, {1, -2, 3, 70000});
  Buffer H = Buffer::from_values(DType::f16, {4}, {0.5, 0.25, -1, 1});
  for (const char* text : {"function (I[N], H[N]) -> (O) { O[] = +(I[i] * H[i]); }",
                           "function (I[N], H[N]) -> (O) { O[] = >(I[i] * H[i]); }",
                           "function (I[N], H[N]) -> (O) { O[i : N] = >(H[i]); }"})
    EXPECT_EQ(interpreted_and_compiled(text, {{"I", I}, {"H", H}}).dtype(), DType::f16) << text;
}

// A default seeds an f16 contraction's accumulator as a value of its dtype, a half (the interpreter's rule),
// before the f32 accumulation: 1 + 2^-11 (an f32 default) is a tie between the halves 1 and 1 + 2^-10 and
// rounds to 1, so 1 + four 2^-12 is 1 + 2^-10; seeded with the f32 value, the sum 1 + 3 * 2^-11 (a tie
// again) rounds to 1 + 2^-9 (random programs of the differential fuzzer found it). An f16 default is
// widened as it is, an f64 one rounded once, and both backends agree with the interpreter bit for bit.
TEST(HalfTest, ADefaultSeedsTheAccumulatorAsAHalf) {
  const Buffer B = Buffer::from_values(DType::f16, {4}, {0x1p-12, 0x1p-12, 0x1p-12, 0x1p-12});
  const std::string sum = "function (D[M], B[N]) -> (O) { O[j : M] = +(B[i]) default D; }";
  for (DType d : {DType::f32, DType::f64}) {
    const Buffer D = Buffer::from_values(d, {2}, {1 + 0x1p-11, 3});
    const Buffer o = interpreted_and_compiled(sum, {{"D", D}, {"B", B}});
    ASSERT_EQ(o.dtype(), DType::f16);
    EXPECT_EQ(o.get(0), 1 + 0x1p-10) << to_string(d);
    EXPECT_EQ(o.get(1), 3) << to_string(d);  // 3 + 2^-10, a tie between 3 and 3 + 2^-9: the even one
  }
  const Buffer H = Buffer::from_values(DType::f16, {2}, {1 + 0x1p-10, 3});
  EXPECT_EQ(interpreted_and_compiled(sum, {{"D", H}, {"B", B}}).get(0), 1 + 0x1p-9);
}

// Ahead-of-time export and the kernel cache run what the JIT runs: the header declares int64_t and
// uint16_t (binary16 bits) arguments, and the loaded object computes the interpreter's values.
TEST(DTypeTest, ExportedObjectsRunBothDtypes) {
  Program p = parse_program("function (A[N], H[N]) -> (O, P) { O = A * 3 - 1; S[] = +(H[i] * H[i]); P = H / S; }");
  Buffer A(DType::i64, {5}), H(DType::f16, {5});
  for (int64_t i = 0; i < 5; ++i) {
    A.set_int(i, (int64_t{1} << 60) + i * 977);
    H.set(i, 0.3 * static_cast<double>(i) - 0.5);
  }
  const TensorMap in{{"A", A}, {"H", H}};
  cpu::ExportedObject exported = cpu::export_object(p, testing::types_of(in), "dtypes");
  EXPECT_NE(exported.header.find("const int64_t* A"), std::string::npos) << exported.header;
  EXPECT_NE(exported.header.find("const uint16_t* H"), std::string::npos) << exported.header;
  EXPECT_NE(exported.header.find("IEEE binary16"), std::string::npos) << exported.header;
  TensorMap want = interpret(p, in), got = cpu::load(std::move(exported))->run(in, 1);
  expect_agree(got.at("O"), want.at("O"), "exported O");
  expect_agree(got.at("P"), want.at("P"), "exported P", 0x1p-10);
}

TEST(DTypeTest, LiteralsBeyondTwoToThe53AreRefused) {
  EXPECT_THROW(parse_program("function (A[N]) -> (O) { O = A + 9007199254740993; }"), UserError);
  EXPECT_NO_THROW(parse_program("function (A[N]) -> (O) { O = A + 9007199254740992; }"));
}

}  // namespace
}  // namespace polytile
