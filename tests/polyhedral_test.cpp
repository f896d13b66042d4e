// Contractions as isl sets: domains, exact bounds, emptiness, the proof that assign writes each element
// once (with a witness when it does not), and the single-write proof used by defract.
#include <gtest/gtest.h>

#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/isl_support.h"
#include "polytile/parser.h"
#include "polytile/polyhedral.h"

namespace polytile::poly {
namespace {

struct Typed {
  Program program;
  ProgramTypes types;
};

Typed typed(const std::string& text, const std::map<std::string, std::vector<int64_t>>& shapes) {
  Typed t{parse_program(text, "t.tile"), {}};
  std::map<std::string, TensorType> in;
  for (const auto& [name, shape] : shapes) in[name] = TensorType{DType::f64, shape};
  t.types = infer_types(t.program, in);
  return t;
}

const Contraction& first(const Program& p) {
  for (const auto& st : p.statements)
    if (const auto* c = std::get_if<Contraction>(&st)) return *c;
  throw std::logic_error("no contraction");
}

// This binary links libLLVM too (every test does), which exports Polly's copy of isl under isl's names: the
// system libisl polytile is compiled against must be the one that runs, for every function.
TEST(PolyhedralTest, IslRunsFromTheSystemLibraryAlone) {
  const std::string library = isl_support::isl_library();
  EXPECT_NE(library.find("libisl"), std::string::npos) << library;
  EXPECT_NO_THROW(isl_support::check_one_isl());
}

TEST(PolyhedralTest, MaxPoolDomainBoundsAndAccesses) {
  Typed t = typed("function (I[N]) -> (O) { O[i : N/2] = >(I[2*i + j]), j < 2; }", {{"I", {7}}});
  ContractionAnalysis a = analyze(first(t.program), t.types);
  EXPECT_FALSE(a.empty);
  ASSERT_EQ(a.bounds.size(), 2u);
  EXPECT_EQ(a.bounds[0].name, "i");
  EXPECT_EQ(a.bounds[0].min, 0);
  EXPECT_EQ(a.bounds[0].max, 2);
  EXPECT_EQ(a.bounds[1].min, 0);
  EXPECT_EQ(a.bounds[1].max, 1);
  EXPECT_EQ(a.domain, "{ S_O[i, j] : 0 <= i <= 2 and 0 <= j <= 1 }");
  EXPECT_EQ(a.write, "{ S_O[i, j] -> O[o0 = i] : 0 <= i <= 2 and 0 <= j <= 1 }");
  ASSERT_EQ(a.reads.size(), 1u);
  EXPECT_EQ(a.reads[0], "{ S_O[i, j] -> I[o0 = 2i + j] : 0 <= i <= 2 and 0 <= j <= 1 }");
}

TEST(PolyhedralTest, BoundsAreExactForCoupledAndRationalIndices) {
  // The wrong max pool: j is bounded only through 2*i + j in [0, N): exact bounds come from the projection.
  Typed t = typed("function (I[N]) -> (O) { O[i : N/2] = >(I[2*i + j]); }", {{"I", {7}}});
  ContractionAnalysis a = analyze(first(t.program), t.types);
  EXPECT_EQ(a.bounds[1].min, -4);
  EXPECT_EQ(a.bounds[1].max, 6);
  // (i + j)/2 must be integral: with j < 2 and i in [0, 4), the domain has 4 points, not 8.
  Typed r = typed("function (I[N]) -> (O) { O[i : N] = +(I[(i + j)/2]), j < 2; }", {{"I", {4}}});
  ContractionAnalysis b = analyze(first(r.program), r.types);
  EXPECT_NE(b.domain.find("(i + j) mod 2 = 0"), std::string::npos) << b.domain;
  EXPECT_EQ(b.bounds[0].max, 3);
}

TEST(PolyhedralTest, EmptyDomainIsLegal) {
  Typed t = typed("function (I[N]) -> (O) { O[i : N] = +(I[i + 5]); }", {{"I", {3}}});
  ContractionAnalysis a = analyze(first(t.program), t.types);
  EXPECT_TRUE(a.empty);
  EXPECT_TRUE(a.bounds.empty());
  EXPECT_NE(print_analyses({a}).find("empty domain: writes nothing"), std::string::npos);
}

TEST(PolyhedralTest, UnboundedVariableIsAUserError) {
  Typed t = typed("function (I[N]) -> (O) { O[i : N] = +(I[i + j - k]); }", {{"I", {3}}});
  try {
    analyze(first(t.program), t.types);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("index variable j of contraction O is unbounded"), std::string::npos) << e.what();
  }
}

TEST(PolyhedralTest, AssignIsProvenSafeOrRefusedWithAWitness) {
  Typed ok = typed("function (A[N, M]) -> (T) { T[j, i : M, N] = =(A[i, j]); }", {{"A", {3, 4}}});
  EXPECT_NO_THROW(analyze(first(ok.program), ok.types));
  // Stride-2 writes of a size-2 window overlap exactly when the output is not truncated...
  Typed bad = typed("function (I[N]) -> (O) { O[i + j : N] = =(I[i]), j < 2; }", {{"I", {4}}});
  try {
    analyze(first(bad.program), bad.types);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "assign contraction O can write an element more than once: O[1] is written at i=0, j=1 and at "
                 "i=1, j=0; use an aggregation such as + or > if that is intended");
  }
  // ...and the proof is exact, not conservative: this one only looks like it could overlap.
  Typed exact = typed("function (I[N]) -> (O) { O[2*i + j : N] = =(I[i]), j < 2; }", {{"I", {4}}});
  EXPECT_NO_THROW(analyze(first(exact.program), exact.types));
  // The interpreter, as the oracle, agrees on both.
  EXPECT_THROW(interpret(bad.program, {{"I", Buffer(DType::f64, {4})}}), UserError);
  EXPECT_NO_THROW(interpret(exact.program, {{"I", Buffer(DType::f64, {4})}}));
}

TEST(PolyhedralTest, SingleWriteProofDistinguishesOutputVariables) {
  // A stride-1 flip: (y, k) = (1, 0) and (0, 1) write the same element.
  Typed flip = typed("function (DO[Y], K[KK]) -> (DI) { DI[y + k : 6] = +(DO[y] * K[k]); }", {{"DO", {4}}, {"K", {3}}});
  EXPECT_FALSE(writes_each_output_once(first(flip.program), flip.types));
  // The post's flip happens to be injective for a 2x2 kernel (3*y + 2*j with j < 2 never collides)...
  Typed conv = typed(
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {"
      "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]); }",
      {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  EXPECT_TRUE(writes_each_output_once(first(conv.program), conv.types));
  // ...but not for a 4x4 one: (y, j) = (2, 0) and (0, 3) both write row 6.
  Typed conv3 = typed(
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {"
      "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]); }",
      {{"DO", {1, 3, 3, 2}}, {"K", {4, 4, 2, 2}}});
  EXPECT_FALSE(writes_each_output_once(first(conv3.program), conv3.types));
  Typed reduced = typed(
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {"
      "  DI[v0, v1_0 + 3*v1_1, v2_0 + 3*v2_1, v3 : N, 3*OH, 3*OW, CI] = +(DO[v0, -v1_0 + v1_1 - 2*v4_0, "
      "-v2_0 + v2_1 - 2*v5_0, v6] * K[2*v1_0 + 3*v4_0, 2*v2_0 + 3*v5_0, v3, v6]), v1_0 < 3, v2_0 < 3; }",
      {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  EXPECT_TRUE(writes_each_output_once(first(reduced.program), reduced.types));
  // Without the digit constraint the same output element has two digit representations.
  Typed loose = typed(
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {"
      "  DI[v0, v1_0 + 3*v1_1, v2, v3 : N, 3*OH, 3*OW, CI] = +(DO[v0, -v1_0 + v1_1 - 2*v4_0, v2, v6] * "
      "K[2*v1_0 + 3*v4_0, 0, v3, v6]), v1_0 < 6; }",
      {{"DO", {2, 3, 3, 7}}, {"K", {2, 2, 5, 7}}});
  EXPECT_FALSE(writes_each_output_once(first(loose.program), loose.types));
}

TEST(PolyhedralTest, IslNamesNeverClashWithUserNames) {
  Typed t = typed("function (I[N]) -> (O) { O[and : N] = +(I[ex0 + o1]), ex0 < 2, o1 < 2; }", {{"I", {4}}});
  ContractionAnalysis a = analyze(first(t.program), t.types);
  EXPECT_EQ(a.bounds.size(), 3u);
  EXPECT_NE(a.domain.find("and_"), std::string::npos) << a.domain;
}

}  // namespace
}  // namespace polytile::poly
