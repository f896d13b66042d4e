// libFuzzer target: parse, check and lower. Tile text is parsed; every input dim is bound to a small size
// taken from the input bytes; then types are inferred, every contraction is analyzed with isl, reduced and
// defracted with translation validation on, scheduled with isl for the CPU and for an sm_90 GPU (loop ASTs
// included), and differentiated.
// A UserError at any stage is a correct refusal; an InternalError (a failed proof or a broken invariant)
// or any other exception aborts, and libFuzzer keeps the input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "polytile/autodiff.h"
#include "polytile/error.h"
#include "polytile/parser.h"
#include "polytile/passes.h"
#include "polytile/polyhedral.h"
#include "polytile/scheduler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    polytile::Program p = polytile::parse_program(text, "fuzz.tile");
    // Sizes 0..4 from the last bytes of the input (so the fuzzer explores them too).
    std::map<std::string, polytile::TensorType> inputs;
    size_t byte = 0;
    for (const auto& param : p.inputs) {
      polytile::TensorType t;
      t.dtype = polytile::DType::f32;
      for (size_t k = 0; k < param.dims.size(); ++k, ++byte)
        t.shape.push_back(size > byte ? data[size - 1 - byte] % 5 : 2);
      inputs[param.name] = t;
    }
    polytile::ProgramTypes types = polytile::infer_types(p, inputs);
    polytile::poly::analyze_program(p, types);
    polytile::Program lowered = polytile::poly::reduce_and_defract(p, polytile::poly::PassContext{&types, true});
    const polytile::ProgramTypes lowered_types = polytile::infer_types(lowered, inputs);
    polytile::sched::schedule(lowered, lowered_types);
    static const polytile::sched::Target gpu = polytile::sched::gpu_target("sm_90");
    polytile::sched::schedule(lowered, lowered_types, gpu);  // the GPU strategy's kernels, shared tiles, barriers
    polytile::ad::vjp(p);
  } catch (const polytile::UserError&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "not a user error: %s\n", e.what());
    std::abort();
  }
  return 0;
}
