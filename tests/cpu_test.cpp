// Differential tests of the CPU backend against the reference interpreter: every example (f32 and f64),
// the contraction generator of the polyhedral property test, gradient programs from autodiff, every
// elementwise operator and intrinsic with integer and boolean semantics, parallel = serial, determinism
// of the generated LLVM IR, and run-time errors.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "generators.h"
#include "polytile/autodiff.h"
#include "polytile/cpu.h"
#include "polytile/error.h"
#include "polytile/kernel_cache.h"
#include "polytile/lower.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile::cpu {
namespace {

using testing::Shapes;
using testing::shapes_from_args;

TensorMap inputs_for(const Shapes& shapes, DType dtype, uint64_t seed) {
  TensorMap in;
  uint64_t k = 0;
  for (const auto& [name, shape] : shapes) {
    Buffer d = testing::random_buffer(shape, seed + 131 * k++);
    in[name] = Buffer::from_values(dtype, shape, d.to_doubles());
  }
  return in;
}

// Compiled and interpreted results agree; the tolerance grows with the data size (reduction length).
// Every compilation here also proves each rewriting pass with isl (CompileOptions::verify).
void expect_same(const Program& p, const TensorMap& in, const std::string& what, CompileOptions options = {}) {
  options.verify = true;
  TensorMap want = interpret(p, in), got = run(p, in, options);
  int64_t scale = 10;
  for (const auto& [name, b] : in) scale = std::max(scale, b.size());
  for (const auto& o : p.outputs) {
    const Buffer &w = want.at(o), &g = got.at(o);
    ASSERT_EQ(g.shape(), w.shape()) << what;
    ASSERT_EQ(g.dtype(), w.dtype()) << what;
    double eps = w.dtype() == DType::f32 ? 1e-6 : w.dtype() == DType::f64 ? 1e-14 : 0;
    for (int64_t e = 0; e < w.size(); ++e) {
      double a = g.get(e), b = w.get(e);
      if (std::isnan(b) || std::isinf(b)) {
        ASSERT_TRUE(std::isnan(b) ? std::isnan(a) : a == b) << what << " " << o << "[" << e << "] " << a << " vs " << b;
        continue;
      }
      ASSERT_NEAR(a, b, eps * static_cast<double>(scale) * std::max(1.0, std::fabs(b)))
          << what << " " << o << "[" << e << "]\n" << print(p);
    }
  }
}

using testing::types_of;

// Register-blocked paths wherever they apply, however small the nest, for a given vector width and
// register file (32: the tests' blocks are the same on every host; the plan follows the registers), with
// two FMAs per cycle (as on every AVX2 core; Zen 4's one is CpuModel::fma_per_cycle's own test).
CompileOptions microkernels_forced(int vector_bits, int vector_registers = 32) {
  CompileOptions o;
  o.target.cpu.vector_bits = vector_bits;
  o.target.cpu.vector_registers = vector_registers;
  o.target.cpu.fma_per_cycle = 2;
  o.target.cpu.microkernel_min_points = 0;
  o.threads = 2;
  return o;
}

TEST(CpuTest, EveryExampleInF32AndF64) {
  int n = 0;
  for (const auto& [path, shapes] : testing::examples_with_shapes(POLYTILE_SOURCE_DIR "/examples")) {
    Program p = parse_file(path.string());
    for (DType t : {DType::f32, DType::f64}) expect_same(p, inputs_for(shapes, t, 7), path.filename().string());
    ++n;
  }
  EXPECT_GE(n, 19);
}

TEST(CpuTest, GeneratedContractionsMatchTheInterpreter) {
  const uint64_t seed = 515151;
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 150; ++iter) {
    testing::generators::Case cs = testing::generators::any_case(rng);
    Program p = parse_program(cs.text);
    expect_same(p, inputs_for(cs.shapes, DType::f64, seed + iter), "seed " + std::to_string(seed) + " iteration " +
                                                                        std::to_string(iter) + " (" + cs.kind + ")");
  }
}

// GPU semantics on the host (CompileOptions::target = a GPU target): every kernel's blocks run their
// threads one after another, so what the GPU strategy maps -- grids, blocks, guards of partial tiles,
// register tiles, linearized z dimensions, sequential kernels -- is checked against the interpreter. The
// small model makes even the examples span several blocks with partial tiles.
std::vector<std::pair<std::string, CompileOptions>> gpu_semantics() {
  std::vector<std::pair<std::string, CompileOptions>> out;
  CompileOptions o;
  o.target = sched::gpu_target("sm_90");
  out.emplace_back("sm_90", o);
  o.target = sched::gpu_target("sm_80");
  o.target.gpu->threads_per_block = 8;
  o.target.gpu->tile_rows = 2;
  o.target.gpu->tile_cols = 3;
  // Sums with fewer than 64 blocks of outputs split their reductions into slices of 2 points or more.
  o.target.gpu->min_blocks = 64;
  o.target.gpu->min_slice = 2;
  // A thread's columns consecutive (GpuModel::interleave_columns), 3 of them: partial tiles at every edge.
  o.target.gpu->interleave_columns = false;
  out.emplace_back("sm_80 with 8-thread blocks, 2x3 register tiles of consecutive columns and split reductions", o);
  // Updates straight to memory (where isl cannot prove the accumulators safe) and from global memory.
  o.target = sched::gpu_target("sm_90");
  o.target.gpu->accumulators = false;
  o.target.gpu->shared_bytes = 0;
  out.emplace_back("sm_90 without accumulators and shared tiles", o);
  // Register tiles with guarded rows without branches (rows out of range read clamped elements of the
  // shared tiles, NaN on the host, and keep their accumulators), and indices in 64 bits.
  o.target = sched::gpu_target("sm_90");
  o.target.gpu->masked_registers = true;
  o.target.gpu->index32 = false;
  o.target.gpu->unswitch_registers = false;  // every thread masked, not only those at the edges
  o.target.gpu->vector_copies = false;        // and the tiles copied element by element
  out.emplace_back("sm_90 with masked register tiles, 64-bit indices and element-by-element copies", o);
  return out;
}

// With caches of a few hundred bytes every CPU decision that depends on them flips at test sizes: leading
// variables fused into one outer loop, row groups of one row per chunk, tiles where reuse is "far". Each
// generated contraction gets two elementwise consumers, so that row groups form.
TEST(CpuTest, TinyCachesMatchTheInterpreter) {
  CompileOptions tiny;
  tiny.target.cpu.l1_bytes = 256;
  tiny.target.cpu.l2_bytes = 512;
  tiny.target.threads = 2;
  tiny.threads = 2;
  const uint64_t seed = 616161;
  std::mt19937_64 rng(seed);
  int fused = 0, grouped = 0;
  for (int iter = 0; iter < 60; ++iter) {
    testing::generators::Case cs = testing::generators::any_case(rng);
    // Two elementwise consumers of the output, both outputs themselves: nests over one box, one reading
    // the other (a row group where their outer loops are split alike).
    std::string text = cs.text;
    const size_t arrow = text.find("-> ("), close = text.find(')', arrow);
    const std::string out = text.substr(arrow + 4, close - arrow - 4);
    ASSERT_EQ(out.find(','), std::string::npos) << text;
    text.replace(arrow, close - arrow + 1, "-> (" + out + ", R1, R2)");
    text.insert(text.rfind('}'), "  R1 = " + out + " * 3;\n  R2 = R1 + " + out + ";\n");
    Program p = parse_program(text);
    TensorMap in = inputs_for(cs.shapes, DType::f64, seed + iter);
    expect_same(p, in, "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + " (" + cs.kind + ")", tiny);
    CompileOptions verified = tiny;
    verified.verify = true;
    auto compiled = compile(p, types_of(in), verified);
    for (const auto& nest : compiled->schedule().nests) fused += nest.tree.find("i0 + i1)") != std::string::npos;
    grouped += !compiled->schedule().groups.empty();
  }
  EXPECT_GE(fused, 10);
  EXPECT_GE(grouped, 10);
}

// Split reductions on the CPU: a sum with few outputs and long reductions gets one slice per thread of its
// longest reduction variable, computed in parallel, and the slices' sum. With the thresholds at their
// least, every generated sum that can be split is (three slices, from three target threads), each split
// proven by isl (expect_same compiles with verify) and computed as the interpreter does.
TEST(CpuTest, SplitReductionsOnTheCpuMatchTheInterpreter) {
  CompileOptions forced;
  forced.target.threads = 3;
  forced.target.cpu.split_max_outputs = int64_t{1} << 40;
  forced.target.cpu.split_min_points = 1;
  forced.verify = true;  // as expect_same compiles: the program inspected below is the one it ran
  const uint64_t seed = 424242;
  std::mt19937_64 rng(seed);
  int split = 0;
  for (int iter = 0; iter < 80; ++iter) {
    testing::generators::Case cs = testing::generators::any_case(rng);
    Program p = parse_program(cs.text);
    TensorMap in = inputs_for(cs.shapes, DType::f64, seed + iter);
    expect_same(p, in, "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + " (" + cs.kind + ")", forced);
    const Program& lowered = compile(p, types_of(in), forced)->program();
    split += print(lowered).find("_slices") != std::string::npos;
  }
  EXPECT_GE(split, 8) << "the forced thresholds split the sums with plain output indices";
  // The default thresholds: a bias gradient (32 outputs, 50176 points each) is split on two threads and
  // not on one; a softmax's row sums (4096 outputs) and a matmul are not.
  Program bias = parse_program("function (D[N, H, W, C]) -> (B) { B[c : C] = +(D[n, y, x, c]); }");
  TensorMap d = inputs_for({{"D", {64, 28, 28, 32}}}, DType::f32, 5);
  CompileOptions two, one;
  two.verify = true;
  two.target.threads = 2;
  one.target.threads = 1;
  expect_same(bias, d, "bias gradient", two);
  EXPECT_NE(print(compile(bias, types_of(d), two)->program()).find("B_slices[n_slice, c : 2, C]"), std::string::npos);
  EXPECT_EQ(print(compile(bias, types_of(d), one)->program()).find("_slices"), std::string::npos);
  Program rows = parse_program("function (X[N, C]) -> (S) { S[i : N] = +(X[i, j]); }");
  TensorMap x = inputs_for({{"X", {4096, 100}}}, DType::f32, 6);
  EXPECT_EQ(print(compile(rows, types_of(x), two)->program()).find("_slices"), std::string::npos);
  // A column sum whose threads would each read half of every row (2048 outputs, each thread's 4 KiB of
  // every 8 KiB row) is split into slices of rows where each column sums at least split_line_min_points
  // (1024) rows and the two slices' partial sums fit in half of L1 (2 x 2048 x 4 bytes of 48 KiB); not
  // with fewer rows, nor with 8192 columns (64 KiB of partial sums), nor on one thread.
  Program cols = parse_program("function (X[M, N]) -> (S) { S[j : N] = +(X[i, j]); }");
  two.target.cpu.l1_bytes = 48 * 1024;
  one.target.cpu.l1_bytes = 48 * 1024;
  TensorMap tall = inputs_for({{"X", {1100, 2048}}}, DType::f32, 7);
  expect_same(cols, tall, "column sum of 1100 rows", two);
  const std::string split_sum = print(compile(cols, types_of(tall), two)->program());
  EXPECT_NE(split_sum.find("S_slices[i_slice, j : 2, N] = +(X[550*i_slice + i_step, j]), i_step < 550;"), std::string::npos) << split_sum;
  EXPECT_EQ(print(compile(cols, types_of(tall), one)->program()).find("_slices"), std::string::npos);
  TensorMap short_rows = inputs_for({{"X", {1000, 2048}}}, DType::f32, 8);
  EXPECT_EQ(print(compile(cols, types_of(short_rows), two)->program()).find("_slices"), std::string::npos);
  TensorMap wide = inputs_for({{"X", {1100, 8192}}}, DType::f32, 9);
  EXPECT_EQ(print(compile(cols, types_of(wide), two)->program()).find("_slices"), std::string::npos);
  // Column maxima and minima too, the slices' maximum (minimum) into S, where every slice holds a point
  // for every column; not under a constraint (its domain need not be a box), nor where the output has
  // elements that no point writes (they keep 0, which the slices' zeros would not).
  // A NaN in either slice reaches the column's result, as in the interpreter.
  std::vector<double> values = tall.at("X").to_doubles();
  values[700 * 2048 + 5] = std::nan("");
  values[3 * 2048 + 9] = std::nan("");
  TensorMap with_nan{{"X", Buffer::from_values(DType::f32, {1100, 2048}, values)}};
  for (const char* agg : {">", "<"}) {
    Program extremum = parse_program(std::string("function (X[M, N]) -> (S) { S[j : N] = ") + agg + "(X[i, j]); }");
    expect_same(extremum, tall, std::string("column ") + agg, two);
    expect_same(extremum, with_nan, std::string("column ") + agg + " with NaNs", two);  // NaN where the interpreter has it
    const Buffer want = interpret(extremum, with_nan).at("S");
    EXPECT_TRUE(std::isnan(want.get(5)) && std::isnan(want.get(9)) && !std::isnan(want.get(6))) << "the NaNs reach columns 5 and 9";
    const std::string split = print(compile(extremum, types_of(tall), two)->program());
    EXPECT_NE(split.find(std::string("S[o0 : N] = ") + agg + "(S_slices[s, o0]);"), std::string::npos) << split;
  }
  for (const char* body : {"S[j : N] = >(X[i, j]), i < M - 3;", "S[j : N + 1] = >(X[i, j]);", "S[j : N] = >(X[i, j] + X[i + 1, j]);"}) {
    Program p = parse_program(std::string("function (X[M, N]) -> (S) { ") + body + " }");
    expect_same(p, tall, body, two);
    EXPECT_EQ(print(compile(p, types_of(tall), two)->program()).find("_slices"), std::string::npos) << body;
  }
}

// A split sum of products whose every input reads the output's one variable, S[c] = +(A[n, c] * B[n, c])
// (a normalization's scale gradient): its slices, one per thread, are the only variable a micro-kernel
// could take rows from, and rows that share no operand take one row each, so that the slices stay
// separate blocks, which the threads share (in blocks of both slices it ran on one thread at half the
// speed). On 2 and 3 threads, in f32 and f64, against the interpreter.
TEST(CpuTest, SlicesOfASplitProductSumRunOnTheirOwnThreads) {
  Program p = parse_program("function (A[N, C], B[N, C]) -> (S) { S[c : C] = +(A[n, c] * B[n, c]); }");
  for (int threads : {2, 3}) {
    for (DType t : {DType::f32, DType::f64}) {
      const std::string what = std::to_string(threads) + " threads, " + to_string(t);
      CompileOptions o = microkernels_forced(512);
      o.threads = threads;
      o.target.threads = threads;
      TensorMap in = inputs_for({{"A", {6000, 96}}, {"B", {6000, 96}}}, t, 61);
      auto compiled = compile(p, types_of(in), o);
      const sched::Nest* slices = nullptr;
      for (const auto& nest : compiled->schedule().nests)
        if (nest.tensor == "S_slices" && nest.microkernel) slices = &nest;
      const std::string loops = sched::print_loops(compiled->schedule());
      ASSERT_NE(slices, nullptr) << what << "\n" << loops;
      EXPECT_EQ(slices->variables[slices->microkernel->block], "n_slice") << what << "\n" << loops;
      EXPECT_EQ(slices->microkernel->rows, 1) << what << "\n" << loops;
      EXPECT_TRUE(slices->parallel_outer) << what << "\n" << loops;
      EXPECT_EQ(slices->outer_hi - slices->outer_lo + 1, threads) << what << "\n" << loops;
      expect_same(p, in, "split product sum, " + what, o);
    }
  }
}

// A nest whose leading pair of variables the CPU would fuse into one loop (too few values of the first for
// the threads), where the domain ties the pair to a later variable with other coefficients: isl 0.25's AST
// build failed on the fused loop's bounds ("input involves unknown divs"), an InternalError, found by the
// differential fuzzer in a gradient program. The pair now runs as two loops; the values are the
// interpreter's. The same sum with a box of a domain still fuses its pair.
TEST(CpuTest, LeadingPairsIslCannotBoundAsOneLoopRunAsTwo) {
  CompileOptions two;
  two.target.threads = 2;
  two.threads = 2;
  Program tied = parse_program(
      "function (A[P, Q, R], D[]) -> (DA) {\n"
      "  DA[v0, v1, 3 : P, Q, R] = +(D[]), v2 < 2, v1 - v2 < 2, v0 - v1 + v2 < 4, v0 - 2*v1 + 2*v2 + 1 < P, v0 < Q, v1 - v2 < R;\n}\n");
  TensorMap in = inputs_for({{"A", {4, 4, 4}}, {"D", {}}}, DType::f32, 17);
  auto loops = [&](const Program& p) { return sched::print_loops(compile(p, types_of(in), two)->schedule()); };
  const std::string text = loops(tied);
  EXPECT_NE(text.find("nest DA.update"), std::string::npos) << text;
  EXPECT_NE(text.find("S(floord("), std::string::npos) << "the init's pair fused\n" << text;
  EXPECT_EQ(text.find("S(floord("), text.rfind("S(floord(")) << "only the init's pair fused\n" << text;
  expect_same(tied, in, "a leading pair tied to a later variable", two);
  Program boxed = parse_program("function (A[P, Q, R], D[]) -> (DA) {\n  DA[v0, v1, 3 : P, Q, R] = +(D[]), v2 < 2;\n}\n");
  const std::string box = loops(boxed);
  EXPECT_NE(box.find("S(floord(c0, 4), mod(c0, 4)"), box.rfind("S(floord(c0, 4), mod(c0, 4)")) << "both nests' pairs fused\n" << box;
  expect_same(boxed, in, "a leading pair over a box", two);
}

// Reductions whose band leads with no output variable still run on the threads: a row sum S[i] (its one
// output variable is the output's contiguous one) splits its rows; a column sum or maximum S[j] (the output
// variable is innermost, vectorized) splits column tiles, whole cache lines of S each, the last one short
// where the threads do not divide the columns; a total S[0 : 1] is split into slices like a bias gradient.
// Each is proven (expect_same compiles with verify) and computed as the interpreter does, on two threads.
TEST(CpuTest, ReductionsWithNoLeadingOutputVariableRunOnTheThreads) {
  CompileOptions two;
  two.target.threads = 2;
  two.threads = 2;
  auto update = [](const CompiledProgram& c) -> const sched::Nest& {
    for (const auto& n : c.schedule().nests)
      if (n.name == "S.update") return n;
    throw std::runtime_error("no S.update nest");
  };
  for (DType t : {DType::f32, DType::f64}) {
    const std::string what = " (" + to_string(t) + ")";
    Program rows = parse_program("function (X[N, C]) -> (S) { S[i : N] = +(X[i, j]); }");
    TensorMap x = inputs_for({{"X", {400, 100}}}, t, 11);  // 40000 points: a row reduction
    expect_same(rows, x, "row sum" + what, two);
    const sched::Nest& row_nest = update(*compile(rows, types_of(x), two));
    EXPECT_TRUE(row_nest.reduction.has_value()) << what;
    EXPECT_TRUE(row_nest.parallel_outer) << what;
    EXPECT_EQ(row_nest.outer_hi - row_nest.outer_lo + 1, 400) << what;
    for (const char* agg : {"+", ">"}) {
      Program cols = parse_program(std::string("function (X[N, C]) -> (S) { S[j : C] = ") + agg + "(X[i, j]); }");
      TensorMap y = inputs_for({{"X", {37, 2000}}}, t, 12);
      const std::string name = std::string("column ") + (agg[0] == '+' ? "sum" : "maximum") + what;
      expect_same(cols, y, name, two);
      const sched::Nest& col_nest = update(*compile(cols, types_of(y), two));
      EXPECT_TRUE(col_nest.parallel_outer) << name;
      EXPECT_EQ(col_nest.outer_hi - col_nest.outer_lo + 1, 2) << name << ": one column tile per thread";
      const std::string width = t == DType::f32 ? "1008" : "1000";  // 1000 rounded up to whole lines of S
      EXPECT_NE(col_nest.tree.find("floor((d0)/" + width + ")"), std::string::npos) << name << "\n" << col_nest.tree;
      CompileOptions one = two;
      one.target.threads = 1;
      EXPECT_FALSE(update(*compile(cols, types_of(y), one)).parallel_outer) << name << " on one thread";
    }
  }
  // Column tiles of other forms, on three threads (three tiles): a shifted read, a reversed output under a
  // constraint, a product of two rows, a constant trailing output index.
  CompileOptions three = two;
  three.target.threads = 3;
  three.threads = 3;
  for (const char* body : {"S[j : C - 1] = +(X[i, j + 1]);", "S[C - 1 - j : C] = >(X[i, j]), i < N - 3;",
                           "S[j : C] = <(X[2 * i, j] * X[2 * i + 1, j]);", "S[j, 0 : C, 1] = +(X[i, j]);"}) {
    Program p = parse_program(std::string("function (X[N, C]) -> (S) { ") + body + " }");
    TensorMap y = inputs_for({{"X", {40, 530}}}, DType::f64, 14);
    expect_same(p, y, body, three);
    const sched::Nest& n = update(*compile(p, types_of(y), three));
    EXPECT_TRUE(n.parallel_outer) << body;
    EXPECT_EQ(n.outer_hi - n.outer_lo + 1, 3) << body << "\n" << n.tree;
  }
  Program total = parse_program("function (X[N, C]) -> (S) { S[0 : 1] = +(X[i, j]); }");
  TensorMap z = inputs_for({{"X", {512, 300}}}, DType::f64, 13);
  expect_same(total, z, "total", two);
  EXPECT_NE(print(compile(total, types_of(z), two)->program()).find("S_slices"), std::string::npos);
}

// The chunk tensors of a row group (sched::ChunkTensor), by name.
std::vector<std::string> chunk_tensor_names(const sched::NestGroup& g) {
  std::vector<std::string> out;
  for (const auto& t : g.chunk_tensors) out.push_back(t.tensor);
  return out;
}

// Row groups (sched::NestGroup): a softmax and its gradient run as one group of row-local nests, chunk by
// chunk, on the JIT's runtime and through an exported object's entry point; a nest that reads another row
// of what an earlier nest wrote starts a new group. Small chunks (a tiny L2) make every boundary count:
// grouping the shifted read wrongly would read rows the chunk has not computed yet. The tensors only a
// group touches live in each chunk's own memory (chunk tensors): a chunk tensor placed wrongly reads
// another row's or another tensor's values.
TEST(CpuTest, RowGroupsMatchTheInterpreter) {
  CompileOptions small;
  small.target.cpu.l2_bytes = 4096;
  small.target.threads = 2;
  small.threads = 2;
  CompileOptions verified = small;
  verified.verify = true;  // the program expect_same ran, proven pass by pass
  // Checked against the interpreter, then compiled again to inspect its schedule.
  auto checked = [&](const Program& p, const TensorMap& in, const std::string& what) {
    expect_same(p, in, what, small);
    return compile(p, types_of(in), verified);
  };
  const Program softmax = parse_program(
      "function (X[N, C]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n  E = exp(X - M);\n"
      "  S[i, 0 : N, 1] = +(E[i, j]);\n  O = E / S;\n}\n");
  // The gradient as the rules write it, through the maxima too (their adjoint, proven zero, is left out by
  // default): its comparisons and scatter to the maxima's arguments are more nests for the group to hold.
  ad::Options through_maxima;
  through_maxima.prove_zero_adjoints = false;
  const Program backward = ad::vjp(softmax, through_maxima).program;
  TensorMap in = inputs_for({{"X", {37, 50}}, {"DO", {37, 50}}}, DType::f32, 3);
  for (const auto& [what, p] : {std::pair{"softmax", softmax}, std::pair{"softmax gradient", backward}}) {
    TensorMap used = in;
    if (p.inputs.size() == 1) used.erase("DO");
    auto compiled = checked(p, used, what);
    CompileOptions one_thread = small;  // the runtime's serial path: every chunk on the caller's thread
    one_thread.threads = 1;
    expect_same(p, used, std::string(what) + " on one thread", one_thread);
    const auto& groups = compiled->schedule().groups;
    ASSERT_EQ(groups.size(), 1u) << what << "\n" << sched::print_loops(compiled->schedule());
    EXPECT_EQ(groups[0].first, 0u) << what;
    EXPECT_EQ(groups[0].last, compiled->schedule().nests.size() - 1) << what;
    EXPECT_LT(groups[0].rows, 8) << what;
    // Everything but the inputs and outputs: M, E and S; the gradient's own temporaries.
    const std::vector<std::string> chunked = chunk_tensor_names(groups[0]);
    if (p.inputs.size() == 1) EXPECT_EQ(chunked, (std::vector<std::string>{"E", "M", "S"})) << what;
    else EXPECT_GE(chunked.size(), 5u) << what << "\n" << sched::print_loops(compiled->schedule());
    for (const auto& t : chunked) {
      EXPECT_EQ(std::count(p.outputs.begin(), p.outputs.end(), t), 0) << what << ": output " << t << " in a chunk's memory";
      EXPECT_FALSE(used.count(t)) << what << ": input " << t << " in a chunk's memory";
    }
    // The exported entry point runs the group the same way.
    const TensorMap jit = compiled->run(used);
    const ExportedObject exported = export_object(p, types_of(used), "grouped", verified);
    EXPECT_NE(exported.header.find("Row groups run each task's chunks of rows in malloc'ed memory"), std::string::npos) << exported.header;
    const TensorMap loaded = load(exported)->run(used, 2);
    for (const auto& o : p.outputs) EXPECT_EQ(loaded.at(o).to_doubles(), jit.at(o).to_doubles()) << what;
    CompileOptions alone = verified;
    alone.target.cpu.row_groups = false;
    EXPECT_TRUE(compile(p, types_of(used), alone)->schedule().groups.empty());
  }
  // A max pool's gradient at batch 3: one image per chunk is more than a quarter of L2, so every nest's
  // outer loop runs over (image, row) pairs, and the whole gradient is one group.
  {
    CompileOptions pool_options = small;
    pool_options.target.cpu.l2_bytes = 1024;
    const Program pool = parse_program(
        "function (I[N, H, W, C]) -> (O) { O[n, y, x, c : N, H/2, W/2, C] = >(I[n, 2*y + j, 2*x + i, c]), j < 2, i < 2; }");
    const Program gradient = ad::vjp(pool).program;
    TensorMap pool_in = inputs_for({{"I", {3, 8, 12, 5}}, {"DO", {3, 4, 6, 5}}}, DType::f32, 9);
    expect_same(gradient, pool_in, "max pool gradient", pool_options);
    pool_options.verify = true;
    auto compiled = compile(gradient, types_of(pool_in), pool_options);
    const auto& schedule = compiled->schedule();
    ASSERT_EQ(schedule.groups.size(), 1u) << sched::print_loops(schedule);
    EXPECT_EQ(schedule.groups[0].first, 0u);
    EXPECT_EQ(schedule.groups[0].last, schedule.nests.size() - 1) << sched::print_loops(schedule);
    EXPECT_EQ(schedule.nests[0].outer_hi - schedule.nests[0].outer_lo + 1, 3 * 4) << sched::print_loops(schedule);
    // The maxima, their counts and the scaled gradient: iteration (n, y) touches elements n*4*6*5 + y*6*5
    // on, 30 of them (isl proves it of the row-major offsets).
    EXPECT_EQ(chunk_tensor_names(schedule.groups[0]), (std::vector<std::string>{"GO", "NO", "O"})) << sched::print_loops(schedule);
    for (const auto& t : schedule.groups[0].chunk_tensors) EXPECT_EQ(t.row_elements, 6 * 5) << t.tensor;
    const TensorMap loaded = load(export_object(gradient, types_of(pool_in), "pool", pool_options))->run(pool_in, 2);
    EXPECT_EQ(loaded.at("DI").to_doubles(), compiled->run(pool_in).at("DI").to_doubles());
  }
  // A batched softmax (attention's, over B x L rows of L): each batch is more than a quarter of L2, so the
  // elementwise nests run over (batch, row) pairs, and the row reductions and their inits fuse the same
  // pair (RowReduction::fused_outer): one group over 3 x 20 rows, forward and backward.
  {
    const Program batched = parse_program(
        "function (X[B, L, C]) -> (O) {\n  M[b, i, 0 : B, L, 1] = >(X[b, i, j]);\n  E = exp(X - M);\n"
        "  S[b, i, 0 : B, L, 1] = +(E[b, i, j]);\n  O = E / S;\n}\n");
    TensorMap x = inputs_for({{"X", {3, 20, 40}}, {"DO", {3, 20, 40}}}, DType::f32, 7);
    CompileOptions rows = small;  // row reductions at these sizes
    rows.target.cpu.microkernel_min_points = 0;
    CompileOptions rows_verified = rows;
    rows_verified.verify = true;
    for (const auto& [what, p] : {std::pair{"batched softmax", batched}, std::pair{"batched softmax gradient", ad::vjp(batched).program}}) {
      TensorMap used = x;
      if (p.inputs.size() == 1) used.erase("DO");
      expect_same(p, used, what, rows);
      auto compiled = compile(p, types_of(used), rows_verified);
      const auto& schedule = compiled->schedule();
      ASSERT_EQ(schedule.groups.size(), 1u) << what << "\n" << sched::print_loops(schedule);
      EXPECT_EQ(schedule.groups[0].first, 0u) << what;
      EXPECT_EQ(schedule.groups[0].last, schedule.nests.size() - 1) << what << "\n" << sched::print_loops(schedule);
      size_t fused = 0;
      for (const auto& n : schedule.nests) {
        EXPECT_EQ(n.outer_hi - n.outer_lo + 1, 3 * 20) << what << ": " << n.name << "\n" << sched::print_loops(schedule);
        fused += n.reduction && !n.reduction->fused_outer.empty();
      }
      EXPECT_GE(fused, 2u) << what;
      const TensorMap loaded = load(export_object(p, types_of(used), "batched", rows_verified))->run(used, 2);
      for (const auto& o : p.outputs) EXPECT_EQ(loaded.at(o).to_doubles(), compiled->run(used).at(o).to_doubles()) << what;
    }
  }
  // Chunk tensors of every element size: bool (1 byte), f16, f32 and f64 rows of 37 elements, placed at
  // their offsets in the chunk memory, in the JIT and in an exported object. (B reads X and H: with only
  // one operand of its shape, it would be computed in O and in K's sum, no tensor.)
  {
    const Program mixed = parse_program(
        "function (X[N, C]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n  H = exp(cast(X - M, f16));\n  B = X < M * 0.5 && H < 0.9;\n"
        "  S[i, 0 : N, 1] = +(H[i, j]);\n  K[i, 0 : N, 1] = +(B[i, j]);\n  D = cast(X, f64) * 2;\n  T[i, 0 : N, 1] = +(D[i, j]);\n"
        "  O = select(B, H / S, K + T);\n}\n");
    TensorMap x = inputs_for({{"X", {41, 37}}}, DType::f32, 6);
    auto compiled = checked(mixed, x, "chunk tensors of every element size");
    ASSERT_EQ(compiled->schedule().groups.size(), 1u) << sched::print_loops(compiled->schedule());
    const std::vector<std::string> chunked = chunk_tensor_names(compiled->schedule().groups[0]);
    for (const char* t : {"B", "H", "M", "T"})
      EXPECT_EQ(std::count(chunked.begin(), chunked.end(), t), 1) << t << "\n" << sched::print_loops(compiled->schedule());
    const TensorMap loaded = load(export_object(mixed, types_of(x), "mixed", verified))->run(x, 2);
    EXPECT_EQ(loaded.at("O").to_doubles(), compiled->run(x).at("O").to_doubles());
  }
  // E, read by P's update in another row of it, outside the group, keeps its full-size memory; M and S
  // do not.
  {
    const Program read_later = parse_program(
        "function (X[N, C]) -> (O, P) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n  E = exp(X - M);\n"
        "  S[i, 0 : N, 1] = +(E[i, j]);\n  O = E / S;\n  P[i, j : N, C] = +(E[N - 1 - i, j]);\n}\n");
    TensorMap x = inputs_for({{"X", {37, 50}}}, DType::f32, 5);
    auto compiled = checked(read_later, x, "softmax with a later read of E");
    ASSERT_GE(compiled->schedule().groups.size(), 1u) << sched::print_loops(compiled->schedule());
    EXPECT_EQ(chunk_tensor_names(compiled->schedule().groups[0]), (std::vector<std::string>{"M", "S"}))
        << sched::print_loops(compiled->schedule());
  }
  // B's row i reads row N - 1 - i of A: B's update starts a new group, with O. (Each element of B has one
  // term: B's update stores it, and B has no init nest.)
  const Program shifted = parse_program(
      "function (X[N, C]) -> (O) {\n  A = exp(X);\n  B[i, j : N, C] = +(A[N - 1 - i, j]);\n  O = B * 2;\n}\n");
  TensorMap x = inputs_for({{"X", {29, 40}}}, DType::f32, 4);
  auto compiled = checked(shifted, x, "shifted rows");
  const auto& nests = compiled->schedule().nests;
  auto index = [&](const std::string& name) {
    for (size_t k = 0; k < nests.size(); ++k)
      if (nests[k].name == name) return k;
    ADD_FAILURE() << "no nest " << name;
    return size_t{0};
  };
  const size_t a = index("A.elementwise"), b = index("B.update");
  for (const auto& g : compiled->schedule().groups) EXPECT_FALSE(g.first <= a && b <= g.last) << sched::print_loops(compiled->schedule());
  ASSERT_EQ(compiled->schedule().groups.size(), 1u) << sched::print_loops(compiled->schedule());
  EXPECT_EQ(compiled->schedule().groups[0].first, b);
  EXPECT_EQ(compiled->schedule().groups[0].last, index("O.elementwise"));
  EXPECT_TRUE(nests[b].stores);
  EXPECT_EQ(chunk_tensor_names(compiled->schedule().groups[0]), (std::vector<std::string>{"B"}));
  const TensorMap loaded = load(export_object(shifted, types_of(x), "shifted", verified))->run(x, 2);
  EXPECT_EQ(loaded.at("O").to_doubles(), compiled->run(x).at("O").to_doubles());
}

// A sum whose elements each get one term at most (isl: the write is injective) stores 0 + term without
// reading the element, and only the elements no term writes get an init nest: a strided scatter leaves the
// odd elements to it; -0.0 terms still sum to +0.0, as the interpreter's 0 + (-0.0) does; a max pool's
// gradient scatters this way.
TEST(CpuTest, SumsWithOneTermPerElementStoreIt) {
  const Program scatter = parse_program("function (X[N]) -> (O) { O[2*i : 2*N + 1] = +(X[i]); }");
  TensorMap in{{"X", Buffer::from_values(DType::f32, {4}, {-0.0, 1.5, -0.0, -2.0})}};
  auto compiled = compile(scatter, types_of(in));
  const auto& nests = compiled->schedule().nests;
  ASSERT_EQ(nests.size(), 2u) << sched::print_loops(compiled->schedule());
  EXPECT_EQ(nests[0].kind, sched::Nest::Kind::init);
  EXPECT_TRUE(nests[1].stores);
  // Into an output holding 7s: every element is written, the odd ones by the init nest.
  TensorMap got{{"O", Buffer::from_values(DType::f32, {9}, std::vector<double>(9, 7.0))}};
  const TensorMap want = interpret(scatter, in);
  for (int round = 0; round < 2; ++round) {
    compiled->run(in, got);
    ASSERT_EQ(got.at("O").size(), 9);
    for (int64_t e = 0; e < 9; ++e) {
      EXPECT_EQ(got.at("O").get(e), want.at("O").get(e)) << e;
      EXPECT_EQ(std::signbit(got.at("O").get(e)), std::signbit(want.at("O").get(e))) << e;
    }
  }
  const Program pool = parse_program(
      "function (I[N, H, W, C]) -> (O) { O[n, y, x, c : N, H/2, W/2, C] = >(I[n, 2*y + j, 2*x + i, c]), j < 2, i < 2; }");
  const Program gradient = ad::vjp(pool).program;
  TensorMap pool_in = inputs_for({{"I", {2, 6, 8, 3}}, {"DO", {2, 3, 4, 3}}}, DType::f32, 8);
  expect_same(gradient, pool_in, "max pool gradient");
  CompileOptions verified;
  verified.verify = true;
  bool stores = false;
  for (const auto& nest : compile(gradient, types_of(pool_in), verified)->schedule().nests) stores |= nest.tensor == "DI" && nest.stores;
  EXPECT_TRUE(stores);
}

// log, sin, cos, pow and f64 exp vectorize through glibc's vector math library where the system has it,
// on AVX-512 machines in its 16-lane (f32) and 8-lane (f64) variants (f32 exp is inline arithmetic: see
// ExpF32IsWithinOneUlp); all agree with the interpreter.
TEST(CpuTest, VectorMathMatchesTheInterpreter) {
  const Program p = parse_program(
      "function (X[N], Y[N]) -> (O) { O = exp(X) + log(Y) + sin(X) * cos(Y) + pow(Y, X); }");
  for (DType t : {DType::f32, DType::f64}) {
    Buffer x(t, {4099}), y(t, {4099});
    for (int64_t e = 0; e < x.size(); ++e) {
      x.set(e, std::sin(0.37 * static_cast<double>(e)) * 4);
      y.set(e, 0.01 + 0.003 * static_cast<double>(e));
    }
    const TensorMap in{{"X", x}, {"Y", y}};
    expect_same(p, in, "vector math in " + to_string(t));
    const std::string& ir = compile(p, types_of(in))->llvm_ir();
    const bool mvec = ir.find("_ZGV") != std::string::npos;  // libmvec is there
    __builtin_cpu_init();
    const bool wide = __builtin_cpu_supports("avx512f");
    if (!mvec) {
      std::cout << "no libmvec on this system: the loops call libm\n";
      continue;
    }
    EXPECT_EQ(ir.find(t == DType::f32 ? "_ZGVeN16v_logf" : "_ZGVeN8v_exp") != std::string::npos, wide) << ir.substr(0, 2000);
    EXPECT_EQ(ir.find("_ZGVeN16v_expf"), std::string::npos) << ir.substr(0, 2000);
  }
}

// The libm functions that glibc 2.35's libmvec also has in vector form (tanh, erf, tan, asin, acos, atan,
// sinh, cosh) in a loop the vectorizer takes (an elementwise nest) and in vector code the emitter writes
// itself (a matmul's fused epilogue, micro-kernels forced on 512-, 256- and 128-bit vectors: libmvec's
// AVX-512, AVX2 and SSE widths), f32 and f64: within 8 ulp of the interpreter's correctly rounded values
// (libmvec's worst, measured over every 97th f32: erf 4 ulp near 1, tan 3.8), NaN and infinities where it
// has them. Where the process has libmvec's 16-lane tanhf and the host AVX-512, the code calls it (before:
// tanhf per element, 31x slower on a 4096x1024 tanh) and no lane-by-lane function is left.
TEST(CpuTest, LibmFunctionsRunOnVectorMathVariants) {
  const std::vector<double> special{0.0, -0.0, 1e-30, -1e-30, 1e-5, 0.5, -0.75, 8.0, -8.0, 9.5, 88.0, -89.0, 500.0, -1e4,
                                    std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN()};
  auto ulps = [](double got, double want, DType t) {
    if (std::isnan(want)) return std::isnan(got) ? 0.0 : 1e30;
    if (std::isinf(want)) return got == want ? 0.0 : 1e30;
    const double w = t == DType::f32 ? static_cast<double>(static_cast<float>(want)) : want;
    double ulp = t == DType::f32 ? std::nextafter(std::fabs(static_cast<float>(w)), INFINITY) - std::fabs(static_cast<float>(w))
                                 : std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
    if (!(ulp > 0) || std::isinf(ulp)) ulp = t == DType::f32 ? std::ldexp(1.0, -149) : std::ldexp(1.0, -1074);
    return std::fabs(got - w) / ulp;
  };
  const bool avx512 = __builtin_cpu_supports("avx512f");
  for (const char* f : {"tanh(C)", "erf(C)", "tan(C)", "asin(C / 8)", "acos(C / 8)", "atan(C)", "sinh(C)", "cosh(C)"}) {
    const Program elementwise = parse_program(std::string("function (C[M, K]) -> (Y) { Y = ") + f + "; }");
    // B is a row of ones and X a column: C[i, j] = X[i, 0], exactly the value the elementwise run gets.
    const Program epilogue = parse_program(std::string("function (X[M, L], B[L, K]) -> (Y) { C[i, j : M, K] = +(X[i, l] * B[l, j]); Y = ") +
                                           f + "; }");
    for (DType t : {DType::f32, DType::f64}) {
      const int64_t rows = 37, cols = 29;  // not multiples of any vector's lanes: remainders too
      Buffer c(t, {rows, cols}), x(t, {rows * cols, 1}), ones(t, {1, cols});
      for (int64_t e = 0; e < c.size(); ++e)
        c.set(e, e < static_cast<int64_t>(special.size()) ? special[e] : 12.0 * std::sin(0.731 * static_cast<double>(e)));
      for (int64_t e = 0; e < c.size(); ++e) x.set(e, c.get(e));  // row e of the epilogue's C: C's element e
      for (int64_t j = 0; j < cols; ++j) ones.set(j, 1.0);
      const std::string what = std::string(f) + " in " + to_string(t);
      const Buffer want = interpret(elementwise, {{"C", c}}).at("Y"), got = run(elementwise, {{"C", c}}).at("Y");
      for (int64_t e = 0; e < c.size(); ++e)
        EXPECT_LE(ulps(got.get(e), want.get(e), t), 8.0) << what << " at " << c.get(e) << ": " << got.get(e) << " vs " << want.get(e);
      const TensorMap in{{"X", x}, {"B", ones}};
      const Buffer exact = interpret(epilogue, in).at("Y");
      for (int bits : {512, 256, 128}) {
        const auto compiled = compile(epilogue, types_of(in), microkernels_forced(bits));
        int fused = 0;
        for (const auto& nest : compiled->schedule().nests) fused += nest.epilogue.has_value();
        EXPECT_EQ(fused, 1) << what << " on " << bits << "-bit vectors";
        TensorMap out;
        compiled->run(in, out);
        for (int64_t e = 0; e < exact.size(); ++e)
          EXPECT_LE(ulps(out.at("Y").get(e), exact.get(e), t), 8.0)
              << what << " at " << x.get(e / cols) << ", epilogue on " << bits << "-bit vectors: " << out.at("Y").get(e) << " vs "
              << exact.get(e);
        EXPECT_EQ(compiled->llvm_ir().find("polytile.lanes."), std::string::npos) << what;  // replaced or inlined
      }
      // SSE code (x86-64-v2) on 256-bit vectors: no variant has their lanes (libmvec's SSE ones take 128
      // bits), so the lane-by-lane calls are inlined, libm per element.
      CompileOptions sse = microkernels_forced(256);
      sse.target = cpu_target("x86-64-v2");
      sse.target.cpu.vector_bits = 256;
      sse.target.cpu.microkernel_min_points = 0;
      const auto compiled = compile(epilogue, types_of(in), sse);
      EXPECT_TRUE(compiled->schedule().nests.back().epilogue.has_value()) << what;
      const std::string sse_ir = compiled->llvm_ir();
      EXPECT_EQ(sse_ir.find("polytile.lanes."), std::string::npos) << what;
      EXPECT_EQ(sse_ir.find("_ZGV"), std::string::npos) << what;
      TensorMap out;
      compiled->run(in, out);
      for (int64_t e = 0; e < exact.size(); ++e)
        EXPECT_LE(ulps(out.at("Y").get(e), exact.get(e), t), 8.0) << what << " at " << x.get(e / cols) << ", SSE code";
      const std::string name = std::string(f).substr(0, std::string(f).find('('));
      const std::string variant = t == DType::f32 ? "_ZGVeN16v_" + name + "f" : "_ZGVeN8v_" + name;
      if (!avx512 || !dlsym(RTLD_DEFAULT, variant.c_str())) {
        std::cout << "no AVX-512 or no " << variant << " in this process (glibc before 2.35): libm per lane\n";
        continue;
      }
      const std::string plain = compile(elementwise, {{"C", {t, c.shape()}}})->llvm_ir();
      EXPECT_NE(plain.find("call <" + std::string(t == DType::f32 ? "16 x float" : "8 x double") + "> @" + variant), std::string::npos)
          << what;
      EXPECT_NE(compile(epilogue, types_of(in), microkernels_forced(512))->llvm_ir().find("@" + variant), std::string::npos) << what;
    }
  }
}

// The host's f32 exp (llvm_ir values.cpp exp_f32: range reduction, a degree-6 polynomial, two exact
// scalings) against the correctly rounded e^x (libm's double exp, rounded): within one ulp -- of the
// subnormal spacing below 2^-126 -- on every 523rd f32 from -104 to 89 (4.3 million, every binade, the
// subnormal results included; the whole range, run once by hand, peaks at 0.91 ulp), and exact where e^x
// is exact or saturates: 0 and 1, overflow to inf, underflow to 0, inf, -inf, NaN. Vectorized and in the
// scalar remainder loop, and in sigmoid.
TEST(CpuTest, ExpF32IsWithinOneUlp) {
  std::vector<float> xs;
  const uint32_t lo = std::bit_cast<uint32_t>(89.0f), neg = std::bit_cast<uint32_t>(-104.0f);
  for (uint32_t b = 0; b <= lo; b += 523) xs.push_back(std::bit_cast<float>(b));
  for (uint32_t b = 0x80000000u; b <= neg; b += 523) xs.push_back(std::bit_cast<float>(b));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> special{0.0f, -0.0f, 88.72283f, 88.7228394f, 89.0f, 1e30f, inf, -103.972f, -103.973f, -104.0f,
                                   -1e30f, -inf, nan, -87.3365479f, 1.0f};
  xs.insert(xs.end(), special.begin(), special.end());
  Buffer x(DType::f32, {static_cast<int64_t>(xs.size())});
  std::copy(xs.begin(), xs.end(), static_cast<float*>(x.data()));
  const Program p = parse_program("function (X[N]) -> (O, S) { O = exp(X); S = sigmoid(X); }");
  TensorMap out;
  compile(p, {{"X", {DType::f32, x.shape()}}})->run({{"X", x}}, out);
  const float* o = static_cast<const float*>(out.at("O").data());
  const float* sg = static_cast<const float*>(out.at("S").data());
  double worst = 0;
  float at = 0;
  for (size_t e = 0; e < xs.size(); ++e) {
    const double want = std::exp(static_cast<double>(xs[e]));
    if (std::isnan(xs[e])) {
      EXPECT_TRUE(std::isnan(o[e]));
      continue;
    }
    if (static_cast<float>(want) == o[e]) continue;  // correctly rounded (inf and 0 included)
    ASSERT_TRUE(std::isfinite(o[e]) && want <= std::numeric_limits<float>::max()) << "exp(" << xs[e] << ") = " << o[e];
    int exponent = 0;
    std::frexp(want, &exponent);
    const double ulp = std::ldexp(1.0, std::max(exponent - 24, -149));
    const double error = std::abs(static_cast<double>(o[e]) - want) / ulp;
    if (error > worst) worst = error, at = xs[e];
  }
  EXPECT_LT(worst, 1.0) << "at x = " << at;
  std::cout << "f32 exp: at most " << worst << " ulp (x = " << at << ") on " << xs.size() << " values\n";
  EXPECT_EQ(o[xs.size() - 1], static_cast<float>(std::exp(1.0)));
  for (size_t e = 0; e < xs.size(); ++e) {  // sigmoid = 1 / (1 + exp(-x)) in f32, on the same values
    if (std::isnan(xs[e])) continue;
    const float want = 1.0f / (1.0f + static_cast<float>(std::exp(-static_cast<double>(xs[e]))));
    ASSERT_NEAR(sg[e], want, 3e-7 * want + 1e-44) << "sigmoid(" << xs[e] << ")";
  }
}

// exp_f32's formula (llvm_ir values.cpp) step by step in C++: the scalar code the emitter writes.
float exp_f32_formula(float x) {
  float xc = x > 89.0f ? 89.0f : x;
  xc = xc < -104.0f ? -104.0f : xc;
  const float magic = 0x1.8p23f;
  const float t = std::fma(xc, 0x1.715476p+0f, magic);
  const float k = t - magic;
  float r = std::fma(k, -0x1.62e4p-1f, xc);
  r = std::fma(k, -0x1.7f7d1cp-20f, r);
  float p = 0x1.6a233ep-10f;
  for (float c : {0x1.123a76p-7f, 0x1.5558f6p-5f, 0x1.55549p-3f, 0x1.fffffcp-2f, 1.0f, 1.0f}) p = std::fma(p, r, c);
  const int32_t bits = std::bit_cast<int32_t>(t), half = bits >> 1, rest = bits - half;
  auto power = [](int32_t biased) { return std::bit_cast<float>((static_cast<uint32_t>(biased) + (127u - 0x25A00000u)) << 23); };
  return p * power(half) * power(rest);
}

// The vector code's e^x is the scalar formula's, bit for bit: with AVX-512 its last step is one vscalefps
// (the CPU backend's ScaleByPowersOfTwo rewrites the two integer-made powers of two; 16 lanes, and 8 in
// the vectorizer's epilogue with AVX512VL), which rounds the same exact product once. 16 x 4096 + 11 and
// 16 x 8192 + 11 values over the whole range (the subnormal results, overflow, underflow, inf, NaN): the
// main vector loop, its 8-lane epilogue and the scalar rest all run. The rewrite is in the module on AVX-512 hosts.
TEST(CpuTest, VectorExpIsTheScalarFormulaBitForBit) {
  // 16 x 4096 + 11 points take the brief pipeline of small nests, 16 x 8192 + 11 (above 2^17) O3.
  for (int64_t n : {16 * 4096 + 11, 16 * 8192 + 11}) {
    SCOPED_TRACE(std::to_string(n) + " values");
    std::vector<float> xs;
    for (int64_t e = 0; e < n; ++e) xs.push_back(static_cast<float>(-110.0 + 200.0 * static_cast<double>(e) / static_cast<double>(n)));
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> special{0.0f, -0.0f, 88.72283f, 88.7228394f, 89.0f, inf, -103.972f, -103.973f, -104.0f, -inf,
                                     std::numeric_limits<float>::quiet_NaN(), -87.3365479f, 1.0f};
    std::copy(special.begin(), special.end(), xs.begin() + 1000);          // in the vector loop
    std::copy(special.begin() + 5, special.begin() + 11, xs.end() - 11);  // in the 8-lane epilogue
    std::copy(special.begin(), special.begin() + 3, xs.end() - 3);        // in the scalar rest
    Buffer x(DType::f32, {n});
    std::copy(xs.begin(), xs.end(), static_cast<float*>(x.data()));
    const Program p = parse_program("function (X[N]) -> (O) { O = exp(X); }");
    auto compiled = compile(p, {{"X", {DType::f32, x.shape()}}});
    const TensorMap out = compiled->run({{"X", x}});
    const float* o = static_cast<const float*>(out.at("O").data());
    for (size_t e = 0; e < xs.size(); ++e) {
      const float want = exp_f32_formula(xs[e]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(o[e])) << "exp(" << xs[e] << ") at " << e;
        continue;
      }
      ASSERT_EQ(std::bit_cast<uint32_t>(o[e]), std::bit_cast<uint32_t>(want)) << "exp(" << xs[e] << ") at " << e << ": " << o[e] << " against " << want;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f");
    EXPECT_EQ(compiled->llvm_ir().find("@llvm.x86.avx512.mask.scalef.ps.512(") != std::string::npos, avx512) << compiled->llvm_ir().substr(0, 3000);
#endif
  }
}

// A division by a divisor that stays the same along a loop is computed through its f64 reciprocal on
// AVX-512 (the CPU backend's DivideByInvariants): the quotient must still be the f32 division's, bit for
// bit. Every row's values are random bit patterns (subnormals, infinities, NaN, zeros of both signs);
// its divisor is one of the special values or random bits. 1035 columns: the 16-lane loop, an 8-lane
// epilogue and the scalar rest; 64 rows take the brief pipeline of small nests, 256 rows O3.
TEST(CpuTest, DivisionByARowsDivisorIsTheDivisionBitForBit) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> special{0.0f, -0.0f, inf, -inf, nan, 1.0f, 3.0f, -0.1f, 0x1p-149f, -0x1.fffffcp-127f, 0x1p-126f,
                                   0x1.fffffep127f, 0x1p127f, 0x1.000002p0f, 0x1.fffffep0f, 1e-40f, 7e37f};
  const Program p = parse_program("function (X[N, C], D[N, 1]) -> (O) { O = X / D; }");
  std::mt19937 bits(11);
  for (int64_t rows : {64, 256}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const int64_t columns = 16 * 64 + 11;
    Buffer x(DType::f32, {rows, columns}), d(DType::f32, {rows, 1});
    float* xs = static_cast<float*>(x.data());
    float* ds = static_cast<float*>(d.data());
    for (int64_t e = 0; e < rows * columns; ++e) xs[e] = std::bit_cast<float>(static_cast<uint32_t>(bits()));
    for (int64_t r = 0; r < rows; ++r) {
      ds[r] = r < static_cast<int64_t>(special.size()) ? special[r] : std::bit_cast<float>(static_cast<uint32_t>(bits()));
      // A row of the special values too, against this row's divisor: in the vector loop and in the rest.
      std::copy(special.begin(), special.end(), xs + r * columns + 100);
      std::copy(special.begin(), special.begin() + 8, xs + r * columns + columns - 8);
    }
    auto compiled = compile(p, {{"X", {DType::f32, x.shape()}}, {"D", {DType::f32, d.shape()}}});
    const TensorMap out = compiled->run({{"X", x}, {"D", d}});
    const float* o = static_cast<const float*>(out.at("O").data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < columns; ++c) {
        const float want = xs[r * columns + c] / ds[r], got = o[r * columns + c];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << xs[r * columns + c] << " / " << ds[r] << " at " << r << ", " << c;
          continue;
        }
        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
            << std::hexfloat << xs[r * columns + c] << " / " << ds[r] << " at " << r << ", " << c << ": " << got << " against " << want;
      }
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f");
    EXPECT_EQ(compiled->llvm_ir().find("%reciprocal = fdiv double 1.0") != std::string::npos, avx512) << compiled->llvm_ir().substr(0, 3000);
#endif
  }
}

TEST(CpuTest, EveryExampleUnderGpuSemantics) {
  int n = 0;
  for (const auto& [path, shapes] : testing::examples_with_shapes(POLYTILE_SOURCE_DIR "/examples")) {
    Program p = parse_file(path.string());
    for (const auto& [what, options] : gpu_semantics())
      for (DType t : {DType::f32, DType::f64})
        expect_same(p, inputs_for(shapes, t, 7), path.filename().string() + " on " + what, options);
    ++n;
  }
  EXPECT_GE(n, 19);
}

// The data gradient of a padded stride-2 3x3 convolution (after reduce and defract: two residues per
// spatial axis) at a size where isl guards the threads' code by a looser condition than the copies' (loops
// that then run no iteration). The barriers run in every reduction tile, outside both guards; under the
// copies' guard, check_barriers found a path from the threads' reads to the next tile's copy with no
// barrier between them, and the compilation failed.
TEST(CpuTest, AStridedConvGradientKeepsABarrierOnEveryPath) {
  Program p = parse_program(
      "function (K[KH, KW, CI, CO], DO[N, OH, OW, CO]) -> (DI) {\n"
      "  DI[v0, v1_0 + 2*v1_1 - 1, v2_0 + 2*v2_1 - 1, v3 : N, 28, 28, CI] = +(K[v1_0 + 2*v4_0, v2_0 + 2*v5_0, v3, v6] * "
      "DO[v0, v1_1 - v4_0, v2_1 - v5_0, v6]), v1_0 < 2, v2_0 < 2;\n}");
  CompileOptions sm90;
  sm90.target = sched::gpu_target("sm_90");
  const Shapes shapes{{"K", {3, 3, 64, 64}}, {"DO", {2, 14, 14, 64}}};
  auto compiled = compile(p, {{"K", {DType::f32, {3, 3, 64, 64}}}, {"DO", {DType::f32, {2, 14, 14, 64}}}}, sm90);
  const sched::Nest& update = compiled->schedule().nests.back();
  ASSERT_FALSE(update.shared.empty()) << "the update reads no shared tile: the test lost its subject";
  expect_same(p, inputs_for(shapes, DType::f32, 11), "the stride-2 data gradient on sm_90", sm90);
}

// Every model GPU tuning tries (sched::gpu_tuning_candidates) computes what the interpreter computes, on a
// padded conv and both its gradients at sizes where the models map them differently (threads fitted to
// 16 or 40 channels, register tiles partial at the borders, a weight gradient in split reductions).
TEST(CpuTest, EveryGpuTuningCandidateUnderGpuSemantics) {
  const std::string conv = "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
                           "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }";
  const Program forward = parse_program(conv);
  ad::Result grad = ad::vjp(forward);
  const Shapes shapes{{"I", {2, 10, 12, 16}}, {"K", {3, 3, 16, 40}}};
  Shapes grad_shapes = shapes;
  grad_shapes[grad.program.inputs.back().name] = {2, 10, 12, 40};
  const auto candidates = sched::gpu_tuning_candidates();
  ASSERT_EQ(candidates.size(), 6u);
  for (const auto& [what, model] : candidates) {
    CompileOptions options;
    options.target = sched::gpu_target("sm_90");
    options.target.gpu = model;
    options.target.gpu->min_blocks = 64;  // the weight gradient's 3x3x16x40 outputs: split
    expect_same(forward, inputs_for(shapes, DType::f32, 5), "the padded conv on " + what, options);
    expect_same(grad.program, inputs_for(grad_shapes, DType::f32, 6), "its gradient on " + what, options);
  }
}

// Register tiles whose rows isl guards (a padded convolution's edge: 10 threads of 4 rows along 40
// columns) run branch-free where masked: the rows out of range read clamped elements of the shared tiles
// (NaN on the host) and keep their accumulators. Unswitched (the default), the threads whose rows are all
// in range run a copy of the reduction loop without the guards, the others the guarded (or masked) loop;
// a thread at the edge in the unguarded copy would read NaN. A sum (one FMA, selected) and a max (the
// aggregation, selected) agree with the interpreter in all four ways.
TEST(CpuTest, MaskedAndBranchingRegisterTilesAgree) {
  const Shapes shapes{{"I", {2, 5, 40, 16}}, {"K", {3, 3, 16, 24}}};
  for (const char* op : {"+", ">"}) {
    const Program conv = parse_program(std::string("function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
                                                   "  O[n, y, x, co : N, H, W, CO] = ") +
                                       op + "(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
    for (bool masked : {true, false})
      for (bool unswitch : {true, false}) {
        CompileOptions options;
        options.target = sched::gpu_target("sm_90");
        options.target.gpu->masked_registers = masked;
        options.target.gpu->unswitch_registers = unswitch;
        const std::string what = std::string(op) + (masked ? " masked" : " branching") + (unswitch ? ", unswitched" : "");
        auto compiled = compile(conv, {{"I", {DType::f32, shapes.at("I")}}, {"K", {DType::f32, shapes.at("K")}}}, options);
        const sched::Nest& update = compiled->schedule().nests.back();
        ASSERT_TRUE(update.accumulators && update.accumulators->elements() == 4) << what << ": the test lost its subject";
        expect_same(conv, inputs_for(shapes, DType::f32, 7), what, options);
      }
  }
}

// A GPU update that writes every output element and keeps its accumulators across its steps starts them at
// the aggregation's identity, and no init kernel writes the output first (a matmul's sum, a max); one that
// leaves elements without points (a stride-2 sum over half the input's length) keeps its init kernel. Each
// against the interpreter on caller memory filled with NaN: an element no kernel writes shows.
TEST(CpuTest, GpuUpdatesCoveringEveryElementStartAtTheIdentity) {
  CompileOptions o;
  o.target = sched::gpu_target("sm_90");
  const Program sum = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  const Program max = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = >(A[i, k] * B[k, j]); }");
  const Program strided = parse_program("function (A[N], B[N, M]) -> (C) { C[i, j : N, M] = +(A[2 * i + k] * B[i, j]), k < 2; }");
  const Shapes matrices{{"A", {40, 24}}, {"B", {24, 36}}};
  const std::vector<std::tuple<const Program*, Shapes, bool>> cases = {
      {&sum, matrices, true}, {&max, matrices, true}, {&strided, {{"A", {64}}, {"B", {64, 40}}}, false}};
  for (const auto& [program, shapes, covered] : cases) {
    const TensorMap in = inputs_for(shapes, DType::f32, 9);
    auto compiled = compile(*program, types_of(in), o);
    const std::string loops = sched::print_loops(compiled->schedule());
    EXPECT_EQ(loops.find(".init (") == std::string::npos, covered) << loops;
    EXPECT_EQ(loops.find("= identity") != std::string::npos, covered) << loops;
    const TensorMap want = interpret(*program, in);
    ViewMap inputs, outputs;
    for (const auto& [name, buffer] : in) inputs[name] = TensorView::of(buffer);
    TensorMap got;
    for (const std::string& name : program->outputs) {
      got[name] = Buffer(DType::f32, want.at(name).shape());
      for (int64_t e = 0; e < got.at(name).size(); ++e) got.at(name).set(e, std::nan(""));
      outputs[name] = TensorView::of(got.at(name));
    }
    compiled->run(inputs, outputs);
    for (const auto& [name, buffer] : want)
      for (int64_t e = 0; e < buffer.size(); ++e)
        ASSERT_NEAR(got.at(name).get(e), buffer.get(e), 1e-4 * std::max(1.0, std::fabs(buffer.get(e)))) << name << "[" << e << "]\n" << loops;
  }
}

// A shared tile's copy moves 16-byte vectors where its rows, the input's rows and the block's origin
// allow and the input's address is aligned (checked in each block), else element by element. Under GPU
// semantics: a matmul (every tile in vectors where the inputs are aligned), the same on inputs one element
// past 16-byte alignment (every copy element by element), and a 9-tap window whose tiles of 136 columns
// start 3 columns before their block's 128 (element by element: the origin is not a multiple of 4), all
// against the interpreter; without the fallback the misaligned runs read NaN from the tiles.
TEST(CpuTest, SharedTileCopiesMoveVectorsWhereAligned) {
  CompileOptions o;
  o.target = sched::gpu_target("sm_90");
  const Program matmul = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  const Program window = parse_program(
      "function (A[M, N], W[T]) -> (O) { O[i, j : M, N] = +(A[i, j + k - 3] * W[k]), k < 9; }");
  const std::vector<std::pair<const Program*, Shapes>> cases = {{&matmul, {{"A", {64, 32}}, {"B", {32, 48}}}},
                                                                {&window, {{"A", {8, 520}}, {"W", {9}}}}};
  for (const auto& [program, shapes] : cases) {
    const TensorMap in = inputs_for(shapes, DType::f32, 3);
    auto compiled = compile(*program, types_of(in), o);
    bool promoted = false;
    for (const sched::Nest& nest : compiled->schedule().nests) promoted = promoted || !nest.shared.empty();
    ASSERT_TRUE(promoted) << "no shared tile: the test lost its subject\n" << sched::print_loops(compiled->schedule());
    expect_same(*program, in, "aligned inputs", o);
    const TensorMap want = interpret(*program, in);
    std::map<std::string, std::vector<float>> memory;
    ViewMap inputs, outputs;
    for (const auto& [name, buffer] : in) {
      std::vector<float>& m = memory[name];
      m.assign(static_cast<size_t>(buffer.size()) + 8, 0.0f);
      float* at = m.data() + 4 - (reinterpret_cast<uintptr_t>(m.data()) % 16) / sizeof(float) + 1;
      std::memcpy(at, buffer.data(), static_cast<size_t>(buffer.byte_size()));
      inputs[name] = TensorView{at, DType::f32, buffer.shape(), {}};
    }
    TensorMap got;
    for (const std::string& name : program->outputs) {
      got[name] = Buffer(DType::f32, want.at(name).shape());
      outputs[name] = TensorView::of(got.at(name));
    }
    compiled->run(inputs, outputs);
    for (const auto& [name, buffer] : want)
      for (int64_t e = 0; e < buffer.size(); ++e)
        ASSERT_NEAR(got.at(name).get(e), buffer.get(e), 1e-4 * std::max(1.0, std::fabs(buffer.get(e)))) << name << "[" << e << "], misaligned inputs";
  }
}

// A rank-0 input read at every point (a scalar compared with itself in a cond) is promoted to a shared
// tile of no dimensions, its one element: copied as an element (the vector copies
// read the tile's last dimension, which it does not have: the copy crashed; the differential fuzzer's GPU
// semantics found it), against the interpreter.
TEST(CpuTest, RankZeroSharedTilesAreCopiedAsOneElement) {
  const Program p = parse_program(
      "function (A[], B[M, N]) -> (O) { O[i : 3] = +(A[] == A[] ? B[j - i + 2, 2*j]), i < 3, j < 1, k < 3; }");
  CompileOptions o;
  o.target = sched::gpu_target("sm_90");
  TensorMap in = inputs_for({{"B", {4, 6}}}, DType::f32, 5);
  in["A"] = Buffer::from_values(DType::i32, {}, {7});
  auto compiled = compile(p, types_of(in), o);
  bool scalar_tile = false;
  for (const sched::Nest& nest : compiled->schedule().nests)
    for (const sched::SharedTile& tile : nest.shared) scalar_tile = scalar_tile || (tile.tensor == "A" && tile.sizes.empty());
  ASSERT_TRUE(scalar_tile) << "no rank-0 shared tile: the test lost its subject\n" << sched::print_loops(compiled->schedule());
  expect_same(p, in, "a rank-0 shared tile", o);
}

// The GPU model decides the kernels' launches: two models of one architecture are two compilations.
TEST(CpuTest, TheGpuModelIsPartOfTheCacheKey) {
  Program p = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  std::map<std::string, TensorType> types{{"A", {DType::f32, {40, 16}}}, {"B", {DType::f32, {16, 50}}}};
  CompileOptions wide, narrow;
  wide.target = narrow.target = sched::gpu_target("sm_90");
  narrow.target.gpu->threads_per_block = 8;
  auto a = compile(p, types, wide), b = compile(p, types, narrow);
  EXPECT_NE(a, b);
  EXPECT_NE(a->schedule().nests.back().kernel->block, b->schedule().nests.back().kernel->block);
  // So does every other size of the model: without accumulators, a second compilation has none.
  CompileOptions direct = wide;
  direct.target.gpu->accumulators = false;
  auto c = compile(p, types, direct);
  EXPECT_NE(a, c);
  EXPECT_TRUE(a->schedule().nests.back().accumulators.has_value());
  EXPECT_FALSE(c->schedule().nests.back().accumulators.has_value());
}

TEST(CpuTest, GeneratedContractionsUnderGpuSemantics) {
  const uint64_t seed = 626262;
  std::mt19937_64 rng(seed);
  const auto targets = gpu_semantics();
  for (int iter = 0; iter < 100; ++iter) {
    testing::generators::Case cs = testing::generators::any_case(rng);
    Program p = parse_program(cs.text);
    const auto& [what, options] = targets[static_cast<size_t>(iter) % targets.size()];
    expect_same(p, inputs_for(cs.shapes, DType::f64, seed + iter),
                "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + " (" + cs.kind + ") on " + what, options);
  }
}

// isl's min and max take more than two arguments: this loop nest bounds one of them by a three-way min.
TEST(CpuTest, LoopBoundsWithManyArgumentMinMax) {
  Program p = parse_program("function (I[N]) -> (O) { O[i : 5] = +(I[3/2*i - 1/2*j + 1/2]), j < 4; }");
  Buffer in(DType::f64, {7});
  for (int64_t i = 0; i < 7; ++i) in.set(i, static_cast<double>(int64_t{1} << i));
  EXPECT_EQ(run(p, {{"I", in}}).at("O").to_doubles(), interpret(p, {{"I", in}}).at("O").to_doubles());
}

TEST(CpuTest, GradientProgramsMatchTheInterpreter) {
  const char* programs[][2] = {
      {"function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
       "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }",
       "I=2x9x9x3 K=2x2x3x4"},
      {"function (I[N, C]) -> (O) { O[i, c : N - 2, C] = >(I[i + j, c]), j < 3; }", "I=9x3"},
      {"function (A[N, M]) -> (O) { O[i : N] = *(A[i, j]); }", "A=4x5"},
      {"function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M);"
       "  S[i, 0 : N, 1] = +(E[i, j]); O = E / S; }",
       "X=3x5"},
      {"function (I[N, M], D[N]) -> (O) { O[i : N] = >(I[i, j]) default D; }", "I=4x3 D=4"},
  };
  for (const auto& [text, shapes_text] : programs) {
    Program p = parse_program(text);
    Shapes shapes = shapes_from_args(shapes_text);
    ad::Result g = ad::vjp(p);
    TensorMap in = inputs_for(shapes, DType::f64, 3);
    std::map<std::string, TensorType> types = types_of(in);
    ProgramTypes pt = infer_types(p, types);
    for (size_t o = 0; o < p.outputs.size(); ++o)
      in[g.program.inputs[p.inputs.size() + o].name] = testing::random_buffer(pt.tensors.at(p.outputs[o]).shape, 9 + o);
    expect_same(g.program, in, std::string("gradient of ") + text);
    for (const auto& [what, options] : gpu_semantics()) expect_same(g.program, in, std::string("gradient on ") + what + " of " + text, options);
    Program fwd = ad::jvp(p).program;
    TensorMap tin = inputs_for(shapes, DType::f64, 4);
    for (size_t i = 0; i < p.inputs.size(); ++i)
      tin[fwd.inputs[p.inputs.size() + i].name] = testing::random_buffer(tin.at(p.inputs[i].name).shape(), 20 + i);
    expect_same(fwd, tin, std::string("tangent of ") + text);
  }
}

// The classes of backend disagreement an outside differential tester found: comparisons of bools (false <
// true), exact i32 wrap-around in products and long product reductions, casts of inf, NaN and out-of-range
// floats to i32 (trunc, then wrap modulo 2^32; inf and NaN give 0), and assign with a cond (the static
// rule: two valid points may not target one element, whatever the condition says).
TEST(CpuTest, BoolComparisonsI32WrapAndCastsAgreeWithTheInterpreter) {
  const double inf = std::numeric_limits<double>::infinity();
  Buffer a = Buffer::from_values(DType::boolean, {4}, {0, 0, 1, 1}), b = Buffer::from_values(DType::boolean, {4}, {0, 1, 0, 1});
  Buffer big = Buffer::from_values(DType::i32, {4}, {2147483647, -2147483647 - 1, 65537, 3});
  Buffer f = Buffer::from_values(DType::f32, {8}, {inf, -inf, std::numeric_limits<double>::quiet_NaN(), 3e10, -3e9, 2147483648.0, -2.5, 1e38});
  Buffer d = Buffer::from_values(DType::f64, {8}, {inf, -inf, std::numeric_limits<double>::quiet_NaN(), 3e10, -3e9, 2147483648.0, -2.5, 1e300});
  Buffer threes = Buffer::from_values(DType::i32, {40}, std::vector<double>(40, 3));
  struct Case {
    const char* text;
    TensorMap in;
  };
  std::vector<Case> cases = {
      {"function (A[N], B[N]) -> (O) { O = A > B; }", {{"A", a}, {"B", b}}},
      {"function (A[N], B[N]) -> (O) { O = A < B; }", {{"A", a}, {"B", b}}},
      {"function (A[N], B[N]) -> (O) { O = A >= B; }", {{"A", a}, {"B", b}}},
      {"function (A[N], B[N]) -> (O) { O = (A <= B) == (B > A); }", {{"A", a}, {"B", b}}},
      {"function (A[N]) -> (O) { O = A * A; }", {{"A", big}}},
      {"function (A[N]) -> (O) { O = A * A * A + A; }", {{"A", big}}},
      {"function (A[N]) -> (O) { O[] = *(A[i]); }", {{"A", threes}}},
      {"function (A[N]) -> (O) { O[] = +(A[i] * A[i]); }", {{"A", big}}},
      {"function (F[N]) -> (O) { O = cast(F, i32); }", {{"F", f}}},
      {"function (F[N]) -> (O) { O = cast(F, i32); }", {{"F", d}}},
  };
  for (const auto& [text, in] : cases) expect_same(parse_program(text), in, text);
  // assign with a cond: the rule is static in both backends.
  Program p = parse_program("function (A[N], B[N], C[N]) -> (O) { O[] = =(A[i] == B[i] ? C[i]); }");
  Buffer x = Buffer::from_values(DType::f32, {4}, {1, 2, 3, 4}), y = Buffer::from_values(DType::f32, {4}, {9, 2, 9, 9});
  TensorMap in{{"A", x}, {"B", y}, {"C", x}};
  EXPECT_THROW(interpret(p, in), UserError);
  EXPECT_THROW(run(p, in), UserError);
}

// An empty batch: every tensor with a zero dim is empty, contractions over empty domains write zeros or
// their default, and gradients (through reduce and defract) do the same, on both backends.
TEST(CpuTest, ZeroSizeDimensionsWork) {
  struct Case {
    std::string text;
    Shapes shapes;
  };
  std::vector<Case> cases = {
      {"function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }", {{"A", {0, 4}}, {"B", {4, 3}}}},
      {"function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }", {{"A", {3, 0}}, {"B", {0, 5}}}},
      {"function (A[M, K], D[M]) -> (C) { C[i : M] = >(A[i, k]) default D; }", {{"A", {4, 0}}, {"D", {4}}}},
      {"function (X[N, C]) -> (Y) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); Y = E / S; }",
       {{"X", {0, 6}}}},
      {"function (X[N, C]) -> (Y) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); Y = E / S; }",
       {{"X", {3, 0}}}},
      {"function (X[N, C]) -> (Y) { Y = relu(X) * 2 + 1; }", {{"X", {0, 3}}}},
  };
  Program conv = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  for (auto& [text, shapes] : cases) {
    Program p = parse_program(text);
    for (DType t : {DType::f32, DType::f64}) expect_same(p, inputs_for(shapes, t, 3), text);
  }
  // The gradient of the post's convolution with an empty batch: DI is empty, DK is all zeros.
  ad::Result g = ad::vjp(conv);
  TensorMap in = inputs_for({{"I", {0, 9, 9, 5}}, {"K", {2, 2, 5, 7}}, {"DO", {0, 3, 3, 7}}}, DType::f32, 4);
  expect_same(g.program, in, "empty-batch gradient");
  TensorMap out = run(g.program, in);
  EXPECT_EQ(out.at("DI").size(), 0);
  for (int64_t e = 0; e < out.at("DK").size(); ++e) ASSERT_EQ(out.at("DK").get(e), 0.0);
}

// Ten thousand chained elementwise statements: fusion stops at bounded expression sizes, so this compiles in
// about two seconds (it overflowed the stack in the emitter, and took minutes, when fusion made one
// ten-thousand-level expression in a quadratic loop).
TEST(CpuTest, TenThousandChainedStatementsCompile) {
  std::string text = "function (A[N]) -> (O) { T0 = A + 1;";
  for (int i = 1; i < 10000; ++i) text += " T" + std::to_string(i) + " = T" + std::to_string(i - 1) + " * 0.5 + 1;";
  text += " O = T9999; }";
  expect_same(parse_program(text), inputs_for({{"A", {5}}}, DType::f32, 9), "10000 statements");
}

TEST(CpuTest, ElementwiseSemanticsMatchExactly) {
  Buffer i = Buffer::from_values(DType::i32, {6}, {-7, 7, 5, 0, -2147483647 - 1, 3});
  Buffer j = Buffer::from_values(DType::i32, {6}, {2, -2, 0, 3, -1, 3});
  Buffer f = Buffer::from_values(DType::f32, {6}, {1.5, -2.5, 0.5, std::numeric_limits<double>::quiet_NaN(), -0.0, 2.25});
  Buffer g = Buffer::from_values(DType::f32, {6}, {2.5, -2.5, std::numeric_limits<double>::infinity(), 1, 0, -3});
  TensorMap in{{"I", i}, {"J", j}, {"F", f}, {"G", g}};
  const char* exprs[] = {"I / J",        "I % J",          "I * 3 + 2147483647", "-I",          "abs(I)",
                         "sign(I)",      "relu(I)",        "max(I, J)",          "min(I, J)",   "I == J",
                         "I < J && !(J > 2) || I >= 7",    "cast(F, i32)",       "cast(I, f64) / 4",
                         "F / G",        "F % G",          "max(F, G)",          "min(F, G)",   "relu(F)",
                         "sign(F)",      "round(F)",       "floor(F) + ceil(G)", "select(F > G, F, G)",
                         "(F > 0) + (G > 0)", "F + 1.1",   "I + 2.5",            "cast(F != F, i32)"};
  for (const char* e : exprs) {
    Program p = parse_program(std::string("function (I[N], J[N], F[N], G[N]) -> (O) { O = ") + e + "; }");
    TensorMap want = interpret(p, in), got = run(p, in);
    const Buffer &w = want.at("O"), &r = got.at("O");
    ASSERT_EQ(r.dtype(), w.dtype()) << e;
    for (int64_t k = 0; k < w.size(); ++k) {
      if (std::isnan(w.get(k))) {
        EXPECT_TRUE(std::isnan(r.get(k))) << e << " at " << k;
      } else {
        EXPECT_EQ(r.get(k), w.get(k)) << e << " at " << k;
      }
    }
  }
  // Transcendentals: libm and LLVM's lowering may differ in the last bit.
  const char* math[] = {"exp(F)", "log(G)", "sqrt(G)", "sin(F)", "cos(F)", "tan(F)", "asin(F / 4)", "acos(F / 4)",
                        "atan(F)", "sinh(F)", "cosh(F)", "tanh(F)", "erf(F)", "sigmoid(F)", "pow(G, 2)"};
  for (const char* e : math) {
    Program p = parse_program(std::string("function (F[N], G[N]) -> (O) { O = ") + e + "; }");
    TensorMap fin{{"F", f}, {"G", g}};
    TensorMap want = interpret(p, fin), got = run(p, fin);
    for (int64_t k = 0; k < 6; ++k) {
      double a = got.at("O").get(k), b = want.at("O").get(k);
      if (std::isnan(b)) {
        EXPECT_TRUE(std::isnan(a)) << e;
      } else if (std::isinf(b)) {
        EXPECT_EQ(a, b) << e << " at " << k;
      } else {
        EXPECT_NEAR(a, b, 1e-6 * std::max(1.0, std::fabs(b))) << e << " at " << k;
      }
    }
  }
}

TEST(CpuTest, AggregationsNaNAndUnwrittenElements) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Buffer a = Buffer::from_values(DType::f64, {3, 2}, {1, nan, 3, 4, 0, 5});
  for (const char* agg : {"+", "*", ">", "<"}) {
    Program p = parse_program(std::string("function (A[N, M]) -> (O) { O[i : N + 2] = ") + agg + "(A[i, j]); }");
    expect_same(p, {{"A", a}}, agg);
  }
  expect_same(parse_program("function (A[N, M], D[N]) -> (O) { O[i : N] = <(A[i, j]) default D; }"),
              {{"A", a}, {"D", Buffer::from_values(DType::f64, {3}, {2, -1, 7})}}, "min with default");
  expect_same(parse_program("function (A[N, M]) -> (O) { O[i : N] = >(A[i, j]), j < N - N; }"), {{"A", a}}, "empty");
  // cond under max/min/product: an element whose points all miss stays unwritten (0), as in the interpreter.
  Buffer x = Buffer::from_values(DType::f64, {3}, {1, 2, 3}), y = Buffer::from_values(DType::f64, {3}, {2, 2, 5});
  Buffer z = Buffer::from_values(DType::f64, {3}, {10, 20, 30});
  for (const char* agg : {">", "<", "*"})
    expect_same(parse_program(std::string("function (A[N], B[N], C[N]) -> (O) { O[i : N] = ") + agg + "(A[i] == B[j] ? C[j]); }"),
                {{"A", x}, {"B", y}, {"C", z}}, std::string("cond ") + agg);
  Buffer b = Buffer::from_values(DType::i32, {4}, {3, -1, 3, 2});
  expect_same(parse_program("function (B[N]) -> (O, P, Q) { O[] = >(B[i]); P[] = +(B[i] == B[j]); Q[i : N] = *(B[i]); }"),
              {{"B", b}}, "integers and booleans");
}

TEST(CpuTest, ParallelEqualsSerialAndIrIsDeterministic) {
  Program p = parse_program(
      "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in = inputs_for({{"A", {150, 40}}, {"B", {40, 70}}}, DType::f32, 5);
  CompileOptions one, two;
  one.threads = 1;
  two.threads = 2;
  Buffer serial = run(p, in, one).at("C"), parallel = run(p, in, two).at("C");
  EXPECT_EQ(serial.to_doubles(), parallel.to_doubles());
  std::map<std::string, TensorType> types{{"A", {DType::f32, {150, 40}}}, {"B", {DType::f32, {40, 70}}}};
  auto c1 = compile(p, types, one), c2 = compile(p, types, two);
  EXPECT_NE(c1.get(), c2.get());  // different cache keys: compiled twice
  EXPECT_EQ(c1->llvm_ir(), c2->llvm_ir());
  EXPECT_EQ(compile(p, types, one).get(), c1.get());  // cached
  EXPECT_NE(c1->schedule().tree().find("mark: \"parallel\""), std::string::npos) << c1->schedule().tree();
  EXPECT_NE(c1->schedule().tree().find("mark: \"tile\""), std::string::npos) << c1->schedule().tree();
  EXPECT_TRUE(c1->schedule().nests.back().microkernel.has_value());  // the register-blocked path, deterministic too
}

TEST(CpuTest, ElementwiseChainsFuseWithoutChangingRounding) {
  // C is materialized as f32 0.1 by the interpreter; the fused chain must round it the same way.
  Program p = parse_program("function (X[N], Y[M, N]) -> (O, P) { C = 0.1; T = X * C; U = T * T - Y; O = U + 1; P = T * 2; }");
  TensorMap in = inputs_for({{"X", {5}}, {"Y", {3, 5}}}, DType::f64, 4);
  std::map<std::string, TensorType> types{{"X", {DType::f64, {5}}}, {"Y", {DType::f64, {3, 5}}}};
  auto compiled = compile(p, types);
  // C folds into T; U into O; T, cheap, is computed in both its readers (twice in U: T * T), so O and P are
  // left.
  EXPECT_EQ(compiled->program().statements.size(), 2u) << print(compiled->program());
  TensorMap got = compiled->run(in), want = interpret(p, in);
  for (const char* o : {"O", "P"}) EXPECT_EQ(got.at(o).to_doubles(), want.at(o).to_doubles()) << o;
}

// A cheap producer read by a few elementwise statements is computed in each of them (no pass of its own);
// one with a transcendental call, or with two operands of its full shape, stays a tensor.
TEST(CpuTest, CheapProducersOfSeveralReadersAreComputedInEach) {
  auto statements = [](const std::string& text, const Shapes& shapes) {
    Program p = parse_program(text);
    TensorMap in = inputs_for(shapes, DType::f64, 5);
    std::map<std::string, TensorType> types;
    for (const auto& [name, b] : in) types[name] = {DType::f64, b.shape()};
    expect_same(p, in, text);
    auto compiled = compile(p, types);
    std::set<std::string> kept;
    for (const auto& st : compiled->program().statements) kept.insert(statement_output(st));
    return kept;
  };
  const Shapes shapes{{"X", {6, 40}}, {"Y", {6, 40}}, {"R", {6, 1}}};
  auto kept = statements("function (X[N, C], Y[N, C], R[N, 1]) -> (O, P) { T = X * (1.0 / R) + 2; O = T * Y; P = T - Y; }", shapes);
  EXPECT_FALSE(kept.count("T"));
  kept = statements("function (X[N, C], Y[N, C], R[N, 1]) -> (O, P) { T = exp(X) + R; O = T * Y; P = T - Y; }", shapes);
  EXPECT_TRUE(kept.count("T"));
  kept = statements("function (X[N, C], Y[N, C], R[N, 1]) -> (O, P) { T = X * Y + R; O = T * Y; P = T - Y; }", shapes);
  EXPECT_TRUE(kept.count("T"));
  // The softmax gradient's DE_2 and the maxima's adjoint: D is computed in M, which the row sum then
  // evaluates where it reads it (casts count for nothing in that budget), and in DX.
  Program g = parse_program(
      "function (DO[N, C], E[N, C], S[N, 1], B[N, 1]) -> (DM, DX) {\n"
      "  A = DO * (1.0 / S);\n  D = A + (B + 0);\n  M = -(D * E);\n  DM[i, 0 : N, 1] = +(M[i, j]);\n  DX = D * E;\n}\n");
  TensorMap in = inputs_for({{"DO", {64, 300}}, {"E", {64, 300}}, {"S", {64, 1}}, {"B", {64, 1}}}, DType::f32, 9);
  expect_same(g, in, "softmax-like gradient");
  auto compiled = compile(g, types_of(in));
  std::vector<std::string> nests;
  for (const auto& n : compiled->schedule().nests) nests.push_back(n.name);
  EXPECT_EQ(nests, (std::vector<std::string>{"DM.init", "DM.update", "DX.elementwise"}));
}

// A cheap producer that one contraction reads too (a layer norm's D = X - mean, read by the sum of its
// squares and by the output) is computed in its elementwise readers and evaluated where the contraction
// reads it: no nest writes it (before, D was a pass of its own, a layer norm of 8192 x 1024 1.9 -> 1.6 ms
// without it). Read by two contractions, it stays a tensor.
TEST(CpuTest, CheapProducersOfAContractionAndElementwiseReadersAreNotMaterialized) {
  const Program norm = parse_program(
      "function (X[N, C]) -> (Y) { S[n, 0 : N, 1] = +(X[n, c]); D = X - S / 40.0; Q[n, 0 : N, 1] = +(D[n, c] * D[n, c]);"
      " Y = D / sqrt(Q / 40.0 + 0.00001); }");
  const Program twice = parse_program(
      "function (X[N, C]) -> (Y) { S[n, 0 : N, 1] = +(X[n, c]); D = X - S / 40.0; Q[n, 0 : N, 1] = +(D[n, c] * D[n, c]);"
      " R[n, 0 : N, 1] = >(D[n, c]); Y = D / sqrt(Q / 40.0 + 0.00001) + R; }");
  for (DType t : {DType::f32, DType::f64}) {
    TensorMap in = inputs_for({{"X", {300, 40}}}, t, 21);
    CompileOptions verified;
    verified.verify = true;  // fusion's translation validation
    expect_same(norm, in, "layer norm in " + to_string(t));
    std::vector<std::string> nests;
    auto compiled = compile(norm, types_of(in), verified);
    for (const auto& n : compiled->schedule().nests) nests.push_back(n.name);
    EXPECT_EQ(nests, (std::vector<std::string>{"S.init", "S.update", "Q.init", "Q.update", "Y.elementwise"})) << print(compiled->program());
    EXPECT_TRUE(compiled->schedule().nests[3].inlined.count("D"));
    expect_same(twice, in, "D read by two contractions in " + to_string(t));
    nests.clear();
    for (const auto& n : compile(twice, types_of(in), verified)->schedule().nests) nests.push_back(n.name);
    EXPECT_NE(std::find(nests.begin(), nests.end(), "D.elementwise"), nests.end());
  }
}

// CompiledProgram::profile: one step per row group and per nest outside the groups, in the order they
// run, covering every nest once; the steps' mean times add up to no more than the calls took; the
// outputs are those of run().
TEST(CpuTest, ProfilesEveryStepOfARun) {
  const Program p = parse_program(
      "function (X[N, C], W[C, D]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]);"
      " P = E / S; H[i, d : N, D] = +(P[i, c] * W[c, d]); O = relu(H); }");
  const TensorMap in = inputs_for({{"X", {300, 64}}, {"W", {64, 48}}}, DType::f32, 37);
  const auto compiled = compile(p, types_of(in));
  const sched::Schedule& schedule = compiled->schedule();
  ASSERT_FALSE(schedule.groups.empty()) << sched::print_loops(schedule);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<StepTime> steps = compiled->profile(in, 3);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(steps.empty());
  size_t next = 0;
  double total = 0;
  for (const StepTime& st : steps) {
    EXPECT_EQ(st.first, next) << st.name;
    ASSERT_LE(st.first, st.last);
    ASSERT_LT(st.last, schedule.nests.size());
    const bool group = std::any_of(schedule.groups.begin(), schedule.groups.end(), [&](const sched::NestGroup& g) {
      return g.first == st.first && g.last == st.last;
    });
    EXPECT_EQ(st.name, group ? "row group " + schedule.nests[st.first].name + " .. " + schedule.nests[st.last].name
                             : schedule.nests[st.first].name);
    if (!group) {
      EXPECT_EQ(st.first, st.last);
    }
    EXPECT_GE(st.seconds, 0.0) << st.name;
    total += st.seconds;
    next = st.last + 1;
  }
  EXPECT_EQ(next, schedule.nests.size());
  EXPECT_GT(total, 0.0);
  EXPECT_LE(total * 3, wall);
  expect_same(p, in, "the profiled program");
  EXPECT_THROW(compiled->profile(in, 0), UserError);
}

// A producer that is not cheap (a tanh) read several times by one elementwise statement, as the GELU's
// gradient reads its tanh, goes into that statement: the copies are one computation after LLVM's CSE, so
// one nest runs, with one tanh per element (4096 x 1024 on the 2-core Xeon guest: 1.40 -> 1.35 ms, with
// the gradient's algebra 1.12). Read by two statements it stays a nest of its own.
TEST(CpuTest, AProducerReadSeveralTimesByOneStatementGoesIntoIt) {
  const Program once = parse_program(
      "function (X[N, C], DY[N, C]) -> (DX) { T = tanh(0.79 * (X + 0.044 * X * X * X)); DX = DY * (0.5 * (1.0 + T) + 0.4 * X * (1.0 - T * T)); }");
  const Program two = parse_program(
      "function (X[N, C], DY[N, C]) -> (DX, DZ) { T = tanh(0.79 * X); DX = DY * (1.0 - T * T); DZ = DY * T; }");
  for (DType t : {DType::f32, DType::f64}) {
    TensorMap in = inputs_for({{"X", {37, 45}}, {"DY", {37, 45}}}, t, 23);
    CompileOptions verified;
    verified.verify = true;  // fusion's translation validation
    expect_same(once, in, "tanh read three times in " + to_string(t));
    auto compiled = compile(once, types_of(in), verified);
    ASSERT_EQ(compiled->schedule().nests.size(), 1u) << sched::print_loops(compiled->schedule());
    // As many calls of tanh (scalar or vector) as where the statement reads T once.
    auto tanh_calls = [](const std::string& ir) {
      size_t n = 0;
      for (size_t at = ir.find(" call "); at != std::string::npos; at = ir.find(" call ", at + 1))
        n += ir.substr(at, ir.find('(', at) - at).find("tanh") != std::string::npos;
      return n;
    };
    const size_t single = tanh_calls(compile(parse_program("function (X[N, C], DY[N, C]) -> (DX) { DX = DY * tanh(0.79 * (X + 0.044 * X * X * X)); }"),
                                             types_of(in))->llvm_ir());
    EXPECT_GE(single, 1u);
    EXPECT_EQ(tanh_calls(compiled->llvm_ir()), single) << compiled->llvm_ir();
    expect_same(two, in, "tanh read by two statements in " + to_string(t));
    EXPECT_EQ(compile(two, types_of(in), verified)->schedule().nests.size(), 3u);
  }
}

// A producer that divides each element (attention's P = E / Z) is not computed inside a product that
// reads it, where a micro-kernel would broadcast it, one scalar division per element (16 x 512 x 512 x 64
// on the 2-core Xeon guest: P V with P = E / Z inside, 2.1 ms; with P read from memory 1.37, attention's
// forward 4.15 -> 3.8 ms): it is a nest of its own. A copy still computes it where it reads it, and so does
// a product whose producer divides only by a row vector (D * (1 / S)).
TEST(CpuTest, ProductsDoNotComputeAProducersDivisionPerElement) {
  const Program attention = parse_program(
      "function (E[B, L, L], Z[B, L, 1], V[B, L, D]) -> (O, C) { P = E / Z; O[b, i, d : B, L, D] = +(P[b, i, j] * V[b, j, d]);"
      " Q = E / Z; C[b, j, i : B, L, L] = =(Q[b, i, j]); }");
  const Program row = parse_program(
      "function (E[B, L, L], Z[B, L, 1], V[B, L, D]) -> (O) { P = E * (1.0 / Z); O[b, i, d : B, L, D] = +(P[b, i, j] * V[b, j, d]); }");
  TensorMap in = inputs_for({{"E", {2, 24, 24}}, {"Z", {2, 24, 1}}, {"V", {2, 24, 32}}}, DType::f32, 29);
  const CompileOptions forced = microkernels_forced(64);
  expect_same(attention, in, "division by rows", forced);
  expect_same(row, in, "reciprocal of rows", forced);
  auto names = [&](const Program& p) {
    std::vector<std::string> out;
    for (const auto& n : compile(p, types_of(in), forced)->schedule().nests) out.push_back(n.name);
    return out;
  };
  const std::vector<std::string> nests = names(attention);
  EXPECT_NE(std::find(nests.begin(), nests.end(), "P.elementwise"), nests.end()) << ::testing::PrintToString(nests);
  EXPECT_EQ(std::find(nests.begin(), nests.end(), "Q.elementwise"), nests.end()) << ::testing::PrintToString(nests);
  const std::vector<std::string> reciprocal = names(row);
  EXPECT_EQ(std::find(reciprocal.begin(), reciprocal.end(), "P.elementwise"), reciprocal.end()) << ::testing::PrintToString(reciprocal);
}

// A batched product with the batch innermost (C[i, j, b] = +(A[i, k, b] * B[k, j, b]): no broadcast
// operand, and B, larger than half of L2, read whole at every i) runs its block columns (of b) outermost,
// split across the threads, with i inside each: each column's part of B is then reused by every i (64 x
// 64 x 256 on the 2-core Xeon guest: 6.6-7.0 -> 3.7-3.9 ms). Here with an L2 of 64 KiB: 4 column blocks
// lead instead of 12 values of i, and the values are the interpreter's.
TEST(CpuTest, ProductsThatRereadALargeInputLeadWithTheirColumns) {
  const Program p = parse_program("function (A[M, K, Bt], B[K, N, Bt]) -> (C) { C[i, j, b : M, N, Bt] = +(A[i, k, b] * B[k, j, b]); }");
  const TensorMap in = inputs_for({{"A", {12, 8, 256}}, {"B", {8, 12, 256}}}, DType::f32, 31);
  CompileOptions small = microkernels_forced(512);
  small.target.cpu.l2_bytes = 64 * 1024;
  expect_same(p, in, "batch innermost", small);
  const auto compiled = compile(p, types_of(in), small);
  const sched::Nest& nest = compiled->schedule().nests.back();
  ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
  const int64_t lanes = int64_t{nest.microkernel->lanes} * nest.microkernel->chunks;
  EXPECT_EQ(nest.outer_hi - nest.outer_lo + 1, 256 / lanes) << sched::print_loops(compiled->schedule());
  // With the L2 it has, B (96 KiB) fits: i leads as before.
  CompileOptions large = microkernels_forced(512);
  large.target.cpu.l2_bytes = 2 * 1024 * 1024;
  const auto fitting = compile(p, types_of(in), large);
  const sched::Nest& fits = fitting->schedule().nests.back();
  EXPECT_EQ(fits.outer_hi - fits.outer_lo + 1, 12);
}

// Semantic mutants: the examples with one integer literal changed (strides, offsets, dims, constraint
// bounds). Whatever the interpreter makes of a mutant -- values or a UserError -- the CPU backend must
// make the same.
TEST(CpuTest, MutatedExamplesAgreeWithTheInterpreter) {
  const uint64_t seed = 777;
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::string, Shapes>> corpus;
  for (const auto& entry : std::filesystem::directory_iterator(POLYTILE_SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".tile") continue;
    std::ifstream f(entry.path());
    std::string first, rest;
    std::getline(f, first);
    std::stringstream ss;
    ss << f.rdbuf();
    corpus.emplace_back(ss.str(), shapes_from_args(first.substr(first.find(':') + 1)));
  }
  std::sort(corpus.begin(), corpus.end());
  int compared = 0, errors = 0;
  for (int iter = 0; iter < 120; ++iter) {
    auto [text, shapes] = corpus[rng() % corpus.size()];
    std::vector<size_t> digits;
    for (size_t i = 0; i < text.size(); ++i)
      if (std::isdigit(static_cast<unsigned char>(text[i])) && (i == 0 || !std::isalnum(static_cast<unsigned char>(text[i - 1])) ) &&
          (i + 1 == text.size() || !std::isalnum(static_cast<unsigned char>(text[i + 1]))))
        digits.push_back(i);
    if (digits.empty()) continue;
    text[digits[rng() % digits.size()]] = static_cast<char>('0' + rng() % 6);
    Program p;
    try {
      p = parse_program(text, "mutant.tile");
    } catch (const UserError&) {
      continue;
    }
    TensorMap in = inputs_for(shapes, DType::f64, seed + iter);
    std::string what = "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + "\n" + text;
    bool interp_ok = true;
    try {
      interpret(p, in);
    } catch (const UserError&) {
      interp_ok = false;
    }
    if (!interp_ok) {
      EXPECT_THROW(run(p, in), UserError) << what;
      ++errors;
      continue;
    }
    expect_same(p, in, what);
    ++compared;
  }
  std::cout << compared << " mutants compared, " << errors << " rejected by both\n";
  EXPECT_GT(compared, 50);
}

// The weight gradient (vjp with respect to K) of an unpadded 3x3 convolution.
Program conv_weight_gradient() {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H - 2, W - 2, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]); }");
  ad::Options o;
  o.wrt = {"K"};
  return ad::vjp(conv, o).program;
}

// A weight gradient: the output block is small next to the reduction, so the scheduler splits an output
// variable across threads and runs the reductions outside the output loops (the tiled path).
TEST(CpuTest, WeightGradientScheduleMatchesTheInterpreter) {
  Program grad = conv_weight_gradient();
  TensorMap in = inputs_for({{"I", {2, 32, 32, 8}}, {"K", {3, 3, 8, 8}}, {"DO", {2, 30, 30, 8}}}, DType::f64, 12);
  std::map<std::string, TensorType> types = types_of(in);
  for (bool microkernel : {false, true}) {  // the loop-nest path and the register-blocked one
    CompileOptions two;
    two.threads = 2;
    two.target.cpu.microkernel_min_points = microkernel ? 0 : INT64_MAX;
    auto compiled = compile(grad, types, two);
    EXPECT_NE(compiled->schedule().tree().find("mark: \"tile"), std::string::npos) << compiled->schedule().tree();
    EXPECT_TRUE(compiled->schedule().nests.back().parallel_outer);
    EXPECT_EQ(compiled->schedule().nests.back().microkernel.has_value(), microkernel);
    expect_same(grad, in, "weight gradient", two);
  }
}

// A weight gradient whose output fits three quarters of a thread's L2 and whose reduction is long (a weight-mode
// micro-kernel) runs as one slice of the reduction per thread, the slices summed after: each thread then
// reads its part of the data and of the output gradient, and the blocks of 8 channels do not split unevenly.
// The micro-kernel's threads split the slices. Three threads slice the batch (6 images: the variable they
// share evenly), two the output rows (32 of them, the widest that splits evenly); one thread does not split.
TEST(CpuTest, WeightGradientsSplitTheirReductionsAcrossThreads) {
  Program grad = conv_weight_gradient();
  TensorMap in = inputs_for({{"I", {6, 34, 34, 8}}, {"K", {3, 3, 8, 8}}, {"DO", {6, 32, 32, 8}}}, DType::f64, 21);
  const std::pair<int, const char*> cases[] = {{3, "DK_slices[n_slice, "}, {2, "DK_slices[y_slice, "}, {1, nullptr}};
  for (const auto& [threads, slices] : cases) {
    CompileOptions o;
    o.threads = threads;
    o.target.threads = threads;
    o.verify = true;
    auto compiled = compile(grad, types_of(in), o);
    const std::string lowered = print(compiled->program());
    const std::string what = std::to_string(threads) + " threads";
    if (!slices) {
      EXPECT_EQ(lowered.find("_slices"), std::string::npos) << what << "\n" << lowered;
    } else {
      EXPECT_NE(lowered.find(slices), std::string::npos) << what << "\n" << lowered;
      const sched::Nest& partial = compiled->schedule().nests.front();
      ASSERT_TRUE(partial.microkernel.has_value()) << what;
      // The weight-mode band splits the slice variable (the first of the micro-kernel's dims) over the threads.
      EXPECT_NE(partial.tree.find("mark: \"tile_split\", child: { schedule: \"[{ Step[d0, "), std::string::npos) << partial.tree;
      EXPECT_NE(partial.tree.find("] -> [(d0)] }]\""), std::string::npos) << partial.tree;
    }
    expect_same(grad, in, what, o);
  }
}

// A copy of the output per thread may fill three quarters of its L2 (plan.h weight_share_max_bytes), not
// only half: the weight gradient above (3x3x8x8 f64, 4608 bytes) is split into two slices with an L2 of
// 8192 bytes (a copy is 56% of it; half would not have split it) and not with 6136 (three quarters: 4602).
TEST(CpuTest, WeightGradientCopiesMayFillThreeQuartersOfL2) {
  Program grad = conv_weight_gradient();
  TensorMap in = inputs_for({{"I", {6, 34, 34, 8}}, {"K", {3, 3, 8, 8}}, {"DO", {6, 32, 32, 8}}}, DType::f64, 22);
  for (int64_t l2 : {8192, 6136}) {
    CompileOptions o;
    o.threads = 2;
    o.target.threads = 2;
    o.target.cpu.l2_bytes = l2;
    const std::string lowered = print(compile(grad, types_of(in), o)->program());
    EXPECT_EQ(lowered.find("DK_slices[") != std::string::npos, l2 == 8192) << l2 << " bytes of L2\n" << lowered;
    expect_same(grad, in, std::to_string(l2) + " bytes of L2", o);
  }
}

// A weight-mode micro-kernel whose output rows hold several column blocks (a 1x1 conv's weight gradient
// with 128 output channels: two blocks of 64 with AVX-512's registers, eight of 16 with AVX2's) splits its
// row blocks across the threads, not the column blocks, though they divide evenly: each thread's part of
// every output row would be 256 bytes, and the cores' prefetchers would pass the accumulators' lines back
// and forth (on a 2-core Cascade Lake the bench's 128-channel 3x3 weight gradient, whose packed column
// blocks split the same way, ran in 10.4-10.6 ms split by column blocks, 7.8-7.9 ms by row blocks).
TEST(CpuTest, WeightModeThreadsSplitRowBlocksNotColumnBlocks) {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]); }");
  ad::Options ao;
  ao.wrt = {"K"};
  const Program grad = ad::vjp(conv, ao).program;
  TensorMap in = inputs_for({{"I", {2, 32, 32, 18}}, {"K", {1, 1, 18, 128}}, {"DO", {2, 32, 32, 128}}}, DType::f32, 23);
  CompileOptions o;
  o.threads = 2;
  o.target.threads = 2;
  auto compiled = compile(grad, types_of(in), o);
  const sched::Nest& nest = compiled->schedule().nests.back();
  ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
  ASSERT_EQ(nest.microkernel->rows, 6) << sched::print_loops(compiled->schedule());  // three row blocks of channels
  // Step[j, i, bb, bv, tiles]: the threads' band is the row blocks' (two and one).
  EXPECT_NE(nest.tree.find("mark: \"tile_split\", child: { schedule: \"[{ Step[d0, d1, bb, bv, t0, t1, t2] -> [(floor((bb)/2))] }]"),
            std::string::npos)
      << nest.tree;
  expect_same(grad, in, "a 1x1 weight gradient of 128 channels", o);
}

// A micro-kernel whose broadcast operand holds the block variable contiguously (a weight gradient's
// I[n, y + j, x + i, ci], blocks of channels) prefetches it two blocks' rows ahead, rounded up to a cache
// line, at every reduction step; without the target's prefetch it emits none. The results are the
// interpreter's either way.
TEST(CpuTest, WeightGradientMicrokernelsPrefetchTheirBroadcastOperand) {
  Program grad = conv_weight_gradient();
  TensorMap in = inputs_for({{"I", {6, 34, 34, 16}}, {"K", {3, 3, 16, 16}}, {"DO", {6, 32, 32, 16}}}, DType::f32, 5);
  for (bool prefetch : {true, false}) {
    CompileOptions o;
    o.threads = 2;
    o.target.threads = 2;
    o.target.cpu.prefetch = prefetch;
    auto compiled = compile(grad, types_of(in), o);
    const sched::Nest& partial = compiled->schedule().nests.front();
    ASSERT_TRUE(partial.microkernel.has_value());
    const sched::Microkernel& mk = *partial.microkernel;
    const int64_t expected = prefetch ? (2 * mk.rows * 4 + 63) / 64 * 64 : 0;
    EXPECT_EQ(mk.prefetch_bytes, expected) << mk.rows << " rows";
    EXPECT_EQ(compiled->llvm_ir().find("@llvm.prefetch") != std::string::npos, prefetch);
    EXPECT_EQ(sched::print_loops(compiled->schedule()).find(", prefetch +" + std::to_string(expected) + " B") != std::string::npos, prefetch)
        << sched::print_loops(compiled->schedule());
    expect_same(grad, in, prefetch ? "prefetching" : "not prefetching", o);
  }
  // A forward convolution's micro-kernel, whose rows (pixels) are whole input rows apart, prefetches nothing.
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H - 2, W - 2, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]); }");
  CompileOptions o;
  o.threads = 2;
  auto forward = compile(conv, {{"I", {DType::f32, {2, 34, 34, 16}}}, {"K", {DType::f32, {3, 3, 16, 32}}}}, o);
  ASSERT_TRUE(forward->schedule().nests.back().microkernel.has_value());
  EXPECT_EQ(forward->schedule().nests.back().microkernel->prefetch_bytes, 0);
  EXPECT_FALSE(forward->schedule().nests.back().microkernel->prefetch_next_block);
  EXPECT_EQ(forward->llvm_ir().find("@llvm.prefetch"), std::string::npos);
}

// Two threads, micro-kernels at any size, and the target's prefetches on or off.
CompileOptions microkernels_prefetching(bool prefetch) {
  CompileOptions o;
  o.threads = 2;
  o.target.cpu.prefetch = prefetch;
  o.target.cpu.microkernel_min_points = 0;
  return o;
}

// A 1x1 convolution reads each pixel of its input once, and with 256 channels (1 KiB per pixel) a block
// of pixel rows spans a page or more: its micro-kernel prefetches the next block's rows. A product whose
// rows are pages apart and a convolution whose pixels overlap (3x3) do not. The results are the interpreter's with and without.
TEST(CpuTest, MicrokernelsReadingPagesOnceFetchTheNextBlock) {
  Program conv1x1 = parse_program(
      "function (I[N, H, W, CI], K[CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y, x, ci] * K[ci, co]); }");
  TensorMap in = inputs_for({{"I", {2, 12, 12, 256}}, {"K", {256, 16}}}, DType::f32, 9);
  for (bool prefetch : {true, false}) {
    const CompileOptions o = microkernels_prefetching(prefetch);
    auto compiled = compile(conv1x1, types_of(in), o);
    ASSERT_TRUE(compiled->schedule().nests.back().microkernel.has_value());
    const sched::Microkernel& mk = *compiled->schedule().nests.back().microkernel;
    EXPECT_EQ(compiled->schedule().nests.back().variables[mk.block], "x");
    EXPECT_EQ(mk.prefetch_next_block, prefetch);
    EXPECT_EQ(mk.prefetch_bytes, 0);
    EXPECT_EQ(compiled->llvm_ir().find("@llvm.prefetch") != std::string::npos, prefetch);
    EXPECT_EQ(sched::print_loops(compiled->schedule()).find(", prefetch next block") != std::string::npos, prefetch);
    expect_same(conv1x1, in, prefetch ? "prefetching the next block" : "not prefetching", o);
  }
  const CompileOptions o = microkernels_prefetching(true);
  // Rows of a block 8 KiB apart, each read once: the prefetchers follow each row's stream.
  Program rows = parse_program(
      "function (I[N, CI], K[CI, CO]) -> (O) { O[n, co : N, CO] = +(I[n, ci] * K[ci, co]); }");
  auto far = compile(rows, {{"I", {DType::f32, {256, 2048}}}, {"K", {DType::f32, {2048, 16}}}}, o);
  ASSERT_TRUE(far->schedule().nests.back().microkernel.has_value());
  EXPECT_EQ(far->schedule().nests.back().variables[far->schedule().nests.back().microkernel->block], "n");
  EXPECT_FALSE(far->schedule().nests.back().microkernel->prefetch_next_block);
  // Overlapping pixels (x + i): neighbouring blocks read each other's rows.
  Program conv3x3 = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H - 2, W - 2, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]); }");
  auto overlapping = compile(conv3x3, {{"I", {DType::f32, {2, 12, 12, 256}}}, {"K", {DType::f32, {3, 3, 256, 16}}}}, o);
  ASSERT_TRUE(overlapping->schedule().nests.back().microkernel.has_value());
  EXPECT_FALSE(overlapping->schedule().nests.back().microkernel->prefetch_next_block);
}

// A product's fused epilogue that reads a tensor with a row for each of the block's rows (a residual, a
// GELU gradient's forward values) prefetches those lines at the next block's rows; one that reads only
// what the rows share (a bias) does not, and neither does a target without prefetches.
// The results are the interpreter's either way.
TEST(CpuTest, EpiloguesReadingRowsPrefetchTheNextBlocksLines) {
  Program residual = parse_program(
      "function (A[M, K], B[K, N], R[M, N]) -> (D) { C[i, j : M, N] = +(A[i, k] * B[k, j]); D = C * R + R; }");
  TensorMap in = inputs_for({{"A", {61, 96}}, {"B", {96, 80}}, {"R", {61, 80}}}, DType::f32, 17);
  for (bool prefetch : {true, false}) {
    const CompileOptions o = microkernels_prefetching(prefetch);
    auto compiled = compile(residual, types_of(in), o);
    const sched::Nest& product = compiled->schedule().nests.back();
    ASSERT_TRUE(product.microkernel.has_value());
    ASSERT_TRUE(product.epilogue.has_value());
    const std::vector<std::string> expected = prefetch ? std::vector<std::string>{"R"} : std::vector<std::string>{};
    EXPECT_EQ(product.microkernel->prefetch_epilogue, expected);
    EXPECT_EQ(compiled->llvm_ir().find("@llvm.prefetch") != std::string::npos, prefetch);
    EXPECT_EQ(sched::print_loops(compiled->schedule()).find(", prefetch next block's epilogue lines") != std::string::npos, prefetch);
    expect_same(residual, in, prefetch ? "prefetching the epilogue's lines" : "not prefetching", o);
  }
  Program bias = parse_program(
      "function (A[M, K], B[K, N], Bias[N]) -> (D) { C[i, j : M, N] = +(A[i, k] * B[k, j]); D = relu(C + Bias); }");
  auto shared = compile(bias, {{"A", {DType::f32, {61, 96}}}, {"B", {DType::f32, {96, 80}}}, {"Bias", {DType::f32, {80}}}}, microkernels_prefetching(true));
  ASSERT_TRUE(shared->schedule().nests.back().epilogue.has_value());
  EXPECT_TRUE(shared->schedule().nests.back().microkernel->prefetch_epilogue.empty());
  EXPECT_EQ(shared->llvm_ir().find("@llvm.prefetch"), std::string::npos);  // the product's own blocks prefetch nothing
}

// A product whose output overflows L2 and whose reduction is long takes reduction tiles sized for L2
// (sgemm 2048's packed panels): its vector operand streams from L2 at every block, and each step of a
// uniform block prefetches the operand's lines 8 steps ahead, and computes the interpreter's values. With
// an output that fits L2, or without the target's prefetch, it emits none.
TEST(CpuTest, L2TiledProductsPrefetchTheirVectorOperandAhead) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in = inputs_for({{"A", {96, 800}}, {"B", {800, 256}}}, DType::f32, 13);
  for (bool prefetch : {true, false}) {
    for (int64_t l2 : {int64_t{64} << 10, int64_t{4} << 20}) {  // C's 96 KiB overflow half of two 64 KiB L2s
      CompileOptions o;
      o.threads = 2;
      o.target.threads = 2;
      o.target.cpu.prefetch = prefetch;
      o.target.cpu.l2_bytes = l2;
      auto compiled = compile(mm, types_of(in), o);
      const sched::Nest& product = compiled->schedule().nests.back();
      ASSERT_TRUE(product.microkernel.has_value());
      const bool expected = prefetch && l2 < (int64_t{1} << 20);
      const std::string what = std::string(prefetch ? "prefetching" : "not prefetching") + ", L2 " + std::to_string(l2);
      EXPECT_EQ(product.microkernel->prefetch_vector_steps, expected ? 8 : 0) << what;
      EXPECT_EQ(compiled->llvm_ir().find("@llvm.prefetch") != std::string::npos, expected) << what;
      EXPECT_EQ(sched::print_loops(compiled->schedule()).find(", prefetch vector +8 steps") != std::string::npos, expected) << what;
      if (expected) expect_same(mm, in, what, o);  // the other three are programs other tests run
    }
  }
}

// The text of module `name` in a compiled program's LLVM IR ("" when it has none).
std::string module_of(const std::string& ir, const std::string& name) {
  const size_t begin = ir.find("; ModuleID = '" + name + "'");
  if (begin == std::string::npos) return std::string();
  const size_t end = ir.find("; ModuleID = ", begin + 1);
  return ir.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The text of function `function`'s definition in `ir`, up to its closing brace ("" when it has none).
std::string function_of(const std::string& ir, const std::string& function) {
  const size_t begin = ir.find("define void @" + function + "(");
  if (begin == std::string::npos) return std::string();
  return ir.substr(begin, ir.find("\n}\n", begin) - begin);
}

// The attributes of function `function` in `module`, as the module's attribute group lists them.
std::string attributes_of(const std::string& module, const std::string& function) {
  const size_t define = module.find("define void @" + function + "(");
  const size_t group = module.find(" #", define);
  if (define == std::string::npos || group == std::string::npos) return std::string();
  const std::string id = module.substr(group + 1, module.find_first_of(" {", group + 1) - group - 1);
  const size_t attrs = module.find("attributes " + id + " = {");
  if (attrs == std::string::npos) return std::string();
  return module.substr(attrs, module.find('}', attrs) - attrs);
}

// Code for a CPU named as LLVM names it (cpu_target): x86-64-v2 (SSE4.2, which every x86-64 machine of
// the last decade runs) and x86-64-v3 (AVX2), each with its own vector width in the schedule (a conv's
// micro-kernel) and in LLVM's vectorizers (an exp chain), with the interpreter's results wherever this
// machine runs them, from the JIT and from an exported object.
TEST(CpuTest, CodeForANamedCpu) {
  const Program p = parse_program(
      "function (I[N, H, W, C], K[KH, KW, C, CO]) -> (O, E) {\n"
      "  O[n, y, x, co : N, H - KH + 1, W - KW + 1, CO] = +(I[n, y + j, x + i, c] * K[j, i, c, co]);\n"
      "  E = exp(I) * 0.5;\n}\n");
  const TensorMap in = inputs_for({{"I", {2, 10, 12, 16}}, {"K", {3, 3, 16, 32}}}, DType::f32, 5);
  for (const auto& [name, bits] : {std::pair{std::string("x86-64-v2"), 128}, std::pair{std::string("x86-64-v3"), 256}}) {
    CompileOptions o;
    o.target = cpu_target(name);
    o.threads = 2;
    EXPECT_EQ(o.target.cpu_name, name);
    EXPECT_EQ(o.target.cpu.vector_bits, bits) << name;
    EXPECT_EQ(o.target.cpu.vector_registers, 16) << name;
    const std::string ir = optimized_llvm_ir(p, types_of(in), o);
    const std::string lanes = "<" + std::to_string(bits / 32) + " x float>";
    EXPECT_NE(ir.find(lanes), std::string::npos) << name;
    for (int wider = bits * 2; wider <= 512; wider *= 2)
      EXPECT_EQ(ir.find("<" + std::to_string(wider / 32) + " x float>"), std::string::npos) << name << ": " << wider << "-bit vectors";
    if (!missing_cpu_features(name).empty()) {
      EXPECT_THROW(compile(p, types_of(in), o), UserError) << name;
      continue;
    }
    expect_same(p, in, name, o);
    const TensorMap want = interpret(p, in), loaded = load(export_object(p, types_of(in), "named", o))->run(in, 2);
    for (const auto& out : p.outputs)
      for (int64_t e = 0; e < want.at(out).size(); ++e)
        ASSERT_NEAR(loaded.at(out).get(e), want.at(out).get(e), 1e-4 * std::max(1.0, std::fabs(want.at(out).get(e)))) << name << " " << out;
  }
}

// Cache sizes after a CPU's name (cpu_target("znver3,l2=512K")) replace this machine's: the named CPU's
// instruction set with those caches, the schedule blocked for them (a smaller L2 gives a 3x3 conv shorter
// reduction tiles, in the loop IR), the results the interpreter's; and a malformed or shrinking size is a
// UserError that names the spec and what is wrong with it.
TEST(CpuTest, CacheSizesAfterACpusName) {
  const sched::Target host = host_target();
  const sched::Target zen3 = cpu_target("znver3,l1=16K,l2=256k,l3=8M");
  EXPECT_EQ(zen3.cpu_name, "znver3");
  EXPECT_EQ(zen3.cpu.vector_bits, 256);
  EXPECT_EQ(zen3.cpu.l1_bytes, 16 * 1024);
  EXPECT_EQ(zen3.cpu.l2_bytes, 256 * 1024);
  EXPECT_EQ(zen3.cpu.l3_bytes, 8 * 1024 * 1024);
  const sched::Target small = cpu_target("host,l1=8K,l2=96K");
  EXPECT_EQ(small.cpu_name, "");
  EXPECT_EQ(small.cpu.vector_bits, host.cpu.vector_bits);
  EXPECT_EQ(small.cpu.l1_bytes, 8 * 1024);
  EXPECT_EQ(small.cpu.l2_bytes, 96 * 1024);
  EXPECT_EQ(small.cpu.l3_bytes, host.cpu.l3_bytes);
  EXPECT_EQ(cpu_target(",l2=131072").cpu.l2_bytes, 128 * 1024);  // an empty name is this machine's CPU
  const Program p = parse_program(
      "function (I[N, H, W, C], K[KH, KW, C, CO]) -> (O) {\n"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]);\n}\n");
  const TensorMap in = inputs_for({{"I", {2, 12, 12, 64}}, {"K", {3, 3, 64, 64}}}, DType::f32, 3);
  CompileOptions o;
  o.threads = 2;
  o.cache = false;
  const std::string loops = sched::print_loops(compile(p, types_of(in), o)->schedule());
  o.target = small;
  const std::string small_loops = sched::print_loops(compile(p, types_of(in), o)->schedule());
  EXPECT_NE(loops, small_loops) << "the caches changed nothing:\n" << loops;
  expect_same(p, in, "host,l1=8K,l2=96K", o);
  for (const auto& [spec, message] : std::vector<std::pair<std::string, std::string>>{
           {"znver3,l9=1K", "CPU 'znver3,l9=1K': 'l9=1K' is not a cache size"},
           {"znver3,l2", "CPU 'znver3,l2': 'l2' is not a cache size"},
           {"host,l2=abc", "CPU 'host,l2=abc': l2=abc is not a cache size"},
           {"host,l1=512", "l1=512 is not a cache size"},
           {"host,l3=2000G", "l3=2000G is not a cache size"},
           {"host,l2=1M,l2=2M", "l2 is given twice"},
           {"host,l1=2M,l2=1M", "the caches must grow from level to level, but l1 is 2097152, l2 1048576"},
           {"pentium-9000,l2=1M", "unknown CPU 'pentium-9000'"}}) {
    try {
      cpu_target(spec);
      ADD_FAILURE() << "no error for " << spec;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << spec << ": " << e.what();
    }
  }
}

// A CPU LLVM does not know is a UserError naming it; one with instructions this machine lacks is
// refused to run here (the error names the CPU and what is missing) but exported for, its header naming it.
TEST(CpuTest, NamedCpusThatDoNotRunHere) {
  try {
    cpu_target("pentium-9000");
    FAIL() << "no error for an unknown CPU";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown CPU 'pentium-9000'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cpu_target("host").cpu_name, "");
  const Program p = parse_program("function (A[M, K], B[K, N]) -> (C) {\n  C[i, j : M, N] = +(A[i, k] * B[k, j]);\n}\n");
  const std::map<std::string, TensorType> types{{"A", {DType::f32, {16, 8}}}, {"B", {DType::f32, {8, 32}}}};
  CompileOptions o;
  o.target = cpu_target("sapphirerapids");  // AMX, AVX512-FP16: no machine of ours has them
  EXPECT_EQ(o.target.cpu.vector_bits, 512);
  const std::vector<std::string> missing = missing_cpu_features("sapphirerapids");
  if (missing.empty()) {
    EXPECT_NO_THROW(compile(p, types, o));  // a Sapphire Rapids or later runs it
  } else {
    try {
      compile(p, types, o);
      FAIL() << "code for a CPU this machine cannot run was compiled to run here";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("CPU sapphirerapids cannot run on this machine, which lacks " + missing[0]),
                std::string::npos) << e.what();
    }
  }
  for (const std::string& f : missing) EXPECT_NE(f, "pku") << "a system instruction counted as one compiled code needs";
  const ExportedObject exported = export_object(p, types, "spr", o);
  EXPECT_EQ(exported.cpu, "sapphirerapids");
  EXPECT_FALSE(exported.object.empty());
  EXPECT_NE(exported.header.find("CPU sapphirerapids"), std::string::npos) << exported.header;
}

// A micro-kernel whose steps have both variants runs each as a function of its own, in a module of its
// own, compiled alongside the nest's function, which holds only the loops around the steps and calls them
// with the iterators they read: part0 the uniform blocks (unpredicated: no selects, no masked loads),
// part1 the border blocks (predicated). All three are made into machine code without Loop Strength
// Reduction (their functions say "polytile-no-lsr").
TEST(CpuTest, UniformAndBorderBlocksAreFunctionsOfTheirOwn) {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
  TensorMap in = inputs_for({{"I", {2, 6, 30, 8}}, {"K", {3, 3, 8, 64}}}, DType::f32, 41);
  const CompileOptions o = microkernels_forced(512);
  const std::string ir = optimized_llvm_ir(conv, types_of(in), o);
  for (const char* part : {"nest_0.part0", "nest_0.part1"}) {
    EXPECT_NE(ir.find("define void @" + std::string(part) + "("), std::string::npos) << part << "\n" << ir.substr(0, 2000);
    EXPECT_NE(ir.find("call void @" + std::string(part) + "("), std::string::npos) << part;
  }
  EXPECT_EQ(ir.find("@nest_0.part2("), std::string::npos);
  const std::string loops = module_of(ir, "nest_0"), uniform = module_of(ir, "nest_0.part0"), border = module_of(ir, "nest_0.part1");
  ASSERT_FALSE(loops.empty()) << ir.substr(0, 2000);
  ASSERT_FALSE(uniform.empty()) << ir.substr(0, 2000);
  ASSERT_FALSE(border.empty()) << ir.substr(0, 2000);
  EXPECT_EQ(loops.find("fmuladd"), std::string::npos) << loops;
  EXPECT_NE(uniform.find("fmuladd"), std::string::npos) << uniform;
  EXPECT_EQ(uniform.find("select"), std::string::npos) << uniform;
  EXPECT_EQ(uniform.find("masked.load"), std::string::npos) << uniform;
  EXPECT_NE(border.find("masked.load"), std::string::npos) << border;
  EXPECT_NE(attributes_of(uniform, "nest_0.part0").find("\"polytile-no-lsr\""), std::string::npos) << uniform;
  EXPECT_NE(attributes_of(border, "nest_0.part1").find("\"polytile-no-lsr\""), std::string::npos) << border;
  EXPECT_NE(loops.find("\"polytile-no-lsr\""), std::string::npos) << loops;
  expect_same(conv, in, "the conv with its uniform and border blocks outlined", o);
}

// The uniform blocks' machine code is made without Loop Strength Reduction, so their fma loop comes from
// the emitter in the form LSR made of it (NestEmitter::fma_address): per input one address invariant in
// the loop plus the loop's counter times the input's step, its rows and vectors at constant offsets from
// that. In the optimized IR, the loop's block of FMAs then computes no integers but the counter's step and
// one scaling per input, at most 3 (the flattened index of each row, as it was emitted before, took 11
// adds, ors and shifts in the 3x3 conv's block, 10 in the seed conv's). Both agree with the interpreter.
TEST(CpuTest, UniformBlocksAddressEachInputFromOneInvariantBase) {
  struct Case {
    std::string what, tile;
    Shapes shapes;
  };
  const std::vector<Case> cases = {
      {"a 3x3 conv",
       "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
       "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }",
       {{"I", {2, 14, 30, 32}}, {"K", {3, 3, 32, 64}}}},
      {"the seed's strided dilated conv",
       "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
       "  O[n, y, x, co : N, H / 3, W / 3, CO] = +(I[n, 3 * y + 2 * j, 3 * x + 2 * i, ci] * K[j, i, ci, co]); }",
       {{"I", {2, 32, 62, 32}}, {"K", {2, 2, 32, 64}}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Program p = parse_program(c.tile);
    const TensorMap in = inputs_for(c.shapes, DType::f32, 43);
    const CompileOptions o = microkernels_forced(512);
    const std::string ir = optimized_llvm_ir(p, types_of(in), o);
    // The uniform blocks: part0 where the nest also has border blocks (the 3x3 conv's padding), else the
    // nest's own module (the seed's conv has none).
    std::string uniform = module_of(ir, "nest_0.part0");
    if (uniform.empty()) uniform = module_of(ir, "nest_0");
    ASSERT_FALSE(uniform.empty()) << ir.substr(0, 2000);
    ASSERT_EQ(uniform.find("masked.load"), std::string::npos) << uniform;
    int fma_blocks = 0;
    std::istringstream lines(uniform);
    std::string line, block;
    int fmas = 0, integer_ops = 0;
    auto end_block = [&] {
      if (fmas > 0) {
        ++fma_blocks;
        EXPECT_LE(integer_ops, 3) << "block " << block << " of\n" << uniform;
      }
      fmas = integer_ops = 0;
    };
    while (std::getline(lines, line)) {
      const size_t colon = line.find(':');  // a block's label: "name:" with "; preds = ..." after it
      if (!line.empty() && line[0] != ' ' && line[0] != ';' && colon != std::string::npos &&
          line.substr(0, colon).find_first_of(" (=\"") == std::string::npos) {
        end_block();
        block = line.substr(0, colon);
        continue;
      }
      if (line.find("@llvm.fmuladd") != std::string::npos && line.find("call ") != std::string::npos) ++fmas;
      for (const char* op : {" = add ", " = sub ", " = mul ", " = shl ", " = or ", " = and ", " = lshr ", " = ashr "})
        if (line.find(op) != std::string::npos) ++integer_ops;
    }
    end_block();
    EXPECT_GE(fma_blocks, 1) << uniform;
    expect_same(p, in, c.what, o);
  }
}

// Border blocks (rows that differ: a padded conv's first and last columns) mask their lanes only where a
// lane can leave the vector variable's range: with 64 output channels in column blocks of 8-lane vectors,
// isl proves every lane of every block in range (Microkernel::lanes_in_range) and the border module
// compares no lanes (the column block is an argument of it, so such compares would stay); with 60, the
// last column block's lanes are masked. Both compute what the interpreter does.
TEST(CpuTest, BorderBlocksMaskLanesOnlyWhereALaneCanLeaveTheRange) {
  for (int64_t channels : {64, 60}) {
    SCOPED_TRACE(std::to_string(channels) + " channels");
    const Program p = parse_program(
        "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
        "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
    const TensorMap in = inputs_for({{"I", {2, 8, 56, 16}}, {"K", {3, 3, 16, channels}}}, DType::f32, 47);
    const CompileOptions o = microkernels_forced(256, 16);
    auto compiled = compile(p, types_of(in), o);
    const sched::Nest& nest = compiled->schedule().nests.back();
    ASSERT_TRUE(nest.microkernel);
    ASSERT_GT(channels, int64_t{nest.microkernel->chunks} * nest.microkernel->lanes) << "one column block: its lanes fold";
    EXPECT_EQ(nest.microkernel->lanes_in_range, channels == 64);
    const std::string ir = optimized_llvm_ir(p, types_of(in), o);
    // The border blocks' module: the one with masked stores (their rows are masked either way).
    std::string border;
    for (size_t at = ir.find("; ModuleID = '"); at != std::string::npos && border.empty(); at = ir.find("; ModuleID = '", at + 1)) {
      const std::string module = module_of(ir, ir.substr(at + 14, ir.find('\'', at + 14) - at - 14));
      if (module.find("masked.store") != std::string::npos) border = module;
    }
    ASSERT_FALSE(border.empty()) << ir.substr(0, 3000);
    bool compares_lanes = false;  // an icmp of any predicate on the lanes' 8 indices
    std::istringstream lines(border);
    for (std::string line; std::getline(lines, line);)
      compares_lanes |= line.find(" icmp ") != std::string::npos && line.find("<8 x i64>") != std::string::npos;
    EXPECT_EQ(compares_lanes, channels != 64) << border;
    expect_same(p, in, std::to_string(channels) + " channels", o);
    // Nothing written past the output: its last pixel's lanes past channel 59 would land there (earlier
    // pixels' stray lanes can be overwritten by their neighbours' blocks before the run ends).
    const std::vector<int64_t> shape{2, 8, 56, channels};
    const size_t elements = static_cast<size_t>(2 * 8 * 56 * channels);
    std::vector<float> out(elements + 64, 12345.0f);
    ViewMap inputs;
    for (const auto& [name, b] : in) inputs[name] = {const_cast<void*>(b.data()), DType::f32, b.shape(), {}};
    compiled->run(inputs, ViewMap{{"O", {out.data(), DType::f32, shape, {}}}});
    for (size_t e = elements; e < out.size(); ++e) ASSERT_EQ(out[e], 12345.0f) << "element " << e - elements << " past the output";
  }
}

// A vector variable whose range follows a reduction variable -- x in a padded NCHW depthwise conv or NCW
// conv, with x + i - 1 in the image, which no permuted output serves (its input would need a copy too, or
// its 19 channels fill no vectors) -- runs as a micro-kernel: its border blocks mask, at each kernel
// position, the lanes that it takes past the image. In NCHW those lanes would read the neighbouring row's
// last or first columns, here NaN and inf, which must not reach the output, nor may the weights there
// (inf and NaN too) through a lane that read 0. Forward and data gradient, at three vector widths, in f32
// and f64, against the interpreter.
TEST(CpuTest, LanesThatFollowTheReductionsAreMaskedAtEachPoint) {
  struct Case {
    const char* text;
    Shapes shapes;
  };
  const Case cases[] = {
      {"function (I[N, C, H, W], K[C, KH, KW]) -> (O) {"
       "  O[n, c, y, x : N, C, H, W] = +(I[n, c, y + j - 1, x + i - 1] * K[c, j, i]); }",
       {{"I", {2, 6, 5, 37}}, {"K", {6, 3, 3}}}},
      {"function (I[N, C, H, W], K[C, KH, KW]) -> (O) {"
       "  O[n, c, y, x : N, C, H, W] = +(I[n, c, y + 2*j - 2, x + 2*i - 2] * K[c, j, i]); }",
       {{"I", {2, 5, 6, 16}}, {"K", {5, 3, 3}}}},
      {"function (I[N, CI, W], K[CO, CI, KW]) -> (O) {"
       "  O[n, co, x : N, CO, W] = +(I[n, ci, x + i - 2] * K[co, ci, i]); }",
       {{"I", {3, 7, 45}}, {"K", {19, 7, 5}}}},
  };
  int predicated = 0;
  for (const Case& cs : cases) {
    const Program fwd = parse_program(cs.text);
    ad::Options ao;
    ao.wrt = {"I"};
    const Program grad = ad::vjp(fwd, ao).program;
    for (int bits : {512, 256, 128}) {
      for (DType t : {DType::f32, DType::f64}) {
        const std::string what = std::string(cs.text) + ", " + std::to_string(bits) + " bits, " + to_string(t);
        TensorMap in = inputs_for(cs.shapes, t, 53);
        Buffer& image = in.at("I");
        const int64_t width = image.shape().back();
        for (int64_t row = 1; row < image.size() / width; row += 3) {
          image.set(row * width - 1, std::numeric_limits<double>::quiet_NaN());  // the row before's last column
          image.set(row * width, std::numeric_limits<double>::infinity());
        }
        // Weights at kernel positions that take border lanes past the image (their first and last column):
        // a lane invalid there must not add 0 times them.
        Buffer& weights = in.at("K");
        weights.set(0, std::numeric_limits<double>::infinity());
        weights.set(weights.size() - 1, std::numeric_limits<double>::quiet_NaN());
        const CompileOptions o = microkernels_forced(bits);
        auto compiled = compile(fwd, types_of(in), o);
        const sched::Nest& nest = compiled->schedule().nests.back();
        ASSERT_TRUE(nest.microkernel) << what << "\n" << sched::print_loops(compiled->schedule());
        EXPECT_EQ(nest.variables[nest.microkernel->vector], "x") << what;
        EXPECT_FALSE(nest.microkernel->lanes_in_range) << what;
        predicated += nest.ast.find("Fp(") != std::string::npos;
        expect_same(fwd, in, "forward " + what, o);
        const ProgramTypes pt = infer_types(fwd, types_of(in));
        in["DO"] = testing::random_buffer(pt.tensors.at("O").shape, 54, t);
        expect_same(grad, in, "data gradient of " + what, o);
      }
    }
  }
  EXPECT_EQ(predicated, 18) << "every forward has border blocks";
}

// A micro-kernel without a broadcast operand (an NHWC depthwise conv: image and weights both read the
// channels, its vector variable) has no other output variable that only picks columns: its images and
// rows pick rows of both operands. The threads then split its images, each reading images of its own, as
// for any conv, not tiles of pixel blocks as for a packed matrix's panels (each thread reading part of
// every image: 0.33-0.35 -> 0.27 ms on 8x56x56x64, 2 threads). Forward and data gradient against the
// interpreter.
TEST(CpuTest, MicrokernelsWithoutABroadcastOperandSplitTheirImages) {
  const Program fwd = parse_program(
      "function (I[N, H, W, C], K[KH, KW, C]) -> (O) {"
      "  O[n, y, x, c : N, H, W, C] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c]); }");
  TensorMap in = inputs_for({{"I", {6, 9, 56, 64}}, {"K", {3, 3, 64}}}, DType::f32, 57);
  ad::Options ao;
  ao.wrt = {"I"};
  const Program grad = ad::vjp(fwd, ao).program;
  TensorMap grad_in = in;
  grad_in["DO"] = testing::random_buffer({6, 9, 56, 64}, 58, DType::f32);
  CompileOptions o = microkernels_forced(512);
  for (const auto& [p, inputs, name] : {std::tuple{&fwd, &in, "O.update"}, std::tuple{&grad, &grad_in, "DI.update"}}) {
    auto compiled = compile(*p, types_of(*inputs), o);
    const std::string loops = sched::print_loops(compiled->schedule());
    bool found = false;
    for (const auto& nest : compiled->schedule().nests) {
      if (nest.name != name) continue;
      found = true;
      ASSERT_TRUE(nest.microkernel) << loops;
      EXPECT_TRUE(nest.parallel_outer) << loops;
      EXPECT_EQ(nest.outer_hi - nest.outer_lo + 1, 6) << "the threads split the 6 images\n" << loops;
    }
    EXPECT_TRUE(found) << loops;
    expect_same(*p, *inputs, name, o);
  }
}

// A micro-kernel nest whose parallel dimension the threads cannot share evenly takes the next dimension's
// values in where both are plain variables: the seed conv's data gradient's 19 rows (10 + 9 on two threads,
// 7 + 6 + 6 on three) with their residues mod 3 (0 and 2: 57 values, a third of them empty). The forward's
// next dimension is a tile of its columns (a floor division); on two threads its tiles of image blocks
// shrink to one block, so that its 19 rows go with its 2 blocks of 4 images (38 values, 19 + 19) and the
// tile of columns takes all of them; on three, 38 values would not share evenly either (13 + 13 + 12),
// so its 19 rows stay alone. One thread merges nothing (the data gradient leads with the residues, 0..2).
// Each computes what the interpreter does.
TEST(CpuTest, MicrokernelThreadsShareRowsThatDoNotDivideEvenly) {
  Program fwd = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }");
  TensorMap in = inputs_for({{"I", {8, 57, 57, 5}}, {"K", {2, 2, 5, 19}}}, DType::f64, 41);
  ad::Options ao;
  ao.wrt = {"I"};
  Program grad = ad::vjp(fwd, ao).program;
  TensorMap grad_in = in;
  grad_in["DO"] = testing::random_buffer({8, 19, 19, 19}, 42);
  auto parallel_values = [](const CompiledProgram& c, const std::string& name) -> int64_t {
    for (const auto& n : c.schedule().nests)
      if (n.name == name && n.microkernel) return n.parallel_outer ? n.outer_hi - n.outer_lo + 1 : 1;
    ADD_FAILURE() << "no micro-kernel nest " << name << "\n" << sched::print_loops(c.schedule());
    return 0;
  };
  for (int threads : {1, 2, 3}) {
    CompileOptions o = microkernels_forced(512);
    o.threads = threads;
    o.target.threads = threads;
    const std::string what = std::to_string(threads) + " threads";
    auto f = compile(fwd, types_of(in), o);
    auto g = compile(grad, types_of(grad_in), o);
    EXPECT_EQ(parallel_values(*f, "O.update"), threads == 2 ? 38 : 19) << what << "\n" << sched::print_loops(f->schedule());
    EXPECT_EQ(parallel_values(*g, "DI.update"), threads == 1 ? 3 : 57) << what << "\n" << sched::print_loops(g->schedule());
    expect_same(fwd, in, "forward, " + what, o);
    expect_same(grad, grad_in, "data gradient, " + what, o);
  }
}

// Register-blocked micro-kernels, forced on every eligible update (no size threshold) and for three vector
// widths, so that blocks are partial, borders are predicated and chunks are masked: convolutions forward
// and both gradients (strided, dilated, padded, transposed weights in the data gradient), matmuls of odd
// sizes, and every example and generated contraction.
TEST(CpuTest, MicrokernelsMatchTheInterpreter) {
  const char* convs[] = {
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }",
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }",
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, (H + 1)/2, (W + 1)/2, CO] = +(I[n, 2*y + j - 1, 2*x + i - 1, ci] * K[j, i, ci, co]); }",
  };
  int microkernels = 0, predicated = 0, packed = 0;
  auto count = [&](const Program& p, const TensorMap& in, const CompileOptions& o) {
    std::map<std::string, TensorType> types = types_of(in);
    for (const auto& nest : compile(p, types, o)->schedule().nests) {
      microkernels += nest.microkernel.has_value();
      packed += nest.name == "B_P.update";
      predicated += nest.ast.find("Fp(") != std::string::npos;
    }
  };
  for (int bits : {512, 256, 128}) {
    CompileOptions o = microkernels_forced(bits);
    for (const char* text : convs) {
      Program fwd = parse_program(text);
      TensorMap in = inputs_for({{"I", {2, 11, 10, 5}}, {"K", {3, 3, 5, 19}}}, DType::f64, 31);
      expect_same(fwd, in, std::string("forward ") + text, o);
      count(fwd, in, o);
      {  // non-finite values: points outside the domain (borders, partial blocks) must not touch them
        TensorMap odd = in;
        odd["K"].set(7, std::numeric_limits<double>::infinity());
        odd["I"].set(123, std::numeric_limits<double>::quiet_NaN());
        odd["I"].set(0, -std::numeric_limits<double>::infinity());
        expect_same(fwd, odd, std::string("forward with inf and NaN ") + text, o);
      }
      ProgramTypes pt = infer_types(fwd, {{"I", {DType::f64, {2, 11, 10, 5}}}, {"K", {DType::f64, {3, 3, 5, 19}}}});
      in["DO"] = testing::random_buffer(pt.tensors.at("O").shape, 32);
      for (const char* wrt : {"I", "K"}) {
        ad::Options ao;
        ao.wrt = {wrt};
        Program grad = ad::vjp(fwd, ao).program;
        expect_same(grad, in, std::string("gradient wrt ") + wrt + " of " + text, o);
        count(grad, in, o);
      }
    }
    Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
    // The last two shapes read B's rows 2 KiB or more apart: with an L2 smaller than B (16 KiB), B is
    // packed into panels first (40 rows of A: each element of B serves 32 points or more); 600 columns
    // into panels whose last one is padded at every vector width.
    CompileOptions small_l2 = o;
    small_l2.target.cpu.l2_bytes = 16 * 1024;
    for (auto [m, k, n] : {std::tuple{37, 23, 70}, std::tuple{6, 1, 16}, std::tuple{13, 40, 3}, std::tuple{40, 9, 512},
                           std::tuple{40, 9, 600}}) {
      for (DType t : {DType::f32, DType::f64}) {
        TensorMap in = inputs_for({{"A", {m, k}}, {"B", {k, n}}}, t, 40);
        expect_same(mm, in, "matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n), small_l2);
        count(mm, in, small_l2);
      }
    }
  }
  std::cout << microkernels << " micro-kernel nests, " << predicated << " with predicated blocks, " << packed << " packed\n";
  EXPECT_GE(microkernels, 40);
  EXPECT_EQ(packed, 12);  // 40x9x512 and 40x9x600 in f32 and f64 at every vector width
  EXPECT_GE(predicated, 20);
  // Everything else, with micro-kernels wherever they apply.
  CompileOptions o;
  o.target.cpu.microkernel_min_points = 0;
  for (const auto& entry : std::filesystem::directory_iterator(POLYTILE_SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".tile") continue;
    std::ifstream f(entry.path());
    std::string first;
    std::getline(f, first);
    Program p = parse_file(entry.path().string());
    for (DType t : {DType::f32, DType::f64})
      expect_same(p, inputs_for(shapes_from_args(first.substr(first.find(':') + 1)), t, 8), entry.path().filename().string(), o);
  }
  std::mt19937_64 rng(616161);
  for (int iter = 0; iter < 150; ++iter) {
    testing::generators::Case cs = testing::generators::any_case(rng);
    expect_same(parse_program(cs.text), inputs_for(cs.shapes, DType::f64, 77 + iter), "generated " + std::to_string(iter), o);
  }
}

// Whether the condition of some branch between a micro-kernel step's unmasked and masked fused
// multiply-adds (`br i1 %c, label %fma.all, label %fma.some`) in `ir` depends on a vector compare (a lane
// mask), read off the definitions %c is made from within its function. `branches` counts the branches.
bool fma_branch_reads_lane_masks(const std::string& ir, int& branches) {
  // The names (%x) in `text`, in order.
  auto names = [](const std::string& text) {
    std::vector<std::string> out;
    for (size_t at = text.find('%'); at != std::string::npos; at = text.find('%', at + 1)) {
      size_t end = at + 1;
      while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_' || text[end] == '.' || text[end] == '-')) ++end;
      if (end > at + 1) out.push_back(text.substr(at, end - at));
    }
    return out;
  };
  // "icmp PREDICATE <N x ...>": a compare of vectors.
  auto vector_compare = [](const std::string& rhs) {
    const size_t icmp = rhs.find("icmp ");
    if (icmp == std::string::npos) return false;
    const size_t type = rhs.find(' ', icmp + 5);
    return type != std::string::npos && type + 1 < rhs.size() && rhs[type + 1] == '<';
  };
  const std::string branch = "br i1 ", targets = ", label %fma.all, label %fma.some";
  bool reads = false;
  size_t at = 0;
  while ((at = ir.find("define ", at)) != std::string::npos) {
    const size_t end = std::min(ir.find("\ndefine ", at + 1), ir.size());
    std::map<std::string, std::string> defs;
    std::vector<std::string> conditions;
    std::istringstream lines(ir.substr(at, end - at));
    for (std::string line; std::getline(lines, line);) {
      const size_t first = line.find_first_not_of(' ');
      const size_t equals = line.find(" = ");
      if (first != std::string::npos && line[first] == '%' && equals != std::string::npos)
        defs[line.substr(first, equals - first)] = line.substr(equals + 3);
      const size_t br = line.find(branch), to = line.find(targets);
      if (br != std::string::npos && to != std::string::npos) conditions.push_back(line.substr(br + branch.size(), to - br - branch.size()));
    }
    branches += static_cast<int>(conditions.size());
    std::set<std::string> seen;
    while (!conditions.empty()) {
      const std::string v = conditions.back();
      conditions.pop_back();
      if (!seen.insert(v).second || !defs.count(v)) continue;
      const std::string& rhs = defs.at(v);
      reads = reads || vector_compare(rhs);
      for (const std::string& operand : names(rhs)) conditions.push_back(operand);
    }
    at = end;
  }
  return reads;
}

// A micro-kernel's fused multiply-adds are masked by the inputs' conditions and the constraints alone: an
// accumulator whose output element is out of range is never stored, so in a padded panel's last block
// column (its vector operand's lanes past the output are zeros, in range of the panel) every step runs
// unmasked, as in the uniform blocks (sgemm 1000 on the Emerald Rapids guest: 7.14-7.25 -> 6.69-6.85 ms).
// Lanes whose inputs leave their tensors stay masked (a padded NCHW depthwise conv: x + i - 1 outside the
// image). Each against the interpreter, the matmul's A holding infinities: a padded lane's accumulator is
// then NaN (0 times infinity), which a store letting it out would write into C's next row.
TEST(CpuTest, FusedMultiplyAddsOfLanesPastTheOutputRunUnmasked) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  Program dw = parse_program(
      "function (I[N, C, H, W], K[C, KH, KW]) -> (O) {"
      "  O[n, c, y, x : N, C, H, W] = +(I[n, c, y + j - 1, x + i - 1] * K[c, j, i]); }");
  for (int bits : {512, 256}) {
    for (DType t : {DType::f32, DType::f64}) {
      const std::string what = std::to_string(bits) + " bits, " + to_string(t);
      CompileOptions o = microkernels_forced(bits);
      o.target.cpu.l2_bytes = 16 * 1024;  // B packed into panels (as in MicrokernelsMatchTheInterpreter)
      TensorMap in = inputs_for({{"A", {200, 9}}, {"B", {9, 601}}}, t, 61);
      for (int64_t e = 0; e < in.at("A").size(); e += 97) in.at("A").set(e, std::numeric_limits<double>::infinity());
      auto compiled = compile(mm, types_of(in), o);
      ASSERT_NE(print(compiled->program()).find("B_P["), std::string::npos) << what;
      int branches = 0;
      EXPECT_FALSE(fma_branch_reads_lane_masks(compiled->llvm_ir(), branches)) << what << "\n" << compiled->llvm_ir();
      EXPECT_GT(branches, 0) << what << ": the padded panel's blocks are predicated";
      expect_same(mm, in, "matmul 200x9x601, " + what, o);
      TensorMap images = inputs_for({{"I", {1, 2, 3, 300}}, {"K", {2, 3, 3}}}, t, 62);
      auto conv = compile(dw, types_of(images), o);
      branches = 0;
      EXPECT_TRUE(fma_branch_reads_lane_masks(conv->llvm_ir(), branches)) << what << "\n" << conv->llvm_ir();
      EXPECT_GT(branches, 0) << what;
      expect_same(dw, images, "depthwise NCHW conv, " + what, o);
    }
  }
}

// A matmul's B whose rows are 2 KiB or more apart is packed into panels (plan.cpp pack_vector_operand);
// where CpuModel::pack_within_l2 is false (AMD's Zen cores) only if it does not fit in a core's L2: one
// that fits is read from L2 after its first pass, its pages within the TLB's reach. 64x32x512 f32 (B: 64
// KiB) with an L2 of 128 KiB: unpacked there, packed on the others; of 32 KiB: packed on both. The
// interpreter's values either way.
TEST(CpuTest, OperandsThatFitInL2AreNotPackedOnZenCores) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in = inputs_for({{"A", {64, 32}}, {"B", {32, 512}}}, DType::f32, 41);
  for (bool pack_within_l2 : {false, true})
    for (int64_t l2 : {128 * 1024, 32 * 1024}) {
      CompileOptions o = microkernels_forced(512);
      o.target.cpu.l2_bytes = l2;
      o.target.cpu.pack_within_l2 = pack_within_l2;
      const std::string what = std::to_string(l2) + " bytes of L2, pack_within_l2 " + std::to_string(pack_within_l2);
      const std::string lowered = print(compile(mm, types_of(in), o)->program());
      EXPECT_EQ(lowered.find("B_P[") != std::string::npos, pack_within_l2 || l2 == 32 * 1024) << what << "\n" << lowered;
      expect_same(mm, in, what, o);
    }
  // The rule by CPU (cpu::cpu_target): off for Zen cores, on for Intel's.
  EXPECT_FALSE(cpu_target("znver4").cpu.pack_within_l2);
  EXPECT_FALSE(cpu_target("znver3").cpu.pack_within_l2);
  EXPECT_TRUE(cpu_target("sapphirerapids").cpu.pack_within_l2);
  EXPECT_TRUE(cpu_target("skylake-avx512").cpu.pack_within_l2);
}

// Packed panels of a B larger than half of L2 lead, split across the threads, when A fits in half of it:
// each panel is then read from memory once, by every row block of A in turn, where tiles of A's row
// blocks each read all of B (a transformer's DW1 = N2^T DU, 256 x 1024 by 1024 x 1024, 2.13-2.17 ->
// 1.83-1.89 ms). A 48 x 64 (12 KiB) by B 64 x 512 (128 KiB, 8 panels): with 32 KiB of L2 the threads
// split the 8 panels; with 16 KiB (A no longer fits in half) the 8 row blocks. Against the interpreter.
TEST(CpuTest, LargePanelsLeadWhenTheRowsFitInL2) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in = inputs_for({{"A", {48, 64}}, {"B", {64, 512}}}, DType::f32, 47);
  for (int64_t l2 : {32 * 1024, 16 * 1024}) {
    CompileOptions o = microkernels_forced(512);
    o.target.cpu.l2_bytes = l2;
    const std::string what = std::to_string(l2) + " bytes of L2";
    auto compiled = compile(mm, types_of(in), o);
    const std::string loops = sched::print_loops(compiled->schedule());
    const size_t nest = loops.find("nest C.update");
    ASSERT_NE(nest, std::string::npos) << loops;
    ASSERT_NE(loops.find("micro-kernel", nest), std::string::npos) << loops;
    ASSERT_NE(print(compiled->program()).find("B_P["), std::string::npos) << what;
    // The first loop of the nest: over the 8 panels, or over the row blocks' tiles.
    const size_t first = loops.find("parallel for c0 = 0 while (c0 <= ", nest);
    ASSERT_NE(first, std::string::npos) << loops;
    const bool panels_lead = loops.compare(first, 35, "parallel for c0 = 0 while (c0 <= 7)") == 0 &&
                             loops.find("S(i, j_blk, j_lane, k); threads split 0..7;", nest) != std::string::npos;
    EXPECT_EQ(panels_lead, l2 == 32 * 1024) << what << "\n" << loops.substr(nest, 600);
    expect_same(mm, in, what, o);
  }
}

// Nor is a B beyond L2 whose elements each serve fewer than 32 points (plan.cpp kServedPagePack): a
// skinny matmul's B, read by a few rows of A, would be copied and read again, three passes over memory
// where the rows' blocks of a column read each tile of it once. With an L2 of 32 KiB, B of 64x512 (128
// KiB, rows 2 KiB apart): 8 rows of A unpacked, 32 packed. The interpreter's values either way.
TEST(CpuTest, SkinnyMatmulsReadTheirWideOperandAsItIs) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  for (int64_t rows : {8, 32}) {
    TensorMap in = inputs_for({{"A", {rows, 64}}, {"B", {64, 512}}}, DType::f32, 43);
    CompileOptions o = microkernels_forced(512);
    o.target.cpu.l2_bytes = 32 * 1024;
    const std::string lowered = print(compile(mm, types_of(in), o)->program());
    EXPECT_EQ(lowered.find("B_P[") != std::string::npos, rows == 32) << rows << " rows of A\n" << lowered;
    expect_same(mm, in, std::to_string(rows) + " rows of A", o);
  }
}

// A weight-mode micro-kernel (a small output, a long reduction) sizes its reduction tiles by a row of
// blocks across all columns, unless that row fills L1 in fewer than 16 steps: then by one block, whose
// column the next blocks reuse. C = A B of 6 x 2048 times 2048 x 1024 (B unpacked: 6 points an element;
// 16 columns of 64 floats, 4 KiB a step of k) took tiles of 8 steps, now of 128. Read off
// the loop around the FMAs (for cN = (T * cM) ...); against the interpreter.
TEST(CpuTest, WeightModeRowsThatFillL1InAFewStepsTileByOneBlock) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in = inputs_for({{"A", {6, 2048}}, {"B", {2048, 1024}}}, DType::f32, 45);
  CompileOptions o = microkernels_forced(512);
  o.target.cpu.l1_bytes = 48 * 1024;
  o.target.cpu.l2_bytes = 2 << 20;
  auto compiled = compile(mm, types_of(in), o);
  const std::string loops = sched::print_loops(compiled->schedule());
  EXPECT_EQ(print(compiled->program()).find("B_P["), std::string::npos) << loops;
  // T of the loop right around the FMAs, "for cN = (T * cM) while ...".
  const size_t fma = loops.find("Fma(");
  ASSERT_NE(fma, std::string::npos) << loops;
  const size_t loop = loops.rfind("for c", fma), from = loops.find(" = (", loop);
  ASSERT_TRUE(loop != std::string::npos && from < loops.find('\n', loop)) << loops;
  EXPECT_GE(std::stoll(loops.substr(from + 4)), 16) << loops;
  expect_same(mm, in, "skinny matmul in weight mode", o);
}

// Panels for vector operands whose rows are wider than a block column (prepare_layouts): a convolution's
// weights with 16 output channels, read 8 at a time (f64, 128-bit vectors), are packed into panels of 8
// (26 channels: the last panel padded) for the forward pass, and -- moving the input channels last as
// they go -- for the data gradient; each packed element serves 1024 points. A weight gradient whose
// reduction is split across the threads keeps its output gradient unpacked (the split needs the output's
// plain indices). All of it against the interpreter.
TEST(CpuTest, WideOperandsArePackedIntoPanels) {
  Program fwd = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
  CompileOptions o = microkernels_forced(128);
  auto lowered = [&](const Program& p, const TensorMap& in) { return print(compile(p, types_of(in), o)->program()); };
  TensorMap in = inputs_for({{"I", {1, 32, 32, 16}}, {"K", {3, 3, 16, 16}}}, DType::f64, 51);
  EXPECT_NE(lowered(fwd, in).find("K_P[tb, t0, t1, t2, tl : 2, 3, 3, 16, 8] = =(K[t0, t1, t2, 8*tb + tl])"), std::string::npos)
      << lowered(fwd, in);
  expect_same(fwd, in, "forward, packed weights", o);
  // 26 output channels, read 10 at a time (5 chunks of 2 lanes: 3 columns, the fewest lanes past the
  // channels): two panels of 10 and a padded one of 6, whose lanes 6-9 are masked.
  TensorMap odd = inputs_for({{"I", {1, 32, 32, 16}}, {"K", {3, 3, 16, 26}}}, DType::f64, 54);
  EXPECT_NE(lowered(fwd, odd).find("K_P[tb, t0, t1, t2, tl : 3, 3, 3, 16, 10] = =(K[t0, t1, t2, 10*tb + tl])"), std::string::npos)
      << lowered(fwd, odd);
  expect_same(fwd, odd, "forward, packed weights with a padded panel", o);
  in["DO"] = testing::random_buffer({1, 32, 32, 16}, 52);
  ad::Options ao;
  ao.wrt = {"I"};
  Program data = ad::vjp(fwd, ao).program;
  EXPECT_NE(lowered(data, in).find("K_P[tb, t0, t1, t3, tl : 2, 3, 3, 16, 8] = =(K[t0, t1, 8*tb + tl, t3])"), std::string::npos)
      << lowered(data, in);
  expect_same(data, in, "data gradient, transposed weights packed", o);
  ao.wrt = {"K"};
  Program weights = ad::vjp(fwd, ao).program;
  TensorMap big = inputs_for({{"I", {4, 32, 32, 128}}, {"K", {3, 3, 128, 16}}, {"DO", {4, 32, 32, 16}}}, DType::f64, 53);
  const std::string split = lowered(weights, big);
  EXPECT_NE(split.find("DK_slices["), std::string::npos) << split;
  EXPECT_EQ(split.find("_P["), std::string::npos) << split;
}

// Micro-kernel rows that share no operand (plan.cpp: every input reads the block variable): an NCHW
// depthwise conv's channel rows each read their own plane and their own weights. With AVX2's 16 registers
// the product runs as a loop nest; with AVX-512's 32 as a micro-kernel. Both against the interpreter.
TEST(CpuTest, RowsSharingNoOperandAreNoMicroKernelOnAvx2) {
  Program dw = parse_program(
      "function (I[N, C, H, W], K[C, KH, KW]) -> (O) {\n"
      "  O[n, c, y, x : N, C, H, W] = +(I[n, c, y + j - 1, x + i - 1] * K[c, j, i]);\n}\n");
  TensorMap in = inputs_for({{"I", {2, 16, 12, 24}}, {"K", {16, 3, 3}}}, DType::f32, 95);
  auto product_is_microkernel = [&](const CompileOptions& o) {
    auto compiled = compile(dw, types_of(in), o);
    for (const auto& nest : compiled->schedule().nests)
      if (nest.tensor == "O" && nest.kind == sched::Nest::Kind::update) return nest.microkernel.has_value();
    ADD_FAILURE() << "no update nest of O\n" << sched::print_loops(compiled->schedule());
    return false;
  };
  const CompileOptions avx2 = microkernels_forced(256, 16), avx512 = microkernels_forced(512, 32);
  EXPECT_FALSE(product_is_microkernel(avx2));
  EXPECT_TRUE(product_is_microkernel(avx512));
  expect_same(dw, in, "NCHW depthwise conv, AVX2: loops", avx2);
  expect_same(dw, in, "NCHW depthwise conv, AVX-512: micro-kernel", avx512);
}

// Two products reading the same operand the same way read one copy of it (lay_out_program's shared
// copies): C = A^T B and D = A^T E each want A transposed (rows 2080 bytes apart), and A_T is made once;
// F = A B' reads A as it is. Run against the interpreter with every rewrite proven.
TEST(CpuTest, ProductsReadingAnOperandAlikeShareItsCopy) {
  CompileOptions o = microkernels_forced(128);
  Program p = parse_program(
      "function (A[K, M], B[K, N], E[K, N], G[M, N]) -> (C, D, F) {\n"
      "  C[i, j : M, N] = +(A[k, i] * B[k, j]);\n"
      "  D[i, j : M, N] = +(A[k, i] * E[k, j]);\n"
      "  F[k, j : K, N] = +(A[k, i] * G[i, j]);\n}\n");
  TensorMap in = inputs_for({{"A", {64, 260}}, {"B", {64, 40}}, {"E", {64, 40}}, {"G", {260, 40}}}, DType::f64, 91);
  const std::string lowered = print(compile(p, types_of(in), o)->program());
  EXPECT_NE(lowered.find("A_T[t1, t0 : 260, 64] = =(A[t0, t1])"), std::string::npos) << lowered;
  EXPECT_EQ(lowered.find("A_T_["), std::string::npos) << lowered;
  EXPECT_NE(lowered.find("C[i, j : M, N] = +(A_T[i, k] * B[k, j])"), std::string::npos) << lowered;
  EXPECT_NE(lowered.find("D[i, j : M, N] = +(A_T[i, k] * E[k, j])"), std::string::npos) << lowered;
  expect_same(p, in, "two products reading one transposed copy", o);
}

// Rows of the broadcast operand closer than a page, whose lines L2 cannot keep (plan.cpp,
// overflows_l2_sets): in C = A^T B with A's rows 1 KiB apart, every step's line falls into one sixteenth of
// L2's sets, so a 128 KiB L2 keeps 128 of them, and the micro-kernel's reduction tiles (50 steps) fill
// more than a quarter of that: A is read from a copy with k's dim last. A 2 MiB L2 keeps 2048: no copy.
// Rows 1.5 KiB apart (24 lines: every eighth set) leave 256 lines: no copy either. The same with the steps over two reduction variables (a
// batch of sequences, as a transformer's weight gradient reads its layer's input). Each run against the
// interpreter.
TEST(CpuTest, BroadcastRowsThatConflictInL2AreTransposed) {
  CompileOptions small = microkernels_forced(512);
  small.target.cpu.l1_bytes = 32 * 1024;
  small.target.cpu.l2_bytes = 128 * 1024;
  small.target.cpu.l3_bytes = 32 * 1024 * 1024;
  CompileOptions large = small;
  large.target.cpu.l2_bytes = 2 * 1024 * 1024;
  auto lowered = [](const Program& p, const TensorMap& in, const CompileOptions& o) { return print(compile(p, types_of(in), o)->program()); };
  Program atb = parse_program("function (A[K, M], B[K, N]) -> (C) { C[i, j : M, N] = +(A[k, i] * B[k, j]); }");
  TensorMap kib = inputs_for({{"A", {100, 256}}, {"B", {100, 128}}}, DType::f32, 81);
  const std::string copied = lowered(atb, kib, small);
  EXPECT_NE(copied.find("A_T[t1, t0 : 256, 100] = =(A[t0, t1])"), std::string::npos) << copied;
  expect_same(atb, kib, "A^T B, rows 1 KiB apart in a 128 KiB L2", small);
  EXPECT_EQ(lowered(atb, kib, large).find("A_T["), std::string::npos) << lowered(atb, kib, large);
  TensorMap spread = inputs_for({{"A", {100, 384}}, {"B", {100, 128}}}, DType::f32, 82);
  EXPECT_EQ(lowered(atb, spread, small).find("A_T["), std::string::npos) << lowered(atb, spread, small);
  expect_same(atb, spread, "A^T B, rows 1.5 KiB apart", small);
  Program sequences = parse_program(
      "function (X[B, L, C], D[B, L, F]) -> (W) { W[c, f : C, F] = +(X[b, i, c] * D[b, i, f]); }");
  TensorMap batch = inputs_for({{"X", {2, 50, 256}}, {"D", {2, 50, 128}}}, DType::f32, 83);
  const std::string batched = lowered(sequences, batch, small);
  EXPECT_NE(batched.find("X_T[t0, t2, t1 : 2, 256, 50] = =(X[t0, t1, t2])"), std::string::npos) << batched;
  expect_same(sequences, batch, "a weight gradient over a batch of sequences, rows 1 KiB apart", small);
  EXPECT_EQ(lowered(sequences, batch, large).find("X_T["), std::string::npos) << lowered(sequences, batch, large);
}

// A 3x3 convolution with zero padding of one in PyTorch's default layouts (NCHW, OIHW).
Program padded_nchw_conv() {
  return parse_program(
      "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {"
      "  O[n, co, y, x : N, CO, H, W] = +(I[n, ci, y + j - 1, x + i - 1] * K[co, ci, j, i]); }");
}

// The broadcast operand read across pages at every reduction step (prepare_layouts): in C = A^T B each
// step k reads a row of A further, 260 f64 (2080 bytes) on; A is read from a copy with k's dim last, as
// A B reads A -- also with a batch dim before it. Rows 200 f64 apart (1600 bytes) stay as they are, as
// does A B's A. Every rewrite proven with isl (expect_same's verify) and run against the interpreter.
TEST(CpuTest, BroadcastOperandsReadAcrossPagesAreTransposed) {
  CompileOptions o = microkernels_forced(128);
  auto lowered = [&](const Program& p, const TensorMap& in) { return print(compile(p, types_of(in), o)->program()); };
  Program atb = parse_program("function (A[K, M], B[K, N]) -> (C) { C[i, j : M, N] = +(A[k, i] * B[k, j]); }");
  TensorMap wide = inputs_for({{"A", {64, 260}}, {"B", {64, 40}}}, DType::f64, 71);
  const std::string copied = lowered(atb, wide);
  EXPECT_NE(copied.find("A_T[t1, t0 : 260, 64] = =(A[t0, t1])"), std::string::npos) << copied;
  EXPECT_NE(copied.find("A_T[i, k]"), std::string::npos) << copied;
  expect_same(atb, wide, "A^T B, A transposed", o);
  Program batched = parse_program(
      "function (A[S, K, M], B[S, K, N]) -> (C) { C[s, i, j : S, M, N] = +(A[s, k, i] * B[s, k, j]); }");
  TensorMap three = inputs_for({{"A", {3, 40, 300}}, {"B", {3, 40, 24}}}, DType::f64, 72);
  const std::string batch = lowered(batched, three);
  EXPECT_NE(batch.find("A_T[t0, t2, t1 : 3, 300, 40] = =(A[t0, t1, t2])"), std::string::npos) << batch;
  expect_same(batched, three, "batched A^T B, A transposed", o);
  TensorMap near = inputs_for({{"A", {64, 200}}, {"B", {64, 40}}}, DType::f64, 73);
  EXPECT_EQ(lowered(atb, near).find("A_T["), std::string::npos) << lowered(atb, near);
  expect_same(atb, near, "A^T B, rows 1600 bytes apart", o);
  // Columns that one block covers (64 f32 in 512-bit vectors, attention's dV = P^T dO): each element of A
  // is loaded once, by the block of its row, and a copy would only add a pass over it. With 192 columns
  // the blocks read A three times or more, and it is copied.
  const CompileOptions wide_vectors = microkernels_forced(512);
  TensorMap one_block = inputs_for({{"A", {64, 600}}, {"B", {64, 64}}}, DType::f32, 75);
  const std::string once = print(compile(atb, types_of(one_block), wide_vectors)->program());
  EXPECT_EQ(once.find("A_T["), std::string::npos) << once;
  expect_same(atb, one_block, "A^T B, one column block", wide_vectors);
  TensorMap blocks = inputs_for({{"A", {64, 600}}, {"B", {64, 192}}}, DType::f32, 76);
  const std::string thrice = print(compile(atb, types_of(blocks), wide_vectors)->program());
  EXPECT_NE(thrice.find("A_T["), std::string::npos) << thrice;
  Program ab = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap plain = inputs_for({{"A", {260, 600}}, {"B", {600, 40}}}, DType::f64, 74);
  EXPECT_EQ(lowered(ab, plain).find("A_T["), std::string::npos) << lowered(ab, plain);
  // An NCHW conv's input channels are its longest reduction, a plane (32 x 32 floats, 4 KB) apart: read
  // from an NHWC copy, the channels the innermost reduction. Its data gradient reads the output gradient
  // after the weights, so a copy would not make the channels innermost there; with its blocks along x the
  // rows share each line of the output gradient: no copy.
  const CompileOptions avx512 = microkernels_forced(512);
  auto lowered_wide = [&](const Program& p, const TensorMap& in) { return print(compile(p, types_of(in), avx512)->program()); };
  Program nchw = padded_nchw_conv();
  TensorMap planes = inputs_for({{"I", {1, 32, 32, 32}}, {"K", {32, 32, 3, 3}}}, DType::f32, 75);
  const std::string forward = lowered_wide(nchw, planes);
  EXPECT_NE(forward.find("I_T[t0, t2, t3, t1 : 1, 32, 32, 32] = =(I[t0, t1, t2, t3])"), std::string::npos) << forward;
  EXPECT_NE(forward.find("I_T[n, j + y - 1, i + x - 1, ci]"), std::string::npos) << forward;
  expect_same(nchw, planes, "NCHW convolution, input channels from an NHWC copy", avx512);
  ad::Options data;
  data.wrt = {"I"};
  const Program gradient = ad::vjp(nchw, data).program;
  planes["DO"] = inputs_for({{"DO", {1, 32, 32, 32}}}, DType::f32, 76).at("DO");
  const std::string backward = lowered_wide(gradient, planes);
  EXPECT_NE(backward.find("DI_L["), std::string::npos) << backward;
  EXPECT_EQ(backward.find("DO_T["), std::string::npos) << backward;
  expect_same(gradient, planes, "NCHW data gradient, output gradient read as it is", avx512);
  // A stride-2 NCHW conv's data gradient whose blocks run over the images: each row reads its own image
  // of the output gradient, a plane (16 x 16 f64, 2 KB) further at every output channel. The gradient's
  // product then reads an NHWC copy of it first (x y = y x), which makes the output channels the
  // innermost reduction; the swapped product is proven with isl in its original order (expect_same's
  // verify) and run against the interpreter.
  const Program strided = parse_program(
      "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {"
      "  O[n, co, y, x : N, CO, H/2, W/2] = +(I[n, ci, 2*y + j - 1, 2*x + i - 1] * K[co, ci, j, i]); }");
  const Program strided_gradient = ad::vjp(strided, data).program;
  TensorMap images = inputs_for({{"I", {4, 16, 32, 32}}, {"K", {16, 16, 3, 3}}, {"DO", {4, 16, 16, 16}}}, DType::f64, 77);
  auto compiled = compile(strided_gradient, types_of(images), avx512);
  const std::string swapped = print(compiled->program());
  EXPECT_NE(swapped.find("DO_T[t0, t2, t3, t1 : 4, 16, 16, 16] = =(DO[t0, t1, t2, t3])"), std::string::npos) << swapped;
  EXPECT_NE(swapped.find("= +(DO_T["), std::string::npos) << swapped;
  bool innermost = false;
  for (const auto& nest : compiled->schedule().nests)
    if (nest.microkernel && !nest.microkernel->reductions.empty())
      innermost = nest.variables[nest.microkernel->reductions.back()] == "v4";  // the output channel
  EXPECT_TRUE(innermost) << sched::print_loops(compiled->schedule());
  expect_same(strided_gradient, images, "strided NCHW data gradient, output gradient copied and read first", avx512);
}

// Output permutation (prepare_layouts): an NCHW convolution's output is contiguous along x, 7 columns that
// leave an eighth of the lanes of 4 vectors of 2 f64 empty, while its 8 output channels fill them; the
// convolution writes O_L[n, y, x, co] (reading its weights transposed, co last) and an assign moves it
// into O. With zero padding too, and the program's gradients, each proven with isl (expect_same's verify)
// and run against the interpreter; an NHWC convolution keeps its output, and so does a skinny matmul whose
// A would have to be copied.
TEST(CpuTest, OutputsArePermutedForTheirMicroKernel) {
  CompileOptions o = microkernels_forced(128);
  auto lowered = [&](const Program& p, const TensorMap& in) { return print(compile(p, types_of(in), o)->program()); };
  Program valid = parse_program(
      "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {"
      "  O[n, co, y, x : N, CO, H - KH + 1, W - KW + 1] = +(I[n, ci, y + j, x + i] * K[co, ci, j, i]); }");
  TensorMap in = inputs_for({{"I", {2, 6, 9, 9}}, {"K", {8, 6, 3, 3}}}, DType::f64, 81);
  const std::string laid_out = lowered(valid, in);
  EXPECT_NE(laid_out.find("O_L[n, y, x, co : N, H - KH + 1, W - KW + 1, CO] = +("), std::string::npos) << laid_out;
  EXPECT_NE(laid_out.find("O[t0, t1, t2, t3 : N, CO, H - KH + 1, W - KW + 1] = =(O_L[t0, t2, t3, t1])"), std::string::npos)
      << laid_out;
  expect_same(valid, in, "NCHW convolution, output permuted", o);
  Program padded = padded_nchw_conv();
  TensorMap odd = inputs_for({{"I", {2, 6, 7, 7}}, {"K", {8, 6, 3, 3}}}, DType::f64, 82);
  EXPECT_NE(lowered(padded, odd).find("O_L["), std::string::npos) << lowered(padded, odd);
  expect_same(padded, odd, "padded NCHW convolution, output permuted", o);
  odd["DO"] = testing::random_buffer({2, 8, 7, 7}, 83);
  const Program gradient = ad::vjp(padded, {}).program;
  expect_same(gradient, odd, "the padded NCHW convolution's gradients", o);
  // 16 columns fill a vector of 16 floats, but in the padded conv x's lanes follow the reduction (x + i - 1
  // in the image), so no micro-kernel takes x as its vector variable: it is permuted too (it ran as a
  // nest of plain loops, 20x slower, before). Without padding, x stays the vector variable.
  const CompileOptions wide = microkernels_forced(512);
  TensorMap sixteen = inputs_for({{"I", {2, 16, 16, 16}}, {"K", {32, 16, 3, 3}}}, DType::f32, 86);
  auto micro_kernel_of = [&](const Program& p, const TensorMap& in, const std::string& tensor) {
    for (const auto& nest : compile(p, types_of(in), wide)->schedule().nests)
      if (nest.tensor == tensor && nest.microkernel) return nest.variables[nest.microkernel->block] + " x " + nest.variables[nest.microkernel->vector];
    return std::string("none");
  };
  EXPECT_NE(print(compile(padded, types_of(sixteen), wide)->program()).find("O_L["), std::string::npos);
  EXPECT_EQ(micro_kernel_of(padded, sixteen, "O_L"), "x x co");
  expect_same(padded, sixteen, "padded NCHW convolution of 16 columns, output permuted", wide);
  TensorMap eighteen = inputs_for({{"I", {2, 16, 18, 18}}, {"K", {32, 16, 3, 3}}}, DType::f32, 87);
  EXPECT_EQ(print(compile(valid, types_of(eighteen), wide)->program()).find("O_L["), std::string::npos);
  const std::string direct = micro_kernel_of(valid, eighteen, "O");
  EXPECT_EQ(direct.substr(direct.rfind(' ') + 1), "x") << direct;
  expect_same(valid, eighteen, "NCHW convolution of 16 columns without padding", wide);
  // A strided NCHW conv reads its columns 2 * x + i - 3 apart: no input holds x contiguously, so it has no
  // micro-kernel as written (it ran as plain loops, 50-70x slower); permuted, its channels are the
  // vectors (a ResNet stem's 7x7 stride-2 conv of 3 channels, and a 3x3 stride-2 one).
  for (const auto& [image, weights] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 3, 22, 22}, {32, 3, 7, 7}}, {{2, 16, 14, 14}, {32, 16, 3, 3}}}) {
    const std::string pad = std::to_string(weights[2] / 2);
    Program strided = parse_program(
        "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {"
        "  O[n, co, y, x : N, CO, H / 2, W / 2] = +(I[n, ci, 2 * y + j - " + pad + ", 2 * x + i - " + pad + "] * K[co, ci, j, i]); }");
    TensorMap in = inputs_for({{"I", image}, {"K", weights}}, DType::f32, 88);
    EXPECT_NE(print(compile(strided, types_of(in), wide)->program()).find("O_L["), std::string::npos);
    EXPECT_NE(micro_kernel_of(strided, in, "O_L"), "none");
    expect_same(strided, in, "stride-2 NCHW convolution of " + std::to_string(weights[1]) + " channels, output permuted", wide);
  }
  Program nhwc = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H - KH + 1, W - KW + 1, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]); }");
  TensorMap channels_last = inputs_for({{"I", {2, 9, 9, 6}}, {"K", {3, 3, 6, 8}}}, DType::f64, 84);
  EXPECT_EQ(lowered(nhwc, channels_last).find("_L["), std::string::npos) << lowered(nhwc, channels_last);
  // A skinny matmul's 17 columns leave 3 of 20 lanes empty (vectors of 4 f64) and its 64 rows fill them,
  // but with the rows last it would read all of A transposed (each element of A serves 17 points, fewer
  // than 64): it keeps its output.
  CompileOptions medium = microkernels_forced(256);
  Program ab = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap skinny = inputs_for({{"A", {64, 40}}, {"B", {40, 17}}}, DType::f64, 85);
  const std::string kept = print(compile(ab, types_of(skinny), medium)->program());
  EXPECT_EQ(kept.find("_L["), std::string::npos) << kept;
  expect_same(ab, skinny, "a skinny matmul", medium);
}

// Nest::permuted_copy: the assign that moves a permuted output into place (an NCHW convolution's O_L, or a
// user's own permuting assign of a contraction nothing else reads) is done by the micro-kernel's blocks at
// their last reduction tile, each lane's rows transposed in registers into one vector of the output,
// instead of by a nest of its own: with one reduction tile (zero, fmas, epilogue) and several (partial
// sums stored to the scratch output and loaded back between them), border blocks predicated, rows that
// are not a power of two (7 and 12, and 12 in two groups of 8 lanes' transpositions), f32 and f64, vectors
// of 128 and 512 bits. The assign keeps its nest
// where the block variable is not contiguous in its output (blocks of y), where the blocks leave elements
// unstored (a constraint), and where another statement reads the contraction's output too. Each against
// the interpreter, every rewrite proven with isl (expect_same).
TEST(CpuTest, PermutedOutputsAreStoredByTheirBlocks) {
  struct Seen {
    int fused = 0;
    bool copy_nest = false, stores = false, epilogues = false;
    std::string block, loops;
  };
  auto seen = [](const Program& p, const TensorMap& in, const CompileOptions& o) {
    auto compiled = compile(p, types_of(in), o);
    Seen s;
    for (const auto& nest : compiled->schedule().nests) {
      s.fused += nest.permuted_copy.has_value();
      s.copy_nest = s.copy_nest || nest.tensor == "O";
      if (nest.microkernel && nest.contraction.output != "K_T") s.block = nest.variables[nest.microkernel->block];
    }
    s.loops = sched::print_loops(compiled->schedule());
    s.stores = s.loops.find("Store(") != std::string::npos || s.loops.find("Storep(") != std::string::npos;
    s.epilogues = s.loops.find("Epilogue") != std::string::npos;
    return s;
  };
  auto fixed_caches = [](CompileOptions o, int64_t l1) {
    o.target.cpu.l1_bytes = l1;
    o.target.cpu.l2_bytes = 2 << 20;
    o.target.cpu.l3_bytes = 32 << 20;
    return o;
  };
  Program nchw = padded_nchw_conv();
  const CompileOptions wide = fixed_caches(microkernels_forced(512), 48 << 10);
  TensorMap small = inputs_for({{"I", {2, 16, 14, 14}}, {"K", {32, 16, 3, 3}}}, DType::f32, 91);
  Seen one_tile = seen(nchw, small, wide);
  EXPECT_TRUE(one_tile.fused == 1 && !one_tile.copy_nest && one_tile.block == "x") << one_tile.loops;
  EXPECT_NE(one_tile.loops.find("last tiles stored permuted into O"), std::string::npos) << one_tile.loops;
  EXPECT_TRUE(one_tile.epilogues && !one_tile.stores) << one_tile.loops;
  expect_same(nchw, small, "NCHW convolution, one reduction tile, stored permuted", wide);
  const CompileOptions tiny_l1 = fixed_caches(microkernels_forced(512), 4096);
  Seen tiles = seen(nchw, small, tiny_l1);
  EXPECT_TRUE(tiles.fused == 1 && !tiles.copy_nest && tiles.epilogues && tiles.stores) << tiles.loops;
  expect_same(nchw, small, "NCHW convolution, several reduction tiles, stored permuted", tiny_l1);
  TensorMap doubles = inputs_for({{"I", {2, 8, 10, 10}}, {"K", {16, 8, 3, 3}}}, DType::f64, 92);
  Seen f64 = seen(nchw, doubles, wide);
  EXPECT_TRUE(f64.fused == 1 && !f64.copy_nest) << f64.loops;
  expect_same(nchw, doubles, "f64 NCHW convolution, stored permuted", wide);
  const CompileOptions narrow = fixed_caches(microkernels_forced(128), 48 << 10);
  TensorMap one_image = inputs_for({{"I", {1, 16, 14, 14}}, {"K", {32, 16, 3, 3}}}, DType::f32, 97);
  Seen f32_narrow = seen(nchw, one_image, narrow);
  EXPECT_TRUE(f32_narrow.fused == 1 && !f32_narrow.copy_nest) << f32_narrow.loops;
  expect_same(nchw, one_image, "NCHW convolution in vectors of 128 bits, stored permuted", narrow);
  // A user's permuting assign: blocks of x (7 or 12 rows) store it; blocks of y cannot (a lane's rows
  // are 7 columns apart there), nor blocks that skip the rows y >= 5.
  const std::string contraction = "  T[n, y, x, co : N, H, W, CO] = +(I[n, y, x, ci] * K[ci, co])";
  const std::string assign = "  O[n, co, y, x : N, CO, H, W] = =(T[n, y, x, co]);";
  Program mine = parse_program("function (I[N, H, W, CI], K[CI, CO]) -> (O) {" + contraction + ";" + assign + " }");
  // In f64 with 8 output channels, blocks of 12 rows of one vector of 8 lanes: transposed in two groups
  // of rows (8 and 4), each lane's rows stored in two pieces.
  struct Mine {
    std::vector<int64_t> image;
    int64_t channels;
    DType dtype;
    std::string kernel;
  };
  for (const Mine& m : std::vector<Mine>{{{2, 5, 7, 64}, 32, DType::f32, "7x2x16"},
                                         {{2, 3, 12, 64}, 32, DType::f32, "12x2x16"},
                                         {{2, 3, 12, 64}, 8, DType::f64, "12x1x8"}}) {
    TensorMap in = inputs_for({{"I", m.image}, {"K", {64, m.channels}}}, m.dtype, 94);
    Seen s = seen(mine, in, wide);
    EXPECT_TRUE(s.fused == 1 && !s.copy_nest && s.block == "x") << s.loops;
    EXPECT_NE(s.loops.find("micro-kernel " + m.kernel), std::string::npos) << s.loops;
    expect_same(mine, in, "a permuting assign stored by blocks of " + m.kernel, wide);
  }
  // The assign keeps its nest: blocks of y (8 rows), blocks of x that skip the rows y >= 5, and T read twice.
  struct Kept {
    std::string text, block, what;
    std::vector<int64_t> image;
  };
  for (const Kept& k : std::vector<Kept>{
           {"function (I[N, H, W, CI], K[CI, CO]) -> (O) {" + contraction + ";" + assign + " }", "y", "blocks of y", {2, 8, 7, 64}},
           {"function (I[N, H, W, CI], K[CI, CO]) -> (O) {" + contraction + ", y < 5;" + assign + " }", "x",
            "a contraction whose blocks skip elements", {2, 8, 7, 64}},
           {"function (I[N, H, W, CI], K[CI, CO]) -> (O, R) {" + contraction + ";" + assign + " R = relu(T); }", "",
            "a contraction read by another statement", {2, 5, 7, 64}}}) {
    Program p = parse_program(k.text);
    TensorMap in = inputs_for({{"I", k.image}, {"K", {64, 32}}}, DType::f32, 95);
    Seen s = seen(p, in, wide);
    EXPECT_TRUE(s.fused == 0 && s.copy_nest && (k.block.empty() || s.block == k.block)) << k.what << "\n" << s.loops;
    expect_same(p, in, "a permuting assign of " + k.what, wide);
  }
}

// Conditions that couple a block's rows and lanes: a stride-2 conv's data gradient (reduced and
// defracted) writes DI[n, ci, y0 + 2*y1, x0 + 2*x1], its blocks' rows x1 and its lanes x0, and on 25
// columns the last row's second lane (x = 25) is out of range though the row is in range at lane 0 and the
// lane in every other row. Such conditions mask each row's lanes (BlockValidity::cells); they were
// checked at lane 0 only, and that element's store (a zero) landed on column 0 of the next image row.
TEST(CpuTest, BlocksMaskLanesWhereConditionsCoupleRowsAndLanes) {
  const CompileOptions o = microkernels_forced(512);
  Program strided = parse_program(
      "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {"
      "  O[n, co, y, x : N, CO, 2, 11] = +(I[n, ci, 2 * y + j, 2 * x + i] * K[co, ci, j, i]); }");
  ad::Options ao;
  ao.wrt = {"I"};
  Program gradient = ad::vjp(strided, ao).program;
  for (DType t : {DType::f32, DType::f64}) {
    TensorMap in = inputs_for({{"I", {1, 3, 5, 25}}, {"K", {16, 3, 3, 5}}, {"DO", {1, 16, 2, 11}}}, t, 133);
    auto compiled = compile(gradient, types_of(in), o);
    std::string kernel;
    for (const auto& nest : compiled->schedule().nests)
      if (nest.tensor == "DI" && nest.microkernel)
        kernel = nest.variables[nest.microkernel->block] + " x " + nest.variables[nest.microkernel->vector];
    EXPECT_EQ(kernel, "v3_1 x v3_0") << sched::print_loops(compiled->schedule());
    expect_same(gradient, in, "a strided data gradient whose rows and lanes share a condition", o);
  }
}

// Rows a page apart in a broadcast operand whose steps cross pages every few steps (steps_across_pages):
// a stride-2 NCHW conv reads its image as it is (each element serves 72 points, too few for a copy), its
// input channels a plane of 6.4 KB apart at every ninth step; blocks of 4 images would put each
// row on a page of its own at each of those steps, so the plan takes blocks of columns, which the
// blocks' permuted stores then move into place. Its data gradient reads a copy of the output gradient
// (channels last, each step the next channel) and keeps its blocks of images.
TEST(CpuTest, BlocksAvoidRowsOnPagesOfTheirOwn) {
  CompileOptions o = microkernels_forced(512);
  o.target.cpu.l1_bytes = 48 << 10;
  o.target.cpu.l2_bytes = 2 << 20;
  o.target.cpu.l3_bytes = 32 << 20;
  Program strided = parse_program(
      "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {"
      "  O[n, co, y, x : N, CO, H / 2, W / 2] = +(I[n, ci, 2 * y + j - 1, 2 * x + i - 1] * K[co, ci, j, i]); }");
  TensorMap in = inputs_for({{"I", {4, 32, 40, 40}}, {"K", {32, 32, 3, 3}}}, DType::f32, 131);
  auto compiled = compile(strided, types_of(in), o);
  std::string block;
  for (const auto& nest : compiled->schedule().nests)
    if (nest.tensor == "O_L" && nest.microkernel) block = nest.variables[nest.microkernel->block];
  const std::string loops = sched::print_loops(compiled->schedule());
  EXPECT_EQ(block, "x") << loops;
  EXPECT_NE(loops.find("last tiles stored permuted into O"), std::string::npos) << loops;
  expect_same(strided, in, "stride-2 NCHW convolution in blocks of columns", o);
  ad::Options ao;
  ao.wrt = {"I"};
  Program gradient = ad::vjp(strided, ao).program;
  TensorMap with_seed = in;
  with_seed["DO"] = inputs_for({{"DO", {4, 32, 20, 20}}}, DType::f32, 132).at("DO");
  auto backward = compile(gradient, types_of(with_seed), o);
  std::string images;
  for (const auto& nest : backward->schedule().nests)
    if (nest.tensor == "DI_L" && nest.microkernel) images = nest.variables[nest.microkernel->block];
  EXPECT_EQ(images, "v0") << sched::print_loops(backward->schedule());
  expect_same(gradient, with_seed, "stride-2 NCHW data gradient in blocks of images", o);
}

// The blocks of one column of the vector operand run one after another inside a reduction tile, so the
// column's part of the tile is read from L1 by all of them. A convolution whose weights are packed into
// panels has output channels in blocks (co_blk) that only pick columns; its block step's arguments are
// (n, y, co_blk, x block, column, reduction tiles). With a long reduction into a small output (reduction
// tiles outermost, every block of a thread inside them) the loop over co_blk encloses the loop over the
// rows y; with a shorter one (tiles of blocks inside each reduction tile) it encloses the reduction tiles.
// Read off the printed loops; against the interpreter as well.
TEST(CpuTest, BlocksOfOneColumnRunTogether) {
  Program fwd = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
  for (bool long_reduction : {true, false}) {
    const int64_t ci = long_reduction ? 256 : 16;  // 3 * 3 * 256 reduction points, or 3 * 3 * 16
    const std::string what = std::to_string(ci) + " input channels";
    CompileOptions o = microkernels_forced(128);
    if (!long_reduction) o.target.cpu.l1_bytes = 8 * 1024;  // reduction tiles of fewer than 144 points
    TensorMap in = inputs_for({{"I", {1, 32, 32, ci}}, {"K", {3, 3, ci, 16}}}, DType::f64, 55);
    auto compiled = compile(fwd, types_of(in), o);
    const std::string loops = sched::print_loops(compiled->schedule());
    const size_t step = loops.find("Store(");
    ASSERT_NE(step, std::string::npos) << what << "\n" << loops;
    std::vector<std::string> args;
    std::stringstream list(loops.substr(step + 6, loops.find(')', step) - step - 6));
    for (std::string a; std::getline(list, a, ',');) args.push_back(a.substr(a.find_first_not_of(' ')));
    ASSERT_EQ(args.size(), 8u) << what << "\n" << loops;
    auto loop = [&](const std::string& iterator) { return loops.rfind("for " + iterator + " =", step); };
    const size_t column = loop(args[2]);
    ASSERT_NE(column, std::string::npos) << what << "\n" << loops;
    std::vector<std::string> inside = long_reduction ? std::vector<std::string>{args[1]}
                                                     : std::vector<std::string>{args[5], args[6], args[7]};
    int checked = 0;
    for (const std::string& it : inside) {
      if (loop(it) == std::string::npos) continue;  // a constant: no loop
      EXPECT_LT(column, loop(it)) << what << ": the loop over " << it << " encloses the column blocks'\n" << loops;
      ++checked;
    }
    EXPECT_GT(checked, 0) << what << "\n" << loops;
    expect_same(fwd, in, what, o);
  }
}

// Contractions without index variables (one element from constant indices) are nests with an empty band:
// the schedule's facts about the band's innermost member (the transposition tiles) have none to look at.
TEST(CpuTest, ContractionsWithoutVariablesMatchTheInterpreter) {
  for (const char* text : {"function (X[N]) -> (O) { O[0 : 1] = =(X[2]); }",
                           "function (X[N]) -> (O) { O[0 : 1] = +(X[1] * X[3]); }"}) {
    Program p = parse_program(text);
    expect_same(p, inputs_for({{"X", {5}}}, DType::f32, 3), text);
  }
}

// A transposition steps through a row of its input per element of the output's contiguous variable: that
// variable's tile is one cache line of the output (16 f32), the others longer (cpu_strategy.cpp), while a
// copy keeps its long runs of vectors; both compute what the interpreter does, also where the tiles do
// not divide the extents and in a 4-d transposition (NHWC to NCHW).
TEST(CpuTest, TranspositionsTileTheirContiguousVariableOneLineWide) {
  CompileOptions o;
  o.target.cpu.vector_bits = 256;
  o.target.cpu.l1_bytes = 32 * 1024;
  o.threads = 2;
  // The innermost loop's range, read off the printed loops: "for cK = (W * cJ) while (cK <= ((W * cJ) + W-1))".
  auto inner_tile = [](const std::string& loops) {
    const size_t statement = loops.rfind("S(");
    const size_t loop = loops.rfind("for ", statement);
    const size_t open = loops.find("= (", loop), times = loops.find(" * ", loop);
    if (statement == std::string::npos || loop == std::string::npos || open > statement || times > statement) return int64_t{-1};
    return static_cast<int64_t>(std::stoll(loops.substr(open + 3, times - open - 3)));
  };
  struct Case {
    std::string program;
    Shapes shapes;
    int64_t least, most;  // of the innermost tile (a copy's are evened out by equal_tiles: 530 is 5 of 106)
  };
  const Case cases[] = {
      // Transpositions whose input's last index is not a variable (those whose last indices are variables
      // move squares instead, also with a stride elsewhere: see TranspositionsMoveSquaresTransposedInRegisters).
      {"function (I[M, N]) -> (O) { O[i, j : N/2, M] = =(I[j, 2*i]); }", {{"I", {1300, 530}}}, 16, 16},
      {"function (I[M, N]) -> (O) { O[i, j : M, N] = =(I[i, j]); }", {{"I", {650, 530}}}, 65, 128},
      {"function (I[N, H, W, C]) -> (O) { O[n, c, h, w : N, C/2, H, W] = =(I[n, h, w, 2*c]); }", {{"I", {2, 37, 82, 96}}}, 16, 16},
  };
  for (const Case& c : cases) {
    Program p = parse_program(c.program);
    TensorMap in = inputs_for(c.shapes, DType::f32, 17);
    const std::string loops = sched::print_loops(compile(p, types_of(in), o)->schedule());
    EXPECT_GE(inner_tile(loops), c.least) << c.program << "\n" << loops;
    EXPECT_LE(inner_tile(loops), c.most) << c.program << "\n" << loops;
    expect_same(p, in, c.program, o);
  }
}

// A transposition of 4- or 8-byte elements (a copy whose input's contiguous variable is not the output's)
// moves squares of lanes x lanes elements: lanes vector loads of the input, a transposition in registers
// (shufflevector rounds), lanes vector stores of the output; the loops as they are at the edges. For every
// vector width (squares of 256-bit rows, 4 lanes at least: none for 8-byte elements in 128-bit vectors;
// of 512-bit rows on a core that runs them whole, where both contiguous ranges are whole squares, or end
// in half a square with a square's input rows within 4 KiB -- the edge squares then moved as squares of
// half the size --, in tiles of two squares along the input's contiguous variable; not on one that runs
// them in halves, a Zen 4), in 2 and 4 dimensions, f32, i32, f64 and i64, with and without edges, bit for
// bit as the interpreter. Also where the other indices are not plain variables: rows read with a stride, and a conv
// gradient's weights packed in panels (K_P[tb, j, i, co, tl] = K[j, i, 16*tb + tl, co], each row of the
// square from another row of K).
TEST(CpuTest, TranspositionsMoveSquaresTransposedInRegisters) {
  struct Case {
    std::string program;
    Shapes shapes;
    int64_t input_last, output_last;  // the contiguous variables' ranges
    int64_t row_stride;               // elements between the input's rows of a square
  };
  const Case cases[] = {
      {"function (I[M, N]) -> (O) { O[i, j : N, M] = =(I[j, i]); }", {{"I", {650, 530}}}, 530, 650, 530},
      {"function (I[M, N]) -> (O) { O[i, j : N, M] = =(I[j, i]); }", {{"I", {64, 48}}}, 48, 64, 48},
      {"function (I[M, N]) -> (O) { O[i, j : N, M] = =(I[j, i]); }", {{"I", {40, 40}}}, 40, 40, 40},
      {"function (I[M, N]) -> (O) { O[i, j : N, M] = =(I[j, i]); }", {{"I", {40, 1032}}}, 1032, 40, 1032},
      {"function (I[N, H, W, C]) -> (O) { O[n, c, h, w : N, C, H, W] = =(I[n, h, w, c]); }", {{"I", {2, 5, 41, 96}}}, 96, 41, 96},
      {"function (I[N, H, W, C]) -> (O) { O[n, c, h, w : N, C, H, W] = =(I[n, h, w, c]); }", {{"I", {2, 3, 32, 48}}}, 48, 32, 48},
      {"function (I[N, H, W, C]) -> (O) { O[n, c, h, w : N, C, H, W] = =(I[n, h, w, c]); }", {{"I", {2, 3, 24, 48}}}, 48, 24, 48},
      {"function (I[N, C, H, W]) -> (O) { O[n, h, w, c : N, H, W, C] = =(I[n, c, h, w]); }", {{"I", {3, 37, 4, 16}}}, 16, 37, 64},
      {"function (I[M, N]) -> (O) { O[i, j : N, M/2] = =(I[2*j, i]); }", {{"I", {1300, 530}}}, 530, 650, 1060},
      {"function (K[KH, KW, CI, CO]) -> (P) { P[tb, j, i, co, tl : CI/16, KH, KW, CO, 16] = =(K[j, i, 16*tb + tl, co]); }",
       {{"K", {3, 2, 48, 37}}}, 37, 16, 37},
      {"function (K[KH, KW, CI, CO]) -> (P) { P[tb, j, i, co, tl : CI/16, KH, KW, CO, 16] = =(K[j, i, 16*tb + tl, co]); }",
       {{"K", {3, 2, 48, 64}}}, 64, 16, 64},
  };
  // Two squares along the input's contiguous variable: a loop "for cK = (2 * cJ) while (cK <= ((2 * cJ) + 1))",
  // or "min(E, ((2 * cJ) + 1))" where E squares are not a whole number of pairs.
  auto pairs = [](const std::string& loops) {
    std::istringstream lines(loops);
    for (std::string line; std::getline(lines, line);) {
      const size_t lower = line.find(" = (2 * c");
      if (line.find("for c") == std::string::npos || lower == std::string::npos) continue;
      const size_t close = line.find(')', lower);
      const std::string outer = line.substr(lower + 8, close - lower - 8);  // cJ
      if (line.find("((2 * " + outer + ") + 1)", close) != std::string::npos) return true;
    }
    return false;
  };
  int squared = 0, whole_lines = 0, half_edges = 0;
  struct Core {
    int bits, fma_per_cycle;
  };
  for (Core core : {Core{512, 2}, Core{512, 1}, Core{256, 2}, Core{128, 2}}) {
    CompileOptions o;
    o.target.cpu.vector_bits = core.bits;
    o.target.cpu.fma_per_cycle = core.fma_per_cycle;
    o.target.cpu.vector_registers = core.bits == 512 ? 32 : 16;
    for (const Case& c : cases)
      for (DType t : {DType::f32, DType::i32, DType::f64, DType::i64}) {
        // scheduler.cpp transposition
        const int bytes = static_cast<int>(dtype_bytes(t)), wide = core.bits / (8 * bytes), narrow = std::min(256, core.bits) / (8 * bytes);
        const bool full_width = core.bits == 512 && core.fma_per_cycle == 2;
        const bool whole = full_width && c.input_last % wide == 0 && c.output_last % wide == 0;
        auto half_edge = [&](int64_t range) { return range >= wide && range % wide % narrow == 0; };
        const bool halves = full_width && !whole && half_edge(c.input_last) && half_edge(c.output_last) && c.row_stride * wide * bytes <= 4096;
        const int lanes = whole || halves ? wide : narrow;
        const std::string what = c.program + " " + to_string(t) + " " + std::to_string(core.bits) + " bits, " +
                                 std::to_string(core.fma_per_cycle) + " FMAs a cycle";
        Program p = parse_program(c.program);
        TensorMap in = inputs_for(c.shapes, t, 23);
        auto compiled = compile(p, types_of(in), o);
        const std::string loops = sched::print_loops(compiled->schedule());
        if (lanes < 4) {
          EXPECT_EQ(loops.find("squares"), std::string::npos) << what;
        } else {
          const std::string square = std::to_string(lanes) + "x" + std::to_string(lanes);
          EXPECT_NE(loops.find("transposed by " + square + " squares"), std::string::npos) << what << "\n" << loops;
          const char* element = t == DType::f32 ? "float" : t == DType::f64 ? "double" : t == DType::i32 ? "i32" : "i64";
          const std::string vector = "<" + std::to_string(lanes) + " x " + element + ">";
          EXPECT_NE(compiled->llvm_ir().find("shufflevector " + vector), std::string::npos) << what;
          ++squared;
          if (whole || halves) {
            EXPECT_TRUE(pairs(loops)) << what << "\n" << loops;
            ++whole_lines;
          }
          const std::string edges = "(" + std::to_string(narrow) + "x" + std::to_string(narrow) + " at the edges)";
          EXPECT_EQ(loops.find(edges) != std::string::npos, halves) << what << "\n" << loops;
          if (halves) {
            const std::string half_vector = "<" + std::to_string(narrow) + " x " + element + ">";
            EXPECT_NE(compiled->llvm_ir().find("shufflevector " + half_vector), std::string::npos) << what;
            ++half_edges;
          }
        }
        const TensorMap want = interpret(p, in), got = run(p, in, o);
        const std::string out = p.outputs.at(0);
        const Buffer &w = want.at(out), &g = got.at(out);
        ASSERT_EQ(g.shape(), w.shape()) << what;
        int64_t differ = 0;
        for (int64_t e = 0; e < w.size(); ++e) differ += g.get(e) != w.get(e);
        EXPECT_EQ(differ, 0) << what;
      }
  }
  // Every case: all types at 512 bits (both cores) and 256, 4-byte ones at 128.
  EXPECT_EQ(squared, 11 * (4 + 4 + 4 + 2));
  // 512-bit rows at 512 bits on the first core: the 64 x 48, 2x3x32x48 and 64-column panel cases, every
  // type; the 40 x 40 and 2x3x24x48 ones, in whole squares of 8-byte elements and with half edges of
  // 4-byte ones; 40 x 1032 in whole squares of 8-byte elements only (4-byte ones end in half a square, and
  // a square's input rows are 4 KiB apart: 256-bit rows).
  EXPECT_EQ(whole_lines, 3 * 4 + 2 * 4 + 2);
  EXPECT_EQ(half_edges, 2 * 2);
  // Not squares: a transposition whose input's last index is not a variable (every other column), one
  // whose input's contiguous variable is also in another of its indices (the vector of a square's row
  // would not be a run of the input), one whose output's last variable is in another of its indices.
  for (const char* text : {"function (I[M, N]) -> (O) { O[i, j : N/2, M] = =(I[j, 2*i]); }",
                           "function (I[M, N]) -> (O) { O[i, j : N, M - N] = =(I[i + j, i]); }",
                           "function (I[M, N]) -> (O) { O[i + j, j : M, N] = =(I[j, i]); }"}) {
    Program p = parse_program(text);
    TensorMap in = inputs_for({{"I", {64, 48}}}, DType::f32, 5);
    EXPECT_EQ(sched::print_loops(compile(p, types_of(in))->schedule()).find("squares"), std::string::npos) << text;
    expect_same(p, in, text);
  }
}

// In a small nest (every tensor under 2^18 elements), the loops around a vectorized loop are not unrolled
// (cpu.cpp KeepLoopsAroundVectorLoops). A conv weight gradient's sum of its slices, O[a, b, c, d] =
// +(S[s, a, b, c, d]) over two slices and 64 channels: the channel loop is vectorized (and may be unrolled
// into its vectors); the slice loop around it stays a loop, so the update function adds each channel's
// vector once, not once per slice (the unroller used to copy the whole vector loop for each slice: 45 ms
// of LLVM at the end of a gradient's compile). A large nest keeps the unrolling: a max pool's 2x2 window
// loops are unrolled around its channel loop, so the update function compares each channel 4 times. For
// every vector width, and against the interpreter.
TEST(CpuTest, LoopsAroundVectorLoopsAreNotUnrolledInSmallNests) {
  // The lanes times the number of vector instructions `op` (e.g. "fadd") in the update nest's function
  // (nest_1; nest_0 initializes the output).
  auto vector_lanes = [](const std::string& ir, const std::string& op) {
    const std::string update = function_of(ir, "nest_1");
    if (update.empty()) return int64_t{-1};
    int64_t total = 0;
    for (size_t at = update.find(" = " + op + " "); at != std::string::npos; at = update.find(" = " + op + " ", at + 1)) {
      const size_t line_end = update.find('\n', at), vec = update.find(" x float>", at);
      if (vec > line_end) continue;  // a scalar one
      const size_t open = update.rfind('<', vec);
      total += std::stoll(update.substr(open + 1, vec - open - 1));
    }
    return total;
  };
  const Program sum = parse_program("function (S[NS, A, B, C, D]) -> (O) { O[a, b, c, d : A, B, C, D] = +(S[s, a, b, c, d]); }");
  const Program pool = parse_program(
      "function (I[N, H, W, C]) -> (O) { O[n, y, x, c : N, H/2, W/2, C] = >(I[n, 2*y + j, 2*x + i, c]), j < 2, i < 2; }");
  // 2 x 3 x 3 x 128 x 64 points: more than the brief pipeline's 2^17 (NestsOfFewPointsGetTheBriefPipeline),
  // every tensor under 2^18 elements.
  const TensorMap sum_in = inputs_for({{"S", {2, 3, 3, 128, 64}}}, DType::f32, 23);
  const std::map<std::string, TensorType> pool_types{{"I", {DType::f32, {2, 64, 64, 64}}}};  // 2^19 elements
  for (int bits : {128, 256, 512}) {
    CompileOptions o;
    o.target.cpu.vector_bits = bits;
    const int64_t adds = vector_lanes(optimized_llvm_ir(sum, types_of(sum_in), o), "fadd");
    EXPECT_GT(adds, 0) << bits << "-bit vectors: the channel loop is not vectorized";
    EXPECT_LE(adds, 64) << bits << "-bit vectors: the slice loop was unrolled around the vector loop";
    expect_same(sum, sum_in, "the sum of slices with " + std::to_string(bits) + "-bit vectors", o);
    EXPECT_GT(vector_lanes(optimized_llvm_ir(pool, pool_types, o), "fcmp ogt"), 64)
        << bits << "-bit vectors: the large max pool's window loops were not unrolled";
  }
}

// A column sum (a bias gradient: 32 channels summed over every pixel of a batch) keeps its accumulators in
// registers across the rows: after the late unroller turns the vector loop over the channels into straight
// code, LICM promotes each vector of the output, loaded once before the rows and stored once after them.
// Without it every row loaded, added and stored all of them (the store of a row feeding the load of the
// next): 48 GB/s against 88-110 in the bench's bias gradient on this project's AVX2 machine.
TEST(CpuTest, ColumnSumsAccumulateInRegisters) {
  // In the update nest's function (nest_1; nest_0 initializes): the lanes of its vector stores of f32, and
  // how many of those stores store an fadd's result -- a sum that goes through memory in every iteration
  // of its loop (where the accumulators are registers, a store takes the value out of its loop: a phi).
  struct Stores {
    int64_t lanes = 0, of_fadd = 0;
  };
  auto stores = [](const std::string& ir) {
    Stores out;
    const std::string function = function_of(ir, "nest_1");
    if (function.empty()) return Stores{-1, -1};
    std::istringstream update(function);
    std::set<std::string> sums;
    for (std::string line; std::getline(update, line);) {
      std::istringstream words(line);
      std::string first, second, third;
      words >> first >> second >> third;
      if (second == "=" && third == "fadd") sums.insert(first);
      if (first != "store" || line.find(" x float> ") == std::string::npos) continue;
      const size_t open = line.find('<'), x = line.find(" x float> ");
      out.lanes += std::stoll(line.substr(open + 1, x - open - 1));
      const std::string value = line.substr(x + 10, line.find(',', x) - x - 10);
      out.of_fadd += sums.count(value) ? 1 : 0;
    }
    return out;
  };
  const Program bias = parse_program("function (D[N, H, W, C]) -> (B) { B[c : C] = +(D[n, y, x, c]); }");
  // 64 x 28 x 28 images of 32 channels (the bench's), and 8 of them (under 2^18 elements: a small nest).
  for (int64_t images : {64, 8}) {
    const TensorMap in = inputs_for({{"D", {images, 28, 28, 32}}}, DType::f32, 31);
    for (int bits : {256, 512}) {
      for (int threads : {1, 2}) {  // one sum, or a slice per thread summed after
        CompileOptions o;
        o.target.cpu.vector_bits = bits;
        o.target.threads = threads;
        const std::string what = std::to_string(images) + " images, " + std::to_string(bits) + "-bit vectors, " +
                                 std::to_string(threads) + " thread(s)";
        const Stores st = stores(optimized_llvm_ir(bias, types_of(in), o));
        EXPECT_GT(st.lanes, 0) << what << ": the channel loop is not vectorized";
        EXPECT_LE(st.lanes, 32) << what << ": each channel is stored more than once in the code";
        EXPECT_EQ(st.of_fadd, 0) << what << ": the sums go through memory";
        expect_same(bias, in, "the bias gradient of " + what, o);
      }
    }
  }
}

// A plain nest of at most 2^17 points (its domain's box, printed with its loops) gets the brief pipeline:
// the micro-kernels' clean-up passes and the loop vectorizer instead of O3, and machine code without Loop
// Strength Reduction. Its code is vector code all the same and agrees with the interpreter; a nest of more
// points gets O3 and keeps LSR, a micro-kernel gets its own pipeline and no LSR in any of its modules.
TEST(CpuTest, NestsOfFewPointsGetTheBriefPipeline) {
  // The text of nest k's module and the pipeline its nest function was given.
  auto nest_module = [](const std::string& ir, size_t k) { return module_of(ir, "nest_" + std::to_string(k)); };
  auto pipeline_of = [](const std::string& module, size_t k) {
    const std::string attrs = attributes_of(module, "nest_" + std::to_string(k));
    const size_t at = attrs.find("\"polytile-pipeline\"=\"");
    if (at == std::string::npos) return std::string("none");
    const size_t value = at + std::string("\"polytile-pipeline\"=\"").size();
    return attrs.substr(value, attrs.find('"', value) - value);
  };
  // Machine code without Loop Strength Reduction (cpu.cpp machine_code): the brief nests' and the micro-kernels'.
  auto without_lsr = [](const std::string& module, size_t k) {
    return attributes_of(module, "nest_" + std::to_string(k)).find("\"polytile-no-lsr\"") != std::string::npos;
  };
  auto vector_ops = [](const std::string& module) {
    int64_t n = 0;
    for (size_t at = module.find(" x float>"); at != std::string::npos; at = module.find(" x float>", at + 1)) ++n;
    return n;
  };
  struct Case {
    std::string what, tile;
    Shapes shapes;
    int64_t exact;      // points of the update's domain, counted by hand
    bool rectangular;   // its box is the domain itself
    std::string pipeline;
  };
  const std::string sum = "function (S[NS, A, B, C, D]) -> (O) { O[a, b, c, d : A, B, C, D] = +(S[s, a, b, c, d]); }";
  // Every other element from i on and before it (j from -(N - 1) / 2: a band of slope 1/2 through a box
  // twice its size; with j's coefficient 1, a row reduction would take it).
  const std::string band = "function (I[N]) -> (O) { O[i : N] = +(I[i + 2*j]); }";
  const std::vector<Case> cases = {
      {"a sum of slices", sum, {{"S", {2, 3, 3, 5, 64}}}, 5760, true, "brief"},
      {"a band", band, {{"I", {100}}}, 100 * 50, false, "brief"},
      {"a larger sum of slices", sum, {{"S", {2, 3, 3, 128, 64}}}, 147456, true, "full"},
      {"a larger band", band, {{"I", {600}}}, 600 * 300, false, "full"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Program p = parse_program(c.tile);
    const TensorMap in = inputs_for(c.shapes, DType::f32, 29);
    CompileOptions o;
    o.cache = false;
    auto compiled = compile(p, types_of(in), o);
    const auto& nests = compiled->schedule().nests;
    const std::string loops = sched::print_loops(compiled->schedule());
    size_t k = 0;
    while (k < nests.size() && nests[k].kind != sched::Nest::Kind::update) ++k;
    ASSERT_LT(k, nests.size()) << loops;
    ASSERT_FALSE(nests[k].microkernel.has_value()) << loops;
    if (c.rectangular) {
      EXPECT_EQ(nests[k].points, c.exact) << loops;
    }
    EXPECT_GE(nests[k].points, c.exact) << loops;
    EXPECT_EQ(nests[k].points <= (int64_t{1} << 17), c.pipeline == "brief") << loops;
    EXPECT_NE(loops.find("; " + std::to_string(nests[k].points) + " points in its box"), std::string::npos) << loops;
    const std::string module = nest_module(compiled->llvm_ir(), k);
    EXPECT_EQ(pipeline_of(module, k), c.pipeline) << module;
    EXPECT_EQ(without_lsr(module, k), c.pipeline == "brief") << module;
    EXPECT_GT(vector_ops(module), 0) << "not vectorized:\n" << module;
    expect_same(p, in, c.what, o);
  }
  // A micro-kernel keeps its own pipeline, whatever its points, and none of its functions gets LSR: the
  // nest's, nor part0's where its uniform blocks are a function of their own.
  const Program matmul = parse_program("function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }");
  auto compiled = compile(matmul, {{"A", {DType::f32, {64, 64}}}, {"B", {DType::f32, {64, 128}}}}, microkernels_forced(512));
  const auto& nests = compiled->schedule().nests;
  for (size_t k = 0; k < nests.size(); ++k)
    if (nests[k].microkernel) {
      EXPECT_EQ(nests[k].points, -1);
      const std::string module = nest_module(compiled->llvm_ir(), k), name = "nest_" + std::to_string(k);
      EXPECT_EQ(pipeline_of(module, k), "microkernel");
      EXPECT_TRUE(without_lsr(module, k)) << module;
      if (module.find("call void @" + name + ".part0(") != std::string::npos) {
        const std::string uniform = module_of(compiled->llvm_ir(), name + ".part0");
        ASSERT_FALSE(uniform.empty());
        EXPECT_NE(attributes_of(uniform, name + ".part0").find("\"polytile-no-lsr\""), std::string::npos) << uniform;
      }
    }
}

// Nests are compiled by worker threads while the scheduler goes on (cpu.cpp lower_and_emit): when a
// later statement is a user error, the first statement's micro-kernel nest may already be compiling. The
// error reaches the caller with its message, nothing hangs, and compiling again afterwards works.
TEST(CpuTest, UserErrorWhileEarlierNestsCompileReachesTheCaller) {
  Program p = parse_program(R"(function (A[M, K], B[K, N]) -> (C, D) {
    C[m, n : M, N] = +(A[m, k] * B[k, n]);
    D[i : M] = =(C[i, j]);
  })");
  std::map<std::string, TensorType> inputs{{"A", {DType::f32, {64, 64}}}, {"B", {DType::f32, {64, 128}}}};
  CompileOptions o = microkernels_forced(512);
  o.cache = false;
  for (int threads : {1, 2, 4}) {
    o.threads = threads;
    try {
      compile(p, inputs, o);
      ADD_FAILURE() << "an assign that writes twice was compiled";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("assign contraction D can write an element more than once"), std::string::npos)
          << e.what();
    }
  }
  Program fine = parse_program("function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }");
  expect_same(fine, inputs_for({{"A", {64, 64}}, {"B", {64, 128}}}, DType::f32, 81), "matmul after the error", o);
}

// The micro-kernel's block columns fit the vector variable's extent: 96 and 80 output channels of f32 in
// 512-bit vectors (16 lanes) run as columns of 6 or 3 and of 5 chunks, with no lanes past the channels,
// instead of a column of 4 and a partly empty one; 64 and 256 keep columns of 4. Against the interpreter.
TEST(CpuTest, MicrokernelColumnsFitTheVectorExtent) {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
  CompileOptions o = microkernels_forced(512);
  for (int64_t channels : {96, 80, 64, 256}) {
    TensorMap in = inputs_for({{"I", {1, 12, 12, 8}}, {"K", {3, 3, 8, channels}}}, DType::f32, 71);
    auto compiled = compile(conv, types_of(in), o);
    const sched::Nest& nest = compiled->schedule().nests.back();
    ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
    const int64_t column = int64_t{nest.microkernel->chunks} * nest.microkernel->lanes;
    EXPECT_EQ(channels % column, 0) << channels << " channels in columns of " << column;
    if (channels % 64 == 0) {
      EXPECT_EQ(nest.microkernel->chunks, 4) << channels << " channels";
    }
    expect_same(conv, in, std::to_string(channels) + " output channels", o);
  }
  // AVX2's 16 registers (8 f32 lanes): the default column is 2 chunks (up to 6 rows of accumulators, the
  // 2 vector operands and the broadcast fit without spilling). Where 4 chunks fill the channels too, a
  // padded conv takes them (2 rows: fewer predicated border blocks, fewer passes over the image), as it
  // takes 3 or 4 for 96 channels; a matmul's 6 x 2 ties 2 x 4 in the model and stays.
  CompileOptions avx2 = microkernels_forced(256, 16);
  for (int64_t channels : {64, 256, 96}) {
    TensorMap in = inputs_for({{"I", {1, 12, 12, 8}}, {"K", {3, 3, 8, channels}}}, DType::f32, 72);
    auto compiled = compile(conv, types_of(in), avx2);
    const sched::Nest& nest = compiled->schedule().nests.back();
    ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
    const sched::Microkernel& mk = *nest.microkernel;
    EXPECT_GT(mk.chunks, 2) << channels << " channels";
    EXPECT_EQ(channels % (int64_t{mk.chunks} * mk.lanes), 0) << channels << " channels, " << mk.chunks << " chunks";
    EXPECT_LE(mk.rows * mk.chunks + mk.chunks + 1, 16) << mk.rows << "x" << mk.chunks;
    expect_same(conv, in, std::to_string(channels) + " output channels, 16 registers", avx2);
  }
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }");
  TensorMap in = inputs_for({{"A", {48, 32}}, {"B", {32, 64}}}, DType::f32, 74);
  auto compiled = compile(mm, types_of(in), avx2);
  const sched::Nest& nest = compiled->schedule().nests.back();
  ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
  EXPECT_EQ(nest.microkernel->rows, 6);
  EXPECT_EQ(nest.microkernel->chunks, 2);
  expect_same(mm, in, "matmul, 16 registers", avx2);
}

// Rows in distant pages (a conv's images, each past L1) cost 4% of the model's efficiency a row: with
// AVX2's 16 registers a padded conv's 2 rows of 4 chunks then go over the batch, where no block has a
// border, rather than over x with predicated border blocks (at 0.85 whatever the rows, as before, x won
// here; the batch's 2 x 4 measured 3-10% faster on Zen 3). Against the interpreter.
TEST(CpuTest, TwoDistantRowsBlockTheBatch) {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
  CompileOptions o = microkernels_forced(256, 16);
  TensorMap in = inputs_for({{"I", {8, 20, 20, 8}}, {"K", {3, 3, 8, 64}}}, DType::f32, 75);  // images 100 KiB apart
  auto compiled = compile(conv, types_of(in), o);
  const sched::Nest& nest = compiled->schedule().nests.back();
  ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
  const sched::Microkernel& mk = *nest.microkernel;
  EXPECT_EQ(nest.variables.at(mk.block), "n") << sched::print_loops(compiled->schedule());
  EXPECT_EQ(mk.rows, 2);
  EXPECT_EQ(mk.chunks, 4);
  expect_same(conv, in, "conv over a batch of 8", o);
}

// The host target's register file goes with its vectors: AVX-512's 32 zmm registers, else AVX2's (or
// SSE's) 16 -- planning AVX2 micro-kernels for 32 registers spilled their accumulators (half speed).
TEST(CpuTest, HostTargetCountsItsVectorRegistersAndReadsItsL3) {
  const sched::Target host = host_target();
  EXPECT_EQ(host.cpu.vector_registers, host.cpu.vector_bits == 512 ? 32 : 16) << host.cpu.vector_bits << "-bit vectors";
  EXPECT_EQ(host.cpu.vector_bits == 512, static_cast<bool>(__builtin_cpu_supports("avx512f")));
  // The L3 is the one Linux's sysfs names where it names one ("32768K"), not glibc's sum for the package.
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int l = 0;
    long kib = 0;
    char unit = 0;
    if (level >> l && l == 3 && size >> kib >> unit && unit == 'K') {
      EXPECT_EQ(host.cpu.l3_bytes, kib * 1024) << dir;
    }
  }
  EXPECT_GE(host.cpu.l3_bytes, host.cpu.l2_bytes);
}

// A 1x1 conv's kernel variables take one value each, so they push no row of a block past the image's
// border: its blocks are planned as a matmul's (6 rows of 2 chunks with 16 registers over 56 columns),
// not as a padded conv's border blocks (4 rows, which leave 8 accumulators). Against the interpreter.
TEST(CpuTest, OneByOneConvsBlockTheirRowsAsAMatmulDoes) {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]); }");
  CompileOptions o = microkernels_forced(256, 16);
  TensorMap in = inputs_for({{"I", {1, 2, 56, 16}}, {"K", {1, 1, 16, 64}}}, DType::f32, 73);
  auto compiled = compile(conv, types_of(in), o);
  const sched::Nest& nest = compiled->schedule().nests.back();
  ASSERT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
  EXPECT_EQ(nest.microkernel->rows, 6) << sched::print_loops(compiled->schedule());
  EXPECT_EQ(nest.microkernel->chunks, 2);
  expect_same(conv, in, "1x1 conv", o);
}

// A long reduction whose output overflows half of each thread's L2 (a large matmul) sizes its reduction
// tiles for L2 (plan.h long_tiles): each tile reloads the accumulators from beyond L2, so fewer, longer
// tiles. The same matmul with a short reduction keeps the L1-sized tiles.
TEST(CpuTest, LongReductionsOverflowingL2TakeL2SizedTiles) {
  Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  CompileOptions o = microkernels_forced(256);
  o.target.cpu.l1_bytes = 4096;
  o.target.cpu.l2_bytes = 64 * 1024;  // the 112x112 f64 output (98 KiB) overflows three quarters of two threads' L2
  auto tile_of = [&](int64_t k) {  // the micro-kernel's reduction tile: its Fma loop's extent
    TensorMap in = inputs_for({{"A", {112, k}}, {"B", {k, 112}}}, DType::f64, 61);
    auto compiled = compile(mm, types_of(in), o);
    const sched::Nest& nest = compiled->schedule().nests.back();
    EXPECT_TRUE(nest.microkernel.has_value()) << sched::print_loops(compiled->schedule());
    expect_same(mm, in, "matmul with a reduction of " + std::to_string(k), o);
    return sched::print_loops(compiled->schedule());
  };
  const std::string long_reduction = tile_of(920), short_reduction = tile_of(697);
  // A block (6 rows of A, 16 columns of B in f64: 176 bytes per value of k) over a tile within 3/4 of L1,
  // 3072 bytes: 17 values of k (already balanced); within three eighths of L2, 24576 bytes: 139, so 920 in
  // 7 tiles, balanced to 132.
  EXPECT_NE(long_reduction.find("c4 <= min(919, ((132 * c2) + 131))"), std::string::npos) << long_reduction;
  EXPECT_NE(short_reduction.find("c3 <= ((17 * c1) + 16)"), std::string::npos) << short_reduction;
  // Several short reduction variables (a window's), 48 x 48 = 2304 points, keep L1 tiles: the accumulators
  // they reload are a few blocks' (a 3x3 256->256 conv's forward and data gradient ran 6% faster on one
  // thread of a Cascade Lake with L1 tiles than with L2 tiles). l's 48 values in tiles of 16 (17 fit), not 24.
  const Program window = parse_program(
      "function (A[M, K, L], B[K, L, N]) -> (C) { C[i, j : M, N] = +(A[i, k, l] * B[k, l, j]); }");
  TensorMap in = inputs_for({{"A", {112, 48, 48}}, {"B", {48, 48, 112}}}, DType::f64, 62);
  auto compiled = compile(window, types_of(in), o);
  const std::string loops = sched::print_loops(compiled->schedule());
  EXPECT_NE(loops.find("((16 * c"), std::string::npos) << loops;
  EXPECT_EQ(loops.find("((24 * c"), std::string::npos) << loops;
  expect_same(window, in, "a window of two reduction variables", o);
}

// Elementwise consumers fused into micro-kernel blocks (epilogues): bias + activation after a padded conv
// (borders: predicated blocks; unstored elements: the remaining nest), broadcasts along and across the
// vector lanes, libm functions lane by lane, integer and boolean results, and a consumer that must not be
// fused (the contraction's output is also a program output).
TEST(CpuTest, EpiloguesMatchTheInterpreter) {
  struct Case {
    const char* text;
    Shapes shapes;
    bool fused;
  };
  const Case cases[] = {
      {"function (I[N, H, W, C], K[KH, KW, C, CO], B[CO]) -> (R) {"
       "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]); R = relu(O + B); }",
       {{"I", {2, 9, 7, 5}}, {"K", {3, 3, 5, 21}}, {"B", {21}}}, true},
      {"function (I[N, H, W, C], K[KH, KW, C, CO]) -> (R) {"
       "  O[n, y, x, co : N, H/2, W/2, CO] = +(I[n, 2*y + j, 2*x + i, c] * K[j, i, c, co]); R = tanh(O) * 0.5 + exp(O / 8); }",
       {{"I", {2, 11, 10, 3}}, {"K", {2, 2, 3, 18}}}, true},
      {"function (A[M, K], B[K, N], S[M, 1]) -> (E, F) {"
       "  C[i, j : M, N] = +(A[i, k] * B[k, j]); E = C * S > 0.25; D[i, j : M, N] = +(A[i, k] * B[k, j]); F = cast(D * 7, i32); }",
       {{"A", {23, 17}}, {"B", {17, 40}}, {"S", {23, 1}}}, true},
      // A long reduction: several reduction tiles, the consumer at the last one.
      {"function (A[M, K], B[K, N], S[N]) -> (E) { C[i, j : M, N] = +(A[i, k] * B[k, j]); E = sigmoid(C - S); }",
       {{"A", {9, 700}}, {"B", {700, 40}}, {"S", {40}}}, true},
      {"function (A[M, K], B[K, N]) -> (C, E) { C[i, j : M, N] = +(A[i, k] * B[k, j]); E = C * 2; }",
       {{"A", {23, 17}}, {"B", {17, 40}}}, false},
  };
  int epilogues = 0;
  for (int bits : {512, 256, 128}) {
    CompileOptions o = microkernels_forced(bits);
    for (const auto& cs : cases) {
      Program p = parse_program(cs.text);
      for (DType t : {DType::f32, DType::f64}) {
        TensorMap in = inputs_for(cs.shapes, t, 51);
        expect_same(p, in, cs.text, o);
        std::map<std::string, TensorType> types = types_of(in);
        int here = 0;
        for (const auto& nest : compile(p, types, o)->schedule().nests) here += nest.epilogue.has_value();
        EXPECT_EQ(here > 0, cs.fused) << cs.text;
        epilogues += here;
      }
    }
  }
  EXPECT_EQ(epilogues, 3 * 2 * 5);
}

// Cheap elementwise producers of a contraction's inputs are evaluated where the inputs are read (no
// nest, no buffer): in broadcast and vector operands of micro-kernels (with predicated borders) and in
// plain loop nests; producers read twice, expensive ones and program outputs stay materialized.
TEST(CpuTest, InlinedProducersMatchTheInterpreter) {
  struct Case {
    const char* text;
    Shapes shapes;
    int inlined;
  };
  const Case cases[] = {
      {"function (X[N, H, W, C], K[KH, KW, C, CO]) -> (O) { I = relu(X - 0.25);"
       "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]); }",
       {{"X", {2, 9, 7, 5}}, {"K", {3, 3, 5, 21}}}, 1},
      {"function (A[M, K], B[K, N], S[N]) -> (C) { P = A * 2 + 1; Q = max(abs(B) - 0.5, S);"
       "  C[i, j : M, N] = +(P[i, k] * Q[k, j]); }",
       {{"A", {23, 17}}, {"B", {17, 40}}, {"S", {40}}}, 2},
      {"function (A[M, K], B[K, N]) -> (C, D) { P = A * 2; C[i, j : M, N] = +(P[i, k] * B[k, j]);"
       "  D[i, j : M, N] = +(P[i, k] * B[k, j]); }",
       {{"A", {23, 17}}, {"B", {17, 40}}}, 0},
      {"function (A[M, K], B[K, N]) -> (C, P) { P = exp(A); C[i, j : M, N] = +(P[i, k] * B[k, j]); }",
       {{"A", {23, 17}}, {"B", {17, 40}}}, 0},
      // Two dense layers: H is the first one's epilogue (its contraction output stays scratch), so the
      // second must read H, not recompute it from C.
      {"function (A[M, K], B[K, N], Bias[N], W[N, P]) -> (D) { C[i, j : M, N] = +(A[i, k] * B[k, j]);"
       "  H = relu(C + Bias); D[i, p : M, P] = +(H[i, j] * W[j, p]); }",
       {{"A", {30, 20}}, {"B", {20, 48}}, {"Bias", {48}}, {"W", {48, 33}}}, 0},
  };
  for (bool microkernel : {true, false}) {
    for (int bits : {512, 128}) {
      CompileOptions o;
      o.target.cpu.vector_bits = bits;
      o.target.cpu.microkernel_min_points = microkernel ? 0 : INT64_MAX;
      o.threads = 2;
      for (const auto& cs : cases) {
        Program p = parse_program(cs.text);
        for (DType t : {DType::f32, DType::f64}) {
          TensorMap in = inputs_for(cs.shapes, t, 71);
          expect_same(p, in, cs.text, o);
          std::map<std::string, TensorType> types = types_of(in);
          int inlined = 0, elementwise = 0;
          for (const auto& nest : compile(p, types, o)->schedule().nests) {
            inlined += static_cast<int>(nest.inlined.size());
            elementwise += nest.kind == sched::Nest::Kind::elementwise;
          }
          EXPECT_EQ(inlined, cs.inlined) << cs.text;
          if (cs.inlined > 0) {
            EXPECT_EQ(elementwise, 0) << cs.text;
          }
        }
      }
    }
  }
}

// Vectorized row reductions: sums, maxima and minima over a contiguous reduction variable (softmax rows,
// dot products, matrix-vector products, a scalar total) with partial last groups, inlined producers,
// several accumulators, and NaN and infinities propagating exactly as in the interpreter.
TEST(CpuTest, RowReductionsMatchTheInterpreter) {
  struct Case {
    const char* text;
    Shapes shapes;
  };
  const Case cases[] = {
      {"function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); O = E / S; }",
       {{"X", {7, 201}}}},
      {"function (A[M, K], x[K]) -> (y) { y[i : M] = +(A[i, k] * x[k]); }", {{"A", {5, 77}}, {"x", {77}}}},
      {"function (A[M, K], B[M, K]) -> (d) { d[i : M] = +(A[i, k] * B[i, k]); }", {{"A", {3, 150}}, {"B", {3, 150}}}},
      {"function (X[N, C]) -> (L, H) { L[i : N] = <(X[i, j]); Y = abs(X) * 2; H[] = >(Y[i, j]); }", {{"X", {9, 65}}}},
      {"function (X[B, N, C]) -> (O) { O[b, c : B, C] = +(X[b, n, c]); }", {{"X", {2, 40, 70}}}},
      // every value below -1: a lane past the row's end must add the identity (-inf), not 0
      {"function (X[N, C]) -> (M) { Y = -abs(X) - 1; M[i : N] = >(Y[i, j]); }", {{"X", {4, 37}}}},
      // rows of a whole number of steps at every width (no masked step) and, at 512 bits, of one
      // unmasked step followed by a masked one
      {"function (X[N, C]) -> (M, S) { M[i : N] = >(X[i, j]); S[i : N] = +(X[i, j]); }", {{"X", {3, 128}}}},
      {"function (X[N, C]) -> (M, S) { M[i : N] = >(X[i, j]); S[i : N] = +(X[i, j]); }", {{"X", {2, 100}}}},
  };
  int reductions = 0;
  for (int bits : {512, 256, 128}) {
    CompileOptions o = microkernels_forced(bits);
    for (const auto& cs : cases) {
      Program p = parse_program(cs.text);
      for (DType t : {DType::f32, DType::f64}) {
        TensorMap in = inputs_for(cs.shapes, t, 81);
        expect_same(p, in, cs.text, o);
        for (auto& [name, b] : in) {  // non-finite values in the middle and at the end of rows
          b.set(b.size() / 2, std::numeric_limits<double>::quiet_NaN());
          b.set(b.size() - 1, std::numeric_limits<double>::infinity());
          b.set(1, -std::numeric_limits<double>::infinity());
        }
        expect_same(p, in, std::string("with NaN and inf: ") + cs.text, o);
        std::map<std::string, TensorType> types = types_of(in);
        for (const auto& nest : compile(p, types, o)->schedule().nests) reductions += nest.reduction.has_value();
      }
    }
  }
  // softmax: 2, matvec, dot, min, max, negative max: 1 each; the sum over a middle axis reads n with a
  // stride: 0; the two max-and-sum cases: 2 each.
  EXPECT_EQ(reductions, 3 * 2 * 11);
}

// Rows of one vector to two (16-31 f32 with AVX-512) run as row reductions too, a full vector and a
// masked one: an NCHW global average pool and maximum (28 columns a row, the other reduction variable the
// image's rows), sums over 16 and 17 columns; rows under one vector (15) stay plain nests, unless other
// reduction variables give each output two vectors' worth of points (an NCHW global pool over 7 x 7, 49
// points; not over 3 x 3, 9). NaN and inf at the start of every other row: a lane past a row's end would
// reach the next row's.
TEST(CpuTest, RowsShorterThanTwoVectorsRunAsRowReductions) {
  struct Case {
    const char* text;
    Shapes shapes;
    bool row_reduction;
  };
  const Case cases[] = {
      {"function (X[N, C, H, W]) -> (G) { G[n, c : N, C] = +(X[n, c, y, x]); }", {{"X", {2, 5, 28, 28}}}, true},
      {"function (X[N, C, H, W]) -> (G) { G[n, c : N, C] = >(X[n, c, y, x]); }", {{"X", {2, 5, 28, 28}}}, true},
      {"function (X[N, C]) -> (S) { S[i : N] = +(X[i, j]); }", {{"X", {300, 16}}}, true},
      {"function (X[N, C]) -> (S) { S[i : N] = +(X[i, j]); }", {{"X", {300, 17}}}, true},
      {"function (X[N, C]) -> (S) { S[i : N] = +(X[i, j]); }", {{"X", {300, 15}}}, false},
      {"function (X[N, C, H, W]) -> (G) { G[n, c : N, C] = +(X[n, c, y, x]); }", {{"X", {4, 64, 7, 7}}}, true},
      {"function (X[N, C, H, W]) -> (G) { G[n, c : N, C] = >(X[n, c, y, x]); }", {{"X", {4, 64, 7, 7}}}, true},
      {"function (X[N, C, H, W]) -> (G) { G[n, c : N, C] = +(X[n, c, y, x]); }", {{"X", {4, 64, 3, 3}}}, false},
  };
  CompileOptions o = microkernels_forced(512);
  for (const auto& cs : cases) {
    Program p = parse_program(cs.text);
    TensorMap in = inputs_for(cs.shapes, DType::f32, 83);
    const int64_t row = cs.shapes.at("X").back();
    for (int64_t at = 0; at < in.at("X").size(); at += 2 * row) {
      in.at("X").set(at, std::numeric_limits<double>::quiet_NaN());
      if (at + row < in.at("X").size()) in.at("X").set(at + row, -std::numeric_limits<double>::infinity());
    }
    int rows = 0;
    for (const auto& nest : compile(p, types_of(in), o)->schedule().nests) rows += nest.reduction.has_value();
    EXPECT_EQ(rows, cs.row_reduction ? 1 : 0) << cs.text << " " << row << " columns";
    expect_same(p, in, std::string(cs.text) + ", " + std::to_string(row) + " columns", o);
  }
}

// Integer row reductions run as vector row reductions too (wrapping sums and products and maxima are
// exact in any order): i32 and i64 sums, maxima, minima and dot products (wrapping past 2^31), a ragged
// cumulative sum, and the count of a row's true values (bools summed into an i32). Before, they ran as
// plain nests over the columns with the rows innermost, a row a stride apart: an i32 row sum of 8192 x
// 1024 took 27 ms, 0.58 now.
TEST(CpuTest, IntegerRowReductionsRunAsRowReductions) {
  const char* texts[] = {
      "function (X[N, C]) -> (S) { S[i : N] = +(X[i, j]); }",
      "function (X[N, C]) -> (S) { S[i : N] = >(X[i, j]); }",
      "function (X[N, C]) -> (S) { S[i : N] = <(X[i, j]); }",
      "function (X[N, C], Y[N, C]) -> (S) { S[i : N] = +(X[i, j] * Y[i, j]); }",
      "function (X[M, N]) -> (O) { O[r, i : M, N] = +(X[r, k]), i - k < N; }",
      "function (X[N, C]) -> (S) { B = X > 0; S[i : N] = +(B[i, j]); }",
  };
  CompileOptions o = microkernels_forced(512);
  for (const char* text : texts) {
    const Program p = parse_program(text);
    for (DType t : {DType::i32, DType::i64}) {
      for (int64_t cols : {16, 37, 150}) {
        TensorMap in;
        for (const char* name : {"X", "Y"}) {
          if (std::string(text).find(std::string(name) + "[") == std::string::npos) continue;
          Buffer b(t, {11, cols});
          // Large values: the dot products wrap.
          for (int64_t e = 0; e < b.size(); ++e) b.set(e, static_cast<double>((e * 7919 + 13) % 200003) * (e % 3 == 0 ? -1 : 1) * (t == DType::i32 ? 1 : 40000));
          in[name] = b;
        }
        const std::string what = std::string(text) + " in " + to_string(t) + ", " + std::to_string(cols) + " columns";
        int rows = 0;
        for (const auto& nest : compile(p, types_of(in), o)->schedule().nests) rows += nest.reduction.has_value();
        EXPECT_EQ(rows, 1) << what;  // the count: an i32 of bools whatever X's type
        const TensorMap want = interpret(p, in), got = run(p, in, o);
        for (const auto& out : p.outputs) {
          ASSERT_EQ(got.at(out).dtype(), want.at(out).dtype()) << what;
          for (int64_t e = 0; e < want.at(out).size(); ++e)
            ASSERT_EQ(got.at(out).get(e), want.at(out).get(e)) << what << " " << out << "[" << e << "]";
        }
      }
    }
  }
}

// Conditional terms in row reductions: an argmax (the least index where a row holds its maximum, ties
// and NaN included: NaN equals nothing) with the count of hits that cond-miss lowering adds, the largest
// index of the maxima and a sum over the elements equal to another tensor's, the comparands f32, f64 or i32 and the values i32, i64 or f64. Before, an argmax of
// 8192 x 1024 ran as a plain nest with the rows innermost: 56 ms, now 1.15.
TEST(CpuTest, ConditionalRowReductionsMatchTheInterpreter) {
  struct Case {
    const char* text;
    DType compared, value;
  };
  const Case cases[] = {
      {"function (X[N, C], Idx[C]) -> (A) { M[n : N] = >(X[n, c]); A[n : N] = <(X[n, c] == M[n] ? Idx[c]); }", DType::f32, DType::i32},
      {"function (X[N, C], Idx[C]) -> (A) { M[n : N] = >(X[n, c]); A[n : N] = <(X[n, c] == M[n] ? Idx[c]); }", DType::f64, DType::i64},
      {"function (X[N, C], Idx[C]) -> (A) { M[n : N] = >(X[n, c]); A[n : N] = >(X[n, c] == M[n] ? Idx[c]); }", DType::i32, DType::f64},
      {"function (X[N, C], Idx[C], Y[N, C]) -> (A) { A[n : N] = +(X[n, c] == Y[n, c] ? Idx[c]); }", DType::f32, DType::f64},
  };
  CompileOptions o = microkernels_forced(512);
  for (const auto& cs : cases) {
    const Program p = parse_program(cs.text);
    for (int64_t cols : {16, 45, 300}) {
      TensorMap in;
      Buffer x(cs.compared, {9, cols}), y(cs.compared, {9, cols}), idx(cs.value, {cols});
      for (int64_t e = 0; e < x.size(); ++e) {
        x.set(e, static_cast<double>((e * 37) % 11));  // ties: a row's maximum recurs
        y.set(e, static_cast<double>((e * 53) % 7));
      }
      if (cs.compared != DType::i32) x.set(cols + 3, std::numeric_limits<double>::quiet_NaN());
      for (int64_t j = 0; j < cols; ++j) idx.set(j, static_cast<double>((j * 29) % cols) - 5);
      in["X"] = x;
      in["Idx"] = idx;
      if (std::string(cs.text).find("Y[") != std::string::npos) in["Y"] = y;
      const std::string what = std::string(cs.text) + ", " + to_string(cs.compared) + " compared, " + std::to_string(cols) + " columns";
      int rows = 0;
      for (const auto& nest : compile(p, types_of(in), o)->schedule().nests)
        rows += nest.reduction.has_value() && nest.contraction.combination == CombinationOp::cond;
      EXPECT_GE(rows, 1) << what;
      const Buffer want = interpret(p, in).at("A"), got = run(p, in, o).at("A");
      ASSERT_EQ(got.dtype(), want.dtype()) << what;
      for (int64_t e = 0; e < want.size(); ++e) {
        if (std::isnan(want.get(e))) {
          EXPECT_TRUE(std::isnan(got.get(e))) << what << " A[" << e << "]";
          continue;
        }
        EXPECT_EQ(got.get(e), want.get(e)) << what << " A[" << e << "]";
      }
    }
  }
}

// Row reductions whose reduction variable's range follows the other variables mask each step's lanes by
// the accesses and constraints at that point, and run the steps whose lanes all lie in that range
// unmasked: cumulative sums along rows (k <= i, and k >= i), a max over a window that the row's end cuts short, and
// an NCHW depthwise conv's weight gradient (x + i - 1 in the image; its micro-kernel would hold i's 3
// values in a vector of lanes: the row reduction takes it first). NaN and inf stand where a wrong lane
// would read them (the columns just outside a row's range, which in NCHW are the neighbouring row's).
TEST(CpuTest, RaggedRowReductionsMaskTheirLanesAtEachPoint) {
  struct Case {
    const char* text;
    Shapes shapes;
  };
  const Case cases[] = {
      {"function (X[M, N]) -> (O) { O[r, i : M, N] = +(X[r, k]), i - k < N; }", {{"X", {3, 150}}}},
      // from the end (k >= i): steps below the interval's start whose last value is in it are masked too
      {"function (X[M, N]) -> (O) { O[r, i : M, N] = +(X[r, k]), k - i < N; }", {{"X", {3, 150}}}},
      {"function (X[M, N]) -> (O) { O[r, i : M, N] = >(X[r, i + k]), k < 40; }", {{"X", {3, 101}}}},
      {"function (I[N, C, H, W], DO[N, C, H, W]) -> (DK) {"
       "  DK[c, j, i : C, 3, 3] = +(I[n, c, j + y - 1, i + x - 1] * DO[n, c, y, x]); }",
       {{"I", {2, 3, 5, 37}}, {"DO", {2, 3, 5, 37}}}},
  };
  int ragged = 0;
  for (int bits : {512, 256, 128}) {
    const CompileOptions o = microkernels_forced(bits);
    for (const auto& cs : cases) {
      Program p = parse_program(cs.text);
      for (DType t : {DType::f32, DType::f64}) {
        const std::string what = std::string(cs.text) + ", " + std::to_string(bits) + " bits, " + to_string(t);
        TensorMap in = inputs_for(cs.shapes, t, 83);
        expect_same(p, in, what, o);
        for (auto& [name, b] : in) {  // a row's first and last columns
          const int64_t width = b.shape().back();
          for (int64_t row = 1; row < b.size() / width; row += 2) {
            b.set(row * width - 1, std::numeric_limits<double>::quiet_NaN());
            b.set(row * width, -std::numeric_limits<double>::infinity());
          }
        }
        expect_same(p, in, "with NaN and inf: " + what, o);
        // The weight gradient's micro-kernel is thin (3 values of 12 lanes or more) at 512 bits in f32 only.
        const bool row = cs.shapes.count("DO") == 0 || bits / (8 * static_cast<int>(dtype_bytes(t))) >= 12;
        bool found = false;
        for (const auto& nest : compile(p, types_of(in), o)->schedule().nests) found |= nest.reduction && nest.reduction->ragged;
        EXPECT_EQ(found, row) << what;
        ragged += found;
      }
    }
  }
  EXPECT_EQ(ragged, 3 * 2 * 3 + 1);
}

// Row reductions whose rows share what they read (RowReduction::hoisted): an NCHW depthwise conv's weight
// gradient, whose 9 rows DK[c, j, i] of a channel read the same planes of I and DO, runs its other
// reduction variables outside j and i, in tiles whose reads fit half of L1, and sums each row into the
// output once a tile (the lanes in a tree). L1 sizes that give tiles of one image, of two of five (a partial
// last tile) and of rows of an image (n and y moved out), on one and two threads (where the threads split
// the rows, y_slice leads), a sum and a maximum; and rows of a batched product O[a, b] whose X[a, k, r]
// every b shares, in tiles of k (3 of 13: a partial last tile). Each against the interpreter, also with
// NaN and inf in the columns just outside a row, which a wrong lane or a tile's store into a wrong row
// would carry into the output; at an L1 of 1 MiB nothing is tiled.
TEST(CpuTest, RowReductionsTileTheirReductionWhereRowsShareTheirReads) {
  struct Case {
    const char* text;
    Shapes shapes;
    std::vector<int64_t> l1;
  };
  const Shapes image{{"I", {5, 3, 9, 40}}, {"DO", {5, 3, 9, 40}}};
  const Case cases[] = {
      {"function (I[N, C, H, W], DO[N, C, H, W]) -> (DK) { DK[c, j, i : C, 3, 3] = +(I[n, c, j + y - 1, i + x - 1] * DO[n, c, y, x]); }",
       image, {2048, 4096, 8192, 16384, 1 << 20}},
      {"function (I[N, C, H, W], DO[N, C, H, W]) -> (DK) { DK[c, j, i : C, 3, 3] = >(I[n, c, j + y - 1, i + x - 1] * DO[n, c, y, x]); }",
       image, {2048, 4096, 8192, 16384, 1 << 20}},
      {"function (X[A, K, R], Y[A, B, K, R]) -> (O) { O[a, b : A, B] = +(X[a, k, r] * Y[a, b, k, r]); }",
       {{"X", {2, 13, 40}}, {"Y", {2, 3, 13, 40}}}, {4096, 1 << 20}},
  };
  std::set<std::string> tilings;
  for (const Case& cs : cases) {
    const Program p = parse_program(cs.text);
    for (int threads : {1, 2}) {
      for (int64_t l1 : cs.l1) {
        CompileOptions o = microkernels_forced(512);
        o.threads = threads;
        o.target.cpu.l1_bytes = l1;
        const std::string what = std::string(cs.text) + ", L1 " + std::to_string(l1) + ", " + std::to_string(threads) + " threads";
        TensorMap in = inputs_for(cs.shapes, DType::f32, 91);
        expect_same(p, in, what, o);
        for (auto& [name, b] : in) {
          const int64_t width = b.shape().back();
          for (int64_t row = 1; row < b.size() / width; row += 3) {
            b.set(row * width - 1, std::numeric_limits<double>::quiet_NaN());
            b.set(row * width, -std::numeric_limits<double>::infinity());
          }
        }
        expect_same(p, in, "with NaN and inf: " + what, o);
        auto compiled = compile(p, types_of(in), o);
        const std::string loops = sched::print_loops(compiled->schedule());
        const sched::Nest* rows = nullptr;
        for (const auto& nest : compiled->schedule().nests)
          if (nest.reduction) rows = &nest;
        ASSERT_NE(rows, nullptr) << what << "\n" << loops;
        const size_t at = loops.find("reduction tiles of ");
        EXPECT_EQ(rows->reduction->hoisted > 0, at != std::string::npos) << what;
        EXPECT_EQ(rows->reduction->hoisted > 0, l1 < (1 << 20)) << what << "\n" << loops;
        if (at != std::string::npos) tilings.insert(loops.substr(at, loops.find(')', at) - at + 1));
      }
    }
  }
  for (const char* tiling : {"reduction tiles of n (1)", "reduction tiles of n (2)", "reduction tiles of n, y (2)", "reduction tiles of k (3)"})
    EXPECT_TRUE(tilings.count(tiling)) << tiling << " not among the tilings made";
}

// Panels of a micro-kernel whose rows each read their own vector operand (an NCHW depthwise conv: blocks
// of 8 channels, each row its channel's plane; the weights the broadcast operand): nothing is shared along
// a block column, so the column blocks (2 of 32 lanes for 56 columns) run inside the images and rows, and
// a row of a plane serves both while it is in L1. The forward and the data gradient against the
// interpreter, with the loop over the 2 column blocks inside the one over the 20 rows.
TEST(CpuTest, PanelsWhoseRowsReadTheirOwnVectorOperandRunTheirColumnsInside) {
  const Program forward = parse_program(
      "function (I[N, C, H, W], K[C, KH, KW]) -> (O) { O[n, c, y, x : N, C, H, W] = +(I[n, c, y + j - 1, x + i - 1] * K[c, j, i]); }");
  ad::Options wrt_image;
  wrt_image.wrt = {"I"};
  const Program gradient = ad::vjp(forward, wrt_image).program;
  const CompileOptions o = microkernels_forced(512);
  for (const Program* p : {&forward, &gradient}) {
    TensorMap in = inputs_for({{"I", {3, 32, 20, 56}}, {"K", {32, 3, 3}}, {"DO", {3, 32, 20, 56}}}, DType::f32, 5);
    if (p == &forward) in.erase("DO");
    const std::string what = print(*p);
    expect_same(*p, in, what, o);
    const std::string loops = sched::print_loops(compile(*p, types_of(in), o)->schedule());
    ASSERT_NE(loops.find("micro-kernel 8x2x16"), std::string::npos) << what << loops;
    const size_t rows = loops.find(" <= 19)") != std::string::npos ? loops.find(" <= 19)") : loops.find(" <= 20)");
    const size_t columns = loops.find(" <= 1)");
    ASSERT_NE(rows, std::string::npos) << loops;
    ASSERT_NE(columns, std::string::npos) << loops;
    EXPECT_LT(rows, columns) << "the column blocks' loop runs outside the rows'\n" << loops;
  }
}

// Compiles of different programs may run at once (each has its own isl and LLVM contexts; the cache is
// locked): four threads compile and run four programs, each equal to the interpreter.
TEST(CpuTest, ConcurrentCompilesOfDifferentPrograms) {
  const std::string texts[] = {
      "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }",
      "function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); O = E / S; }",
      "function (I[N]) -> (O) { O[i : N / 2] = >(I[2 * i + j]), j < 2; }",
      "function (A[M, K], B[K, N]) -> (D) { C[i, j : M, N] = +(A[i, k] * B[k, j]); D = relu(C) - 1; }",
  };
  const Shapes shapes[] = {{{"A", {37, 29}}, {"B", {29, 41}}}, {{"X", {13, 77}}}, {{"I", {91}}}, {{"A", {23, 31}}, {"B", {31, 19}}}};
  std::vector<int> ok(4, 0);
  std::vector<std::string> failure(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      try {
        Program p = parse_program(texts[k]);
        TensorMap in = inputs_for(shapes[k], DType::f32, 900 + k);
        CompileOptions o;
        o.threads = 1;
        TensorMap got = compile(p, types_of(in), o)->run(in), want = interpret(p, in);
        bool same = true;
        for (const auto& name : p.outputs)
          for (int64_t e = 0; e < want.at(name).size(); ++e)
            same = same && std::fabs(got.at(name).get(e) - want.at(name).get(e)) <= 1e-4 * std::max(1.0, std::fabs(want.at(name).get(e)));
        ok[k] = same;
      } catch (const std::exception& e) {
        failure[k] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < 4; ++k) EXPECT_TRUE(ok[k]) << texts[k] << " " << failure[k];
}

// Broadcast lowering (lower.h) substitutes single-term contractions into their elementwise readers; the
// values stay the interpreter's, including the +0 a sum makes of -0 (1 / +0 is +inf, 1 / -0 is -inf), a
// max over one NaN term, integer and f64 terms, conditional terms that hit and miss, and lower-rank
// inputs aligned to the right. Every compile here runs the pass's isl proof (verify).
TEST(CpuTest, BroadcastLoweringKeepsTheInterpretersValues) {
  struct Case {
    const char* text;
    Shapes shapes;
  };
  const Case cases[] = {
      {"function (A[N, 1], B[N, C]) -> (O) { T[i, j : N, C] = +(A[i, 0]); O = T * B; }", {{"A", {5, 1}}, {"B", {5, 7}}}},
      {"function (A[N, 1], B[N, 3]) -> (O) { T[i, j : N, 3] = +(A[i, 0]); O = 1 / T + 0 * B; }", {{"A", {4, 1}}, {"B", {4, 3}}}},
      {"function (A[N, 1], B[N, C]) -> (O) { T[i, j : N, C] = >(A[i, 0]); O = T - B; }", {{"A", {6, 1}}, {"B", {6, 5}}}},
      {"function (A[C], B[N, C]) -> (O) { T[i, j : N, C] = *(A[j]); O = T * B; }", {{"A", {9}}, {"B", {4, 9}}}},
      {"function (X[N, C], M[N, 1], G[N, 1]) -> (O) { T[i, j : N, C] = +(X[i, j] == M[i, 0] ? G[i, 0]); O = T + X; }",
       {{"X", {5, 6}}, {"M", {5, 1}}, {"G", {5, 1}}}},
  };
  for (const auto& cs : cases) {
    Program p = parse_program(cs.text);
    for (DType t : {DType::f32, DType::f64, DType::i32}) {
      TensorMap in = inputs_for(cs.shapes, t, 7);
      if (in.count("A") && t != DType::i32) {
        in.at("A").set(0, -0.0);
        in.at("A").set(in.at("A").size() - 1, std::numeric_limits<double>::quiet_NaN());
      }
      if (in.count("M"))  // some hits: X[i, 0] equals its row's M
        for (int64_t i = 0; i < 5; i += 2) in.at("X").set(i * 6, in.at("M").get(i));
      expect_same(p, in, cs.text);
      const std::string lowered = print(compile(p, types_of(in))->program());
      EXPECT_EQ(lowered.find("T["), std::string::npos) << "not substituted:\n" << lowered;
    }
  }
}

// A compiled program keeps its scratch tensors between runs (no page faults, no zeroing) and hands each
// concurrent run a set of its own: runs one after another on different inputs, and runs on four threads
// at once, all equal the interpreter -- a nest that left an element of a scratch tensor unwritten, or two
// runs sharing one set, would show here.
TEST(CpuTest, ScratchTensorsAreReusedAcrossRunsAndConcurrentRuns) {
  Program softmax = parse_program(
      "function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); O = E / S; }");
  ad::Options grad_options;
  Program cases[] = {
      ad::vjp(softmax, grad_options).program,
      parse_program("function (I[N, H, W, CI], K[KH, KW, CI, CO], B[CO]) -> (R) {"
                    "  O[n, y, x, co : N, H - 1, W - 1, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]);"
                    "  P[n, y, x, co : N, (H - 1) / 2, (W - 1) / 2, CO] = >(O[n, 2 * y + j, 2 * x + i, co]), j < 2, i < 2;"
                    "  R = relu(P + B); }"),
  };
  const Shapes shapes[] = {{{"X", {33, 70}}, {"DO", {33, 70}}},
                           {{"I", {2, 15, 15, 8}}, {"K", {2, 2, 8, 16}}, {"B", {16}}}};
  CompileOptions o = microkernels_forced(512);
  for (size_t c = 0; c < 2; ++c) {
    const Program& p = cases[c];
    std::vector<TensorMap> ins, wants;
    for (uint64_t seed = 0; seed < 4; ++seed) {
      ins.push_back(inputs_for(shapes[c], DType::f32, 500 + seed));
      wants.push_back(interpret(p, ins.back()));
    }
    auto compiled = compile(p, types_of(ins[0]), o);
    auto check = [&](const TensorMap& got, size_t k) {
      for (const auto& name : p.outputs)
        for (int64_t e = 0; e < got.at(name).size(); ++e)
          if (std::fabs(got.at(name).get(e) - wants[k].at(name).get(e)) > 1e-4 * std::max(1.0, std::fabs(wants[k].at(name).get(e))))
            return false;
      return true;
    };
    for (size_t k = 0; k < ins.size(); ++k) EXPECT_TRUE(check(compiled->run(ins[k]), k)) << "sequential run " << k << "\n" << print(p);
    std::vector<int> ok(ins.size(), 0);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < ins.size(); ++k)
      threads.emplace_back([&, k] {
        bool all = true;
        for (int r = 0; r < 5; ++r) all = all && check(compiled->run(ins[k]), k);
        ok[k] = all;
      });
    for (auto& t : threads) t.join();
    for (size_t k = 0; k < ins.size(); ++k) EXPECT_TRUE(ok[k]) << "concurrent runs of input " << k << "\n" << print(p);
  }
}

// Tuning: every candidate is compiled and timed (once per distinct code), the program kept is the fastest
// one's, it is cached and computes the same values as the interpreter.
TEST(CpuTest, TuningKeepsTheFastestCandidate) {
  Program conv = parse_program(
      "function (I[N, H, W, C], K[KH, KW, C, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]); }");
  TensorMap in = inputs_for({{"I", {2, 16, 16, 16}}, {"K", {3, 3, 16, 32}}}, DType::f32, 61);
  std::map<std::string, TensorType> types = types_of(in);
  CompileOptions o;
  o.tune = true;
  auto tuned = compile(conv, types, o);
  const auto& report = tuned->tuning().candidates;
  ASSERT_EQ(report.size(), 10u);
  // The program kept is the fastest candidate's: micro-kernels unless "loop nests only" won.
  bool microkernel = false;
  for (const auto& nest : tuned->schedule().nests) microkernel |= nest.microkernel.has_value();
  EXPECT_EQ(microkernel, report.front().first != "loop nests only") << report.front().first;
  for (const auto& [variant, seconds] : report) EXPECT_GT(seconds, 0) << variant;
  // One of the column widths is the plan's own choice (on any host: 32 output channels are 2 or 4 vectors
  // of 8, or 2 of 16): that variant's code is the default's, reported with the default's time, not timed.
  std::map<std::string, double> seconds_of(report.begin(), report.end());
  int copies = 0;
  for (const auto& [variant, seconds] : report) {
    const size_t at = variant.find(" (the code of ");
    if (at == std::string::npos) continue;
    ++copies;
    const std::string original = variant.substr(at + 14, variant.size() - at - 15);
    ASSERT_TRUE(seconds_of.count(original)) << variant;
    EXPECT_EQ(seconds, seconds_of.at(original)) << variant;
  }
  EXPECT_GE(copies, 1);
  EXPECT_EQ(compile(conv, types, o).get(), tuned.get());  // cached
  EXPECT_TRUE(compile(conv, types)->tuning().candidates.empty());
  expect_same(conv, in, "tuned convolution", o);
}

// time_in_rounds on a machine whose speed drifts: candidate 1 is the fastest (0.9 against 1.0 and 1.1), but
// the machine runs at half speed for a stretch as long as three runs, right where timing each candidate three
// times in a row would have put all of candidate 1's runs. Interleaved, every candidate meets the slow
// stretch once and its fastest run is its own speed; a candidate far slower than the others (here 5.0,
// over 3x the fastest in round 0) is timed in round 0 only.
TEST(CpuTest, TuningRoundsInterleaveTheCandidates) {
  const std::vector<double> speed{1.0, 0.9, 1.1, 5.0};
  std::vector<size_t> order;  // every run, untimed first runs included
  auto run = [&](size_t k) {
    const size_t at = order.size();
    order.push_back(k);
    const bool slow = at >= 4 + 3 && at < 4 + 6;  // after the first runs, the stretch of runs 3 to 5
    return speed[k] * (slow ? 2.0 : 1.0);
  };
  const std::vector<double> fastest = time_in_rounds(speed.size(), 5, run);
  ASSERT_EQ(fastest.size(), 4u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(fastest[k], speed[k]) << k;
  EXPECT_EQ(fastest[3], 10.0);  // its one run fell in the slow stretch
  EXPECT_EQ(std::min_element(fastest.begin(), fastest.end()) - fastest.begin(), 1);
  // The first runs in order, then round r from candidate r mod 4 on, the pruned candidate 3 after round 0
  // left out.
  const std::vector<size_t> expected{0, 1, 2, 3, /*round 0*/ 0, 1, 2, 3, /*1*/ 1, 2, 0, /*2*/ 2, 0, 1,
                                     /*3*/ 0, 1, 2, /*4*/ 0, 1, 2};
  EXPECT_EQ(order, expected);
  // The scenario discriminates: timed three runs of each in a row, as tuning did before, the slow stretch
  // falls on candidate 1's runs and candidate 0 looks fastest.
  order.clear();
  std::vector<double> in_a_row(speed.size(), 1e300);
  for (size_t k = 0; k < 4; ++k) run(k);
  for (size_t k = 0; k < 3; ++k) {
    for (int i = 0; i < 3; ++i) in_a_row[k] = std::min(in_a_row[k], run(k));
  }
  EXPECT_EQ(std::min_element(in_a_row.begin(), in_a_row.begin() + 3) - in_a_row.begin(), 0);
  EXPECT_THROW(time_in_rounds(2, 0, run), UserError);
  EXPECT_THROW(time_in_rounds(2, 3, run, 0.5), UserError);
  EXPECT_TRUE(time_in_rounds(0, 3, run).empty());
}

// CpuModel::microkernel_chunks: micro-kernel columns of that many vectors where they leave registers for
// two rows and the vector variable has that many (3 of 8 lanes on 64 channels: the last column masked),
// else the plan's own choice; the same values as the interpreter either way.
TEST(CpuTest, MicrokernelColumnsOfAGivenWidth) {
  Program conv = parse_program(
      "function (I[N, H, W, C], K[KH, KW, C, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]); }");
  TensorMap in = inputs_for({{"I", {2, 12, 12, 16}}, {"K", {3, 3, 16, 64}}}, DType::f32, 67);
  auto chunks_of = [&](const CompileOptions& o) {
    auto compiled = compile(conv, types_of(in), o);
    for (const auto& nest : compiled->schedule().nests)
      if (nest.microkernel) return nest.microkernel->chunks;
    return 0;
  };
  CompileOptions o;
  o.target.cpu.vector_bits = 256;  // 8 lanes, 16 registers: 64 channels are 8 vectors
  o.target.cpu.vector_registers = 16;
  const int chosen = chunks_of(o);
  ASSERT_GT(chosen, 0) << "the conv is not a micro-kernel";
  for (int chunks : {1, 2, 3, 4}) {
    o.target.cpu.microkernel_chunks = chunks;
    EXPECT_EQ(chunks_of(o), chunks) << "columns of " << chunks << " vectors";
    expect_same(conv, in, "columns of " + std::to_string(chunks) + " vectors", o);
  }
  // 6 vectors leave 9 of 16 registers: one row of 6 accumulators. 9 vectors are more than 64 channels
  // have. The plan's choice stays.
  for (int chunks : {6, 9}) {
    o.target.cpu.microkernel_chunks = chunks;
    EXPECT_EQ(chunks_of(o), chosen) << "columns of " << chunks << " vectors";
  }
}

// The program's (last) micro-kernel blocks `rows` rows of `block` by `chunks` vectors.
void expect_microkernel_block(const CompiledProgram& compiled, const std::string& block, int rows, int chunks, const std::string& what) {
  const sched::Nest* kernel = nullptr;
  for (const auto& nest : compiled.schedule().nests)
    if (nest.microkernel) kernel = &nest;
  ASSERT_NE(kernel, nullptr) << what << "\n" << sched::print_loops(compiled.schedule());
  EXPECT_EQ(kernel->variables.at(kernel->microkernel->block), block) << what << "\n" << sched::print_loops(compiled.schedule());
  EXPECT_EQ(kernel->microkernel->rows, rows) << what;
  EXPECT_EQ(kernel->microkernel->chunks, chunks) << what;
}

// CpuModel::fma_per_cycle weighs a block's FMAs against its loads and loop overhead. A 64-channel weight
// gradient's blocks of rows over ci: where two FMAs issue per cycle, 6 rows (a partial last block of 4)
// amortize the loads best; where one does (Zen 4's 512-bit FMAs), the FMAs dominate and 4 rows waste none
// (measured there 2-7% faster on the bench's 64- and 128-channel weight gradients). Either way the values
// are the interpreter's.
TEST(CpuTest, MicrokernelRowsFollowTheCoresFmaRate) {
  Program grad = parse_program(
      "function (I[N, H, W, CI], DO[N, H, W, CO]) -> (DK) {"
      "  DK[j, i, ci, co : 3, 3, CI, CO] = +(I[n, y + j - 1, x + i - 1, ci] * DO[n, y, x, co]); }");
  TensorMap in = inputs_for({{"I", {1, 5, 5, 64}}, {"DO", {1, 5, 5, 64}}}, DType::f32, 71);
  for (int rate : {2, 1}) {
    CompileOptions o = microkernels_forced(512);
    o.target.cpu.fma_per_cycle = rate;
    expect_microkernel_block(*compile(grad, types_of(in), o), "ci", rate == 2 ? 6 : 4, 4, std::to_string(rate) + " FMAs per cycle");
    expect_same(grad, in, std::to_string(rate) + " FMAs per cycle", o);
  }
}

// CpuModel::fma_latency: a step's FMAs wait on their accumulators' chains where a block has fewer than
// latency x rate of them. The small CNN's first weight gradient (one input channel, 32 output channels in
// two vectors) took blocks of one row over ci, 2 accumulators, and ran at half the FMA peak of a Zen 4
// (0.258 ms); with the latency counted its blocks take 3 rows over i, border rows and all (0.136 ms).
// Where the chains do not bind (latency 0, or a block of 4 x 2 accumulators) the choice is as before.
TEST(CpuTest, MicrokernelBlocksHideTheFmaLatency) {
  Program grad = parse_program(
      "function (X[N, H, W, C0], DZ[N, H, W, C1]) -> (DK) {"
      "  DK[j, i, ci, c : 3, 3, C0, C1] = +(X[n, y + j - 1, x + i - 1, ci] * DZ[n, y, x, c]); }");
  TensorMap in = inputs_for({{"X", {4, 14, 14, 1}}, {"DZ", {4, 14, 14, 32}}}, DType::f32, 73);
  for (int latency : {4, 0}) {
    CompileOptions o = microkernels_forced(512);
    o.target.cpu.fma_per_cycle = 1;  // as on Zen 4, where it was measured
    o.target.cpu.fma_latency = latency;
    expect_microkernel_block(*compile(grad, types_of(in), o), latency ? "i" : "ci", latency ? 3 : 1, 2, "latency " + std::to_string(latency));
    expect_same(grad, in, "latency " + std::to_string(latency), o);
  }
}

// A core of one FMA a cycle takes reduction tiles within an eighth of L2 (reduction_tile_budget): a 3x3
// conv's 128 input channels, about 272 bytes of inputs each (a row of 64 filter values, a row of pixels'),
// in three tiles of 43 within three quarters of a 16 KiB L1 at two FMAs a cycle, in one at one.
TEST(CpuTest, OneFmaACycleTakesReductionTilesWithinAnEighthOfL2) {
  Program conv = parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
  TensorMap in = inputs_for({{"I", {2, 6, 6, 128}}, {"K", {3, 3, 128, 64}}}, DType::f32, 72);
  auto options = [](int rate, int percent) {
    CompileOptions o = microkernels_forced(512);
    o.target.cpu.fma_per_cycle = rate;
    o.target.cpu.l1_bytes = 16 * 1024;
    o.target.cpu.l2_bytes = 512 * 1024;
    o.target.cpu.reduction_tile_percent = percent;
    return o;
  };
  for (int rate : {2, 1}) {
    const CompileOptions o = options(rate, 100);
    auto compiled = compile(conv, types_of(in), o);
    const std::string loops = sched::print_loops(compiled->schedule());
    EXPECT_EQ(loops.find("((43 * c") != std::string::npos, rate == 2) << rate << " FMAs per cycle\n" << loops;
    EXPECT_EQ(loops.find("while (c4 <= 127)") != std::string::npos, rate == 1) << rate << " FMAs per cycle\n" << loops;
    expect_same(conv, in, std::to_string(rate) + " FMAs per cycle", o);
  }
  // CpuModel::reduction_tile_percent scales the budget (tuning tries half and double): half of 64 KiB
  // takes the channels in two tiles of 64.
  const CompileOptions o = options(1, 50);
  const std::string loops = sched::print_loops(compile(conv, types_of(in), o)->schedule());
  EXPECT_NE(loops.find("((64 * c"), std::string::npos) << loops;
  expect_same(conv, in, "half the tile budget", o);
}

TEST(CpuTest, RunTimeErrorsAreUserErrors) {
  Program p = parse_program("function (A[N]) -> (O) { O = A * 2; }");
  auto compiled = compile(p, {{"A", {DType::f32, {4}}}});
  EXPECT_THROW(compiled->run({{"A", Buffer(DType::f32, {5})}}), UserError);
  EXPECT_THROW(compiled->run({{"A", Buffer(DType::f64, {4})}}), UserError);
  EXPECT_THROW(compiled->run({}), UserError);
  for (int threads : {-1, 1025}) {  // 0 is the target's count; TBB would warn about and ignore 1025
    CompileOptions o;
    o.threads = threads;
    try {
      compile(p, {{"A", {DType::f32, {4}}}}, o);
      ADD_FAILURE() << threads << " threads compiled";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), "threads " + std::to_string(threads) +
                                           ": give 0 (the target's thread count) or a thread count from 1 to 1024");
    }
  }
  EXPECT_THROW(run(parse_program("function (I[N]) -> (O) { O[i : N] = =(I[i + j]), j < 2; }"), {{"I", Buffer(DType::f32, {4})}}),
               UserError);
}

}  // namespace
}  // namespace polytile::cpu

namespace polytile::cpu {
namespace {

// Runs on caller memory (views): the values of a Buffer run, written straight into the caller's arrays,
// concurrently on four threads with separate memory; and one-line errors for what cannot run in place.
TEST(CpuTest, ViewsRunOnTheCallersMemory) {
  Program p = parse_program(R"(function (A[M, K], B[K, N], S[N]) -> (R, S) {
    C[i, j : M, N] = +(A[i, k] * B[k, j]);
    R = relu(C) + S;
  })");
  const int64_t M = 37, K = 29, N = 45;
  TensorMap in = inputs_for({{"A", {M, K}}, {"B", {K, N}}, {"S", {N}}}, DType::f32, 7);
  CompileOptions o;
  o.target.cpu.microkernel_min_points = 1;  // the micro-kernel's masked borders on caller memory too
  auto compiled = compile(p, types_of(in), o);
  const TensorMap want = compiled->run(in);
  auto copy_of = [](const Buffer& b) {
    std::vector<float> v(static_cast<size_t>(b.size()));
    std::memcpy(v.data(), b.data(), b.byte_size());
    return v;
  };
  auto run_on = [&](std::vector<float>& a, std::vector<float>& b, std::vector<float>& s, std::vector<float>& r, std::vector<float>& s_out) {
    compiled->run(ViewMap{{"A", {a.data(), DType::f32, {M, K}, {}}}, {"B", {b.data(), DType::f32, {K, N}, {N, 1}}},
                          {"S", {s.data(), DType::f32, {N}, {}}}},
                  ViewMap{{"R", {r.data(), DType::f32, {M, N}, {}}}, {"S", {s_out.data(), DType::f32, {N}, {}}}});
  };
  auto a = copy_of(in.at("A")), b = copy_of(in.at("B")), s = copy_of(in.at("S"));
  std::vector<float> r(static_cast<size_t>(M * N), -1.0f), s_out(static_cast<size_t>(N), -1.0f);
  run_on(a, b, s, r, s_out);
  EXPECT_EQ(std::memcmp(r.data(), want.at("R").data(), want.at("R").byte_size()), 0);
  EXPECT_EQ(s_out, s);  // an output that is an input, copied into its view
  // Four threads, each on its own memory, at once.
  std::vector<std::thread> threads;
  std::vector<int> same(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto a2 = a, b2 = b, s2 = s;
      std::vector<float> r2(r.size(), static_cast<float>(t)), s2_out(s.size());
      for (int k = 0; k < 5; ++k) run_on(a2, b2, s2, r2, s2_out);
      same[static_cast<size_t>(t)] = r2 == r && s2_out == s;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(same, std::vector<int>(4, 1));
  // What cannot run in place is a UserError naming the tensor.
  auto error_of = [&](const ViewMap& ins, const ViewMap& outs) {
    try {
      compiled->run(ins, outs);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const ViewMap ins{{"A", {a.data(), DType::f32, {M, K}, {}}}, {"B", {b.data(), DType::f32, {K, N}, {}}}, {"S", {s.data(), DType::f32, {N}, {}}}};
  const ViewMap outs{{"R", {r.data(), DType::f32, {M, N}, {}}}, {"S", {s_out.data(), DType::f32, {N}, {}}}};
  ViewMap bad = ins;
  bad["B"] = {b.data(), DType::f32, {K, N}, {1, K}};  // a transposed layout
  EXPECT_EQ(error_of(bad, outs).rfind("input B: the view is not contiguous row-major", 0), 0u) << error_of(bad, outs);
  bad = ins;
  bad["A"].shape = {M, K + 1};
  EXPECT_EQ(error_of(bad, outs), "input A is a view of f32[37, 30] but the program was compiled for f32[37, 29]");
  bad = ins;
  bad["A"].dtype = DType::f64;
  EXPECT_EQ(error_of(bad, outs).rfind("input A is a view of f64[37, 29]", 0), 0u);
  bad = ins;
  bad.erase("S");
  EXPECT_EQ(error_of(bad, outs), "missing input S");
  ViewMap bad_out = outs;
  bad_out.erase("R");
  EXPECT_EQ(error_of(ins, bad_out).rfind("missing output R", 0), 0u);
  bad_out = outs;
  bad_out["R"].data = a.data();  // writes over input A
  EXPECT_EQ(error_of(ins, bad_out).rfind("output R overlaps input A in memory", 0), 0u) << error_of(ins, bad_out);
  bad_out = outs;
  bad_out["R"].data = reinterpret_cast<char*>(r.data()) + 1;
  EXPECT_EQ(error_of(ins, bad_out).rfind("output R: the view's data is not aligned", 0), 0u) << error_of(ins, bad_out);
  bad_out = outs;
  bad_out["C"] = outs.at("R");
  EXPECT_EQ(error_of(ins, bad_out), "output C is not an output of the program");
  // Views of Buffers are the same run.
  TensorMap got;
  got["R"] = Buffer(DType::f32, {M, N});
  got["S"] = Buffer(DType::f32, {N});
  compiled->run(ViewMap{{"A", TensorView::of(in.at("A"))}, {"B", TensorView::of(in.at("B"))}, {"S", TensorView::of(in.at("S"))}},
                ViewMap{{"R", TensorView::of(got.at("R"))}, {"S", TensorView::of(got.at("S"))}});
  EXPECT_EQ(std::memcmp(got.at("R").data(), want.at("R").data(), want.at("R").byte_size()), 0);
}

// The process's cache: a program compiled twice is one object; cache = false compiles afresh and keeps
// nothing; the least recently used programs leave first when the capacity is reached; clear_cache empties
// it while the programs callers hold keep running.
// Program outputs of at least a quarter of the last-level cache that no later nest touches are stored
// past the caches (Nest::stream): on x86 the streaming body's vector stores are non-temporal, where every
// one is aligned to half its size or more (a max pool gradient's rows of 64 channels are 64-byte aligned;
// softmax's rows of 1000 columns 32-byte aligned, whose 64-byte stores are split in two; rows of 101, 4-byte
// aligned, keep their stores, whatever the vectors' width). The results match the interpreter on the runtime's aligned buffers and,
// bit for bit, on the caller's memory one element off, where the entry calls the other body (a
// non-temporal store of a vector there would fault).
TEST(CpuTest, LargeOutputsAreStoredPastTheCaches) {
  const Program pool = parse_program(
      "function (I[N, H, W, C]) -> (O) { O[n, y, x, c : N, H/2, W/2, C] = >(I[n, 2*y + j, 2*x + i, c]), j < 2, i < 2; }");
  const Program softmax = parse_program(R"(function (X[N, C]) -> (O) {
    M[i, 0 : N, 1] = >(X[i, j]);
    E = exp(X - M);
    S[i, 0 : N, 1] = +(E[i, j]);
    O = E / S;
  })");
  // B is an output that D reads: only D streams.
  const Program chain = parse_program("function (A[N, C]) -> (B, D) { B = A * 2; D = B + 1; }");
  const Program matmul = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  struct Case {
    std::string name;
    Program program;
    Shapes shapes;
    std::string streamed;
    bool nontemporal;
  };
  const std::vector<Case> cases{
      {"max pool gradient", ad::vjp(pool).program, {{"I", {2, 8, 16, 64}}, {"DO", {2, 4, 8, 64}}}, "DI", true},
      {"softmax of rows of 1000", softmax, {{"X", {24, 1000}}}, "O", true},
      {"softmax of rows of 101", softmax, {{"X", {64, 101}}}, "O", false},
      {"an output another reads", chain, {{"A", {64, 64}}}, "D", true},
      // A micro-kernel whose blocks each store their accumulators once (the whole reduction in one tile).
      {"a matmul of a short reduction", matmul, {{"A", {256, 16}}, {"B", {16, 64}}}, "C", true},
  };
  CompileOptions o;
  o.target.cpu.l3_bytes = 64 * 1024;  // outputs of 16 KiB and more
  o.target.cpu.stream_stores = true;  // the host's default is off on Intel's cores (host_target)
  o.threads = 2;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const TensorMap in = inputs_for(c.shapes, DType::f32, 3);
    auto compiled = compile(c.program, types_of(in), o);
    const auto& nests = compiled->schedule().nests;
    int streaming = -1;
    for (size_t k = 0; k < nests.size(); ++k) {
      EXPECT_EQ(nests[k].stream, nests[k].tensor == c.streamed && k + 1 == nests.size()) << nests[k].name;
      if (nests[k].stream) streaming = static_cast<int>(k);
    }
    ASSERT_GE(streaming, 0) << sched::print_loops(compiled->schedule());
    EXPECT_NE(sched::print_loops(compiled->schedule()).find("; stores past the caches"), std::string::npos);
#if defined(__x86_64__)
    const std::string module = module_of(compiled->llvm_ir(), "nest_" + std::to_string(streaming));
    EXPECT_EQ(module.find("!nontemporal") != std::string::npos, c.nontemporal) << module;
    EXPECT_EQ(module.find("call void @llvm.x86.sse.sfence()") != std::string::npos, c.nontemporal);
#endif
    expect_same(c.program, in, c.name, o);
    // On the caller's memory, one element past 64-byte alignment.
    const TensorMap want = compiled->run(in);
    ViewMap inputs, outputs;
    for (const auto& [name, buffer] : in) inputs[name] = TensorView::of(buffer);
    std::map<std::string, std::vector<float>> memory;
    for (const auto& [name, buffer] : want) {
      std::vector<float>& m = memory[name];
      m.assign(static_cast<size_t>(buffer.size()) + 32, -1.0f);
      float* at = m.data() + 16 - (reinterpret_cast<uintptr_t>(m.data()) % 64) / sizeof(float) + 1;
      outputs[name] = TensorView{at, DType::f32, buffer.shape(), {}};
    }
    compiled->run(inputs, outputs);
    for (const auto& [name, buffer] : want)
      EXPECT_EQ(std::memcmp(outputs.at(name).data, buffer.data(), buffer.byte_size()), 0) << name;
    // Exported ahead of time: the header names the streamed output, and the object computes the same.
    const ExportedObject exported = export_object(c.program, types_of(in), "streams", o);
    EXPECT_NE(exported.header.find(" * " + c.streamed + ": stored past the caches"), std::string::npos) << exported.header;
    const TensorMap loaded = load(exported)->run(in, 2);
    for (const auto& [name, buffer] : want)
      EXPECT_EQ(std::memcmp(loaded.at(name).data(), buffer.data(), buffer.byte_size()), 0) << name;
  }
  // Outputs below a quarter of the cache, or with streaming off, go through the caches.
  CompileOptions large_cache = o, off = o;
  large_cache.target.cpu.l3_bytes = 1 << 30;
  off.target.cpu.stream_stores = false;
  const TensorMap in = inputs_for(cases[0].shapes, DType::f32, 3);
  for (const CompileOptions& options : {large_cache, off})
    for (const auto& nest : compile(cases[0].program, types_of(in), options)->schedule().nests) EXPECT_FALSE(nest.stream) << nest.name;
  // Nor do a micro-kernel's blocks that load their accumulators back at each reduction tile.
  CompileOptions tiles = o;
  tiles.target.cpu.l1_bytes = 4096;
  const TensorMap long_in = inputs_for({{"A", {64, 2048}}, {"B", {2048, 64}}}, DType::f32, 3);
  auto long_reduction = compile(matmul, types_of(long_in), tiles);
  const sched::Nest& update = long_reduction->schedule().nests.back();
  ASSERT_TRUE(update.microkernel) << sched::print_loops(long_reduction->schedule());
  EXPECT_NE(sched::print_loops(long_reduction->schedule()).find("Load("), std::string::npos);
  EXPECT_FALSE(update.stream);
  expect_same(matmul, long_in, "a matmul of a long reduction", tiles);
}

// A copy into panels that a micro-kernel reads (plan.h pack_vector_operand) of a core's L2 or more is
// stored past the caches too (scheduler.cpp panel_copy): every thread reads all of it, so the next run's
// stores would each wait for the other cores' copies of the line to be dropped. B of a 40x9x600 matmul
// (21 KiB, against an L2 of 16 KiB), a copy of few points that the loop vectorizer makes vector stores
// (its last panel's rows shorter, their tail zeroed by a nest of its own, through the caches); B of
// 40x9x16384, whose copy O3 makes one memcpy per panel row, which the streaming body moves by
// non-temporal vector stores. Not with streaming off.
TEST(CpuTest, PackedPanelsAreStoredPastTheCaches) {
  const Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  // 16360 and 16361 columns: the last panel is partial, so the panel rows' memcpy has a length that
  // varies, moved by a loop of vector stores; 16361: a length of any multiple of 4 bytes, its last bytes
  // (less than a vector) copied through the caches by a memcpy of their own.
  for (int64_t n : {600, 16384, 16360, 16361}) {
    for (bool on : {true, false}) {
      const std::string what = std::to_string(n) + " columns, streaming " + (on ? "on" : "off");
      CompileOptions o = microkernels_forced(512);
      o.target.cpu.l2_bytes = 16 * 1024;
      o.target.cpu.stream_stores = on;
      const TensorMap in = inputs_for({{"A", {40, 9}}, {"B", {9, n}}}, DType::f32, 5);
      auto compiled = compile(mm, types_of(in), o);
      const auto& nests = compiled->schedule().nests;
      int copy = -1;  // C is below a quarter of the last-level cache; B_P's zero tail (600 columns) is no copy
      for (size_t k = 0; k < nests.size(); ++k) {
        EXPECT_EQ(nests[k].stream, on && nests[k].name == "B_P.update") << what << ": " << nests[k].name;
        if (nests[k].name == "B_P.update") copy = static_cast<int>(k);
      }
      ASSERT_GE(copy, 0) << what << "\n" << sched::print_loops(compiled->schedule());
#if defined(__x86_64__)
      const std::string module = module_of(compiled->llvm_ir(), "nest_" + std::to_string(copy));
      EXPECT_EQ(module.find("!nontemporal") != std::string::npos, on) << what << "\n" << module;
      EXPECT_EQ(module.find("call void @llvm.x86.sse.sfence()") != std::string::npos, on) << what;
      // The streaming body (the other one runs where a caller's memory is not aligned) has no memcpy left.
      const size_t stream = module.find(".stream(");
      EXPECT_EQ(stream != std::string::npos, on) << what << "\n" << module;
      const std::string body = stream == std::string::npos ? module : module.substr(stream, module.find("\n}\n", stream) - stream);
      const bool varies = n == 16360 || n == 16361;
      if (on && varies) {  // a memcpy of the rest of a row (none at run time for 16360) may stay
        EXPECT_NE(body.find("stream.copy"), std::string::npos) << what << "\n" << body;
      } else {
        EXPECT_EQ(body.find("@llvm.memcpy") != std::string::npos, n > 600 && !on) << what << "\n" << body;
      }
#endif
      expect_same(mm, in, what, o);
    }
  }
}

TEST(CpuTest, TheProgramCacheIsBoundedAndCanBeCleared) {
  auto program = [](int k) { return parse_program("function (A[N]) -> (B) { B = A * " + std::to_string(k) + "; }"); };
  const std::map<std::string, TensorType> types{{"A", {DType::f32, {8}}}};
  clear_cache();
  auto first = compile(program(1), types);
  EXPECT_EQ(compile(program(1), types), first);
  CompileOptions fresh;
  fresh.cache = false;
  EXPECT_NE(compile(program(1), types, fresh), first);
  EXPECT_EQ(cached_programs(), 1u);
  set_cache_capacity(2);
  auto second = compile(program(2), types);
  EXPECT_EQ(compile(program(1), types), first);  // now the most recent
  compile(program(3), types);                     // evicts program 2, the least recently used
  EXPECT_EQ(cached_programs(), 2u);
  EXPECT_EQ(compile(program(1), types), first);
  EXPECT_NE(compile(program(2), types), second);
  clear_cache();
  EXPECT_EQ(cached_programs(), 0u);
  TensorMap in{{"A", Buffer::from_values(DType::f32, {8}, {1, 2, 3, 4, 5, 6, 7, 8})}};
  EXPECT_EQ(second->run(in).at("B").get(7), 16.0);  // still valid after leaving the cache
  set_cache_capacity(64);
}

}  // namespace
}  // namespace polytile::cpu
