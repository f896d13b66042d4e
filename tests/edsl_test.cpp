// eDSL constructs beyond the tutorial -- every aggregation and combination, defaults, elementwise
// operators and intrinsics -- compared with the text front end, and every eDSL user error.
#include <gtest/gtest.h>

#include "polytile/edsl.h"
#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile {
namespace {

using namespace polytile::edsl;  // NOLINT

std::string text(const std::string& t) { return print(parse_program(t)); }

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}

TEST(EdslTest, EveryAggregationAndCombinationMatchesTheTextFrontEnd) {
  Tensor A = Placeholder("A", 2), B = Placeholder("B", 1), C = Placeholder("C", 1);
  TensorDim N("N"), M("M");
  TensorIndex i("i"), j("j");
  A.bind_dims(N, M);
  B.bind_dims(M);
  C.bind_dims(N);
  auto P = TensorOutput(N).named("P");
  P(i) *= A(i, j) + B(j);
  auto Q = TensorOutput(N).named("Q");
  Q(i) <= (A(i, j) == B(j));  // C++ binds <= tighter than ==
  auto R = TensorOutput(N).named("R");
  R(i) >= cond(A(i, j), B(j), C(i));
  auto S = TensorOutput(N, 2).named("S");
  S(i, 1) = C(i);
  auto T = TensorOutput(N).named("T");
  T(i) += A(i, j);
  T.add_constraints({j < M - 1, i - j < N});
  T.set_default(C);
  auto U = TensorOutput(2 * N - 1).named("U");
  U((i + j) / 2) += A(i, j);
  Program p = make_program("f", {A, B, C}, {P, Q, R, S, T, U});
  EXPECT_EQ(print(p), text("function f (A[N, M], B[M], C[N]) -> (P, Q, R, S, T, U) {\n"
                           "  P[i : N] = *(A[i, j] + B[j]);\n"
                           "  Q[i : N] = <(A[i, j] == B[j]);\n"
                           "  R[i : N] = >(A[i, j] == B[j] ? C[i]);\n"
                           "  S[i, 1 : N, 2] = =(C[i]);\n"
                           "  T[i : N] = +(A[i, j]), j < M - 1, i - j < N default C;\n"
                           "  U[1/2*i + 1/2*j : 2*N - 1] = +(A[i, j]);\n"
                           "}"));
}

TEST(EdslTest, ElementwiseOperatorsAndIntrinsicsMatchTheTextFrontEnd) {
  Tensor A = Placeholder("A", 1), B = Placeholder("B", 2);
  TensorDim N("N");
  A.bind_dims(N);
  Tensor O = select((A < 0 && !(B >= 1)) || A == B, -A * 0.25, pow(B, A) % 3) / N + cast(A, DType::f64);
  Tensor E = exp(log(sqrt(abs(A)))) + sign(A) - sin(cos(tan(A))) * asin(acos(atan(A))) + sinh(cosh(tanh(A))) +
             erf(sigmoid(relu(A))) + floor(ceil(round(A))) + max(A, 2) - min(1, A) + ident(A) + (A != 2) * (A > 1) -
             (A <= 3) / (2 - A) + 1.5;
  Program p = make_program("g", {A, B}, {O.named("O"), E.named("E")});
  EXPECT_EQ(print(p), text("function g (A[N], B[D0, D1]) -> (O, E) {\n"
                           "  O = select(A < 0 && !(B >= 1) || A == B, -A * 0.25, pow(B, A) % 3) / N + cast(A, f64);\n"
                           "  E = exp(log(sqrt(abs(A)))) + sign(A) - sin(cos(tan(A))) * asin(acos(atan(A))) + "
                           "sinh(cosh(tanh(A))) + erf(sigmoid(relu(A))) + floor(ceil(round(A))) + max(A, 2) - "
                           "min(1, A) + ident(A) + (A != 2) * (A > 1) - (A <= 3) / (2 - A) + 1.5;\n"
                           "}"));
}

TEST(EdslTest, SharedElementwiseTensorsAreMaterializedOnce) {
  Tensor A = Placeholder("A", 1);
  Tensor T = A * A;  // used twice: becomes a statement
  Program p = make_program("h", {A}, {(T + T).named("O")});
  EXPECT_EQ(print(p), "function h (A[D0]) -> (O) {\n  T0 = A * A;\n  O = T0 + T0;\n}\n");
  Buffer a = Buffer::from_values(DType::f64, {2}, {3, 4});
  EXPECT_EQ(interpret(p, {{"A", a}}).at("O").to_doubles(), (std::vector<double>{18, 32}));
}

TEST(EdslTest, RepeatedDimsRequireEqualSizesAtRunTime) {
  Tensor A = Placeholder("A", 2);
  TensorDim K("K");
  A.bind_dims(K, K);
  auto O = TensorOutput(K).named("O");
  TensorIndex i;
  O(i) += A(i, i);  // the trace's diagonal
  Program p = make_program("diag", {A}, {O});
  EXPECT_EQ(print(p), "function diag (A[K, K]) -> (O) {\n  O[x0 : K] = +(A[x0, x0]);\n}\n");
  Buffer sq = testing::random_buffer({3, 3}, 1);
  EXPECT_EQ(interpret(p, {{"A", sq}}).at("O").get(1), testing::at(sq, {1, 1}));
  std::string msg = error_of([&] { interpret(p, {{"A", testing::random_buffer({3, 4}, 1)}}); });
  EXPECT_NE(msg.find("dims disagree: axis 1 of input A is 4 but K = 3"), std::string::npos) << msg;
}

TEST(EdslTest, UserErrorsNameTheObject) {
  struct Case {
    const char* needle;
    std::function<void()> body;
  };
  std::vector<Case> cases = {
      {"bind_dims on I: the tensor has rank 2 but 3 dims were given",
       [] {
         TensorDim a, b, c;
         Placeholder("I", 2).bind_dims(a, b, c);
       }},
      {"bind_dims on I: axis 0 has size N but the dim M is already bound to M",
       [] {
         TensorDim N("N"), M("M");
         Tensor I = Placeholder("I", 1), J = Placeholder("J", 1);
         J.bind_dims(M);
         I.bind_dims(N);
         I.bind_dims(M);
       }},
      {"TensorOutput O is already defined",
       [] {
         Tensor I = Placeholder("I", 1);
         TensorDim N;
         TensorIndex i;
         I.bind_dims(N);
         auto O = TensorOutput(N).named("O");
         O(i) += I(i);
         O(i) += I(i);
       }},
      {"cannot write I with a contraction",
       [] {
         Tensor I = Placeholder("I", 1);
         TensorIndex i;
         I(i) += I(i);
       }},
      {"TensorDim N is used before it is bound",
       [] {
         TensorDim N("N");
         TensorOutput(N);
       }},
      {"tensor I has rank 1 but is indexed with 2",
       [] {
         TensorIndex i, j;
         Placeholder("I", 1)(i, j);
       }},
      {"make_program f: tensor J is used but is not among the program's inputs",
       [] {
         Tensor I = Placeholder("I", 1), J = Placeholder("J", 1);
         make_program("f", {I}, {(I + J).named("O")});
       }},
      {"make_program f: TensorOutput O is never written",
       [] {
         Tensor I = Placeholder("I", 1);
         TensorDim N;
         I.bind_dims(N);
         make_program("f", {I}, {TensorOutput(N).named("O")});
       }},
      {"make_program f: two tensors are named O",
       [] {
         Tensor I = Placeholder("I", 1);
         Tensor a = (I + 1).named("O"), b = (a * 2).named("O");
         make_program("f", {I}, {b});
       }},
      {"contraction O uses two distinct TensorIndex objects named i",
       [] {
         Tensor I = Placeholder("I", 2);
         TensorDim N, M;
         TensorIndex i1("i"), i2("i");
         I.bind_dims(N, M);
         auto O = TensorOutput(N).named("O");
         O(i1) += I(i1, i2);
         make_program("f", {I}, {O});
       }},
      {"make_program f: two distinct TensorDims are named N",
       [] {
         Tensor I = Placeholder("I", 2);
         TensorDim N1("N"), N2("N");
         I.bind_dims(N1, N2);
         make_program("f", {I}, {(I * 2).named("O")});
       }},
      {"set_default on O: default tensor has rank 2, more than 1",
       [] {
         Tensor I = Placeholder("I", 2);
         TensorDim N, M;
         I.bind_dims(N, M);
         TensorOutput(N).named("O").set_default(I);
       }},
      {"add_constraint on I: only a TensorOutput holds a contraction",
       [] {
         TensorIndex i;
         TensorDim two(2);
         Placeholder("I", 1).add_constraint(i < two);
       }},
      {"Placeholder needs a name", [] { Placeholder("", 1); }},
      {"the size of axis 0 depends on run-time broadcasting",
       [] {
         Tensor A = Placeholder("A", 1), B = Placeholder("B", 1);
         TensorDim N("N"), M("M"), X;
         A.bind_dims(N);
         B.bind_dims(M);
         (A + B).bind_dims(X);
       }},
      {"index expression divided by zero",
       [] {
         TensorIndex i;
         (void)(i / 0);
       }},
  };
  for (const auto& c : cases) {
    std::string msg = error_of(c.body);
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in '" << msg << "'";
  }
}

TEST(EdslTest, BindDimsOnContractionOutputsAndBroadcasts) {
  Tensor A = Placeholder("A", 2);
  TensorDim N("N"), M("M"), X, Y, Z;
  TensorIndex i, j;
  A.bind_dims(N, M);
  auto S = TensorOutput(M, N).named("S");
  S(j, i) = A(i, j);
  S.bind_dims(X, Y);  // binds to the symbolic output shape
  Tensor E = S * 2;
  E.bind_dims(Z, Y);  // broadcasting against a scalar keeps the dims
  EXPECT_EQ(X.expr(), M.expr());
  EXPECT_EQ(Z.expr(), M.expr());
  EXPECT_EQ(Y.expr(), N.expr());
  EXPECT_NE(Y.expr(), M.expr());
}

}  // namespace
}  // namespace polytile
