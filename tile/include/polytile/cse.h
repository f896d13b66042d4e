// Common-subexpression elimination on Programs: what is computed twice is computed once.
//
//  * Identical statements: two contractions equal up to the names of their index variables, or two
//    elementwise statements with the same expression, over the same operands (after earlier merges), are
//    one; later readers read the first. A duplicate that is a program output becomes ident(first).
//  * A subexpression equal to an earlier elementwise statement's whole expression (a gradient's
//    sqrt(V + eps) that the forward pass already stored) reads that tensor instead. Only subtrees that
//    read a tensor are replaced (a subtree of literals adopts its surroundings' type; a tensor would not).
//  * e + e becomes 2 * e (x*y + x*y computes x*y once), exact in every dtype.
//  * A transcendental call (sqrt, exp, ...) repeated among the elementwise statements is computed once, by
//    a statement CSE<k> of its own before its first reader.
//  * Statements no output depends on are dropped.
// Values are unchanged bit for bit: the interpreter rounds every intermediate to its dtype, which a stored
// tensor of the same expression holds.
#pragma once

#include "polytile/ir.h"

namespace polytile {

Program eliminate_common_subexpressions(const Program& program);

}  // namespace polytile
