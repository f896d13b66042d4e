// A tour of polytile's public C++ API: build a program with the eDSL and from text, print it, type it,
// run it with the reference interpreter, save the result as .npy, and compute repeated work once (CSE).
#include <polytile/cse.h>
#include <polytile/edsl.h>
#include <polytile/error.h>
#include <polytile/interpreter.h>
#include <polytile/npy.h>
#include <polytile/parser.h>
#include <polytile/shapes.h>

#include <iostream>

using namespace polytile;

int main() {
  // 1. The eDSL: a size-2, stride-2 max pool, as in the Tile tutorial.
  edsl::Tensor I = edsl::Placeholder("I", 1);
  edsl::TensorDim N("N");
  edsl::TensorIndex i("i"), j("j");
  I.bind_dims(N);
  edsl::Tensor O = edsl::TensorOutput(N / 2).named("O");
  O(i) >= I(2 * i + j);
  O.add_constraint(j < 2);
  Program pool = edsl::make_program("max_pool_1d", {I}, {O});
  std::cout << print(pool);

  // 2. The same program from Tile text prints identically.
  Program parsed = parse_program("function max_pool_1d (I[N]) -> (O) { O[i : N/2] = >(I[2*i + j]), j < 2; }");
  std::cout << (print(parsed) == print(pool) ? "text and eDSL agree\n" : "text and eDSL differ\n");

  // 3. Concrete types for concrete inputs.
  ProgramTypes types = infer_types(pool, {{"I", TensorType{DType::f32, {7}}}});
  std::cout << "O: " << types.tensors.at("O").str() << "\n";
  // A pass that adds a statement types only that statement (the others keep theirs).
  infer_statement_type(Elementwise{"Scaled", Expr::binary(BinaryOp::mul, Expr::tensor("O"), Expr::literal(2, true))}, types);
  std::cout << "Scaled: " << types.tensors.at("Scaled").str() << "\n";

  // 4. Run it, then write the output as .npy.
  Buffer input = Buffer::from_values(DType::f32, {7}, {3, -1, 7, 2, 5, 0, 1});
  TensorMap outputs = interpret(pool, {{"I", input}});
  const Buffer& out = outputs.at("O");
  for (int64_t k = 0; k < out.size(); ++k) std::cout << out.get(k) << (k + 1 < out.size() ? " " : "\n");
  write_npy("max_pool_out.npy", out);
  std::cout << "wrote " << read_npy("max_pool_out.npy").type_str() << "\n";

  // 5. Common subexpressions: the square root is computed once, x*y + x*y is 2 * (x*y).
  Program twice = parse_program(
      "function (X[N], Y[N]) -> (A, B) { A = X * Y + X * Y + X / sqrt(Y * Y + 1); B = exp(X) * sqrt(Y * Y + 1); }");
  std::cout << print(eliminate_common_subexpressions(twice));

  // 6. Bad input is a UserError that names the object.
  try {
    parse_program("function (A[N]) -> (B) { B[i : N] = +(A[i*i]); }", "bad.tile");
  } catch (const UserError& e) {
    std::cout << "error: " << e.what() << "\n";
  }
  return out.get(1) == 7 ? 0 : 1;
}
