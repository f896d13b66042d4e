// Tile text front end.
//
//   function [NAME] (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
//     O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);
//     P[i : N/2] = >(I[2*i + j]), j < 2;          // constraints follow the aggregation
//     S[i : N] = +(I[i, j]), j < M default D;       // optional default (init) tensor
//     E = exp(A) + select(A < 0, -A, 2.5 * B);     // elementwise with broadcasting
//   }
//
// Aggregation markers: + (sum), * (product), > (max), < (min), = (assign). Combinations inside the
// parentheses: a single access, A * B, A + B, A == B, A == B ? C. Index expressions are affine with
// rational coefficients ("/" divides exactly: (i - j + 1)/2 is valid only where it is an integer); dims
// may appear in them, and div(a, b), max(a, b), min(a, b) are dim-valued functions there. In shapes and
// constraint bounds "/" is floor division. Comments start with // or #.
#pragma once

#include <string>

#include "polytile/error.h"
#include "polytile/ir.h"

namespace polytile {

// Parses one function. Errors are UserError("SOURCE:LINE:COL: message").
Program parse_program(const std::string& text, const std::string& source_name = "<input>");

// Parses statements (Tile body text) in the context of an existing program: they may use its inputs,
// dims and tensors. Returns the new statements only.
std::vector<Statement> parse_statements(const std::string& body, const Program& context,
                                        const std::string& source_name = "<statements>");

// Reads a file and parses it; a missing or unreadable file is a UserError naming it.
Program parse_file(const std::string& path);

}  // namespace polytile
