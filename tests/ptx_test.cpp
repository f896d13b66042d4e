// The PTX code generator without a GPU: every example, gradient program and generated contraction
// compiles for sm_80 and sm_90 into a bundle whose PTX ptxas assembles (0 bytes spilled, registers and
// shared memory within the target's budget), deterministically; bundles round-trip through their files;
// and every error a user can cause (a bad target, no libdevice when math is called, PTX ptxas rejects) is a
// UserError. The kernels' results are checked with GPU semantics on the host in cpu_test and, on a machine
// with a GPU, by cuda_runtime_test's bundles and `polytile run --backend cuda`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <unistd.h>

#include "generators.h"
#include "polytile/autodiff.h"
#include "polytile/error.h"
#include "polytile/parser.h"
#include "polytile/ptx.h"
#include "test_util.h"

namespace polytile::ptx {
namespace {

using testing::Shapes;

std::map<std::string, TensorType> f32_types(const Shapes& shapes) {
  std::map<std::string, TensorType> t;
  for (const auto& [name, shape] : shapes) t[name] = TensorType{DType::f32, shape};
  return t;
}

// The programs of the gate: the examples at their documented shapes and their reverse-mode gradients.
std::vector<std::pair<std::string, std::pair<Program, std::map<std::string, TensorType>>>> gate_programs() {
  std::vector<std::pair<std::string, std::pair<Program, std::map<std::string, TensorType>>>> out;
  for (const auto& [path, shapes] : testing::examples_with_shapes(POLYTILE_SOURCE_DIR "/examples")) {
    Program p = parse_file(path.string());
    auto types = f32_types(shapes);
    out.push_back({path.filename().string(), {p, types}});
    // The gradient: inputs plus the adjoint of every output.
    ad::Result g = ad::vjp(p);
    auto gtypes = types;
    ProgramTypes pt = infer_types(p, types);
    for (size_t o = 0; o < p.outputs.size(); ++o)
      gtypes[g.program.inputs[p.inputs.size() + o].name] = pt.tensors.at(p.outputs[o]);
    out.push_back({"gradient of " + path.filename().string(), {g.program, gtypes}});
  }
  return out;
}

// ptxas accepts the PTX; every kernel of the manifest is in its report, spills nothing and fits the
// target's registers and shared memory.
void expect_assembles(const Compiled& c, const std::string& arch, const std::string& what) {
  Assembled a = assemble(c.bundle.ptx, arch);
  ASSERT_EQ(a.kernels.size(), c.bundle.kernels.size()) << what << "\n" << a.log;
  for (const auto& k : c.bundle.kernels) {
    auto r = std::find_if(a.kernels.begin(), a.kernels.end(), [&](const KernelResources& x) { return x.name == k.name; });
    ASSERT_NE(r, a.kernels.end()) << what << ": ptxas does not report " << k.name << "\n" << a.log;
    EXPECT_EQ(r->spill_stores, 0) << what << " " << k.name << "\n" << a.log;
    EXPECT_EQ(r->spill_loads, 0) << what << " " << k.name << "\n" << a.log;
    EXPECT_GT(r->registers, 0) << what << " " << k.name << "\n" << a.log;
    EXPECT_LE(r->registers, 255) << what << " " << k.name;
    EXPECT_LE(r->shared_bytes, sched::GpuModel::static_shared_limit) << what << " " << k.name;
    EXPECT_LE(k.block[0] * k.block[1] * k.block[2], 1024) << what << " " << k.name;
  }
}

// How many times `what` occurs in `text`.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A padded 3x3 convolution: its register tiles' rows are guarded at the image's edge.
Program padded_conv() {
  return parse_program(
      "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
      "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }");
}

bool have_toolkit() {
  if (!find_ptxas() || !find_libdevice()) {
    std::cout << "skipped: the CUDA toolkit's ptxas or libdevice is not here (CUDA_PATH, /usr/local/cuda)\n";
    return false;
  }
  return true;
}

TEST(PtxTest, EveryExampleAndGradientAssemblesForSm80AndSm90) {
  if (!have_toolkit()) GTEST_SKIP() << "no CUDA toolkit";
  int kernels = 0;
  for (const auto& [what, program] : gate_programs()) {
    for (const char* arch : {"sm_80", "sm_90"}) {
      Options o;
      o.arch = arch;
      Compiled c = compile(program.first, program.second, o);
      ASSERT_EQ(c.bundle.kernels.size(), c.schedule.nests.size()) << what;
      EXPECT_NE(c.bundle.ptx.find(std::string(".target ") + arch), std::string::npos) << what;
      expect_assembles(c, arch, what + " for " + arch);
      kernels += static_cast<int>(c.bundle.kernels.size());
    }
  }
  EXPECT_GE(kernels, 100);
}

TEST(PtxTest, GeneratedContractionsAssemble) {
  if (!have_toolkit()) GTEST_SKIP() << "no CUDA toolkit";
  const uint64_t seed = 737373;
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 40; ++iter) {
    testing::generators::Case cs = testing::generators::any_case(rng);
    Program p = parse_program(cs.text);
    auto types = f32_types(cs.shapes);
    for (auto& [name, t] : types) t.dtype = DType::f64;
    Options o;
    o.arch = iter % 2 ? "sm_80" : "sm_90";
    expect_assembles(compile(p, types, o), o.arch, "seed " + std::to_string(seed) + " iteration " + std::to_string(iter) + ": " + cs.text);
  }
}

// f16 (loads widen to f32, every operation rounds to a half -- LLVM turns an f32 operation on widened halves
// rounded back into the native mul.rn.f16, which is the same -- and contractions accumulate in f32) and
// i64 (64-bit arithmetic, floor division) assemble for both architectures.
TEST(PtxTest, HalfAndInt64ProgramsAssemble) {
  if (!have_toolkit()) GTEST_SKIP() << "no CUDA toolkit";
  const std::vector<std::pair<std::string, DType>> programs = {
      {"function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }", DType::f16},
      {"function (A[M, K], B[K, N]) -> (C) { T = A * 0.5 - A * A; C[i, j : M, N] = >(T[i, k] * B[k, j]); }", DType::f16},
      {"function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }", DType::i64},
      {"function (A[M, K], B[K, N]) -> (C) { C = A / 3 + A % 7 - abs(A); }", DType::i64},
  };
  for (const auto& [text, dtype] : programs) {
    auto types = f32_types({{"A", {40, 24}}, {"B", {24, 40}}});
    for (auto& [name, t] : types) t.dtype = dtype;
    for (const char* arch : {"sm_80", "sm_90"}) {
      Options o;
      o.arch = arch;
      Compiled c = compile(parse_program(text), types, o);
      if (dtype == DType::f16) {
        EXPECT_NE(c.bundle.ptx.find("ld.global.nc.b16"), std::string::npos) << text;  // halves in memory
        EXPECT_NE(c.bundle.ptx.find("cvt.rn.f16.f32"), std::string::npos) << text;   // results rounded
      }
      expect_assembles(c, arch, text + " in " + to_string(dtype) + " for " + arch);
    }
  }
}

// Each kernel compiles in a module of its own (while the next nests are scheduled) and the PTX texts join
// into one module: one header, and what each kept of libdevice (sin's tables) under its own name, so that
// ptxas sees no symbol twice.
TEST(PtxTest, KernelsCompiledApartJoinIntoOneModule) {
  if (!have_toolkit()) GTEST_SKIP() << "no CUDA toolkit";
  Program p = parse_program(
      "function (A[M, N]) -> (S, R) { T = sin(A) * 3; U = sin(T); S[i : M] = +(U[i, j]); V = cos(T) + sin(A); R[j : N] = >(V[i, j]); }");
  Compiled c = compile(p, f32_types({{"A", {30, 40}}}));
  ASSERT_GE(c.bundle.kernels.size(), 3u);
  EXPECT_EQ(count(c.bundle.ptx, ".version "), 1u);
  EXPECT_EQ(count(c.bundle.ptx, ".address_size "), 1u);
  size_t tables = 0;
  for (const auto& k : c.bundle.kernels) {
    EXPECT_EQ(count(c.bundle.ptx, ".entry " + k.name + "("), 1u) << k.name;
    tables += count(c.bundle.ptx, ".global .align 4 .b8 " + k.name + "___cudart_i2opi_f[");
  }
  EXPECT_GE(tables, 2u) << c.bundle.ptx.substr(0, 2000);
  expect_assembles(c, "sm_90", "three kernels calling sin");
}

// A padded convolution's register tile has guarded rows (the image's edge). Masked (masked=1), the rows
// run without branches and the filter's two values per input channel are loaded from the shared tile once
// for the tile's four rows, not once per row: per step, 4 + 2 shared loads for 8 FMAs instead of 4 + 8.
// (The masked rows' results against the interpreter, under GPU semantics with NaN in the shared tiles:
// CpuTest.EveryGpuTuningCandidateUnderGpuSemantics and CpuTest.MaskedAndBranchingRegisterTilesAgree.)
TEST(PtxTest, MaskedRegisterTilesLoadSharedOperandsOnce) {
  Program p = padded_conv();
  auto types = f32_types({{"I", {1, 4, 32, 64}}, {"K", {3, 3, 64, 64}}});
  Options masked, branching;
  masked.model = sched::GpuModel{};
  masked.model->masked_registers = true;
  masked.model->unswitch_registers = false;  // every thread takes the masked code (TEST below: unswitched)
  branching.model = sched::GpuModel{};
  branching.model->unswitch_registers = false;
  const std::string a = compile(p, types, masked).bundle.ptx, b = compile(p, types, branching).bundle.ptx;
  const size_t loads_a = count(a, "ld.shared.f32"), fmas_a = count(a, "fma.rn.f32");
  const size_t loads_b = count(b, "ld.shared.f32"), fmas_b = count(b, "fma.rn.f32");
  ASSERT_GT(fmas_a, 0u);
  ASSERT_GT(fmas_b, 0u);
  EXPECT_EQ(loads_a * 8, fmas_a * 6) << a;   // 4 rows of the input and 2 columns of the filter per 8 FMAs
  EXPECT_EQ(loads_b * 8, fmas_b * 12) << b;  // the filter's columns again in each row's branch
  expect_assembles(compile(p, types, masked), "sm_90", "the masked register tile");
}

// The same convolution's reduction loop unswitched (the default): where all four rows of a thread are in
// range, a copy of the loop without their guards loads the input's rows as vectors along its input
// channels (4 steps of the unrolled loop: one ld.shared.v4 per row) and the filter's 2 columns once for
// the 4 rows: 4 + 8 shared loads per 32 FMAs, and no branch; the loop with the guards is kept for the
// threads at the image's edge. (Results: every GPU-semantics test in cpu_test, whose threads at the edges
// and inside take the two versions.)
TEST(PtxTest, UnguardedRegisterTilesWhereEveryPositionIsInRange) {
  Program p = padded_conv();
  auto types = f32_types({{"I", {1, 4, 32, 64}}, {"K", {3, 3, 64, 64}}});
  Options guarded;
  guarded.model = sched::GpuModel{};
  guarded.model->unswitch_registers = false;
  const std::string a = compile(p, types).bundle.ptx, b = compile(p, types, guarded).bundle.ptx;
  const size_t fmas_b = count(b, "fma.rn.f32"), scalar_b = count(b, "ld.shared.f32");
  ASSERT_GT(fmas_b, 0u);
  EXPECT_EQ(count(b, "ld.shared.v4.f32"), 0u) << b;
  // The unswitched kernel is the guarded one plus the unguarded loop: 32 FMAs per 4 unrolled steps,
  // with 4 vector loads and 8 scalar ones.
  const size_t fmas_full = count(a, "fma.rn.f32") - fmas_b;
  ASSERT_GT(fmas_full, 0u) << a;
  EXPECT_EQ(count(a, "ld.shared.v4.f32") * 32, fmas_full * 4) << a;
  EXPECT_EQ((count(a, "ld.shared.f32") - scalar_b) * 32, fmas_full * 8) << a;
  expect_assembles(compile(p, types), "sm_90", "the unswitched register tile");
}

// A thread's register columns consecutive instead of a warp apart (GpuModel::interleave_columns = false):
// a matmul's 4x4 tile then reads its 4 columns of B in each reduction step as one vector from shared
// memory (ld.shared.v4.f32) instead of 4 scalars, besides its rows of A (one vector per row for 4 steps,
// as before). The results: every test under GPU semantics (the second model has consecutive columns).
TEST(PtxTest, ConsecutiveColumnsLoadSharedTilesAsVectors) {
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  const auto types = f32_types({{"A", {256, 256}}, {"B", {256, 256}}});
  Options consecutive;
  consecutive.model = sched::GpuModel{};
  consecutive.model->interleave_columns = false;
  const std::string a = compile(p, types).bundle.ptx, b = compile(p, types, consecutive).bundle.ptx;
  ASSERT_EQ(count(a, "fma.rn.f32"), count(b, "fma.rn.f32"));
  const size_t fmas = count(a, "fma.rn.f32");
  ASSERT_GT(fmas, 0u);
  // Per 16 FMAs (a step of the 4x4 tile): interleaved, 4 scalar loads of B and one vector of A per row for
  // 4 steps; consecutive, one vector of B.
  EXPECT_EQ(count(a, "ld.shared.f32") * 16, fmas * 4) << a;
  EXPECT_EQ(count(b, "ld.shared.f32"), 0u) << b;
  EXPECT_EQ(count(b, "ld.shared.v4.f32") * 16, fmas * 2) << b;
  expect_assembles(compile(p, types, consecutive), "sm_90", "the matmul with consecutive columns");
}

// The GPU benchmark's programs (bench/gpu/cases.txt: each case's program and, for bwd_data / bwd_weights,
// its gradient with respect to the first / second input) at the benchmark's shapes.
std::vector<std::pair<std::string, std::pair<Program, std::map<std::string, TensorType>>>> gpu_bench_programs() {
  std::vector<std::pair<std::string, std::pair<Program, std::map<std::string, TensorType>>>> out;
  std::ifstream cases(POLYTILE_SOURCE_DIR "/bench/gpu/cases.txt");
  EXPECT_TRUE(cases) << "bench/gpu/cases.txt";
  for (std::string line; std::getline(cases, line);) {
    std::istringstream fields(line);
    std::string name, directions, file;
    if (line.empty() || line[0] == '#' || !(fields >> name >> directions >> file)) continue;
    const Program p = parse_file(POLYTILE_SOURCE_DIR "/" + file);
    std::string specs;
    std::getline(fields, specs);  // A=1024x1024 B=...
    const auto types = f32_types(testing::shapes_from_args(specs));
    std::istringstream ds(directions);
    for (std::string direction; std::getline(ds, direction, ',');) {
      if (direction == "fwd") {
        out.push_back({name + " fwd", {p, types}});
        continue;
      }
      ad::Options ao;
      ao.wrt = {p.inputs[direction == "bwd_data" ? 0 : 1].name};
      ad::Result g = ad::vjp(p, ao);
      auto gtypes = types;
      gtypes[g.program.inputs.back().name] = infer_types(p, types).tensors.at(p.outputs[0]);
      out.push_back({name + " " + direction, {g.program, gtypes}});
    }
  }
  return out;
}

// The gate of the GPU benchmark's kernels (convolutions in every direction, matrix products): with the
// registers fitted (GpuModel::fit_registers, the default), none spills for sm_80 or sm_90 -- at ptxas's
// own register choice three of them did (the 256- and 96-channel weight gradients' partial sums, the
// 96-channel data gradient). Compile's own report is the bundle's: the same kernels, registers and spills
// as ptxas over the whole module.
TEST(PtxTest, GpuBenchmarkKernelsSpillNothing) {
  if (!have_toolkit()) GTEST_SKIP() << "no CUDA toolkit";
  const auto programs = gpu_bench_programs();
  ASSERT_EQ(programs.size(), 23u);
  int ceilings = 0;
  for (const auto& [what, program] : programs) {
    for (const char* arch : {"sm_80", "sm_90"}) {
      Options o;
      o.arch = arch;
      Compiled c = compile(program.first, program.second, o);
      expect_assembles(c, arch, what + " for " + arch);
      Assembled a = assemble(c.bundle.ptx, arch);
      ASSERT_EQ(c.resources.size(), c.bundle.kernels.size()) << what;
      for (size_t k = 0; k < c.resources.size(); ++k) {
        const KernelResources& r = c.resources[k];
        EXPECT_EQ(r.name, c.bundle.kernels[k].name) << what;
        auto whole = std::find_if(a.kernels.begin(), a.kernels.end(), [&](const KernelResources& x) { return x.name == r.name; });
        ASSERT_NE(whole, a.kernels.end()) << what;
        EXPECT_EQ(whole->registers, r.registers) << what << " " << r.name;
        EXPECT_EQ(count(c.bundle.ptx, ".minnctapersm " + std::to_string(r.min_blocks_per_sm) + "\n"), r.min_blocks_per_sm ? 1u : 0u)
            << what << " " << r.name;
        ceilings += r.min_blocks_per_sm > 0;
      }
    }
  }
  EXPECT_GT(ceilings, 0);  // what the next test shows in one case: the fitting is what removes the spills
}

// A kernel that spills at ptxas's own register choice gets a ceiling: the 96-channel 3x3 conv's data
// gradient takes 64 registers for its 256 threads (4 blocks per multiprocessor) and spills; asked for
// fewer blocks (`.minnctapersm`), it takes more registers and spills nothing. Without fitting, the PTX has
// no ceiling and compile assembles nothing.
TEST(PtxTest, KernelsThatSpillGetARegisterCeiling) {
  if (!have_toolkit()) GTEST_SKIP() << "no CUDA toolkit";
  Program p = padded_conv();
  ad::Options ao;
  ao.wrt = {"I"};
  Program g = ad::vjp(p, ao).program;
  const auto types = f32_types({{"I", {32, 28, 28, 96}}, {"K", {3, 3, 96, 96}}, {"DO", {32, 28, 28, 96}}});
  Options fixed;
  fixed.model = sched::GpuModel{};
  fixed.model->fit_registers = false;
  for (const char* arch : {"sm_80", "sm_90"}) {
    fixed.arch = arch;
    Compiled plain = compile(g, types, fixed);
    EXPECT_TRUE(plain.resources.empty());
    EXPECT_EQ(count(plain.bundle.ptx, ".minnctapersm"), 0u);
    Assembled a = assemble(plain.bundle.ptx, arch);
    ASSERT_EQ(a.kernels.size(), 1u) << a.log;
    EXPECT_GT(a.kernels[0].spill_stores, 0) << arch << ": the precondition (ptxas's own choice spills)\n" << a.log;

    Options fitted;
    fitted.arch = arch;
    Compiled c = compile(g, types, fitted);
    ASSERT_EQ(c.resources.size(), 1u);
    const KernelResources& r = c.resources[0];
    EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << arch;
    EXPECT_GT(r.registers, a.kernels[0].registers) << arch;
    // At most the blocks per multiprocessor its own choice allowed (64K registers, 256 threads).
    EXPECT_GE(r.min_blocks_per_sm, 1) << arch;
    EXPECT_LE(r.min_blocks_per_sm, 65536 / ((a.kernels[0].registers + 7) / 8 * 8 * 256)) << arch;
    expect_assembles(c, arch, std::string("the 96-channel data gradient for ") + arch);
    // Nothing else changed: the same PTX but for the ceiling's line, once.
    const std::string ceiling = ".minnctapersm " + std::to_string(r.min_blocks_per_sm) + "\n";
    ASSERT_EQ(count(c.bundle.ptx, ceiling), 1u) << arch;
    std::string without = c.bundle.ptx;
    without.erase(without.find(ceiling), ceiling.size());
    EXPECT_EQ(without, plain.bundle.ptx) << arch;
  }
}

// Shared tiles are copied in 16-byte vectors where their rows and the input's are whole vectors: the
// matmul's tiles of A (32 x 64 floats per block) and B (64 x 128) as ld.global.nc.v4.f32 and
// st.shared.v4.f32, each thread loading 4 vectors (64 bytes) before it stores them; with rows of 30
// floats, element by element only.
// (Results, both ways: CpuTest.SharedTileCopiesMoveVectorsWhereAligned.)
TEST(PtxTest, SharedTilesCopiedInVectors) {
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  const std::string aligned = compile(p, f32_types({{"A", {4096, 4096}}, {"B", {4096, 4096}}})).bundle.ptx;
  // Per step: A's 512 vectors and B's 2048 over 256 threads, 2 and 8 per thread, at most 4 (64 bytes) at a time.
  EXPECT_EQ(count(aligned, "ld.global.nc.v4.f32"), 6u) << aligned;
  EXPECT_EQ(count(aligned, "st.shared.v4.f32"), 6u);
  // The origins (32 * c0, 64 * c2, 128 * c1) are multiples of 4 and the runtime's buffers 256-byte
  // aligned: no element-by-element copy on the device.
  EXPECT_EQ(count(aligned, "ld.global.nc.f32"), 0u);
  const std::string odd = compile(p, f32_types({{"A", {64, 30}}, {"B", {30, 30}}})).bundle.ptx;
  EXPECT_EQ(count(odd, ".v4.f32"), 0u) << odd;
  EXPECT_GT(count(odd, "st.shared.f32"), 0u);
}

// Kernels compute indices in 32 bits (a GPU needs two instructions or more for a 64-bit add, compare or
// multiply) where every tensor they touch fits in 30 bits, and in 64 bits where one does not (a 2^31-element
// input) or the model says so (index32=0). The 32-bit code's results: every test under GPU semantics.
// (The copies' checks of a tensor's address for 16-byte alignment compare its low bits, a 64-bit pointer's;
// they are no index arithmetic and not counted.)
TEST(PtxTest, KernelIndicesIn32BitsWhereTheyFit) {
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  auto compares = [](const std::string& ir, const std::string& type) {
    size_t n = 0;
    std::set<std::string> pointers, low_bits;  // values of ptrtoint, and those ANDed with 15
    std::istringstream lines(ir);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string name, eq, op, ty, operand;
      words >> name >> eq >> op;
      if (eq != "=") continue;
      if (op == "ptrtoint") pointers.insert(name);
      if (op == "and" && words >> ty >> operand && !operand.empty() && pointers.count(operand.substr(0, operand.size() - 1)) &&
          line.find(", 15") != std::string::npos)
        low_bits.insert(name);
      if (op == "icmp" && line.find(" " + type + " ") != std::string::npos) {
        std::string predicate;
        words >> predicate >> ty >> operand;
        if (!low_bits.count(operand.substr(0, operand.size() - 1))) ++n;
      }
    }
    return n;
  };
  const auto small = f32_types({{"A", {64, 32}}, {"B", {32, 48}}});
  const std::string narrow = compile(p, small).llvm_ir;
  EXPECT_EQ(compares(narrow, "i64"), 0u) << narrow;
  EXPECT_GT(compares(narrow, "i32"), 0u);
  Options wide;
  wide.model = sched::GpuModel{};
  wide.model->index32 = false;
  EXPECT_GT(compares(compile(p, small, wide).llvm_ir, "i64"), 0u);
  const std::string large = compile(p, f32_types({{"A", {65536, 32768}}, {"B", {32768, 16}}})).llvm_ir;
  EXPECT_GT(compares(large, "i64"), 0u) << "A has 2^31 elements: its offsets need 64 bits";
}

// A kernel's innermost sequential loop (the matmul's reduction around its 4x4 register tile) is unrolled
// as the model says: 4 times by default (64 FMAs in the PTX), 2, or not (1; 0 leaves it to LLVM, which
// does not here).
TEST(PtxTest, ReductionLoopsUnrolledAsTheModelSays) {
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  const auto types = f32_types({{"A", {256, 256}}, {"B", {256, 256}}});
  auto fmas = [&](int unroll) {
    Options o;
    o.model = sched::GpuModel{};
    o.model->unroll = unroll;
    return count(compile(p, types, o).bundle.ptx, "fma.rn.f32");
  };
  EXPECT_EQ(fmas(4), 64u);
  EXPECT_EQ(fmas(2), 32u);
  EXPECT_EQ(fmas(1), 16u);
  EXPECT_EQ(fmas(0), 16u);
}

// Tuning compiles every candidate model and keeps the one the measurement finds fastest (here a stand-in
// for the GPU's timing, which these machines lack): its bundle is the one compile gives with that model,
// the report lists every candidate, the winner first; a tie keeps the earlier; a base that already fits
// its threads is not tried twice.
TEST(PtxTest, TuneKeepsTheFastestCandidate) {
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  auto types = f32_types({{"I", {2, 9, 9, 5}}, {"K", {2, 2, 5, 7}}});
  const auto candidates = sched::gpu_tuning_candidates();
  ASSERT_EQ(candidates.size(), 6u);
  EXPECT_EQ(candidates[0].first, "default");
  EXPECT_EQ(candidates[1].first, "masked=1");
  EXPECT_TRUE(candidates[1].second.masked_registers);
  EXPECT_FALSE(candidates[0].second.masked_registers);
  EXPECT_EQ(candidates[4].first, "fit=1,tile=4x8,index32=0");
  EXPECT_TRUE(candidates[4].second.fit_threads);
  EXPECT_EQ(candidates[4].second.tile_rows, 4);
  EXPECT_EQ(candidates[4].second.tile_cols, 8);
  const std::vector<double> times = {5, 6, 3, 4, 1, 2};
  size_t calls = 0;
  std::vector<std::string> progress;
  Tuned t = tune(p, types, Options{}, [&](const Compiled&) { return times.at(calls++); },
                 [&](const std::string& c, double) { progress.push_back(c); });
  EXPECT_EQ(calls, 6u);
  ASSERT_EQ(t.candidates.size(), 6u);
  EXPECT_EQ(t.candidates.front(), std::make_pair(std::string("fit=1,tile=4x8,index32=0"), 1.0));
  EXPECT_EQ(progress, (std::vector<std::string>{"default", "masked=1", "fit=1", "fit=1,tile=8x4,index32=0", "fit=1,tile=4x8,index32=0", "fit=1,tile=8x8,index32=0"}));
  Options chosen;
  chosen.model = candidates[4].second;
  EXPECT_EQ(t.best.bundle.ptx, compile(p, types, chosen).bundle.ptx);
  EXPECT_EQ(t.best.bundle.manifest(), compile(p, types, chosen).bundle.manifest());
  EXPECT_NE(t.best.bundle.ptx, compile(p, types).bundle.ptx);  // the models differ on this program
  // A tie keeps the earlier candidate: the default.
  Tuned tie = tune(p, types, Options{}, [](const Compiled&) { return 1.0; });
  EXPECT_EQ(tie.candidates.front().first, "default");
  EXPECT_EQ(tie.best.bundle.ptx, compile(p, types).bundle.ptx);
  sched::GpuModel fitted;
  fitted.fit_threads = true;
  const auto around = sched::gpu_tuning_candidates(fitted);
  ASSERT_EQ(around.size(), 5u);
  EXPECT_EQ(around[0].first, "as given");
  EXPECT_EQ(around[1].first, "masked=1");
  EXPECT_EQ(around[2].first, "fit=1,tile=8x4,index32=0");
}

// The same program gives the same PTX and manifest; a bundle written and read back is the same bundle.
TEST(PtxTest, DeterministicAndRoundTrips) {
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  auto types = f32_types({{"I", {2, 9, 9, 5}}, {"K", {2, 2, 5, 7}}});
  Compiled a = compile(p, types), b = compile(p, types);
  EXPECT_EQ(a.bundle.ptx, b.bundle.ptx);
  EXPECT_EQ(a.bundle.manifest(), b.bundle.manifest());
  EXPECT_EQ(a.llvm_ir, b.llvm_ir);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("polytile_ptx_test_bundle_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  a.bundle.write(dir.string());
  cuda::KernelBundle back = cuda::KernelBundle::read(dir.string());
  EXPECT_EQ(back.manifest(), a.bundle.manifest());
  EXPECT_EQ(back.ptx, a.bundle.ptx);
  std::filesystem::remove_all(dir);
  // Buffers: inputs, outputs, then the scratch tensors the kernels touch.
  ASSERT_GE(a.bundle.buffers.size(), 3u);
  EXPECT_EQ(a.bundle.buffers[0].role, cuda::BundleBuffer::Role::input);
  EXPECT_EQ(a.bundle.buffers[2].name, "O");
  EXPECT_EQ(a.bundle.buffers[2].role, cuda::BundleBuffer::Role::output);
}

TEST(PtxTest, UserErrors) {
  Program plain = parse_program("function (A[N]) -> (O) { O = A * 2; }");
  Program math = parse_program("function (A[N]) -> (O) { O = exp(A); }");
  auto types = f32_types({{"A", {100}}});
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no UserError)";
  };
  for (const char* bad : {"sm_70", "sm_9", "compute_90", "sm_90a", ""}) {
    Options o;
    o.arch = bad;
    EXPECT_NE(message([&] { compile(plain, types, o); }).find("is not an NVIDIA architecture"), std::string::npos) << bad;
  }
  Options no_libdevice;
  no_libdevice.libdevice = "/nonexistent/libdevice.10.bc";
  std::string m = message([&] { compile(math, types, no_libdevice); });
  EXPECT_NE(m.find("calls exp"), std::string::npos) << m;
  EXPECT_NE(m.find("/nonexistent/libdevice.10.bc"), std::string::npos) << m;
  EXPECT_NO_THROW(compile(plain, types, no_libdevice));  // no math, no libdevice needed
  // A shape mismatch is the front end's user error, as on the CPU.
  EXPECT_THROW(compile(parse_program("function (A[N], B[N]) -> (O) { O = A + B; }"), f32_types({{"A", {3}}, {"B", {4}}})), UserError);
  if (find_ptxas()) {
    m = message([] { assemble(".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus; }\n", "sm_90"); });
    EXPECT_NE(m.find("ptxas rejected the PTX for sm_90"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace polytile::ptx
