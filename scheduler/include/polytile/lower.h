// The lowering pipeline: one entry from a Program and its input types to loop nests, as a list of passes
// that reads like the compiler (scheduler/src/lower.cpp):
//   reduce + defract -> cond-miss lowering -> half widening -> broadcasts -> elementwise fusion -> layouts (CPU)
//   -> split reductions (the GPU's blocks, the CPU's threads) -> isl schedule (loop IR)
// Every stage's result prints (`polytile lower --emit tile|defracted|lowered|schedule|ast|loops`); nothing
// here needs LLVM, and the code generators (cpu_codegen) only emit and run what `lower` produced. With
// `verify`, every pass proves its rewrite (translation validation, polytile/verify.h).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "polytile/ir.h"
#include "polytile/scheduler.h"
#include "polytile/shapes.h"

namespace polytile::sched {

struct LowerOptions {
  Target target;  // cpu::host_target() for what runs on this machine
  bool reduce_and_defract = true;
  bool verify = false;
};

struct LowerTimes {
  double passes = 0, schedule = 0;  // seconds
};

struct Lowered {
  Program defracted;   // after reduce and defract
  Program program;     // after every program pass: what the schedule computes
  ProgramTypes types;  // of `program`
  Schedule schedule;
  LowerTimes times;
};

// What a code generator sees while lowering runs: the program after the passes with its types, before
// scheduling starts (`program`), then each nest as soon as it is final (`nest`, see NestSink).
struct LowerObserver {
  std::function<void(const Program& program, const ProgramTypes& types)> program;
  NestSink nest;
};

// UserError for what the program's inputs make impossible (see infer_types, poly::analyze).
Lowered lower(const Program& program, const std::map<std::string, TensorType>& inputs, const LowerOptions& options = {},
              const LowerObserver& observer = {});

// The cond-miss pass: a cond contraction aggregating with max, min or product leaves an element at the
// aggregation's identity when every point misses, where the semantics leave it unwritten (0). Such a
// contraction O becomes O_raw (the same contraction), a count of hits, and O = select(hits == 0, 0, O_raw).
// With `verify_with` (the input types), both new contractions are proven against the original.
Program lower_cond_misses(const Program& program, const std::map<std::string, TensorType>* verify_with = nullptr);

// Half widening: a contraction whose result is f16 and that adds or multiplies (a sum or product, or an add
// or mul combination) becomes the same contraction over f32 casts of its f16 operands, into an f32 tensor,
// and a cast of that to f16: f16 contractions combine and accumulate in f32 and round once (ir.h).
// Contractions that only select (max, min, assign of one operand) stay as they are.
Program widen_half_contractions(const Program& program, const ProgramTypes& types);

// Broadcast lowering: a contraction whose every output element gets exactly one term read by numpy
// broadcasting (output indices distinct plain variables; input indices the aligned variable or 0 on a dim
// of size 1; no constraints, no default; the term's dtype the output's), and which only elementwise
// statements of its own shape read, is substituted into them as an elementwise expression (a sum adds the
// term to 0; a conditional sum selects it where the condition holds and 0 elsewhere; a product or sum
// of two reads of the output's dtype is that operation on them), so fusion can run
// it in their nest instead of materializing it. Autodiff's adjoints of broadcasts and of a max's argmax
// are such contractions. With `verify`, isl proves the single term per element of each one substituted.
Program broadcasts_to_elementwise(const Program& program, const ProgramTypes& types, bool verify = false);

// The loop IR the emitters consume, as text: every nest with its kind, variables and marks, then its loops,
// guards and statements (iterators c0, c1, ...).
std::string print_loops(const Schedule& schedule);

}  // namespace polytile::sched
