// The lowering pipeline produces exactly what the CPU backend compiles, deterministically, with every pass
// proven under `verify`. (The scheduler's own tests, which need no LLVM, are in scheduler_test.cpp.)
#include <gtest/gtest.h>

#include <random>

#include "generators.h"
#include "loop_runner.h"
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


// Programs to lower two ways: `what`, the program and its inputs' types.
using LoweringCase = std::tuple<std::string, Program, std::map<std::string, TensorType>>;

// Adds a program and, where it has one, its gradient (each output's adjoint shaped as the output).
void add_with_gradient(std::vector<LoweringCase>& cases, const std::string& what, const Program& p, const testing::Shapes& shapes) {
  std::map<std::string, TensorType> inputs;
  for (const auto& [name, dims] : shapes) inputs[name] = {DType::f32, dims};
  cases.emplace_back(what, p, inputs);
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
}

// Every example and `generated` generated contractions (from `seed`), each with its gradient.
std::vector<LoweringCase> examples_and_generated(uint64_t seed, int generated) {
  std::vector<LoweringCase> cases;
  for (const auto& [path, shapes] : testing::examples_with_shapes(POLYTILE_SOURCE_DIR "/examples"))
    add_with_gradient(cases, path.filename().string(), parse_file(path.string()), shapes);
  std::mt19937_64 rng(seed);
  for (int k = 0; k < generated; ++k) {
    testing::generators::Case c = testing::generators::any_case(rng);
    add_with_gradient(cases, "generated " + std::to_string(k) + " (" + c.kind + ")", parse_program(c.text), c.shapes);
  }
  return cases;
}

// The CPUs the loop tests lower for, whatever this machine is: an AVX-512 core (32 zmm registers) and an
// AVX2 one (16 ymm registers), with fixed caches and 2 threads -- the micro-kernel plans, and so which
// nests take which path, differ between the two.
std::vector<Target> fixed_cpu_targets() {
  std::vector<Target> targets;
  for (const char* spec : {"skylake-avx512,l1=32K,l2=1M,l3=32M", "znver3,l1=32K,l2=512K,l3=32M"}) {
    Target t = cpu::cpu_target(spec);
    t.threads = 2;
    targets.push_back(t);
  }
  return targets;
}

// The loops the scheduler writes for box nests itself (Target::direct_box_loops, box_loops.cpp) are
// isl's: with and without it, every nest of every example and its gradient, of generated contractions
// and of the bench's convolutions has the same loops (print_loops), the same C text and as many
// iterators; and both ways are taken, isl's for everything else.
TEST(LowerTest, BoxLoopsAreIslsLoops) {
  std::vector<LoweringCase> cases = examples_and_generated(424242, 60);
  auto add = [&cases](const std::string& what, const Program& p, const testing::Shapes& shapes) { add_with_gradient(cases, what, p, shapes); };
  // The compile bench's convolution (its weight packing and its gradient's transposition) and a 1x1 one.
  const char* conv = "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n"
                     "  O[n, y, x, co : N, 56, 56, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]);\n}\n";
  add("conv 3x3", parse_program(conv), {{"I", {8, 56, 56, 64}}, {"K", {3, 3, 64, 64}}});
  const char* pointwise = "function (I[N, H, W, CI], K[CI, CO]) -> (O) {\n"
                          "  O[n, y, x, co : N, H, W, CO] = +(I[n, y, x, ci] * K[ci, co]);\n}\n";
  add("conv 1x1", parse_program(pointwise), {{"I", {8, 56, 56, 256}}, {"K", {256, 64}}});
  for (const Target& target : fixed_cpu_targets()) {
    int direct = 0, by_isl = 0;
    for (const auto& [what, program, inputs] : cases) {
      LowerOptions options;
      options.target = target;
      options.target.direct_step_loops = false;  // micro-kernels' steps: StepLoopsRunIslsSteps
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
    std::cout << target.cpu_name << ": " << direct << " nests with the scheduler's loops, " << by_isl << " with isl's\n";
    EXPECT_GE(direct, 40) << target.cpu_name;
    EXPECT_GE(by_isl, 40) << target.cpu_name;
  }
}

// The loops the scheduler writes around a micro-kernel's steps and for each step's fma loops
// (Target::direct_step_loops, step_loops.cpp) run what isl's loops run, in the same order: every micro-kernel nest of the
// examples and their gradients, of generated contractions, of convolutions and matrix products of the
// bench's kinds (borders, strides, dilation, channels that blocks do not divide), lowered both ways (for an
// AVX-512 and an AVX2 CPU, whichever this machine is) and
// run on integers, gives the same statements (zero, load, fma, store, epilogue; predicated or not) with
// the same arguments in the same order; and most of them take the new path.
TEST(LowerTest, StepLoopsRunIslsSteps) {
  std::vector<LoweringCase> cases = examples_and_generated(777, 40);
  auto add = [&cases](const std::string& what, const Program& p, const testing::Shapes& shapes) { add_with_gradient(cases, what, p, shapes); };
  auto conv = [](int stride, int dilation, int pad, int oh) {
    auto s = [](int v) { return std::to_string(v); };
    const std::string p = pad ? " - " + s(pad) : "";
    return parse_program("function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n  O[n, y, x, co : N, " + s(oh) + ", " + s(oh) +
                         ", CO] = +(I[n, " + s(stride) + "*y + " + s(dilation) + "*j" + p + ", " + s(stride) + "*x + " +
                         s(dilation) + "*i" + p + ", ci] * K[j, i, ci, co]);\n}\n");
  };
  add("conv 3x3 64 on 20x20", conv(1, 1, 1, 20), {{"I", {2, 20, 20, 64}}, {"K", {3, 3, 64, 64}}});
  add("conv 3x3 96 on 9x9", conv(1, 1, 1, 9), {{"I", {2, 9, 9, 96}}, {"K", {3, 3, 96, 96}}});
  add("conv 3x3 256 on 6x6", conv(1, 1, 1, 6), {{"I", {2, 6, 6, 256}}, {"K", {3, 3, 256, 256}}});
  add("conv 3x3 stride 2", conv(2, 1, 1, 10), {{"I", {2, 20, 20, 64}}, {"K", {3, 3, 64, 64}}});
  add("conv 2x2 stride 3 dilation 2", conv(3, 2, 0, 7), {{"I", {2, 22, 22, 64}}, {"K", {2, 2, 64, 64}}});
  add("conv 1x1", conv(1, 1, 0, 14), {{"I", {2, 14, 14, 256}}, {"K", {1, 1, 256, 64}}});
  const char* matmul = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }";
  add("matmul 96x200x130", parse_program(matmul), {{"A", {96, 200}}, {"B", {200, 130}}});
  add("matmul 256", parse_program(matmul), {{"A", {256, 256}}, {"B", {256, 256}}});
  // The statements a nest runs, in order, as a count and a hash of (statement, predicated, arguments).
  auto run = [](const Nest& nest) {
    std::vector<int64_t> it(static_cast<size_t>(nest.iterators), 0);
    std::pair<uint64_t, uint64_t> seen{0, 1469598103934665603ull};
    testing_loops::run_loops(nest.root, it, [&](const LoopNode& s, const std::vector<int64_t>& args, const std::vector<int64_t>&) {
      uint64_t& h = seen.second;
      auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
      mix(static_cast<uint64_t>(s.statement));
      mix(s.predicated ? 1 : 0);
      for (int64_t a : args) mix(static_cast<uint64_t>(a));
      ++seen.first;
    });
    return seen;
  };
  for (const Target& target : fixed_cpu_targets()) {
    int direct = 0, by_isl = 0;
    for (const auto& [what, program, inputs] : cases) {
      LowerOptions options;
      options.target = target;
      LowerOptions isl_steps = options;
      isl_steps.target.direct_step_loops = false;
      Lowered a, b;
      try {
        a = lower(program, inputs, options);
      } catch (const UserError&) {
        continue;
      }
      b = lower(program, inputs, isl_steps);
      ASSERT_EQ(a.schedule.nests.size(), b.schedule.nests.size()) << what;
      for (size_t k = 0; k < a.schedule.nests.size(); ++k) {
        const Nest& x = a.schedule.nests[k];
        const Nest& y = b.schedule.nests[k];
        if (!x.microkernel) {
          EXPECT_EQ(x.ast, y.ast) << what << ": " << x.name;
          continue;
        }
        EXPECT_EQ(x.outer_lo, y.outer_lo) << what << ": " << x.name;
        EXPECT_EQ(x.outer_hi, y.outer_hi) << what << ": " << x.name;
        EXPECT_EQ(x.parallel_outer, y.parallel_outer) << what << ": " << x.name;
        EXPECT_FALSE(y.direct_loops) << what << ": " << y.name;
        const auto ran = run(x), expected = run(y);
        EXPECT_GT(expected.first, 0u) << what << ": " << x.name;
        EXPECT_EQ(ran, expected) << what << ": " << x.name << "\n" << x.ast << "\nisl:\n" << y.ast;
        (x.direct_loops ? direct : by_isl) += 1;
      }
    }
    std::cout << target.cpu_name << ": " << direct << " micro-kernel nests with the scheduler's step loops, " << by_isl << " with isl's\n";
    // Merged block dimensions (a band member bb + 16 bv, then bb alone) are isl's: more of them on AVX2,
    // whose narrower vectors make more blocks.
    EXPECT_GE(direct, 15) << target.cpu_name;
    EXPECT_GT(direct, 2 * by_isl) << target.cpu_name;
  }
}

}  // namespace
}  // namespace polytile::sched
