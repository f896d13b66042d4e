// Private: derivatives of elementwise expressions, shared by reverse and forward mode.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "polytile/ir.h"

namespace polytile::ad {

// Short builders for the expressions the rules write.
inline Expr T(const std::string& name) { return Expr::tensor(name); }
inline Expr lit(double v) { return Expr::literal(v, false); }
inline Expr ilit(int64_t v) { return Expr::literal(static_cast<double>(v), true); }
inline Expr bin(BinaryOp op, const Expr& a, const Expr& b) { return Expr::binary(op, a, b); }
inline Expr sel(const Expr& c, const Expr& t, const Expr& f) { return Expr::call(Intrinsic::select, {c, t, f}); }

// Whether the node is piecewise constant, its derivative zero in every argument: comparisons, logical
// operators, sign, floor, ceil, round, casts to integers.
bool piecewise_constant(const Expr& node);

// d(node)/d(node.args()[i]) as an expression over the node's arguments; nullopt when it is zero
// (piecewise-constant nodes, a select's condition).
std::optional<Expr> partial(const Expr& node, size_t i);

// g * p, simplified (p for g == 1, g for p == 1, -g for p == -1, 0 for either 0, pushed into a select on
// either side so that masks never multiply).
Expr times(const Expr& g, const Expr& p);

// The adjoint reaching each tensor leaf of `e` when `g` is the adjoint of `e`, added to
// contributions[tensor]: g times d(e)/d(leaf), the leaf's derivative taken in forward mode (tangent, the
// leaf's tangent 1, the others' 0). One product by g per tensor rather than one per occurrence, and the
// occurrences' chain rule shares its factors: the GELU's X * X * X differentiates to (X + X) * X + X * X
// inside one factor, where pushing g down the tree (reverse accumulation) multiplied g by the whole path
// at each of the five occurrences of X.
void backprop(const Expr& e, const Expr& g, std::map<std::string, Expr>& contributions);

// Forward mode: the tangent of `e` given the tangents of its tensor leaves (nullopt: zero).
std::optional<Expr> tangent(const Expr& e, const std::function<std::optional<Expr>(const std::string&)>& tangent_of);

}  // namespace polytile::ad
