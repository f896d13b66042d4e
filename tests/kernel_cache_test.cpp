// The persistent kernel cache and exported objects loaded in process: every example and gradient runs
// through export + load exactly as the JIT runs it; entries are hit across cache instances (as across
// processes), and truncated, corrupted, foreign or garbage entries are dropped and recompiled, never run;
// the size limit drops the least recently used; concurrent writers leave one whole entry.
#include "polytile/kernel_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "polytile/autodiff.h"
#include "polytile/error.h"
#include "polytile/parser.h"
#include "test_util.h"

namespace polytile::cpu {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  // Under the process's id, so that two runs of the tests at once do not share a cache.
  const std::string dir = ::testing::TempDir() + "/polytile_kernel_cache_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(dir);
  return dir;
}

using testing::types_of;

TensorMap inputs_for(const testing::Shapes& shapes, DType dtype, uint64_t seed) {
  TensorMap in;
  uint64_t k = 0;
  for (const auto& [name, shape] : shapes)
    in[name] = Buffer::from_values(dtype, shape, testing::random_buffer(shape, seed + 131 * k++).to_doubles());
  return in;
}

// The loaded object computes exactly what the JIT computes (the same nests, linked differently).
void expect_identical(const TensorMap& got, const TensorMap& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    const Buffer& g = got.at(name);
    ASSERT_EQ(g.type_str(), w.type_str()) << what << " " << name;
    for (int64_t e = 0; e < w.size(); ++e) {
      const double a = g.get(e), b = w.get(e);
      ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << what << " " << name << "[" << e << "]: " << a << " vs " << b;
    }
  }
}

TEST(KernelCacheTest, EveryExampleAndGradientThroughExportAndLoad) {
  KernelCache cache(fresh_dir("examples"));
  int n = 0;
  for (const auto& [path, shapes] : testing::examples_with_shapes(POLYTILE_SOURCE_DIR "/examples")) {
    Program p = parse_file(path.string());
    std::vector<std::pair<std::string, Program>> programs{{path.filename().string(), p}};
    try {
      programs.emplace_back("gradient of " + path.filename().string(), ad::vjp(p).program);
    } catch (const UserError&) {  // not differentiable (an integer program)
    }
    for (const auto& [what, program] : programs) {
      TensorMap in = inputs_for(shapes, DType::f64, 11);
      const TensorMap forward = interpret(p, in);
      for (const auto& o : program.inputs)  // the gradient's seeds D<output>: the outputs' values
        if (!in.count(o.name)) in[o.name] = forward.at(o.name.substr(1));
      CompileOptions options;
      options.threads = 2;
      KernelCache::Result r = cache.get(program, types_of(in), options);
      ASSERT_FALSE(r.hit) << what;
      ASSERT_TRUE(r.not_stored.empty()) << r.not_stored;
      expect_identical(r.program->run(in, 2), run(program, in, options), what);
      ++n;
    }
  }
  EXPECT_GE(n, 30);
  EXPECT_EQ(static_cast<int>(cache.info().entries), n);
}

TEST(KernelCacheTest, ASecondCacheOnTheDirectoryHits) {
  const std::string dir = fresh_dir("hits");
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  TensorMap in = inputs_for({{"I", {2, 9, 9, 5}}, {"K", {2, 2, 5, 7}}}, DType::f32, 3);
  KernelCache::Result first = KernelCache(dir).get(p, types_of(in));
  EXPECT_FALSE(first.hit);
  {  // The entry's key names the compiler that made it: another build of polytile makes other keys.
    std::ifstream f(fs::directory_iterator(dir)->path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    EXPECT_NE(bytes.find("|" + compiler_identity() + "\n"), std::string::npos) << bytes.substr(0, 400);
  }
  KernelCache::Result second = KernelCache(dir).get(p, types_of(in));  // as a second process would
  EXPECT_TRUE(second.hit);
  EXPECT_TRUE(second.dropped.empty()) << second.dropped;
  expect_identical(second.program->run(in), first.program->run(in), "hit");
  expect_identical(second.program->run(in), run(p, in), "hit against the JIT");
  // Other shapes, another dtype, another program text: other entries.
  TensorMap bigger = inputs_for({{"I", {3, 9, 9, 5}}, {"K", {2, 2, 5, 7}}}, DType::f32, 3);
  EXPECT_FALSE(KernelCache(dir).get(p, types_of(bigger)).hit);
  TensorMap f64 = inputs_for({{"I", {2, 9, 9, 5}}, {"K", {2, 2, 5, 7}}}, DType::f64, 3);
  EXPECT_FALSE(KernelCache(dir).get(p, types_of(f64)).hit);
  Program renamed = parse_program("function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (P) {"
                                  "  P[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }");
  EXPECT_FALSE(KernelCache(dir).get(renamed, types_of(in)).hit);
  KernelCache cache(dir);
  EXPECT_EQ(cache.info().entries, 4u);
  EXPECT_GT(cache.info().bytes, 0u);
  EXPECT_EQ(cache.clear(), 4u);
  EXPECT_EQ(cache.info().entries, 0u);
  EXPECT_FALSE(cache.get(p, types_of(in)).hit);
}

// A loaded program run into outputs it was given: a buffer of the compiled type is overwritten in place
// (what polytile run --repeat does, with no fresh pages at every run); one of another shape is replaced,
// and a missing one added. Each run computes what the JIT computes.
TEST(KernelCacheTest, ALoadedProgramRunsIntoTheOutputsItIsGiven) {
  Program p = parse_program("function (A[M, K], B[K, N]) -> (C, D) { C[m, n : M, N] = +(A[m, k] * B[k, n]); D = exp(A); }");
  TensorMap in = inputs_for({{"A", {37, 19}}, {"B", {19, 23}}}, DType::f32, 5);
  KernelCache::Result r = KernelCache(fresh_dir("in_place")).get(p, types_of(in));
  const TensorMap want = run(p, in);
  TensorMap outputs;
  outputs["C"] = Buffer(DType::f32, {37, 23});
  outputs["D"] = Buffer(DType::f32, {1, 2});  // another shape: replaced
  const void* c = outputs.at("C").data();
  r.program->run(in, outputs, 2);
  EXPECT_EQ(outputs.at("C").data(), c) << "C was not written in place";
  expect_identical(outputs, want, "the first run");
  const void* d = outputs.at("D").data();
  TensorMap other = inputs_for({{"A", {37, 19}}, {"B", {19, 23}}}, DType::f32, 6);
  r.program->run(other, outputs, 2);
  EXPECT_EQ(outputs.at("C").data(), c);
  EXPECT_EQ(outputs.at("D").data(), d) << "D was not reused by the second run";
  expect_identical(outputs, run(p, other), "the second run, in place");
  TensorMap none;
  r.program->run(in, none);
  expect_identical(none, want, "a run into an empty map");
}

// Damaged entries: each is detected, removed and compiled again; the next get hits the new entry.
TEST(KernelCacheTest, DamagedEntriesAreCompiledAgainNeverRun) {
  const std::string dir = fresh_dir("damaged");
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  Program q = parse_program("function (A[M, K], B[K, N]) -> (D) { D[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in = inputs_for({{"A", {7, 5}}, {"B", {5, 3}}}, DType::f32, 5);
  KernelCache cache(dir);
  cache.get(q, types_of(in));
  const fs::path q_entry = fs::directory_iterator(dir)->path();
  cache.get(p, types_of(in));
  fs::path entry;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path() != q_entry) entry = f.path();
  ASSERT_FALSE(entry.empty());
  std::string good;
  {
    std::ifstream f(entry, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto damage = [&](const std::string& bytes) {
    std::ofstream f(entry, std::ios::binary | std::ios::trunc);
    f << bytes;
  };
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x20;  // inside the machine code
  std::string q_bytes;
  {
    std::ifstream f(q_entry, std::ios::binary);
    q_bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  const std::vector<std::pair<std::string, std::string>> cases{
      {good.substr(0, good.size() / 3), "truncated"},
      {flipped, "corrupted (checksum mismatch)"},
      {q_bytes, "written for another program"},
      {"hello\n", "not a kernel cache entry"},
      {"", "not a kernel cache entry"}};
  const TensorMap want = run(p, in);
  for (const auto& [bytes, why] : cases) {
    damage(bytes);
    KernelCache::Result r = cache.get(p, types_of(in));
    EXPECT_FALSE(r.hit) << why;
    EXPECT_NE(r.dropped.find(why), std::string::npos) << r.dropped;
    expect_identical(r.program->run(in), want, why);
    KernelCache::Result again = cache.get(p, types_of(in));
    EXPECT_TRUE(again.hit) << why;
    EXPECT_TRUE(again.dropped.empty()) << again.dropped;
  }
}

TEST(KernelCacheTest, TheLimitDropsTheLeastRecentlyUsed) {
  const std::string dir = fresh_dir("limit");
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  TensorMap a = inputs_for({{"A", {7, 5}}, {"B", {5, 3}}}, DType::f32, 5), b = inputs_for({{"A", {8, 5}}, {"B", {5, 3}}}, DType::f32, 5),
            c = inputs_for({{"A", {9, 5}}, {"B", {5, 3}}}, DType::f32, 5);
  KernelCache::Result ra = KernelCache(dir).get(p, types_of(a));
  const uint64_t one = KernelCache(dir).info().bytes;
  KernelCache cache(dir, one * 5 / 2);  // room for two entries
  auto age = [&](int seconds_ago) {  // every entry so far: used `seconds_ago`
    for (const auto& f : fs::directory_iterator(dir))
      fs::last_write_time(f.path(), fs::file_time_type::clock::now() - std::chrono::seconds(seconds_ago));
  };
  age(100);
  cache.get(p, types_of(b));
  age(50);
  EXPECT_TRUE(cache.get(p, types_of(a)).hit);  // a is now the more recently used
  cache.get(p, types_of(c));                   // three entries: b goes
  EXPECT_EQ(cache.info().entries, 2u);
  EXPECT_TRUE(cache.get(p, types_of(a)).hit);
  EXPECT_TRUE(cache.get(p, types_of(c)).hit);
  EXPECT_FALSE(cache.get(p, types_of(b)).hit);
}

TEST(KernelCacheTest, ConcurrentWritersLeaveOneWholeEntry) {
  const std::string dir = fresh_dir("concurrent");
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/conv2d_strided_dilated.tile");
  TensorMap in = inputs_for({{"I", {2, 9, 9, 5}}, {"K", {2, 2, 5, 7}}}, DType::f32, 9);
  const TensorMap want = run(p, in);
  std::vector<std::thread> threads;
  std::vector<TensorMap> got(4);
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { got[t] = KernelCache(dir).get(p, types_of(in)).program->run(in, 1); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) expect_identical(g, want, "a concurrent get");
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);  // no temporary file left behind
  EXPECT_TRUE(KernelCache(dir).get(p, types_of(in)).hit);
}

TEST(KernelCacheTest, UserErrorsAndAnUnwritableCache) {
  EXPECT_THROW(KernelCache(""), UserError);
  Program p = parse_file(POLYTILE_SOURCE_DIR "/examples/matmul.tile");
  TensorMap in = inputs_for({{"A", {7, 5}}, {"B", {5, 3}}}, DType::f32, 5);
  KernelCache cache(fresh_dir("errors"));
  CompileOptions tuned;
  tuned.tune = true;
  EXPECT_THROW(cache.get(p, types_of(in), tuned), UserError);
  CompileOptions gpu;
  gpu.target = sched::gpu_target("sm_90");
  EXPECT_THROW(cache.get(p, types_of(in), gpu), UserError);
  EXPECT_THROW(cache.get(p, {{"A", {DType::f32, {7, 5}}}}), UserError);  // B's type is missing
  auto loaded = cache.get(p, types_of(in)).program;
  EXPECT_THROW(loaded->run({{"A", in.at("A")}}), UserError);
  EXPECT_THROW(loaded->run({{"A", in.at("A")}, {"B", Buffer(DType::f32, {5, 4})}}), UserError);
  EXPECT_THROW(loaded->run(in, -1), UserError);
  CompileOptions negative;
  negative.threads = -2;
  EXPECT_THROW(cache.get(p, types_of(in), negative), UserError);
  // A cache directory that cannot be made (a file is in the way): the program still compiles and runs.
  const std::string file = fresh_dir("a_file");
  std::ofstream(file) << "x";
  KernelCache::Result r = KernelCache(file + "/cache").get(p, types_of(in));
  EXPECT_NE(r.not_stored.find("cannot create"), std::string::npos) << r.not_stored;
  expect_identical(r.program->run(in), run(p, in), "an unwritable cache");
}

}  // namespace
}  // namespace polytile::cpu
