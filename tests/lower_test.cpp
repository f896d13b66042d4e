// The lowering pipeline on its own (sched::lower, no LLVM): it produces exactly what the CPU backend
// compiles, deterministically, with every pass proven under `verify`; and the loop IR prints.
#include <gtest/gtest.h>

#include "polytile/cpu.h"
#include "polytile/lower.h"
#include "polytile/parser.h"

namespace polytile::sched {
namespace {

TEST(LowerTest, IsWhatTheCpuBackendCompilesAndIsDeterministic) {
  Program conv = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  std::map<std::string, TensorType> inputs{{"I", {DType::f32, {2, 9, 9, 5}}}, {"K", {DType::f32, {2, 2, 5, 7}}}};
  LowerOptions options;
  options.verify = true;
  Lowered a = lower(conv, inputs, options), b = lower(conv, inputs, options);
  EXPECT_EQ(print(a.program), print(b.program));
  EXPECT_EQ(a.schedule.tree(), b.schedule.tree());
  EXPECT_EQ(print_loops(a.schedule), print_loops(b.schedule));
  cpu::CompileOptions compile_options;
  compile_options.target = options.target;
  auto compiled = cpu::compile(conv, inputs, compile_options);
  EXPECT_EQ(print(compiled->program()), print(a.program));
  EXPECT_EQ(compiled->schedule().tree(), a.schedule.tree());
  EXPECT_EQ(compiled->schedule().ast(), a.schedule.ast());
}

TEST(LowerTest, CondMissLoweringSplitsMaxMinAndProductOfConds) {
  Program p = parse_program("function (A[N], B[N], C[N]) -> (O) { O[i : N] = >(A[i] == B[j] ? C[j]); }");
  Program lowered = lower_cond_misses(p, nullptr);
  std::string text = print(lowered);
  EXPECT_NE(text.find("O_raw[i : N] = >(A[i] == B[j] ? C[j]);"), std::string::npos) << text;
  EXPECT_NE(text.find("O_hits[i : N] = +(A[i] == B[j] ? ONES_C[j]);"), std::string::npos) << text;
  EXPECT_NE(text.find("O = select(O_hits == 0, 0, O_raw);"), std::string::npos) << text;
  // Proven at concrete sizes; a sum needs no lowering.
  std::map<std::string, TensorType> in{{"A", {DType::f32, {4}}}, {"B", {DType::f32, {4}}}, {"C", {DType::f32, {4}}}};
  EXPECT_NO_THROW(lower_cond_misses(p, &in));
  Program sum = parse_program("function (A[N], B[N], C[N]) -> (O) { O[i : N] = +(A[i] == B[j] ? C[j]); }");
  EXPECT_EQ(print(lower_cond_misses(sum, &in)), print(sum));
}

}  // namespace
}  // namespace polytile::sched
