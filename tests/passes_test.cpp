// reduce and defract: the post's worked example as golden text, idempotence and declines, and a property
// test over generated contractions (strided, dilated, padded, transposed, unpooling, rational, grouped,
// ranks up to 7) against the reference interpreter and isl's single-write proof.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "polytile/passes.h"
#include "polytile/polyhedral.h"
#include "test_util.h"

namespace polytile::poly {
namespace {

const Contraction& only_contraction(const Program& p) {
  for (const auto& st : p.statements)
    if (const auto* c = std::get_if<Contraction>(&st)) return *c;
  throw std::logic_error("no contraction");
}

ProgramTypes types_for(const Program& p, const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::map<std::string, TensorType> in;
  for (const auto& [name, shape] : shapes) in[name] = TensorType{DType::f64, shape};
  return infer_types(p, in);
}

const char* kSeedGradient =
    "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {\n"
    "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]);\n"
    "}\n";

TEST(PassesTest, SeedExampleReducesAndDefractsAsInThePost) {
  Program p = parse_program(kSeedGradient);
  ProgramTypes types = types_for(p, {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  PassContext ctx{&types};
  PassResult reduced = reduce(only_contraction(p), ctx);
  ASSERT_TRUE(reduced.changed);
  EXPECT_EQ(print(Statement(reduced.contraction)),
            "DI[v0, v1, v2, v3 : N, 3*OH, 3*OW, CI] = +(DO[v0, 1/3*v1 - 2/3*v4, 1/3*v2 - 2/3*v5, v6] * "
            "K[v4, v5, v3, v6]);");
  PassResult defracted = defract(reduced.contraction, ctx);
  ASSERT_TRUE(defracted.changed);
  EXPECT_EQ(print(Statement(defracted.contraction)),
            "DI[v0, v1_0 + 3*v1_1, v2_0 + 3*v2_1, v3 : N, 3*OH, 3*OW, CI] = +(DO[v0, -v1_0 + v1_1 - 2*v4_0, "
            "-v2_0 + v2_1 - 2*v5_0, v6] * K[2*v1_0 + 3*v4_0, 2*v2_0 + 3*v5_0, v3, v6]), v1_0 < 3, v2_0 < 3;");
  EXPECT_TRUE(writes_each_output_once(defracted.contraction, types));
}

TEST(PassesTest, SeedExampleWithTheForwardConvolutionsTrueInputSizes) {
  // The forward convolution of the post on a 2x10x11x5 input: DI has the input's true size, not 3*OH.
  const char* text =
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {\n"
      "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 10, 11, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]);\n"
      "}\n";
  Program p = parse_program(text);
  ProgramTypes types = types_for(p, {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  Program d = reduce_and_defract(p, PassContext{&types});
  EXPECT_EQ(print(d),
            "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {\n"
            "  DI[v0, v1_0 + 3*v1_1, v2_0 + 3*v2_1, v3 : N, 10, 11, CI] = +(DO[v0, -v1_0 + v1_1 - 2*v4_0, -v2_0 + "
            "v2_1 - 2*v5_0, v6] * K[2*v1_0 + 3*v4_0, 2*v2_0 + 3*v5_0, v3, v6]), v1_0 < 3, v2_0 < 3;\n"
            "}\n");
  Buffer dout = testing::random_buffer({2, 3, 3, 7}, 1), k = testing::random_buffer({2, 2, 5, 7}, 2);
  testing::expect_near_buffers(interpret(d, {{"DO", dout}, {"K", k}}).at("DI"),
                               interpret(p, {{"DO", dout}, {"K", k}}).at("DI"), 1e-12, "true sizes");
}

TEST(PassesTest, PassesSkipWhatNeedsNothingAndAreIdempotent) {
  Program fwd = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  const Contraction& c = only_contraction(fwd);
  PassResult r = reduce(c);
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.reason, "every output index of O is already a single variable");
  PassResult d = defract(c);
  EXPECT_FALSE(d.changed);
  EXPECT_EQ(d.reason, "contraction O has no fractional coefficients");

  Program p = parse_program(kSeedGradient);
  ProgramTypes types = types_for(p, {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  PassContext ctx{&types};
  PassResult once = reduce(only_contraction(p), ctx);
  EXPECT_FALSE(reduce(once.contraction, ctx).changed);
  PassResult twice = defract(once.contraction, ctx);
  EXPECT_FALSE(defract(twice.contraction, ctx).changed);
}

TEST(PassesTest, ReduceDeclinesWhenIntegralityWouldBeLost) {
  // i appears only in the output: reducing 2*i + j to one variable v0 would let v0 - j be odd.
  Program p = parse_program("function (A[M]) -> (O) { O[2*i + j : 8] = +(A[j]), j < 2; }");
  PassResult r = reduce(only_contraction(p));
  EXPECT_FALSE(r.changed);
  EXPECT_NE(r.reason.find("would not keep every original index variable integral"), std::string::npos) << r.reason;
}

TEST(PassesTest, DefractSplitsRationalIndicesIntoDigits) {
  Program p = parse_program("function (I[N]) -> (O) { O[i : 2*N] = +(I[(i - j + 1)/2]), j < 2; }");
  PassResult d = defract(only_contraction(p));
  ASSERT_TRUE(d.changed);
  // i - j must be odd: i = i_0 + 2*i_1 with digit i_0, and j = i_0 + 2*j_0 + 1 follows the same digit.
  EXPECT_EQ(print(Statement(d.contraction)), "O[i_0 + 2*i_1 : 2*N] = +(I[i_1 - j_0]), i_0 + 2*j_0 + 1 < 2, i_0 < 2;");
  Buffer in = testing::random_buffer({5}, 3);
  Program after = p;
  std::get<Contraction>(after.statements[0]) = d.contraction;
  testing::expect_near_buffers(interpret(after, {{"I", in}}).at("O"), interpret(p, {{"I", in}}).at("O"), 1e-15, "rational");
}

TEST(PassesTest, DefractScalesFractionalConstraints) {
  Program p = parse_program("function (I[N]) -> (O) { O[i : N] = +(I[j]), (i + j)/2 < 2; }");
  PassResult d = defract(only_contraction(p));
  ASSERT_TRUE(d.changed);
  EXPECT_EQ(print(Statement(d.contraction)), "O[i : N] = +(I[j]), i + j < 4;");
}

// ------------------------------------------------------------------------------------------ property test

struct Case {
  std::string text;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string kind;
};

int64_t pick(std::mt19937_64& rng, int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % (hi - lo + 1)); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

std::string affine(int64_t a, const std::string& x, int64_t b, const std::string& k, int64_t c) {
  std::ostringstream os;
  os << a << "*" << x << " + " << b << "*" << k;
  if (c > 0) os << " - " << c;
  if (c < 0) os << " + " << -c;
  return os.str();
}

// The input gradient of a strided, dilated, padded, optionally grouped convolution with an optional
// extra "head" axis (ranks up to 7), written by flipping I and O as in the post.
Case conv_input_gradient(std::mt19937_64& rng) {
  int dims = static_cast<int>(pick(rng, 1, 3));
  bool grouped = pick(rng, 0, 1), heads = dims == 3 && pick(rng, 0, 1);
  int64_t n = pick(rng, 1, 2), g = grouped ? 2 : 1, ci = pick(rng, 1, 2), co = pick(rng, 1, 2), h = heads ? 2 : 1;
  std::vector<std::string> di, dout, k, out_dims;
  std::vector<int64_t> di_shape, do_shape, k_shape;
  di.push_back("n");
  dout.push_back("n");
  out_dims.push_back("N");
  di_shape.push_back(n);
  do_shape.push_back(n);
  if (heads) {
    di.push_back("h");
    dout.push_back("h");
    out_dims.push_back("2");
    di_shape.push_back(h);
    do_shape.push_back(h);
  }
  for (int s = 0; s < dims; ++s) {
    int64_t stride = pick(rng, 1, 4), dil = pick(rng, 1, 4), ks = pick(rng, 1, 3);
    int64_t size = pick(rng, dims == 3 ? 3 : 4, dims == 3 ? 6 : 9), pad = pick(rng, 0, dil * (ks - 1));
    int64_t out = std::max<int64_t>(1, (size + 2 * pad - dil * (ks - 1) - 1) / stride + 1);
    std::string x = "x" + std::to_string(s), kk = "k" + std::to_string(s);
    di.push_back(affine(stride, x, dil, kk, pad));
    dout.push_back(x);
    k.push_back(kk);
    out_dims.push_back(std::to_string(size));
    di_shape.push_back(size);
    do_shape.push_back(out);
    k_shape.push_back(ks);
  }
  if (grouped) {
    for (auto* v : {&di, &dout, &k}) v->push_back("g");
    out_dims.push_back("2");
    di_shape.push_back(g);
    do_shape.push_back(g);
    k_shape.push_back(g);
  }
  if (heads) {
    k.insert(k.begin(), "h");
    k_shape.insert(k_shape.begin(), h);
  }
  di.push_back("ci");
  out_dims.push_back("CI");
  di_shape.push_back(ci);
  dout.push_back("co");
  do_shape.push_back(co);
  k.push_back("ci");
  k.push_back("co");
  k_shape.push_back(ci);
  k_shape.push_back(co);
  std::vector<std::string> do_decl, k_decl;
  for (size_t i = 0; i < do_shape.size(); ++i) do_decl.push_back("D" + std::to_string(i));
  for (size_t i = 0; i < k_shape.size(); ++i) k_decl.push_back(i + 2 == k_shape.size() ? "CI" : "E" + std::to_string(i));
  do_decl[0] = "N";
  std::string text = "function (DO[" + join(do_decl) + "], K[" + join(k_decl) + "]) -> (DI) {\n  DI[" + join(di) +
                     " : " + join(out_dims) + "] = +(DO[" + join(dout) + "] * K[" + join(k) + "]);\n}\n";
  return {text, {{"DO", do_shape}, {"K", k_shape}}, "conv input gradient " + std::to_string(dims) + "d"};
}

// Transposed convolution / unpooling: O[s*x + k] = +(I[x] * K[k]) or +(I[x]), k < s.
Case transposed(std::mt19937_64& rng) {
  int dims = static_cast<int>(pick(rng, 1, 2));
  bool unpool = pick(rng, 0, 1);
  std::vector<std::string> o, i, k, od, cons;
  std::vector<int64_t> i_shape, k_shape;
  for (int s = 0; s < dims; ++s) {
    int64_t stride = pick(rng, 1, 4), ks = pick(rng, 1, 4), size = pick(rng, 2, 6);
    std::string x = "x" + std::to_string(s), kk = "k" + std::to_string(s);
    o.push_back(std::to_string(stride) + "*" + x + " + " + kk);
    i.push_back(x);
    k.push_back(kk);
    od.push_back(std::to_string(stride * size + pick(rng, -1, 2)));
    i_shape.push_back(size);
    k_shape.push_back(ks);
    if (unpool) cons.push_back(kk + " < " + std::to_string(stride));
  }
  std::vector<std::string> idecl, kdecl;
  for (int s = 0; s < dims; ++s) {
    idecl.push_back("X" + std::to_string(s));
    kdecl.push_back("KS" + std::to_string(s));
  }
  std::string body = unpool ? "+(I[" + join(i) + "])" : "+(I[" + join(i) + "] * K[" + join(k) + "])";
  std::string text = "function (I[" + join(idecl) + "]" + (unpool ? "" : ", K[" + join(kdecl) + "]") + ") -> (O) {\n  O[" +
                     join(o) + " : " + join(od) + "] = " + body + (cons.empty() ? "" : ", " + join(cons)) + ";\n}\n";
  Case c{text, {{"I", i_shape}}, unpool ? "unpooling" : "transposed conv"};
  if (!unpool) c.shapes["K"] = k_shape;
  return c;
}

// Rational index expressions: O[i] = +(I[(a*i - j + c)/q]), j < w.
Case rational(std::mt19937_64& rng) {
  int64_t q = pick(rng, 2, 4), a = pick(rng, 1, 3), c = pick(rng, 0, 3), w = pick(rng, 1, 4), n = pick(rng, 3, 8);
  std::ostringstream os;
  os << "function (I[N]) -> (O) {\n  O[i : " << pick(rng, 2, 12) << "] = +(I[(" << a << "*i - j + " << c << ")/" << q
     << "]), j < " << w << ";\n}\n";
  return {os.str(), {{"I", {n}}}, "rational"};
}

bool fraction_free(const Contraction& c) {
  auto ok = [](const Polynomial& p) {
    if (!p.constant().is_integer()) return false;
    for (const auto& [v, coeff] : p.index_terms())
      if (!coeff.is_integer()) return false;
    return true;
  };
  for (const auto& p : c.output_indices)
    if (!ok(p)) return false;
  for (const auto& a : c.inputs)
    for (const auto& p : a.indices)
      if (!ok(p)) return false;
  for (const auto& k : c.constraints)
    if (!ok(k.poly)) return false;
  return true;
}

TEST(PassesPropertyTest, ReduceDefractPreserveValuesAndWriteEachElementOnce) {
  const uint64_t seed = 424242;
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::map<std::string, int> kinds;
  int reduced = 0, defracted = 0;
  for (int iter = 0; iter < 300; ++iter) {
    int which = static_cast<int>(rng() % 4);
    Case cs = which <= 1 ? conv_input_gradient(rng) : which == 2 ? transposed(rng) : rational(rng);
    ++kinds[cs.kind];
    std::string where = "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + " (" + cs.kind + ")\n" + cs.text;
    Program p = parse_program(cs.text, "generated.tile");
    ProgramTypes types = types_for(p, cs.shapes);
    PassContext ctx{&types};
    const Contraction& c = only_contraction(p);
    PassResult r = reduce(c, ctx);
    PassResult d = defract(r.contraction, ctx);
    reduced += r.changed;
    defracted += d.changed;
    Program after = p;
    std::get<Contraction>(after.statements[0]) = d.contraction;
    ASSERT_EQ(print(parse_program(print(after))), print(after)) << where;
    ASSERT_TRUE(fraction_free(d.contraction)) << where << print(after);
    bool single_vars = true;
    for (const auto& o : c.output_indices) single_vars &= o.index_terms().size() <= 1;
    if (r.changed || single_vars) {
      ASSERT_TRUE(writes_each_output_once(d.contraction, types)) << where << print(after);
    }
    EXPECT_FALSE(reduce(r.contraction, ctx).changed) << where;
    EXPECT_FALSE(defract(d.contraction, ctx).changed) << where;
    TensorMap inputs;
    uint64_t s = 1;
    for (const auto& [name, shape] : cs.shapes) inputs[name] = testing::random_buffer(shape, seed + iter * 10 + s++);
    Buffer want = interpret(p, inputs).at(c.output), got = interpret(after, inputs).at(c.output);
    testing::expect_near_buffers(got, want, 1e-11, where + print(after));
  }
  for (const auto& [k, n] : kinds) std::cout << k << ": " << n << "\n";
  std::cout << reduced << " reduced, " << defracted << " defracted\n";
  EXPECT_GT(reduced, 100);
  EXPECT_GT(defracted, 100);
}

}  // namespace
}  // namespace polytile::poly
