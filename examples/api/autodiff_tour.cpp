// Differentiating Tile programs from C++: a vjp, the gradient of a scalar loss, a full Jacobian, an
// override written in Tile text, forward mode, and an adjoint proven zero.
#include <polytile/autodiff.h>
#include <polytile/interpreter.h>
#include <polytile/parser.h>

#include <iostream>

using namespace polytile;

int main() {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }");
  // 1. function (I, K, DO) -> (DI, DK), reduced and defracted.
  std::cout << print(ad::vjp(conv).program);

  // 2. The gradient of a scalar loss, run by the interpreter.
  Program loss = parse_program("function (X[N]) -> (L) { Y = tanh(X); L[] = +(Y[i]); }");
  ad::Result g = ad::gradient(loss);
  Buffer x = Buffer::from_values(DType::f64, {3}, {0.0, 0.5, 1.0});
  Buffer dx = interpret(g.program, {{"X", x}}).at(g.gradients[0]);
  std::cout << "dL/dX[0] = " << dx.get(0) << "\n";  // 1 - tanh(0)^2 = 1

  // 3. The full Jacobian of Y = tanh(X): shape [3, 3], diagonal.
  ad::Result j = ad::differentiate(loss, "Y");
  std::cout << print(j.program);

  // 4. Override Y's derivative with Tile text (here: pretend tanh' = 2).
  ad::Options options;
  options.overrides["Y"] = ad::Override{{"X"}, [](ad::DerivativeContext& ctx) {
                                          std::string name = ctx.fresh("DX_custom");
                                          ctx.emit(name + " = 2 * " + ctx.head() + ";");
                                          return std::vector<std::string>{name};
                                        }};
  Buffer custom = interpret(ad::gradient(loss, options).program, {{"X", x}}).at("DX");
  std::cout << "overridden dL/dX[1] = " << custom.get(1) << "\n";

  // 5. Forward mode: function (X, TX) -> (TL).
  std::cout << print(ad::jvp(loss).program);

  // 6. Log-softmax: its output does not depend on the row maxima M (shift a row's maximum and the log of
  // the sum moves by as much), so M's adjoint is zero and the gradient has no statement for it.
  Program log_softmax = parse_program(
      "function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M);"
      "  S[i, 0 : N, 1] = +(E[i, j]); O = X - M - log(S); }");
  ad::Result ls = ad::vjp(log_softmax);
  std::cout << print(ls.program) << "adjoints proven zero:";
  for (const auto& t : ls.zero_adjoints) std::cout << " " << t;
  std::cout << "\n";
  return dx.get(0) == 1.0 && custom.get(1) == 2.0 && ls.zero_adjoints == std::vector<std::string>{"M"} ? 0 : 1;
}
