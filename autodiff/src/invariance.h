// Private: adjoints that are zero in exact arithmetic, proven from the forward program alone.
//
// The adjoint of an intermediate tensor M is the derivative of the differentiated outputs with respect to M,
// every other input of M's consumers held fixed. It is zero wherever the outputs do not change when M moves
// at all: softmax's row maxima, subtracted from a row before its exponentials and cancelled by the
// normalization (exp(X - M) / sum(exp(X - M)) = exp(X) / sum(exp(X)) for every M), and log-softmax's
// (X - M - log(sum(exp(X - M))) = X - log(sum(exp(X)))). Computed in floating point, the adjoint that the
// rules emit for such an M is rounding noise, and it costs a reduction, a comparison per element and a
// scatter to the maxima's arguments.
//
// The proof moves M by an arbitrary shift d (M + d, one value of d per element of M) and follows the
// perturbation forward through the statements, exactly (as real numbers), as one of:
//   none          the tensor does not change;
//   shift(p)      every element t changes by + p * d(at(t));
//   scale(p)      every element t is multiplied by exp(p * d(at(t)));
// with p a rational power and `at` the element of M (affine in t) whose shift moves element t. Rules:
// exp(shift) = scale, log(scale) = shift, shifts add and subtract, scales multiply and divide (powers add
// and subtract), a shift times or over a dyadic literal scales its power, a scale passes through sqrt (half
// the power), abs, relu, and max, min and select of equal perturbations, and a positive factor leaves
// sums, maxima and minima of a contraction whose output indices determine `at` (an element no point
// writes stays 0, which any scale keeps). What the rules give derivative zero (derivatives.h
// piecewise_constant: comparisons, logical operators, sign, floor, ceil, round, casts to integers; and
// `==` combinations) stops a perturbation, as it stops an adjoint: the
// claim is about the derivative, which those pieces do not pass. Anything else a perturbation reaches is
// unknown. M's adjoint is zero when every observed output ends as none. Broadcasting follows the symbolic
// shapes: a dim of 1 reads element 0, an equal dim the same index, any other pair is unknown.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "polytile/ir.h"

namespace polytile::ad {

struct InvarianceQuery {
  const Program* program = nullptr;                                 // the forward program
  const std::map<std::string, std::vector<DimExpr>>* shapes = nullptr;  // every tensor's symbolic shape
  std::set<std::string> observed;  // the outputs whose derivatives are taken (those with a head)
  std::set<std::string> constant;  // tensors treated as constants (stop_gradient): no perturbation passes
  std::set<std::string> opaque;    // statement outputs whose derivative is the user's (overrides): unknown
                                   // as soon as a perturbation reaches an operand or a dependency
  std::map<std::string, std::vector<std::string>> dependencies;  // of each opaque output
};

// The candidates (statement outputs of the program, observed outputs aside) by any shift of which every
// observed output is unchanged: their adjoints are zero in exact arithmetic.
std::set<std::string> tensors_observed_outputs_ignore(const InvarianceQuery& query, const std::set<std::string>& candidates);

}  // namespace polytile::ad
