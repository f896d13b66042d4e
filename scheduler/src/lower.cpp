// The lowering pipeline (lower.h), pass by pass. To add a pass: write it as a function of its own file that
// takes and returns a Program (with the types it needs), give it a proof under `options.verify`, and call
// it here in order; `polytile lower --emit lowered` prints the program the schedule is built from.
#include "polytile/lower.h"

#include <chrono>

#include "polytile/passes.h"

namespace polytile::sched {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Lowered lower(const Program& source, const std::map<std::string, TensorType>& inputs, const LowerOptions& options) {
  Lowered out;
  auto t0 = std::chrono::steady_clock::now();
  ProgramTypes types = infer_types(source, inputs);
  Program p = options.reduce_and_defract ? poly::reduce_and_defract(source, poly::PassContext{&types, options.verify}) : source;
  out.defracted = p;
  p = lower_cond_misses(p, options.verify ? &inputs : nullptr);
  types = infer_types(p, inputs);
  Program unfused = p;
  p = fuse_elementwise(p, types);
  if (options.verify) verify_fusion(unfused, p, types);
  types = infer_types(p, inputs);  // fusion drops tensors
  p = prepare_layouts(p, types, options.target, options.verify);
  out.types = infer_types(p, inputs);  // layouts add copies
  out.program = std::move(p);
  out.times.passes = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  out.schedule = schedule(out.program, out.types, options.target);
  out.times.schedule = seconds_since(t0);
  return out;
}

}  // namespace polytile::sched
