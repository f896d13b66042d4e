// The machine's own limits, measured in the same run as the kernels so that every rate can be read as a
// fraction of them (bench/run_bench.py does): "peak/fma" -- the f32 FMA throughput of independent
// register-resident FMA chains on every bench thread, with the widest vectors the CPU has (AVX-512, else
// AVX2 + FMA, chosen when the program runs; those of $POLYTILE_BENCH_CPU where it names one) -- and
// "peak/triad" -- STREAM's triad a[i] = b[i] + s * c[i] over arrays of 128 MiB (STREAM's rule: each array at
// least 4x the last-level cache, 32 MiB on the machines measured here; with 16 MiB arrays, the size of the
// softmax and max pool tensors, part of the 48 MiB stayed in the L3 and a repetition measured anything from
// 35 to 78 GB/s), split across the bench threads, counted as STREAM counts it (two reads and one write per
// element). And "peak/shared_writes": how fast the threads write lines that every one of them has just read,
// the case of a micro-kernel's packed panels, which every thread reads and the next run copies again. It
// tells a run's hours apart on a guest whose host moves its vCPUs: on the 2-core Zen 4 guest of 2026-11-29,
// 1.2 MiB per thread took 0.05-0.10 ms where the two sat near each other and 0.48 ms where they sat far apart
// (docs/benchmarks.md).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "bench_threads.h"
#include "polytile/buffer.h"
#include "polytile/cpu.h"

namespace {

// Independent accumulators, enough to cover the FMA latency on two ports (4-5 cycles) and few enough to
// stay in the registers with the two operands: 16 of AVX-512's 32, 12 of AVX2's 16 (16 chains there spill
// to the stack and measure the stores: 113 instead of 190 GFLOP/s on a 2-core Zen 3).
constexpr int kChains = 16, kChainsAvx2 = 12;
constexpr int64_t kSteps = 1 << 22;

struct Shape {
  int lanes, chains;  // of one FMA; of the kernel
};

// part(t) on each of the bench threads, part(0) on the caller's; returns when all are done.
template <class Part>
void on_bench_threads(int threads, const Part& part) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(part, t);
  part(0);
  for (auto& th : pool) th.join();
}

// Each returns the lanes of one FMA and its chains; `sink` keeps the results alive.
__attribute__((target("avx512f"))) Shape fma_chains_avx512(float* sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  for (int64_t s = 0; s < kSteps; ++s)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  _mm512_storeu_ps(sink, total);
  return {16, kChains};
}

__attribute__((target("avx2,fma"))) Shape fma_chains_avx2(float* sink) {
  __m256 acc[kChainsAvx2];
  for (int c = 0; c < kChainsAvx2; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c) * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (int64_t s = 0; s < kSteps; ++s)
    for (int c = 0; c < kChainsAvx2; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
  __m256 total = acc[0];
  for (int c = 1; c < kChainsAvx2; ++c) total = _mm256_add_ps(total, acc[c]);
  _mm256_storeu_ps(sink, total);
  return {8, kChainsAvx2};
}

Shape fma_chains_scalar(float* sink) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = static_cast<float>(c) * 1e-3f;
  for (int64_t s = 0; s < kSteps; ++s)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * 0.999999f + 1e-7f;
  float total = 0;
  for (int c = 0; c < kChains; ++c) total += acc[c];
  sink[0] = total;
  return {1, kChains};
}

void BM_FmaPeak(benchmark::State& state) {
  __builtin_cpu_init();
  // With $POLYTILE_BENCH_CPU (cpu_bench.cpp), the widest vectors of the named CPU's instruction set: the
  // peak of the code the bench times (AVX2's on an AVX-512 machine; half the AVX-512 peak on a core with
  // two 512-bit FMA units, the same on a Zen 4, whose 512-bit FMAs run as two halves).
  const int bits = *bench_cpu() ? polytile::cpu::cpu_target(bench_cpu()).cpu.vector_bits : 512;
  auto kernel = bits >= 512 && __builtin_cpu_supports("avx512f")                                  ? fma_chains_avx512
                : bits >= 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? fma_chains_avx2
                                                                                                  : fma_chains_scalar;
  const int threads = bench_threads();
  std::vector<std::vector<float>> sinks(static_cast<size_t>(threads), std::vector<float>(16));
  Shape shape{1, kChains};
  for (auto _ : state) {
    on_bench_threads(threads, [&](int t) {
      const Shape s = kernel(sinks[static_cast<size_t>(t)].data());
      if (t == 0) shape = s;
    });
    benchmark::DoNotOptimize(sinks);
  }
  const double flops = 2.0 * shape.lanes * shape.chains * static_cast<double>(kSteps) * threads;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["lanes"] = shape.lanes;
}

void BM_Triad(benchmark::State& state) {
  const int64_t n = int64_t{32} << 20;  // 128 MiB of f32 per array
  // On the memory polytile's tensors get (Buffer: huge pages where the kernel gives them), so that the
  // limit is the one they can reach.
  polytile::Buffer a(polytile::DType::f32, {n}), b(polytile::DType::f32, {n}), c(polytile::DType::f32, {n});
  std::fill_n(static_cast<float*>(b.data()), n, 1.0f);
  std::fill_n(static_cast<float*>(c.data()), n, 2.0f);
  const int threads = bench_threads();
  auto part = [&](int t) {
    const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    float *pa = static_cast<float*>(a.data()), *pb = static_cast<float*>(b.data()), *pc = static_cast<float*>(c.data());
    for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  };
  for (auto _ : state) {
    on_bench_threads(threads, part);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(3.0 * 4.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Each bench thread reads all of a 2.4 MiB buffer, then, after a barrier, writes its own part of it
// through the caches (a[i] = b[i] + 1 from a second buffer: no memset or memcpy, whose string
// instructions may skip reading the lines); the time is from that barrier to the last writer's end.
void BM_SharedWrites(benchmark::State& state) {
  const int64_t n = int64_t{600} << 10;  // 2.4 MiB of f32
  const int threads = bench_threads();
  polytile::Buffer shared(polytile::DType::f32, {n}), source(polytile::DType::f32, {n});
  float *a = static_cast<float*>(shared.data()), *b = static_cast<float*>(source.data());
  std::fill_n(a, n, 0.0f);
  std::fill_n(b, n, 1.0f);
  for (auto _ : state) {
    std::barrier sync(threads);
    std::chrono::steady_clock::time_point start, end;
    on_bench_threads(threads, [&](int t) {
      uint32_t bits = 0;  // every element, as integers: a reduction the compiler vectorizes
      const uint32_t* words = reinterpret_cast<const uint32_t*>(a);
      for (int64_t i = 0; i < n; ++i) bits |= words[i];
      benchmark::DoNotOptimize(bits);
      sync.arrive_and_wait();
      if (t == 0) start = std::chrono::steady_clock::now();
      for (int64_t i = n * t / threads, hi = n * (t + 1) / threads; i < hi; ++i) a[i] = b[i] + 1.0f;
      sync.arrive_and_wait();
      if (t == 0) end = std::chrono::steady_clock::now();
    });
    state.SetIterationTime(std::chrono::duration<double>(end - start).count());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(4.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_FmaPeak)->Name("peak/fma")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Triad)->Name("peak/triad")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SharedWrites)->Name("peak/shared_writes")->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace
