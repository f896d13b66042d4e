// The lowering pipeline produces exactly what the CPU backend compiles, deterministically, with every pass
// proven under `verify`. (The scheduler's own tests, which need no LLVM, are in scheduler_test.cpp.)
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

}  // namespace
}  // namespace polytile::sched
