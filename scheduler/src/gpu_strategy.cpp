// The GPU strategy of a plain nest: decisions added to its target-neutral tree (nest_builder.cpp) from the
// GPU model of the target, as PPCG's kernels and Tensor Comprehensions' outer-block/inner-thread mapping
// do. The band's coincident members (output variables proven to write distinct elements) are mapped: the
// last to x, the one before to y, and all earlier ones, linearized into one, to z. A "block" band of
// tile indices and a "thread" band of positions in the tile are mapped to the launch's blocks and
// threads; the reduction members stay sequential inside each thread, and an update's register tile
// (rows along y, columns interleaved along x so a warp touches consecutive elements) runs innermost, so
// each thread keeps rows x cols accumulators across its reductions. A nest with no coincident member
// runs sequentially on one thread.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "nest_builder.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

namespace {

std::string s(int64_t v) { return std::to_string(v); }

// "floor((e)/d)" and "(e) mod d", left as e where d is 1.
std::string floor_div(const std::string& e, int64_t d) { return d == 1 ? e : "floor((" + e + ")/" + s(d) + ")"; }
std::string mod(const std::string& e, int64_t d) { return d == 1 ? "0" : "(" + e + ") mod " + s(d); }

// One mapped dimension: an affine expression of the variables that starts at 0, and its extent.
struct Mapped {
  std::string expr;
  int64_t extent = 1;
  int64_t threads = 1, per_thread = 1;  // threads of a block along it, outputs per thread (register tile)
  bool interleaved = false;             // a thread's outputs are `threads` apart (x) or consecutive (y)
  std::string block() const { return floor_div(expr, threads * per_thread); }
  std::string thread() const { return mod(interleaved ? expr : floor_div(expr, per_thread), threads); }
  std::string reg() const { return mod(interleaved ? floor_div(expr, threads) : expr, per_thread); }
};

}  // namespace

isl::schedule NestBuilder::gpu_plain_nest(const isl::schedule& neutral, const std::vector<std::string>& vars,
                                          const std::vector<size_t>& order, const NestFacts& facts, KernelLaunch& launch) {
  const GpuModel& gpu = *target.gpu;
  launch = KernelLaunch{};
  std::optional<NeutralBand> band = read_band(neutral, vars, order);
  if (!band || band->parallel == 0 || !band->bounded) return neutral;  // nothing to map: one thread
  isl::schedule_node root = neutral.root().child(0);
  const size_t parallel = band->parallel;
  const std::vector<std::string>& perm = band->members;
  const std::vector<int64_t>& extents = band->extents;
  const std::vector<int64_t>& lows = band->lows;
  auto shifted = [&](size_t k) { return lows[k] == 0 ? perm[k] : "(" + perm[k] + " - (" + s(lows[k]) + "))"; };
  // x, y, then z: the earlier coincident members linearized (injective on the box).
  std::vector<Mapped> dims;
  dims.push_back({shifted(parallel - 1), extents[parallel - 1]});
  if (parallel >= 2) dims.push_back({shifted(parallel - 2), extents[parallel - 2]});
  if (parallel >= 3) {
    Mapped z{shifted(0), extents[0]};
    for (size_t k = 1; k + 2 < parallel; ++k) {
      z.expr = "(" + z.expr + ")*" + s(extents[k]) + " + " + shifted(k);
      z.extent *= extents[k];
    }
    dims.push_back(z);
  }
  // Threads: x up to a warp, y and z fill the block up to the model's aim.
  const int64_t aim = std::clamp(gpu.threads_per_block, 1, 1024);
  dims[0].threads = std::min<int64_t>(dims[0].extent, 32);
  int64_t used = dims[0].threads;
  const int64_t axis_limit[3] = {1024, 1024, 64};
  for (size_t a = 1; a < dims.size(); ++a) {
    dims[a].threads = std::clamp<int64_t>(std::min(dims[a].extent, aim / used), 1, axis_limit[a]);
    used *= dims[a].threads;
  }
  // The register tile: an update with reductions computes rows x cols outputs per thread.
  const bool reductions = parallel < perm.size();
  if (facts.update && reductions) {
    auto per = [](const Mapped& m, int want) {
      return std::clamp<int64_t>((m.extent + m.threads - 1) / m.threads, 1, std::max(1, want));
    };
    dims[0].per_thread = per(dims[0], gpu.tile_cols);
    dims[0].interleaved = true;
    if (dims.size() >= 2) dims[1].per_thread = per(dims[1], gpu.tile_rows);
  }
  const int64_t grid_limit[3] = {(int64_t{1} << 31) - 1, 65535, 65535};
  for (size_t a = 0; a < dims.size(); ++a) {
    const int64_t blocks = (dims[a].extent + dims[a].threads * dims[a].per_thread - 1) / (dims[a].threads * dims[a].per_thread);
    if (blocks > grid_limit[a]) return neutral;  // more blocks than the launch allows: one thread runs it
    launch.grid[a] = blocks;
    launch.block[a] = dims[a].threads;
  }
  launch.sequential = false;
  // Bands, outermost first: blocks (z, y, x), threads (z, y, x), reductions, the register tile.
  std::vector<std::string> blocks, threads, registers;
  for (size_t a = dims.size(); a-- > 0;) {
    blocks.push_back(dims[a].block());
    threads.push_back(dims[a].thread());
    if (dims[a].per_thread > 1) registers.push_back(dims[a].reg());
  }
  std::vector<std::string> rest(perm.begin() + static_cast<long>(parallel), perm.end());
  root = isl_support::delete_node(root);
  if (!registers.empty()) root = insert_band(root, vars, registers, std::vector<bool>(registers.size(), true), true);
  if (!rest.empty()) root = insert_band(root, vars, rest, std::vector<bool>(rest.size(), false), true);
  root = insert_band(root, vars, threads, std::vector<bool>(threads.size(), true), true);
  root = root.insert_mark(statements.thread_mark);
  root = insert_band(root, vars, blocks, std::vector<bool>(blocks.size(), true), true);
  root = root.insert_mark(statements.block_mark);
  return root.schedule();
}

// The mapped loops of a kernel must enclose every statement on every axis with more than one block or
// thread: a statement outside them would run once per block or thread. An axis whose member isl fixed
// everywhere (no loop) needs one; an axis mapped around some statements and not others cannot be launched
// as is, and the nest runs on one thread (false).
bool NestBuilder::finish_kernel(Nest& nest) {
  KernelLaunch& launch = *nest.kernel;
  if (launch.sequential) return true;
  // For each (hardware, axis): statements inside a loop mapped to it, and statements outside.
  int inside[2][3] = {}, outside[2][3] = {};
  std::vector<const LoopNode*> stack;
  std::function<void(const LoopNode&)> walk = [&](const LoopNode& n) {
    if (n.kind == LoopNode::Kind::statement) {
      for (int h = 0; h < 2; ++h)
        for (int a = 0; a < 3; ++a) {
          const auto hw = h == 0 ? LoopNode::Hardware::block : LoopNode::Hardware::thread;
          bool in = std::any_of(stack.begin(), stack.end(), [&](const LoopNode* l) { return l->hardware == hw && l->axis == a; });
          ++(in ? inside : outside)[h][a];
        }
      return;
    }
    stack.push_back(&n);
    for (const auto& c : n.body) walk(c);
    for (const auto& c : n.otherwise) walk(c);
    stack.pop_back();
  };
  walk(nest.root);
  for (int h = 0; h < 2; ++h)
    for (int a = 0; a < 3; ++a) {
      int64_t& extent = h == 0 ? launch.grid[static_cast<size_t>(a)] : launch.block[static_cast<size_t>(a)];
      if (inside[h][a] == 0) extent = 1;
      else if (outside[h][a] != 0) return false;
    }
  return true;
}

}  // namespace polytile::sched::internal

namespace polytile::sched {

Target gpu_target(const std::string& arch) {
  int version = 0;
  bool ok = arch.size() >= 5 && arch.rfind("sm_", 0) == 0 &&
            std::all_of(arch.begin() + 3, arch.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (ok) version = std::stoi(arch.substr(3));
  if (!ok || version < 75)
    user_error("GPU target '", arch, "' is not an NVIDIA architecture sm_XY from sm_75 on (e.g. sm_80, sm_90)");
  Target t;
  t.name = arch;
  t.threads = 1;
  t.gpu = GpuModel{};
  return t;
}

}  // namespace polytile::sched
