// What the scheduler's own loop writers share (box_loops.cpp, step_loops.cpp): integers read from isl,
// loop expressions, and a tree's chain of marks and bands with its marks placed on loops.
#pragma once

#include <isl/val.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nest_builder.h"

namespace polytile::sched::internal::direct {

// The value of `v` (taken) when it is an integer that fits, else nullopt.
std::optional<int64_t> small_int(isl_val* v);

// The one affine piece of a band member (the caller frees it), or null when it has several or none.
isl_aff* single_aff(const isl::union_pw_aff& upa);
// The one integer division of `aff` with a nonzero coefficient: -1 when there is none, -2 when several.
int used_division(isl_aff* aff);

// A band member as floor((a . d + b) / T), T >= 1, over the domain's n variables d: an affine function of
// them without parameters (T = 1), or the floor of one alone (coefficient 1, no other term). nullopt
// for anything else.
struct Affine {
  std::vector<int64_t> a;
  int64_t b = 0, T = 1;
};
std::optional<Affine> affine_member(const isl::union_pw_aff& upa, int n);

LoopExpr constant(int64_t v);
LoopExpr iterator(int k);
LoopExpr op(LoopExpr::Kind kind, LoopExpr a, LoopExpr b);

// The marks and bands from the root's child down to the leaf, each with one child, every band member
// with isl's default loop types and no AST options. nullopt for a tree with any other node.
struct BandChain {
  std::vector<isl::union_pw_aff> members;            // every band's members, outermost first
  std::map<size_t, std::vector<std::string>> marks;  // schedule dimension -> the marks just above it
  std::vector<bool> parallel;                        // per dimension: a band's first member under a parallel mark
};
std::optional<BandChain> band_chain(const isl::schedule& tree, const StatementIds& ids);

// The marks on the loops that are made (`has_loop` per schedule dimension): a mark goes with the next loop
// and so does a parallel mark's claim; `leaf` holds those under the last loop.
struct LoopMarks {
  std::vector<std::vector<std::string>> marks;  // per loop made
  std::vector<bool> parallel;                   // per loop made
  std::vector<std::string> leaf;
};
LoopMarks loop_marks(const BandChain& chain, const std::vector<bool>& has_loop);

}  // namespace polytile::sched::internal::direct
