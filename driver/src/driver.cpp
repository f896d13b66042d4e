#include "polytile/driver.h"

#include <algorithm>

#include "polytile/autodiff.h"
#include "polytile/cpu.h"
#include "polytile/error.h"
#include "polytile/lower.h"
#include "polytile/parser.h"
#include "polytile/passes.h"
#include "polytile/polyhedral.h"
#include "polytile/ptx.h"

namespace polytile::driver {

const std::vector<std::string>& stages() {
  static const std::vector<std::string> all = {"tile",     "isl", "reduced", "defracted", "lowered",
                                               "schedule", "ast", "loops",   "llvm",      "ptx"};
  return all;
}

std::string stage_list() {
  std::string out;
  for (const std::string& s : stages()) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool needs_input_types(const std::string& stage) {
  return stage != "tile" && stage != "reduced" && stage != "defracted";
}

std::string print_stage(const Program& program, const StageRequest& request, std::vector<std::string>* log) {
  const std::string& stage = request.stage;
  const bool gpu = !request.target.empty() && request.target != "cpu";
  if (std::find(stages().begin(), stages().end(), stage) == stages().end())
    user_error("unknown stage '", stage, "' (", stage_list(), ")");
  if (request.gpu_model && !gpu) user_error("stage ", stage, ": a GPU model needs a GPU target sm_XY");
  if (!request.cpu.empty() && gpu) user_error("stage ", stage, ": --cpu names a CPU target's CPU, not ", request.target, "'s");
  std::optional<ProgramTypes> types;
  if (!request.inputs.empty()) types = infer_types(program, request.inputs);
  if (needs_input_types(stage) && !types) user_error("stage ", stage, " needs the dtype and shape of every input");
  poly::PassContext ctx{types ? &*types : nullptr, request.verify};
  std::vector<std::string> ignored;
  std::vector<std::string>& lines = log ? *log : ignored;
  if (stage == "tile") return print(program);
  if (stage == "isl") return poly::print_analyses(poly::analyze_program(program, *types));
  if (stage == "reduced") return print(poly::reduce_program(program, ctx, &lines));
  if (stage == "defracted") return print(poly::reduce_and_defract(program, ctx, &lines));
  if (stage == "lowered" || stage == "schedule" || stage == "ast" || stage == "loops") {
    sched::LowerOptions options;
    options.target = gpu ? sched::gpu_target(request.target) : cpu::cpu_target(request.cpu);  // what a run compiles
    if (request.gpu_model) options.target.gpu = request.gpu_model;
    options.verify = request.verify;
    sched::Lowered lowered = sched::lower(program, request.inputs, options);  // no code generation
    return stage == "lowered"    ? print(lowered.program)
           : stage == "schedule" ? lowered.schedule.tree()
           : stage == "ast"      ? lowered.schedule.ast()
                                 : sched::print_loops(lowered.schedule);
  }
  if (stage == "ptx" || (stage == "llvm" && gpu)) {
    if (request.target == "cpu") user_error("stage ptx needs a GPU target sm_XY");
    ptx::Options options;  // no target: the default GPU architecture
    if (gpu) options.arch = request.target;
    options.verify = request.verify;
    options.model = request.gpu_model;
    ptx::Compiled compiled = ptx::compile(program, request.inputs, options);
    return stage == "ptx" ? compiled.bundle.ptx : compiled.llvm_ir;
  }
  POLYTILE_CHECK(stage == "llvm", "print_stage: stage ", stage, " has no printer");
  cpu::CompileOptions options;
  options.target = cpu::cpu_target(request.cpu);
  options.verify = request.verify;
  return cpu::optimized_llvm_ir(program, request.inputs, options);
}

Program gradient(const Program& program, const GradRequest& request) {
  ad::Options options;
  options.wrt = request.wrt;
  options.verify = request.verify;
  options.reduce_and_defract = request.reduce_and_defract;
  options.prove_zero_adjoints = request.prove_zero_adjoints;
  if (request.mode == "forward") {
    if (!request.reduce_and_defract) user_error("forward mode gives the defracted form only");
    return ad::jvp(program, request.wrt, request.verify, request.prove_zero_adjoints).program;
  }
  if (request.mode != "reverse" && request.mode != "mixed")
    user_error("unknown gradient mode '", request.mode, "' (reverse, mixed, forward)");
  options.mixed_mode = request.mode == "mixed";
  return ad::vjp(program, options).program;
}

}  // namespace polytile::driver
