// Tile text: normalized printing, print(parse(x)) fixed point, every construct, and every syntax error with
// its line:column.
#include <gtest/gtest.h>

#include <filesystem>

#include "polytile/error.h"
#include "polytile/parser.h"

namespace polytile {
namespace {

std::string normalize(const std::string& text) { return print(parse_program(text, "t.tile")); }

// Parses, expecting a UserError whose message contains `needle`; returns the message.
std::string parse_error(const std::string& text) {
  try {
    parse_program(text, "t.tile");
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(ParserTest, NormalizesTheSeedConvolution) {
  EXPECT_EQ(normalize("function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n"
                      "O[n, y, x, co: N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);\n}"),
            "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n"
            "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 2*j + 3*y, 2*i + 3*x, ci] * K[j, i, ci, co]);\n"
            "}\n");
}

TEST(ParserTest, PrintParseIsAFixedPointForEveryExample) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(POLYTILE_SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".tile") continue;
    std::string once = print(parse_file(entry.path().string()));
    EXPECT_EQ(print(parse_program(once, "reprinted")), once) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 19);
}

TEST(ParserTest, ParsesEveryContractionForm) {
  std::string text = normalize(
      "# comment\n"
      "function f (A[N, M], B[M], C[N], S[]) -> (O1, O2, O3, O4, O5, O6, O7) {\n"
      "  O1[i, 0 : N, 1] = =(A[i, 0]);          // constant output index\n"
      "  O2[i : N] = *(A[i, j] + B[j]);\n"
      "  O3[i : N] = <(A[i, j] == B[j]);\n"
      "  O4[i : N] = >(A[i, j] == B[j] ? C[i]);\n"
      "  O5[i : N] = +(A[i, j]), j < M - 1, i - j < N default C;\n"
      "  O6[(i - j + 1)/2 : N] = +(A[i, j]);\n"
      "  O7[] = +(S[]);\n"
      "}\n");
  EXPECT_EQ(text,
            "function f (A[N, M], B[M], C[N], S[]) -> (O1, O2, O3, O4, O5, O6, O7) {\n"
            "  O1[i, 0 : N, 1] = =(A[i, 0]);\n"
            "  O2[i : N] = *(A[i, j] + B[j]);\n"
            "  O3[i : N] = <(A[i, j] == B[j]);\n"
            "  O4[i : N] = >(A[i, j] == B[j] ? C[i]);\n"
            "  O5[i : N] = +(A[i, j]), j < M - 1, i - j < N default C;\n"
            "  O6[1/2*i - 1/2*j + 1/2 : N] = +(A[i, j]);\n"
            "  O7[] = +(S[]);\n"
            "}\n");
}

TEST(ParserTest, ParsesElementwiseExpressions) {
  EXPECT_EQ(normalize("function (A[N], B[N]) -> (O) {\n"
                      "  O = select(A < 0 && !(B >= 1) || A == B, -A * 2.5e-1, pow(B, 2) % 3) / N + cast(A, f64);\n"
                      "}"),
            "function (A[N], B[N]) -> (O) {\n"
            "  O = select(A < 0 && !(B >= 1) || A == B, -A * 0.25, pow(B, 2) % 3) / N + cast(A, f64);\n"
            "}\n");
  EXPECT_EQ(normalize("function (A[N]) -> (O) { O = (A - (A - 1)) * -(2 + A); }"),
            "function (A[N]) -> (O) {\n  O = (A - (A - 1)) * -(2 + A);\n}\n");
}

TEST(ParserTest, DimsInIndexExpressions) {
  EXPECT_EQ(normalize("function (I[N]) -> (O) { O[i : N] = +(I[N - 1 - i]); }"),
            "function (I[N]) -> (O) {\n  O[i : N] = +(I[-i + N - 1]);\n}\n");
  EXPECT_EQ(normalize("function (I[N]) -> (O) { O[i : N] = +(I[i + div(N + 1, 2) - max(N, 2)]); }"),
            "function (I[N]) -> (O) {\n  O[i : N] = +(I[i + div(N + 1, 2) - max(N, 2)]);\n}\n");
  EXPECT_EQ(normalize("function (I[N], J[N + 1, 2*N]) -> (O) { O = I; }"),
            "function (I[N], J[N + 1, 2*N]) -> (O) {\n  O = I;\n}\n");
}

struct ErrorCase {
  const char* text;
  const char* where;    // "line:col"
  const char* message;  // substring
};

class ParserErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ParserErrorTest, ReportsLineColumnAndNamesTheObject) {
  const ErrorCase& c = GetParam();
  std::string msg = parse_error(c.text);
  EXPECT_NE(msg.find(std::string("t.tile:") + c.where + ": "), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ParserErrorTest,
    ::testing::Values(
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = (I[i]);\n}", "2:14", "expected an aggregation"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(J[i]);\n}", "2:16", "undefined tensor J"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : M] = +(I[i]);\n}", "2:9", "undefined dim M"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(I[i, 0]);\n}", "2:16", "tensor I has rank 1"},
        ErrorCase{"function (I[N, M]) -> (O) {\n  O[i : N] = +(I[i*j, j]);\n}", "2:18", "non-affine index expression i*j"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(I[i/N]);\n}", "2:18", "division by a non-constant"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = foo(I);\n}", "2:7", "unknown intrinsic foo"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = exp(I, I);\n}", "2:7", "takes 1 argument"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = I;\n  O = I;\n}", "3:3", "tensor O is assigned more than once"},
        ErrorCase{"function (I[N], J[N], I[N]) -> (O) { O = I; }", "1:23", "input I is declared twice"},
        ErrorCase{"function (I[N]) -> (O, P) {\n  O = I;\n}", "1:24", "output P is never defined"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = I + X;\n}", "2:11", "undefined name X"},
        ErrorCase{"function (I[N], N[N]) -> (O) {\n  O = I;\n}", "1:17", "has the name of a dim"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(I[0.5*i]);\n}", "2:18", "rational coefficients"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i] = +(I[i]);\n}", "2:6", "has 1 output indices but 0 dims"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(I[i] - I[i]);\n}", "2:21", "expected ')' closing"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = cast(I, u8);\n}", "2:7", "cast takes a value and a dtype"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = I @ I;\n}", "2:9", "unexpected character '@'"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(I[i]), i < 2.5;\n}", "2:27", "dim expressions are integers"},
        ErrorCase{"function (I[N]) -> (O) {\n  O[i : N] = +(I[i]) default Q;\n}", "2:30", "undefined tensor Q"},
        ErrorCase{"function (I[N]) -> (O) {\n  O = I;\n", "3:1", "expected a statement"},
        ErrorCase{"function (I[N]) -> () {\n}", "2:2", "no outputs"},
        ErrorCase{"function (I[99999999999999999999]) -> (O) { O = I; }", "1:13", "too large"}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return "case" + std::to_string(info.index); });

TEST(ParserTest, MissingFileIsAUserErrorNamingIt) {
  try {
    parse_file("/nonexistent/x.tile");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.tile"), std::string::npos);
  }
}

TEST(ParserTest, DeepExpressionsAreUserErrorsNotStackOverflows) {
  // Ten thousand nested parentheses, calls, unary minus signs or chained terms: a clear error each.
  const std::string head = "function (A[N]) -> (O) { O = ", tail = "; }";
  std::string chain;
  for (int k = 0; k < 10000; ++k) chain += "A + ";
  std::string calls;
  for (int k = 0; k < 10000; ++k) calls += "exp(";
  for (const std::string& body : {std::string(10000, '(') + "A" + std::string(10000, ')'), chain + "A",
                                  calls + "A" + std::string(10000, ')'), std::string(10000, '-') + "A"}) {
    try {
      parse_program(head + body + tail, "deep.tile");
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("expression nested more than 256 levels deep"), std::string::npos) << e.what();
    }
  }
  // 200 levels are fine.
  EXPECT_NO_THROW(parse_program(head + std::string(200, '(') + "A" + std::string(200, ')') + tail));
}

}  // namespace
}  // namespace polytile
