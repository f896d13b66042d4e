// Value semantics of the IR building blocks: exact rationals, dim expressions, polynomials, printing.
#include <gtest/gtest.h>

#include "polytile/error.h"
#include "polytile/ir.h"
#include "polytile/view.h"

namespace polytile {
namespace {

TEST(RationalTest, NormalizesSignAndGcd) {
  Rational r(4, -6);
  EXPECT_EQ(r.num(), -2);
  EXPECT_EQ(r.den(), 3);
  EXPECT_EQ(r.str(), "-2/3");
  EXPECT_EQ(Rational(6, 3).str(), "2");
  EXPECT_TRUE(Rational(0, 5) == Rational(0));
}

TEST(RationalTest, ArithmeticIsExact) {
  Rational a(1, 3), b(1, 6);
  EXPECT_EQ((a + b).str(), "1/2");
  EXPECT_EQ((a - b).str(), "1/6");
  EXPECT_EQ((a * b).str(), "1/18");
  EXPECT_EQ((a / b).str(), "2");
  EXPECT_TRUE(b < a);
  EXPECT_FALSE(a < b);
}

TEST(RationalTest, DivisionByZeroAndOverflowAreUserErrors) {
  EXPECT_THROW(Rational(1, 0), UserError);
  EXPECT_THROW(Rational(1) / Rational(0), UserError);
  Rational big(INT64_MAX / 2 + 1);
  EXPECT_THROW(big * Rational(4), UserError);
  EXPECT_THROW(big + big, UserError);
}

TEST(DimExprTest, FoldsConstantsAndEvaluatesFloorDivision) {
  DimExpr n = DimExpr::symbol("N");
  EXPECT_EQ((DimExpr(3) * DimExpr(4) - 2).str(), "10");
  EXPECT_EQ((n + 0).str(), "N");
  EXPECT_EQ((n * 1).str(), "N");
  EXPECT_EQ((n + -2).str(), "N - 2");
  DimExpr e = (n + 1) / 2;
  EXPECT_EQ(e.str(), "(N + 1)/2");
  EXPECT_EQ(e.evaluate({{"N", 7}}), 4);
  EXPECT_EQ(((n - 10) / 3).evaluate({{"N", 0}}), -4);  // floor, not truncation
  EXPECT_EQ(max(n, DimExpr(3)).evaluate({{"N", 1}}), 3);
  EXPECT_EQ(min(n, DimExpr(3)).str(), "min(N, 3)");
}

TEST(DimExprTest, PrintsMinimalParentheses) {
  DimExpr x = DimExpr::symbol("X"), k = DimExpr::symbol("KX");
  EXPECT_EQ((x - DimExpr(2) * (k - 1)).str(), "X - 2*(KX - 1)");
  EXPECT_EQ((x - (k - 1)).str(), "X - KX + 1");  // sums are left-associated, constants merged
  EXPECT_EQ(((x + 2) - 1).str(), "X + 1");
  EXPECT_EQ((x * (k * 2)).str(), "X*KX*2");
  EXPECT_EQ(((x - k) - 1).str(), "X - KX - 1");
  EXPECT_EQ((x / (k * 2)).str(), "X/(KX*2)");
}

TEST(DimExprTest, UnboundSymbolAndZeroDivisionAreUserErrors) {
  DimExpr n = DimExpr::symbol("N");
  EXPECT_THROW(n.evaluate({}), UserError);
  EXPECT_THROW((DimExpr(4) / n).evaluate({{"N", 0}}), UserError);
  EXPECT_THROW(DimExpr(4) / DimExpr(0), UserError);
}

TEST(PolynomialTest, SortsTermsAndPrintsRationalCoefficients) {
  Polynomial p = Polynomial::index("y") * Rational(3) + Polynomial::index("j") * Rational(2);
  EXPECT_EQ(p.str(), "2*j + 3*y");
  Polynomial q = (Polynomial::index("i") - Polynomial::index("j") + Rational(1)) * Rational(1, 2);
  EXPECT_EQ(q.str(), "1/2*i - 1/2*j + 1/2");
  EXPECT_EQ((p - p).str(), "0");
  EXPECT_EQ((Polynomial::index("v1") * Rational(1, 3) - Polynomial::index("v4") * Rational(2, 3)).str(),
            "1/3*v1 - 2/3*v4");
}

TEST(PolynomialTest, DimsSplitIntoLinearAtomsAndBind) {
  DimExpr n = DimExpr::symbol("N"), m = DimExpr::symbol("M");
  Polynomial p = Polynomial::index("i") + Polynomial::dim(DimExpr(2) * (n - 1)) + Polynomial::dim((m + 1) / 2);
  EXPECT_EQ(p.str(), "i + 2*N + div(M + 1, 2) - 2");
  Polynomial b = p.bind_dims({{"N", 5}, {"M", 4}});
  EXPECT_EQ(b.str(), "i + 10");
  EXPECT_EQ(Polynomial::dim(n * m).str(), "(N*M)");
}

TEST(PolynomialTest, AVariableIsOneIndexAndNothingElse) {
  const Polynomial i = Polynomial::index("i");
  EXPECT_EQ(i.variable(), std::optional<std::string>("i"));
  EXPECT_EQ((i * Rational(2)).variable(), std::nullopt);
  EXPECT_EQ((i + Rational(1)).variable(), std::nullopt);
  EXPECT_EQ((i + Polynomial::index("j")).variable(), std::nullopt);
  EXPECT_EQ((i + Polynomial::dim(DimExpr::symbol("N"))).variable(), std::nullopt);
  EXPECT_EQ(Polynomial(Rational(0)).variable(), std::nullopt);
  EXPECT_EQ((i * Rational(2) - i).variable(), std::optional<std::string>("i"));
}

TEST(PolynomialTest, RenamesIndices) {
  Polynomial p = Polynomial::index("a") * Rational(2) + Polynomial::index("b");
  EXPECT_EQ(p.rename_indices({{"a", "z"}}).str(), "b + 2*z");
  EXPECT_EQ(p.rename_indices({{"a", "b"}}).str(), "3*b");
}

TEST(ExprTest, PrintsWithPrecedence) {
  Expr a = Expr::tensor("A"), b = Expr::tensor("B"), c = Expr::tensor("C");
  EXPECT_EQ(Expr::binary(BinaryOp::mul, Expr::binary(BinaryOp::add, a, b), c).str(), "(A + B) * C");
  EXPECT_EQ(Expr::binary(BinaryOp::sub, a, Expr::binary(BinaryOp::sub, b, c)).str(), "A - (B - C)");
  EXPECT_EQ(Expr::unary(UnaryOp::neg, Expr::literal(2.5, false)).str(), "-2.5");
  EXPECT_EQ(Expr::literal(1, false).str(), "1.0");
  EXPECT_EQ(Expr::call(Intrinsic::cast, {a}, DType::f64).str(), "cast(A, f64)");
  EXPECT_THROW(Expr::call(Intrinsic::exp, {a, b}), UserError);
}

TEST(DTypeTest, PromotionLattice) {
  EXPECT_EQ(promote(DType::boolean, DType::i32), DType::i32);
  EXPECT_EQ(promote(DType::i32, DType::f32), DType::f32);
  EXPECT_EQ(promote(DType::f64, DType::f32), DType::f64);
  EXPECT_EQ(promote(DType::i32, DType::i64), DType::i64);
  EXPECT_EQ(promote(DType::i64, DType::f16), DType::f16);  // as PyTorch: a float beats any integer
  EXPECT_EQ(promote(DType::f16, DType::f32), DType::f32);
  EXPECT_EQ(promote(DType::boolean, DType::f16), DType::f16);
  for (DType t : {DType::f16, DType::f32, DType::f64, DType::i32, DType::i64, DType::boolean}) {
    EXPECT_EQ(parse_dtype(to_string(t)), t);
    EXPECT_EQ(promote(t, t), t);
  }
  EXPECT_EQ(dtype_bytes(DType::f16), 2u);
  EXPECT_EQ(dtype_bytes(DType::i64), 8u);
  EXPECT_FALSE(parse_dtype("u8").has_value());
  EXPECT_FALSE(parse_dtype("bf16").has_value());
}

// Row-major layouts are contiguous whatever a dim of extent 1 strides by; a tensor without elements has no
// layout, so any strides are (DLPack exporters give empty arrays zeros or anything).
TEST(TensorViewTest, ContiguousLayouts) {
  float x = 0;
  EXPECT_TRUE((TensorView{&x, DType::f32, {2, 3}, {}}).contiguous());
  EXPECT_TRUE((TensorView{&x, DType::f32, {2, 3}, {3, 1}}).contiguous());
  EXPECT_TRUE((TensorView{&x, DType::f32, {1, 3}, {7, 1}}).contiguous());
  EXPECT_FALSE((TensorView{&x, DType::f32, {2, 3}, {1, 2}}).contiguous());
  EXPECT_FALSE((TensorView{&x, DType::f32, {2, 3}, {4, 1}}).contiguous());
  EXPECT_FALSE((TensorView{&x, DType::f32, {2, 3}, {3}}).contiguous());
  EXPECT_TRUE((TensorView{&x, DType::f32, {0, 4}, {0, 0}}).contiguous());
  EXPECT_TRUE((TensorView{nullptr, DType::f32, {3, 0}, {5, 9}}).contiguous());
}

}  // namespace
}  // namespace polytile
