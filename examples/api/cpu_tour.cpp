// Compiling to native code: the schedule (isl schedule tree and loops), the LLVM IR, and a run on the
// CPU checked against the reference interpreter.
#include <polytile/cpu.h>
#include <polytile/interpreter.h>
#include <polytile/parser.h>

#include <cmath>
#include <iostream>

using namespace polytile;

int main() {
  Program matmul = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  std::map<std::string, TensorType> types{{"A", {DType::f32, {96, 64}}}, {"B", {DType::f32, {64, 80}}}};

  cpu::CompileOptions options;
  options.threads = 2;
  auto compiled = cpu::compile(matmul, types, options);
  std::cout << compiled->schedule().tree() << compiled->schedule().ast();
  std::cout << "LLVM IR: " << compiled->llvm_ir().size() << " bytes; compile stages (s): passes "
            << compiled->times().passes << ", schedule " << compiled->times().schedule << ", JIT "
            << compiled->times().optimize_and_jit << "\n";

  Buffer a(DType::f32, {96, 64}), b(DType::f32, {64, 80});
  for (int64_t i = 0; i < a.size(); ++i) a.set(i, (i % 7) * 0.25 - 0.5);
  for (int64_t i = 0; i < b.size(); ++i) b.set(i, (i % 5) * 0.5 - 1.0);
  TensorMap native = compiled->run({{"A", a}, {"B", b}});
  TensorMap oracle = interpret(matmul, {{"A", a}, {"B", b}});
  double worst = 0;
  for (int64_t e = 0; e < native.at("C").size(); ++e)
    worst = std::max(worst, std::fabs(native.at("C").get(e) - oracle.at("C").get(e)));
  std::cout << "largest difference from the interpreter: " << worst << "\n";
  return worst < 1e-4 ? 0 : 1;
}
