// `polytile` subcommands: check, run, help. Every failure becomes a one-line message and an exit code.
#include "cli.h"

#include "npz.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "polytile/autodiff.h"
#include "polytile/buffer.h"
#include "polytile/cpu.h"
#include "polytile/driver.h"
#include "polytile/kernel_cache.h"
#include "polytile/cuda_runtime.h"
#include "polytile/ptx.h"
#include "polytile/lower.h"
#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/npy.h"
#include "polytile/parser.h"
#include "polytile/passes.h"
#include "polytile/polyhedral.h"
#include "polytile/shapes.h"

namespace polytile {
namespace {

const char* kMainHelp = R"(usage: polytile <command> [options]

Tile contractions: parse, check and run them.

commands:
  check FILE.tile   parse and check a program; print it as normalized Tile text
  run FILE.tile     run a program on .npy or generated inputs
  lower FILE.tile   print a compiler stage: isl sets and maps, reduced or defracted contractions, loops, LLVM IR, PTX
  compile FILE.tile compile for an NVIDIA GPU into a kernel bundle (PTX + manifest) that polytile-run-bundle runs,
                    or ahead of time for this CPU into an object file and a C header
  grad FILE.tile    print the gradient program (vector-Jacobian product) as Tile text
  cache info|clear  show or empty the kernel cache (compiled programs kept on disk between runs)
  help [COMMAND]    show help for a command
  --version         print polytile's version and what compiles here: a digest of the compiler's
                    sources as built, LLVM's and isl's versions (part of every kernel-cache key)

Run 'polytile <command> --help' for a command's options.
Exit codes: 0 success, 1 user error (bad input), 2 internal error.
)";

const char* kCheckHelp = R"(usage: polytile check FILE.tile [--shape NAME=DIMS[:DTYPE]]...

Parses FILE.tile, checks names, ranks and dims, and prints the normalized Tile text.
With --shape for every input, also binds the dims, prints each tensor's dtype and shape, proves that
every assign (=) contraction writes each element at most once, and warns about contractions whose
domain is empty (they write nothing).

  --shape NAME=DIMS[:DTYPE]   input shape as 2x3x4 (empty for a scalar); dtype f32 (default), f64, i32, bool
)";

const char* kLowerHelp = R"(usage: polytile lower FILE.tile --emit STAGE [--shape NAME=DIMS[:DTYPE]]... [--target cpu|sm_XY]
                      [--cpu NAME[,l1=SIZE,l2=SIZE,l3=SIZE]] [--gpu-model KEY=VALUE,...] [--verbose] [--verify]

Prints one stage of the compiler for FILE.tile:
  tile        the normalized Tile text
  isl         each contraction's iteration domain, write and read access maps, and exact variable bounds
              (needs --shape for every input)
  reduced     contractions after `reduce`: every output index a single variable
  defracted   contractions after `reduce` and `defract`: integer coefficients, digit constraints
  lowered     the program after every pass of the pipeline (cond-miss lowering, fusion, layouts, split
              reductions): what the schedule computes (needs --shape)
  schedule    the isl schedule tree of every loop nest, with its marks: parallel, tile, reduction_tile, point,
              vector_RxVxL (a micro-kernel of R rows x V vectors of L lanes) (needs --shape)
  ast         the loops isl generates from those schedules, as C (needs --shape)
  loops       the loop IR the code generators consume: nests, loops, guards, statements (needs --shape)
  llvm        the optimized LLVM IR the CPU backend runs, without compiling it to machine code (needs --shape);
              with --target sm_XY, the GPU kernels' modules (one each) after libdevice and optimization
  ptx         the PTX of the GPU kernels (needs --shape; --target sm_XY, default sm_90)

  --shape NAME=DIMS[:DTYPE]   input shape; with shapes, reduce ranks basis candidates by their ranges
  --target T                  cpu (default: this machine) or an NVIDIA GPU sm_XY (sm_75 on): the schedule,
                              ast and loops stages then show the kernels' block and thread mapping
  --cpu NAME                  a CPU target's CPU as LLVM names it (znver3, x86-64-v3, ...; default: this
                              machine's): the schedule and LLVM IR made for its vector width and registers;
                              cache sizes after it, e.g. znver3,l2=512K or host,l1=32K,l2=1M,l3=32M
                              (bytes, K, M or G), block the schedule for those caches instead of this
                              machine's
  --gpu-model KEY=VALUE,...   with a GPU --target: the GPU strategy's sizes instead of the defaults, e.g.
                              threads=128,tile=4x2,shared=0 -- keys: threads (per block, default 256),
                              tile (register tile RxC, 4x4), shared (bytes of shared tiles per block, 49152;
                              0: no shared tiles), reuse (reads per element for a tile, 4), split-blocks (sums
                              whose outputs fill fewer blocks are split, 216; 0: never), split-slice (least
                              reduction points per slice, 256), accumulators (1: each thread's outputs in
                              registers, the default; 0: updates go to memory), keep (1: they stay in
                              registers from the first reduction tile to the last, the default; 0: loaded
                              and stored in every tile), pad (1: shared tiles' even
                              rows padded by one element where a warp reads down the columns, the default;
                              0: none),
                              fit (1: the threads fit the register tile -- along x the fewest, from 8, whose
                              columns cover it, along y what its rows need; 0: a warp along x, the default),
                              masked (1: register tiles with guarded rows run without branches, loading the
                              operands the guard does not touch once; 0: a branch per row, the default),
                              index32 (1: kernels compute indices in 32 bits where their tensors fit, the
                              default; 0: in 64 bits), unroll (times a kernel's innermost sequential loop
                              is unrolled, 4; 0: LLVM's and ptxas's choice), interleave (1: a thread's
                              register columns a warp apart, the default; 0: consecutive, loaded from
                              shared memory as vectors), unswitch (1: a reduction loop around guarded
                              register rows also runs unguarded where all rows are in range, the default;
                              0: guarded only), vcopy (1: shared tiles copied in 16-byte vectors where
                              aligned, several loads at a time, the default; 0: element by element),
                              regs (1: where ptxas is found, a kernel that spills at ptxas's own register
                              choice gets a register ceiling it fills, the default; 0: ptxas's choice)
  --verbose                   say on stderr why a pass left a contraction unchanged
  --verify                    prove every rewrite with isl: reduce and defract for all sizes where isl can
                              express them (else at the --shape sizes), and for the schedule stages also
                              cond-miss lowering, fusion and layouts at the --shape sizes; a failed proof
                              is an internal error (exit 2) naming the pass; --verbose says what was proven
)";

const char* kRunHelp = R"(usage: polytile run FILE.tile [--input NAME=FILE.npy]... [--inputs FILE.npz] [--random NAME=DIMS[:DTYPE]]...
                    [--output NAME=FILE.npy]... [--backend interp] [--tune] [--verify] [--seed N] [--limit N]
                    [--threads N] [--cpu NAME[,l1=SIZE,...]] [--time] [--repeat N] [--profile] [--no-cache]

Runs FILE.tile. Every input comes from a .npy file (--input), from a .npz archive (--inputs) or is
generated deterministically (--random: uniform in [-1, 1) for floats, integers in [-5, 5], random bools;
seeded by --seed and the input's name). Outputs named with --output are written as .npy; the others are printed.

  --input NAME=FILE.npy        read input NAME (float16, float32, float64, int32, int64, bool; C order)
  --inputs FILE.npz            read the inputs named by the arrays of a NumPy archive (np.savez or
                               np.savez_compressed: NAME.npy members)
  --random NAME=DIMS[:DTYPE]   generate input NAME, e.g. I=2x9x9x5 or K=2x2x5x7:f64
  --output NAME=FILE.npy       write output NAME
  --backend NAME               cpu (default: native code through LLVM), interp (the reference interpreter),
                               cuda (PTX for --target, run on this machine's GPU through the CUDA driver), or
                               gpu-sim (the --target GPU kernels compiled for this CPU and run with GPU
                               semantics: each block's threads in turn; checks a GPU schedule without a GPU)
  --target sm_XY               cuda, gpu-sim: the GPU architecture (default sm_90)
  --gpu-model KEY=VALUE,...    cuda, gpu-sim: the GPU strategy's sizes (see lower --help)
  --tune                       cpu: time a few schedule variants on this machine (each time printed to stderr)
                               and run the fastest; cuda: the same with GPU models around --gpu-model's (masked
                               register tiles; threads fitted to the register tile, alone and with tiles 8x4,
                               4x8, 8x8 and 64-bit indices), timed on the GPU, their outputs checked against
                               each other
  --verify                     cpu: prove every rewriting pass with isl before running (see lower --help)
  --seed N                     seed for --random (default 1)
  --limit N                    print at most N values per printed output (default 64)
  --threads N                  cpu: run on N threads (default: the machine's)
  --cpu NAME                   cpu: make the code for CPU NAME as LLVM names it (znver3, haswell,
                               skylake-avx512, x86-64-v3, ...; default host): its instruction set and
                               scheduling model, e.g. AVX2 code on an AVX-512 machine; a CPU with
                               instructions this machine lacks is refused (export for it instead);
                               cache sizes after the name (znver3,l2=512K; l1, l2, l3 in bytes, K, M or G)
                               replace this machine's in the schedule
  --time                       print to stderr the compile time of every stage (cpu) and the run time:
                               the median of --repeat runs (the compiled program is reused)
  --repeat N                   run N times (default 1); the outputs are those of the last run
  --profile                    cpu, gpu-sim: print to stderr where a run's time goes, each row group and
                               nest of `lower --emit loops` with its mean time over --repeat runs (after one
                               untimed) and its share; compiles here, as --no-cache does
  --no-cache                   cpu: compile afresh and keep nothing; by default the compiled program is kept
                               in the kernel cache (see polytile cache --help), so a second run of the same
                               program and input types loads it instead of compiling (not with --tune)
)";

const char* kCacheHelp = R"(usage: polytile cache info|clear

The kernel cache keeps the programs `polytile run` compiles for the cpu backend, one file per program
and input types (keyed by the normalized text, the input types, this machine's CPU, the options and
the compiler: polytile's version, a digest of its sources as built, LLVM's and isl's versions, as
`polytile --version` prints them), so that the next run loads machine code instead of compiling. It lives in
$POLYTILE_CACHE_DIR, else $XDG_CACHE_HOME/polytile, else ~/.cache/polytile; least recently used
entries are removed past $POLYTILE_CACHE_MAX_MB megabytes (default 256). A truncated or corrupted
entry is detected (each holds its key and a checksum), removed and compiled again.

  info    print the directory, the number of entries, their size and the limit
  clear   remove every entry
)";

const char* kCompileHelp = R"(usage: polytile compile FILE.tile --shape NAME=DIMS[:DTYPE]... -o PATH [--target sm_XY|cpu]
                        [--name ENTRY] [--cpu NAME[,l1=SIZE,...]] [--gpu-model KEY=VALUE,...] [--verify]

With a GPU target (sm_XY, the default sm_90), compiles FILE.tile for an NVIDIA GPU (no GPU needed) and
writes a kernel bundle to the directory PATH: kernels.ptx and manifest.txt (the target, the buffers with
their roles, dtypes and shapes, and the kernels in launch order with their grid, block and arguments).
`polytile-run-bundle PATH` runs it on a machine with a GPU, which needs neither LLVM nor isl. Prints each
kernel's launch and, where the CUDA toolkit's ptxas is found, the registers, spills and shared memory
ptxas reports.

With --target cpu, compiles FILE.tile ahead of time for this machine's CPU (or --cpu's) and writes
PATH.o (a position-independent object with one C entry point) and PATH.h (its declaration: the arguments
in order with their dtypes and shapes, the workspace, the parallel_for callback). Link the object into a C or C++
program with -lm, or make a shared library of it (cc -shared -o libNAME.so PATH.o -lm); running it needs
no LLVM, isl, NTL or polytile library.

  --shape NAME=DIMS[:DTYPE]   input shape (every input)
  -o PATH                     the bundle's directory (created), or with --target cpu the prefix of PATH.o
                              and PATH.h
  --target T                  GPU architecture sm_XY, sm_75 and later (default sm_90), or cpu
  --name ENTRY                cpu: the entry point's C name (default: PATH's file name)
  --cpu NAME                  cpu: the CPU the object is for, as LLVM names it (znver3, haswell,
                              skylake-avx512, x86-64-v3, ...; default: this machine's), also one with
                              instructions this machine lacks; cache sizes after the name
                              (znver3,l1=32K,l2=512K,l3=32M: bytes, K, M or G) block the code for that
                              machine's caches instead of this one's
  --gpu-model KEY=VALUE,...   the GPU strategy's sizes (see lower --help)
  --verify                    prove every rewriting pass with isl
)";

const char* kGradHelp = R"(usage: polytile grad FILE.tile [--wrt A,B] [--emit tile|defracted] [--mode reverse|mixed|forward] [--verify]
                    [--keep-zero-adjoints]

Prints the derivative of FILE.tile as a Tile program that `polytile run` runs. For
  function (I, K) -> (O)
reverse mode prints  function (I, K, DO) -> (DI, DK)  (DO: the adjoint of O; DI, DK: vector-Jacobian
products), forward mode prints  function (I, K, TI, TK) -> (TO)  (Jacobian-vector products).

  --wrt A,B      inputs to differentiate with respect to (default: all)
  --emit STAGE   tile: the gradient as generated; defracted (default): after reduce and defract, every
                 output element written once, integer coefficients only
  --mode MODE    reverse (default), mixed (dual-number partials for elementwise statements) or forward
  --verify       prove reduce and defract of every gradient contraction with isl, for all sizes
  --keep-zero-adjoints
                 also compute the adjoints of tensors the outputs provably do not depend on (softmax's
                 row maxima: zero in exact arithmetic, rounding noise as computed), as the rules write
                 them (in forward mode: their tangents); by default they are left out
)";

struct Args {
  std::string command;
  std::string file;
  std::vector<std::pair<std::string, std::string>> options;  // in order
  bool help = false;
};

std::pair<std::string, std::string> split_assign(const std::string& opt, const std::string& value) {
  auto eq = value.find('=');
  if (eq == std::string::npos || eq == 0) user_error(opt, " expects NAME=VALUE, got '", value, "'");
  return {value.substr(0, eq), value.substr(eq + 1)};
}

TensorType parse_shape_spec(const std::string& name, const std::string& spec) {
  TensorType t;
  std::string dims = spec;
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    auto dt = parse_dtype(spec.substr(colon + 1));
    if (!dt) user_error("input ", name, ": unknown dtype '", spec.substr(colon + 1), "' (", dtype_list(), ")");
    t.dtype = *dt;
    dims = spec.substr(0, colon);
  }
  if (dims.empty() || dims == "scalar") return t;
  // Every dim between the x's, an empty one included (getline would drop a trailing one: "3x4x").
  for (size_t begin = 0, end = 0; end != std::string::npos; begin = end + 1) {
    end = dims.find('x', begin);
    const std::string item = dims.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      t.shape.push_back(v);
    } catch (const std::exception&) {
      user_error("input ", name, ": bad shape '", dims, "' (write dims as 2x3x4, each >= 0)");
    }
  }
  return t;
}

Buffer random_buffer(const TensorType& t, uint64_t seed, const std::string& name) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(name);
  auto next = [&state]() {  // splitmix64: fixed, portable sequence
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  Buffer b(t.dtype, t.shape);
  for (int64_t i = 0; i < b.size(); ++i) {
    uint64_t r = next();
    double u = static_cast<double>(r >> 11) * 0x1.0p-53;
    switch (t.dtype) {
      case DType::f16:
      case DType::f32:
      case DType::f64: b.set(i, 2 * u - 1); break;
      case DType::i32:
      case DType::i64: b.set_int(i, static_cast<int64_t>(r % 11) - 5); break;
      case DType::boolean: b.set(i, static_cast<double>(r & 1)); break;
    }
  }
  return b;
}

std::string format_element(const Buffer& b, int64_t i) {
  const DType t = b.dtype();
  if (t == DType::boolean) return b.get_int(i) ? "true" : "false";
  if (is_integer(t)) return std::to_string(b.get_int(i));
  std::ostringstream os;
  os.precision(t == DType::f16 ? 5 : t == DType::f32 ? 7 : 15);
  os << b.get(i);
  return os.str();
}

void print_buffer(std::ostream& out, const std::string& name, const Buffer& b, int64_t limit) {
  out << name << ": " << b.type_str() << " = [";
  for (int64_t i = 0; i < b.size() && i < limit; ++i) out << (i ? ", " : "") << format_element(b, i);
  if (b.size() > limit) out << (limit > 0 ? ", " : "") << "... (" << b.size() - limit << " more)";
  out << "]\n";
}

int64_t parse_int(const std::string& opt, const std::string& v) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    user_error(opt, " expects an integer, got '", v, "'");
  }
}

// --gpu-model KEY=VALUE,...: the GPU strategy's sizes (sched::GpuModel), each key at most once.
const char* kGpuModelHelp =
    "threads (per block), tile (register tile RxC), shared (bytes of shared tiles; 0: none), reuse (reads per "
    "element for a tile), split-blocks (split sums filling fewer blocks; 0: never), split-slice (points per slice), "
    "accumulators (1 or 0), keep (1 or 0), pad (1 or 0), fit (1 or 0), masked (1 or 0), index32 (1 or 0), unroll (0-16), interleave (1 or 0), "
    "unswitch (1 or 0), vcopy (1 or 0), regs (1 or 0)";

sched::GpuModel parse_gpu_model(const std::string& spec) {
  sched::GpuModel m;
  std::set<std::string> seen;
  std::stringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty()) user_error("--gpu-model: '", item, "' is not KEY=VALUE (keys: ", kGpuModelHelp, ")");
    if (!seen.insert(key).second) user_error("--gpu-model: ", key, " is given twice");
    const std::string opt = "--gpu-model " + key;
    auto number = [&](int64_t lo, int64_t hi) {
      const int64_t v = parse_int(opt, value);
      if (v < lo || v > hi) user_error(opt, " must be between ", lo, " and ", hi, ", got ", v);
      return v;
    };
    if (key == "threads") {
      m.threads_per_block = static_cast<int>(number(1, 1024));
    } else if (key == "tile") {
      const size_t x = value.find('x');
      if (x == std::string::npos) user_error(opt, " expects ROWSxCOLS, e.g. 4x4, got '", value, "'");
      auto part = [&](const std::string& v) {
        const int64_t n = parse_int(opt, v);
        if (n < 1 || n > 16) user_error(opt, ": rows and columns must be between 1 and 16, got ", n);
        return static_cast<int>(n);
      };
      m.tile_rows = part(value.substr(0, x));
      m.tile_cols = part(value.substr(x + 1));
    } else if (key == "shared") {
      m.shared_bytes = number(0, sched::GpuModel::static_shared_limit);
    } else if (key == "reuse") {
      m.min_reuse = number(1, int64_t{1} << 30);
    } else if (key == "split-blocks") {
      m.min_blocks = number(0, int64_t{1} << 30);
    } else if (key == "split-slice") {
      m.min_slice = number(1, int64_t{1} << 30);
    } else if (key == "accumulators") {
      m.accumulators = number(0, 1) == 1;
    } else if (key == "keep") {
      m.keep_accumulators = number(0, 1) == 1;
    } else if (key == "pad") {
      m.pad_shared = number(0, 1) == 1;
    } else if (key == "fit") {
      m.fit_threads = number(0, 1) == 1;
    } else if (key == "masked") {
      m.masked_registers = number(0, 1) == 1;
    } else if (key == "index32") {
      m.index32 = number(0, 1) == 1;
    } else if (key == "unroll") {
      m.unroll = static_cast<int>(number(0, 16));
    } else if (key == "interleave") {
      m.interleave_columns = number(0, 1) == 1;
    } else if (key == "unswitch") {
      m.unswitch_registers = number(0, 1) == 1;
    } else if (key == "vcopy") {
      m.vector_copies = number(0, 1) == 1;
    } else if (key == "regs") {
      m.fit_registers = number(0, 1) == 1;
    } else {
      user_error("--gpu-model: unknown key '", key, "' (keys: ", kGpuModelHelp, ")");
    }
  }
  return m;
}

int cmd_check(const Args& a, std::ostream& out, std::ostream& err) {
  Program p = parse_file(a.file);
  std::map<std::string, TensorType> shapes;
  for (const auto& [opt, value] : a.options) {
    if (opt != "--shape") user_error("check: unknown option ", opt);
    auto [name, spec] = split_assign(opt, value);
    shapes[name] = parse_shape_spec(name, spec);
  }
  out << print(p);
  if (!shapes.empty()) {
    ProgramTypes types = infer_types(p, shapes);
    for (const auto& analysis : poly::analyze_program(p, types))
      if (analysis.empty)
        err << "polytile: warning: contraction " << analysis.output << " has an empty domain: it writes nothing\n";
    for (const auto& in : p.inputs) out << "// " << in.name << ": " << types.tensors.at(in.name).str() << "\n";
    for (const auto& st : p.statements) {
      const std::string& n = statement_output(st);
      out << "// " << n << ": " << types.tensors.at(n).str() << "\n";
    }
  }
  return 0;
}

int cmd_lower(const Args& a, std::ostream& out, std::ostream& err) {
  Program p = parse_file(a.file);
  driver::StageRequest request;
  bool verbose = false;
  for (const auto& [opt, value] : a.options) {
    if (opt == "--shape") {
      auto [name, spec] = split_assign(opt, value);
      request.inputs[name] = parse_shape_spec(name, spec);
    } else if (opt == "--emit") {
      request.stage = value;
    } else if (opt == "--target") {
      request.target = value;
    } else if (opt == "--cpu") {
      request.cpu = value;
    } else if (opt == "--gpu-model") {
      request.gpu_model = parse_gpu_model(value);
    } else if (opt == "--verbose") {
      verbose = value == "true" || value == "1" || value == "yes";
    } else if (opt == "--verify") {
      request.verify = true;
    } else {
      user_error("lower: unknown option ", opt);
    }
  }
  const std::vector<std::string>& stages = driver::stages();
  if (request.stage.empty()) user_error("lower: --emit STAGE is required (tile, isl, reduced, defracted)");
  if (std::find(stages.begin(), stages.end(), request.stage) == stages.end())
    user_error("lower: unknown stage '", request.stage, "' (", driver::stage_list(), ")");
  const bool gpu = !request.target.empty() && request.target != "cpu";
  if (request.gpu_model && !gpu) user_error("lower: --gpu-model needs a GPU --target sm_XY");
  if (request.stage == "ptx" && request.target == "cpu") user_error("lower --emit ptx needs a GPU --target sm_XY");
  if (driver::needs_input_types(request.stage) && request.inputs.empty())
    user_error("lower --emit ", request.stage, " needs --shape NAME=DIMS for every input");
  std::vector<std::string> log;
  out << driver::print_stage(p, request, &log);
  if (verbose)
    for (const auto& line : log) err << "polytile: " << line << "\n";
  return 0;
}

int cmd_grad(const Args& a, std::ostream& out) {
  Program p = parse_file(a.file);
  driver::GradRequest request;
  std::string emit = "defracted";
  for (const auto& [opt, value] : a.options) {
    if (opt == "--wrt") {
      std::stringstream ss(value);
      std::string name;
      while (std::getline(ss, name, ','))
        if (!name.empty()) request.wrt.push_back(name);
    } else if (opt == "--emit") {
      emit = value;
    } else if (opt == "--mode") {
      request.mode = value;
    } else if (opt == "--verify") {
      request.verify = true;
    } else if (opt == "--keep-zero-adjoints") {
      request.prove_zero_adjoints = false;
    } else {
      user_error("grad: unknown option ", opt);
    }
  }
  if (emit != "tile" && emit != "defracted") user_error("grad: unknown stage '", emit, "' (tile, defracted)");
  if (request.mode != "reverse" && request.mode != "mixed" && request.mode != "forward")
    user_error("grad: unknown mode '", request.mode, "' (reverse, mixed, forward)");
  if (request.mode == "forward" && emit == "tile") user_error("grad --mode forward emits the defracted form only");
  request.reduce_and_defract = emit == "defracted";
  out << print(driver::gradient(p, request));
  return 0;
}

int cmd_compile(const Args& a, std::ostream& out) {
  Program p = parse_file(a.file);
  std::map<std::string, TensorType> shapes;
  ptx::Options options;
  std::string dir, entry, cpu_name;
  bool gpu_model = false;
  for (const auto& [opt, value] : a.options) {
    if (opt == "--shape") {
      auto [name, spec] = split_assign(opt, value);
      shapes[name] = parse_shape_spec(name, spec);
    } else if (opt == "--target") {
      options.arch = value;
    } else if (opt == "--cpu") {
      cpu_name = value;
    } else if (opt == "-o") {
      dir = value;
    } else if (opt == "--name") {
      entry = value;
    } else if (opt == "--gpu-model") {
      options.model = parse_gpu_model(value);
      gpu_model = true;
    } else if (opt == "--verify") {
      options.verify = true;
    } else {
      user_error("compile: unknown option ", opt);
    }
  }
  if (options.arch == "cpu") {
    if (dir.empty()) user_error("compile: -o PATH is required (PATH.o and PATH.h are written)");
    if (gpu_model) user_error("compile: --gpu-model needs a GPU --target, not cpu");
    if (entry.empty()) entry = std::filesystem::path(dir).filename().string();
    cpu::CompileOptions copts;
    copts.target = cpu::cpu_target(cpu_name);
    copts.verify = options.verify;
    auto t0 = std::chrono::steady_clock::now();
    cpu::ExportedObject exported = cpu::export_object(p, shapes, entry, copts);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    exported.write(dir);
    out << dir << ".o, " << dir << ".h: entry point " << entry << " for CPU " << exported.cpu << ", workspace "
        << exported.workspace_bytes << " bytes, compiled in " << static_cast<int64_t>(ms + 0.5) << " ms\n";
    return 0;
  }
  if (!entry.empty()) user_error("compile: --name needs --target cpu (a kernel bundle's kernels are named by polytile)");
  if (!cpu_name.empty()) user_error("compile: --cpu needs --target cpu (a GPU target is its architecture, sm_XY)");
  if (dir.empty()) user_error("compile: -o DIR is required (the bundle's directory)");
  infer_types(p, shapes);  // user errors (a missing shape) first
  ptx::Compiled compiled = ptx::compile(p, shapes, options);
  compiled.bundle.write(dir);
  // ptxas's reports: compile's own where it fitted registers, else one run over the bundle's PTX.
  std::vector<ptx::KernelResources> reports = compiled.resources;
  const bool assembled = !reports.empty() || ptx::find_ptxas();
  if (reports.empty() && assembled) reports = ptx::assemble(compiled.bundle.ptx, options.arch).kernels;
  out << "bundle " << dir << ": " << compiled.bundle.kernels.size() << " kernel" << (compiled.bundle.kernels.size() == 1 ? "" : "s")
      << " for " << options.arch << ", compiled in " << static_cast<int64_t>(compiled.seconds * 1e3 + 0.5) << " ms\n";
  auto dims = [](const std::array<int64_t, 3>& d) {
    return std::to_string(d[0]) + "x" + std::to_string(d[1]) + "x" + std::to_string(d[2]);
  };
  for (const auto& k : compiled.bundle.kernels) {
    out << "  " << k.name << ": grid " << dims(k.grid) << ", block " << dims(k.block);
    for (const auto& r : reports)
      if (r.name == k.name) {
        out << "; ptxas: " << r.registers << " registers, " << r.spill_stores << "/" << r.spill_loads
            << " bytes spilled (stores/loads), " << r.shared_bytes << " bytes shared";
        if (r.min_blocks_per_sm) out << ", register ceiling for " << r.min_blocks_per_sm << " blocks per multiprocessor";
      }
    out << "\n";
  }
  if (!assembled) out << "  (ptxas not found: the PTX was not assembled)\n";
  return 0;
}

double milliseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string ms(double v) {
  std::ostringstream os;
  os.precision(3);
  os << v << " ms";
  return os.str();
}

// The CLI's kernel cache: the default directory and $POLYTILE_CACHE_MAX_MB; none where no directory is set.
std::optional<cpu::KernelCache> kernel_cache() {
  const std::string dir = cpu::KernelCache::default_directory();
  if (dir.empty()) return std::nullopt;
  uint64_t limit_mb = 256;
  if (const char* env = std::getenv("POLYTILE_CACHE_MAX_MB"); env && *env) {
    const int64_t v = parse_int("POLYTILE_CACHE_MAX_MB", env);
    if (v < 0) user_error("POLYTILE_CACHE_MAX_MB=", env, ": give a size in megabytes");
    limit_mb = static_cast<uint64_t>(v);
  }
  return cpu::KernelCache(dir, limit_mb << 20);
}

int cmd_cache(const Args& a, std::ostream& out) {
  if (!a.options.empty()) user_error("cache: unknown option ", a.options.front().first);
  std::optional<cpu::KernelCache> cache = kernel_cache();
  if (!cache) user_error("cache: no kernel cache directory (set POLYTILE_CACHE_DIR or HOME)");
  if (a.file == "info") {
    cpu::KernelCache::Info i = cache->info();
    out << "kernel cache " << i.directory << ": " << i.entries << " entr" << (i.entries == 1 ? "y" : "ies") << ", " << i.bytes
        << " bytes (limit " << i.limit_bytes << " bytes)\n";
  } else if (a.file == "clear") {
    const size_t removed = cache->clear();
    out << "kernel cache " << cache->directory() << ": removed " << removed << " entr" << (removed == 1 ? "y" : "ies") << "\n";
  } else {
    user_error("cache: unknown action '", a.file, "' (info or clear)");
  }
  return 0;
}

int cmd_run(const Args& a, std::ostream& out, std::ostream& err) {
  Program p = parse_file(a.file);
  TensorMap inputs;
  std::map<std::string, std::string> output_files;
  std::vector<std::pair<std::string, TensorType>> randoms;
  uint64_t seed = 1;
  int64_t limit = 64;
  std::string backend = "cpu", target = "sm_90", cpu_name;
  std::optional<sched::GpuModel> model;
  bool tune = false, verify = false, time = false, use_cache = true, profile = false;
  int64_t threads = 0, repeat = 1;
  for (const auto& [opt, value] : a.options) {
    if (opt == "--tune") {
      tune = true;
    } else if (opt == "--no-cache") {
      use_cache = false;
    } else if (opt == "--time") {
      time = true;
    } else if (opt == "--profile") {
      profile = true;
    } else if (opt == "--threads") {
      threads = parse_int(opt, value);
      if (threads < 1 || threads > 1024) user_error("--threads ", value, ": give a thread count from 1 to 1024");
    } else if (opt == "--repeat") {
      repeat = parse_int(opt, value);
      if (repeat < 1 || repeat > 1000000) user_error("--repeat ", value, ": give a count from 1 to 1000000");
    } else if (opt == "--verify") {
      verify = true;
    } else if (opt == "--input") {
      auto [name, file] = split_assign(opt, value);
      if (inputs.count(name)) user_error("input ", name, " is given twice");
      inputs[name] = read_npy(file);
    } else if (opt == "--inputs") {
      for (auto& [name, buffer] : read_npz(value)) {
        bool known = false;
        for (const auto& in : p.inputs) known |= in.name == name;
        if (!known) user_error(value, ": array ", name, " is not an input of the program");
        if (inputs.count(name)) user_error("input ", name, " is given twice");
        inputs.emplace(name, std::move(buffer));
      }
    } else if (opt == "--random") {
      auto [name, spec] = split_assign(opt, value);
      randoms.emplace_back(name, parse_shape_spec(name, spec));
    } else if (opt == "--output") {
      auto [name, file] = split_assign(opt, value);
      output_files[name] = file;
    } else if (opt == "--backend") {
      backend = value;
    } else if (opt == "--target") {
      target = value;
    } else if (opt == "--cpu") {
      cpu_name = value;
    } else if (opt == "--gpu-model") {
      model = parse_gpu_model(value);
    } else if (opt == "--seed") {
      seed = static_cast<uint64_t>(parse_int(opt, value));
    } else if (opt == "--limit") {
      limit = parse_int(opt, value);
      if (limit < 0) user_error("--limit ", value, ": give a count of values from 0 on");
    } else {
      user_error("run: unknown option ", opt);
    }
  }
  if (backend != "interp" && backend != "cpu" && backend != "cuda" && backend != "gpu-sim")
    user_error("unknown backend '", backend, "' (available: cpu, interp, cuda, gpu-sim)");
  const bool compiled_here = backend == "cpu" || backend == "gpu-sim";  // through the CPU backend
  if (tune && backend != "cpu" && backend != "cuda") user_error("--tune needs the cpu or cuda backend");
  if (verify && backend == "interp") user_error("--verify needs a compiling backend (the interpreter runs no passes)");
  if (threads && !compiled_here) user_error("--threads needs the cpu or gpu-sim backend");
  if (profile && !compiled_here) user_error("--profile needs the cpu or gpu-sim backend");
  if (profile) use_cache = false;  // the profile times the program compiled here
  if (model && backend != "cuda" && backend != "gpu-sim") user_error("--gpu-model needs the cuda or gpu-sim backend");
  if (!cpu_name.empty() && backend != "cpu") user_error("--cpu needs the cpu backend");
  for (const auto& [name, type] : randoms) {
    if (inputs.count(name)) user_error("input ", name, " is given twice");
    inputs[name] = random_buffer(type, seed, name);
  }
  for (const auto& [name, file] : output_files) {
    bool known = false;
    for (const auto& o : p.outputs) known |= o == name;
    if (!known) user_error("--output ", name, ": the program has no output named ", name);
  }
  cpu::CompileOptions options;
  options.tune = tune && backend == "cpu";
  if (options.tune) {
    err << "tuning: timing schedule variants on this machine (interleaved rounds, the fastest run of each)\n";
    options.tuning_progress = [&err](const std::string& variant, double seconds) {
      err << "tuning: " << variant << ": " << ms(seconds * 1e3) << "\n";
    };
  }
  options.verify = verify;
  options.threads = static_cast<int>(threads);
  if (backend == "cpu") options.target = cpu::cpu_target(cpu_name);
  if (backend == "gpu-sim") options.target = sched::gpu_target(target);
  if (backend == "gpu-sim" && model) options.target.gpu = model;
  std::map<std::string, TensorType> types;
  for (const auto& [name, b] : inputs) types[name] = TensorType{b.dtype(), b.shape()};
  std::shared_ptr<const cpu::CompiledProgram> compiled;
  std::optional<ptx::Compiled> kernels;
  std::unique_ptr<cuda::Runner> gpu;
  if (backend == "cuda") {
    infer_types(p, types);
    gpu = std::make_unique<cuda::Runner>();  // UserError in one line where there is no GPU, before compiling
    ptx::Options popts;
    popts.arch = target;
    popts.verify = verify;
    popts.model = model;
    if (tune) {
      err << "tuning: timing GPU models on this GPU (the fastest of 5 launches each, after one)\n";
      std::optional<TensorMap> first;  // every candidate must compute what the first computes
      auto measure = [&](const ptx::Compiled& c) {
        std::unique_ptr<cuda::LoadedBundle> loaded = gpu->load(c.bundle);
        for (const auto& [name, value] : inputs) loaded->upload(name, value);
        loaded->launch();
        double best = loaded->launch();
        for (int r = 0; r < 4; ++r) best = std::min(best, loaded->launch());
        TensorMap outputs;
        for (const auto& o : p.outputs) outputs[o] = loaded->download(o);
        if (!first) first = outputs;
        for (const auto& o : p.outputs)  // sums may run in another order: a relative 1e-4
          if (const Difference d = difference(outputs.at(o), first->at(o)); !d.within(1e-4))
            throw InternalError("the GPU models tried disagree on " + o + ": relative error " + std::to_string(d.relative));
        return best;
      };
      ptx::Tuned tuned = ptx::tune(p, types, popts, measure, [&err](const std::string& candidate, double kernel_ms) {
        err << "tuning: " << candidate << ": " << ms(kernel_ms) << "\n";
      });
      err << "tuning: kept " << tuned.candidates.front().first << "\n";
      kernels = std::move(tuned.best);
    } else {
      kernels = ptx::compile(p, types, popts);
    }
    if (time) err << "compile: text to PTX " << ms(kernels->seconds * 1e3) << "\n";
  }
  std::shared_ptr<const cpu::LoadedProgram> loaded;  // from the kernel cache
  std::optional<cpu::KernelCache> cache;
  if (backend == "cpu" && !tune && use_cache) cache = kernel_cache();
  // The compile stages' times, with the name of the last one (making the JIT's code or an object).
  auto print_stages = [&err](const cpu::CompileTimes& t, const char* last, const char* then) {
    err << "compile: passes " << ms(t.passes * 1e3) << ", schedule " << ms(t.schedule * 1e3) << ", LLVM IR "
        << ms(t.llvm_ir * 1e3) << ", " << last << " " << ms(t.optimize_and_jit * 1e3) << then << "\n";
  };
  if (cache) {
    cpu::KernelCache::Result r = cache->get(p, types, options);
    loaded = r.program;
    if (!r.dropped.empty()) err << "kernel cache: dropped the entry for this program: " << r.dropped << "\n";
    if (!r.not_stored.empty()) err << "kernel cache: not stored: " << r.not_stored << "\n";
    if (time && r.hit) err << "compile: none, loaded from the kernel cache in " << ms(r.seconds * 1e3) << "\n";
    if (time && !r.hit) print_stages(loaded->exported().times, "optimize + object", "; stored in the kernel cache");
  } else if (compiled_here) {
    compiled = cpu::compile(p, types, options);
    if (tune && !compiled->tuning().candidates.empty())
      err << "tuning: kept " << compiled->tuning().candidates.front().first << "\n";
    if (time) print_stages(compiled->times(), "optimize + JIT", "");
  }
  TensorMap results;
  std::vector<double> runs;
  for (int64_t r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    if (compiled) {
      compiled->run(inputs, results);  // outputs reused from the second run on
    } else if (loaded) {
      loaded->run(inputs, results, static_cast<int>(threads));  // outputs reused from the second run on
    } else if (gpu) {
      results = gpu->run(kernels->bundle, inputs);
    } else {
      results = interpret(p, inputs);
    }
    runs.push_back(milliseconds_since(t0));
  }
  if (profile) {
    const std::vector<cpu::StepTime> steps = compiled->profile(inputs, static_cast<int>(repeat));
    double total = 0;
    for (const auto& st : steps) total += st.seconds;
    err << "profile (" << backend << "): where a run's " << ms(total * 1e3) << " go, the mean of " << repeat << " timed run"
        << (repeat == 1 ? "" : "s") << " after one untimed\n";
    char line[64];
    for (const auto& st : steps) {
      std::snprintf(line, sizeof line, "  %10.3f ms %5.1f%%  ", st.seconds * 1e3, total > 0 ? 100 * st.seconds / total : 0.0);
      err << line << st.name << "\n";
    }
  }
  if (time) {
    std::sort(runs.begin(), runs.end());
    err << "run (" << backend << "): median " << ms(runs[runs.size() / 2]) << " of " << repeat << " run"
        << (repeat == 1 ? "" : "s") << ", fastest " << ms(runs.front()) << "\n";
  }
  for (const auto& o : p.outputs) {
    auto it = output_files.find(o);
    if (it != output_files.end()) {
      write_npy(it->second, results.at(o));
      out << o << ": " << results.at(o).type_str() << " -> " << it->second << "\n";
    } else {
      print_buffer(out, o, results.at(o), limit);
    }
  }
  return 0;
}

Args parse_args(const std::vector<std::string>& argv) {
  Args a;
  size_t i = 0;
  if (i < argv.size()) a.command = argv[i++];
  if (a.command == "--help" || a.command == "-h") {
    a.command = "help";
  }
  for (; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s == "--help" || s == "-h") {
      a.help = true;
    } else if (s == "--verbose" || s == "--tune" || s == "--verify" || s == "--time" || s == "--profile" || s == "--no-cache" ||
               s == "--keep-zero-adjoints") {
      a.options.emplace_back(s, "true");  // the flags without a value
    } else if (s.rfind("--", 0) == 0 || s == "-o") {
      std::string opt = s, value;
      // options always take a value: --opt VALUE
      if (i + 1 >= argv.size()) user_error("option ", s, " needs a value");
      value = argv[++i];
      a.options.emplace_back(opt, value);
    } else if (a.file.empty()) {
      a.file = s;
    } else {
      user_error("unexpected argument '", s, "'");
    }
  }
  return a;
}

}  // namespace

int run_cli(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  try {
    Args a = parse_args(argv);
    if (a.command.empty()) {
      err << kMainHelp;
      return 1;
    }
    if (a.command == "--version") {
      out << cpu::compiler_identity() << "\n";
      return 0;
    }
    if (a.command == "help") {
      if (a.file == "check") {
        out << kCheckHelp;
      } else if (a.file == "run") {
        out << kRunHelp;
      } else if (a.file == "lower") {
        out << kLowerHelp;
      } else if (a.file == "grad") {
        out << kGradHelp;
      } else if (a.file == "compile") {
        out << kCompileHelp;
      } else if (a.file == "cache") {
        out << kCacheHelp;
      } else if (a.file.empty()) {
        out << kMainHelp;
      } else {
        user_error("no help for unknown command '", a.file, "'");
      }
      return 0;
    }
    if (a.command != "check" && a.command != "run" && a.command != "lower" && a.command != "grad" && a.command != "compile" &&
        a.command != "cache")
      user_error("unknown command '", a.command, "' (run 'polytile --help')");
    if (a.help) {
      out << (a.command == "check"   ? kCheckHelp
              : a.command == "run"   ? kRunHelp
              : a.command == "grad"  ? kGradHelp
              : a.command == "compile" ? kCompileHelp
              : a.command == "cache" ? kCacheHelp
                                     : kLowerHelp);
      return 0;
    }
    if (a.command == "cache") {
      if (a.file.empty()) user_error("cache: say info or clear");
      return cmd_cache(a, out);
    }
    if (a.file.empty()) user_error(a.command, ": missing FILE.tile");
    if (a.command == "check") return cmd_check(a, out, err);
    if (a.command == "lower") return cmd_lower(a, out, err);
    if (a.command == "grad") return cmd_grad(a, out);
    if (a.command == "compile") return cmd_compile(a, out);
    return cmd_run(a, out, err);
  } catch (const UserError& e) {
    std::string m = e.what();
    for (char& c : m)
      if (c == '\n') c = ' ';
    err << "polytile: error: " << m << "\n";
    return 1;
  } catch (const std::exception& e) {
    err << "polytile: internal error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace polytile
