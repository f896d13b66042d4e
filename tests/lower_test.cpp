// The lowering pipeline produces exactly what the CPU backend compiles, deterministically, with every pass
// proven under `verify`. (The scheduler's own tests, which need no LLVM, are in scheduler_test.cpp.)
#include <gtest/gtest.h>

#include <random>

#include "generators.h"
#include "polytile/autodiff.h"
#include "polytile/cpu.h"
#include "polytile/lower.h"
#include "polytile/parser.h"
#include "test_util.h"


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


// The loops the scheduler writes for box nests itself (Target::direct_box_loops, box_loops.cpp) are
// isl's: with and without it, every nest of every example and its gradient, of generated contractions
// and of the bench's convolutions has the same loops (print_loops), the same C text and as many
// iterators; and both ways are taken, isl's for everything else.
TEST(LowerTest, BoxLoopsAreIslsLoops) {
  std::vector<std::tuple<std::string, Program, std::map<std::string, TensorType>>> cases;
  auto add = [&cases](const std::string& what, const Program& p, const testing::Shapes& shapes) {
    std::map<std::string, TensorType> inputs;
    for (const auto& [name, dims] : shapes) inputs[name] = {DType::f32, dims};
    cases.emplace_back(what, p, inputs);
    // Its gradient, with each output's adjoint shaped as the output.
    ad::Result grad;
    try {
      grad = ad::vjp(p);
    } catch (const UserError&) {
      return;  // not differentiable (an integer output, a comparison)
    }
    const ProgramTypes types = infer_types(p, inputs);
    std::map<std::string, TensorType> grad_inputs;
    for (const auto& in : grad.program.inputs) {
      if (inputs.count(in.name)) grad_inputs[in.name] = inputs.at(in.name);
      else if (in.name.size() > 1 && types.tensors.count(in.name.substr(1))) grad_inputs[in.name] = types.tensors.at(in.name.substr(1));
    }
    if (grad_inputs.size() == grad.program.inputs.size()) cases.emplace_back(what + " (gradient)", grad.program, grad_inputs);
  };
  for (const auto& [path, shapes] : testing::examples_with_shapes(POLYTILE_SOURCE_DIR "/examples"))
    add(path.filename().string(), parse_file(path.string()), shapes);
  std::mt19937_64 rng(424242);
  for (int k = 0; k < 60; ++k) {
    testing::generators::Case c = testing::generators::any_case(rng);
    add("generated " + std::to_string(k) + " (" + c.kind + ")", parse_program(c.text), c.shapes);
  }
  // The compile bench's convolution (its weight packing and its gradient's transposition) and a 1x1 one.
  const char* conv = "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n"
                     "  O[n, y, x, co : N, 56, 56, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]);\n}\n";
  add("conv 3x3", parse_program(conv), {{"I", {8, 56, 56, 64}}, {"K", {3, 3, 64, 64}}});
  const char* pointwise = "function (I[N, H, W, CI], K[CI, CO]) -> (O) {\n"
                          "  O[n, y, x, co : N, H, W, CO] = +(I[n, y, x, ci] * K[ci, co]);\n}\n";
  add("conv 1x1", parse_program(pointwise), {{"I", {8, 56, 56, 256}}, {"K", {256, 64}}});
  int direct = 0, by_isl = 0;
  for (const auto& [what, program, inputs] : cases) {
    LowerOptions options;
    options.target = cpu::host_target();
    LowerOptions isl_only = options;
    isl_only.target.direct_box_loops = false;
    Lowered a, b;
    try {
      a = lower(program, inputs, options);
    } catch (const UserError&) {
      continue;  // shapes the program refuses
    }
    b = lower(program, inputs, isl_only);
    ASSERT_EQ(a.schedule.nests.size(), b.schedule.nests.size()) << what;
    EXPECT_EQ(print_loops(a.schedule), print_loops(b.schedule)) << what;
    for (size_t k = 0; k < a.schedule.nests.size(); ++k) {
      const Nest& x = a.schedule.nests[k];
      const Nest& y = b.schedule.nests[k];
      EXPECT_EQ(x.ast, y.ast) << what << ": " << x.name;
      EXPECT_EQ(x.iterators, y.iterators) << what << ": " << x.name;
      EXPECT_EQ(x.outer_lo, y.outer_lo) << what << ": " << x.name;
      EXPECT_EQ(x.outer_hi, y.outer_hi) << what << ": " << x.name;
      EXPECT_FALSE(y.direct_loops) << what << ": " << y.name;
      (x.direct_loops ? direct : by_isl) += 1;
    }
  }
  std::cout << direct << " nests with the scheduler's loops, " << by_isl << " with isl's\n";
  EXPECT_GE(direct, 40);
  EXPECT_GE(by_isl, 40);
}

}  // namespace
}  // namespace polytile::sched
