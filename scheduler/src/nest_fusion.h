// Private to the scheduler: which statements share a loop nest instead of materializing a tensor between
// them, decided from one pass over who produces and who reads each tensor (nest_fusion.cpp).
#pragma once

#include <map>
#include <set>
#include <string>

#include "polytile/ir.h"
#include "polytile/shapes.h"

namespace polytile::sched::internal {

struct NestFusion {
  // Elementwise consumers that may run as a contraction's epilogue (contraction statement -> consumer):
  // the contraction's output has the consumer's shape, is no program output and is read by nothing else,
  // and every other tensor the consumer reads exists before the contraction runs.
  std::map<size_t, size_t> epilogue_of;
  // Elementwise producers an update evaluates where it reads them (contraction -> input -> producer): read
  // only by that contraction's inputs, not program outputs, cheap (a few operations, no transcendental
  // calls; an input element is read many times), and not an epilogue candidate -- an epilogue
  // materializes its consumer while the contraction it reads stays scratch, so that consumer must be
  // read, not recomputed.
  std::map<size_t, std::map<std::string, size_t>> inlined_into;
  std::set<size_t> inlined;  // the producers of inlined_into: they get no nest of their own
  // Assigns that only permute a contraction's output into another tensor (contraction -> assign; see
  // Nest::permuted_copy): the assign's one input is that output, read at a permutation of the assign's
  // plain index variables, the same dtype (f32 or f64), no program output and read by nothing else, and the
  // contraction has no epilogue consumer. The micro-kernel decides whether it takes it.
  std::map<size_t, size_t> permuted_copy_of;
};

NestFusion plan_nest_fusion(const Program& program, const ProgramTypes& types);

// Cheap enough to compute again wherever it is read: no transcendental call and at most 12 nodes, casts
// not counted (fusion wraps one around every producer it substitutes, most to the value's own dtype).
bool cheap(const Expr& e);

// Whether `e` divides a value that changes from element to element: a division (or remainder) with a leaf
// of `shape`, the expression's own (E / Z divides each element; 1 / S over a row vector S is one division
// a row once LLVM hoists it). Computed where a micro-kernel broadcasts it, each such division is a scalar
// one (attention's P = E / Z in P V: 16 x 512 x 512 x 64, 2.1 ms against 1.37 with P read from memory).
bool divides_each_element(const Expr& e, const ProgramTypes& types, const std::vector<int64_t>& shape);

}  // namespace polytile::sched::internal
