// Translation validation: a pass that rewrites a contraction proves with isl that the rewritten
// contraction denotes the same computation as the original.
//
// A contraction denotes the multiset of tuples (output element, input element 1, ..., input element k)
// over its valid points, folded by its aggregation from its default. Two contractions with the same
// output, shape, aggregation, combination and default denote the same computation when those multisets
// agree. verify_rewrite proves that at the sizes in `types` (verify_rewrite_for_all_sizes for every size
// where isl can express them):
//  * with a Substitution (the old variables as affine functions of the new ones, which reduce and defract
//    report), the map z -> x is injective on the new valid domain, maps it onto the old valid domain, and
//    carries every access of the new contraction to the element the old one reads -- a bijection of
//    valid points that commutes with the accesses, so every tuple keeps its multiplicity;
//  * without one, both point -> tuple maps must be injective and have the same image.
// A tensor the rewrite introduced may stand for one of the original's: `copies` names tensors defined by
// an assign copy (P[vb, vl] = =(B[16*vb + vl]) of a layout pass), whose accesses are composed with the
// copy; `renamed` names tensors that stand elementwise for another of the same shape (a ones tensor for
// a count). A failed proof throws InternalError naming the pass and the contraction: never a silently
// different program.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "polytile/ir.h"
#include "polytile/shapes.h"

namespace polytile::poly {

struct Substitution {
  std::vector<std::string> old_variables;  // the original contraction's index variables
  std::vector<Polynomial> values;          // each as a polynomial of the rewritten contraction's variables
};

// The substitution of a rewrite that keeps the variables: each one stands for itself.
Substitution identity_substitution(const Contraction& c);

struct RewriteContext {
  const ProgramTypes* types = nullptr;               // sizes of every tensor either contraction reads
  std::map<std::string, const Contraction*> copies;  // tensor -> its defining assign copy
  std::map<std::string, std::string> renamed;        // tensor -> the original tensor it stands for
};

void verify_rewrite(const std::string& pass, const Contraction& before, const Contraction& after,
                    const RewriteContext& ctx, const std::optional<Substitution>& substitution = std::nullopt);

// The same proof for every size at once: dims stay isl parameters (each >= 0), tensors have the symbolic
// shapes in `shapes` (inputs as declared, contraction outputs as written). Returns false, proving
// nothing, where isl cannot express a size or an index (a product of dims, max, min, a tensor whose shape
// is unknown); a refutation throws InternalError as verify_rewrite does.
bool verify_rewrite_for_all_sizes(const std::string& pass, const Contraction& before, const Contraction& after,
                                  const std::map<std::string, std::vector<DimExpr>>& shapes, const Substitution& substitution);

}  // namespace polytile::poly
