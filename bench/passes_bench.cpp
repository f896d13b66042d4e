// Compile-time cost of the polyhedral stage on the post's strided dilated convolution gradient:
// reduce + defract (the lattice work), and the isl analysis of the result.
#include <benchmark/benchmark.h>

#include "polytile/parser.h"
#include "polytile/passes.h"
#include "polytile/polyhedral.h"

namespace {

using namespace polytile;

const char* kSeedGradient =
    "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {\n"
    "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]);\n"
    "}\n";

struct Fixture {
  Program program = parse_program(kSeedGradient);
  ProgramTypes types = infer_types(program, {{"DO", {DType::f32, {8, 19, 19, 64}}}, {"K", {DType::f32, {2, 2, 64, 64}}}});
};

void BM_ReduceDefractSeedGradient(benchmark::State& state) {
  Fixture f;
  poly::PassContext ctx{&f.types};
  for (auto _ : state) benchmark::DoNotOptimize(poly::reduce_and_defract(f.program, ctx));
}
BENCHMARK(BM_ReduceDefractSeedGradient)->Unit(benchmark::kMicrosecond);

void BM_ReduceSeedGradient(benchmark::State& state) {
  Fixture f;
  poly::PassContext ctx{&f.types};
  const auto& c = std::get<Contraction>(f.program.statements[0]);
  for (auto _ : state) benchmark::DoNotOptimize(poly::reduce(c, ctx));
}
BENCHMARK(BM_ReduceSeedGradient)->Unit(benchmark::kMicrosecond);

void BM_IslAnalysisOfDefractedGradient(benchmark::State& state) {
  Fixture f;
  Program d = poly::reduce_and_defract(f.program, poly::PassContext{&f.types});
  for (auto _ : state) benchmark::DoNotOptimize(poly::analyze_program(d, f.types));
}
BENCHMARK(BM_IslAnalysisOfDefractedGradient)->Unit(benchmark::kMicrosecond);

void BM_ParseSeedGradient(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(parse_program(kSeedGradient));
}
BENCHMARK(BM_ParseSeedGradient)->Unit(benchmark::kMicrosecond);

}  // namespace


