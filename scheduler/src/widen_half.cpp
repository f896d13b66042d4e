// Half-precision widening (lower.h). Data model: a contraction whose result is f16 and which adds or
// multiplies (a sum or product aggregation, or an add or mul combination) is computed in f32 and rounded
// once (ir.h): it reads f32 casts of its f16 operands, writes an f32 tensor, and a cast to f16 gives the
// original output. The casts are elementwise statements, so fusion may inline them into the contraction's
// loads. Contractions that only select (max, min or assign of one operand) stay f16: their results are
// inputs' halves either way. A default (init tensor) seeds the f32 accumulator with its value as a half.
#include <map>

#include "polytile/lower.h"

namespace polytile::sched {

Program widen_half_contractions(const Program& p, const ProgramTypes& types) {
  Program out = p;
  out.statements.clear();
  std::set<std::string> names = tensor_names(p);
  std::map<std::string, std::string> widened;  // f16 tensor -> its f32 cast, once made
  auto dtype = [&](const std::string& t) { return types.tensors.at(t).dtype; };
  // The f32 cast of an f16 tensor, made before its first use.
  auto widen = [&](const std::string& tensor) {
    auto [it, made] = widened.try_emplace(tensor, "");
    if (made) {
      it->second = fresh_name(tensor + "_f32", names);
      out.statements.push_back(Elementwise{it->second, Expr::call(Intrinsic::cast, {Expr::tensor(tensor)}, DType::f32)});
    }
    return it->second;
  };
  for (const auto& st : p.statements) {
    const auto* c = std::get_if<Contraction>(&st);
    const bool arithmetic = c && (c->aggregation == AggregationOp::sum || c->aggregation == AggregationOp::product ||
                                  c->combination == CombinationOp::add || c->combination == CombinationOp::mul);
    if (!arithmetic || dtype(c->output) != DType::f16) {
      out.statements.push_back(st);
      continue;
    }
    Contraction wide = *c;
    // The operands that carry the value (a cond's third; the others only compare, exactly in either type).
    const size_t first = c->combination == CombinationOp::cond ? 2 : 0;
    for (size_t i = first; i < wide.inputs.size(); ++i)
      if (dtype(wide.inputs[i].tensor) == DType::f16) wide.inputs[i].tensor = widen(wide.inputs[i].tensor);
    // The default seeds the accumulator as a value of the output's dtype (as the interpreter does): a
    // default of another dtype is rounded to a half before it is widened.
    if (c->init) {
      std::string& init = *wide.init;
      if (dtype(init) == DType::f16) {
        init = widen(init);
      } else {
        const std::string rounded = fresh_name(init + "_f16_f32", names);
        out.statements.push_back(Elementwise{
            rounded, Expr::call(Intrinsic::cast, {Expr::call(Intrinsic::cast, {Expr::tensor(init)}, DType::f16)}, DType::f32)});
        init = rounded;
      }
    }
    wide.output = fresh_name(c->output + "_f32", names);
    out.statements.push_back(wide);
    out.statements.push_back(Elementwise{c->output, Expr::call(Intrinsic::cast, {Expr::tensor(wide.output)}, DType::f16)});
  }
  return out;
}

}  // namespace polytile::sched
