// The lowering pipeline (lower.h), pass by pass. To add a pass: write it as a function of its own file that
// takes and returns a Program (with the types it needs), give it a proof under `options.verify`, and call
// it here in order; `polytile lower --emit lowered` prints the program the schedule is built from.
#include "polytile/lower.h"

#include <chrono>

#include "polytile/error.h"
#include "polytile/passes.h"

namespace polytile::sched {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Types are inferred once, then carried: every pass keeps the type of each tensor it keeps (fusion wraps
// an absorbed producer in a cast to its dtype; layouts and cond-miss lowering leave outputs as they were),
// so after a pass only the statements it added are typed, and what it dropped is forgotten. With
// `verify`, the carried types are checked against typing the whole program again.
ProgramTypes carry_types(const ProgramTypes& before, const Program& after, const std::map<std::string, TensorType>& inputs,
                         bool verify, const char* pass) {
  ProgramTypes types;
  types.dims = before.dims;
  for (const auto& in : after.inputs) types.tensors[in.name] = before.tensors.at(in.name);
  for (const auto& st : after.statements) {
    auto known = before.tensors.find(statement_output(st));
    if (known != before.tensors.end()) {
      types.tensors.insert(*known);
    } else {
      infer_statement_type(st, types);
    }
  }
  if (verify) {
    ProgramTypes again = infer_types(after, inputs);
    for (const auto& [name, t] : again.tensors) {
      auto carried = types.tensors.find(name);
      POLYTILE_CHECK(carried != types.tensors.end() && carried->second.dtype == t.dtype && carried->second.shape == t.shape,
                     pass, " changed the type of ", name, " to ", t.str());
    }
    POLYTILE_CHECK(again.tensors.size() == types.tensors.size(), pass, " left types of tensors it dropped");
  }
  return types;
}

}  // namespace

Lowered lower(const Program& source, const std::map<std::string, TensorType>& inputs, const LowerOptions& options,
              const LowerObserver& observer) {
  Lowered out;
  auto t0 = std::chrono::steady_clock::now();
  const bool verify = options.verify;
  ProgramTypes types = infer_types(source, inputs);  // the only full typing; passes carry it (carry_types)
  // reduce and defract change variables only: every tensor keeps its type.
  Program p = options.reduce_and_defract ? poly::reduce_and_defract(source, poly::PassContext{&types, verify}) : source;
  out.defracted = p;
  p = lower_cond_misses(p, verify ? &inputs : nullptr);
  types = carry_types(types, p, inputs, verify, "cond-miss lowering");
  p = widen_half_contractions(p, types);
  types = carry_types(types, p, inputs, verify, "half widening");
  p = broadcasts_to_elementwise(p, types, verify);
  types = carry_types(types, p, inputs, verify, "broadcast lowering");
  Program unfused = p;
  p = fuse_elementwise(p, types);
  if (verify) verify_fusion(unfused, p, types);
  types = carry_types(types, p, inputs, verify, "fusion");
  if (!options.target.gpu) p = prepare_layouts(p, types, options.target, verify);  // for the CPU's micro-kernels
  types = carry_types(types, p, inputs, verify, "layouts");
  p = split_reductions(p, types, options.target, verify);  // for the GPU's blocks, and the CPU's threads
  out.types = carry_types(types, p, inputs, verify, "split reductions");
  out.program = std::move(p);
  out.times.passes = seconds_since(t0);

  if (observer.program) observer.program(out.program, out.types);
  t0 = std::chrono::steady_clock::now();
  out.schedule = schedule(out.program, out.types, options.target, observer.nest);
  out.times.schedule = seconds_since(t0);
  return out;
}

}  // namespace polytile::sched
