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
#include "polytile/verify.h"
#include "polytile/error.h"
#include "generators.h"
#include "test_util.h"

namespace polytile::poly {
namespace {

using namespace polytile::testing::generators;  // NOLINT

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

// From the pipeline fuzzer: v2 and v5v appear only as v2 - v5v, so the contraction ranges over whole lines
// of (v2, v5v) wherever it has points, and the interpreter and analyze refuse it as unbounded. Defract
// used to fold the pair into one variable (one point of each line): the CPU backend then ran the program
// the interpreter refuses, and with translation validation on it failed with an internal error even at
// sizes where the contraction has no points (CO < 7) and the program is valid.
TEST(PassesTest, ContractionsWithAnUnboundedDirectionAreLeftAsWritten) {
  const std::string text =
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, AO]) -> (DI) {\n"
      "  DI[v0, v1, x2, v3 : N, 3*OH, 3*OW, CI] = +(DO[v0, 1/3*v1 - 2/3*vt, 1/3*v2 - 1/3*v5v, 6] * K[v4, v5, v6, v6]);\n"
      "}\n";
  Program p = parse_program(text);
  for (int64_t co : {3, 8}) {  // no points, and points
    ProgramTypes types = types_for(p, {{"DO", {1, 2, 2, co}}, {"K", {2, 2, 2, 2}}});
    std::vector<std::string> log;
    Program after = reduce_and_defract(p, PassContext{&types, /*verify=*/true}, &log);
    EXPECT_EQ(print(after), print(p)) << co;
    EXPECT_NE(std::find(log.begin(), log.end(), "defract: DI has index variables that no index or constraint bounds: left as written"), log.end());
    TensorMap inputs{{"DO", testing::random_buffer({1, 2, 2, co}, 1)}, {"K", testing::random_buffer({2, 2, 2, 2}, 2)}};
    if (co == 3) {
      testing::expect_near_buffers(interpret(after, inputs).at("DI"), interpret(p, inputs).at("DI"), 0, "no points");
      continue;
    }
    for (const Program* q : {&p, &after}) {
      try {
        analyze_program(*q, infer_types(*q, {{"DO", {DType::f64, {1, 2, 2, co}}}, {"K", {DType::f64, {2, 2, 2, 2}}}}));
        ADD_FAILURE() << "an unbounded contraction was analyzed";
      } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("index variable v2 of contraction DI is unbounded"), std::string::npos) << e.what();
      }
    }
  }
}

// Runs reduce then defract on the program's only contraction and compares values with the original.
void expect_passes_keep_values(const std::string& text, const std::map<std::string, std::vector<int64_t>>& shapes) {
  Program p = parse_program(text);
  ProgramTypes types = types_for(p, shapes);
  Program after = reduce_and_defract(p, PassContext{&types});
  TensorMap inputs;
  uint64_t seed = 7;
  for (const auto& [name, shape] : shapes) inputs[name] = testing::random_buffer(shape, seed++);
  const std::string& out = only_contraction(p).output;
  testing::expect_near_buffers(interpret(after, inputs).at(out), interpret(p, inputs).at(out), 1e-12, text + print(after));
}

TEST(PassesTest, ReduceShiftsRationalConstantOffsetsIntoTheNewVariables) {
  // (l + k + 1)/2 is integral at the valid points; the new variable takes the offset: no v0 + 1/2.
  Program p = parse_program("function (F[L]) -> (O) { O[(l + k + 1)/2 : 4] = +(F[l]), l < 3; }");
  PassResult r = reduce(only_contraction(p));
  ASSERT_TRUE(r.changed);
  EXPECT_EQ(print(Statement(r.contraction)), "O[v0 : 4] = +(F[v1]), v1 < 3;");
  expect_passes_keep_values("function (F[L]) -> (O) { O[(l + k + 1)/2 : 4] = +(F[l]), l < 3; }", {{"F", {3}}});
  // The gradients of rational accesses with offsets (the class the outside tester found).
  for (const char* index : {"(x + y + 1)/2", "(x - y + 3)/2", "(2*x - y + 1)/4", "(3*x + 2*y - 5)/3"})
    expect_passes_keep_values(std::string("function (DC[8], B[M]) -> (DA) { DA[") + index +
                                  " : 9] = +(DC[x] * B[y]); }",
                              {{"DC", {8}}, {"B", {5}}});
}

TEST(PassesTest, ReduceNeverMakesAFractionalConstraintAVariable) {
  // i/2 < 2 holds for i in 0..3; a variable v = i/2 would keep only the even i.
  const char* text = "function (E[K]) -> (O) { O[j + k : 6] = +(E[k]), j < 2, i/2 < 2; }";
  PassResult r = reduce(only_contraction(parse_program(text)));
  ASSERT_TRUE(r.changed);
  EXPECT_EQ(print(Statement(r.contraction)), "O[v0 : 6] = +(E[v0 - v1]), v1 < 2, 1/2*v2 < 2;");
  expect_passes_keep_values(text, {{"E", {4}}});
  // A rational constraint that is integral wherever the accesses are may still serve.
  expect_passes_keep_values("function (E[K]) -> (O) { O[j + k : 6] = +(E[(k + j)/2]), (k + j)/2 < 2, j < 3; }", {{"E", {4}}});
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

// ------------------------------------------------------------------------------------------ translation validation

std::string refutation(const Contraction& before, const Contraction& after, const ProgramTypes& types,
                       const std::optional<Substitution>& sub) {
  RewriteContext rc;
  rc.types = &types;
  try {
    verify_rewrite("test", before, after, rc, sub);
  } catch (const InternalError& e) {
    return e.what();
  }
  return "";
}

TEST(VerifyTest, ProvesTheSeedRewritesAndRefutesWrongOnes) {
  Program p = parse_program(kSeedGradient);
  ProgramTypes types = types_for(p, {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  PassContext ctx{&types, true};
  const Contraction& c = only_contraction(p);
  PassResult r = reduce(c, ctx);
  PassResult d = defract(r.contraction, ctx);
  EXPECT_EQ(refutation(c, r.contraction, types, r.substitution), "");
  EXPECT_EQ(refutation(r.contraction, d.contraction, types, d.substitution), "");
  // Without the substitution the proof falls back to images, which needs injective tuple maps: it holds here.
  EXPECT_EQ(refutation(c, d.contraction, types, std::nullopt), "");

  // A dropped digit constraint lets two digit choices stand for one original point.
  Contraction dropped = d.contraction;
  dropped.constraints.pop_back();
  EXPECT_NE(refutation(r.contraction, dropped, types, d.substitution).find("stand for one original point"), std::string::npos);
  // A wrong access: K's first index off by one.
  Contraction shifted = d.contraction;
  shifted.inputs[1].indices[0] = shifted.inputs[1].indices[0] + Polynomial(Rational(1));
  EXPECT_NE(refutation(r.contraction, shifted, types, d.substitution), "");
  // A different aggregation.
  Contraction maxed = d.contraction;
  maxed.aggregation = AggregationOp::max;
  EXPECT_NE(refutation(r.contraction, maxed, types, d.substitution).find("aggregation"), std::string::npos);
}

TEST(VerifyTest, RefutesTheOldReduceOfRationalOffsets) {
  // What reduce used to produce for (l + k + 1)/2: v0 + 1/2 is never integral, every point is lost.
  Program p = parse_program("function (F[L]) -> (O) { O[(l + k + 1)/2 : 4] = +(F[l]), l < 3; }");
  Program wrong = parse_program("function (F[L]) -> (O) { O[v0 + 1/2 : 4] = +(F[v1]), v1 < 3; }");
  ProgramTypes types = types_for(p, {{"F", {3}}});
  Substitution sub{{"k", "l"}, {Polynomial::index("v0") * Rational(2) - Polynomial::index("v1"), Polynomial::index("v1")}};
  std::string why = refutation(only_contraction(p), only_contraction(wrong), types, sub);
  EXPECT_NE(why.find("original points are lost"), std::string::npos) << why;
  EXPECT_NE(why.find("test changed the meaning of contraction O"), std::string::npos) << why;
  // And the fixed pass proves itself.
  PassContext ctx{&types, true};
  EXPECT_NO_THROW(reduce_and_defract(p, ctx));
}

TEST(VerifyTest, ProvesForAllSizesWithDimsAsParameters) {
  Program p = parse_program(kSeedGradient);
  const Contraction& c = only_contraction(p);
  std::map<std::string, std::vector<DimExpr>> shapes;
  for (const auto& in : p.inputs) shapes[in.name] = in.dims;
  PassResult r = reduce(c), d = defract(r.contraction);
  EXPECT_TRUE(verify_rewrite_for_all_sizes("reduce", c, r.contraction, shapes, *r.substitution));
  EXPECT_TRUE(verify_rewrite_for_all_sizes("defract", r.contraction, d.contraction, shapes, *d.substitution));
  // A digit constraint dropped: refuted without any sizes.
  Contraction dropped = d.contraction;
  dropped.constraints.pop_back();
  EXPECT_THROW(verify_rewrite_for_all_sizes("defract", r.contraction, dropped, shapes, *d.substitution), InternalError);
  // The old rational-offset reduce, refuted for all sizes.
  Program old = parse_program("function (F[L]) -> (O) { O[(l + k + 1)/2 : 4] = +(F[l]), l < 3; }");
  Program wrong = parse_program("function (F[L]) -> (O) { O[v0 + 1/2 : 4] = +(F[v1]), v1 < 3; }");
  Substitution sub{{"k", "l"}, {Polynomial::index("v0") * Rational(2) - Polynomial::index("v1"), Polynomial::index("v1")}};
  try {
    verify_rewrite_for_all_sizes("reduce", only_contraction(old), only_contraction(wrong), {{"F", {DimExpr::symbol("L")}}}, sub);
    ADD_FAILURE() << "not refuted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("lost for some sizes"), std::string::npos) << e.what();
  }
  // Sizes isl cannot express (a product of dims) prove nothing, and say so.
  Program product = parse_program("function (A[N, M]) -> (O) { O[i + j : N*M] = +(A[i, j]); }");
  const Contraction& pc = only_contraction(product);
  PassResult pr = reduce(pc);
  ASSERT_TRUE(pr.changed);
  EXPECT_FALSE(verify_rewrite_for_all_sizes("reduce", pc, pr.contraction, {{"A", {DimExpr::symbol("N"), DimExpr::symbol("M")}}},
                                            *pr.substitution));
}

TEST(VerifyTest, MultiplicityCountsWhenAVariableReadsNothing) {
  // j appears in no access: each O[i] sums A[i] twice. Halving j's range keeps the image, not the count.
  Program p = parse_program("function (A[N]) -> (O) { O[i : N] = +(A[i]), j < 2; }");
  Program half = parse_program("function (A[N]) -> (O) { O[i : N] = +(A[i]), j < 1; }");
  ProgramTypes types = types_for(p, {{"A", {3}}});
  EXPECT_NE(refutation(only_contraction(p), only_contraction(half), types, std::nullopt).find("distinct tuple"), std::string::npos);
  Substitution identity{{"i", "j"}, {Polynomial::index("i"), Polynomial::index("j")}};
  EXPECT_NE(refutation(only_contraction(p), only_contraction(half), types, identity).find("lost"), std::string::npos);
  EXPECT_EQ(refutation(only_contraction(p), only_contraction(p), types, identity), "");
}

// ------------------------------------------------------------------------------------------ property test

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
    Case cs = any_case(rng);
    ++kinds[cs.kind];
    std::string where = "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + " (" + cs.kind + ")\n" + cs.text;
    Program p = parse_program(cs.text, "generated.tile");
    ProgramTypes types = types_for(p, cs.shapes);
    PassContext ctx{&types, /*verify=*/true};
    const Contraction& c = only_contraction(p);
    // Every rewrite proves itself with isl (translation validation) as well as agreeing with the interpreter.
    ASSERT_NO_THROW(reduce_and_defract(p, ctx)) << where;
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
