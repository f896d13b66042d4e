// The compiler's stages as text and its gradient modes, in one place for every front door: the command
// line (`polytile lower --emit STAGE`, `polytile grad`) and the Python package (`Program.lower(stage)`,
// `Program.grad()`) print and differentiate through these functions, so they cannot drift apart.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "polytile/ir.h"
#include "polytile/scheduler.h"
#include "polytile/shapes.h"

namespace polytile::driver {

// What to print: one stage, for inputs of the given types where the stage needs them.
struct StageRequest {
  // tile, isl, reduced, defracted, lowered, schedule, ast, loops, llvm, ptx (stages()).
  std::string stage;
  // The inputs' dtypes and shapes: needed from isl on; reduced and defracted use them where isl cannot
  // express the sizes as parameters.
  std::map<std::string, TensorType> inputs;
  std::string target;                       // "" or "cpu": this machine; "sm_XY": an NVIDIA GPU
  std::optional<sched::GpuModel> gpu_model;  // GPU targets only
  std::string cpu;                          // CPU targets: the CPU the code is for (cpu::cpu_target); "": this one
  bool verify = false;                      // translation validation of every rewriting pass
};

// The stages print_stage knows, in pipeline order.
const std::vector<std::string>& stages();
// The same as text: "tile, isl, ..., ptx" (for messages).
std::string stage_list();

// Whether `stage` needs the inputs' types (every stage but tile, reduced and defracted).
bool needs_input_types(const std::string& stage);

// The text of one stage of `program`. UserError naming the stage for an unknown stage, a stage that needs
// input types without them, a GPU model without a GPU target, and every error the stages report. `log`, if
// given, receives what reduce and defract did (one line per rewrite).
std::string print_stage(const Program& program, const StageRequest& request, std::vector<std::string>* log = nullptr);

// What to differentiate, and how.
struct GradRequest {
  std::vector<std::string> wrt;  // input names; empty: all inputs
  std::string mode = "reverse";  // reverse (vjp), mixed (reverse with dual-number partials), forward (jvp)
  bool reduce_and_defract = true;  // false: the gradient as generated (reverse and mixed modes only)
  bool verify = false;
  bool prove_zero_adjoints = true;  // false: also the adjoints proven zero, as the rules write them
};

// The gradient program of `program` (autodiff.h: vjp, or jvp in forward mode). UserError for an unknown
// mode, forward mode without reduce/defract, and every error autodiff reports.
Program gradient(const Program& program, const GradRequest& request);

}  // namespace polytile::driver
