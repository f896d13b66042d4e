// The GPU strategy of a plain nest: decisions added to its target-neutral tree (nest_builder.cpp) from the
// GPU model of the target, as PPCG's kernels and Tensor Comprehensions' outer-block/inner-thread mapping
// do. The band's coincident members (output variables proven to write distinct elements) are mapped: the
// last to x, the one before to y, and all earlier ones, linearized into one, to z. A "block" band of
// tile indices and a "thread" band of positions in the tile are mapped to the launch's blocks and
// threads; the reduction members stay sequential inside each thread, and an update's register tile
// (rows along y, columns interleaved along x so a warp touches consecutive elements) runs innermost, so
// each thread keeps rows x cols accumulators across its reductions. A nest with no coincident member
// runs sequentially on one thread.
// Shared memory (PPCG's promotion): an update's inputs that the threads of a block share are read from
// shared tiles. The reductions are tiled by a band between blocks and threads; per block and reduction
// tile, the threads copy each promoted input's footprint (isl's fixed box hull, proven to cover it) into
// its tile together, wait at a barrier, compute, and wait again before the next copy. The reduction tiles
// start whole and the widest is halved until the tiles fit the model's shared memory. Rows of an even
// length are padded by one element (SharedTile::pitch), so that a warp reading down a column of a tile
// spreads over the banks.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "nest_builder.h"
#include "polytile/error.h"

namespace polytile::sched::internal {

namespace {

std::string s(int64_t v) { return std::to_string(v); }

// Whether the consecutive threads of a warp (statement variable `lane`, mapped to x) read `tensor` down a
// column: some access's index in a dimension before the last depends on it. Such a tile needs its rows
// padded to an odd pitch, or the warp's reads fall into few banks; a tile read along its rows or the same
// element by the whole warp does not, and unpadded its rows stay 16-byte aligned, so that a thread's
// consecutive elements load as one vector.
bool reads_down_columns(const std::vector<NestFacts::Read>& reads, const std::string& tensor, unsigned lane) {
  for (const NestFacts::Read& r : reads) {
    if (r.tensor != tensor) continue;
    if (lane >= r.access.domain_tuple_dim()) return true;  // no such variable: pad, as before
    const unsigned dims = r.access.range_tuple_dim();
    // The equalities that define the index (the domain's bounds, which involve every variable, dropped).
    const isl::map defining = isl::manage(isl_map_from_basic_map(isl_map_affine_hull(r.access.copy())));
    for (unsigned d = 0; d + 1 < dims; ++d) {
      isl_map* one = isl_map_project_out(defining.copy(), isl_dim_out, d + 1, dims - d - 1);
      one = isl_map_project_out(one, isl_dim_out, 0, d);
      const isl_bool involved = isl_map_involves_dims(one, isl_dim_in, lane, 1);
      isl_map_free(one);
      if (involved != isl_bool_false) return true;  // an error counts as a column: pad, as before
    }
  }
  return false;
}

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
                                          const std::vector<size_t>& order, const NestFacts& facts, KernelLaunch& launch,
                                          std::vector<SharedTile>& shared, std::optional<Accumulators>& accumulators,
                                          KernelStatements& added, bool z_in_parts) {
  const GpuModel& gpu = *target.gpu;
  launch = KernelLaunch::of(gpu);
  std::optional<NeutralBand> band = read_band(neutral, ordered(vars, order));
  if (!band || band->parallel == 0 || !band->bounded) return neutral;  // nothing to map: one thread
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
  // Threads: x up to a warp, y and z fill the block up to the model's aim. With a register tile (and
  // GpuModel::fit_threads), x has the fewest threads from 8 whose columns cover it, and y no more threads
  // than its rows need.
  const bool register_tile = facts.update && parallel < perm.size();  // an update with reductions
  const unsigned lane = static_cast<unsigned>(std::find(vars.begin(), vars.end(), perm[parallel - 1]) - vars.begin());
  const int64_t aim = std::clamp(gpu.threads_per_block, 1, 1024);
  int64_t x_threads = 32;
  if (register_tile && gpu.fit_threads)
    while (x_threads > 8 && (x_threads / 2) * gpu.tile_cols >= dims[0].extent) x_threads /= 2;
  dims[0].threads = std::min<int64_t>(dims[0].extent, x_threads);
  int64_t used = dims[0].threads;
  const int64_t axis_limit[3] = {1024, 1024, 64};
  for (size_t a = 1; a < dims.size(); ++a) {
    const int64_t need = a == 1 && register_tile && gpu.fit_threads ? (dims[a].extent + gpu.tile_rows - 1) / std::max(1, gpu.tile_rows)
                                                                    : dims[a].extent;
    dims[a].threads = std::clamp<int64_t>(std::min(need, aim / used), 1, axis_limit[a]);
    used *= dims[a].threads;
  }
  // The register tile: an update with reductions computes rows x cols outputs per thread.
  if (register_tile) {
    auto per = [](const Mapped& m, int want) {
      return std::clamp<int64_t>((m.extent + m.threads - 1) / m.threads, 1, std::max(1, want));
    };
    dims[0].per_thread = per(dims[0], gpu.tile_cols);
    dims[0].interleaved = gpu.interleave_columns;
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
  // Bands, outermost first: blocks (z, y, x), [reduction tiles], threads (z, y, x), reductions, the register tile.
  std::vector<std::string> blocks, threads, registers;
  std::vector<int64_t> register_sizes;
  int64_t block_points = 1;  // outputs of a block
  // Where each block holds one value of z, the members z linearizes are the block band's first members
  // (the parts of z, one loop each) rather than the linearization: isl then generates the loops, guards
  // and copies without inverting it (floor and mod of z in every bound: 4x slower on a weight gradient).
  const bool z_parts = z_in_parts && parallel >= 3 && dims[2].threads * dims[2].per_thread == 1;
  added.z_parts.clear();
  if (z_parts)
    for (size_t k = 0; k + 2 < parallel; ++k)
      if (extents[k] > 1) {
        blocks.push_back(shifted(k));
        added.z_parts.push_back(extents[k]);
      }
  for (size_t a = dims.size(); a-- > 0;) {
    if (a == 2 && z_parts) continue;  // one thread along z
    blocks.push_back(dims[a].block());
    threads.push_back(dims[a].thread());
    if (dims[a].per_thread > 1) {
      registers.push_back(dims[a].reg());
      register_sizes.push_back(dims[a].per_thread);
    }
    block_points *= dims[a].threads * dims[a].per_thread;
  }
  std::vector<std::string> rest(perm.begin() + static_cast<long>(parallel), perm.end());
  // The output variables (the mapped ones), in the statement's order: the accumulators' statements' arguments.
  std::vector<size_t> outputs(order.begin(), order.begin() + static_cast<long>(parallel));
  std::sort(outputs.begin(), outputs.end());
  std::vector<std::string> outs;
  for (size_t k : outputs) outs.push_back(vars[k]);
  // The accumulators need each step's positions and elements to match one to one (accumulators_proven).
  std::vector<std::string> mapping = blocks;
  mapping.insert(mapping.end(), threads.begin(), threads.end());
  mapping.insert(mapping.end(), registers.begin(), registers.end());
  const bool accumulate = gpu.accumulators && register_tile && facts.write &&
                          accumulators_proven(neutral, vars, outs, mapping, *facts.write);
  if (accumulate) accumulators = Accumulators{register_sizes, outputs, gpu.masked_registers};
  auto tile_members = [&](const std::vector<int64_t>& tiles) {  // the reduction tiles' band
    std::vector<std::string> members;
    for (size_t k = 0; k < tiles.size(); ++k) members.push_back(floor_div(shifted(parallel + k), tiles[k]));
    return members;
  };
  auto tree_with = [&](const std::vector<int64_t>& tiles) {
    isl::schedule_node at = isl_support::delete_node(neutral.root().child(0));
    if (!registers.empty())
      at = insert_band(at, vars, registers, std::vector<bool>(registers.size(), true), true).insert_mark(statements.register_mark);
    if (!rest.empty()) at = insert_band(at, vars, rest, std::vector<bool>(rest.size(), false), true);
    at = insert_band(at, vars, threads, std::vector<bool>(threads.size(), true), true);
    at = at.insert_mark(statements.thread_mark);
    if (!tiles.empty()) at = insert_band(at, vars, tile_members(tiles), std::vector<bool>(tiles.size(), false), true);
    at = insert_band(at, vars, blocks, std::vector<bool>(blocks.size(), true), true);
    return at.insert_mark(statements.block_mark).schedule();
  };
  auto with_accumulators = [&](const isl::schedule& tree) {
    return accumulate ? graft_accumulators(tree, vars, outs, registers, added) : tree;
  };
  if (!register_tile || gpu.shared_bytes <= 0 || facts.reads.empty()) return with_accumulators(tree_with({}));
  // Reduction tiles: the whole range of each reduction, the widest halved until the promoted tiles fit
  // (the trees tried have no accumulators: they change no step; the boxes are proven once chosen).
  std::vector<int64_t> tiles(extents.begin() + static_cast<long>(parallel), extents.end());
  const isl::union_set domain = neutral.get_domain();
  std::set<std::string> down_columns;  // the inputs a warp reads down their columns: their tiles are padded
  for (const NestFacts::Read& r : facts.reads)
    if (reads_down_columns(facts.reads, r.tensor, lane)) down_columns.insert(r.tensor);
  std::string largest;  // the tensor of the largest tile in the last try (promote)
  for (;;) {
    // The copies' steps: each point to its block and reduction tile (the tree's prefix at the threads).
    std::vector<std::string> step = blocks;
    for (const std::string& m : tile_members(tiles)) step.push_back(m);
    const isl::union_map steps = isl::union_map(ctx.get(), "{ S[" + join(vars) + "] -> [" + join(step) + "] }").intersect_domain(domain);
    int64_t per_tile = block_points;
    for (int64_t t : tiles) per_tile *= t;
    const std::optional<std::vector<Promoted>> promoted =
        promote(steps, facts, per_tile, gpu.min_reuse, gpu.pad_shared ? &down_columns : nullptr,
                std::min(gpu.shared_bytes, GpuModel::static_shared_limit), largest);
    if (promoted) {  // the tiles fit
      if (promoted->empty()) return with_accumulators(tree_with({}));
      for (const Promoted& p : *promoted) prove_cover(p);
      return graft_copies(with_accumulators(tree_with(tiles)), steps, *promoted, shared, added);
    }
    auto widest = std::max_element(tiles.begin(), tiles.end());
    if (*widest == 1) return with_accumulators(tree_with({}));  // not even one reduction point per tile fits
    *widest = (*widest + 1) / 2;
  }
}

// The inputs to promote at a tree's reduction tiles: each read tensor whose footprint over one step (a
// block and a reduction tile) has a fixed-size box (prove_cover proves it covers the footprint), and whose
// elements are read at least `min_reuse` times per tile on average; the tiles of `padded` tensors with
// rows of even length get one more element per row. None when the tiles take more than `budget` bytes:
// the boxes of the tensors after the one that passes it are not computed (the halving of the reduction
// tiles tries one size after another, and a box is most of the cost of a try). `largest` names the
// tensor of the largest tile, and the one named there is taken first where the order cannot change what
// is promoted (every tensor has a tile slot), so that a try that does not fit stops after one box.
std::optional<std::vector<NestBuilder::Promoted>> NestBuilder::promote(const isl::union_map& steps, const NestFacts& facts,
                                                                       int64_t per_tile, int64_t min_reuse,
                                                                       const std::set<std::string>* padded, int64_t budget,
                                                                       std::string& largest) {
  std::vector<const NestFacts::Read*> firsts;  // each tensor's first read, in the reads' order
  for (const NestFacts::Read& r : facts.reads)
    if (std::none_of(firsts.begin(), firsts.end(), [&](const NestFacts::Read* f) { return f->tensor == r.tensor; })) firsts.push_back(&r);
  std::vector<const NestFacts::Read*> order = firsts;
  if (order.size() <= StatementIds::max_tiles)
    std::stable_partition(order.begin(), order.end(), [&](const NestFacts::Read* f) { return f->tensor == largest; });
  std::vector<Promoted> out;
  int64_t bytes = 0, most = -1;
  for (const NestFacts::Read* r : order) {
    if (out.size() == StatementIds::max_tiles) break;
    isl::union_map accesses = isl::union_map(r->access);
    for (const NestFacts::Read& other : facts.reads)
      if (other.tensor == r->tensor) accesses = accesses.unite(isl::union_map(other.access));
    const isl::map footprint = steps.reverse().apply_range(accesses).as_map();
    const isl::fixed_box box = footprint.range_simple_fixed_box_hull();
    if (!box.is_valid()) continue;
    Promoted p;
    p.tile.tensor = r->tensor;
    p.element_bytes = r->element_bytes;
    const isl::multi_val size = box.size();
    for (unsigned d = 0; d < size.size(); ++d) p.tile.sizes.push_back(size.at(static_cast<int>(d)).get_num_si());
    p.tile.pitch = p.tile.sizes.empty() ? 1 : p.tile.sizes.back();
    if (p.tile.elements() * min_reuse > per_tile) continue;
    if (padded && p.tile.sizes.size() >= 2 && p.tile.pitch % 2 == 0 && padded->count(p.tile.tensor)) ++p.tile.pitch;
    const int64_t tile_bytes = p.tile.storage() * static_cast<int64_t>(p.element_bytes);
    if (tile_bytes > most) {
      most = tile_bytes;
      largest = r->tensor;
    }
    bytes += tile_bytes;
    if (bytes > budget) return std::nullopt;
    p.offset = box.offset();
    p.footprint = footprint;
    out.push_back(std::move(p));
  }
  // In the reads' order (the shared tiles' numbers).
  auto rank = [&](const Promoted& p) {
    return std::find_if(firsts.begin(), firsts.end(), [&](const NestFacts::Read* f) { return f->tensor == p.tile.tensor; }) - firsts.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](const Promoted& a, const Promoted& b) { return rank(a) < rank(b); });
  return out;
}

// The proof of a tile: every element a block's valid points read in a reduction tile lies in the box there.
void NestBuilder::prove_cover(const Promoted& p) {
  isl::set local = isl::set::universe(p.footprint.range().space());
  for (size_t d = 0; d < p.tile.sizes.size(); ++d)
    local = isl::manage(isl_set_upper_bound_si(isl_set_lower_bound_si(local.release(), isl_dim_set, static_cast<unsigned>(d), 0),
                                               isl_dim_set, static_cast<unsigned>(d), static_cast<int>(p.tile.sizes[d] - 1)));
  const isl::map cover = isl::manage(
      isl_map_sum(p.offset.as_map().release(), isl_map_from_domain_and_range(p.footprint.domain().release(), local.release())));
  POLYTILE_CHECK(p.footprint.is_subset(cover), "isl's box of ", p.tile.tensor, "'s footprint does not cover it");
}

isl::schedule_node NestBuilder::thread_mark(const isl::schedule& tree) {
  isl::schedule_node n = tree.root();
  while (!(n.isa<isl::schedule_node_mark>() && isl_support::mark_id(n).get() == statements.thread_mark.get())) {
    POLYTILE_CHECK(n.n_children() == 1, "no thread mark in a GPU tree");
    n = n.child(0);
  }
  return n;
}

// The copies and barriers of promoted tiles, grafted around the threads (as PPCG does) for every block and
// reduction tile with points: C0, C1, ..., SyncIn, the threads, SyncOut.
isl::schedule NestBuilder::graft_copies(const isl::schedule& tree, const isl::union_map& steps,
                                        const std::vector<Promoted>& promoted, std::vector<SharedTile>& shared,
                                        KernelStatements& copies) {
  isl::schedule_node node = thread_mark(tree);
  const isl::set all = steps.range().as_set();
  const unsigned depth = all.tuple_dim();
  copies.params.clear();
  for (unsigned k = 0; k < depth; ++k) copies.params.emplace_back(ctx.get(), "P" + std::to_string(k));
  isl::id_list ids(ctx.get(), static_cast<int>(depth));
  for (const isl::id& id : copies.params) ids = ids.add(id);
  const isl::set context = all.bind(isl::multi_id(all.space(), ids));
  const isl::ast_build build = isl::ast_build::from_context(context);
  // Each block and reduction tile (the prefix schedule's values) to its step, as a statement.
  const isl::map step_of = node.prefix_schedule_union_map().reverse().apply_range(steps).as_map();
  auto graft = [&](const isl::id& statement) {
    return isl::schedule_node::from_extension(isl::union_map(step_of.set_range_tuple(statement)));
  };
  for (size_t t = 0; t < promoted.size(); ++t) {
    shared.push_back(promoted[t].tile);
    // The origin as expressions of the parameters.
    const isl::set origin = promoted[t].offset.as_map().bind_domain(isl::multi_id(all.space(), ids));
    std::vector<isl::ast_expr> exprs;
    for (unsigned d = 0; d < origin.tuple_dim(); ++d)
      exprs.push_back(build.expr_from(isl::manage(isl_set_dim_max(origin.copy(), static_cast<int>(d)))));
    copies.origins.push_back(std::move(exprs));
    node = node.graft_before(graft(statements.copy(t)));
  }
  // The barriers run in every block and reduction tile of the steps' hull, not only where the block has
  // points: isl may guard the threads' code by a looser condition than the copies' (loops that then run no
  // iteration), and a barrier under the copies' guard would leave a path from the threads' reads to the
  // next step's copies with no barrier between them. Every thread of a block takes the same branch, since
  // the hull's conditions hold block and tile values only.
  const isl::set hull = isl::manage(isl_set_from_basic_set(isl_set_simple_hull(isl_set_remove_divs(step_of.domain().release()))));
  auto barrier = [&](const isl::id& statement) {
    const isl::map identity = isl::manage(isl_map_identity(isl_space_map_from_set(hull.space().release())));
    return isl::schedule_node::from_extension(isl::union_map(identity.intersect_domain(hull).set_range_tuple(statement)));
  };
  node = node.graft_before(barrier(statements.sync_before));
  node = node.graft_after(barrier(statements.sync_after));
  return node.schedule();
}

// Whether a thread's accumulators can hold its output elements: in each step (a block and reduction
// tile), distinct positions of a thread hold distinct elements and each position one element. The mapped
// members (`mapping`: blocks, threads, register positions) are functions of the output variables, and the
// element is a function of them too (they are the only variables in the output's index): isl proves that
// the mapping determines the output variables (it is injective on their values) and that these and the
// elements determine each other.
bool NestBuilder::accumulators_proven(const isl::schedule& neutral, const std::vector<std::string>& vars,
                                      const std::vector<std::string>& outs, const std::vector<std::string>& mapping,
                                      const isl::map& write) {
  const isl::union_set domain = neutral.get_domain();
  const isl::union_map to_outputs = isl::union_map(ctx.get(), "{ S[" + join(vars) + "] -> O[" + join(outs) + "] }").intersect_domain(domain);
  const isl::union_set values = domain.apply(to_outputs);
  const isl::union_map mapped = isl::union_map(ctx.get(), "{ O[" + join(outs) + "] -> [" + join(mapping) + "] }").intersect_domain(values);
  const isl::union_map elements = to_outputs.reverse().apply_range(isl::union_map(write));
  return mapped.is_injective() && elements.is_single_valued() && elements.is_injective();
}

// The accumulators, grafted as PPCG grafts private copies: inside the threads, in each step, AccIn for
// the output variables' values of every point the thread has in the step (scheduled by a band over their
// positions) before the reductions, and AccOut after them (accumulators_proven must hold).
isl::schedule NestBuilder::graft_accumulators(const isl::schedule& tree, const std::vector<std::string>& vars,
                                              const std::vector<std::string>& outs, const std::vector<std::string>& registers,
                                              KernelStatements& added) {
  isl::schedule_node node = thread_mark(tree).child(0).child(0);  // the reductions, under the thread band
  added.acc_depth = isl_support::schedule_depth(node);
  added.register_depth = registers.empty() ? added.acc_depth : isl_support::schedule_depth(node.child(0).child(0));
  auto map = [&](const std::string& from, const std::string& to) {
    return isl::union_map(ctx.get(), "{ " + from + " -> " + to + " }");
  };
  const std::string S = "S[" + join(vars) + "]", position = "[" + join(registers) + "]";
  const isl::union_map prefix = node.prefix_schedule_union_map().intersect_domain(tree.get_domain());
  // Each step to its statements, scheduled over the positions; every statement notes its position.
  added.positions = map(S, position);
  // A thread's position holds one element in all the steps of its block (accumulators_proven: the mapping
  // is injective on the output variables), so the element is loaded in the first step that has points of
  // it and stored in the last: the registers stay across the reduction tiles in between.
  auto graft = [&](const isl::id& statement, bool first) {
    const std::string tuple = statement.name() + "[" + join(outs) + "]";
    const isl::union_map steps = map(S, tuple).reverse().apply_range(prefix);  // element -> its steps
    const isl::union_map at = (!target.gpu->keep_accumulators ? steps : first ? steps.lexmin() : steps.lexmax()).reverse();
    added.positions = added.positions->unite(map(tuple, position));
    isl::schedule_node g = isl::schedule_node::from_extension(at);
    if (registers.empty()) return g;
    std::vector<std::string> members;
    for (const std::string& r : registers) members.push_back("{ " + tuple + " -> [(" + r + ")] }");
    g = g.child(0).insert_partial_schedule(isl::multi_union_pw_aff(ctx.get(), "[" + join(members) + "]"));
    g = g.insert_mark(statements.acc_mark);
    while (!g.isa<isl::schedule_node_extension>()) g = g.parent();
    return g;
  };
  node = node.graft_before(graft(statements.id(LoopNode::Statement::acc_load), true));
  node = node.graft_after(graft(statements.id(LoopNode::Statement::acc_store), false));
  return node.schedule();
}

// The mapped loops of a kernel must enclose every statement on every axis with more than one block or
// thread: a statement outside them would run once per block or thread. An axis whose member isl fixed
// everywhere (no loop) needs one; an axis mapped around some statements and not others cannot be launched
// as is, and the nest runs on one thread (false). An axis in parts needs a loop of every part around every
// statement (isl may fix one part by the others: the blocks differing in it alone would repeat the work).
bool NestBuilder::finish_kernel(Nest& nest) {
  KernelLaunch& launch = *nest.kernel;
  if (launch.sequential) return true;
  // The parts of each (hardware, axis) the loops map, by their stride, with their extents (0: the whole).
  std::map<int64_t, int64_t> parts[2][3];
  std::function<void(const LoopNode&)> collect = [&](const LoopNode& n) {
    if (n.kind == LoopNode::Kind::loop && n.hardware != LoopNode::Hardware::none)
      parts[n.hardware == LoopNode::Hardware::block ? 0 : 1][n.axis][n.part_stride] = n.part_extent;
    for (const auto& c : n.body) collect(c);
    for (const auto& c : n.otherwise) collect(c);
  };
  collect(nest.root);
  // For each (hardware, axis): statements inside loops of all its parts, and statements outside some.
  int inside[2][3] = {}, outside[2][3] = {};
  std::vector<const LoopNode*> stack;
  std::function<void(const LoopNode&)> walk = [&](const LoopNode& n) {
    if (n.kind == LoopNode::Kind::statement) {
      for (int h = 0; h < 2; ++h)
        for (int a = 0; a < 3; ++a) {
          const auto hw = h == 0 ? LoopNode::Hardware::block : LoopNode::Hardware::thread;
          // A copy runs on all the threads of its block together: it is inside no thread loop.
          if (h == 1 && n.statement == LoopNode::Statement::copy) continue;
          std::set<int64_t> around;
          for (const LoopNode* l : stack)
            if (l->hardware == hw && l->axis == a) around.insert(l->part_stride);
          const bool in = !around.empty() && around.size() == parts[h][a].size();
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
      int64_t product = 1;
      for (const auto& [stride, part] : parts[h][a]) product *= part;
      if (inside[h][a] == 0) extent = 1;
      else if (outside[h][a] != 0) return false;
      else if (parts[h][a].size() > 1 || parts[h][a].begin()->second != 0) {
        // the parts found must be all the axis has: their extents multiply to its size
        if (product != extent) return false;
      }
    }
  return true;
}

}  // namespace polytile::sched::internal

namespace polytile::sched {

int64_t Accumulators::elements() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

KernelLaunch KernelLaunch::of(const GpuModel& model) {
  KernelLaunch launch;
  launch.index32 = model.index32;
  launch.unroll = model.unroll;
  launch.unswitch = model.unswitch_registers;
  launch.vector_copies = model.vector_copies;
  return launch;
}

std::string GpuModel::key() const {
  std::string k;
  for (int64_t v : {int64_t{threads_per_block}, int64_t{tile_rows}, int64_t{tile_cols}, shared_bytes, min_reuse, min_blocks,
                    min_slice, max_split_bytes, int64_t{accumulators}, int64_t{keep_accumulators}, int64_t{pad_shared}, int64_t{fit_threads},
                    int64_t{masked_registers}, int64_t{index32}, int64_t{unroll}, int64_t{interleave_columns},
                    int64_t{unswitch_registers}, int64_t{vector_copies}, int64_t{fit_registers}})
    k += (k.empty() ? "" : "/") + std::to_string(v);
  return k;
}

std::vector<std::pair<std::string, GpuModel>> gpu_tuning_candidates(const GpuModel& base) {
  std::vector<std::pair<std::string, GpuModel>> out;
  auto add = [&](const std::string& description, const GpuModel& m) {
    for (const auto& [d, earlier] : out)
      if (earlier.key() == m.key()) return;  // the base had it already
    out.emplace_back(description, m);
  };
  add(base.key() == GpuModel{}.key() ? "default" : "as given", base);
  GpuModel masked = base;
  masked.masked_registers = true;
  add("masked=1", masked);
  GpuModel fit = base;
  fit.fit_threads = true;
  add("fit=1", fit);
  // The larger register tiles with 64-bit indices: on an H200 (2026-11-27) 32-bit ones made them slower
  // (8x4: geometric mean against the peers 0.33 against 0.38; the 256-channel 3x3 forward 2.1x), while the
  // default's tiles gained 1.05x.
  for (const auto& [rows, cols] : {std::pair{8, 4}, {4, 8}, {8, 8}}) {
    GpuModel m = fit;
    m.tile_rows = rows;
    m.tile_cols = cols;
    m.index32 = false;
    add("fit=1,tile=" + std::to_string(rows) + "x" + std::to_string(cols) + ",index32=0", m);
  }
  return out;
}

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
