// Build-internal (never installed): the contraction analysis of polyhedral.h as isl objects in the
// caller's isl context, so that the scheduler builds on the sets and maps themselves instead of their
// text. The public analyze() is this with a context of its own, printed.
#pragma once

#include <vector>

#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"

namespace polytile::poly::internal {

struct IslAnalysis {
  ContractionAnalysis summary;  // bounds and emptiness (not the isl text of the objects below)
  isl::set domain;              // S_<output>[index variables]
  isl::map write;               // domain -> output element
  std::vector<isl::map> reads;  // domain -> input element, one per access
  // The same accesses as functions of the index variables, not restricted to the domain (the footprint
  // of a box of points, even where some are invalid).
  isl::map write_function;
  std::vector<isl::map> read_functions;
};

// analyze() of polyhedral.h, with every isl object in `ctx` (which must outlive the result), not printed.
// Without `accesses`, only the domain, its bounds and emptiness (and the user errors about them): the
// write and read maps stay null and an assign is not checked for writing an element twice.
IslAnalysis analyze(const Contraction& c, const ProgramTypes& types, const isl::ctx& ctx, bool accesses = true);

// The domain's bounds and emptiness alone, in a context of its own: what the passes that size things
// need, for half the isl work of analyze() and none of its printing.
ContractionAnalysis bounds_of(const Contraction& c, const ProgramTypes& types);

// writes_each_output_once() of polyhedral.h on the domain an analysis of `c` already built.
bool writes_each_output_once(const Contraction& c, const ProgramTypes& types, const IslAnalysis& analysis);

}  // namespace polytile::poly::internal
