// Contractions as integer sets. For a contraction with concrete shapes, the iteration domain is the isl
// set of integer points of its index variables at which every index expression (output included) is an
// integer in range and every constraint holds; each access is an isl map from that domain to the tensor's
// index space. Everything here is exact (isl), and isl stays behind this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "polytile/ir.h"
#include "polytile/shapes.h"

namespace polytile::poly {

struct VariableBounds {
  std::string name;
  int64_t min = 0, max = 0;  // inclusive, exact
};

struct ContractionAnalysis {
  std::string output;
  bool empty = false;                  // no valid point: the output is all zeros (or its default)
  std::vector<VariableBounds> bounds;  // per index variable; empty when the domain is empty
  std::string domain;                  // isl syntax
  std::string write;                   // isl map: domain -> output element
  std::vector<std::string> reads;      // isl maps: domain -> input element, one per access
};

// Builds the domain and accesses of `c` under `types` (from infer_types). UserError when a variable is
// unbounded, or when an assign (=) contraction can write an element twice: the message names the output
// and shows a witness, two index points that write the same element.
ContractionAnalysis analyze(const Contraction& c, const ProgramTypes& types);

// Every contraction of a program, in order.
std::vector<ContractionAnalysis> analyze_program(const Program& p, const ProgramTypes& types);

// isl text of a program's analyses, for `polytile lower --emit isl`.
std::string print_analyses(const std::vector<ContractionAnalysis>& analyses);

// The isl proof behind defract: every output element is written by exactly one tuple of values of the
// variables that appear in the output indices (over the domain's projection onto them).
bool writes_each_output_once(const Contraction& c, const ProgramTypes& types);

}  // namespace polytile::poly
