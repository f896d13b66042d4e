// Differential fuzzing with a structured program generator (program_generator.h): random whole programs
// run on the CPU backend (every rewriting pass proven with isl) and with the GPU strategy's kernels under
// GPU semantics against the reference interpreter -- the same values, or a UserError from both; values
// that differ only because the program amplified rounding (every statement agrees with the interpreter
// on the backend's own values of its operands) are counted, not failed -- and
// random differentiable programs through all three AD modes against central finite differences in f64
// (ill-conditioned ones, and differences that are not smooth at the inputs, counted, not checked). The
// default budget (1000 programs on the CPU backend, 2 x 200 under GPU semantics, 400 through autodiff)
// runs in about a minute; set POLYTILE_FUZZ_PROGRAMS=N for a longer run (the README records some) and
// POLYTILE_FUZZ_SEED=S for other programs than the suite's. Each failure prints the seed, the iteration
// and the program; POLYTILE_FUZZ_TRACE=1 prints every program of the backends' tests to stderr before it
// runs (a crash ends the run: the last one printed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>

#include "polytile/autodiff.h"
#include "polytile/cpu.h"
#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "polytile/shapes.h"
#include "program_generator.h"
#include "test_util.h"

namespace polytile {
namespace {

int budget(int default_programs) {
  const char* env = std::getenv("POLYTILE_FUZZ_PROGRAMS");
  return env ? std::max(1, std::atoi(env)) : default_programs;
}

// The generator's seed: the suite's own, or POLYTILE_FUZZ_SEED's (the autodiff test takes it plus one).
uint64_t seed_or(uint64_t suite) {
  const char* env = std::getenv("POLYTILE_FUZZ_SEED");
  return env ? std::strtoull(env, nullptr, 10) : suite;
}

TensorMap make_inputs(const testing::fuzz::Generated& g, uint64_t seed) {
  TensorMap in;
  uint64_t k = 0;
  for (const auto& [name, shape] : g.shapes) {
    DType t = *parse_dtype(g.dtypes.at(name));
    Buffer b = testing::random_buffer(shape, seed + 7919 * k++, t == DType::f32 ? DType::f64 : t);
    Buffer typed(t, shape);
    for (int64_t e = 0; e < b.size(); ++e) typed.set(e, t == DType::boolean ? static_cast<double>(b.get(e) > 0) : 2 * b.get(e));
    in[name] = typed;
  }
  return in;
}

// Values agree: exactly for integers and bools, NaN where NaN, else within a tolerance that grows with the
// number of terms a reduction may add (f32 accumulates in f32 on the CPU, in f64 in the interpreter).
std::string differs(const Buffer& got, const Buffer& want, double f64_tolerance = 1e-9) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) return "type " + got.type_str() + " vs " + want.type_str();
  for (int64_t e = 0; e < want.size(); ++e) {
    double a = got.get(e), b = want.get(e);
    if (std::isnan(b) ? std::isnan(a) : a == b) continue;
    double tol = want.dtype() == DType::f16 ? 4e-3 : want.dtype() == DType::f32 ? 1e-4 : want.dtype() == DType::f64 ? f64_tolerance : 0;
    if (std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b))) continue;
    return "element " + std::to_string(e) + ": " + std::to_string(a) + " vs " + std::to_string(b);
  }
  return "";
}

// Runs a program on a backend (the CPU's, or a test's stand-in for a wrong one).
using Runner = std::function<TensorMap(const Program&, const TensorMap&)>;

// Where a backend's outputs differ from the interpreter's, whether each operation is right up to rounding
// and only the program amplified the rounding (an f32 sum one ulp apart, then `%` or a comparison): the
// program run with every statement's tensor as an output gives the backend's own value of each; each
// statement interpreted alone on the backend's values of what it reads must give the backend's value of
// its output, and the original run's outputs must be those values. "" when all holds, else what does not.
// A wrong kernel fails the first test (its statement, on its own inputs), a wrong fusion the second.
std::string statementwise(const Program& p, const TensorMap& in, const TensorMap& got, const Runner& run,
                          double tolerance) {
  Program every = p;
  every.outputs.clear();
  for (const Statement& s : p.statements) every.outputs.push_back(statement_output(s));
  TensorMap own;
  try {
    own = run(every, in);
  } catch (const std::exception& e) {
    return std::string("every statement's tensor as an output: ") + e.what();
  }
  for (const Statement& s : p.statements) {
    const std::string& out = statement_output(s);
    Program one;
    one.inputs = p.inputs;  // they bind the dims the statement's shapes name
    TensorMap values = in;
    for (const std::string& t : statement_operands(s)) {
      if (values.count(t)) continue;
      Param param{t, {}};
      for (int64_t d : own.at(t).shape()) param.dims.emplace_back(d);
      one.inputs.push_back(param);
      values[t] = own.at(t);
    }
    one.outputs = {out};
    one.statements = {s};
    std::string why;
    try {
      why = differs(own.at(out), interpret(one, values).at(out), tolerance);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) return "statement " + print(s) + " on the backend's values of its operands: " + why;
  }
  for (const std::string& o : p.outputs)
    if (std::string why = differs(got.at(o), own.at(o), tolerance); !why.empty())
      return "output " + o + " against the same program with every tensor an output: " + why;
  return "";
}

// The least precise float type anything in `p` is computed in: an input, a statement's tensor, or any
// part of an elementwise expression -- where a float literal or an intrinsic meets integers it computes
// in f32 (tanh of an i64 tensor, cast to f64 afterwards: seed 61204, iteration 317). f64 where nothing is.
DType least_precise_float(const Program& p, const TensorMap& in) {
  std::map<std::string, TensorType> inputs;
  for (const auto& [name, b] : in) inputs[name] = {b.dtype(), b.shape()};
  const ProgramTypes types = infer_types(p, inputs);
  DType weakest = DType::f64;
  auto see = [&weakest](DType t) {
    if (t == DType::f16 || (t == DType::f32 && weakest == DType::f64)) weakest = t;
  };
  for (const auto& [name, t] : types.tensors) see(t.dtype);
  std::function<void(const Expr&)> walk = [&](const Expr& e) {
    const ExprType t = expr_type(e, types.tensors);
    if (!t.weak) see(t.dtype);  // a literal alone takes the type of the tensor it meets
    if (e.kind() == Expr::Kind::unary || e.kind() == Expr::Kind::binary || e.kind() == Expr::Kind::call)
      for (const Expr& a : e.args()) walk(a);
  };
  for (const Statement& st : p.statements)
    if (const auto* e = std::get_if<Elementwise>(&st)) walk(e->expr);
  return weakest;
}

// Random programs (the generator seeded with `suite_seed`, or POLYTILE_FUZZ_SEED) compiled with `options`
// against the interpreter: the same values, or a UserError from both. Where the values differ, the
// backend's own intermediate values decide (statementwise): every statement right on them, the difference
// is rounding that the program amplified (counted and printed, not a failure).
void programs_agree(const std::string& backend, const cpu::CompileOptions& options, uint64_t suite_seed, int default_programs) {
  const uint64_t seed = seed_or(suite_seed);
  const int programs = budget(default_programs);
  std::cout << backend << ": seed " << seed << ", " << programs << " programs\n";
  testing::fuzz::ProgramGenerator gen(seed, false);
  int compared = 0, refused = 0, amplified = 0;
  for (int iter = 0; iter < programs; ++iter) {
    testing::fuzz::Generated g = gen.next();
    std::string where = backend + ": seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + " inputs";
    for (const auto& [name, dtype] : g.dtypes) where += " " + name + ":" + dtype;
    where += "\n" + g.text;
    Program p;
    ASSERT_NO_THROW(p = parse_program(g.text, "fuzz.tile")) << where;
    TensorMap in = make_inputs(g, seed + static_cast<uint64_t>(iter));
    if (std::getenv("POLYTILE_FUZZ_TRACE")) std::cerr << where << "\n";  // the last one printed crashed
    std::optional<TensorMap> want;
    std::string interp_error;
    try {
      want = interpret(p, in);
    } catch (const UserError& e) {
      interp_error = e.what();
    }
    if (!want) {
      EXPECT_THROW(cpu::run(p, in, options), UserError) << where << "interpreter: " << interp_error;
      ++refused;
      continue;
    }
    TensorMap got;
    try {
      got = cpu::run(p, in, options);
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << backend << ": " << e.what();
      continue;
    }
    // f32 or f16 anywhere upstream bounds the precision of every float output: the CPU accumulates f32 (and
    // f16) sums in f32, the interpreter in f64, and an f32 intrinsic (libm's tanhf on the CPU) may be an
    // ulp off the interpreter's correctly rounded one.
    const DType weakest = least_precise_float(p, in);
    const double tolerance = weakest == DType::f16 ? 4e-3 : weakest == DType::f32 ? 1e-4 : 1e-9;
    std::string first;
    for (const auto& o : p.outputs)
      if (std::string why = differs(got.at(o), want->at(o), tolerance); !why.empty() && first.empty()) first = o + ": " + why;
    ++compared;
    if (first.empty()) continue;
    const Runner on_backend = [&options](const Program& q, const TensorMap& x) { return cpu::run(q, x, options); };
    const std::string local = statementwise(p, in, got, on_backend, tolerance);
    EXPECT_EQ(local, "") << where << "against the interpreter, " << first;
    if (local.empty()) {
      ++amplified;
      std::cout << where << "amplified rounding (every statement agrees on the backend's own values): " << first << "\n";
    }
  }
  std::cout << compared << " compared (" << amplified << " of them rounding the program amplified), " << refused
            << " refused by both\n";
  EXPECT_GT(compared, programs / 2);
}

TEST(DifferentialFuzzTest, RandomProgramsAgreeOnTheCpuBackend) {
  cpu::CompileOptions options;
  options.verify = true;
  options.threads = 1;
  programs_agree("cpu", options, 20261122, 1000);
}

// The comparisons' tolerance comes from the least precise float type a program computes in, implicit
// ones included: tanh of an i64 tensor is f32 (then cast to f64: glibc's tanhf, an ulp from the
// interpreter's correctly rounded f32, was compared at f64's tolerance; seed 61204, iteration 317), as is
// an integer tensor times a float literal; a literal that meets an f64 tensor is f64.
TEST(DifferentialFuzzTest, ImplicitF32BoundsTheTolerance) {
  auto weakest = [](const std::string& text, DType b) {
    return least_precise_float(parse_program(text), {{"B", Buffer(b, {3})}});
  };
  EXPECT_EQ(weakest("function (B[N]) -> (T0) { T0 = (cast(tanh(tanh(B)), f64) + B * 0); }", DType::i64), DType::f32);
  EXPECT_EQ(weakest("function (B[N]) -> (T0) { T0 = cast(B * 0.5, f64); }", DType::i64), DType::f32);
  EXPECT_EQ(weakest("function (B[N]) -> (T0) { T0 = B * 2; }", DType::i64), DType::f64);
  EXPECT_EQ(weakest("function (B[N]) -> (T0) { T0 = tanh(B) * 0.5; }", DType::f64), DType::f64);
  EXPECT_EQ(weakest("function (B[N]) -> (T0) { T0 = cast(B, f16) + 1; }", DType::f64), DType::f16);
  EXPECT_EQ(weakest("function (B[N]) -> (T0) { T0[] = +(B[i]); }", DType::f32), DType::f32);
}

// The fallback that forgives a difference must still catch wrong code. A program from the generator
// (seed 55201, iteration 1143) whose f32 product T1 is about 5e5 at A = 5: the CPU's (f32 products) and
// the interpreter's (f64, rounded once) come out an ulp (0.03) apart, and T1 % T0 turns that into 0.18
// against 0.21 (the first A from 5 whose outputs differ is taken, should another CPU's tanh move T0 an
// ulp). On the CPU's own values every statement agrees; a backend that computed one statement wrong, or
// whose program gave other outputs than the statements' chain, is reported, naming what differs.
TEST(DifferentialFuzzTest, StatementwiseComparisonTellsAmplifiedRoundingFromWrongCode) {
  const Program p = parse_program(R"(function (A[]) -> (T2) {
  T0 = (tanh(tanh(0.5)) + A * 0);
  T1[] = *(T0[] * A[]), (i + 1)/2 < 2, j < 4, k < 3, i + j < 2 default A;
  T2 = (relu((T1 % T0)) + A * 0);
}
)");
  cpu::CompileOptions options;
  options.threads = 1;
  const Runner cpu_run = [&options](const Program& q, const TensorMap& x) { return cpu::run(q, x, options); };
  Buffer a(DType::i32, {});
  TensorMap in, got;
  for (int value = 5; value < 12 && got.empty(); ++value) {
    a.set(0, value);
    in = {{"A", a}};
    TensorMap out = cpu_run(p, in);
    if (!differs(out.at("T2"), interpret(p, in).at("T2"), 1e-4).empty()) got = out;
  }
  ASSERT_FALSE(got.empty()) << "the premise: for some A the outputs differ";
  EXPECT_EQ(statementwise(p, in, got, cpu_run, 1e-4), "");

  // A kernel off by a part in a thousand in one statement: that statement, on its own operands.
  for (const std::string wrong : {"T1", "T2"}) {
    const Runner off = [&](const Program& q, const TensorMap& x) {
      TensorMap out = cpu_run(q, x);
      if (out.count(wrong)) out[wrong].set(0, out[wrong].get(0) * 1.001);
      return out;
    };
    const std::string why = statementwise(p, in, got, off, 1e-4);
    EXPECT_NE(why.find("statement " + wrong), std::string::npos) << why;
  }
  // Outputs that the chain of statements does not give (as a wrong fusion's would).
  TensorMap fused = got;
  fused["T2"].set(0, got.at("T2").get(0) + 0.01);
  EXPECT_NE(statementwise(p, in, fused, cpu_run, 1e-4).find("output T2"), std::string::npos);
}

// The same with the GPU strategy's kernels (blocks, threads, shared tiles, register tiles) run on the host
// with GPU semantics, on other programs: the default model, and a small one under which these programs
// span several blocks with partial register tiles and split reductions.
TEST(DifferentialFuzzTest, RandomProgramsAgreeUnderGpuSemantics) {
  cpu::CompileOptions options;
  options.verify = true;
  options.threads = 1;
  options.target = sched::gpu_target("sm_90");
  programs_agree("gpu semantics", options, 20261128, 200);
  options.target.gpu->threads_per_block = 8;
  options.target.gpu->tile_rows = 2;
  options.target.gpu->tile_cols = 3;
  options.target.gpu->min_blocks = 64;
  options.target.gpu->min_slice = 2;
  programs_agree("gpu semantics with 8-thread blocks, 2x3 register tiles and split reductions", options, 20261129, 200);
}

// <head, outputs> at the given inputs; `magnitude` gets sum |head * output|, which bounds the rounding
// error of the loss (a central difference cannot be more accurate than 1e-16 * magnitude / h).
double loss(const Program& p, const TensorMap& in, const TensorMap& heads, double* magnitude = nullptr) {
  TensorMap out = interpret(p, in);
  double s = 0, m = 0;
  for (const auto& o : p.outputs)
    for (int64_t e = 0; e < out.at(o).size(); ++e) {
      s += heads.at(o).get(e) * out.at(o).get(e);
      m += std::fabs(heads.at(o).get(e) * out.at(o).get(e));
    }
  if (magnitude) *magnitude = m;
  return s;
}

// The largest magnitude among the values the program computes at `in` (every statement's tensor), or
// infinity where one is not finite. Finite differences and the gradients' own rounding errors scale with
// it, not with the outputs: 2^50 - (2^50 - x) is x to a few digits only.
double largest_value(Program p, const TensorMap& in) {
  p.outputs.clear();
  for (const auto& st : p.statements) p.outputs.push_back(statement_output(st));
  double m = 0;
  for (const auto& [name, b] : interpret(p, in))
    for (int64_t e = 0; e < b.size(); ++e) {
      const double v = std::fabs(b.get(e));
      if (!std::isfinite(v)) return std::numeric_limits<double>::infinity();
      m = std::max(m, v);
    }
  return m;
}

TEST(DifferentialFuzzTest, RandomGradientsInEveryModeMatchFiniteDifferences) {
  const uint64_t seed = std::getenv("POLYTILE_FUZZ_SEED") ? seed_or(0) + 1 : 11222026;
  const int programs = budget(400);
  std::cout << "seed " << seed << ", " << programs << " programs\n";
  testing::fuzz::ProgramGenerator gen(seed, true);
  int checked = 0, ill_conditioned = 0, rough = 0;
  for (int iter = 0; iter < programs; ++iter) {
    testing::fuzz::Generated g = gen.next();
    std::string where = "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + "\n" + g.text;
    Program p = parse_program(g.text, "fuzz.tile");
    TensorMap in = make_inputs(g, seed + static_cast<uint64_t>(iter));
    TensorMap out;
    try {
      out = interpret(p, in);
    } catch (const UserError&) {
      continue;
    }
    // Ill-conditioned programs have no meaningful finite differences: counted, not checked. A value beyond
    // 1e100 (a product of many inputs, its exp: a step of h may overflow it), or intermediates a million
    // times the outputs (which are their differences).
    double outputs = 1;
    for (const auto& o : p.outputs)
      for (int64_t e = 0; e < out.at(o).size(); ++e) outputs = std::max(outputs, std::fabs(out.at(o).get(e)));
    const double largest = largest_value(p, in);
    if (!(largest <= 1e100 && largest <= 1e6 * outputs)) {
      ++ill_conditioned;
      continue;
    }
    ++checked;
    TensorMap heads;
    for (const auto& o : p.outputs) heads[o] = testing::random_buffer(out.at(o).shape(), seed + 31 * static_cast<uint64_t>(iter));
    ad::Result rev = ad::vjp(p);
    ad::Options mixed_options;
    mixed_options.mixed_mode = true;
    ad::Result mixed = ad::vjp(p, mixed_options), fwd = ad::jvp(p);
    TensorMap rin = in;
    for (size_t o = 0; o < p.outputs.size(); ++o) rin[rev.program.inputs[p.inputs.size() + o].name] = heads.at(p.outputs[o]);
    TensorMap grads = interpret(rev.program, rin), mixed_grads = interpret(mixed.program, rin);
    // The gradient program compiles and agrees on the CPU as well.
    cpu::CompileOptions options;
    options.verify = true;
    options.threads = 1;
    TensorMap cpu_grads = cpu::run(rev.program, rin, options);
    const double h = 1e-6;
    double magnitude = 0;
    loss(p, in, heads, &magnitude);
    auto tolerance = [&](double fd) { return 1e-5 * std::max(1.0, std::fabs(fd)) + 1e-15 * magnitude / h; };
    // A loss that is not smooth at the inputs has no derivative there for the differences to estimate: a
    // comparison whose sides round differently once the inputs move ((1.5 - A) + A == (1.5 - A') + A' holds
    // for some values and not for others) makes the loss jump within a step. Its central differences
    // at steps h and 2h then disagree (a jump J gives J/2h and J/4h); those of a smooth loss agree to
    // O(h^2) and rounding. Where they disagree nothing is checked against them (counted: rough).
    auto smooth = [&](double fd, double coarser) { return std::fabs(fd - coarser) <= tolerance(fd); };
    double tangent_dot = 0;
    TensorMap fin = in;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const std::string& x = p.inputs[i].name;
      const Buffer& gx = grads.at(rev.gradients[i]);
      ASSERT_EQ(gx.shape(), in.at(x).shape()) << where;
      // Mixed mode multiplies partials in another order; literal-only subexpressions round to f32 (weak
      // literals, ir.h), so the two orders may differ in the eighth digit.
      EXPECT_EQ(differs(mixed_grads.at(mixed.gradients[i]), gx, 1e-6), "") << where << "mixed vs reverse, d" << x;
      EXPECT_EQ(differs(cpu_grads.at(rev.gradients[i]), gx), "") << where << "cpu vs interpreter, d" << x;
      for (int64_t e = 0; e < std::min<int64_t>(3, gx.size()); ++e) {
        int64_t at = (e * 7919 + iter) % gx.size();
        auto central = [&](double step) {
          TensorMap plus = in, minus = in;
          plus[x].set(at, in.at(x).get(at) + step);
          minus[x].set(at, in.at(x).get(at) - step);
          return (loss(p, plus, heads) - loss(p, minus, heads)) / (2 * step);
        };
        const double fd = central(h);
        if (!smooth(fd, central(2 * h))) {
          ++rough;
          continue;
        }
        EXPECT_NEAR(gx.get(at), fd, tolerance(fd)) << where << "reverse d" << x << " at " << at;
      }
      // Forward mode along a random tangent t: <jvp(t), head> = d/dh loss(x + h t).
      Buffer t = testing::random_buffer(in.at(x).shape(), seed + 97 * static_cast<uint64_t>(iter) + i);
      fin[fwd.program.inputs[p.inputs.size() + i].name] = t;
      for (int64_t e = 0; e < t.size(); ++e) tangent_dot += t.get(e) * gx.get(e);
    }
    auto along = [&](double step) {  // the central difference along every input's tangent at once
      TensorMap plus = in, minus = in;
      for (size_t i = 0; i < p.inputs.size(); ++i) {
        const std::string& x = p.inputs[i].name;
        const Buffer& t = fin.at(fwd.program.inputs[p.inputs.size() + i].name);
        for (int64_t e = 0; e < t.size(); ++e) {
          plus[x].set(e, in.at(x).get(e) + step * t.get(e));
          minus[x].set(e, in.at(x).get(e) - step * t.get(e));
        }
      }
      return (loss(p, plus, heads) - loss(p, minus, heads)) / (2 * step);
    };
    TensorMap tangents = interpret(fwd.program, fin);
    double jvp_dot = 0;
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      const Buffer& to = tangents.at(fwd.gradients[o]);
      for (int64_t e = 0; e < to.size(); ++e) jvp_dot += to.get(e) * heads.at(p.outputs[o]).get(e);
    }
    // Forward and reverse mode take the same branches at the inputs: they agree also where the loss is rough.
    EXPECT_NEAR(jvp_dot, tangent_dot, tolerance(tangent_dot)) << where << "forward mode against reverse";
    const double directional = along(h);
    if (!smooth(directional, along(2 * h))) {
      ++rough;
      continue;
    }
    EXPECT_NEAR(jvp_dot, directional, tolerance(directional)) << where << "forward mode";
    EXPECT_NEAR(tangent_dot, directional, tolerance(directional)) << where << "reverse, directional";
  }
  std::cout << checked << " programs differentiated, " << ill_conditioned << " ill-conditioned ones not; " << rough
            << " finite differences not smooth at their inputs, not compared\n";
  EXPECT_GT(checked, programs / 2);
}

}  // namespace
}  // namespace polytile
