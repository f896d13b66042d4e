// The polyhedral stage of polytile's C++ API: isl analysis of a contraction, the reduce and defract
// passes on the post's gradient (with their isl proofs), and the lattice library underneath.
#include <polytile/lattice.h>
#include <polytile/parser.h>
#include <polytile/passes.h>
#include <polytile/polyhedral.h>
#include <polytile/verify.h>

#include <iostream>

using namespace polytile;

int main() {
  Program grad = parse_program(
      "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {"
      "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]); }");
  ProgramTypes types = infer_types(grad, {{"DO", {DType::f32, {2, 3, 3, 7}}}, {"K", {DType::f32, {2, 2, 5, 7}}}});

  // 1. The contraction as isl sets and maps, with exact bounds.
  std::cout << poly::print_analyses(poly::analyze_program(grad, types));

  // 2. reduce, then defract: single-variable outputs, then integer coefficients and digits.
  const auto& c = std::get<Contraction>(grad.statements[0]);
  poly::PassContext ctx{&types};
  poly::PassResult reduced = poly::reduce(c, ctx);
  poly::PassResult defracted = poly::defract(reduced.contraction, ctx);
  std::cout << print(Statement(reduced.contraction)) << "\n" << print(Statement(defracted.contraction)) << "\n";
  std::cout << "each element written once: " << poly::writes_each_output_once(defracted.contraction, types) << "\n";

  // Translation validation: each pass's change of variables is a bijection of valid points that commutes
  // with every access (an isl proof; a failure would throw InternalError naming the pass).
  poly::RewriteContext proof;
  proof.types = &types;
  poly::verify_rewrite("reduce", c, reduced.contraction, proof, reduced.substitution);
  poly::verify_rewrite("defract", reduced.contraction, defracted.contraction, proof, defracted.substitution);
  std::cout << "reduce and defract proven\n";

  // 3. The lattice behind defract: integer points where 1/3*v1 - 2/3*v4 is an integer.
  auto lat = lattice::integrality_lattice(lattice::RatMatrix{lattice::IntMatrix{{1, -2}}, 3}, {0});
  std::cout << "lattice basis " << lat->basis.str() << "\n";
  lattice::HermiteForm h = lattice::column_hermite(lattice::IntMatrix{{4, 6, 10}});
  std::cout << "hnf " << h.H.str() << " rank " << h.rank << "\n";
  return h.H(0, 0) == 2 ? 0 : 1;
}
