// libFuzzer target: Tile text through the parser and printer. Any input either parses or is a UserError;
// a parsed program prints to text that parses back to the same text. Anything else (a crash, another
// exception, a printer/parser disagreement) aborts, and libFuzzer keeps the input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "polytile/error.h"
#include "polytile/parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  polytile::Program p;
  try {
    p = polytile::parse_program(text, "fuzz.tile");
  } catch (const polytile::UserError&) {
    return 0;
  }
  const std::string printed = polytile::print(p);
  try {
    if (polytile::print(polytile::parse_program(printed, "printed.tile")) == printed) return 0;
  } catch (const polytile::UserError& e) {
    std::fprintf(stderr, "printed text does not parse: %s\n%s\n", e.what(), printed.c_str());
    std::abort();
  }
  std::fprintf(stderr, "print(parse(print(p))) != print(p):\n%s\n", printed.c_str());
  std::abort();
}
