// The lowering pipeline on its own (sched::lower, no LLVM): it produces exactly what the CPU backend
// compiles, deterministically, with every pass proven under `verify`; and the loop IR prints.
#include <gtest/gtest.h>

#include <algorithm>

#include "polytile/cpu.h"
#include "polytile/lower.h"
#include "polytile/parser.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

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

// Types are inferred once and carried through the passes: after cond-miss lowering (O_raw, O_hits and a
// ones tensor added), fusion (a chain absorbed) and layouts (a transposed weight copy added) the carried
// types are exactly those of typing the lowered program from scratch, with and without verification.
TEST(LowerTest, CarriedTypesAreTheTypesOfTheLoweredProgram) {
  Program p = parse_program(R"(function (I[N, H, W, CI], K[KH, KW, CI, CO], DO[N, Y, X, CO], A[M], B[M]) -> (DI, O, R) {
    DI[n, j + y - 1, i + x - 1, ci : N, H, W, CI] = +(K[j, i, ci, co] * DO[n, y, x, co]);
    O[m : M] = >(A[m] == B[k] ? A[k]);
    T = exp(A) + 1;
    U = T * 2;
    R = U - B;
  })");
  std::map<std::string, TensorType> inputs{{"I", {DType::f32, {2, 16, 16, 32}}}, {"K", {DType::f32, {3, 3, 32, 32}}},
                                           {"DO", {DType::f32, {2, 16, 16, 32}}}, {"A", {DType::f32, {8}}},
                                           {"B", {DType::f32, {8}}}};
  for (bool verify : {false, true}) {
    LowerOptions options;
    options.verify = verify;
    options.target.cpu.microkernel_min_points = 1;
    Lowered lowered = lower(p, inputs, options);
    const std::string text = print(lowered.program);
    ASSERT_NE(text.find("O_hits"), std::string::npos) << text;  // every pass did something
    ASSERT_EQ(text.find("U = "), std::string::npos) << text;
    ASSERT_NE(text.find("K_T"), std::string::npos) << text;
    ProgramTypes again = infer_types(lowered.program, inputs);
    ASSERT_EQ(lowered.types.tensors.size(), again.tensors.size());
    for (const auto& [name, t] : again.tensors) EXPECT_EQ(lowered.types.tensors.at(name).str(), t.str()) << name;
    EXPECT_EQ(lowered.types.dims, again.dims);
  }
}

// A UserError thrown in the middle of scheduling (the second contraction's assign can write twice, found
// when the scheduler analyzes it, after the first one's micro-kernel nest and its isl objects exist)
// reaches the caller with its message, and every isl object is freed on the way: under AddressSanitizer
// the test asks LeakSanitizer on the spot.
TEST(LowerTest, UserErrorInTheMiddleOfSchedulingLeaksNothing) {
  Program p = parse_program(R"(function (A[M, K], B[K, N]) -> (C, D) {
    C[m, n : M, N] = +(A[m, k] * B[k, n]);
    D[i : M] = =(C[i, j]);
  })");
  std::map<std::string, TensorType> inputs{{"A", {DType::f32, {64, 64}}}, {"B", {DType::f32, {64, 128}}}};
  ProgramTypes types = infer_types(p, inputs);
  Target target;
  target.cpu.microkernel_min_points = 1;
  Program first = parse_program("function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }");
  Schedule before = schedule(first, infer_types(first, inputs), target);
  ASSERT_TRUE(std::any_of(before.nests.begin(), before.nests.end(), [](const Nest& n) { return n.microkernel.has_value(); }));
  try {
    schedule(p, types, target);
    FAIL() << "an assign that writes twice was scheduled";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("assign contraction D can write an element more than once"), std::string::npos)
        << e.what();
  }
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(__lsan_do_recoverable_leak_check(), 0) << "isl objects leaked when scheduling threw";
#endif
}

}  // namespace
}  // namespace polytile::sched
