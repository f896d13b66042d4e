// The polytile command line, run in-process: every command, its help, and every user error as a one-line
// message with exit code 1.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <unistd.h>

#include "cli.h"
#include "polytile/cuda_runtime.h"
#include "polytile/interpreter.h"
#include "polytile/npy.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile {
namespace {

struct Result {
  int code;
  std::string out, err;
};

Result cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  int code = run_cli(args, out, err);
  return {code, out.str(), err.str()};
}

const std::string kExamples = POLYTILE_SOURCE_DIR "/examples/";

// Under the process's id: two runs of the tests at once (a CI checkout beside a developer's build) do not
// share files.
std::string temp(const std::string& name) {
  return ::testing::TempDir() + "/polytile_cli_" + std::to_string(::getpid()) + "_" + name;
}

// A user error as the CLI reports it: exit code 1 and one line on stderr that says `what`.
void one_line_error(const Result& r, const std::string& what) {
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(CliTest, HelpForEveryCommand) {
  for (auto args : {std::vector<std::string>{"--help"}, {"help"}, {"-h"}}) {
    Result r = cli(args);
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("commands:"), std::string::npos);
  }
  EXPECT_NE(cli({"check", "--help"}).out.find("usage: polytile check"), std::string::npos);
  EXPECT_NE(cli({"help", "run"}).out.find("usage: polytile run"), std::string::npos);
  EXPECT_NE(cli({"run", "--help"}).out.find("--random NAME=DIMS[:DTYPE]"), std::string::npos);
  Result none = cli({});
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("usage:"), std::string::npos);
}

TEST(CliTest, CheckPrintsNormalizedTextAndTypes) {
  Result r = cli({"check", kExamples + "conv2d_strided_dilated.tile"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, print(parse_file(kExamples + "conv2d_strided_dilated.tile")));
  Result t = cli({"check", kExamples + "conv2d_strided_dilated.tile", "--shape", "I=2x9x9x5:f64", "--shape", "K=2x2x5x7"});
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("// I: f64[2, 9, 9, 5]\n// K: f32[2, 2, 5, 7]\n// O: f64[2, 3, 3, 7]\n"), std::string::npos) << t.out;
}

// --cpu names the CPU the code is for: run with one this machine runs, an unknown one is an error, and
// compile takes it only with --target cpu.
TEST(CliTest, CodeForANamedCpu) {
  const std::string mm = kExamples + "matmul.tile";
  Result r = cli({"run", mm, "--random", "A=8x16", "--random", "B=16x4", "--cpu", "x86-64-v2", "--no-cache"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("C: f32[8, 4]", 0), 0u) << r.out;
  one_line_error(cli({"run", mm, "--random", "A=8x16", "--random", "B=16x4", "--cpu", "pentium-9000"}), "unknown CPU 'pentium-9000'");
  one_line_error(cli({"run", mm, "--random", "A=8x16", "--random", "B=16x4", "--cpu", "znver3", "--backend", "interp"}),
                 "--cpu needs the cpu backend");
  one_line_error(cli({"compile", mm, "--shape", "A=8x16", "--shape", "B=16x4", "--cpu", "znver3", "-o", temp("b")}),
                 "--cpu needs --target cpu");
  r = cli({"compile", mm, "--shape", "A=8x16", "--shape", "B=16x4", "--target", "cpu", "--cpu", "skylake-avx512", "-o", temp("mm_skx")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("for CPU skylake-avx512"), std::string::npos) << r.out;
  EXPECT_NE(slurp(temp("mm_skx") + ".h").find("CPU skylake-avx512"), std::string::npos);
  // lower shows the schedule made for the named CPU's vectors: SSE's 4 lanes, AVX2's 8, AVX-512's 16.
  for (const auto& [name, lanes] : {std::pair{"x86-64-v2", "x4"}, std::pair{"x86-64-v3", "x8"}, std::pair{"skylake-avx512", "x16"}}) {
    r = cli({"lower", mm, "--emit", "loops", "--shape", "A=96x64", "--shape", "B=64x64", "--cpu", name});
    EXPECT_EQ(r.code, 0) << r.err;
    const size_t at = r.out.find("micro-kernel ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string shape = r.out.substr(at + 13, r.out.find_first_not_of("0123456789x", at + 13) - at - 13);
    EXPECT_EQ(shape.substr(shape.rfind('x')), lanes) << name << ": " << shape;
  }
  one_line_error(cli({"lower", mm, "--emit", "loops", "--shape", "A=96x64", "--shape", "B=64x64", "--cpu", "znver3", "--target", "sm_90"}),
                 "--cpu names a CPU target's CPU, not sm_90's");
}

// Cache sizes after --cpu's name block the schedule for that machine's caches: a padded 3x3 conv's
// reduction tiles shrink with a smaller L1 and L2, in lower's loops, and run and compile take them too;
// a malformed size is a one-line error naming it.
TEST(CliTest, CacheSizesAfterTheCpusName) {
  const std::string conv = temp("conv3x3.tile");
  std::ofstream(conv) << "function (I[N, H, W, C], K[KH, KW, C, CO]) -> (O) {\n"
                         "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]);\n}\n";
  const std::vector<std::string> shapes{"--shape", "I=2x12x12x64", "--shape", "K=3x3x64x64"};
  auto lower = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args{"lower", conv, "--emit", "loops"};
    args.insert(args.end(), shapes.begin(), shapes.end());
    args.insert(args.end(), more.begin(), more.end());
    return cli(args);
  };
  const Result mine = lower({}), small = lower({"--cpu", "host,l1=8K,l2=96K"}), same = lower({"--cpu", "host"});
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_EQ(same.out, mine.out);
  EXPECT_NE(small.out, mine.out) << "the caches changed nothing:\n" << mine.out;
  Result r = cli({"run", conv, "--random", "I=2x12x12x64", "--random", "K=3x3x64x64", "--cpu", "host,l1=8K,l2=96K", "--no-cache",
                  "--limit", "2"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("O: f32[2, 12, 12, 64]", 0), 0u) << r.out;
  r = cli({"compile", conv, "--shape", "I=2x12x12x64", "--shape", "K=3x3x64x64", "--target", "cpu", "--cpu", "znver3,l2=512K",
           "-o", temp("conv_zen3")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("for CPU znver3"), std::string::npos) << r.out;
  one_line_error(lower({"--cpu", "znver3,l2=512"}), "CPU 'znver3,l2=512': l2=512 is not a cache size");
  one_line_error(lower({"--cpu", "znver3,size=1M"}), "CPU 'znver3,size=1M': 'size=1M' is not a cache size");
}

TEST(CliTest, RunReadsAndWritesNpy) {
  Buffer a = testing::random_buffer({3, 4}, 1), b = testing::random_buffer({4, 2}, 2);
  write_npy(temp("a.npy"), a);
  write_npy(temp("b.npy"), b);
  Result r = cli({"run", kExamples + "matmul.tile", "--input", "A=" + temp("a.npy"), "--input", "B=" + temp("b.npy"),
                  "--output", "C=" + temp("c.npy")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "C: f64[3, 2] -> " + temp("c.npy") + "\n");
  Buffer c = read_npy(temp("c.npy"));
  Buffer want = interpret(parse_file(kExamples + "matmul.tile"), {{"A", a}, {"B", b}}).at("C");
  ASSERT_EQ(c.shape(), want.shape());
  // The compiled sum may run in another order than the interpreter's (float reductions are reassociated
  // so they vectorize): equal up to rounding.
  EXPECT_TRUE(difference(c, want).within(1e-14)) << difference(c, want).relative;
  for (auto f : {"a.npy", "b.npy", "c.npy"}) std::remove(temp(f).c_str());
}

// .npz inputs (tests/data: written by np.savez and np.savez_compressed): the arrays are the inputs they
// name, the same values as from .npy files; a damaged or foreign archive is a user error naming the file.
TEST(CliTest, RunReadsNpzArchives) {
  const std::string data = POLYTILE_SOURCE_DIR "/tests/data/";
  const std::string mm = kExamples + "matmul.tile";
  Result stored = cli({"run", mm, "--inputs", data + "matmul_inputs.npz", "--backend", "interp", "--output", "C=" + temp("npz_c.npy")});
  ASSERT_EQ(stored.code, 0) << stored.err;
  Buffer c = read_npy(temp("npz_c.npy"));
  std::vector<double> a(12), b(20);
  for (int i = 0; i < 12; ++i) a[static_cast<size_t>(i)] = i / 4.0;
  for (int i = 0; i < 20; ++i) b[static_cast<size_t>(i)] = (i - 7) / 3.0;
  Buffer want = interpret(parse_file(mm), {{"A", Buffer::from_values(DType::f32, {3, 4}, a)},
                                           {"B", Buffer::from_values(DType::f32, {4, 5}, b)}}).at("C");
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(c.to_doubles(), want.to_doubles());
  Result compressed = cli({"run", mm, "--inputs", data + "matmul_inputs_compressed.npz"});
  ASSERT_EQ(compressed.code, 0) << compressed.err;
  EXPECT_EQ(compressed.out, cli({"run", mm, "--inputs", data + "matmul_inputs.npz"}).out);
  // The same arrays as .npy files: the same result.
  write_npy(temp("npz_a.npy"), Buffer::from_values(DType::f32, {3, 4}, a));
  write_npy(temp("npz_b.npy"), Buffer::from_values(DType::f32, {4, 5}, b));
  Result npy = cli({"run", mm, "--input", "A=" + temp("npz_a.npy"), "--input", "B=" + temp("npz_b.npy")});
  ASSERT_EQ(npy.code, 0) << npy.err;
  EXPECT_EQ(npy.out, compressed.out);

  // Damaged archives: cut short, and one data byte flipped (the member's CRC no longer matches).
  const std::string bytes = slurp(data + "matmul_inputs.npz");
  const std::string cut = temp("cut.npz"), flipped = temp("flipped.npz");
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::string damaged = bytes;
  size_t header = damaged.find("\x93NUMPY");
  ASSERT_NE(header, std::string::npos);
  damaged[header + 128 + 4] = static_cast<char>(damaged[header + 128 + 4] ^ 0x40);  // in A's data
  std::ofstream(flipped, std::ios::binary) << damaged;
  one_line_error(cli({"run", mm, "--inputs", cut}), cut + ": cannot read the .npz archive");
  one_line_error(cli({"run", mm, "--inputs", flipped}), flipped + ":A.npy: damaged member");
  one_line_error(cli({"run", mm, "--inputs", data + "npz_with_text.npz"}), "npz_with_text.npz:notes.txt: not a .npy member");
  one_line_error(cli({"run", mm, "--inputs", data + "matmul_inputs_extra.npz"}),
                 "matmul_inputs_extra.npz: array X is not an input of the program");
  one_line_error(cli({"run", mm, "--inputs", data + "matmul_inputs.npz", "--random", "A=3x4"}), "input A is given twice");
  one_line_error(cli({"run", mm, "--inputs", "/nonexistent.npz"}), "/nonexistent.npz: cannot read the .npz archive");
  one_line_error(cli({"run", mm, "--inputs", mm}), mm + ": cannot read the .npz archive");
  for (const auto& f : {cut, flipped, temp("npz_c.npy"), temp("npz_a.npy"), temp("npz_b.npy")}) std::remove(f.c_str());
}

// numpy's default integers and its halves, from an archive numpy wrote: the printed values are numpy's own
// (int64 arithmetic that wraps, float16 arithmetic), on both backends, and written back as <i8 and <f2.
TEST(CliTest, RunsInt64AndFloat16Arrays) {
  const std::string program = temp("int64_and_half.tile");
  std::ofstream(program) << "function (A[N], H[M]) -> (O, P) {\n  O = A * 3 + 1;\n  P = H * 2 + H;\n}\n";
  const std::string archive = POLYTILE_SOURCE_DIR "/tests/data/int64_and_half.npz";
  const std::string numpy =  // A * 3 + 1 and H * 2 + H in numpy, A = [2^62 + 3, -2^63, 2^53 + 1, -7]
      "O: i64[4] = [-4611686018427387894, -9223372036854775807, 27021597764222980, -20]\n"
      "P: f16[4] = [0.2998, -7.5, inf, 3.5763e-07]\n";
  for (const char* backend : {"cpu", "interp"}) {
    Result r = cli({"run", program, "--inputs", archive, "--backend", backend});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, numpy) << backend;
  }
  Result w = cli({"run", program, "--inputs", archive, "--output", "O=" + temp("o_i64.npy"), "--output", "P=" + temp("p_f16.npy")});
  ASSERT_EQ(w.code, 0) << w.err;
  EXPECT_NE(slurp(temp("o_i64.npy")).find("'descr': '<i8'"), std::string::npos);
  EXPECT_NE(slurp(temp("p_f16.npy")).find("'descr': '<f2'"), std::string::npos);
  EXPECT_EQ(read_npy(temp("o_i64.npy")).get_int(2), 27021597764222980);
  EXPECT_EQ(read_npy(temp("p_f16.npy")).get(1), -7.5);
}

TEST(CliTest, RunWithGeneratedInputsIsDeterministicAndPrints) {
  std::vector<std::string> args = {"run", kExamples + "max_pool_1d.tile", "--random", "I=7", "--seed", "3"};
  Result r1 = cli(args), r2 = cli(args);
  ASSERT_EQ(r1.code, 0) << r1.err;
  EXPECT_EQ(r1.out, r2.out);
  EXPECT_EQ(r1.out.rfind("O: f32[3] = [", 0), 0u) << r1.out;
  Result limited = cli({"run", kExamples + "max_pool_1d.tile", "--random", "I=9:f64", "--limit", "2", "--backend", "interp"});
  EXPECT_NE(limited.out.find("O: f64[4] = ["), std::string::npos) << limited.out;
  EXPECT_NE(limited.out.find(", ... (2 more)]"), std::string::npos) << limited.out;
  Result none = cli({"run", kExamples + "max_pool_1d.tile", "--random", "I=9:f64", "--limit", "0", "--backend", "interp"});
  EXPECT_EQ(none.out, "O: f64[4] = [... (4 more)]\n");
}

// grad leaves out the softmax maxima's adjoint (proven zero) unless asked to keep it; both run and agree.
TEST(CliTest, GradLeavesOutAdjointsProvenZero) {
  const std::string softmax = kExamples + "softmax.tile";
  Result pruned = cli({"grad", softmax}), kept = cli({"grad", softmax, "--keep-zero-adjoints"});
  ASSERT_EQ(pruned.code, 0) << pruned.err;
  ASSERT_EQ(kept.code, 0) << kept.err;
  EXPECT_EQ(pruned.out.find("== M["), std::string::npos) << pruned.out;
  EXPECT_NE(kept.out.find("X[i, j] == M[i, 0] ? GM[i, 0]"), std::string::npos) << kept.out;
  std::ofstream(temp("pruned.tile")) << pruned.out;
  std::ofstream(temp("kept.tile")) << kept.out;
  TensorMap in{{"X", testing::random_buffer({3, 6}, 5)}, {"DO", testing::random_buffer({3, 6}, 6)}};
  Buffer a = interpret(parse_file(temp("pruned.tile")), in).at("DX"), b = interpret(parse_file(temp("kept.tile")), in).at("DX");
  for (int64_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a.get(e), b.get(e), 1e-12);
}

TEST(CliTest, LowerPrintsEveryStage) {
  std::string grad = kExamples + "conv2d_strided_dilated_grad_input.tile";
  std::vector<std::string> shapes = {"--shape", "DO=2x3x3x7", "--shape", "K=2x2x5x7"};
  auto lower = [&](const std::string& stage, bool with_shapes = true) {
    std::vector<std::string> args = {"lower", grad, "--emit", stage};
    if (with_shapes) args.insert(args.end(), shapes.begin(), shapes.end());
    return cli(args);
  };
  Result tile = lower("tile", false);
  EXPECT_EQ(tile.out, print(parse_file(grad)));
  Result isl = lower("isl");
  ASSERT_EQ(isl.code, 0) << isl.err;
  EXPECT_NE(isl.out.find("domain: { S_DI[n, j, y, i, x, ci, co] : "), std::string::npos) << isl.out;
  EXPECT_NE(isl.out.find("read: { S_DI[n, j, y, i, x, ci, co] -> K[o0 = j, o1 = i, o2 = ci, o3 = co]"), std::string::npos)
      << isl.out;
  EXPECT_NE(isl.out.find("bounds: 0 <= co <= 6"), std::string::npos) << isl.out;
  Result reduced = lower("reduced");
  EXPECT_NE(reduced.out.find("DI[v0, v1, v2, v3 : N, 3*OH, 3*OW, CI] = +(DO[v0, 1/3*v1 - 2/3*v4, 1/3*v2 - 2/3*v5, v6]"),
            std::string::npos)
      << reduced.out;
  Result defracted = lower("defracted");
  EXPECT_NE(defracted.out.find("v1_0 < 3, v2_0 < 3;"), std::string::npos) << defracted.out;
  Result verbose = cli({"lower", kExamples + "matmul.tile", "--emit", "defracted", "--verbose"});
  EXPECT_EQ(verbose.code, 0);
  EXPECT_NE(verbose.err.find("polytile: reduce: every output index of C is already a single variable"), std::string::npos);
  EXPECT_NE(verbose.err.find("polytile: defract: contraction C has no fractional coefficients"), std::string::npos);
  EXPECT_NE(cli({"help", "lower"}).out.find("usage: polytile lower"), std::string::npos);
  // The pipeline's later stages come from sched::lower without code generation: the program the schedule
  // computes (the data gradient's kernel transposed for its micro-kernel), the schedule and the loop IR.
  Result lowered = lower("lowered");
  ASSERT_EQ(lowered.code, 0) << lowered.err;
  EXPECT_NE(lowered.out.find("v1_0 < 3, v2_0 < 3;"), std::string::npos) << lowered.out;
  Result loops = lower("loops");
  ASSERT_EQ(loops.code, 0) << loops.err;
  EXPECT_NE(loops.out.find("nest DI.update (update of DI; S("), std::string::npos) << loops.out;
  EXPECT_NE(loops.out.find("for c0 = "), std::string::npos) << loops.out;
  Result ast = lower("ast"), schedule = lower("schedule");
  EXPECT_NE(ast.out.find("// DI.update"), std::string::npos) << ast.out;
  EXPECT_NE(schedule.out.find("// DI.update"), std::string::npos) << schedule.out;
  // Proven stages: --verify adds the proofs and changes nothing printed.
  std::vector<std::string> verified = {"lower", grad, "--emit", "loops", "--verify"};
  verified.insert(verified.end(), shapes.begin(), shapes.end());
  Result proven = cli(verified);
  ASSERT_EQ(proven.code, 0) << proven.err;
  EXPECT_EQ(proven.out, loops.out);
}

TEST(CliTest, GradPrintsARunnableGradientProgram) {
  Result r = cli({"grad", kExamples + "conv2d_strided_dilated.tile"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("function (I[N, H, W, CI], K[KH, KW, CI, CO], DO[N, H/3, W/3, CO]) -> (DI, DK) {", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("v1_0 < 3, v2_0 < 3;"), std::string::npos) << r.out;
  std::string file = temp("grad.tile");
  std::ofstream(file) << r.out;
  Result run = cli({"run", file, "--random", "I=1x9x9x2", "--random", "K=2x2x2x3", "--random", "DO=1x3x3x3"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find("DK: f32[2, 2, 2, 3]"), std::string::npos) << run.out;
  Result raw = cli({"grad", kExamples + "conv2d_strided_dilated.tile", "--emit", "tile", "--wrt", "I"});
  EXPECT_NE(raw.out.find("DI[n, 2*j + 3*y, 2*i + 3*x, ci : N, H, W, CI] = +(K[j, i, ci, co] * DO[n, y, x, co]);"),
            std::string::npos)
      << raw.out;
  EXPECT_EQ(raw.out.find("DK"), std::string::npos);
  Result fwd = cli({"grad", kExamples + "matmul.tile", "--mode", "forward"});
  EXPECT_NE(fwd.out.find("-> (TC)"), std::string::npos) << fwd.out;
  Result mixed = cli({"grad", kExamples + "global_mean.tile", "--mode", "mixed"});
  EXPECT_EQ(mixed.code, 0) << mixed.err;
  EXPECT_NE(cli({"grad", "--help"}).out.find("usage: polytile grad"), std::string::npos);
  std::remove(file.c_str());
}

TEST(CliTest, CheckWarnsAboutEmptyDomainsAndProvesAssign) {
  std::string empty = temp("empty.tile"), assign = temp("assign.tile");
  {
    std::ofstream(empty) << "function (I[N]) -> (O) { O[i : N] = +(I[i + 5]); }";
    std::ofstream(assign) << "function (I[N]) -> (O) { O[i + j : N] = =(I[i]), j < 2; }";
  }
  Result r = cli({"check", empty, "--shape", "I=3"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "polytile: warning: contraction O has an empty domain: it writes nothing\n");
  Result a = cli({"check", assign, "--shape", "I=4"});
  EXPECT_EQ(a.code, 1);
  EXPECT_NE(a.err.find("assign contraction O can write an element more than once: O[1] is written at i=0, j=1 and at i=1, j=0"),
            std::string::npos)
      << a.err;
  std::remove(empty.c_str());
  std::remove(assign.c_str());
}

// --tune: the same values (up to rounding) as the interpreter, from the fastest of the timed variants,
// with each variant's fastest run reported.
TEST(CliTest, RunTunedMatchesTheInterpreter) {
  std::string mm = kExamples + "matmul.tile";
  std::string tuned = temp("tuned.npy"), oracle = temp("oracle.npy");
  Result r = cli({"run", mm, "--random", "A=40x70:f64", "--random", "B=70x90:f64", "--tune", "--output", "C=" + tuned});
  ASSERT_EQ(r.code, 0) << r.err;
  // Each variant's time, then the winner.
  EXPECT_NE(r.err.find("tuning: default: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tuning: loop nests only: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tuning: kept "), std::string::npos) << r.err;
  Result o = cli({"run", mm, "--random", "A=40x70:f64", "--random", "B=70x90:f64", "--backend", "interp", "--output", "C=" + oracle});
  ASSERT_EQ(o.code, 0) << o.err;
  Buffer a = read_npy(tuned), b = read_npy(oracle);
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a.get(e), b.get(e), 1e-12) << e;
}

TEST(CliTest, VersionNamesTheReleaseAndTheCompiler) {
  // "polytile 0.1.0, sources <16 hex digits>, LLVM 16.x.y, isl-..." on one line (no <regex>: GCC 12 warns
  // inside it under the sanitizers' -O2).
  Result r = cli({"--version"});
  EXPECT_EQ(r.code, 0);
  const std::string head = std::string("polytile ") + POLYTILE_VERSION_FOR_TESTS + ", sources ";
  ASSERT_EQ(r.out.compare(0, head.size(), head), 0) << r.out;
  const std::string digest = r.out.substr(head.size(), 16);
  EXPECT_EQ(digest.find_first_not_of("0123456789abcdef"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.compare(head.size() + 16, 11, ", LLVM 16.0"), 0) << r.out;
  EXPECT_NE(r.out.find(", isl-"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
}

// --time reports every compile stage and the median of --repeat runs on stderr, leaving the printed
// outputs as they are; --threads changes no value.
TEST(CliTest, RunTimesStagesAndRepeatedRunsOnStderr) {
  std::string mm = kExamples + "matmul.tile";
  std::vector<std::string> base{"run", mm, "--random", "A=40x30", "--random", "B=30x20"};
  Result plain = cli(base);
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return cli(args);
  };
  Result timed = with({"--time", "--repeat", "4", "--threads", "1", "--no-cache"});  // the JIT's stages
  ASSERT_EQ(timed.code, 0) << timed.err;
  EXPECT_EQ(timed.out, plain.out);
  for (const char* stage : {"compile: passes ", ", schedule ", ", LLVM IR ", ", optimize + JIT ", "run (cpu): median ", " of 4 runs"})
    EXPECT_NE(timed.err.find(stage), std::string::npos) << stage << " missing in: " << timed.err;
  Result interp = with({"--time", "--backend", "interp"});
  ASSERT_EQ(interp.code, 0) << interp.err;
  EXPECT_EQ(interp.err.find("compile:"), std::string::npos) << interp.err;
  EXPECT_NE(interp.err.find("run (interp): median "), std::string::npos) << interp.err;
}

// --profile prints each step of a run (the softmax's row group) with its mean time and share on stderr,
// leaving the printed outputs as they are; the interpreter has no steps to time.
TEST(CliTest, RunProfilesItsStepsOnStderr) {
  std::vector<std::string> base{"run", kExamples + "softmax.tile", "--random", "X=300x40"};
  Result plain = cli(base);
  ASSERT_EQ(plain.code, 0) << plain.err;
  std::vector<std::string> args = base;
  for (const char* a : {"--profile", "--repeat", "3"}) args.push_back(a);
  Result profiled = cli(args);
  ASSERT_EQ(profiled.code, 0) << profiled.err;
  EXPECT_EQ(profiled.out, plain.out);
  EXPECT_NE(profiled.err.find("profile (cpu): where a run's "), std::string::npos) << profiled.err;
  EXPECT_NE(profiled.err.find("the mean of 3 timed runs after one untimed"), std::string::npos) << profiled.err;
  EXPECT_NE(profiled.err.find("%  row group M.init .. O.elementwise\n"), std::string::npos) << profiled.err;
  args.insert(args.end(), {"--backend", "interp"});
  Result interp = cli(args);
  EXPECT_EQ(interp.code, 1);
  EXPECT_NE(interp.err.find("--profile needs the cpu or gpu-sim backend"), std::string::npos) << interp.err;
}

// The kernel cache: a second run of the same program and input types loads it instead of compiling
// and prints the same; a damaged entry is said to be dropped and compiled again; cache info and clear.
TEST(CliTest, RunKeepsCompiledProgramsInTheKernelCache) {
  const char* before = std::getenv("POLYTILE_CACHE_DIR");
  const std::string saved = before ? before : "", dir = temp("kernel_cache");
  std::filesystem::remove_all(dir);
  setenv("POLYTILE_CACHE_DIR", dir.c_str(), 1);
  const std::vector<std::string> args{"run", kExamples + "conv2d_strided_dilated_grad_input.tile", "--random", "DO=2x3x3x7",
                                      "--random", "K=2x2x5x7", "--time"};
  auto with = [&](std::vector<std::string> more) { auto a = args; a.insert(a.end(), more.begin(), more.end()); return a; };
  Result info = cli({"cache", "info"});
  EXPECT_EQ(info.out, "kernel cache " + dir + ": 0 entries, 0 bytes (limit 268435456 bytes)\n");
  Result jit = cli(with({"--no-cache"}));
  EXPECT_EQ(jit.err.find("kernel cache"), std::string::npos) << jit.err;
  Result first = cli(args), second = cli(args);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.err.find("optimize + object"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("; stored in the kernel cache"), std::string::npos) << first.err;
  EXPECT_NE(second.err.find("compile: none, loaded from the kernel cache in "), std::string::npos) << second.err;
  EXPECT_EQ(first.out, jit.out);
  EXPECT_EQ(second.out, jit.out);
  EXPECT_NE(cli({"cache", "info"}).out.find(": 1 entry, "), std::string::npos);
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::fstream entry(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    entry.seekp(200);
    entry.put('#');
  }
  Result damaged = cli(args);
  EXPECT_NE(damaged.err.find("kernel cache: dropped the entry for this program: corrupted (checksum mismatch)"), std::string::npos)
      << damaged.err;
  EXPECT_EQ(damaged.out, jit.out);
  EXPECT_NE(cli(args).err.find("loaded from the kernel cache"), std::string::npos);
  EXPECT_EQ(cli({"cache", "clear"}).out, "kernel cache " + dir + ": removed 1 entry\n");
  // Misuse: one line, exit code 1.
  for (const auto& [bad, what] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"cache"}, "cache: say info or clear"},
           {{"cache", "purge"}, "cache: unknown action 'purge' (info or clear)"},
           {{"cache", "info", "--limit", "3"}, "cache: unknown option --limit"}}) {
    Result r = cli(bad);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  }
  setenv("POLYTILE_CACHE_MAX_MB", "lots", 1);
  Result limit = cli(args);
  unsetenv("POLYTILE_CACHE_MAX_MB");
  EXPECT_EQ(limit.code, 1);
  EXPECT_NE(limit.err.find("POLYTILE_CACHE_MAX_MB"), std::string::npos) << limit.err;
  if (before) setenv("POLYTILE_CACHE_DIR", saved.c_str(), 1);
  else unsetenv("POLYTILE_CACHE_DIR");
}

// The GPU commands without a GPU: compile writes a bundle that reads back, lower shows the kernels'
// mapping and PTX, gpu-sim runs the kernels with GPU semantics and computes what the interpreter computes
// (up to the rounding of reassociated sums), and every misuse is one line with exit code 1.
TEST(CliTest, GpuCommandsWithoutAGpu) {
  const std::string file = kExamples + "conv2d_strided_dilated.tile", dir = temp("bundle");
  Result c = cli({"compile", file, "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7", "-o", dir, "--target", "sm_80"});
  ASSERT_EQ(c.code, 0) << c.err;
  // One kernel: the update writes every element, its accumulators starting at zero (no init kernel).
  EXPECT_NE(c.out.find("1 kernel for sm_80"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("k0_O_update: grid "), std::string::npos) << c.out;
  std::ifstream manifest(dir + "/manifest.txt");
  std::string first;
  std::getline(manifest, first);
  EXPECT_EQ(first, "polytile kernel bundle 1");
  Result loops = cli({"lower", file, "--emit", "loops", "--target", "sm_90", "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7"});
  EXPECT_EQ(loops.code, 0) << loops.err;
  EXPECT_NE(loops.out.find("thread.x for"), std::string::npos) << loops.out;
  Result ptx = cli({"lower", file, "--emit", "ptx", "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7"});
  EXPECT_EQ(ptx.code, 0) << ptx.err;
  EXPECT_NE(ptx.out.find(".target sm_90"), std::string::npos);
  const std::vector<std::string> args{"run", kExamples + "conv2d_strided_dilated_grad_input.tile", "--random", "DO=2x3x3x7:f64",
                                      "--random", "K=2x2x5x7:f64"};
  Result interp = cli([&] { auto a = args; a.insert(a.end(), {"--backend", "interp", "--output", "DI=" + temp("di_interp.npy")}); return a; }());
  Result sim = cli([&] { auto a = args; a.insert(a.end(), {"--backend", "gpu-sim", "--target", "sm_80", "--output", "DI=" + temp("di_sim.npy")}); return a; }());
  ASSERT_EQ(interp.code, 0) << interp.err;
  ASSERT_EQ(sim.code, 0) << sim.err;
  // Equal up to rounding: the kernels' float sums may be reassociated.
  const Buffer di_sim = read_npy(temp("di_sim.npy")), di_interp = read_npy(temp("di_interp.npy"));
  ASSERT_EQ(di_sim.shape(), di_interp.shape());
  EXPECT_TRUE(difference(di_sim, di_interp).within(1e-14)) << difference(di_sim, di_interp).relative;
  for (auto f : {"di_sim.npy", "di_interp.npy"}) std::remove(temp(f).c_str());
  // Misuse.
  one_line_error(cli({"compile", file, "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7"}), "-o DIR is required");
  one_line_error(cli({"compile", file, "--shape", "I=2x9x9x5", "-o", dir}), "K");
  one_line_error(cli({"compile", file, "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7", "-o", dir, "--target", "sm_70"}),
                 "'sm_70' is not an NVIDIA architecture");
  one_line_error(cli({"lower", file, "--emit", "ptx", "--target", "cpu", "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7"}),
                 "needs a GPU --target");
  one_line_error(cli({"run", file, "--random", "I=2x9x9x5", "--random", "K=2x2x5x7", "--backend", "gpu-sim", "--target", "gfx90a"}),
                 "'gfx90a' is not an NVIDIA architecture");
  // --gpu-model: the strategy's sizes. The defaults promote the matmul's inputs to shared tiles and split
  // its long reduction; shared=0 and split-blocks=0 turn both off; threads and tile change the launch.
  // (Integer inputs: the split sums exactly as the interpreter does.)
  const std::string matmul = kExamples + "matmul.tile";
  const std::vector<std::string> mm{"lower", matmul, "--emit", "loops", "--target", "sm_90", "--shape", "A=64x512", "--shape", "B=512x48"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& more) {
    a.insert(a.end(), more.begin(), more.end());
    return cli(a);
  };
  Result tiled = cli(mm);
  ASSERT_EQ(tiled.code, 0) << tiled.err;
  EXPECT_NE(tiled.out.find("shared tile 0 A"), std::string::npos) << tiled.out;
  EXPECT_NE(tiled.out.find("nest C_slices.update"), std::string::npos) << tiled.out;
  Result plain = with(mm, {"--gpu-model", "shared=0,split-blocks=0"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("shared tile"), std::string::npos) << plain.out;
  EXPECT_EQ(plain.out.find("C_slices"), std::string::npos) << plain.out;
  EXPECT_NE(tiled.out.find("accumulators 4x"), std::string::npos) << tiled.out;
  Result direct = with(mm, {"--gpu-model", "accumulators=0"});
  ASSERT_EQ(direct.code, 0) << direct.err;
  EXPECT_EQ(direct.out.find("accumulators"), std::string::npos) << direct.out;
  EXPECT_EQ(direct.out.find("AccIn"), std::string::npos) << direct.out;
  one_line_error(with(mm, {"--gpu-model", "accumulators=2"}), "--gpu-model accumulators must be between 0 and 1");
  // Shared tiles whose columns a warp reads are padded to an odd pitch by default: the data gradient's
  // filter, read by input channel (the warp's lanes) down its rows of 64 output channels, gets 33 of its
  // 32; the matmul's tiles (read along rows or one element by the whole warp) keep their rows, and so does
  // everything with pad=0. fit=1 gives the 48 columns of B 16 threads of 3 columns instead of a warp's 32 of 2.
  EXPECT_NE(tiled.out.find("shared tile 0 A 32x128;"), std::string::npos) << tiled.out;
  EXPECT_EQ(tiled.out.find("pitch"), std::string::npos) << tiled.out;
  const std::vector<std::string> di{"lower", kExamples + "conv2d_strided_dilated_grad_input.tile", "--emit", "loops", "--target",
                                    "sm_90", "--shape", "DO=2x3x3x64", "--shape", "K=2x2x64x64"};
  Result columns = cli(di);
  ASSERT_EQ(columns.code, 0) << columns.err;
  EXPECT_NE(columns.out.find("shared tile 1 K 2x2x64x32 pitch 33"), std::string::npos) << columns.out;
  EXPECT_NE(columns.out.find("shared tile 0 DO 2x4x3x32;"), std::string::npos) << columns.out;
  Result unpadded = with(di, {"--gpu-model", "pad=0"});
  ASSERT_EQ(unpadded.code, 0) << unpadded.err;
  EXPECT_NE(unpadded.out.find("shared tile 1 K 2x2x64x32;"), std::string::npos) << unpadded.out;
  EXPECT_EQ(unpadded.out.find("pitch"), std::string::npos) << unpadded.out;
  EXPECT_NE(tiled.out.find("block 32x8x1; shared"), std::string::npos) << tiled.out;
  Result fitted = with(mm, {"--gpu-model", "fit=1"});
  ASSERT_EQ(fitted.code, 0) << fitted.err;
  EXPECT_NE(fitted.out.find("block 16x16x1; shared"), std::string::npos) << fitted.out;
  EXPECT_NE(fitted.out.find("accumulators 4x3"), std::string::npos) << fitted.out;
  one_line_error(with(mm, {"--gpu-model", "pad=2"}), "--gpu-model pad must be between 0 and 1");
  one_line_error(with(mm, {"--gpu-model", "fit=-1"}), "--gpu-model fit must be between 0 and 1");
  Result small = with(mm, {"--gpu-model", "threads=64,tile=2x2,split-blocks=0"});
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_NE(small.out.find("block 32x2x1"), std::string::npos) << small.out;
  Result split_sim = cli({"run", matmul, "--random", "A=8x300:i32", "--random", "B=300x5:i32", "--backend", "gpu-sim", "--gpu-model",
                          "split-blocks=64,split-slice=16"});
  Result split_interp = cli({"run", matmul, "--random", "A=8x300:i32", "--random", "B=300x5:i32", "--backend", "interp"});
  ASSERT_EQ(split_sim.code, 0) << split_sim.err;
  EXPECT_EQ(split_sim.out, split_interp.out);
  one_line_error(with(mm, {"--gpu-model", "bogus=1"}), "--gpu-model: unknown key 'bogus'");
  one_line_error(with(mm, {"--gpu-model", "shared=1,shared=2"}), "shared is given twice");
  one_line_error(with(mm, {"--gpu-model", "threads=2000"}), "--gpu-model threads must be between 1 and 1024");
  one_line_error(with(mm, {"--gpu-model", "tile=4"}), "expects ROWSxCOLS");
  one_line_error(with(mm, {"--gpu-model", "shared"}), "is not KEY=VALUE");
  one_line_error(cli({"lower", matmul, "--emit", "loops", "--shape", "A=4x4", "--shape", "B=4x4", "--gpu-model", "threads=64"}),
                 "--gpu-model needs a GPU --target");
  one_line_error(cli({"run", matmul, "--random", "A=4x4", "--random", "B=4x4", "--gpu-model", "threads=64"}),
                 "--gpu-model needs the cuda or gpu-sim backend");
  if (cuda::driver_status().state != cuda::DriverStatus::State::ready) {
    // Without a GPU, the cuda backend compiles and then says in one line that there is nothing to run on.
    Result cuda = cli({"run", file, "--random", "I=2x9x9x5", "--random", "K=2x2x5x7", "--backend", "cuda"});
    EXPECT_EQ(cuda.code, 1) << cuda.out;
    EXPECT_EQ(std::count(cuda.err.begin(), cuda.err.end(), '\n'), 1) << cuda.err;
    // Tuning needs the GPU to time on: the same line, before anything is compiled.
    Result tune = cli({"run", file, "--random", "I=2x9x9x5", "--random", "K=2x2x5x7", "--backend", "cuda", "--tune"});
    EXPECT_EQ(tune.code, 1) << tune.out;
    EXPECT_EQ(tune.err, cuda.err);
  }
}

// compile --target cpu: an object with one C entry point and its header (the C program that links
// them is tests/aot_test.c); the same program gives the same bytes; misuse is one line with exit code 1.
TEST(CliTest, CompileForTheCpuWritesAnObjectAndAHeader) {
  const std::string file = kExamples + "conv2d_strided_dilated.tile", dir = temp("aot"), prefix = dir + "/seed_conv";
  std::filesystem::create_directories(dir);
  const std::vector<std::string> args{"compile", file, "--target", "cpu", "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7"};
  auto with = [&](std::vector<std::string> more) { auto a = args; a.insert(a.end(), more.begin(), more.end()); return a; };
  Result c = cli(with({"-o", prefix}));
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("entry point seed_conv for CPU "), std::string::npos) << c.out;
  const std::string object = slurp(prefix + ".o"), header = slurp(prefix + ".h");
  EXPECT_EQ(object.substr(0, 4), "\x7f" "ELF");
  EXPECT_NE(header.find("int seed_conv(const float* I, const float* K, float* O, void* workspace, polytile_parallel_for "
                        "parallel_for, void* parallel_user);"), std::string::npos) << header;
  EXPECT_NE(header.find("O  output f32[2, 3, 3, 7]"), std::string::npos) << header;
  EXPECT_NE(header.find("#define SEED_CONV_WORKSPACE_BYTES 0"), std::string::npos) << header;
  // --name, and determinism: another path, the same entry point, the same bytes.
  Result again = cli(with({"-o", prefix + "_again", "--name", "seed_conv"}));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(slurp(prefix + "_again.o") == object) << "the object differs";
  EXPECT_EQ(slurp(prefix + "_again.h"), header);
  one_line_error(cli(with({})), "-o PATH is required");
  one_line_error(cli(with({"-o", dir + "/2conv"})), "'2conv' is not a C identifier");
  one_line_error(cli(with({"-o", prefix, "--name", "float"})), "'float' is reserved in C or C++");
  one_line_error(cli(with({"-o", prefix, "--gpu-model", "threads=64"})), "--gpu-model needs a GPU --target");
  one_line_error(cli({"compile", file, "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7", "-o", prefix, "--name", "x"}),
                 "--name needs --target cpu");
  one_line_error(cli(with({"-o", prefix + ".h/conv"})), "cannot create the directory " + prefix + ".h");  // a file
}

TEST(CliTest, UserErrorsAreOneLineWithExitCodeOne) {
  Buffer i64ish = testing::random_buffer({3}, 1);
  write_npy(temp("v.npy"), i64ish);
  std::string bad_npy = temp("bad.npy");
  {
    std::ofstream f(bad_npy);
    f << "not numpy";
  }
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  std::string mm = kExamples + "matmul.tile";
  std::string huge = temp("huge.tile"), deep = temp("deep.tile"), cond_assign = temp("cond_assign.tile");
  {
    std::ofstream c(cond_assign);
    c << "function (A[N], B[N], C[N]) -> (O) { O[] = =(A[i] == B[i] ? C[i]); }";
    std::ofstream f(huge);
    f << "function (A[N]) -> (O) { O[i : N] = +(A[i]), j < 4611686018427387904; }";
    std::ofstream g(deep);
    g << "function (A[N]) -> (O) { O = " << std::string(10000, '(') << "A" << std::string(10000, ')') << "; }";
  }
  std::vector<Case> cases = {
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"check"}, "check: missing FILE.tile"},
      {{"check", "/nonexistent.tile"}, "cannot open Tile file /nonexistent.tile"},
      {{"check", POLYTILE_SOURCE_DIR "/tests/data/syntax_error.tile"}, "syntax_error.tile:3:14: expected an aggregation"},
      {{"check", mm, "--shape", "A=3x4"}, "missing input B"},
      {{"check", mm, "--shape", "A=3xq"}, "input A: bad shape '3xq'"},
      {{"check", mm, "--shape", "A=3x4x"}, "input A: bad shape '3x4x'"},
      {{"check", "/tmp"}, "cannot read Tile file /tmp: it is a directory"},
      {{"check", mm, "--bogus", "1"}, "check: unknown option --bogus"},
      {{"run", mm, "--random", "A=3x4"}, "missing input B"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--tune", "--backend", "interp"}, "--tune needs the cpu or cuda backend"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--tune", "--backend", "gpu-sim"}, "--tune needs the cpu or cuda backend"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=5x2"}, "dims disagree: axis 0 of input B is 5 but K = 4"},
      {{"run", mm, "--random", "A=3x4:u8", "--random", "B=4x2"}, "unknown dtype 'u8'"},
      {{"run", mm, "--input", "A=" + temp("v.npy"), "--random", "B=3x2"}, "input A is declared with rank 2 but got shape (3)"},
      {{"run", mm, "--input", "A=" + bad_npy}, "is not a .npy file"},
      {{"run", mm, "--input", "A=/nonexistent.npy"}, "cannot open .npy file /nonexistent.npy"},
      {{"run", mm, "--input", "A=/tmp", "--random", "B=4x2"}, "cannot read .npy file /tmp: it is a directory"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--limit", "-1"}, "--limit -1: give a count of values from 0"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--backend", "gpu"}, "unknown backend 'gpu'"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--output", "Z=z.npy"}, "the program has no output named Z"},
      {{"run", mm, "--random", "A=3x4", "--random", "A=3x4"}, "input A is given twice"},
      {{"run", mm, "--random"}, "option --random needs a value"},
      {{"run", mm, "--random", "A"}, "--random expects NAME=VALUE"},
      {{"run", mm, "--seed", "x"}, "--seed expects an integer"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--threads", "0"}, "--threads 0: give a thread count from 1"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--repeat", "0"}, "--repeat 0: give a count from 1"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--threads", "2", "--backend", "interp"},
       "--threads needs the cpu or gpu-sim backend"},
      {{"run", mm, "extra.tile"}, "unexpected argument 'extra.tile'"},
      {{"run", mm, "--random", "A=3x4", "--random", "B=4x2", "--output", "C=/nonexistent/c.npy"},
       "cannot write .npy file /nonexistent/c.npy"},
      {{"lower", mm}, "lower: --emit STAGE is required"},
      {{"grad", mm, "--mode", "sideways"}, "grad: unknown mode 'sideways'"},
      {{"grad", mm, "--emit", "ptx"}, "grad: unknown stage 'ptx'"},
      {{"grad", mm, "--wrt", "C"}, "cannot differentiate with respect to C: it is not an input"},
      {{"grad", kExamples + "max_over_axis.tile", "--wrt", "Q"}, "cannot differentiate with respect to Q"},
      {{"grad", mm, "--wrt", "A,B,A"}, "cannot differentiate with respect to A twice"},
      {{"lower", mm, "--emit", "sass"}, "lower: unknown stage 'sass'"},
      {{"lower", mm, "--emit", "isl"}, "lower --emit isl needs --shape"},
      {{"lower", mm, "--emit", "isl", "--shape", "A=3x4", "--shape", "B=5x2"}, "dims disagree"},
      // Sizes that are well-formed but impossible are refused before anything runs or is allocated.
      {{"run", mm, "--random", "A=67108864x1024", "--random", "B=1024x2"}, "more than this machine's"},
      {{"run", huge, "--random", "A=3"}, "ranges over a box of about"},
      {{"run", huge, "--random", "A=3", "--backend", "interp"}, "too many candidate points"},
      {{"check", deep}, "expression nested more than 256 levels deep"},
      // assign is static: check, the interpreter and the cpu backend all refuse a cond that could collide.
      {{"check", cond_assign, "--shape", "A=4", "--shape", "B=4", "--shape", "C=4"}, "can write an element more than once"},
      {{"run", cond_assign, "--random", "A=4", "--random", "B=4", "--random", "C=4", "--backend", "interp"}, "more than once"},
      {{"run", cond_assign, "--random", "A=4", "--random", "B=4", "--random", "C=4"}, "more than once"},
  };
  for (const auto& c : cases) {
    Result r = cli(c.args);
    EXPECT_EQ(r.code, 1) << c.needle;
    EXPECT_EQ(r.err.rfind("polytile: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in: " << r.err;
  }
  std::remove(temp("v.npy").c_str());
  std::remove(bad_npy.c_str());
}

}  // namespace
}  // namespace polytile
