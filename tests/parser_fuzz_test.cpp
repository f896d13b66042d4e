// Robustness: mutated and truncated Tile programs either parse -- and then print to a fixed point and
// type-check without internal errors -- or fail with a UserError. Never a crash or an InternalError.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "polytile/error.h"
#include "polytile/parser.h"
#include "polytile/shapes.h"

namespace polytile {
namespace {

std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  for (const auto& entry : std::filesystem::directory_iterator(POLYTILE_SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".tile") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    texts.push_back(ss.str());
  }
  std::sort(texts.begin(), texts.end());
  return texts;
}

std::string mutate(std::string s, std::mt19937_64& rng) {
  static const std::string alphabet = "()[]{},;:+-*/%<>=!?&|.#_ 0123456789ijkNMOIx\n";
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    size_t pos = rng() % s.size();
    switch (rng() % 4) {
      case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
      case 1: s.erase(pos, 1 + rng() % 3); break;
      case 2: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      case 3: s = s.substr(0, pos); break;
    }
  }
  return s;
}

TEST(ParserFuzzTest, MutantsParseCleanlyOrFailWithAUserError) {
  const uint64_t seed = 20261121;
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::vector<std::string> texts = corpus();
  ASSERT_FALSE(texts.empty());
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = mutate(texts[rng() % texts.size()], rng);
    Program p;
    try {
      p = parse_program(text, "mutant.tile");
    } catch (const UserError&) {
      ++rejected;
      continue;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << " (seed " << seed << "): " << e.what() << "\n" << text;
    }
    ++parsed;
    std::string once = print(p);
    ASSERT_EQ(print(parse_program(once, "reprinted")), once) << "iteration " << iter << "\n" << text;
    // Type-check with small shapes: only UserErrors may come out.
    std::map<std::string, TensorType> inputs;
    for (const auto& in : p.inputs) inputs[in.name] = TensorType{DType::f32, std::vector<int64_t>(in.dims.size(), 3)};
    try {
      infer_types(p, inputs);
    } catch (const UserError&) {
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": " << e.what() << "\n" << text;
    }
  }
  std::cout << parsed << " mutants parsed, " << rejected << " rejected\n";
  EXPECT_GT(parsed, 50);
  EXPECT_GT(rejected, 1000);
}

// Inputs libFuzzer found (fuzz/parser_fuzzer): each must print to text that parses back to itself.
TEST(ParserFuzzTest, LibFuzzerFindingsRoundTrip) {
  const char* findings[] = {
      // A product of dims with a negated factor printed as K1*-X1, which parsed back as K1*-1*X1.
      "function complex_conv_2d (I[N, X0, X1, G, GCI], K[K0, K1, G, GCI, GCO]) -> (O) {\n"
      "  O[n, x0, x1, g, gco : N, (X0 + 1)/2, (X1 + 2)/3, G, GCO] = +(I[n, - div(((X0 + 1)/2)* 21-  + 2*(K0 - 1) + 1 - X0, "
      "2), k1 + 3*x1 - div(((X1 + 2)/3 - 1)*3 + K1*- X1, 1), g, gci] * K[k0, k1, g, gci, gco]);\n}\n",
      "function (A[N, M]) -> (O) { O[i : N*-M + 2*N*M] = +(A[i, j - N*-1]); }",
      // A floor division inside a product of dims printed with `/`, which an index expression reads as
      // rational division: it now prints as div(a, b).
      "function complexnv_2d (I[N, X0, X1, G, GCI], K[K0, K1, G, GCI, GCO]) -> (O) {\n"
      "  O[n, x0, x1, g, gco : N, (X0 + 0)/2, (X1 + 2)/3, G, GCO] = +(I[n,+ 2*x0 - div(((X0 + 1)/2 + 1)*2 / 2*(K0 - 1) + "
      "0 - X0, 1), k1 + 3*x1 - min(((X1 + 2)/3 / 1)*3 + K1 - X1, 2), g, gck0i] * K[k0, kg,1 , gci, gco]);\n}\n",
  };
  // Products of dims whose factors are sums: printed as div(X, 1), read back node for node.
  const char* products[] = {
      "function complexo_cnv_2d (I[N, X0, X1, G, GCI], K[K0, GCO]) -> (O) {\n"
      "  O[n, x0, x1, g, gco : N, (X0 + 0)/2, (X1 + 2)/3, G, GCO] = +(I[n, 2*k0 + 2*x0 - div(((X0 + 0)/2 - 1)*2 + 2*(K0 - 1) +0 "
      "- X0, 1), k1 + 3*x1 - div(((X1 + 2)/3 - 1)*2 + 2*(K0 - 1) +  X0, 1), k1 + 2*k0- div(((X0 + 0)/2 - 1)*2 * 2*(K0 - 1) +  "
      "- X0, 1), k1 - digco]);\n}\n",
      "function (A[N, M]) -> (O) { O[i : N] = +(A[i, (N - 1)*(M + 2) - 3*(N - 1)*M + j]), j < 2; }",
  };
  for (const char* text : products) {
    std::string once = print(parse_program(text));
    EXPECT_EQ(print(parse_program(once)), once) << text;
  }
  // A floor division of a dim by a zero constant is refused when parsed (it printed as .../0, which does not parse).
  EXPECT_THROW(parse_program("function (A[N]) -> (O) { O[i : N] = +(A[i + div(N + 1, 2 - 2)]); }"), UserError);
  // A real literal beyond double precision is refused (it printed as `inf`, which is no literal).
  EXPECT_THROW(parse_program("function (A[N]) -> (O) { O = A * 0.007936506e98507936; }"), UserError);
  for (const char* text : findings) {
    std::string once = print(parse_program(text));
    EXPECT_EQ(print(parse_program(once)), once) << text;
  }
}

}  // namespace
}  // namespace polytile
