// Forward mode (jvp). Data model: the tangent program is the forward program plus, after each statement
// whose operands carry tangents, statements computing that statement's tangent T<name> by the rules of
// autodiff.h (the forward counterparts of the reverse rules: sum and assign are linear in their
// operands, max/min pass the tangent of the maximal elements averaged over ties, product uses the same
// zero-aware decomposition as reverse mode).
#include <algorithm>

#include "builder.h"
#include "derivatives.h"
#include "invariance.h"
#include "polytile/autodiff.h"
#include "polytile/cse.h"
#include "polytile/error.h"
#include "polytile/passes.h"

namespace polytile::ad {
namespace {


class ForwardMode {
 public:
  ForwardMode(const Program& p, bool verify) : forward_(p), b_(p), verify_(verify) { b_.program.statements.clear(); }

  // Tensors no output depends on (invariance.h) get no tangent: what they would pass on cancels exactly.
  void prove_zero_tangents() {
    InvarianceQuery query;
    query.program = &forward_;
    query.shapes = &b_.shapes;
    query.observed.insert(forward_.outputs.begin(), forward_.outputs.end());
    std::set<std::string> candidates;
    for (const auto& st : forward_.statements) candidates.insert(statement_output(st));
    zero_ = tensors_observed_outputs_ignore(query, candidates);
  }

  Result run(const std::vector<std::string>& inputs) {
    std::vector<std::string> names;  // T<output>, reserved first
    for (const auto& o : forward_.outputs) names.push_back(b_.fresh("T" + o));
    for (const auto& name : inputs) {
      const Param* param = nullptr;
      for (const auto& p : forward_.inputs)
        if (p.name == name) param = &p;
      if (!param) user_error("cannot take a tangent of ", name, ": it is not an input of the program");
      if (tangent_.count(name)) user_error("cannot take a tangent of ", name, " twice: it is named more than once");
      std::string t = b_.fresh("T" + name);
      b_.program.inputs.push_back(Param{t, param->dims});
      b_.shapes[t] = param->dims;
      tangent_[name] = t;
    }
    for (const auto& st : forward_.statements) {
      b_.add(st);
      if (zero_.count(statement_output(st))) {
        std::vector<std::string> operands = statement_operands(st);
        if (std::any_of(operands.begin(), operands.end(), [&](const std::string& o) { return has(o); }))
          proven_.push_back(statement_output(st));
        continue;
      }
      if (const auto* e = std::get_if<Elementwise>(&st)) {
        elementwise(*e);
      } else {
        contraction(std::get<Contraction>(st));
      }
    }
    Result r;
    b_.program.outputs.clear();
    std::map<std::string, std::string> bound;  // a tangent already given an output's name
    for (size_t i = 0; i < forward_.outputs.size(); ++i) {
      const std::string& o = forward_.outputs[i];
      const std::string& name = names[i];
      auto it = tangent_.find(o);
      if (it == tangent_.end()) {
        b_.zeros(o, {}, name + "_zeros");
        b_.rename_last(name);
      } else if (auto b = bound.find(it->second); b != bound.end()) {
        // Two outputs share a tangent (P = O with outputs P and O): the first name may have replaced it.
        b_.add(Elementwise{name, Expr::call(Intrinsic::ident, {T(b->second)})});
      } else if (made_.count(it->second)) {
        b_.bind_name(it->second, name);
        bound[it->second] = name;
      } else {
        b_.add(Elementwise{name, Expr::call(Intrinsic::ident, {T(it->second)})});
      }
      r.gradients.push_back(name);
    }
    b_.program.outputs = r.gradients;
    b_.eliminate_dead_code();
    b_.program = poly::reduce_and_defract(b_.program, poly::PassContext{nullptr, verify_});
    b_.program = eliminate_common_subexpressions(b_.program);
    validate(b_.program);
    r.program = b_.program;
    r.adjoints = tangent_;
    r.zero_adjoints = proven_;
    return r;
  }

 private:


  bool has(const std::string& t) const { return tangent_.count(t) != 0; }

  void elementwise(const Elementwise& e) {
    std::optional<Expr> t = tangent(e.expr, [this](const std::string& name) -> std::optional<Expr> {
      auto it = tangent_.find(name);
      if (it == tangent_.end()) return std::nullopt;
      return T(it->second);
    });
    if (!t) return;
    // The tangent has the output's shape even when only a broadcast operand carries one (O = A + B with a
    // scalar B: TO = TB spread over A's shape). select(O == O, t, t) is t broadcast to O, NaN included.
    if (b_.expr_shape(*t) != b_.shapes.at(e.output)) {
      Expr o = T(e.output);
      t = Expr::call(Intrinsic::select, {Expr::binary(BinaryOp::eq, o, o), *t, *t});
    }
    std::string name = b_.elementwise("T" + e.output, *t);
    if (t->kind() != Expr::Kind::tensor) made_.insert(name);
    tangent_[e.output] = name;
  }

  Contraction like(const Contraction& c, const std::string& base) {
    Contraction t = c;
    t.output = b_.fresh(base);
    t.init.reset();
    return t;
  }

  void contraction(const Contraction& c) {
    std::vector<std::string> parts;
    auto tan_access = [this](const TensorAccess& a) { return TensorAccess{tangent_.at(a.tensor), a.indices}; };
    const std::string base = "T" + c.output;
    switch (c.aggregation) {
      case AggregationOp::sum:
      case AggregationOp::assign: {
        switch (c.combination) {
          case CombinationOp::none:
            if (has(c.inputs[0].tensor)) {
              Contraction t = like(c, base);
              t.aggregation = AggregationOp::sum;
              t.inputs = {tan_access(c.inputs[0])};
              parts.push_back(b_.add(std::move(t)));
            }
            break;
          case CombinationOp::mul:
            for (size_t i = 0; i < 2; ++i) {
              if (!has(c.inputs[i].tensor)) continue;
              Contraction t = like(c, base);
              t.aggregation = AggregationOp::sum;
              t.inputs[i] = tan_access(c.inputs[i]);
              parts.push_back(b_.add(std::move(t)));
            }
            break;
          case CombinationOp::add: {
            bool t0 = has(c.inputs[0].tensor), t1 = has(c.inputs[1].tensor);
            if (!t0 && !t1) break;
            Contraction t = like(c, base);
            t.aggregation = AggregationOp::sum;
            if (t0 && t1) {
              t.inputs = {tan_access(c.inputs[0]), tan_access(c.inputs[1])};
            } else {
              size_t i = t0 ? 0 : 1;
              t.inputs = {tan_access(c.inputs[i])};
              t.combination = CombinationOp::none;
              b_.keep_bounds(c.inputs[1 - i], t.constraints, t.inputs, t.combination);
            }
            parts.push_back(b_.add(std::move(t)));
            break;
          }
          case CombinationOp::cond:
            if (has(c.inputs[2].tensor)) {
              Contraction t = like(c, base);
              t.aggregation = AggregationOp::sum;
              t.inputs[2] = tan_access(c.inputs[2]);
              parts.push_back(b_.add(std::move(t)));
            }
            break;
          case CombinationOp::eq: break;
        }
        if (c.init && has(*c.init)) {
          if (c.aggregation == AggregationOp::assign)
            user_error("cannot take the tangent of contraction ", c.output, ": assign with a default tensor");
          // The default's tangent, broadcast to the output's shape.
          Expr out = T(c.output);
          parts.push_back(b_.elementwise(base, sel(bin(BinaryOp::eq, out, out), T(tangent_.at(*c.init)), T(tangent_.at(*c.init)))));
        }
        break;
      }
      case AggregationOp::max:
      case AggregationOp::min: {
        if (c.combination != CombinationOp::none)
          user_error("cannot take the tangent of contraction ", c.output, ": ", to_string(c.aggregation), " of a ",
                     to_string(c.combination), " combination; compute the combination in a statement of its own first");
        bool ta = has(c.inputs[0].tensor), td = c.init && has(*c.init);
        if (!ta && !td) break;
        const TensorAccess out{c.output, c.output_indices};
        Contraction n = like(c, "N" + c.output);
        n.aggregation = AggregationOp::sum;
        n.combination = CombinationOp::eq;
        n.inputs = {c.inputs[0], out};
        std::string count = b_.add(std::move(n));
        Expr num = lit(0);
        if (ta) {
          Contraction s = like(c, "S" + c.output);
          s.aggregation = AggregationOp::sum;
          s.combination = CombinationOp::cond;
          s.inputs = {c.inputs[0], out, tan_access(c.inputs[0])};
          num = T(b_.add(std::move(s)));
        }
        Expr total = T(count);
        if (c.init) {
          Expr hit = bin(BinaryOp::eq, T(*c.init), T(c.output));
          total = bin(BinaryOp::add, total, hit);
          if (td) num = bin(BinaryOp::add, num, sel(hit, T(tangent_.at(*c.init)), lit(0)));
        }
        parts.push_back(b_.elementwise(base, sel(bin(BinaryOp::eq, total, ilit(0)), lit(0), bin(BinaryOp::div, num, total))));
        break;
      }
      case AggregationOp::product: {
        if (!has(c.inputs[0].tensor)) break;
        if (c.combination != CombinationOp::none || c.init)
          user_error("cannot take the tangent of contraction ", c.output, ": product of a ", to_string(c.combination),
                     " combination or with a default tensor");
        const TensorAccess& a = c.inputs[0];
        const Expr A = T(a.tensor), is_zero = bin(BinaryOp::eq, A, ilit(0));
        std::string zero = b_.elementwise("ZERO", ilit(0));
        Contraction z = like(c, "Z" + c.output);
        z.aggregation = AggregationOp::sum;
        z.combination = CombinationOp::eq;
        z.inputs = {a, {zero, {}}};
        std::string zc = b_.add(std::move(z));
        Contraction p = like(c, "P" + c.output);
        p.inputs = {{b_.elementwise("NZ" + a.tensor, sel(is_zero, ilit(1), A)), a.indices}};
        std::string pc = b_.add(std::move(p));
        std::string rinv = b_.elementwise("R" + a.tensor, sel(is_zero, lit(0), bin(BinaryOp::div, lit(1), A)));
        std::string isz = b_.elementwise("S" + a.tensor, sel(is_zero, lit(1), lit(0)));
        auto weighted = [&](const std::string& w) {
          Contraction s = like(c, "S" + c.output);
          s.aggregation = AggregationOp::sum;
          s.combination = CombinationOp::mul;
          s.inputs = {tan_access(a), {w, a.indices}};
          return b_.add(std::move(s));
        };
        std::string s0 = weighted(rinv), s1 = weighted(isz);
        Expr zz = T(zc);
        parts.push_back(b_.elementwise(
            base, bin(BinaryOp::mul, T(pc),
                      sel(bin(BinaryOp::eq, zz, ilit(0)), T(s0), sel(bin(BinaryOp::eq, zz, ilit(1)), T(s1), lit(0))))));
        break;
      }
    }
    if (parts.empty()) return;
    tangent_[c.output] = b_.sum(parts, base);
    made_.insert(tangent_[c.output]);
  }

  const Program& forward_;
  Builder b_;
  std::map<std::string, std::string> tangent_;
  std::set<std::string> made_;  // tangent tensors this pass created (free to rename)
  std::set<std::string> zero_;        // tensors whose tangent is proven not to reach the outputs
  std::vector<std::string> proven_;   // those of them a tangent would have reached
  bool verify_;
};

}  // namespace

Result jvp(const Program& program, const std::vector<std::string>& tangents, bool verify, bool prove_zero_tangents) {
  validate(program);
  std::vector<std::string> inputs = tangents;
  if (inputs.empty())
    for (const auto& p : program.inputs) inputs.push_back(p.name);
  ForwardMode mode(program, verify);
  if (prove_zero_tangents) mode.prove_zero_tangents();
  return mode.run(inputs);
}

}  // namespace polytile::ad
