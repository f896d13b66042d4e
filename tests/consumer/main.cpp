// A downstream project: parse a program through the installed package, differentiate it, and run the
// gradient natively; check against the reference interpreter.
#include <polytile/autodiff.h>
#include <polytile/cpu.h>
#include <polytile/interpreter.h>
#include <polytile/parser.h>

#include <iostream>

int main() {
  using namespace polytile;
  Program p = parse_program("function (A[N]) -> (S) { T = A * A; S[] = +(T[i]); }");
  Buffer a = Buffer::from_values(DType::f32, {3}, {1, 2, 3});
  double s = interpret(p, {{"A", a}}).at("S").get(0);
  ad::Result g = ad::gradient(p);
  Buffer da = cpu::run(g.program, {{"A", a}}).at(g.gradients[0]);
  std::cout << print(g.program) << "sum = " << s << ", dS/dA[2] = " << da.get(2) << "\n";
  return s == 14 && da.get(2) == 6 ? 0 : 1;
}
