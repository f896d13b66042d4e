// The shared LLVM IR emitter on its own, as a code generator uses it: schedule a program, emit one
// function per loop nest into a module of your own, and inspect it (here: print the functions and count
// the vector fused multiply-adds of the matmul's micro-kernel); then one nest with its border blocks
// outlined into a module of their own.
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

  // 98 rows: the last block of rows is partial, so the micro-kernel has border blocks, which can be a
  // function of their own in another module (another context: compiled on another thread).
  ProgramTypes odd = infer_types(matmul, {{"A", {DType::f32, {98, 64}}}, {"B", {DType::f32, {64, 128}}}});
  sched::Schedule outlined = sched::schedule(matmul, odd);
  const sched::Nest& update = outlined.nests.back();
  llvm::LLVMContext main_context, border_context;
  llvm::Module main_module("main", main_context), border_module("border", border_context);
  const std::map<std::string, int> buffers{{"A", 0}, {"B", 1}, {"C", 2}};
  llvm_ir::emit_nest(main_module, update, "update", odd, buffers, /*outline=*/true);
  const size_t parts = llvm_ir::separate_parts(update);
  for (size_t j = 0; j < parts; ++j) llvm_ir::emit_nest_part(border_module, update, "update", j, odd, buffers);
  std::cout << "separate border blocks: " << parts << "\n";
  for (const auto& f : border_module)
    if (!f.isDeclaration()) std::cout << "defined in the border module: " << f.getName().str() << "\n";
  return fmas > 0 && parts > 0 ? 0 : 1;
}
