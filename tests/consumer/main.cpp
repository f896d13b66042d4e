// A downstream project: parse a program through the installed package and run it.
#include <polytile/interpreter.h>
#include <polytile/parser.h>

#include <iostream>

int main() {
  polytile::Program p = polytile::parse_program("function (A[N]) -> (S) { S[] = +(A[i]); }");
  polytile::Buffer a = polytile::Buffer::from_values(polytile::DType::f32, {3}, {1, 2, 3});
  double s = polytile::interpret(p, {{"A", a}}).at("S").get(0);
  std::cout << polytile::print(p) << "sum = " << s << "\n";
  return s == 6 ? 0 : 1;
}
