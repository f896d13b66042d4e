// The reference interpreter: the executable definition of Tile semantics (see ir.h) and the oracle that
// every pass and backend is tested against. It favours obvious correctness over speed:
//  * a contraction enumerates integer points of a bounding box of its index variables -- the box comes
//    from interval propagation over every access and constraint, and where that leaves a variable
//    unbounded, from Fourier-Motzkin elimination (the exact rational projection) -- and checks, for each
//    point, the full valid-indices rule (integrality and range of every index expression, every constraint);
//  * values are combined in the combination's dtype, accumulated in double precision in index-variable
//    order (first-appearance order, lexicographic), and rounded once to the output dtype; i32 sums and
//    products are exact and wrap modulo 2^32; a default seeds the accumulator as a value of the output dtype;
//  * max/min propagate NaN; assign raises a UserError with a witness when two valid points target one
//    element (decided before a cond combination is evaluated: the rule is static);
//  * elementwise statements evaluate per element with numpy broadcasting, rounding every intermediate
//    result to its dtype.
#pragma once

#include <map>
#include <string>

#include "polytile/buffer.h"
#include "polytile/ir.h"

namespace polytile {

using TensorMap = std::map<std::string, Buffer>;

struct InterpretOptions {
  bool keep_intermediates = false;  // return every tensor, not only the outputs
};

// Runs `program` on `inputs` (one Buffer per declared input). Returns the outputs by name.
TensorMap interpret(const Program& program, const TensorMap& inputs, const InterpretOptions& options = {});

}  // namespace polytile
