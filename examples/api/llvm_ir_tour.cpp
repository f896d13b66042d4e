// The shared LLVM IR emitter on its own, as a code generator uses it: schedule a program, emit one
// function per loop nest into a module of your own, and inspect it (here: print the functions and count
// the vector fused multiply-adds of the matmul's micro-kernel).
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <polytile/llvm_ir.h>
#include <polytile/parser.h>
#include <polytile/scheduler.h>

#include <iostream>

using namespace polytile;

int main() {
  Program matmul = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  ProgramTypes types = infer_types(matmul, {{"A", {DType::f32, {96, 64}}}, {"B", {DType::f32, {64, 128}}}});
  sched::Schedule schedule = sched::schedule(matmul, types);

  llvm::LLVMContext context;
  llvm::Module module("matmul", context);
  llvm_ir::emit_nests(module, schedule, types, {{"A", 0}, {"B", 1}, {"C", 2}});
  int fmas = 0;
  for (const auto& f : module) {
    std::cout << (f.isDeclaration() ? "declared " : "defined ") << f.getName().str() << "\n";
    if (f.getName().starts_with("llvm.fmuladd.v")) fmas = static_cast<int>(f.getNumUses());
  }
  std::cout << "vector fused multiply-adds in the micro-kernel: " << fmas << "\n";
  return fmas > 0 ? 0 : 1;
}
