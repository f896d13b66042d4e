// Autodiff against finite differences in f64 (central differences through the reference interpreter):
// every tutorial op, every intrinsic, a convolution sweep, pooling with ties, softmax, layer norm, an MLP
// with cross-entropy, product with zeros, Jacobians, heads, overrides, stop-gradient, second order,
// forward = reverse, mixed = reverse, lowering of gradient contractions, determinism and refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "polytile/autodiff.h"
#include "polytile/cse.h"
#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "polytile/passes.h"
#include "polytile/polyhedral.h"
#include "test_util.h"

namespace polytile::ad {
namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

TensorMap random_inputs(const Shapes& shapes, uint64_t seed, double lo = -1, double hi = 1) {
  TensorMap in;
  uint64_t k = 0;
  for (const auto& [name, shape] : shapes) {
    Buffer b = testing::random_buffer(shape, seed + 977 * k++);
    for (int64_t i = 0; i < b.size(); ++i) b.set(i, lo + (b.get(i) + 1) / 2 * (hi - lo));
    in[name] = b;
  }
  return in;
}

ProgramTypes types_of(const Program& p, const TensorMap& in) {
  std::map<std::string, TensorType> t;
  for (const auto& [name, b] : in) t[name] = TensorType{b.dtype(), b.shape()};
  return infer_types(p, t);
}

// sum over outputs of <head, output>
double weighted_loss(const Program& p, const TensorMap& in, const TensorMap& heads) {
  TensorMap out = interpret(p, in);
  double s = 0;
  for (const auto& o : p.outputs)
    for (int64_t e = 0; e < out.at(o).size(); ++e) s += heads.at(o).get(e) * out.at(o).get(e);
  return s;
}

struct FdOptions {
  double lo = -1, hi = 1;
  int samples = 1 << 30;  // elements checked per input
  double tol = 1e-6;
  Options ad;
};

// vjp of every output with random heads, against central differences, for every input.
void check_vjp(const std::string& text, const Shapes& shapes, const FdOptions& o = {}, uint64_t seed = 1) {
  SCOPED_TRACE(text);
  Program p = parse_program(text, "fd.tile");
  TensorMap in = random_inputs(shapes, seed, o.lo, o.hi);
  ProgramTypes types = types_of(p, in);
  TensorMap heads;
  for (const auto& out : p.outputs) heads[out] = testing::random_buffer(types.tensors.at(out).shape, seed + 31);
  Result r = vjp(p, o.ad);
  TensorMap gin = in;
  for (size_t i = 0; i < p.outputs.size(); ++i) gin[r.program.inputs[p.inputs.size() + i].name] = heads[p.outputs[i]];
  TensorMap grads = interpret(r.program, gin);
  if (o.ad.reduce_and_defract && !o.ad.overrides.size()) {
    // Translation validation of the gradient's clean-up: reduce and defract prove every rewrite at these sizes.
    Options raw_options = o.ad;
    raw_options.reduce_and_defract = false;
    Program raw = vjp(p, raw_options).program;
    ProgramTypes gtypes = types_of(raw, gin);
    ASSERT_NO_THROW(poly::reduce_and_defract(raw, poly::PassContext{&gtypes, true})) << print(raw);
    // And for every size at once where isl can express the sizes (a UserError says where it cannot).
    Options proven = o.ad;
    proven.verify = true;
    try {
      vjp(p, proven);
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("for all sizes"), std::string::npos) << e.what();
    }
  }
  std::mt19937_64 rng(seed);
  const double h = 1e-6;
  std::vector<std::string> wrt = o.ad.wrt;
  if (wrt.empty())
    for (const auto& x : p.inputs) wrt.push_back(x.name);
  for (size_t w = 0; w < wrt.size(); ++w) {
    const Buffer& g = grads.at(r.gradients[w]);
    const Buffer& x = in.at(wrt[w]);
    ASSERT_EQ(g.shape(), x.shape()) << wrt[w];
    for (int s = 0; s < std::min<int64_t>(o.samples, x.size()); ++s) {
      int64_t e = o.samples >= x.size() ? s : static_cast<int64_t>(rng() % x.size());
      TensorMap plus = in, minus = in;
      plus[wrt[w]].set(e, x.get(e) + h);
      minus[wrt[w]].set(e, x.get(e) - h);
      double fd = (weighted_loss(p, plus, heads) - weighted_loss(p, minus, heads)) / (2 * h);
      ASSERT_NEAR(g.get(e), fd, o.tol * std::max(1.0, std::fabs(fd))) << "d/d" << wrt[w] << " at flat " << e << "\n"
                                                                       << print(r.program);
    }
  }
}

// ---------------------------------------------------------------------------------------------- ops

TEST(AutodiffTest, EveryTutorialAndPostExample) {
  struct Ex {
    const char* file;
    Shapes shapes;
  };
  std::vector<Ex> examples = {
      {"sum_over_axis", {{"I", {4, 3}}}},
      {"max_over_axis", {{"I", {4, 3}}}},
      {"matmul", {{"A", {3, 4}}, {"B", {4, 2}}}},
      {"global_min", {{"I", {2, 3, 2}}}},
      {"mean_over_axis", {{"I", {4, 3}}}},
      {"global_mean", {{"I", {4, 3}}}},
      {"wrong_max_pool_1d", {{"I", {7}}}},
      {"max_pool_1d", {{"I", {7}}}},
      {"max_pool_1d_round_up", {{"I", {7}}}},
      {"skip", {{"I", {4, 5}}}},
      {"cumulative_sum", {{"I", {6}}}},
      {"conv_1d", {{"I", {2, 6, 2}}, {"K", {3, 2, 2}}}},
      {"conv_2d_dilated", {{"I", {1, 7, 8, 2}}, {"K", {2, 2, 2, 2}}}},
      {"complex_conv_2d", {{"I", {1, 6, 5, 2, 2}}, {"K", {2, 2, 2, 2, 2}}}},
      {"conv2d_strided_dilated", {{"I", {1, 9, 9, 2}}, {"K", {2, 2, 2, 3}}}},
      {"conv2d_strided_dilated_grad_input", {{"DO", {1, 3, 3, 2}}, {"K", {2, 2, 3, 2}}}},
      {"conv2d_grad_input_reduced", {{"DO", {1, 3, 3, 2}}, {"K", {2, 2, 3, 2}}}},
      {"conv2d_grad_input_defracted", {{"DO", {1, 3, 3, 2}}, {"K", {2, 2, 3, 2}}}},
  };
  for (const auto& ex : examples) {
    SCOPED_TRACE(ex.file);
    std::ifstream f(std::string(POLYTILE_SOURCE_DIR "/examples/") + ex.file + ".tile");
    std::stringstream ss;
    ss << f.rdbuf();
    FdOptions o;
    o.samples = 12;
    check_vjp(ss.str(), ex.shapes, o);
  }
}

TEST(AutodiffTest, EveryElementwiseIntrinsicAndOperator) {
  const char* unary[] = {"exp(A)",  "log(A)",   "sqrt(A)",  "sin(A)",     "cos(A)",   "tan(A)",   "asin(A)",
                         "acos(A)", "atan(A)",  "sinh(A)",  "cosh(A)",    "tanh(A)",  "erf(A)",   "sigmoid(A)",
                         "abs(A - 0.6)", "relu(A - 0.6)", "-A", "ident(A)", "cast(A, f64) * 2", "A * A * A",
                         "1 / A",   "A / 3",    "floor(A) + A", "ceil(A) * A", "round(A) + sign(A - 0.6) + A",
                         "(A > 0.5) * A", "select(A < 0.6, A * A, 2 * A)"};
  for (const char* f : unary) {
    std::string text = std::string("function (A[N]) -> (O) { O = ") + f + "; }";
    FdOptions o;
    o.lo = 0.1;
    o.hi = 0.9;
    check_vjp(text, {{"A", {7}}}, o);
  }
  const char* binary[] = {"A + B", "A - B", "A * B", "A / B", "pow(A, B)", "max(A, B)", "min(A, B)", "A % B",
                          "pow(A, 2) + pow(2, B)", "select(A < B, A, B * B)", "A * B + A / B - B"};
  for (const char* f : binary) {
    std::string text = std::string("function (A[N], B[N]) -> (O) { O = ") + f + "; }";
    FdOptions o;
    o.lo = 0.2;
    o.hi = 1.7;
    check_vjp(text, {{"A", {6}}, {"B", {6}}}, o);
  }
  // Broadcasting: the adjoint of a broadcast operand is summed over the broadcast dims.
  check_vjp("function (A[N, M], B[P], C[N, K], S[]) -> (O) { O = A * B + S - exp(C); }",
            {{"A", {3, 1}}, {"B", {4}}, {"C", {3, 1}}, {"S", {}}});
  check_vjp("function (A[N, M], B[X, M]) -> (O) { O = A * B; }", {{"A", {3, 4}}, {"B", {1, 4}}});
}

// An elementwise statement's adjoint for each tensor it reads is the head times that tensor's derivative,
// taken in forward mode through the expression: the head is multiplied once per tensor, and the occurrences
// of a tensor share their chain rule. The GELU's X appears five times; its gradient reads DY once (pushing
// DY down the tree multiplied it by each occurrence's path, five products by DY and 16 multiplications an
// element where 13 do now). A mask on either side of a product stays a select: relu(A) * B's adjoint of A
// is 0 where A <= 0 even where B is infinite, not 0 * inf.
TEST(AutodiffTest, ElementwiseAdjointsMultiplyTheHeadOncePerTensor) {
  const char* gelu = "function (X[N, C]) -> (Y) { Y = 0.5 * X * (1.0 + tanh(0.7978845608 * (X + 0.044715 * X * X * X))); }";
  check_vjp(gelu, {{"X", {5, 7}}});
  const std::string g = print(vjp(parse_program(gelu)).program);
  size_t heads = 0;
  for (size_t at = g.find("DY"); at != std::string::npos; at = g.find("DY", at + 1)) ++heads;
  EXPECT_EQ(heads, 2u) << g;  // the parameter and one product
  const char* masked = "function (A[N], B[N]) -> (O) { O = relu(A) * B; }";
  check_vjp(masked, {{"A", {6}}, {"B", {6}}});
  Result r = vjp(parse_program(masked));
  TensorMap in{{"A", Buffer::from_values(DType::f64, {3}, {-1.0, 2.0, -3.0})},
               {"B", Buffer::from_values(DType::f64, {3}, {INFINITY, 1.5, 1.0})},
               {"DO", Buffer::from_values(DType::f64, {3}, {1.0, 1.0, 1.0})}};
  ASSERT_EQ(r.program.inputs.back().name, "DO") << print(r.program);
  const Buffer da = interpret(r.program, in).at(r.gradients[0]);
  EXPECT_EQ(da.get(0), 0.0) << print(r.program);
  EXPECT_EQ(da.get(1), 1.5);
  EXPECT_EQ(da.get(2), 0.0);
}

TEST(AutodiffTest, ComparisonsAndRoundingHaveZeroDerivative) {
  Program p = parse_program("function (A[N]) -> (O) { O = floor(A) + (A > 0) + sign(A) + round(A); }");
  Result r = vjp(p);
  TensorMap in = random_inputs({{"A", {5}}}, 3);
  in["DO"] = testing::random_buffer({5}, 4);
  Buffer g = interpret(r.program, in).at(r.gradients[0]);
  for (int64_t i = 0; i < g.size(); ++i) EXPECT_EQ(g.get(i), 0.0);
}

std::string conv_text(int dims, int64_t stride, int64_t dil, bool same, bool grouped) {
  std::string in = "n", k, o = "n", in_dims = "N", k_dims, o_dims = "N";
  for (int d = 0; d < dims; ++d) {
    std::string x = "x" + std::to_string(d), kk = "k" + std::to_string(d), X = "X" + std::to_string(d),
                K = "K" + std::to_string(d);
    int64_t pad = same ? dil : 0;  // "same" padding of a size-3 kernel
    in += ", " + std::to_string(stride) + "*" + x + " + " + std::to_string(dil) + "*" + kk + (pad ? " - " + std::to_string(pad) : "");
    k += (d ? ", " : "") + kk;
    o += ", " + x;
    in_dims += ", " + X;
    k_dims += (d ? ", " : "") + K;
    o_dims += ", " + (same ? "(" + X + " + " + std::to_string(stride - 1) + ")/" + std::to_string(stride)
                           : "(" + X + " - " + std::to_string(dil) + "*(" + K + " - 1) - 1)/" + std::to_string(stride) + " + 1");
  }
  if (grouped) {
    in += ", g";
    k += ", g";
    o += ", g";
    in_dims += ", G";
    k_dims += ", G";
    o_dims += ", G";
  }
  return "function (I[" + in_dims + ", CI], K[" + k_dims + ", CI, CO]) -> (O) {\n  O[" + o + ", co : " + o_dims +
         ", CO] = +(I[" + in + ", ci] * K[" + k + ", ci, co]);\n}\n";
}

TEST(AutodiffTest, ConvolutionSweep) {
  int cases = 0;
  for (int dims = 1; dims <= 3; ++dims)
    for (int64_t stride = 1; stride <= 3; ++stride)
      for (int64_t dil = 1; dil <= 3; ++dil)
        for (bool same : {false, true})
          for (bool grouped : {false, true}) {
            std::vector<int64_t> ishape{1}, kshape;
            int64_t size = dims == 3 ? 2 * dil + 2 : 2 * dil + 3;
            for (int d = 0; d < dims; ++d) {
              ishape.push_back(size);
              kshape.push_back(3);
            }
            if (grouped) {
              ishape.push_back(2);
              kshape.push_back(2);
            }
            ishape.push_back(2);
            kshape.push_back(2);
            kshape.push_back(2);
            FdOptions o;
            o.samples = 6;
            check_vjp(conv_text(dims, stride, dil, same, grouped), {{"I", ishape}, {"K", kshape}}, o, 100 + cases);
            ++cases;
          }
  EXPECT_EQ(cases, 108);
}

TEST(AutodiffTest, TransposedConvolutionAndSevenDimensions) {
  check_vjp("function (I[X, C], K[KX, C, D]) -> (O) { O[2*x + k, d : 2*X + 1, D] = +(I[x, c] * K[k, c, d]); }",
            {{"I", {4, 2}}, {"K", {3, 2, 2}}});
  FdOptions o;
  o.samples = 10;
  check_vjp("function (A[N1, N2, N3, N4, N5, N6, N7], B[N7, N3]) -> (O) {"
            "  O[a, b, c, d, e, f : N1, N2, N3, N4, N5, N6] = +(A[a, b, c, d, e, f, g] * B[g, c]); }",
            {{"A", {2, 1, 2, 2, 1, 2, 3}}, {"B", {3, 2}}}, o);
}

TEST(AutodiffTest, PoolingIncludingOverlappingWindowsAndTies) {
  check_vjp("function (I[N, C]) -> (O) { O[i, c : N - 2, C] = >(I[i + j, c]), j < 3; }", {{"I", {7, 2}}});
  check_vjp("function (I[N, C]) -> (O) { S[i, c : N/2, C] = +(I[2*i + j, c]), j < 2; O = S / 2; }", {{"I", {7, 2}}});
  check_vjp("function (I[N]) -> (O) { O[i : N - 2] = <(I[i + j]), j < 3; }", {{"I", {8}}});
  // Ties share the adjoint equally (as JAX does): max(1, 3, 3, 2) sends 1/2 to each 3.
  Program p = parse_program("function (I[N]) -> (O) { O[] = >(I[i]); }");
  Result r = vjp(p);
  TensorMap in{{"I", Buffer::from_values(DType::f64, {4}, {1, 3, 3, 2})}, {"DO", Buffer::from_values(DType::f64, {}, {2})}};
  EXPECT_EQ(interpret(r.program, in).at("DI").to_doubles(), (std::vector<double>{0, 1, 1, 0}));
  // A max with a default tensor: the adjoint goes to whichever of the default and the elements wins.
  check_vjp("function (I[N, M], D[N]) -> (O) { O[i : N] = >(I[i, j]) default D; }", {{"I", {3, 4}}, {"D", {3}}});
  check_vjp("function (I[N, M], D[N]) -> (O) { O[i : N] = +(I[i, j]) default D; }", {{"I", {3, 4}}, {"D", {3}}});
  check_vjp("function (I[N], D[]) -> (O) { O[2*i : N] = =(I[2*i]) default D; }", {{"I", {5}}, {"D", {}}});
}

TEST(AutodiffTest, ProductAggregationWithZeros) {
  Program p = parse_program("function (A[N, M]) -> (O) { O[i : N] = *(A[i, j]); }");
  Result r = vjp(p);
  // Row 0: no zero; row 1: exactly one zero; row 2: two zeros.
  Buffer a = Buffer::from_values(DType::f64, {3, 3}, {2, 3, 5, 2, 0, 5, 0, 3, 0});
  TensorMap in{{"A", a}, {"DO", Buffer::from_values(DType::f64, {3}, {1, 1, 1})}};
  EXPECT_EQ(interpret(r.program, in).at("DA").to_doubles(), (std::vector<double>{15, 10, 6, 0, 10, 0, 0, 0, 0}));
  check_vjp("function (A[N, M]) -> (O) { O[i : N] = *(A[i, j]); }", {{"A", {3, 4}}});
}

const char* kSoftmax =
    "function (X[N, C]) -> (O) {\n"
    "  M[i, 0 : N, 1] = >(X[i, j]);\n"
    "  E = exp(X - M);\n"
    "  S[i, 0 : N, 1] = +(E[i, j]);\n"
    "  O = E / S;\n"
    "}\n";
const char* kLayerNorm =
    "function (X[N, C], G[C], B[C]) -> (O) {\n"
    "  S[i, 0 : N, 1] = +(X[i, j]);\n"
    "  D = X - S / C;\n"
    "  D2 = D * D;\n"
    "  V[i, 0 : N, 1] = +(D2[i, j]);\n"
    "  O = D / sqrt(V / C + 0.00001) * G + B;\n"
    "}\n";
const char* kMlp =
    "function (X[N, D], W1[D, H], B1[H], W2[H, K], B2[K], Y[N, K]) -> (L) {\n"
    "  Z1[n, h : N, H] = +(X[n, d] * W1[d, h]);\n"
    "  A1 = tanh(Z1 + B1);\n"
    "  Z2[n, k : N, K] = +(A1[n, h] * W2[h, k]);\n"
    "  Z = Z2 + B2;\n"
    "  M[n, 0 : N, 1] = >(Z[n, k]);\n"
    "  E = exp(Z - M);\n"
    "  S[n, 0 : N, 1] = +(E[n, k]);\n"
    "  LP = Z - M - log(S);\n"
    "  T[] = +(Y[n, k] * LP[n, k]);\n"
    "  L = -T / N;\n"
    "}\n";
const Shapes kMlpShapes = {{"X", {4, 3}}, {"W1", {3, 5}}, {"B1", {5}}, {"W2", {5, 3}}, {"B2", {3}}, {"Y", {4, 3}}};

TEST(AutodiffTest, SoftmaxLogSoftmaxLogsumexpLayerNorm) {
  check_vjp(kSoftmax, {{"X", {3, 4}}});
  check_vjp("function (X[N, C]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n  E = exp(X - M);\n"
            "  S[i, 0 : N, 1] = +(E[i, j]);\n  O = X - M - log(S);\n}\n",
            {{"X", {3, 4}}});
  check_vjp("function (X[N, C]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n  E = exp(X - M);\n"
            "  S[i, 0 : N, 1] = +(E[i, j]);\n  O = M + log(S);\n}\n",
            {{"X", {3, 4}}});
  check_vjp(kLayerNorm, {{"X", {3, 4}}, {"G", {4}}, {"B", {4}}});
}

TEST(AutodiffTest, MlpWithCrossEntropyThroughTheGradientApi) {
  check_vjp(kMlp, kMlpShapes);
  // gradient(): the scalar loss needs no head.
  Program p = parse_program(kMlp);
  Result g = gradient(p);
  ASSERT_EQ(g.gradients.size(), 6u);
  EXPECT_EQ(g.program.inputs.size(), p.inputs.size());
  TensorMap in = random_inputs(kMlpShapes, 5);
  TensorMap grads = interpret(g.program, in);
  const double h = 1e-6;
  Buffer w1 = in.at("W1");
  for (int64_t e = 0; e < w1.size(); ++e) {
    TensorMap plus = in, minus = in;
    plus["W1"].set(e, w1.get(e) + h);
    minus["W1"].set(e, w1.get(e) - h);
    double fd = (interpret(p, plus).at("L").get(0) - interpret(p, minus).at("L").get(0)) / (2 * h);
    EXPECT_NEAR(grads.at("DW1").get(e), fd, 1e-7);
  }
}

TEST(AutodiffTest, CumulativeSumSkipAndConstantIndices) {
  check_vjp("function (I[N]) -> (O) { O[i : N] = +(I[k]), i - k < N; }", {{"I", {6}}});
  check_vjp("function (I[M, N]) -> (O) { O[2*i : N] = +(I[2*i, j]); }", {{"I", {4, 5}}});
  check_vjp("function (I[N]) -> (O) { O[i, 1 : N, 3] = =(I[i]); }", {{"I", {4}}});
  check_vjp("function (A[N], B[N], C[N]) -> (O) { O[i : N] = +(A[i] == B[j] ? C[j]); }", {{"A", {4}}, {"B", {4}}, {"C", {4}}});
  check_vjp("function (A[N], B[M]) -> (O) { O[i : N] = +(A[i] + B[j]); }", {{"A", {3}}, {"B", {4}}});
  check_vjp("function (A[N], B[M]) -> (O) { O[i : 2*N] = +(A[(i + j)/2] + B[j]), j < 2; }", {{"A", {3}}, {"B", {4}}});
  // A constant index decides the validity of every point: C[5] is out of bounds, so O is all zeros and so
  // is its gradient; C[1] is in bounds.
  check_vjp("function (C[2], E[M]) -> (O) { O[i : M] = +(C[5] + E[i]); }", {{"C", {2}}, {"E", {3}}});
  check_vjp("function (C[2], E[M]) -> (O) { O[i : M] = +(C[1] + E[i]); }", {{"C", {2}}, {"E", {3}}});
  check_vjp("function (C[2], E[M]) -> (O) { O[i : M] = +(E[i] * C[5]); }", {{"C", {2}}, {"E", {3}}});
}

// ---------------------------------------------------------------------------------------------- API

TEST(AutodiffTest, FullJacobianMatchesFiniteDifferences) {
  Program p = parse_program("function (A[N], B[N, M]) -> (O) { T[i : M] = +(A[j] * B[j, i]); O = tanh(T) * 2; }");
  Result r = differentiate(p, "O");
  TensorMap in = random_inputs({{"A", {3}}, {"B", {3, 2}}}, 9);
  TensorMap jac = interpret(r.program, in);
  const Buffer& ja = jac.at(r.gradients[0]);
  ASSERT_EQ(ja.shape(), (std::vector<int64_t>{2, 3}));  // shape(O) + shape(A)
  const double h = 1e-6;
  for (int64_t e = 0; e < 3; ++e) {
    TensorMap plus = in, minus = in;
    plus["A"].set(e, in.at("A").get(e) + h);
    minus["A"].set(e, in.at("A").get(e) - h);
    Buffer op = interpret(p, plus).at("O"), om = interpret(p, minus).at("O");
    for (int64_t o = 0; o < 2; ++o) EXPECT_NEAR(testing::at(ja, {o, e}), (op.get(o) - om.get(o)) / (2 * h), 1e-7);
  }
  EXPECT_EQ(jac.at(r.gradients[1]).shape(), (std::vector<int64_t>{2, 3, 2}));
}

TEST(AutodiffTest, HeadWithPrefixDimsAndAllAdjoints) {
  Program p = parse_program("function (A[N], B[N]) -> (O) { T = A * B; O = exp(T); }");
  Options o;
  o.all_adjoints = true;
  Result r = differentiate(p, "O", o, 1);
  // H has a new leading dim: results are H (2 x N) times the Jacobian (N x N).
  TensorMap in = random_inputs({{"A", {3}}, {"B", {3}}}, 2);
  in[r.program.inputs.back().name] = testing::random_buffer({2, 3}, 7);
  TensorMap out = interpret(r.program, in);
  const Buffer& da = out.at(r.gradients[0]);
  ASSERT_EQ(da.shape(), (std::vector<int64_t>{2, 3}));
  const Buffer& hd = in.at(r.program.inputs.back().name);
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t i = 0; i < 3; ++i) {
      double a = in.at("A").get(i), b = in.at("B").get(i);
      EXPECT_NEAR(testing::at(da, {k, i}), testing::at(hd, {k, i}) * std::exp(a * b) * b, 1e-12);
    }
  ASSERT_TRUE(r.adjoints.count("T"));
  const Buffer& dt = out.at(r.adjoints.at("T"));
  EXPECT_NEAR(testing::at(dt, {1, 2}), testing::at(hd, {1, 2}) * std::exp(in.at("A").get(2) * in.at("B").get(2)), 1e-12);
}

TEST(AutodiffTest, OverridesHooksAndStopGradient) {
  Program p = parse_program("function (X[N]) -> (L) { Y = X * X; Z = Y + X; L[] = +(Z[i]); }");
  TensorMap in = random_inputs({{"X", {4}}}, 4);
  auto dx = [&](const Options& o) { return interpret(gradient(p, o).program, in).at("DX"); };
  // Plain: dL/dX = 2X + 1.
  Buffer plain = dx({});
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(plain.get(i), 2 * in.at("X").get(i) + 1, 1e-12);
  // Stop-gradient at Y: only the direct path remains.
  Options stop;
  stop.stop_gradient = {"Y"};
  for (double v : dx(stop).to_doubles()) EXPECT_EQ(v, 1.0);
  // Override Y's derivative (on purpose 3X instead of 2X), written as Tile text.
  Options ov;
  ov.overrides["Y"] = Override{{"X"}, [](DerivativeContext& ctx) {
                                 std::string name = ctx.fresh("DYX");
                                 ctx.emit(name + " = " + ctx.head() + " * 3 * X;");
                                 return std::vector<std::string>{name};
                               }};
  Buffer custom = dx(ov);
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(custom.get(i), 3 * in.at("X").get(i) + 1, 1e-12);
  // A per-op hook: elementwise statements get doubled adjoints, contractions use the built-in rule.
  Options hook;
  hook.hook = [](const Statement& st, DerivativeContext& ctx) -> std::optional<std::map<std::string, std::string>> {
    const auto* e = std::get_if<Elementwise>(&st);
    if (!e || e->output != "Z") return std::nullopt;
    std::string a = ctx.fresh("HY"), b = ctx.fresh("HX");
    ctx.emit(a + " = 2 * " + ctx.head() + ";\n" + b + " = 2 * " + ctx.head() + ";");
    return std::map<std::string, std::string>{{"Y", a}, {"X", b}};
  };
  Buffer hooked = dx(hook);
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(hooked.get(i), 2 * (2 * in.at("X").get(i) + 1), 1e-12);
  // An override with the wrong number of adjoints, and text that does not parse, are user errors.
  Options bad;
  bad.overrides["Y"] = Override{{"X"}, [](DerivativeContext&) { return std::vector<std::string>{}; }};
  EXPECT_THROW(gradient(p, bad), UserError);
  Options bad_text;
  bad_text.overrides["Y"] = Override{{"X"}, [](DerivativeContext& ctx) {
                                       ctx.emit("Q = ;");
                                       return std::vector<std::string>{"Q"};
                                     }};
  EXPECT_THROW(gradient(p, bad_text), UserError);
}

TEST(AutodiffTest, SecondOrderHessianVectorProductOfTheMlp) {
  Program p = parse_program(kMlp);
  Options o;
  o.wrt = {"W1"};
  Program g = gradient(p, o).program;  // (inputs) -> (DW1)
  Result hv = vjp(g);                  // (inputs, DDW1) -> (D<input>...): H v for head v
  TensorMap in = random_inputs(kMlpShapes, 6);
  Buffer v = testing::random_buffer({3, 5}, 8);
  TensorMap hin = in;
  hin[hv.program.inputs.back().name] = v;
  TensorMap out = interpret(hv.program, hin);
  size_t w1 = 1;  // W1 is the second input
  const Buffer& hvw = out.at(hv.gradients[w1]);
  const double h = 1e-5;
  TensorMap plus = in, minus = in;
  for (int64_t e = 0; e < v.size(); ++e) {
    plus["W1"].set(e, in.at("W1").get(e) + h * v.get(e));
    minus["W1"].set(e, in.at("W1").get(e) - h * v.get(e));
  }
  Buffer gp = interpret(g, plus).at("DW1"), gm = interpret(g, minus).at("DW1");
  for (int64_t e = 0; e < v.size(); ++e) EXPECT_NEAR(hvw.get(e), (gp.get(e) - gm.get(e)) / (2 * h), 1e-6) << e;
}

double dot(const Buffer& a, const Buffer& b) {
  double s = 0;
  for (int64_t i = 0; i < a.size(); ++i) s += a.get(i) * b.get(i);
  return s;
}

// <jvp(t), u> == <t, vjp(u)>, and mixed mode == plain reverse mode, on a set of programs.
TEST(AutodiffTest, ForwardEqualsReverseAndMixedEqualsReverse) {
  std::vector<std::pair<std::string, Shapes>> programs = {
      {kSoftmax, {{"X", {3, 4}}}},
      {kLayerNorm, {{"X", {3, 4}}, {"G", {4}}, {"B", {4}}}},
      {kMlp, kMlpShapes},
      {conv_text(2, 2, 2, true, true), {{"I", {1, 6, 6, 2, 2}}, {"K", {3, 3, 2, 2, 2}}}},
      {"function (A[N, M]) -> (O) { O[i : N] = *(A[i, j]); }", {{"A", {3, 4}}}},
      {"function (I[N], D[]) -> (O) { O[i : N - 2] = <(I[i + j]), j < 3; P = O * D; }", {{"I", {8}}, {"D", {}}}},
      {"function (A[N], B[M]) -> (O) { O[i : N] = +(A[i] + B[j]), j < 2; }", {{"A", {3}}, {"B", {4}}}},
      {"function (I[N, M], D[N]) -> (O) { O[i : N] = >(I[i, j]) default D; }", {{"I", {3, 4}}, {"D", {3}}}},
      {"function (A[N], S[]) -> (O) { O = sin(A) * S + pow(A, 2); }", {{"A", {5}}, {"S", {}}}},
      // An output read by a later statement, and a broadcast scalar operand.
      {"function (A[N]) -> (P, O) { O = A * 2.0; P = O; }", {{"A", {4}}}},
      {"function (A[N], B[]) -> (O) { O = A + B; }", {{"A", {4}}, {"B", {}}}},
      {"function (A[N], B[]) -> (O, Q) { O = A - B; Q = B * 3.0; }", {{"A", {4}}, {"B", {}}}},
  };
  int k = 0;
  for (const auto& [text, shapes] : programs) {
    SCOPED_TRACE(text);
    Program p = parse_program(text);
    TensorMap in = random_inputs(shapes, 40 + k++);
    ProgramTypes types = types_of(p, in);
    Result fwd = jvp(p), rev = vjp(p);
    Options mixed_options;
    mixed_options.mixed_mode = true;
    Result mixed = vjp(p, mixed_options);
    TensorMap fin = in, rin = in;
    double t_dot_vjp = 0, jvp_dot_u = 0;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      Buffer t = testing::random_buffer(in.at(p.inputs[i].name).shape(), 70 + i);
      fin[fwd.program.inputs[p.inputs.size() + i].name] = t;
    }
    for (size_t o = 0; o < p.outputs.size(); ++o)
      rin[rev.program.inputs[p.inputs.size() + o].name] = testing::random_buffer(types.tensors.at(p.outputs[o]).shape, 90 + o);
    TensorMap fout = interpret(fwd.program, fin), rout = interpret(rev.program, rin), mout = interpret(mixed.program, rin);
    for (size_t o = 0; o < p.outputs.size(); ++o)
      jvp_dot_u += dot(fout.at(fwd.gradients[o]), rin.at(rev.program.inputs[p.inputs.size() + o].name));
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      t_dot_vjp += dot(fin.at(fwd.program.inputs[p.inputs.size() + i].name), rout.at(rev.gradients[i]));
      testing::expect_near_buffers(mout.at(mixed.gradients[i]), rout.at(rev.gradients[i]), 1e-12, "mixed vs reverse");
    }
    EXPECT_NEAR(jvp_dot_u, t_dot_vjp, 1e-10 * std::max(1.0, std::fabs(t_dot_vjp)));
  }
}

TEST(AutodiffTest, MixedModeHoldsPartialsFromTheForwardPass) {
  Options o;
  o.mixed_mode = true;
  Program p = parse_program("function (A[N], B[N]) -> (O) { O = sin(A) * B; }");
  std::string text = print(vjp(p, o).program);
  EXPECT_NE(text.find("PO_A = cos(A) * B;"), std::string::npos) << text;
  EXPECT_NE(text.find("PO_B = sin(A);"), std::string::npos) << text;
  EXPECT_NE(text.find("DA = DO * PO_A;"), std::string::npos) << text;
}

TEST(AutodiffTest, GradientContractionsAreReducedDefractedAndWrittenOnce) {
  std::vector<std::pair<std::string, Shapes>> programs = {
      {print(parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile")), {{"I", {1, 9, 9, 2}}, {"K", {2, 2, 2, 3}}}},
      {conv_text(2, 3, 2, true, false), {{"I", {1, 7, 7, 2}}, {"K", {3, 3, 2, 2}}}},
      {"function (I[N]) -> (O) { O[i : N/2] = >(I[2*i + j]), j < 2; }", {{"I", {9}}}},
      {"function (I[X, C], K[KX, C, D]) -> (O) { O[2*x + k, d : 2*X + 1, D] = +(I[x, c] * K[k, c, d]); }",
       {{"I", {4, 2}}, {"K", {3, 2, 2}}}},
  };
  for (const auto& [text, shapes] : programs) {
    SCOPED_TRACE(text);
    Program p = parse_program(text);
    Result r = vjp(p);
    TensorMap in = random_inputs(shapes, 3);
    ProgramTypes ft = types_of(p, in);
    for (size_t o = 0; o < p.outputs.size(); ++o) in[r.program.inputs[p.inputs.size() + o].name] = Buffer(DType::f64, ft.tensors.at(p.outputs[o]).shape);
    ProgramTypes types = types_of(r.program, in);
    for (const auto& st : r.program.statements) {
      const auto* c = std::get_if<Contraction>(&st);
      if (!c) continue;
      EXPECT_FALSE(poly::reduce(*c).changed && poly::defract(*c).changed) << print(st);
      for (const auto& a : c->inputs)
        for (const auto& ix : a.indices)
          for (const auto& [v, coeff] : ix.index_terms()) EXPECT_TRUE(coeff.is_integer()) << print(st);
      EXPECT_TRUE(poly::writes_each_output_once(*c, types) || c->aggregation != AggregationOp::sum ||
                  std::any_of(c->output_indices.begin(), c->output_indices.end(),
                              [](const Polynomial& q) { return q.index_terms().empty(); }))
          << print(st);
    }
  }
}

// Gradients compute nothing twice: CSE finds nothing left to merge in them, and the layer-norm gradient
// takes its square root once (it read sqrt(V / C + eps) five times).
TEST(AutodiffTest, GradientsComputeNothingTwice) {
  for (const char* text : {kLayerNorm, kSoftmax, kMlp}) {
    Program g = vjp(parse_program(text)).program;
    EXPECT_EQ(print(eliminate_common_subexpressions(g)), print(g)) << text;
  }
  std::string ln = print(vjp(parse_program(kLayerNorm)).program);
  size_t roots = 0;
  for (size_t at = ln.find("sqrt("); at != std::string::npos; at = ln.find("sqrt(", at + 1)) ++roots;
  EXPECT_EQ(roots, 1u) << ln;
  EXPECT_EQ(ln.find("DD2 * D + DD2 * D"), std::string::npos) << ln;
}

// ------------------------------------------------------------------------------------ adjoints proven zero

// The largest magnitude in a buffer.
double largest(const Buffer& b) {
  double m = 0;
  for (int64_t e = 0; e < b.size(); ++e) m = std::max(m, std::fabs(b.get(e)));
  return m;
}

// What the proof of zero adjoints (Options::prove_zero_adjoints) is checked against: the gradient as the
// rules write it, every adjoint an output, at random inputs. Each tensor proven zero must have an adjoint
// there that is zero up to rounding, and the gradients with and without the proof must agree.
struct ZeroAdjointCheck {
  std::vector<std::string> proven;     // what the proof found
  std::map<std::string, double> size;  // as written: the largest magnitude of each tensor's adjoint
  double scale = 1;                    // 1 + the largest magnitude of any adjoint as written
};

ZeroAdjointCheck check_zero_adjoints(const std::string& text, const Shapes& shapes, uint64_t seed, Options o = {}) {
  Program p = parse_program(text, "zero.tile");
  TensorMap in = random_inputs(shapes, seed);
  ProgramTypes types = types_of(p, in);
  Result pruned = vjp(p, o);
  Options written_options = o;
  written_options.prove_zero_adjoints = false;
  written_options.all_adjoints = true;
  Result written = vjp(p, written_options);
  TensorMap gin = in;
  for (size_t i = 0; i < p.outputs.size(); ++i)
    gin[pruned.program.inputs[p.inputs.size() + i].name] = testing::random_buffer(types.tensors.at(p.outputs[i]).shape, seed + 31 + i);
  TensorMap a = interpret(pruned.program, gin), b = interpret(written.program, gin);
  ZeroAdjointCheck r;
  r.proven = pruned.zero_adjoints;
  for (const auto& [tensor, adjoint] : written.adjoints) {
    r.size[tensor] = largest(b.count(adjoint) ? b.at(adjoint) : gin.at(adjoint));  // a head is an input
    r.scale = std::max(r.scale, 1 + r.size[tensor]);
  }
  for (const auto& z : r.proven) {  // no adjoint as written: nothing reached it, so it is zero too
    EXPECT_LE(r.size[z], 1e-12 * r.scale) << "the adjoint of " << z << " is proven zero but computes to " << r.size[z] << "\n"
                                          << text;
  }
  for (size_t w = 0; w < pruned.gradients.size(); ++w) {
    const Buffer &x = a.at(pruned.gradients[w]), &y = b.at(written.gradients[w]);
    for (int64_t e = 0; e < x.size(); ++e)
      EXPECT_NEAR(x.get(e), y.get(e), 1e-12 * r.scale) << pruned.gradients[w] << " at " << e << "\n" << text;
  }
  return r;
}

const char* kRowMax = "function (X[N, C]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n";

// Softmax's row maxima are subtracted and cancel: the outputs do not depend on them, and their adjoint
// (a reduction, a comparison per element and a scatter to the maxima's arguments) is left out.
TEST(AutodiffTest, AdjointsProvenZeroAreLeftOut) {
  const Shapes x = {{"X", {3, 5}}};
  const std::string softmax_tail = "  E = exp(X - M);\n  S[i, 0 : N, 1] = +(E[i, j]);\n";
  const std::vector<std::pair<std::string, std::string>> proven = {
      {"softmax", kSoftmax},
      {"log-softmax", std::string(kRowMax) + softmax_tail + "  O = X - M - log(S);\n}\n"},
      {"logsumexp", std::string(kRowMax) + softmax_tail + "  O = M + log(S);\n}\n"},
      // Literal factors, a square root, abs, relu, max, select on an unmoved condition, and sign and
      // comparisons (derivative zero): each keeps the factor exp(-M / 2) that the normalization divides out.
      {"scaled", std::string(kRowMax) +
                     "  E = sqrt(exp(2 * (X - M) / 2));\n  S[i, 0 : N, 1] = +(E[i, j]);\n  R = relu(E - 0.5 * E) / S;\n"
                     "  O = select(X > 0, R, abs(-E) / S) + sign(E) + (E > 0) + max(E, R * S) / S;\n}\n"},
      // What the proof cannot follow (tanh of a shift) is stopped by a comparison, as its adjoint is.
      {"stopped by a comparison", std::string(kRowMax) + softmax_tail + "  T = tanh(X - M);\n  O = E / S + (T > 0.5);\n}\n"},
  };
  auto expected = [](const std::string& name) {
    return name == "stopped by a comparison" ? std::vector<std::string>{"M", "T"} : std::vector<std::string>{"M"};
  };
  for (const auto& [name, text] : proven) {
    SCOPED_TRACE(name);
    ZeroAdjointCheck c = check_zero_adjoints(text, x, 3);
    EXPECT_EQ(c.proven, expected(name));
    std::string g = print(vjp(parse_program(text)).program);
    EXPECT_EQ(g.find("== M["), std::string::npos) << g;  // the maxima's scatter is gone
    Options written;
    written.prove_zero_adjoints = false;
    EXPECT_NE(print(vjp(parse_program(text), written).program).find("== M["), std::string::npos);
    check_vjp(text, x);  // and against finite differences
  }
  // The MLP's cross-entropy, through gradient(); all_adjoints gives the proven ones as zeros.
  Options all;
  all.all_adjoints = true;
  Result mlp = gradient(parse_program(kMlp), all);
  EXPECT_EQ(mlp.zero_adjoints, std::vector<std::string>{"M"});
  TensorMap out = interpret(mlp.program, random_inputs(kMlpShapes, 4));
  ASSERT_TRUE(mlp.adjoints.count("M"));
  EXPECT_EQ(largest(out.at(mlp.adjoints.at("M"))), 0.0);
  EXPECT_EQ(check_zero_adjoints(kMlp, kMlpShapes, 5).proven, std::vector<std::string>{"M"});

  // Where the outputs do depend on the maxima, nothing is left out (their adjoint as written is far from
  // zero), and where the proof cannot follow a perturbation (a shift through a sum), it leaves it in.
  const std::vector<std::pair<std::string, std::string>> kept = {
      {"unnormalized", std::string(kRowMax) + "  O = exp(X - M);\n}\n"},
      {"shift over scale", std::string(kRowMax) + softmax_tail + "  O = (X - M) / S;\n}\n"},
      {"normalized over the other axis", std::string(kRowMax) + "  E = exp(X - M);\n  S[0, j : 1, C] = +(E[i, j]);\n  O = E / S;\n}\n"},
      {"shift and scale added", std::string(kRowMax) + softmax_tail + "  O = E / S + M;\n}\n"},
      {"shift through relu", std::string(kRowMax) + "  O = relu(X - M) + M;\n}\n"},
      {"shift through a sum", std::string(kRowMax) + "  D = X - M;\n  S[i, 0 : N, 1] = +(D[i, j]);\n  O = D - S;\n}\n"},
      {"power of the factor", std::string(kRowMax) + softmax_tail + "  O = E / sqrt(S);\n}\n"},
      {"sum with a default", "function (X[N, C], D[N, 1]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n" + softmax_tail +
                                 "  T[i, 0 : N, 1] = +(E[i, j]) default D;\n  O = E / T;\n}\n"},
  };
  for (const auto& [name, text] : kept) {
    SCOPED_TRACE(name);
    const Shapes shapes = name == "sum with a default" ? Shapes{{"X", {3, 5}}, {"D", {3, 1}}} : x;
    ZeroAdjointCheck c = check_zero_adjoints(text, shapes, 7);
    EXPECT_TRUE(c.proven.empty());
    EXPECT_GT(c.size["M"], 1e-3) << "not a case whose maxima matter";
  }
  // Centering by the row mean is shift-invariant too, but the proof does not follow shifts through sums.
  ZeroAdjointCheck centered = check_zero_adjoints(
      std::string(kRowMax) + "  D = X - M;\n  S[i, 0 : N, 1] = +(D[i, j]);\n  O = D - S / 5;\n}\n", x, 7);
  EXPECT_TRUE(centered.proven.empty());

  // The user's derivatives win: with the maxima (or the normalizer) a constant, an override reading them,
  // or a hook, nothing is proven.
  Options stop;
  stop.stop_gradient = {"S"};
  EXPECT_TRUE(check_zero_adjoints(kSoftmax, x, 8, stop).proven.empty());
  Options ov;
  ov.overrides["E"] = Override{{"X", "M"}, [](DerivativeContext& ctx) {
                                 std::string dx = ctx.fresh("DEX"), dm = ctx.fresh("DEM");
                                 ctx.emit(dx + " = " + ctx.head() + " * E;\n" + dm + "[i, 0 : N, 1] = +(" + ctx.head() + "[i, j]);");
                                 return std::vector<std::string>{dx, dm};
                               }};
  EXPECT_TRUE(vjp(parse_program(kSoftmax), ov).zero_adjoints.empty());
  Options hook;
  hook.hook = [](const Statement&, DerivativeContext&) -> std::optional<std::map<std::string, std::string>> { return std::nullopt; };
  EXPECT_TRUE(vjp(parse_program(kSoftmax), hook).zero_adjoints.empty());
  Options mixed;
  mixed.mixed_mode = true;
  EXPECT_EQ(check_zero_adjoints(kSoftmax, x, 9, mixed).proven, std::vector<std::string>{"M"});

  // Forward mode: the maxima get no tangent, and the tangents agree with those through the maxima.
  for (const auto& [name, text] : proven) {
    SCOPED_TRACE(name + " forward");
    Program p = parse_program(text);
    Result pruned = jvp(p), written = jvp(p, {}, false, false);
    EXPECT_EQ(pruned.zero_adjoints, expected(name));
    EXPECT_TRUE(written.zero_adjoints.empty());
    EXPECT_FALSE(pruned.adjoints.count("M"));
    EXPECT_TRUE(written.adjoints.count("M"));
    TensorMap in = random_inputs(x, 10);
    in["TX"] = testing::random_buffer({3, 5}, 11);
    Buffer a = interpret(pruned.program, in).at("TO"), b = interpret(written.program, in).at("TO");
    for (int64_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a.get(e), b.get(e), 1e-12) << e;
  }
  EXPECT_TRUE(jvp(parse_program(std::string(kRowMax) + "  O = exp(X - M);\n}\n")).zero_adjoints.empty());

  // The full Jacobian (differentiate without a head) leaves the maxima out too, and equals the one through them.
  Program sm = parse_program(kSoftmax);
  Options through;
  through.prove_zero_adjoints = false;
  Result jac = differentiate(sm, "O"), jac_through = differentiate(sm, "O", through);
  EXPECT_EQ(jac.zero_adjoints, std::vector<std::string>{"M"});
  TensorMap jin = random_inputs(x, 12);
  Buffer ja = interpret(jac.program, jin).at(jac.gradients[0]), jb = interpret(jac_through.program, jin).at(jac_through.gradients[0]);
  ASSERT_EQ(ja.shape(), (std::vector<int64_t>{3, 5, 3, 5}));
  for (int64_t e = 0; e < ja.size(); ++e) EXPECT_NEAR(ja.get(e), jb.get(e), 1e-12) << e;
}

// Random programs built from softmax's pieces (rows, their maxima, exponentials, row sums and maxima,
// logarithms and square roots of positive values, products, quotients, relu, abs, select): every adjoint
// the proof calls zero computes to zero up to rounding in the gradient as written, and the gradients with
// and without the proof agree. Both outcomes must occur often.
TEST(AutodiffTest, RandomProgramsAdjointsProvenZeroAreZero) {
  const uint64_t seed = 12012026;
  std::mt19937_64 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int proven = 0, kept = 0;
  for (int iter = 0; iter < 300; ++iter) {
    struct Value {
      std::string name;
      bool row, positive, small;  // shape [N, 1]; > 0; |v| <= 4 on inputs in [-1, 1]
    };
    std::vector<Value> pool = {{"X", false, false, true}, {"Y", false, false, true}, {"M", true, false, true},
                               {"E", false, true, false}, {"S", true, true, false},  {"P", false, true, false},
                               {"L", false, false, false}, {"D", false, false, true},
                               {"R", true, false, false}};
    std::string body = std::string(
        "  M[i, 0 : N, 1] = >(X[i, j]);\n  E = exp(X - M);\n  S[i, 0 : N, 1] = +(E[i, j]);\n  P = E / S;\n"
        "  L = X - M - log(S);\n  D = X - M;\n  R[i, 0 : N, 1] = +(D[i, j]);\n");
    const int statements = 2 + static_cast<int>(pick(5));
    for (int s = 0; s < statements; ++s) {
      const std::string name = "T" + std::to_string(s);
      const Value a = pool[pick(pool.size())], b = pool[pick(pool.size())];
      Value v{name, a.row && b.row, false, false};
      std::string expr;
      switch (pick(9)) {
        case 0: expr = a.name + " - " + b.name, v.small = a.small && b.small && s < 2; break;
        case 1: expr = a.name + " + " + b.name, v.small = a.small && b.small && s < 2, v.positive = a.positive && b.positive; break;
        case 2: expr = a.name + " * " + b.name, v.positive = a.positive && b.positive; break;
        case 3:
          if (!b.positive) continue;
          expr = a.name + " / " + b.name, v.positive = a.positive;
          break;
        case 4:
          if (!a.small) continue;
          expr = "exp(" + a.name + ")", v.positive = true;
          break;
        case 5:
          if (!a.positive) continue;
          expr = pick(2) ? "log(" + a.name + ")" : "sqrt(" + a.name + ")", v.positive = expr[0] == 's', v.row = a.row;
          break;
        case 6: expr = (pick(2) ? "relu(" : "abs(") + a.name + ")", v.small = a.small, v.row = a.row; break;
        case 7: expr = "select(Y > 0, " + a.name + ", " + b.name + ")", v.row = false, v.positive = a.positive && b.positive; break;
        default:
          if (a.row) continue;
          body += "  " + name + "[i, 0 : N, 1] = " + (pick(2) ? "+" : ">") + "(" + a.name + "[i, j]);\n";
          pool.push_back({name, true, a.positive, false});
          continue;
      }
      body += "  " + name + " = " + expr + ";\n";
      pool.push_back(v);
    }
    const std::string text = "function (X[N, C], Y[N, C]) -> (" + pool.back().name + ") {\n" + body + "}\n";
    SCOPED_TRACE("seed " + std::to_string(seed) + " iteration " + std::to_string(iter));
    ZeroAdjointCheck c = check_zero_adjoints(text, {{"X", {3, 4}}, {"Y", {3, 4}}}, seed + iter);
    if (::testing::Test::HasFailure()) return;
    const bool m_proven = std::count(c.proven.begin(), c.proven.end(), "M") != 0;
    if (m_proven) ++proven;
    if (!m_proven && c.size.count("M") && c.size["M"] > 1e-6 * c.scale) ++kept;
  }
  std::cout << "maxima proven zero in " << proven << " programs, kept (and non-zero) in " << kept << "\n";
  EXPECT_GE(proven, 30);
  EXPECT_GE(kept, 30);
}

TEST(AutodiffTest, DeterministicText) {
  Program p = parse_program(kMlp);
  EXPECT_EQ(print(vjp(p).program), print(vjp(p).program));
  EXPECT_EQ(print(jvp(p).program), print(jvp(p).program));
  EXPECT_EQ(print(differentiate(p, "L").program), print(differentiate(p, "L").program));
}

TEST(AutodiffTest, RefusalsNameTheStatement) {
  auto message = [](const std::function<void()>& f) {  // the UserError f throws
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto error_of = [&message](const std::string& text, bool forward = false) {
    return message([&] {
      Program p = parse_program(text);
      if (forward) {
        jvp(p);
      } else {
        vjp(p);
      }
    });
  };
  EXPECT_NE(error_of("function (A[N], B[N]) -> (O) { O[] = >(A[i] * B[i]); }").find(
                "cannot differentiate contraction O: max of a mul combination"),
            std::string::npos);
  EXPECT_NE(error_of("function (A[N], D[]) -> (O) { O[] = *(A[i]) default D; }").find(
                "cannot differentiate contraction O: product with a default tensor"),
            std::string::npos);
  EXPECT_NE(error_of("function (A[N], B[N]) -> (O) { O[] = <(A[i] + B[i]); }", true).find(
                "cannot take the tangent of contraction O: min of a add combination"),
            std::string::npos);
  Program p = parse_program("function (A[N]) -> (O) { O = A * 2; }");
  try {
    gradient(p);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient needs a scalar loss, but output O has rank 1"), std::string::npos);
  }
  Options o;
  o.wrt = {"O"};
  EXPECT_THROW(vjp(p, o), UserError);
  EXPECT_THROW(differentiate(p, "Q"), UserError);
  // An input named twice: one gradient each would be two outputs of the same name.
  Program two = parse_program("function (A[N], B[N]) -> (O) { O[i : N] = +(A[i] * B[i]); }");
  o.wrt = {"A", "B", "A"};
  EXPECT_EQ(message([&] { vjp(two, o); }), "cannot differentiate with respect to A twice: it is named more than once");
  EXPECT_EQ(message([&] { differentiate(two, "O", o); }), "cannot differentiate with respect to A twice: it is named more than once");
  EXPECT_EQ(message([&] { jvp(two, {"B", "B"}); }), "cannot take a tangent of B twice: it is named more than once");
}

}  // namespace
}  // namespace polytile::ad
