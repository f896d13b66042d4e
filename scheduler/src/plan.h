// Private: which contractions run as register-blocked micro-kernels, and with which variables and block
// shape (see Microkernel in scheduler.h). Pure decisions from the contraction's polynomials, dtypes and
// variable ranges; the isl checks (injective write, a point valid exactly where its row and its lane are)
// are made by the scheduler.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "polytile/polyhedral.h"
#include "polytile/scheduler.h"

namespace polytile::sched {

struct MicroPlan {
  std::string vector, block;  // variable names
  int rows = 1, chunks = 1, lanes = 1;
  int transpose_input = -1;   // input to read from a copy with the vector variable's dim last
};

// Whether some index of `idx` depends on variable v.
bool uses(const std::vector<Polynomial>& idx, const std::string& v);

// The elements of a row-major tensor of `shape` between the elements that `idx` addresses at two points
// one apart in v (the other variables equal).
double output_stride(const std::vector<Polynomial>& idx, const std::string& v, const std::vector<int64_t>& shape);

// Whether a micro-kernel with an output of `out_bytes` and `reduction_points` reduction points per output
// element runs in weight mode (a weight gradient: the reduction tiles outside the blocks, the blocks split
// across the threads; see block_bands): each thread's share of the output is at most
// weight_share_max_bytes.
bool weight_mode(int64_t out_bytes, int64_t reduction_points, const Target& target);
// Three quarters of a thread's L2: what stays there of a weight gradient's output while the reduction
// streams its operands past (not half, as for the outputs of other micro-kernels). A 128-channel 3x3
// weight gradient (590 KB) with 1 MiB L2s is then split into a copy per thread (weight_split), each
// thread reading different rows of both operands; with half, its 22 row blocks were split across the
// threads, both reading every panel of the packed output gradient, half of it packed by the other
// thread: on the 2-core Zen 4 guest 3-4% slower in quiet minutes (8.0-8.2 against 7.8-7.9 ms) and 20%
// in others (9.7-9.8 against 8.2).
int64_t weight_share_max_bytes(const Target& target);

// Whether such a micro-kernel's reduction is split into one slice per thread (split_reductions.cpp):
// with two threads or more, when every slice (a whole copy of the output per thread) still runs in
// weight mode.
bool weight_split(int64_t out_bytes, int64_t reduction_points, const Target& target);

// Whether a micro-kernel sizes its reduction tiles for L2 instead of L1 (see size_reduction_tiles): a
// reduction variable of 768 points or more (a matmul's k) into an output whose share per thread overflows
// half of L2. Each reduction tile then loads and stores the accumulators from beyond L2, as many times per
// block as there are tiles; tiles sized for L2 make that several times rarer, and the vector operand's
// tile, now read from L2, costs one vector load per row group of fused multiply-adds (sgemm 2048: 257 ->
// 287 GFLOP/s; 768 384 -> 419, 1000 350 -> 367, 1024 377 -> 395, 1536 365 -> 409). Not for a window's
// several short variables, however many points they have together: a conv's blocks inside one reduction
// tile are a few rows of pixels, whose accumulators stay in L1 and L2 anyway, while its vector operand's
// tile streams from L2 at every step (3x3 128->128, 1152 points: fwd 394-436 -> 382-390 GFLOP/s,
// bwd-data 431-433 -> 413-427 with L2 tiles; 3x3 256->256, 2304 points, on one thread of a Cascade Lake:
// fwd and bwd-data 15.7 -> 14.8 and 16.5 -> 15.6 ms with L1 tiles; until 2026-11-28 the rule also gave
// L2 tiles to every reduction of 2048 points or more).
bool long_tiles(int64_t out_bytes, int64_t longest, const Target& target);

// The bytes a micro-kernel's reduction tile may read (size_reduction_tiles: the footprint of a block's, or
// in weight mode a row of blocks', inputs over one tile). Three quarters of L1, so that the vector
// operand's tile is reused from L1 by every block of it. With long_tiles, three eighths of L2: a matmul's
// k of 2048 then runs in one tile (its 64-column panel of B, 512 KiB, beside the threads' row tiles of A,
// up to half of L2, sized in build_microkernel), each block's accumulators loaded never and stored once;
// in tiles of an eighth of L2 (3 of 683) they went back to L3 twice a block. On a 2-core Emerald Rapids
// guest (interleaved, fastest of 10 runs, 2026-12-06): sgemm 2048 55.7-56.5 -> 53.9-54.6 ms, 2000
// 51.5-52.3 -> 50.4-50.8, 1000 6.50-6.63 -> 6.40-6.45, A^T B 2048 57.4-58.9 -> 55.5-57.0; a quarter of
// L2 (tiles of 1024) was within the noise of an eighth. An eighth of L2 on a core that issues one
// full-width FMA a cycle (CpuModel::fma_per_cycle; Zen 4): a step of R rows x C chunks
// then takes R x C cycles, twice two FMAs a cycle's, and its C vector loads stream from L2 at half the
// rate, while longer tiles load and store the accumulators fewer times. On a 2-core Zen 4 guest
// (interleaved, 2026-11-29) the 3x3 convs' forward and data gradients ran 2-3% faster with it (128
// channels 8.08 -> 7.87 and 8.07 -> 7.88 ms, 256 channels 8.08 -> 7.91 and 7.99 -> 7.80), the 64- and
// 128-channel and 1x1 weight gradients 3-12% faster, the 256-channel one 1% slower, sgemm 256-2048 the
// same. Scaled by CpuModel::reduction_tile_percent.
int64_t reduction_tile_budget(bool long_tiles, const Target& target);

// Whether input access `a` of a micro-kernel of `plan` is broadcast with rows that differ: it reads the
// block variable and not the vector one, so each row of a block broadcasts an element of its own.
bool broadcast_per_row(const TensorAccess& a, const MicroPlan& plan);

// Microkernel::prefetch_bytes for a micro-kernel of `plan` over `c`: two blocks' rows of the input ahead,
// rounded up to whole 64-byte lines, when every broadcast input whose rows differ holds the
// block variable contiguously (in its last index only, coefficient 1); 0 when none does or one does not.
int64_t broadcast_prefetch_bytes(const Contraction& c, const ProgramTypes& types, const MicroPlan& plan);

// The values of a loop of `count` iterations left idle when `threads` threads take equal chunks of it
// (the busiest thread's chunk times the threads, less count): 0 when the loop splits evenly.
int64_t idle_values(int64_t count, int64_t threads);

// The size of equal tiles over `extent` values: as few tiles of at most `most` values as cover it, their
// count rounded up to a multiple of `multiple` (threads taking equal shares), then spread evenly, so that
// no tile is a sliver. With threads, up to twice as many tiles where that evens out their shares.
int64_t equal_tiles(int64_t extent, int64_t most, int64_t multiple = 1);

// The number of points of the variables' bounding box (saturating at 2^50).
int64_t box_points(const std::vector<poly::VariableBounds>& bounds);

// Elements of dtype t in one of the target's vectors (at least 1).
int64_t vector_lanes(DType t, const Target& target);

// nullopt when the contraction is not a float sum of products whose output is contiguous along a
// variable that every input reads either contiguously or not at all (or, with allow_transpose, through
// one small operand that has v, with coefficient 1, in one dim).
std::optional<MicroPlan> plan_microkernel(const Contraction& c, const ProgramTypes& types,
                                          const std::vector<poly::VariableBounds>& bounds, const Target& target,
                                          bool allow_transpose);

}  // namespace polytile::sched
