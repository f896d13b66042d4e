// What the headers promise about threads, exercised by several threads at once (and, in build-tsan/ from
// ./setup.sh --tsan, under ThreadSanitizer: `ctest -L threads`): concurrent runs of one compiled program
// on the callers' own memory and of a row group whose temporaries live in chunk memory, concurrent
// compiles of the same and of different programs with the program cache being cleared meanwhile,
// concurrent users of one persistent kernel cache directory, the interpreter and parser in parallel, and
// PTX compiles whose kernels compile on threads of their own.
// Every result is checked against the interpreter.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include "polytile/cpu.h"
#include "polytile/interpreter.h"
#include "polytile/kernel_cache.h"
#include "polytile/parser.h"
#include "polytile/ptx.h"
#include "test_util.h"

// What ThreadSanitizer must not report (it reads this function of the binary it runs in; elsewhere unused).
// oneTBB and LLVM come from the distribution, not built with the sanitizer, so synchronization inside
// them is invisible to it: every hand-off of a task between TBB's threads looks like a race on the task's
// memory (reports with TBB's library on either stack are TBB's), and LLVM matches a regular expression it
// compiled once into a function-local static whose guard's fast path is an atomic load inside libLLVM.
// Races between the callers' threads in polytile's own code (caches, scratch pools, compilation) have
// neither on their stacks and are reported: a counter incremented without a lock in cpu::compile is.
extern "C" const char* __tsan_default_suppressions() { return "race:libtbb.so\nrace:llvm_regexec\n"; }
// The suppressions match only stacks ThreadSanitizer can restore. With the default history, a long LLVM
// compilation on a TBB thread overwrites the record of the earlier write ("failed to restore the stack"),
// and the report then shows no library at all; the largest history keeps those stacks.
extern "C" const char* __tsan_default_options() { return "history_size=7"; }

namespace polytile {
namespace {

constexpr int kThreads = 4;

const char* kConv =
    "function (I[N, H, W, CI], K[KH, KW, CI, CO], B[CO]) -> (R) {"
    "  O[n, y, x, co : N, H - 1, W - 1, CO] = +(I[n, y + j, x + i, ci] * K[j, i, ci, co]);"
    "  R = relu(O + B); }";

TensorMap conv_inputs(uint64_t seed) {
  return {{"I", testing::random_buffer({2, 9, 9, 4}, seed, DType::f32)},
          {"K", testing::random_buffer({2, 2, 4, 8}, seed + 1, DType::f32)},
          {"B", testing::random_buffer({8}, seed + 2, DType::f32)}};
}

using testing::types_of;

bool close(const Buffer& got, const Buffer& want) {
  return got.shape() == want.shape() && difference(got, want).within(1e-5);
}

// Runs body(k) on kThreads threads at once (released together) and returns what each reported.
std::vector<std::string> on_threads(const std::function<std::string(int)>& body) {
  std::vector<std::string> failures(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k)
    threads.emplace_back([&, k] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      try {
        failures[static_cast<size_t>(k)] = body(k);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(k)] = std::string("threw: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return failures;
}

void expect_none(const std::vector<std::string>& failures) {
  for (size_t k = 0; k < failures.size(); ++k) EXPECT_EQ(failures[k], "") << "thread " << k;
}

// One CompiledProgram, four threads, each running it repeatedly on views of its own buffers (with two TBB
// threads per run for the parallel loops).
TEST(ThreadsTest, ConcurrentRunsOfOneProgramOnCallersMemory) {
  Program p = parse_program(kConv);
  cpu::CompileOptions options;
  options.threads = 2;
  auto compiled = cpu::compile(p, types_of(conv_inputs(1)), options);
  expect_none(on_threads([&](int k) -> std::string {
    TensorMap in = conv_inputs(100 + static_cast<uint64_t>(k));
    const Buffer want = interpret(p, in).at("R");
    Buffer out(want.dtype(), want.shape());
    ViewMap inputs, outputs{{"R", TensorView::of(out)}};
    for (auto& [name, b] : in) inputs[name] = TensorView::of(b);
    for (int r = 0; r < 8; ++r) {
      compiled->run(inputs, outputs);
      if (!close(out, want)) return "run " + std::to_string(r) + " differs from the interpreter";
    }
    return "";
  }));
}

// A softmax's row group, whose exponentials, maxima and sums live in chunk memory (sched::ChunkTensor):
// four threads run it at once, each run's chunks on two TBB threads, every chunk in the memory of the
// thread that runs it.
TEST(ThreadsTest, ConcurrentRunsOfARowGroupInChunkMemory) {
  Program p = parse_program(
      "function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); O = E / S; }");
  cpu::CompileOptions options;
  options.threads = 2;
  options.target.cpu.l2_bytes = 16384;  // chunks of a few rows: many chunks per run
  options.target.threads = 2;
  const TensorMap shapes{{"X", testing::random_buffer({96, 70}, 1, DType::f32)}};
  auto compiled = cpu::compile(p, types_of(shapes), options);
  ASSERT_EQ(compiled->schedule().groups.size(), 1u);
  ASSERT_EQ(compiled->schedule().groups[0].chunk_tensors.size(), 3u);
  expect_none(on_threads([&](int k) -> std::string {
    TensorMap in{{"X", testing::random_buffer({96, 70}, 200 + static_cast<uint64_t>(k), DType::f32)}};
    const Buffer want = interpret(p, in).at("O");
    TensorMap out;
    for (int r = 0; r < 8; ++r) {
      compiled->run(in, out);
      if (!close(out.at("O"), want)) return "run " + std::to_string(r) + " differs from the interpreter";
    }
    return "";
  }));
}

// The same program compiled by four threads at once: each gets a program that computes it (perhaps its own
// compilation, perhaps the one the cache kept); different programs at once, while another thread clears
// the cache.
TEST(ThreadsTest, ConcurrentCompilesAndCacheClears) {
  cpu::clear_cache();
  Program p = parse_program(kConv);
  const TensorMap in = conv_inputs(7);
  const Buffer want = interpret(p, in).at("R");
  expect_none(on_threads([&](int) -> std::string {
    cpu::CompileOptions options;
    options.threads = 1;
    auto c = cpu::compile(p, types_of(in), options);
    return close(c->run(in).at("R"), want) ? "" : "a concurrent compile computes something else";
  }));
  std::atomic<bool> done{false};
  std::thread clearer([&] {
    while (!done.load()) {
      cpu::clear_cache();
      std::this_thread::yield();
    }
  });
  expect_none(on_threads([&](int k) -> std::string {
    // Scale factors make four different programs (four cache keys).
    Program q = parse_program("function (A[M, K], B[K, N]) -> (C) { T[i, j : M, N] = +(A[i, k] * B[k, j]); C = T * " +
                              std::to_string(k + 2) + "; }");
    TensorMap qin{{"A", testing::random_buffer({17, 9}, 30 + static_cast<uint64_t>(k), DType::f32)},
                  {"B", testing::random_buffer({9, 13}, 40 + static_cast<uint64_t>(k), DType::f32)}};
    for (int r = 0; r < 3; ++r) {
      cpu::CompileOptions options;
      options.threads = 1;
      if (!close(cpu::compile(q, types_of(qin), options)->run(qin).at("C"), interpret(q, qin).at("C")))
        return "program " + std::to_string(k) + " differs from the interpreter";
    }
    return "";
  }));
  done = true;
  clearer.join();
}

// Four threads share one cache directory: the first users of an entry may each compile and store it (one
// atomic rename wins), later ones load it; every result is the interpreter's.
TEST(ThreadsTest, ConcurrentUsersOfOneKernelCacheDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("polytile_threads_test_cache_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Program p = parse_program(kConv);
  const TensorMap in = conv_inputs(11);
  const Buffer want = interpret(p, in).at("R");
  std::atomic<int> hits{0};
  for (int round = 0; round < 2; ++round)
    expect_none(on_threads([&](int) -> std::string {
      cpu::KernelCache cache(dir.string());
      cpu::CompileOptions options;
      options.threads = 1;
      cpu::KernelCache::Result r = cache.get(p, types_of(in), options);
      if (r.hit) ++hits;
      if (!r.dropped.empty()) return "an entry was dropped: " + r.dropped;
      return close(r.program->run(in, 1).at("R"), want) ? "" : "a cached program differs from the interpreter";
    }));
  EXPECT_EQ(hits.load(), kThreads) << "the second round loads what the first stored";
  EXPECT_EQ(cpu::KernelCache(dir.string()).info().entries, 1u);
  std::filesystem::remove_all(dir);
}

// ptx::compile compiles each kernel on a thread of its own while its caller schedules the next nests;
// callers on four threads compile a weight gradient's three kernels (partial sums and their
// initialization, their sum, which starts its accumulators at zero) at once, and each gets the PTX one
// compile alone gives.
TEST(ThreadsTest, ConcurrentPtxCompilesOfKernelsOnThreadsOfTheirOwn) {
  Program p = parse_program(
      "function (I[N, H, W, CI], DO[N, H, W, CO]) -> (DK) {"
      "  DK[j, i, ci, co : 3, 3, CI, CO] = +(I[n, y + j - 1, x + i - 1, ci] * DO[n, y, x, co]); }");
  const std::map<std::string, TensorType> types{{"I", {DType::f32, {2, 12, 12, 8}}}, {"DO", {DType::f32, {2, 12, 12, 16}}}};
  ptx::Options options;
  options.model = sched::GpuModel{};
  options.model->min_slice = 16;  // the sum split into slices at this size
  const ptx::Compiled alone = ptx::compile(p, types, options);
  ASSERT_EQ(alone.bundle.kernels.size(), 3u) << alone.bundle.manifest();
  expect_none(on_threads([&](int) -> std::string {
    const ptx::Compiled c = ptx::compile(p, types, options);
    if (c.bundle.ptx != alone.bundle.ptx) return "other PTX";
    return c.llvm_ir == alone.llvm_ir ? "" : "other LLVM IR";
  }));
}

// The front end and the interpreter are plain functions of their arguments.
TEST(ThreadsTest, ParsingAndInterpretingInParallel) {
  Program p = parse_program(kConv);
  const TensorMap in = conv_inputs(21);
  const Buffer want = interpret(p, in).at("R");
  expect_none(on_threads([&](int) -> std::string {
    for (int r = 0; r < 3; ++r) {
      Program q = parse_program(kConv);
      if (print(q) != print(p)) return "parsed differently";
      if (!close(interpret(q, in).at("R"), want)) return "interpreted differently";
    }
    return "";
  }));
}

}  // namespace
}  // namespace polytile
