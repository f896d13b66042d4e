// The scheduler: from a Program at concrete shapes to loop nests, through isl. Every contraction becomes
// up to three nests -- init (identity or default tensor), update (the valid points, aggregating into the
// output), finalize (elements no valid point writes become 0; the set is computed exactly by isl) -- and
// every elementwise statement one nest over its output box. Each nest gets an isl schedule tree with a
// band ordering output variables first, tiled by the target's cost model, and marks for the decisions
// taken ("parallel" when distinct iterations of the outer loop provably write distinct elements,
// "tile", "point", "vector"); isl generates the loop AST, which is handed on in a small isl-free loop IR.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "polytile/ir.h"
#include "polytile/shapes.h"

namespace polytile::sched {

// The machine model of the CPU strategy (cache tiles, micro-kernels, row reductions, the parallel split).
struct CpuModel {
  int vector_bits = 512;        // widest SIMD register
  int64_t l1_bytes = 48 * 1024; // per core data cache
  int64_t l2_bytes = 2 * 1024 * 1024;
  int64_t l3_bytes = 32 * 1024 * 1024;  // the last level, shared by the cores
  int vector_registers = 32;    // architectural SIMD registers (accumulators + operands of a micro-kernel)
  // Full-width vector FMAs a core issues per cycle: 2 on Intel's AVX-512 and on AVX2 cores, 1 where a
  // 512-bit operation takes both 256-bit pipes (Zen 4). The micro-kernel plan's throughput model weighs a
  // block's FMAs against its loads and loop overhead with it.
  int fma_per_cycle = 2;
  // Cycles from an FMA to the next FMA on the same accumulator (4 on Zen 3 and 4, Skylake and its
  // successors): a micro-kernel step with fewer than fma_latency x fma_per_cycle accumulators waits on
  // them, and the plan's model counts that (a 3x3x1x32 weight gradient's 1 x 2 blocks ran at half the FMA
  // peak of a Zen 4).
  int fma_latency = 4;
  // Micro-kernel columns of this many vectors (a last column past the vector variable's range is masked),
  // where they leave registers for two rows and the range has that many (0, or where they do not: the
  // plan's throughput model chooses; CompileOptions::tune tries 2 and 4).
  int microkernel_chunks = 0;
  // Micro-kernel reduction tiles may read this percentage of the bytes the plan's rule gives them (three
  // quarters of L1, or an eighth of L2 for long reductions and on a core of one FMA a cycle;
  // CompileOptions::tune tries 50 and 200).
  int reduction_tile_percent = 100;
  // Update nests with at least this many points use register-blocked micro-kernels when eligible.
  int64_t microkernel_min_points = int64_t{1} << 15;
  // Split reductions (split_reductions): a sum with at most split_max_outputs output elements and at least
  // split_min_points reduction points for each (a bias gradient, a column sum, a total) has no loop worth
  // splitting across threads (its few outputs are the vectorized inner loop); it is computed in one slice
  // of its longest reduction variable per thread, and the slices' partial sums added.
  int64_t split_max_outputs = 1024;
  int64_t split_min_points = 16384;
  // ... and a sum, maximum or minimum whose threads would each read a part of every line of an input (a
  // column sum: its output's one variable is an input's last index), split along rows, where every output
  // has at least this many points and the slices' partial results fit in half of L1.
  int64_t split_line_min_points = 1024;
  // Row groups (NestGroup): consecutive row-local nests run chunk by chunk together; false runs every
  // nest over its whole range before the next.
  bool row_groups = true;
  // Micro-kernels whose blocks march along their broadcast operand's lines prefetch it a cache line or
  // more ahead (Microkernel::prefetch_bytes), those whose blocks each read pages of it that no other block
  // reads prefetch the next block's rows (prefetch_next_block), and fused epilogues that read rows of
  // their own prefetch the next block's (prefetch_epilogue); false emits no prefetches.
  bool prefetch = true;
  // Stores that bypass the caches (Nest::stream) for program outputs of at least a quarter of the last
  // level (glibc's memcpy switches to them at that size too); false: every store goes through the caches.
  // The host's target (cpu::host_target) turns them on for AMD's CPUs only, where they were measured faster.
  bool stream_stores = true;
  // A micro-kernel's vector operand whose rows lie 2 KiB or more apart is copied into panels
  // (pack_vector_operand) even where the whole operand fits in a core's L2; false leaves such an operand
  // unpacked. cpu::host_target's rule for a CPU: false on AMD's Zen cores, where that was measured faster.
  bool pack_within_l2 = true;
};

// The machine model of the GPU strategy (sched::gpu_target): the launch shapes it aims for. The
// architecture is the target's name.
struct GpuModel {
  int threads_per_block = 256;  // what the strategy aims for (at most 1024, the limit of every sm_75+ GPU)
  // Update nests with reductions get a register tile: each thread computes rows x cols outputs (rows
  // along the second mapped dimension, cols interleaved along the first, so that a warp's loads and
  // stores stay coalesced), with the reduction loops outside the tile.
  int tile_rows = 4, tile_cols = 4;
  // Shared memory for promoted inputs (SharedTile) per block, at most; 0 promotes nothing. The tiles are
  // static shared memory, of which every sm_75+ GPU gives a block 48 KiB (the most used, whatever this says).
  static constexpr int64_t static_shared_limit = 48 * 1024;
  int64_t shared_bytes = static_shared_limit;
  // An input is promoted when each element of its tile is read at least this many times per tile.
  int64_t min_reuse = 4;
  // Split reductions (split_reductions): a sum whose outputs fill fewer blocks than this (two per
  // multiprocessor of an A100; an H100 has 132) is computed in slices of its longest reduction variable,
  // each slice with at least min_slice reduction points per output element, the partial sums taking at
  // most max_split_bytes.
  int64_t min_blocks = 216;
  int64_t min_slice = 256;
  int64_t max_split_bytes = int64_t{256} << 20;
  // Update kernels keep each thread's outputs in registers (Accumulators) where isl proves it safe.
  bool accumulators = true;
  // The accumulators stay in registers from an element's first reduction tile to its last (loaded and
  // stored once); false loads and stores them in every reduction tile, as before (for comparison).
  bool keep_accumulators = true;
  // Shared tiles whose rows have an even length and whose columns a warp reads (the lanes' variable in an
  // index before the last) get one element of padding per row (SharedTile::pitch); the others stay aligned.
  bool pad_shared = true;
  // The threads of an update with a register tile fit it: along x as few as make each thread's columns
  // fill the tile (down to 8; 64 channels with 4 columns: 16 threads) instead of a whole warp, so that
  // narrow outputs still get rows x cols outputs per thread, and along y no more than its rows need. Off
  // by default: on an H200 it sped up some convolutions by up to 1.2x and slowed others by up to 2.7x
  // (fewer threads per block where y is short); a cost model should choose.
  bool fit_threads = false;
  // A register tile whose positions isl guards (a padded convolution's rows at the image's edge) runs
  // without branches: every position loads its operands, from a clamped element of each shared tile where
  // out of range, and keeps its accumulator there, so that an operand the guard does not touch (the
  // filter, across the rows) is loaded once instead of once per position (Accumulators::masked). Off by
  // default: on an H200 it made the 3x3 forwards with 4x4 and 4x3 tiles 1.15x faster and the stride-2
  // forward (4x2) 1.25x slower (the selects and clamps cost more issue slots than the loads they save); a
  // tuning candidate.
  bool masked_registers = false;
  // Kernels compute their indices (iterators, bounds, offsets) in 32 bits where every tensor they touch,
  // their launch and their loop bounds fit in 30 bits: a GPU adds, compares and multiplies 64-bit integers
  // with two instructions or more. Off: in 64 bits, as the host's code does.
  bool index32 = true;
  // A kernel's innermost sequential loop (the reduction around the register tile) is unrolled this many
  // times on the device, so that a step's shared loads issue while the step before computes (ptxas does
  // not pipeline loops). 0: no hint, LLVM's and ptxas's own choice; 1: not unrolled.
  int unroll = 4;
  // A thread's register tile columns are interleaved, a warp's width apart (its loads and stores of a
  // column coalesced); false: consecutive, so that a thread's columns of a shared tile load as one vector
  // (ld.shared.v4.f32 for 4 columns) and its accumulators are stored once at the end anyway. A tuning
  // candidate, not yet timed.
  bool interleave_columns = true;
  // A kernel's innermost reduction loop around a register tile with guarded positions (a padded
  // convolution's rows at the image's edge) runs in two versions: without the guards where the thread's
  // every position is in range (all but the threads at the edges), as it is elsewhere. Unguarded, a
  // position's operands load as vectors along the reduction and the operands the guard does not touch
  // once for all positions. False: one version, guarded. Not yet timed on a GPU.
  bool unswitch_registers = true;
  // A shared tile's copy moves 16-byte vectors where its rows, the input's rows and the block's origin
  // allow and the input's address is aligned (else elements), each thread loading up to 64 bytes before
  // storing any. False: element by element, each stored before the next is loaded (as before; for
  // comparison). Not yet timed on a GPU.
  bool vector_copies = true;
  // Where the CUDA toolkit's ptxas is found, ptx::compile assembles each kernel as soon as its PTX exists,
  // and one that spills registers at ptxas's own choice gets a register ceiling ptxas fills instead
  // (`.minnctapersm`: as many blocks per multiprocessor as its registers allowed, then one fewer, down to
  // one, until it spills nothing). ptxas picks fewer registers than a block's threads could have (64 for
  // 256 threads, the budget of 4 resident blocks) and spilled hoisted addresses of three benchmark kernels
  // (4-64 bytes). False: ptxas's choice, whatever it spills. The PTX then depends on the toolkit's ptxas
  // where one is found (as what the driver's JIT makes of it does).
  bool fit_registers = true;
  // Every field above, as text: what a cache of compiled kernels keys them by (a new field goes here too).
  std::string key() const;
};

// The GPU models to tune among (ptx::tune), since no single model wins everywhere (on an H200 the best
// of these was up to 1.7x faster than the default on some convolutions and 5x slower on others): the
// models to try around `base` -- itself first ("default" or "as given"), then its register tiles masked
// (GpuModel::masked_registers), then its threads fitted to the register tile
// (GpuModel::fit_threads), alone and with register tiles 8x4, 4x8 and 8x8 (with 64-bit indices), each described by the
// `--gpu-model` keys it changes ("fit=1,tile=8x4"); a model the base already is is not repeated.
std::vector<std::pair<std::string, GpuModel>> gpu_tuning_candidates(const GpuModel& base = {});


// What a schedule is made for: the part every target has, and the model of the strategy that adds its
// decisions (marks and bands) to the target-neutral schedule trees. The defaults describe no particular
// machine; cpu::host_target() (polytile/cpu.h) reads the running one, gpu_target() describes an NVIDIA GPU.
// A target with `gpu` makes every nest a kernel (Nest::kernel), for the architecture `name` (sm_XY); the
// CPU model is then unused.
struct Target {
  std::string name = "cpu";
  int threads = 2;
  CpuModel cpu;
  // The CPU the machine code is for, as LLVM names it ("znver3", "skylake-avx512", "x86-64-v3"): its
  // instruction set and scheduling model (cpu::cpu_target). Empty: the machine this process runs on.
  std::string cpu_name;
  std::optional<GpuModel> gpu;
  // The loops of a box domain's plain nest (its variables permuted, tiled, two merged) are written by the
  // scheduler itself, as isl's AST build would write them but about a millisecond a loop level sooner
  // (Nest::direct_loops). False: isl builds every nest's loops -- the same loops and text, for comparison.
  bool direct_box_loops = true;
  // The loops of a micro-kernel nest -- around its steps (blocks and reduction tiles) and each step's fma
  // loops -- are scanned by the scheduler (Fourier-Motzkin elimination), not by isl's AST build: the same
  // statements in the same order, bounds written otherwise (Nest::direct_loops: its steps' loops). False:
  // isl builds them.
  bool direct_step_loops = true;
};

// The GPU target of an architecture "sm_XY" (sm_75 and later), with the defaults of GpuModel. UserError for
// anything else, naming it.
Target gpu_target(const std::string& arch);

// An integer or boolean expression over loop iterators, as isl's AST writes loop bounds, guards and
// statement arguments: affine arithmetic, floor division and remainder, min/max, comparisons, and/or, select.
struct LoopExpr {
  enum class Kind { constant, iterator, add, sub, mul, floordiv, mod, min, max, neg, select, eq, le, lt, ge, gt, land, lor };
  Kind kind = Kind::constant;
  int64_t value = 0;  // constant
  int iterator = -1;  // iterator index
  std::vector<LoopExpr> args;
  std::string str() const;
};

struct LoopNode {
  // barrier: in a GPU kernel, every thread of the block waits here until all have arrived (and their
  // shared-memory writes are visible); never inside a loop mapped to threads (see check_barriers).
  enum class Kind { block, loop, guard, statement, barrier };
  // GPU kernels: a loop mapped to the hardware runs one iteration per block (or thread) of the launch, the
  // one whose index along `axis` (0 = x, 1 = y, 2 = z) equals the iterator's value -- when that value lies
  // in the loop's range (lower <= it, condition, a multiple of step from lower); the others run nothing.
  // Several loops may share an axis as its parts: a part's value is (index / part_stride) % part_extent,
  // the axis the parts' values linearized (z = n * H + y: two loops, z / H and z % H).
  enum class Hardware { none, block, thread };
  // The statements of a micro-kernel nest (see Microkernel); every other nest has only `plain`.
  // `copy` fills a kernel's shared tile (Nest::shared[tile]) with all the threads of its block;
  // `acc_load` and `acc_store` move one of a thread's accumulators (Nest::accumulators) from and to the
  // output element at `args`, the values of the output variables.
  enum class Statement { plain, zero, load, fma, store, epilogue, copy, acc_load, acc_store };
  Kind kind = Kind::block;
  Statement statement = Statement::plain;
  bool predicated = false;  // micro-kernel statement of a block that is partial or not uniform
  // block: either variant of a micro-kernel step that has both (uniform and predicated); a code
  // generator may make each a function of its own, compiled apart from the rest of the nest (the
  // uniform one's statements are all unpredicated, the other's predicated).
  bool separate = false;
  int tile = -1;            // copy: the index of its shared tile
  // loop: for (it = lower; condition; it += step)
  int iterator = -1;
  LoopExpr lower, condition;
  int64_t step = 1;
  // A register loop of a kernel (Nest::accumulators): its iterator only takes values in [0, unroll), so
  // the emitter runs it over that whole range, the body guarded by the loop's own range, and unrolls it.
  int64_t unroll = 0;
  bool parallel = false;
  Hardware hardware = Hardware::none;
  int axis = 0;
  int64_t part_stride = 1;  // a part of its axis: the index divided by part_stride, modulo part_extent
  int64_t part_extent = 0;  // 0: the whole axis
  // guard: if (condition) body else otherwise
  std::vector<LoopNode> body;  // block children, loop body, guard body
  std::vector<LoopNode> otherwise;
  // statement: the values of the statement's domain variables
  std::vector<LoopExpr> args;
  // statement of a kernel with accumulators (plain update, acc_load, acc_store): the position of its
  // accumulator, one value per dimension of Nest::accumulators.
  std::vector<LoopExpr> registers;
};

// A register-blocked update: the output is computed in blocks of `rows` consecutive values of the block
// variable b times `chunks` vectors of `lanes` consecutive values of the vector variable v (contiguous in
// the output). A block's accumulators are loaded into registers (statement `load`), every reduction point
// of the block adds rows x chunks fused multiply-adds -- an input without v is broadcast, an input with v
// contiguous is loaded as vectors -- (`fma`), and the accumulators are stored (`store`). Without a default
// tensor, a block's first reduction tile starts from zero accumulators (`zero`) instead of loading, and the
// init nest only covers the output elements no block stores. An elementwise consumer of the output (bias,
// activation) can be fused as an `epilogue`: at a block's last reduction tile it is computed from the
// accumulators and stored to its own tensor; the contraction's output is then only scratch. Blocks in which
// every row has the same reduction points and every lane is in range run unpredicated; the others
// (borders, partial blocks) guard each row by the validity of its point and mask lanes past v's range.
// Statement arguments: load/store (others..., Bb, Bv, reduction tiles...), fma (others..., Bb, Bv,
// reductions...), with b = block_lo + rows * Bb + row and v = vector_lo + chunks * lanes * Bv + lane.
struct Microkernel {
  size_t block = 0, vector = 0;           // indices into Nest::variables
  std::vector<size_t> others, reductions; // the other output variables, the reduction variables
  int rows = 1, chunks = 1, lanes = 1;
  int64_t block_lo = 0, vector_lo = 0, vector_hi = 0;
  // When positive, every fma step prefetches the element `prefetch_bytes` past row 0's element of each
  // broadcast input whose rows differ. Set when those inputs hold the block variable contiguously (a
  // weight gradient's I[n, y, x, ci] with blocks of ci; not a forward conv's or a matmul's rows, which
  // are whole input rows apart): the blocks inside a reduction tile then march along the input's cache
  // lines, each line read by the two or three blocks that share it, and the reduction steps a whole
  // input row apart (1 KiB for 256 channels) defeat the hardware prefetchers, so the first block to touch
  // a line would wait for it from L3 or memory at every step.
  int64_t prefetch_bytes = 0;
  // When set, every fma step prefetches one element of the next block's broadcast input: row r mod rows
  // of block Bb + 1 at the step's reduction point, r the innermost reduction variable. Set when the
  // output has one block column, each element of the broadcast input is read at one reduction point of
  // one row (so by one block, once: a 1x1 convolution's pixels), and a block's rows, less than a 4 KiB
  // page apart, span a page or more: each block then reads pages of its own, and the hardware prefetchers
  // stop at page boundaries, so without it every block would start its rows' streams cold.
  bool prefetch_next_block = false;
  // When positive, every fma step of a uniform block prefetches each cache line of its vector operand
  // this many steps of the innermost reduction variable ahead. Set where the reduction tiles are sized
  // for L2 (plan.h long_tiles: a product whose output overflows L2, as sgemm 2048's packed panels of
  // 2048 x 64 floats, 512 KiB, in one tile): the vector operand then streams from L2 at every block, a
  // step's lines (4 of them for 4 chunks of 16 floats) for every step's 24 FMAs, and asked for ahead its
  // loads find them in L1.
  int prefetch_vector_steps = 0;
  // The tensors a fused epilogue reads with a different element for each row of the block: at each
  // block's epilogue, their lines at the next block's rows (Bb + 1) are prefetched. Set with the target's
  // prefetch where there are such inputs: the blocks of one column visit their rows a whole row apart (a
  // 6-row block of a 1024-wide product: 4 lines of each row, rows 4 KiB apart), which the hardware
  // prefetchers do not follow, and an epilogue runs only at a block's last reduction tile, so without it
  // every epilogue waited for its lines from memory (a transformer's training step: the GELU gradient's
  // epilogue reads two 4 MiB tensors of the forward pass; see microkernel.cpp).
  std::vector<std::string> prefetch_epilogue;
  // Every lane of every block is in the vector variable's range (isl: no block has a lane outside it, as
  // with 64 channels in blocks of 16): predicated blocks then mask their rows only, never their lanes.
  bool lanes_in_range = false;
};

// A vectorized row reduction: a float sum, max or min over a reduction variable r that every input reads
// contiguously (or not at all) and whose range is the same at every other point (a softmax row max, a
// dot product). Each output element gets `accumulators` vectors of `lanes` lanes set to the identity
// (`zero`), every step (`fma`, arguments: outputs..., other reductions..., group) folds accumulators x
// lanes consecutive r values into them, lanes past r's range masked, and `store` reduces the lanes and
// aggregates the result into the element. Max and min propagate NaN like the plain nests.
struct RowReduction {
  size_t vector = 0;                       // index of r in Nest::variables
  std::vector<size_t> outputs, others;     // output variables, the other reduction variables
  int accumulators = 4, lanes = 1;
  int64_t lo = 0, hi = 0;                  // r's range
  // r's range depends on the other variables (an NCHW depthwise conv's weight gradient, x + i - 1 in the
  // image): every step masks its lanes by the accesses and constraints on r (unmasked where all hold).
  bool ragged = false;
  // Reduction tiles (where rows share what they read and one row reads more than half of L1): the first
  // `hoisted` of `others` run outside the output variables after the first `outer_outputs`, the last of
  // them in tiles of `tile` values; each row sums its accumulators into the output once a tile.
  size_t outer_outputs = 0, hoisted = 0;
  int64_t tile = 0;
  // The rows' outer loop over S's dims (d0, d1, ...) where the first two output variables run as one,
  // "(e1*d0 + d1)" (NestBuilder::fuse_leading, by the bytes the rows read): a batched softmax's B x L rows,
  // as its elementwise nests run them. Empty: the first output variable leads.
  std::string fused_outer;
};

// The launch of a GPU kernel: one nest, its mapped loops' iterator values running from 0 to grid - 1
// (blocks) and 0 to block - 1 (threads) on each axis. A nest whose writes are not provably distinct for
// distinct output elements (a scatter, a reduction to one element) runs sequentially on one thread.
struct KernelLaunch {
  std::array<int64_t, 3> grid{1, 1, 1};
  std::array<int64_t, 3> block{1, 1, 1};
  bool sequential = true;  // nothing mapped: grid and block of one (the strategy clears it when it maps)
  // Index arithmetic in 32 bits where the kernel's tensors, launch and loop bounds fit (GpuModel::index32).
  bool index32 = true;
  // How many times the code generator unrolls the kernel's innermost sequential loop (GpuModel::unroll).
  int unroll = 4;
  // Whether the code generator unswitches guarded register tiles (GpuModel::unswitch_registers).
  bool unswitch = true;
  // Whether shared tiles are copied in vectors, several loads at a time (GpuModel::vector_copies).
  bool vector_copies = true;
  int64_t blocks() const { return grid[0] * grid[1] * grid[2]; }
  // A sequential launch (one thread) with the code generator's choices the model makes.
  static KernelLaunch of(const GpuModel& model);
};

// A GPU kernel's input promoted to shared memory (as PPCG promotes): for one block of outputs and one
// tile of the reduction loops, a box of the input that holds every element the block's valid points read
// in the tile (isl's fixed box hull of the footprint; isl proves the cover when the kernel is built). A
// `copy` statement, run by all the threads of the block together (box element e, row-major, by the
// thread whose linear index is e modulo the block's thread count, so that consecutive threads read
// consecutive elements), sets the tile's origin -- its arguments, one index per dimension of the input --
// and fills the box from the input; elements outside the input's bounds are left unset, as no valid point
// reads them. Until the next copy of the tile, the update statement reads the input's element at `index`
// from the tile's element at `index - origin`. Barriers separate a copy from the threads that read the
// tile and those from the next copy (check_barriers). The tile's rows (its last dimension) are `pitch`
// elements apart in memory, at least the last size: an odd pitch puts the elements of one column in
// different banks, so threads reading down a column (a gradient reading a filter by its input channel)
// do not wait for each other.
struct SharedTile {
  std::string tensor;
  std::vector<int64_t> sizes;
  int64_t pitch = 0;
  int64_t elements() const;  // of the box
  int64_t storage() const;   // in memory, with the rows' padding
};

// A GPU update kernel's accumulators (as PPCG promotes to private memory): each thread keeps the output
// elements of its register tile in a local array of `sizes` (the register tile's dimensions), which the
// device holds in registers once the register loops are unrolled. In each step (a block and reduction
// tile), a thread first loads (acc_load) the element of every position of its tile that has points in the
// step, then its update statements aggregate into the accumulator at their position instead of the
// output, then it stores them back (acc_store). The loads and stores take the values of the output
// variables (`variables`, indices into Nest::variables, the only ones in the output's index). isl proves
// that in each step a thread's positions and elements match one to one.
struct Accumulators {
  std::vector<int64_t> sizes;
  std::vector<size_t> variables;
  // Register loops with guards run branch-free where every input is read from a shared tile
  // (GpuModel::masked_registers): out of range, a position reads clamped elements and keeps its accumulator.
  bool masked = false;
  // The update writes every output element (isl: the elements are the write map's image) and keeps its
  // accumulators from an element's first step to its last (GpuModel::keep_accumulators): the first step
  // starts them at the aggregation's identity instead of loading the element, and no init nest writes it
  // before (`AccIn(...) acc[...] = identity` in the loop IR).
  bool from_identity = false;
  int64_t elements() const;
};

// One loop nest and the statement its instances execute.
struct Nest {
  enum class Kind { init, update, finalize, elementwise };
  Kind kind = Kind::update;
  std::string name;                   // e.g. "DI.update"
  std::string tensor;                 // the tensor written
  Contraction contraction;            // init, update, finalize
  Elementwise elementwise;            // elementwise
  std::vector<std::string> variables; // the statement's domain variables (statement args, in order)
  LoopNode root;
  int iterators = 0;
  // The root is a loop (or a block of loops) over the outermost schedule dimension whose iterations may
  // run concurrently; the runtime splits [outer_lo, outer_hi] (inclusive) across threads.
  bool parallel_outer = false;
  int64_t outer_lo = 0, outer_hi = 0;
  // CPU nests of plain loops: at most this many statement instances (the product of the domain's extents),
  // so that the code generator can tell a nest that runs in microseconds; -1 where not counted (micro-kernels,
  // row reductions, GPU kernels) or unbounded.
  int64_t points = -1;
  // Update nests of a sum in which isl proves every element is written by one point at most (a pooling
  // gradient's scatter, a strided copy): each point stores 0 + its term, without reading the element, and
  // the init nest covers only the elements no point writes.
  bool stores = false;
  // CPU transpositions (a copy of 4- or 8-byte elements whose input's contiguous variable is not the
  // output's, each last index a plain variable): the two innermost loops run over transpose_lanes values
  // of the input's contiguous variable and, inside, as many of the output's; the code generator moves such
  // a square by vectors, transposed in registers. 0: none.
  int transpose_lanes = 0;
  // ... and where a range ends in half a square, the edge squares move their whole quarters as squares of
  // transpose_lanes / 2 (the other edges run the loops).
  bool transpose_half_edges = false;
  // CPU nests of plain loops (not transpositions), and micro-kernels without epilogue that store each
  // block's accumulators once, that write a program output no later nest touches, without reading it,
  // and large enough that the caller will not find it in the caches anyway (CpuModel::stream_stores): the
  // code generator may store it past the caches (non-temporal stores, where its vector stores are
  // aligned), which saves reading each line before writing it. Also copies into a micro-kernel's packed
  // panels of a core's L2 or more: every thread reads them, so through the caches the next run's stores
  // would each wait for the other cores' copies of the line to be dropped.
  bool stream = false;
  std::optional<Microkernel> microkernel;  // update nests only
  std::optional<RowReduction> reduction;   // update nests only
  std::optional<Elementwise> epilogue;     // micro-kernel nests: the fused elementwise consumer
  // Micro-kernel nests: an assign that only moves the output's dims into another order (an NCHW conv's
  // output, which its micro-kernel computes with the channels last, prepare_layouts' permuted output),
  // done by the blocks instead of a nest of its own: at a block's last reduction tile (the epilogue's
  // statement) the accumulators are stored into that assign's output, transposed in registers (each lane's
  // rows one vector: set only where the block variable is contiguous there and the blocks store every
  // element). The contraction's output is then only scratch for the earlier tiles' partial sums.
  std::optional<Contraction> permuted_copy;
  std::optional<KernelLaunch> kernel;      // GPU targets: every nest is a kernel
  std::vector<SharedTile> shared;          // kernels: inputs of the update read from shared memory
  std::optional<Accumulators> accumulators;  // update kernels: the output kept in registers
  // Update nests: cheap elementwise producers of inputs read by nothing else, evaluated where the input
  // is read instead of being materialized (keyed by the input tensor).
  std::map<std::string, Elementwise> inlined;
  std::string tree;                   // isl schedule tree with marks
  std::string ast;                    // isl's C rendering of the loops
  bool direct_loops = false;          // root and ast written without isl's AST build (Target::direct_box_loops,
                                      // direct_step_loops: its steps' loops)
};

// The tensors a nest's code reads or writes (its buffers): the tensor written first, then the others in
// the order its statement names them.
std::vector<std::string> nest_tensors(const Nest& nest);

// Nest::permuted_copy: the indices into the copy's output of the element that `c` writes at its output
// indices -- dim q of the copy's output is the dim of c's output that the copy's input index names.
std::vector<Polynomial> permuted_indices(const Contraction& c, const Contraction& copy);

// Nests that run together, a few rows at a time (the CPU): consecutive nests first..last, each with a
// parallel outer loop over the same range, where isl proves that iteration c of every nest reads and writes
// only elements that the group's earlier nests write in their own iteration c, or that no nest of the group
// writes -- and that no later nest writes an element an earlier one reads in another iteration. The runtime
// then runs, for each chunk of `rows` consecutive outer iterations, every nest of the group on that chunk
// before the next chunk (chunks on different threads at once), so that what one nest writes is still in
// cache when the next reads it: a softmax and its gradient pass over memory a few times instead of
// fifteen. `rows` keeps the group's data per chunk within half the L2 cache.
//
// A tensor that only the group's nests touch, that is not a program input or output, and whose elements
// iteration c touches all lie in the c-th run of `row_elements` elements of its row-major storage
// (counted from outer_lo; isl proves it: a softmax's exponentials, row c of them, or a max pool gradient's
// maxima when c runs over (image, row) pairs) is a chunk tensor: the runtime gives each chunk memory of
// rows x row_elements elements for it, reused chunk after chunk, and passes the nests that memory shifted
// back by the chunk's first row, so their addresses land in it. It never takes memory of its full size:
// the same few cache lines serve chunk after chunk, instead of a stream of them going out to memory.
struct ChunkTensor {
  std::string tensor;
  int64_t row_elements = 0;
};

struct NestGroup {
  size_t first = 0, last = 0;  // indices into Schedule::nests, inclusive
  int64_t rows = 1;
  std::vector<ChunkTensor> chunk_tensors;  // by tensor name
};

struct Schedule {
  std::vector<Nest> nests;  // in execution order
  std::vector<NestGroup> groups;  // disjoint, in nest order; a nest in no group runs alone
  std::string tree() const;
  std::string ast() const;
};

// Elementwise fusion: an elementwise statement read only by one later elementwise statement (and not a
// program output) is substituted into it, wrapped in a cast to its own dtype so that every value rounds
// exactly as the materialized tensor did; the chain then runs as one loop nest with no temporary. A cheap
// one (no transcendental call, at most 12 nodes besides casts, at most one operand of its own shape) read
// once by each of up to three elementwise statements is substituted into each of them: computing it again
// costs less than a pass that writes it and passes that read it back. Where one contraction reads it too
// (a layer norm's D = X - mean, read by the sum of D * D), it is substituted into the elementwise readers
// and kept for the contraction alone, which evaluates it where it reads it (no nest writes it).
// Broadcasting commutes with elementwise operations, so the substitution is exact for any shapes.
Program fuse_elementwise(const Program& program, const ProgramTypes& types);

// Layout: an input that a contraction reads with its vector variable (the output variable contiguous in
// the output) in a non-contiguous dim, and that is small next to the contraction's work (a convolution's
// weights in the data gradient), is read from a transposed copy with that dim last -- one assign
// contraction -- so the update can run as a register-blocked micro-kernel. An input whose rows the
// micro-kernel broadcasts and that its innermost reduction variable steps through a page or more at a time
// (A in C = A^T B) is read from a copy with that variable's dim last, as A B reads A. An output whose
// contiguous dim leaves part of every vector empty, where another of its dims fills them (an NCHW
// convolution's columns and channels), is computed into a copy with that dim last (NAME_L) and moved
// into place by one assign contraction.
// With `verify`, every rewritten contraction is proven equal to the original with poly::verify_rewrite
// (the packing's change of variables v = VL*vb + vl, the copies looked through); a failed proof is an
// InternalError naming the pass.
Program prepare_layouts(const Program& program, const ProgramTypes& types, const Target& target = {},
                        bool verify = false);

// Split reductions: a sum indexed by plain variables whose outputs would fill fewer than
// GpuModel::min_blocks blocks (a GPU target), or that has at most CpuModel::split_max_outputs outputs with
// at least split_min_points reduction points each (the CPU, with two threads or more: its threads split
// output loops, and these have none worth splitting), is split along its longest reduction variable r
// into S slices of L consecutive values (r = least + L*s + q, 0 <= q < L; S = the threads on the CPU): a
// contraction of partial sums O_slices[s, outputs...] and the sum of the slices into O (which keeps its
// default). On the CPU a sum, maximum or minimum whose threads would each read a part of every row of
// its input (a column reduction of 1024 rows or more, CpuModel::split_line_min_points) is split the same
// way, a maximum or minimum only where every slice holds a point for every output element.
// Other statements are left as they are. With `verify`,
// isl proves each split contraction's slices hold the original's valid points, each once, reading the
// same elements (poly::verify_rewrite).
Program split_reductions(const Program& program, const ProgramTypes& types, const Target& target, bool verify = false);

// Translation validation of fuse_elementwise: every statement of `fused`, with each cast(e, t) whose e is an
// elementwise producer's expression with that producer's dtype (recursively) put back as the producer's
// tensor, is the statement of `original` with the same output; every producer gone from `fused` was no
// output (one that stays, for a contraction, may be read either way). InternalError otherwise.
void verify_fusion(const Program& original, const Program& fused, const ProgramTypes& types);

// The synchronization of a kernel's loop IR, as the host runs it (threads one after another between
// barriers) and as the GPU does (all at once): no barrier or copy inside a loop mapped to threads (where
// threads may diverge), and along every path through the block's code -- loops taken twice, so that one
// iteration's end meets the next one's start -- a barrier between a copy of a tile and the threads that
// read it, and between those and the next copy. InternalError naming the nest otherwise.
void check_barriers(const Nest& nest);

// Called with each nest and its index in Schedule::nests as soon as both are final -- after the
// statement that made it, in index order -- so that a code generator can compile it while the next
// statements are scheduled. The reference lives for the call only (copy what another thread needs).
using NestSink = std::function<void(size_t index, const Nest& nest)>;

// `program` should already be reduced and defracted; `types` from infer_types. UserError for an unbounded
// variable or an assign that may write twice (see polyhedral.h).
Schedule schedule(const Program& program, const ProgramTypes& types, const Target& target = {}, const NestSink& sink = {});

}  // namespace polytile::sched
