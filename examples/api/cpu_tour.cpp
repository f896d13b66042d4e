// Compiling to native code: the schedule (isl schedule tree and loops; here a register-blocked
// micro-kernel with the bias + relu consumer fused into it), the layout pass, the LLVM IR, and runs on
// the CPU -- into preallocated outputs and into the caller's own memory -- checked against the reference
// interpreter; then an object file for this CPU, the kernel cache, a softmax's row group and a tuned
// compile.
#include <polytile/cpu.h>
#include <polytile/interpreter.h>
#include <polytile/kernel_cache.h>
#include <polytile/lower.h>
#include <polytile/parser.h>
#include <polytile/scheduler.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <vector>

using namespace polytile;

int main() {
  Program layer = parse_program(
      "function (A[M, K], B[K, N], Bias[N]) -> (Y) { C[i, j : M, N] = +(A[i, k] * B[k, j]); Y = relu(C + Bias); }");
  std::map<std::string, TensorType> types{
      {"A", {DType::f32, {96, 64}}}, {"B", {DType::f32, {64, 600}}}, {"Bias", {DType::f32, {600}}}};

  // The layout pass alone: B's rows are 2400 bytes apart, so B is first copied into contiguous panels.
  std::cout << print(sched::prepare_layouts(layer, infer_types(layer, types))) << "\n";
  // Broadcast lowering alone: T only broadcasts Scale's rows, so it becomes part of Y's expression.
  Program scaled = parse_program("function (C[M, N], Scale[M, 1]) -> (Y) { T[i, j : M, N] = +(Scale[i, 0]); Y = C * T; }");
  ProgramTypes scaled_types = infer_types(scaled, {{"C", {DType::f32, {4, 3}}}, {"Scale", {DType::f32, {4, 1}}}});
  std::cout << print(sched::broadcasts_to_elementwise(scaled, scaled_types)) << "\n";

  // Lowering with an observer: the program after the passes, then each nest as soon as its place is
  // final -- the CPU backend compiles nests that way while the scheduler goes on to the next statements.
  size_t reported = 0;
  sched::LowerObserver observer;
  observer.program = [](const Program& p, const ProgramTypes&) { std::cout << "scheduling " << p.statements.size() << " statements\n"; };
  observer.nest = [&reported](size_t k, const sched::Nest& nest) {
    std::cout << "nest " << k << " final: " << nest.name << "\n";
    ++reported;
  };
  sched::Lowered lowered = sched::lower(layer, types, sched::LowerOptions{}, observer);

  cpu::CompileOptions options;  // its target is cpu::host_target(): this machine's caches and vector width
  std::cout << "host: " << options.target.threads << " threads, " << options.target.cpu.vector_bits << "-bit vectors\n";
  options.threads = 2;
  options.verify = true;  // every rewriting pass proves itself with isl while compiling
  auto compiled = cpu::compile(layer, types, options);
  std::cout << compiled->schedule().tree() << compiled->schedule().ast();
  for (const auto& nest : compiled->schedule().nests)
    if (nest.microkernel)
      std::cout << nest.name << ": " << nest.microkernel->rows << " rows x " << nest.microkernel->chunks << " vectors of "
                << nest.microkernel->lanes << " lanes" << (nest.epilogue ? ", computing " + nest.epilogue->output : "") << "\n";
  for (const auto& out : layer.outputs) std::cout << out << ": " << compiled->types().tensors.at(out).str() << "\n";
  std::cout << "LLVM IR: " << compiled->llvm_ir().size() << " bytes; compile stages (s): passes "
            << compiled->times().passes << ", schedule " << compiled->times().schedule << ", JIT "
            << compiled->times().optimize_and_jit << "\n";

  Buffer a(DType::f32, {96, 64}), b(DType::f32, {64, 600}), bias(DType::f32, {600});
  for (int64_t i = 0; i < a.size(); ++i) a.set(i, (i % 7) * 0.25 - 0.5);
  for (int64_t i = 0; i < b.size(); ++i) b.set(i, (i % 5) * 0.5 - 1.0);
  for (int64_t i = 0; i < bias.size(); ++i) bias.set(i, (i % 3) - 1.0);
  TensorMap inputs{{"A", a}, {"B", b}, {"Bias", bias}};
  TensorMap native;
  for (int repeat = 0; repeat < 3; ++repeat) compiled->run(inputs, native);  // Y is allocated once, then reused
  TensorMap oracle = interpret(layer, inputs);
  double worst = 0;
  for (int64_t e = 0; e < native.at("Y").size(); ++e)
    worst = std::max(worst, std::fabs(native.at("Y").get(e) - oracle.at("Y").get(e)));
  std::cout << "largest difference from the interpreter: " << worst << "\n";

  // On memory the caller owns (say, a framework's arrays): views, nothing copied; Y is written in place.
  std::vector<float> y(96 * 600);
  compiled->run(ViewMap{{"A", TensorView::of(a)}, {"B", TensorView::of(b)}, {"Bias", {bias.data(), DType::f32, {600}, {}}}},
                ViewMap{{"Y", {y.data(), DType::f32, {96, 600}, {}}}});
  for (int64_t e = 0; e < native.at("Y").size(); ++e) worst = std::max(worst, std::fabs(y[static_cast<size_t>(e)] - native.at("Y").get(e)));

  // Ahead of time: the same program as one object file with a C entry point, and its header (what
  // `polytile compile --target cpu` writes); aot.write("out/layer") puts out/layer.o and out/layer.h.
  cpu::ExportedObject aot = cpu::export_object(layer, types, "layer");
  std::cout << "layer.o: " << aot.object.size() << " bytes of machine code for " << aot.cpu << ", workspace "
            << aot.workspace_bytes << " bytes\n" << aot.header.substr(0, aot.header.find('\n', aot.header.find("int layer("))) << "\n";

  // The kernel cache `polytile run` keeps on disk: the first get compiles, stores and loads the entry; a
  // second KernelCache on the directory (as a second process would) loads it. Runs into the outputs they
  // were given before write them in place.
  const std::string cache_dir = (std::filesystem::temp_directory_path() / "polytile_cpu_tour_cache").string();
  std::filesystem::remove_all(cache_dir);
  cpu::KernelCache(cache_dir).get(layer, types, options);
  cpu::KernelCache::Result cached = cpu::KernelCache(cache_dir).get(layer, types, options);
  TensorMap loaded;
  for (int repeat = 0; repeat < 3; ++repeat) cached.program->run(inputs, loaded, 2);  // Y is allocated once
  std::cout << "kernel cache: " << (cached.hit ? "hit" : "miss") << ", loaded in " << cached.seconds * 1e3 << " ms\n";
  for (int64_t e = 0; e < native.at("Y").size(); ++e) worst = std::max(worst, std::fabs(loaded.at("Y").get(e) - native.at("Y").get(e)));
  std::filesystem::remove_all(cache_dir);

  // Row groups: a softmax's nests (row maxima, exp, row sums, division) run together, a few rows at a time;
  // M, E and S, which only the group touches, live in each chunk's own memory (chunk tensors).
  Program softmax = parse_program(
      "function (X[N, C]) -> (O) { M[i, 0 : N, 1] = >(X[i, j]); E = exp(X - M); S[i, 0 : N, 1] = +(E[i, j]); O = E / S; }");
  auto grouped = cpu::compile(softmax, {{"X", {DType::f32, {512, 1000}}}}, options);
  for (const auto& g : grouped->schedule().groups) {
    std::cout << "row group " << grouped->schedule().nests[g.first].name << " .. " << grouped->schedule().nests[g.last].name
              << ": " << g.rows << " rows at a time; chunk tensors";
    for (const auto& t : g.chunk_tensors) std::cout << " " << t.tensor << " (" << t.row_elements << " a row)";
    std::cout << "\n";
  }
  // Where a run's time goes: each row group and nest, its mean over 5 runs.
  Buffer x = Buffer::from_values(DType::f32, {512, 1000}, std::vector<double>(512 * 1000, 0.5));
  const std::vector<cpu::StepTime> steps = grouped->profile({{"X", x}}, 5);
  for (const auto& st : steps) std::cout << st.name << ": " << st.seconds * 1e3 << " ms\n";

  // Tuning: a few target variants timed on this machine; the fastest is kept (and cached).
  options.tune = true;
  auto tuned = cpu::compile(layer, types, options);
  for (const auto& [variant, seconds] : tuned->tuning().candidates) std::cout << variant << ": " << seconds * 1e3 << " ms\n";
  return worst < 1e-4 && reported == lowered.schedule.nests.size() && compiled->schedule().nests.back().epilogue && !tuned->tuning().candidates.empty() &&
                 !grouped->schedule().groups.empty() && grouped->schedule().groups[0].chunk_tensors.size() == 3 && steps.size() == 1 &&
                 aot.object.compare(0, 4, "\x7f" "ELF") == 0 && cached.hit
             ? 0
             : 1;
}
