// Concrete typing of a Program: given the dtypes and shapes of its inputs, bind every dim, compute the
// dtype and shape of every tensor, and check everything that depends on sizes (repeated dims agree,
// dims are positive, broadcasting is possible). Dtype rules are those documented in ir.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "polytile/ir.h"

namespace polytile {

struct TensorType {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::string str() const;  // "f32[2, 3]"
  int64_t bytes() const;     // of its elements
};

struct ProgramTypes {
  std::map<std::string, int64_t> dims;        // every bound dim
  std::map<std::string, TensorType> tensors;  // inputs and every statement output
};

// UserError naming the input, dim or tensor on any mismatch.
ProgramTypes infer_types(const Program& program, const std::map<std::string, TensorType>& inputs);

// Types one statement whose operands `types` already has and records its output there: what a pass
// that adds statements does instead of typing the whole program again. UserError as infer_types.
void infer_statement_type(const Statement& statement, ProgramTypes& types);

// numpy broadcasting of two shapes; UserError mentioning `what` when incompatible.
std::vector<int64_t> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                      const std::string& what);

// Shape of an elementwise expression: numpy broadcasting of the shapes of the tensors it reads; UserError
// mentioning `what` when they are incompatible.
std::vector<int64_t> expr_shape(const Expr& e, const std::map<std::string, TensorType>& tensors, const std::string& what);

// Dtype and weakness of an elementwise expression (weak = built from literals and dims only).
struct ExprType {
  DType dtype;
  bool weak;
};
ExprType expr_type(const Expr& e, const std::map<std::string, TensorType>& tensors);
// The type in which a binary operation's operands are combined.
ExprType combine_types(ExprType a, ExprType b);

}  // namespace polytile
