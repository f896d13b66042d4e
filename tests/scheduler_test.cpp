// The scheduler and the lowering pipeline on their own: this binary links the scheduler, polyhedral and
// the front end, no LLVM. Schedules are checked with isl, not by substring: the schedule tree a nest
// prints is parsed back and its domain compared with isl equality against what the contraction's
// analysis says the nest must execute, and every loop marked parallel is proven dependence-free.
#include <gtest/gtest.h>
#include <isl/cpp.h>

#include <algorithm>
#include <array>
#include <set>
#include <functional>
#include <numeric>
#include <optional>

#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "loop_runner.h"
#include "test_util.h"
#include "polytile/isl_support.h"
#include "polytile/lower.h"
#include "polytile/parser.h"
#include "polytile/polyhedral.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace polytile::sched {
namespace {

using testing_loops::evaluate;
using testing_loops::run_loops;

using isl_support::IslContext;

isl::set renamed(const isl::ctx& ctx, const std::string& set_text, const std::string& tuple) {
  isl::set s(ctx, set_text);
  return isl_support::set_tuple_id(s, isl::id(ctx, tuple));
}

const Contraction& contraction(const Program& p, const std::string& output) {
  for (const auto& st : p.statements)
    if (const auto* c = std::get_if<Contraction>(&st); c && c->output == output) return *c;
  throw std::runtime_error("no contraction " + output);
}

// Plain nests (one statement S) of a lowered program, checked against the analysis of their contraction:
// an update executes exactly the valid points, a finalize exactly the output elements no valid point
// writes; the elements of an init nest and the image of the update cover the whole output; and under a
// "parallel" mark, two points of the update that write the same element run in the same iteration of
// the outermost loop.
// A kernel's points to their block and thread: the partial schedules of its "block" and "thread" bands,
// side by side (isl builds no whole-tree map of a tree with extension nodes, as kernels with shared
// tiles have).
isl::map hardware_schedule(const isl::schedule& tree) {
  std::optional<isl::union_map> hardware;
  tree.root().foreach_descendant_top_down([&](const isl::schedule_node& node) {
    if (node.isa<isl::schedule_node_mark>()) {
      const std::string mark = isl_support::mark_id(node).name();
      if (mark == "block" || mark == "thread") {
        isl::union_map band = isl::union_map::from(node.child(0).as<isl::schedule_node_band>().partial_schedule());
        hardware = hardware ? isl::manage(isl_union_map_flat_range_product(hardware->release(), band.release())) : band;
      }
    }
    return true;
  });
  EXPECT_TRUE(hardware.has_value()) << "a kernel without mapped bands";
  return hardware ? hardware->as_map() : isl::map();
}

int kernels_proven = 0;

void check_plain_nests(const Lowered& lowered) {
  IslContext ctx;
  int checked = 0;
  for (const Nest& nest : lowered.schedule.nests) {
    if (nest.kind == Nest::Kind::elementwise || nest.microkernel || nest.reduction) continue;
    const Contraction& c = contraction(lowered.program, nest.tensor);
    poly::ContractionAnalysis a = poly::analyze(c, lowered.types);
    isl::schedule tree(ctx.get(), nest.tree);
    isl::union_set executed = tree.domain();
    std::vector<std::string> vars;
    const auto& shape = lowered.types.tensors.at(c.output).shape;
    std::vector<std::string> conditions;
    for (size_t k = 0; k < shape.size(); ++k) {
      vars.push_back("o" + std::to_string(k));
      conditions.push_back("0 <= o" + std::to_string(k) + " < " + std::to_string(shape[k]));
    }
    isl::set box(ctx.get(), "{ S[" + isl_support::join(vars) + "]" +
                                (conditions.empty() ? "" : " : " + isl_support::join(conditions, " and ")) + " }");
    isl::map write = isl::map(ctx.get(), a.write).set_domain_tuple(isl::id(ctx.get(), "S")).set_range_tuple(isl::id(ctx.get(), "S"));
    isl::set written = a.empty ? box.subtract(box) : write.range();
    switch (nest.kind) {
      case Nest::Kind::update: {
        isl::set domain = renamed(ctx.get(), a.domain, "S");
        EXPECT_TRUE(executed.is_equal(isl::union_set(domain))) << nest.name << ": " << executed << " vs " << domain;
        if (nest.kernel && !nest.kernel->sequential) {
          // A GPU kernel: two points that write the same element run in the same thread of the same block
          // (the schedule dimensions of the "block" and "thread" bands agree), so no atomics are needed.
          const isl::map hardware = hardware_schedule(tree);
          std::vector<std::string> kept;
          for (unsigned k = 0; k < hardware.range_tuple_dim(); ++k) kept.push_back("c" + std::to_string(k));
          isl::map same_element = write.intersect_domain(domain).apply_range(write.intersect_domain(domain).reverse());
          isl::map threads = same_element.apply_domain(hardware).apply_range(hardware);
          const std::string same = "[" + isl_support::join(kept) + "]";
          EXPECT_TRUE(threads.is_subset(isl::map(ctx.get(), "{ " + same + " -> " + same + " }")))
              << nest.name << ": two threads of a kernel write the same element";
          ++kernels_proven;
        }
        if (nest.parallel_outer) {
          // The outermost schedule dimension, and the pairs of points that write the same element.
          isl::map schedule = tree.get_map().as_map();  // one statement: one map
          std::vector<std::string> dims;
          for (unsigned k = 0; k < schedule.range_tuple_dim(); ++k) dims.push_back("c" + std::to_string(k));
          isl::map outermost = schedule.apply_range(isl::map(ctx.get(), "{ [" + isl_support::join(dims) + "] -> [c0] }"));
          isl::map same_element = write.intersect_domain(domain).apply_range(write.intersect_domain(domain).reverse());
          isl::map iterations = same_element.apply_domain(outermost).apply_range(outermost);
          EXPECT_TRUE(iterations.is_subset(isl::map(ctx.get(), "{ [a] -> [a] }")))
              << nest.name << ": a parallel outer loop has iterations writing the same element";
        }
        ++checked;
        break;
      }
      case Nest::Kind::finalize:
        EXPECT_TRUE(executed.is_equal(isl::union_set(box.subtract(written)))) << nest.name << ": " << executed;
        ++checked;
        break;
      case Nest::Kind::init:
        EXPECT_TRUE(box.is_subset(executed.extract_set(box.space()).unite(written))) << nest.name;
        ++checked;
        break;
      case Nest::Kind::elementwise: break;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(SchedulerTest, PlainNestsExecuteExactlyTheirPointsAndParallelLoopsAreProven) {
  Program p = parse_program(R"(function (A[M, K], B[K, N], P[H, W]) -> (C, X, Y, Z) {
    C[m, n : M, N] = +(A[m, k] * B[k, n]);
    X[y, x : 5, 5] = >(P[2*y + j - 1, 2*x + i - 1]), j < 3, i < 3;
    Y[i : M] = >(A[i, k] == B[k, i] ? A[i, k]);
    Z[i, j : N, M] = =(A[j, i]);
  })");
  std::map<std::string, TensorType> inputs{{"A", {DType::f32, {48, 40}}}, {"B", {DType::f32, {40, 48}}},
                                           {"P", {DType::f32, {10, 10}}}};
  for (int64_t microkernel_min_points : {INT64_MAX, int64_t{1}}) {
    LowerOptions options;
    options.target.cpu.microkernel_min_points = microkernel_min_points;  // plain tiled nests, then micro-kernels
    options.target.cpu.l2_bytes = 64 * 1024;
    Lowered lowered = lower(p, inputs, options);
    check_plain_nests(lowered);
  }
}

// Without reduce/defract, an output index i + j leaves two output variables that do not write distinct
// elements: no parallel mark may be placed on i, and the check above would catch one.
TEST(SchedulerTest, OutputVariablesThatShareElementsAreNotParallel) {
  Program p = parse_program("function (A[M, N]) -> (V) { V[i + j : M + N - 1] = +(A[i, j]); }");
  LowerOptions options;
  options.reduce_and_defract = false;
  Lowered lowered = lower(p, {{"A", {DType::f32, {30, 20}}}}, options);
  check_plain_nests(lowered);
  for (const Nest& n : lowered.schedule.nests) {
    if (n.kind == Nest::Kind::update) {
      EXPECT_FALSE(n.parallel_outer) << n.tree;
    }
  }
}

// A big sum as plain nests gets cache tiles, and its parallel outer loop is the tile loop: the proof above
// covers tiled trees too.
TEST(SchedulerTest, TiledUpdatesKeepTheirPointsAndTheirParallelProof) {
  Program p = parse_program("function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }");
  std::map<std::string, TensorType> inputs{{"A", {DType::f32, {96, 80}}}, {"B", {DType::f32, {80, 72}}}};
  LowerOptions options;
  options.target.cpu.microkernel_min_points = INT64_MAX;
  options.target.cpu.l2_bytes = 16 * 1024;  // B (23 KiB), read again for every row of C, leaves L2
  Lowered lowered = lower(p, inputs, options);
  bool tiled = false;
  for (const Nest& n : lowered.schedule.nests) tiled |= n.kind == Nest::Kind::update && n.tree.find("\"tile\"") != std::string::npos;
  ASSERT_TRUE(tiled) << lowered.schedule.tree();
  check_plain_nests(lowered);
}

TEST(SchedulerTest, CondMissLoweringSplitsMaxMinAndProductOfConds) {
  Program p = parse_program("function (A[N], B[N], C[N]) -> (O) { O[i : N] = >(A[i] == B[j] ? C[j]); }");
  Program lowered = lower_cond_misses(p, nullptr);
  std::string text = print(lowered);
  EXPECT_NE(text.find("O_raw[i : N] = >(A[i] == B[j] ? C[j]);"), std::string::npos) << text;
  EXPECT_NE(text.find("O_hits[i : N] = +(A[i] == B[j] ? ONES_C[j]);"), std::string::npos) << text;
  EXPECT_NE(text.find("O = select(O_hits == 0, 0, O_raw);"), std::string::npos) << text;
  // Proven at concrete sizes; a sum needs no lowering.
  std::map<std::string, TensorType> in{{"A", {DType::f32, {4}}}, {"B", {DType::f32, {4}}}, {"C", {DType::f32, {4}}}};
  EXPECT_NO_THROW(lower_cond_misses(p, &in));
  Program sum = parse_program("function (A[N], B[N], C[N]) -> (O) { O[i : N] = +(A[i] == B[j] ? C[j]); }");
  EXPECT_EQ(print(lower_cond_misses(sum, &in)), print(sum));
}

// Types are inferred once and carried through the passes: after cond-miss lowering (O_raw, O_hits and a
// ones tensor added), fusion (a chain absorbed) and layouts (a transposed weight copy added) the carried
// types are exactly those of typing the lowered program from scratch, with and without verification.
TEST(SchedulerTest, CarriedTypesAreTheTypesOfTheLoweredProgram) {
  Program p = parse_program(R"(function (I[N, H, W, CI], K[KH, KW, CI, CO], DO[N, Y, X, CO], A[M], B[M]) -> (DI, O, R) {
    DI[n, j + y - 1, i + x - 1, ci : N, H, W, CI] = +(K[j, i, ci, co] * DO[n, y, x, co]);
    O[m : M] = >(A[m] == B[k] ? A[k]);
    T = exp(A) + 1;
    U = T * 2;
    R = U - B;
  })");
  std::map<std::string, TensorType> inputs{{"I", {DType::f32, {2, 16, 16, 32}}}, {"K", {DType::f32, {3, 3, 32, 32}}},
                                           {"DO", {DType::f32, {2, 16, 16, 32}}}, {"A", {DType::f32, {8}}},
                                           {"B", {DType::f32, {8}}}};
  for (bool verify : {false, true}) {
    LowerOptions options;
    options.verify = verify;
    options.target.cpu.microkernel_min_points = 1;
    Lowered lowered = lower(p, inputs, options);
    const std::string text = print(lowered.program);
    ASSERT_NE(text.find("O_hits"), std::string::npos) << text;  // every pass did something
    ASSERT_EQ(text.find("U = "), std::string::npos) << text;
    ASSERT_NE(text.find("K_T"), std::string::npos) << text;
    ProgramTypes again = infer_types(lowered.program, inputs);
    ASSERT_EQ(lowered.types.tensors.size(), again.tensors.size());
    for (const auto& [name, t] : again.tensors) EXPECT_EQ(lowered.types.tensors.at(name).str(), t.str()) << name;
    EXPECT_EQ(lowered.types.dims, again.dims);
  }
}

// Broadcast lowering substitutes only what it can prove is one term per element read by broadcasting,
// read only by elementwise statements of its shape and not a program output.
TEST(SchedulerTest, BroadcastLoweringSubstitutesOnlyPlainBroadcasts) {
  std::map<std::string, TensorType> inputs{{"A", {DType::f32, {4, 1}}}, {"B", {DType::f32, {4, 6}}}};
  const std::string head = "function (A[N, 1], B[N, C]) -> ";
  ProgramTypes types;
  auto lowered = [&](const std::string& text) {
    Program p = parse_program(text);
    types = infer_types(p, inputs);
    return print(broadcasts_to_elementwise(p, types, /*verify=*/true));
  };
  std::string yes = lowered(head + "(O) { T[i, j : N, C] = +(A[i, 0]); O = T * B; }");
  EXPECT_EQ(yes.find("T["), std::string::npos) << yes;
  EXPECT_NE(yes.find("O = cast(A + 0, f32) * B;"), std::string::npos) << yes;
  // A product of two broadcast reads (autodiff's adjoint of D * D broadcast along rows) and a sum of two.
  std::string product = lowered(head + "(O) { T[i, j : N, C] = +(B[i, j] * A[i, 0]); O = T + B; }");
  EXPECT_EQ(product.find("T["), std::string::npos) << product;
  EXPECT_NE(product.find("O = cast(B * A + 0, f32) + B;"), std::string::npos) << product;
  std::string sum = lowered(head + "(O) { T[i, j : N, C] = +(A[i, 0] + B[i, j]); O = T * B; }");
  EXPECT_NE(sum.find("O = cast(A + B + 0, f32) * B;"), std::string::npos) << sum;
  const char* kept[] = {
      "(O, T) { T[i, j : N, C] = +(A[i, 0]); O = T * B; }",                          // a program output
      "(O) { T[i, j : N, C] = +(A[i, 0]); O[i : N] = +(T[i, j]); }",                // read by a contraction
      "(O) { T[i, j : N, C] = +(A[i, 0]); U = A + 1; O = T * U; }",                // a reader of another shape
      "(O) { T[i, j : N, C] = +(B[i, k]); O = T * B; }",                             // a reduction
      "(O) { T[i, j : N, C] = +(B[i, j]), j < 3; O = T * B; }",                      // a constraint
      "(O) { T[i, j : N, C] = +(B[i, C - 1 - j]); O = T * B; }",                     // not the aligned element
      "(O) { T[i, j : N, C] = +(A[i, 0] * B[i, C - 1 - j]); O = T * B; }",           // a product of one
      "(O) { T[i, j : N, C] = +(B[i, k] * B[k, j]); O = T * B; }",                   // a matmul
      "(O) { T[j, i : C, N] = +(B[i, j]); Bt[j, i : C, N] = =(B[i, j]); O = T * Bt; }",  // a transpose
  };
  for (const char* k : kept) {
    std::string text = lowered(head + k);
    EXPECT_NE(text.find("T["), std::string::npos) << k << "\n" << text;
  }
}

// Every thread of a launch (blocks and threads in order) runs the kernel's loop IR.
void run_launch_threads(const Nest& nest, const KernelLaunch& launch,
                        const std::function<void(int64_t thread, const LoopNode& statement, const std::vector<int64_t>& args,
                                                 const std::vector<int64_t>& position)>& visit) {
  std::vector<int64_t> it(static_cast<size_t>(nest.iterators));
  std::array<int64_t, 6> hw{};
  for (hw[2] = 0; hw[2] < launch.grid[2]; ++hw[2])
    for (hw[1] = 0; hw[1] < launch.grid[1]; ++hw[1])
      for (hw[0] = 0; hw[0] < launch.grid[0]; ++hw[0])
        for (hw[5] = 0; hw[5] < launch.block[2]; ++hw[5])
          for (hw[4] = 0; hw[4] < launch.block[1]; ++hw[4])
            for (hw[3] = 0; hw[3] < launch.block[0]; ++hw[3]) {
              int64_t thread = 0;
              for (size_t k = 0; k < 6; ++k) thread = thread * 4096 + hw[k];
              run_loops(nest.root, it, [&](const LoopNode& n, const std::vector<int64_t>& args, const std::vector<int64_t>& position) {
                visit(thread, n, args, position);
              }, &hw);
            }
}

// The loop IR of GPU kernels run on integers over their whole launch: every block and thread runs the
// nest with its mapped loops fixed at its indices, and together they execute every point of the nest's
// domain exactly once (none outside the grid or the block, none twice); every output element is written
// by one thread only. Shrinking any axis of a launch loses points: the check sees it. In kernels with
// shared tiles, every element an update reads from a tile lies in the box the thread's last copy of that
// tile filled (origin, origin + size): shrinking a tile leaves elements uncovered. In kernels with
// accumulators, each thread's accumulators are followed: an update aggregates into the position that
// its thread loaded with its own output element (else misplaced), a load never replaces a position
// still loaded nor loads an element another position holds (else clobbered), a store writes the element
// its position was loaded with (else misplaced), and no position is left loaded when the thread ends
// (else unstored).
struct LaunchRun {
  int64_t instances = 0, outside = 0, repeated = 0, shared_elements = 0;
  int64_t copies = 0, tile_reads = 0, uncovered = 0;
  int64_t acc_loads = 0, acc_stores = 0, misplaced = 0, clobbered = 0, unstored = 0;
  int64_t elements = 0;  // distinct elements written
};

// The points of a bounded set.
std::set<std::vector<int64_t>> points_of(const isl::set& domain) {
  std::set<std::vector<int64_t>> points;
  domain.foreach_point([&](isl::point p) {
    std::vector<int64_t> x;
    for (unsigned d = 0; d < domain.tuple_dim(); ++d)
      x.push_back(isl::manage(isl_point_get_coordinate_val(p.get(), isl_dim_set, static_cast<int>(d))).get_num_si());
    points.insert(x);
  });
  return points;
}

LaunchRun run_launch(const Nest& nest, const KernelLaunch& launch, const std::set<std::vector<int64_t>>& domain,
                     const Lowered& lowered) {
  LaunchRun out;
  std::map<std::vector<int64_t>, int> seen;
  std::map<std::vector<int64_t>, int64_t> writer;  // element -> linear thread id
  std::map<std::pair<int64_t, int>, std::vector<int64_t>> origin;  // (thread, tile) -> origin of its last copy
  // (thread, position) -> the element loaded there, while loaded
  std::map<std::pair<int64_t, std::vector<int64_t>>, std::vector<int64_t>> loaded;
  const Contraction* c = nest.kind == Nest::Kind::update ? &contraction(lowered.program, nest.tensor) : nullptr;
  std::map<std::string, int64_t> values;  // the statement's variables
  auto at = [&](const std::vector<Polynomial>& index) {
    std::vector<int64_t> out;
    for (const Polynomial& q : index) {
      Polynomial b = q.bind_dims(lowered.types.dims);
      Rational v = b.constant();
      for (const auto& [var, coeff] : b.index_terms()) v = v + coeff * Rational(values.at(var));
      out.push_back(v.num() / v.den());
    }
    return out;
  };
  run_launch_threads(nest, launch, [&](int64_t thread, const LoopNode& statement, const std::vector<int64_t>& args,
                                       const std::vector<int64_t>& position) {
    using St = LoopNode::Statement;
    if (statement.statement == St::copy) {
      origin[{thread, statement.tile}] = args;
      ++out.copies;
      return;
    }
    if (statement.statement == St::acc_load || statement.statement == St::acc_store) {
      values.clear();
      for (size_t k = 0; k < args.size(); ++k) values[nest.variables.at(nest.accumulators->variables.at(k))] = args[k];
      const std::vector<int64_t> element = at(c->output_indices);
      if (statement.statement == St::acc_load) {
        ++out.acc_loads;
        for (const auto& [slot, held] : loaded)
          if (slot.first == thread && (slot.second == position || held == element)) ++out.clobbered;
        loaded[{thread, position}] = element;
        return;
      }
      ++out.acc_stores;
      auto slot = loaded.find({thread, position});
      if (slot == loaded.end() || slot->second != element) ++out.misplaced;
      if (slot != loaded.end()) loaded.erase(slot);
      return;
    }
    ++out.instances;
    if (!domain.count(args)) ++out.outside;
    if (++seen[args] > 1) ++out.repeated;
    std::vector<int64_t> element = args;
    if (c) {
      values.clear();
      for (size_t k = 0; k < nest.variables.size(); ++k) values[nest.variables[k]] = args[k];
      element = at(c->output_indices);
      if (nest.accumulators) {
        auto slot = loaded.find({thread, position});
        if (slot == loaded.end() || slot->second != element) ++out.misplaced;
      }
      for (const auto& input : c->inputs)
        for (size_t t = 0; t < nest.shared.size(); ++t) {
          if (nest.shared[t].tensor != input.tensor) continue;
          ++out.tile_reads;
          const std::vector<int64_t> idx = at(input.indices);
          auto o = origin.find({thread, static_cast<int>(t)});
          bool covered = o != origin.end();
          for (size_t d = 0; covered && d < idx.size(); ++d)
            covered = o->second[d] <= idx[d] && idx[d] < o->second[d] + nest.shared[t].sizes[d];
          if (!covered) ++out.uncovered;
        }
    }
    auto [w, fresh] = writer.emplace(element, thread);
    if (!fresh && w->second != thread) ++out.shared_elements;
  });
  EXPECT_EQ(seen.size(), domain.size()) << nest.name << ": points not executed";
  out.unstored = static_cast<int64_t>(loaded.size());
  out.elements = static_cast<int64_t>(writer.size());
  return out;
}

// Removes the which-th barrier (in program order) of a loop IR; false when it has fewer.
bool remove_nth_barrier(LoopNode& n, int& which) {
  for (std::vector<LoopNode>* nodes : {&n.body, &n.otherwise})
    for (auto c = nodes->begin(); c != nodes->end(); ++c) {
      if (c->kind == LoopNode::Kind::barrier && which-- == 0) {
        nodes->erase(c);
        return true;
      }
      if (remove_nth_barrier(*c, which)) return true;
    }
  return false;
}
bool remove_barrier(LoopNode& root, int which) { return remove_nth_barrier(root, which); }

// Applies `change` to every statement of a kind in a loop IR; the number changed.
int change_statements(LoopNode& n, LoopNode::Statement kind, const std::function<void(LoopNode&)>& change) {
  if (n.kind == LoopNode::Kind::statement) {
    if (n.statement != kind) return 0;
    change(n);
    return 1;
  }
  int changed = 0;
  for (std::vector<LoopNode>* nodes : {&n.body, &n.otherwise})
    for (LoopNode& c : *nodes) changed += change_statements(c, kind, change);
  return changed;
}

// x + 1, as loop IR.
LoopExpr plus_one(const LoopExpr& x) {
  LoopExpr one, sum;
  one.value = 1;
  sum.kind = LoopExpr::Kind::add;
  sum.args = {x, one};
  return sum;
}

// A copy inside a loop that each block runs (over reduction tiles).
bool copies_in_a_loop(const LoopNode& n, bool in_loop = false) {
  if (n.kind == LoopNode::Kind::statement) return in_loop && n.statement == LoopNode::Statement::copy;
  in_loop = in_loop || (n.kind == LoopNode::Kind::loop && n.hardware == LoopNode::Hardware::none);
  for (const auto* nodes : {&n.body, &n.otherwise})
    for (const LoopNode& c : *nodes)
      if (copies_in_a_loop(c, in_loop)) return true;
  return false;
}

TEST(SchedulerTest, GpuKernelsRunEveryPointOnceOnOneThreadPerElement) {
  const std::pair<const char*, std::map<std::string, TensorType>> cases[] = {
      {"function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }",
       {{"A", {DType::f32, {37, 20}}}, {"B", {DType::f32, {20, 45}}}}},
      {"function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
       "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }",
       {{"I", {DType::f32, {2, 11, 10, 5}}}, {"K", {DType::f32, {2, 2, 5, 19}}}}},
      {"function (K[KH, KW, CI, CO], DO[N, H, W, CO]) -> (DI) {"
       "  DI[n, 3*y + 2*j, 3*x + 2*i, ci : N, 9, 9, CI] = +(K[j, i, ci, co] * DO[n, y, x, co]); }",
       {{"K", {DType::f32, {2, 2, 5, 7}}}, {"DO", {DType::f32, {2, 3, 3, 7}}}}},
      {"function (I[N, C]) -> (O) { O[i, c : N - 2, C] = >(I[i + j, c]), j < 3; R = relu(O) * 2; }",
       {{"I", {DType::f32, {40, 33}}}}},
      {"function (A[M, N]) -> (V) { V[i + j : M + N - 1] = +(A[i, j]); }", {{"A", {DType::f32, {30, 20}}}}},
      // A weight gradient: each block one (j, i), z in two parts.
      {"function (I[N, H, W, CI], K[KH, KW, CI, CO], DO[N, H, W, CO]) -> (DK) {"
       "  DK[j, i, ci, co : KH, KW, CI, CO] = +(I[n, j + y - 1, i + x - 1, ci] * DO[n, y, x, co]); }",
       {{"I", {DType::f32, {2, 5, 5, 8}}}, {"K", {DType::f32, {3, 3, 8, 33}}}, {"DO", {DType::f32, {2, 5, 5, 33}}}}},
      // A diagonal: isl fixes b by a, so the update's z is linearized (its init has both parts).
      {"function (I[A, Y, X, K]) -> (O) { O[a, b, y, x : A, A, Y, X] = +(I[a, y, x, k]), b - a < 1, a - b < 1; }",
       {{"I", {DType::f32, {3, 8, 33, 4}}}}},
  };
  int z_in_parts = 0, z_linearized = 0, parts_caught = 0;
  int kernels = 0, shrunk = 0, tiled = 0, shrunk_tiles = 0, unsynchronized_caught = 0, accumulating = 0, acc_caught = 0;
  int accumulating_in_tiles = 0;
  kernels_proven = 0;
  for (int threads : {256, 8}) {
    for (const auto& [text, inputs] : cases) {
      LowerOptions options;
      options.target = gpu_target("sm_90");
      options.target.gpu->threads_per_block = threads;
      options.target.gpu->tile_rows = threads == 8 ? 3 : 4;
      // Small blocks get little shared memory: their reductions run in several tiles.
      if (threads == 8) options.target.gpu->shared_bytes = 512;
      Lowered lowered = lower(parse_program(text), inputs, options);
      check_plain_nests(lowered);
      IslContext ctx;
      for (const Nest& nest : lowered.schedule.nests) {
        ASSERT_TRUE(nest.kernel) << nest.name;
        const std::set<std::vector<int64_t>> domain = points_of(isl::schedule(ctx.get(), nest.tree).domain().as_set());
        LaunchRun r = run_launch(nest, *nest.kernel, domain, lowered);
        EXPECT_EQ(r.outside, 0) << nest.name << " of " << text;
        EXPECT_EQ(r.repeated, 0) << nest.name << " of " << text;
        EXPECT_EQ(r.shared_elements, 0) << nest.name << " of " << text;
        EXPECT_EQ(r.uncovered, 0) << nest.name << " of " << text << ": reads outside the copied tile";
        EXPECT_EQ(r.misplaced, 0) << nest.name << " of " << text << ": accumulators hold other elements";
        EXPECT_EQ(r.clobbered, 0) << nest.name << " of " << text;
        EXPECT_EQ(r.unstored, 0) << nest.name << " of " << text;
        ++kernels;
        if (nest.accumulators) {
          ++accumulating;
          EXPECT_GT(r.acc_loads, 0) << nest.name;
          EXPECT_EQ(r.acc_loads, r.acc_stores) << nest.name;
          // A thread keeps an element in its registers from the first reduction tile to the last: one load
          // and one store per element, however many tiles the reduction runs in.
          EXPECT_EQ(r.acc_loads, r.elements) << nest.name << " of " << text;
          if (copies_in_a_loop(nest.root)) ++accumulating_in_tiles;
          using St = LoopNode::Statement;
          // Loading the next element (the last output variable plus one), aggregating into the next position,
          // or not storing: each is caught.
          Nest shifted = nest;
          EXPECT_GT(change_statements(shifted.root, St::acc_load, [](LoopNode& n) { n.args.back() = plus_one(n.args.back()); }), 0);
          EXPECT_GT(run_launch(shifted, *nest.kernel, domain, lowered).misplaced, 0) << nest.name << ": AccIn of the next element";
          if (!nest.accumulators->sizes.empty()) {
            Nest moved = nest;
            change_statements(moved.root, St::plain, [](LoopNode& n) { n.registers.back() = plus_one(n.registers.back()); });
            EXPECT_GT(run_launch(moved, *nest.kernel, domain, lowered).misplaced, 0) << nest.name << ": S at the next position";
            ++acc_caught;
          }
          Nest unstored = nest;
          EXPECT_GT(change_statements(unstored.root, St::acc_store, [](LoopNode& n) { n = LoopNode{}; }), 0);  // an empty block
          EXPECT_GT(run_launch(unstored, *nest.kernel, domain, lowered).unstored, 0) << nest.name << ": no AccOut";
          acc_caught += 2;
        }
        if (!nest.shared.empty()) {
          ++tiled;
          EXPECT_GT(r.copies, 0) << nest.name;
          EXPECT_GT(r.tile_reads, 0) << nest.name;
          EXPECT_NO_THROW(check_barriers(nest)) << nest.name;
          // A tile one element shorter along any dimension misses elements the update reads.
          for (size_t t = 0; t < nest.shared.size(); ++t)
            for (size_t d = 0; d < nest.shared[t].sizes.size(); ++d) {
              if (nest.shared[t].sizes[d] < 2) continue;
              Nest smaller = nest;
              --smaller.shared[t].sizes[d];
              EXPECT_GT(run_launch(smaller, *nest.kernel, domain, lowered).uncovered, 0)
                  << nest.name << ": tile " << t << " shrunk along " << d << " still covers every read";
              ++shrunk_tiles;
            }
          // Without the barrier after the copies, they race with the threads reading the tiles; without the
          // one after the threads, so does the next reduction tile's copy (none when there is one tile).
          for (int which = 0; which < 2; ++which) {
            Nest unsynchronized = nest;
            EXPECT_TRUE(remove_barrier(unsynchronized.root, which)) << nest.name;
            if (which == 0 || copies_in_a_loop(nest.root)) {
              EXPECT_THROW(check_barriers(unsynchronized), InternalError) << nest.name << ": barrier " << which << " removed";
              ++unsynchronized_caught;
            }
          }
        }
        // z in parts: each part a loop of its own; two parts with one stride leave points unexecuted.
        std::vector<LoopNode*> parts;
        std::function<void(LoopNode&)> find_parts = [&](LoopNode& n) {
          if (n.kind == LoopNode::Kind::loop && n.part_extent > 0) parts.push_back(&n);
          for (auto* nodes : {&n.body, &n.otherwise})
            for (LoopNode& c : *nodes) find_parts(c);
        };
        Nest swapped = nest;
        find_parts(swapped.root);
        if (parts.size() >= 2) {
          ++z_in_parts;
          parts[1]->part_stride = parts[0]->part_stride;
          std::set<std::vector<int64_t>> executed;
          run_launch_threads(swapped, *nest.kernel, [&](int64_t, const LoopNode& n, const std::vector<int64_t>& args, const std::vector<int64_t>&) {
            if (n.statement == LoopNode::Statement::plain) executed.insert(args);
          });
          EXPECT_LT(executed.size(), domain.size()) << nest.name << ": two parts of z with one stride";
          ++parts_caught;
        }
        // The diagonal's z linearized: isl's loop over it steps by A + 1, scaled to steps of 1 (the blocks
        // past A have nothing to do, so a launch one block shorter along z still runs every point).
        const bool diagonal = nest.name == "O.update" && std::string(text).find("b - a") != std::string::npos;
        if (diagonal && parts.empty() && nest.kernel->grid[2] > 1) ++z_linearized;
        // Shrinking an axis of the launch leaves points unexecuted.
        for (int a = 0; a < 3; ++a) {
          for (bool blocks : {true, false}) {
            KernelLaunch less = *nest.kernel;
            int64_t& extent = blocks ? less.grid[static_cast<size_t>(a)] : less.block[static_cast<size_t>(a)];
            if (extent < 2 || (diagonal && blocks && a == 2)) continue;
            --extent;
            // Count the instances: fewer than the domain's points.
            int64_t instances = 0;
            run_launch_threads(nest, less, [&](int64_t, const LoopNode& n, const std::vector<int64_t>&, const std::vector<int64_t>&) {
              if (n.statement == LoopNode::Statement::plain) ++instances;
            });
            EXPECT_LT(instances, static_cast<int64_t>(domain.size())) << nest.name << ": a shrunk launch still runs every point";
            ++shrunk;
          }
        }
      }
    }
  }
  EXPECT_GE(z_in_parts, 4);  // the weight gradient's init and update, the diagonal's init; two sizes of blocks
  EXPECT_EQ(parts_caught, z_in_parts);
  EXPECT_EQ(z_linearized, 2);
  EXPECT_GE(kernels, 20);
  EXPECT_GE(shrunk, 20);
  EXPECT_GE(kernels_proven, 8);
  EXPECT_GE(tiled, 6);
  EXPECT_GE(shrunk_tiles, 25);
  EXPECT_GE(unsynchronized_caught, 8);
  EXPECT_GE(accumulating, 6);
  EXPECT_GE(accumulating_in_tiles, 3);
  EXPECT_GE(acc_caught, 12);
}

// The switch the GPU model has for comparison (GpuModel::keep_accumulators, --gpu-model keep=0): a matmul
// whose reduction runs in several tiles loads and stores each element once with it, once per tile without.
TEST(SchedulerTest, GpuAccumulatorsStayInRegistersAcrossReductionTiles) {
  const std::map<std::string, TensorType> inputs{{"A", {DType::f32, {37, 96}}}, {"B", {DType::f32, {96, 45}}}};
  int64_t loads[2] = {0, 0}, elements = 0;
  for (bool keep : {true, false}) {
    LowerOptions options;
    options.target = gpu_target("sm_90");
    options.target.gpu->shared_bytes = 2048;
    options.target.gpu->keep_accumulators = keep;
    Lowered lowered = lower(parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"), inputs, options);
    IslContext ctx;
    for (const Nest& nest : lowered.schedule.nests) {
      if (!nest.accumulators) continue;
      ASSERT_TRUE(copies_in_a_loop(nest.root)) << "the reduction should run in several tiles";
      LaunchRun r = run_launch(nest, *nest.kernel, points_of(isl::schedule(ctx.get(), nest.tree).domain().as_set()), lowered);
      EXPECT_EQ(r.misplaced + r.clobbered + r.unstored, 0) << keep;
      EXPECT_EQ(r.acc_loads, r.acc_stores);
      loads[keep ? 0 : 1] = r.acc_loads;
      elements = r.elements;
    }
  }
  EXPECT_EQ(elements, 37 * 45);
  EXPECT_EQ(loads[0], elements);
  EXPECT_GE(loads[1], 2 * elements);
}

// Micro-kernel nests run through their loop IR on integers: the fused multiply-adds of uniform blocks
// touch only valid points, uniform and predicated blocks together cover every valid point exactly once
// (the rows and lanes of a predicated block that are not valid points are masked), and each block's
// steps run in order, each opening with zero (the block's first step, when there is no default tensor)
// or load, then its F instances, then closing with the epilogue (the block's last step, when one is
// fused) or the store, all uniform or all predicated.
TEST(SchedulerTest, MicrokernelStepsCoverEveryValidPointOnceAndOpenAndCloseEveryBlock) {
  const std::map<std::string, TensorType> conv{{"I", {DType::f32, {2, 7, 9, 3}}}, {"K", {DType::f32, {3, 3, 3, 20}}}};
  const std::pair<const char*, std::map<std::string, TensorType>> cases[] = {
      {"function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
       "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); }", conv},
      {"function (I[N, H, W, CI], K[KH, KW, CI, CO], B[CO]) -> (R) {"
       "  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, ci] * K[j, i, ci, co]); R = relu(O + B); }",
       {{"I", {DType::f32, {2, 7, 9, 3}}}, {"K", {DType::f32, {3, 3, 3, 20}}}, {"B", {DType::f32, {20}}}}},
      {"function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {"
       "  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }",
       {{"I", {DType::f32, {2, 11, 10, 5}}}, {"K", {DType::f32, {2, 2, 5, 19}}}}},
      {"function (K[KH, KW, CI, CO], DO[N, H, W, CO]) -> (DI) {"
       "  DI[n, j + y - 1, i + x - 1, ci : N, H, W, CI] = +(K[j, i, ci, co] * DO[n, y, x, co]); }",
       {{"K", {DType::f32, {3, 3, 18, 5}}}, {"DO", {DType::f32, {2, 7, 9, 5}}}}},
      {"function (I[N, H, W, CI], DO[N, H, W, CO]) -> (DK) {"
       "  DK[j, i, ci, co : 3, 3, CI, CO] = +(I[n, y + j - 1, x + i - 1, ci] * DO[n, y, x, co]); }",
       {{"I", {DType::f32, {2, 32, 32, 2}}}, {"DO", {DType::f32, {2, 32, 32, 17}}}}},
      {"function (A[M, K], B[K, N], C0[M, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]) default C0; }",
       {{"A", {DType::f32, {37, 200}}}, {"B", {DType::f32, {200, 45}}}, {"C0", {DType::f32, {37, 45}}}}},
      // B's rows 2400 bytes apart: packed into panels, the last one padded (600 columns are 9 panels of 64
      // and 24, or 18 of 32 and 24): its lanes past column 599 are masked by the output's range.
      {"function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }",
       {{"A", {DType::f32, {7, 5}}}, {"B", {DType::f32, {5, 600}}}}},
  };
  int nests = 0, predicated = 0, epilogues = 0;
  for (int bits : {512, 256}) {
    for (const auto& [text, inputs] : cases) {
      LowerOptions options;
      options.target.cpu.microkernel_min_points = 1;
      options.target.cpu.vector_bits = bits;
      options.target.cpu.l1_bytes = 4096;  // several reduction tiles
      Lowered lowered = lower(parse_program(text), inputs, options);
      for (const Nest& nest : lowered.schedule.nests) {
        if (!nest.microkernel) continue;
        ++nests;
        const Microkernel& mk = *nest.microkernel;
        const Contraction& c = contraction(lowered.program, nest.tensor);
        // The valid points, flagged in their bounding box.
        IslContext ctx;
        isl::set domain(ctx.get(), poly::analyze(c, lowered.types).domain);
        std::vector<int64_t> lo, extent;
        for (unsigned d = 0; d < domain.tuple_dim(); ++d) {
          lo.push_back(domain.dim_min_val(static_cast<int>(d)).get_num_si());
          extent.push_back(domain.dim_max_val(static_cast<int>(d)).get_num_si() - lo.back() + 1);
        }
        auto flat = [&](const std::vector<int64_t>& x) -> int64_t {
          int64_t at = 0;
          for (size_t d = 0; d < x.size(); ++d) {
            if (x[d] < lo[d] || x[d] >= lo[d] + extent[d]) return -1;
            at = at * extent[d] + x[d] - lo[d];
          }
          return at;
        };
        std::vector<char> valid(static_cast<size_t>(std::accumulate(extent.begin(), extent.end(), int64_t{1}, std::multiplies<>())));
        std::vector<int> covered(valid.size());
        domain.foreach_point([&](isl::point p) {
          std::vector<int64_t> x;
          for (unsigned d = 0; d < extent.size(); ++d) x.push_back(isl::manage(isl_point_get_coordinate_val(p.get(), isl_dim_set, static_cast<int>(d))).get_num_si());
          valid[static_cast<size_t>(flat(x))] = 1;
        });
        const size_t nb = mk.others.size() + 2;
        const int64_t vl = int64_t{mk.chunks} * mk.lanes;
        struct Block {
          int steps = 0, epilogues = 0;
          bool open = false, predicated = false, last_closed_by_epilogue = false;
        };
        std::map<std::vector<int64_t>, Block> blocks;
        std::vector<int64_t> iterators(static_cast<size_t>(nest.iterators));
        using St = LoopNode::Statement;
        run_loops(nest.root, iterators, [&](const LoopNode& s, const std::vector<int64_t>& args, const std::vector<int64_t>&) {
          ASSERT_GE(args.size(), nb) << nest.name;
          Block& b = blocks[std::vector<int64_t>(args.begin(), args.begin() + static_cast<long>(nb))];
          predicated += s.predicated;
          if (s.statement == St::zero || s.statement == St::load) {
            EXPECT_FALSE(b.open) << nest.name << ": a step opens before the last one closed";
            EXPECT_EQ(s.statement == St::zero, !c.init && b.steps == 0) << nest.name << ": step " << b.steps << " of a block";
            b.open = true;
            b.predicated = s.predicated;
            ++b.steps;
            return;
          }
          EXPECT_TRUE(b.open) << nest.name << ": a statement outside a step";
          EXPECT_EQ(s.predicated, b.predicated) << nest.name << ": a step mixes uniform and predicated statements";
          if (s.statement == St::store || s.statement == St::epilogue) {
            b.open = false;
            b.last_closed_by_epilogue = s.statement == St::epilogue;
            b.epilogues += s.statement == St::epilogue;
            return;
          }
          ASSERT_EQ(s.statement, St::fma) << nest.name;
          std::vector<int64_t> x(nest.variables.size());
          for (size_t k = 0; k < mk.others.size(); ++k) x[mk.others[k]] = args[k];
          for (size_t k = 0; k < mk.reductions.size(); ++k) x[mk.reductions[k]] = args[nb + k];
          for (int64_t d = 0; d < mk.rows; ++d) {
            for (int64_t l = 0; l < vl; ++l) {
              x[mk.block] = mk.block_lo + mk.rows * args[nb - 2] + d;
              x[mk.vector] = mk.vector_lo + vl * args[nb - 1] + l;
              const int64_t at = flat(x);
              const bool is_valid = at >= 0 && valid[static_cast<size_t>(at)];
              if (!s.predicated) {
                EXPECT_TRUE(is_valid) << nest.name << ": an unpredicated block computes an invalid point";
              }
              if (is_valid) ++covered[static_cast<size_t>(at)];
            }
          }
        });
        for (size_t at = 0; at < valid.size(); ++at)
          if (valid[at]) {
            EXPECT_EQ(covered[at], 1) << nest.name << ": a valid point is computed " << covered[at] << " times";
          }
        for (const auto& [key, b] : blocks) {
          EXPECT_FALSE(b.open) << nest.name;
          EXPECT_EQ(b.epilogues, nest.epilogue ? 1 : 0) << nest.name;
          EXPECT_EQ(b.last_closed_by_epilogue, nest.epilogue.has_value()) << nest.name;
          epilogues += b.epilogues;
        }
      }
    }
  }
  EXPECT_GE(nests, 14);       // every case, at both vector widths
  EXPECT_GT(predicated, 0);   // borders and partial blocks
  EXPECT_GT(epilogues, 0);    // the relu fused into the conv
}

// A matmul's packed panels are read by tiles of row blocks that the threads split between them, as many
// tiles each, in order: the busiest thread gets no more than an even share of the row blocks. (On a Zen 4
// a 1000-row sgemm has 125 blocks of 8 rows: 63 and 62 on 2 threads; 4 tiles of 32 gave 64 and 61. Here,
// blocks of 6 rows: 1016 rows on 2 threads fail with the old tiles.)
TEST(SchedulerTest, PackedMatmulRowBlocksAreSharedEvenlyByTheThreads) {
  const Program mm = parse_program("function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  int checked = 0;
  for (int64_t m : {1000, 1016, 600}) {
    for (int threads : {2, 3}) {
      LowerOptions options;
      options.target.threads = threads;
      options.target.cpu.microkernel_min_points = 1;
      options.target.cpu.vector_bits = 512;
      options.target.cpu.l2_bytes = 1 << 20;  // B (2 MB) is packed
      const std::string what = std::to_string(m) + " rows, " + std::to_string(threads) + " threads";
      Lowered lowered = lower(mm, {{"A", {DType::f32, {m, 512}}}, {"B", {DType::f32, {512, 1000}}}}, options);
      for (const Nest& nest : lowered.schedule.nests) {
        if (!nest.microkernel || !nest.parallel_outer) continue;
        const LoopNode* outer = &nest.root;  // the parallel loop
        while (outer->kind != LoopNode::Kind::loop) outer = &outer->body.at(0);
        ASSERT_TRUE(outer->parallel) << what << "\n" << print_loops(lowered.schedule);
        const int64_t values = nest.outer_hi - nest.outer_lo + 1;
        ASSERT_EQ(values % threads, 0) << what << "\n" << print_loops(lowered.schedule);
        std::vector<std::set<int64_t>> rows(static_cast<size_t>(threads));  // each thread's row blocks
        const size_t nb = nest.microkernel->others.size() + 2;
        std::vector<int64_t> it(static_cast<size_t>(nest.iterators));
        run_loops(nest.root, it, [&](const LoopNode& s, const std::vector<int64_t>& args, const std::vector<int64_t>&) {
          if (s.statement != LoopNode::Statement::zero) return;
          const int64_t thread = (it.at(static_cast<size_t>(outer->iterator)) - nest.outer_lo) / (values / threads);
          rows.at(static_cast<size_t>(thread)).insert(args.at(nb - 2));
        });
        size_t blocks = 0, most = 0;
        for (const auto& r : rows) blocks += r.size(), most = std::max(most, r.size());
        EXPECT_LE(most, (blocks + threads - 1) / threads) << what << "\n" << print_loops(lowered.schedule);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6);
}

// The nest sink (NestSink) sees every nest once, in index order, as soon as it is final: what it was handed
// is what the finished schedule holds at that index, for a gradient whose contractions add init nests
// before their updates and fuse a consumer into a micro-kernel.
TEST(SchedulerTest, NestSinkSeesEachNestOnceInOrderAsFinal) {
  Program p = parse_program(R"(function (I[N, H, W, C], K[KH, KW, C, CO], B[CO], DO[N, H, W, CO]) -> (R, DI, DK) {
    O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]);
    R = relu(O + B);
    DI[n, y + j - 1, x + i - 1, c : N, H, W, C] = +(K[j, i, c, co] * DO[n, y, x, co]);
    DK[j, i, c, co : KH, KW, C, CO] = +(I[n, y + j - 1, x + i - 1, c] * DO[n, y, x, co]);
  })");
  std::map<std::string, TensorType> inputs{{"I", {DType::f32, {2, 9, 9, 5}}}, {"K", {DType::f32, {3, 3, 5, 20}}},
                                           {"B", {DType::f32, {20}}}, {"DO", {DType::f32, {2, 9, 9, 20}}}};
  Target target;
  target.cpu.microkernel_min_points = 1;
  target.threads = 2;
  std::vector<std::pair<size_t, Nest>> seen;
  Schedule s = schedule(p, infer_types(p, inputs), target, [&](size_t k, const Nest& n) { seen.emplace_back(k, n); });
  ASSERT_EQ(seen.size(), s.nests.size());
  for (size_t k = 0; k < seen.size(); ++k) {
    EXPECT_EQ(seen[k].first, k);
    EXPECT_EQ(seen[k].second.name, s.nests[k].name);
    EXPECT_EQ(seen[k].second.ast, s.nests[k].ast) << s.nests[k].name;
    EXPECT_EQ(seen[k].second.microkernel.has_value(), s.nests[k].microkernel.has_value()) << s.nests[k].name;
  }
  EXPECT_TRUE(std::any_of(s.nests.begin(), s.nests.end(), [](const Nest& n) { return n.kind == Nest::Kind::init; }));
  EXPECT_TRUE(std::any_of(s.nests.begin(), s.nests.end(), [](const Nest& n) { return n.epilogue.has_value(); }));
}

// A UserError thrown in the middle of scheduling (the second contraction's assign can write twice, found
// when the scheduler analyzes it, after the first one's micro-kernel nest and its isl objects exist)
// reaches the caller with its message, and every isl object is freed on the way: under AddressSanitizer
// the test asks LeakSanitizer on the spot.
TEST(SchedulerTest, UserErrorInTheMiddleOfSchedulingLeaksNothing) {
  Program p = parse_program(R"(function (A[M, K], B[K, N]) -> (C, D) {
    C[m, n : M, N] = +(A[m, k] * B[k, n]);
    D[i : M] = =(C[i, j]);
  })");
  std::map<std::string, TensorType> inputs{{"A", {DType::f32, {64, 64}}}, {"B", {DType::f32, {64, 128}}}};
  ProgramTypes types = infer_types(p, inputs);
  Target target;
  target.cpu.microkernel_min_points = 1;
  Program first = parse_program("function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }");
  Schedule before = schedule(first, infer_types(first, inputs), target);
  ASSERT_TRUE(std::any_of(before.nests.begin(), before.nests.end(), [](const Nest& n) { return n.microkernel.has_value(); }));
  try {
    schedule(p, types, target);
    FAIL() << "an assign that writes twice was scheduled";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("assign contraction D can write an element more than once"), std::string::npos)
        << e.what();
  }
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(__lsan_do_recoverable_leak_check(), 0) << "isl objects leaked when scheduling threw";
#endif
}

// Split reductions (GPU targets): sums whose outputs fill few blocks are computed in slices of their
// longest reduction variable and summed -- proven by isl under `verify` (the slices hold each original
// point once) and equal to the original program in the interpreter; other aggregations, and sums with
// enough outputs, are left alone.
TEST(SchedulerTest, SplitReductionsAreProvenAndKeepTheSum) {
  struct Case {
    const char* text;
    std::map<std::string, TensorType> inputs;
    bool splits;
  };
  const Case cases[] = {
      {"function (I[N, H, W, CI], DO[N, H, W, CO]) -> (DK) {"
       "  DK[j, i, ci, co : 3, 3, CI, CO] = +(I[n, y + j - 1, x + i - 1, ci] * DO[n, y, x, co]); }",
       {{"I", {DType::f64, {2, 12, 11, 3}}}, {"DO", {DType::f64, {2, 12, 11, 4}}}}, true},
      // A reduction to one element, with a default added once.
      {"function (A[M, N], B[]) -> (S) { S[] = +(A[i, j]) default B; }", {{"A", {DType::f64, {40, 30}}}, {"B", {DType::f64, {}}}}, true},
      // The longest reduction variable starts below zero.
      {"function (A[M]) -> (O) { O[i : 3] = +(A[i - j]), j + 40 < 60; }", {{"A", {DType::f64, {50}}}}, true},
      {"function (A[M, N]) -> (O) { O[i : M] = >(A[i, j]); }", {{"A", {DType::f64, {4, 300}}}}, false},
      {"function (A[M, N]) -> (O) { O[i : M] = +(A[i, j]); }", {{"A", {DType::f64, {4000, 3}}}}, false},
  };
  for (const Case& c : cases) {
    Program p = parse_program(c.text);
    LowerOptions options;
    options.verify = true;
    options.target = gpu_target("sm_90");
    options.target.gpu->min_blocks = 32;
    options.target.gpu->min_slice = 8;
    Lowered lowered = lower(p, c.inputs, options);
    const std::string text = print(lowered.program);
    EXPECT_EQ(text.find("_slices[") != std::string::npos, c.splits) << c.text << "\n" << text;
    TensorMap inputs;
    uint64_t seed = 5;
    for (const auto& [name, t] : c.inputs) inputs[name] = testing::random_buffer(t.shape, ++seed);
    TensorMap want = interpret(p, inputs), got = interpret(lowered.program, inputs);
    for (const auto& [name, b] : want) testing::expect_near_buffers(got.at(name), b, 1e-12, std::string(c.text) + " " + name);
  }
}

}  // namespace
}  // namespace polytile::sched
