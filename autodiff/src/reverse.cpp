// Reverse mode. Data model: the gradient program starts as a copy of the forward program (so every
// forward value is available), gains one input per head, and then, walking the forward statements
// backwards, one group of statements per (statement, operand) pair that carries adjoint: the rules of
// autodiff.h. Adjoints have shape prefix + shape(tensor); the prefix is empty for gradients and vjps, the
// head's leading dims for differentiate. Contributions to a tensor's adjoint are summed when the sweep
// reaches the tensor's own statement.
#include <algorithm>

#include "builder.h"
#include "derivatives.h"
#include "invariance.h"
#include "polytile/autodiff.h"
#include "polytile/cse.h"
#include "polytile/error.h"
#include "polytile/parser.h"
#include "polytile/passes.h"

namespace polytile::ad {
namespace {


class Context : public DerivativeContext {
 public:
  Context(Builder& b, std::string head, size_t prefix) : b_(b), head_(std::move(head)), prefix_(prefix) {}
  const std::string& head() const override { return head_; }
  size_t prefix_rank() const override { return prefix_; }
  void emit(const std::string& text) override {
    for (auto& st : parse_statements(text, b_.program, "custom derivative")) {
      b_.reserve(statement_output(st));
      b_.add(std::move(st));
    }
  }
  std::string fresh(const std::string& base) override { return b_.fresh(base); }

 private:
  Builder& b_;
  std::string head_;
  size_t prefix_;
};

class ReverseMode {
 public:
  ReverseMode(const Program& forward, const Options& options) : forward_(forward), options_(options), b_(forward) {}

  // Differentiates: `seeds` maps forward tensors to their head adjoints (already in the program).
  Result run(const std::vector<DimExpr>& prefix, const std::map<std::string, std::string>& seeds,
             const std::vector<std::string>& wrt) {
    prefix_ = prefix;
    for (const auto& w : wrt) {
      bool is_input = false;
      for (const auto& p : forward_.inputs) is_input |= p.name == w;
      if (!is_input) user_error("cannot differentiate with respect to ", w, ": it is not an input of the program");
      if (std::count(wrt.begin(), wrt.end(), w) > 1) user_error("cannot differentiate with respect to ", w, " twice: it is named more than once");
    }
    std::map<std::string, std::string> reserved;  // wrt input -> D<input>
    for (const auto& w : wrt) reserved[w] = b_.fresh("D" + w);
    std::set<std::string> observed;
    for (const auto& [tensor, head] : seeds) observed.insert(tensor);
    mark_requirements(wrt, observed);
    if (options_.mixed_mode) insert_partials();
    for (const auto& [tensor, head] : seeds) contributions_[tensor].push_back(head);

    std::vector<Statement> statements = b_.program.statements;  // the forward part (with partials)
    for (auto it = statements.rbegin(); it != statements.rend(); ++it) {
      const std::string& out = statement_output(*it);
      if (partial_of_.count(out) || !requires_.count(out)) continue;
      auto c = contributions_.find(out);
      if (c == contributions_.end()) continue;
      std::string adjoint = b_.sum(c->second, "D" + out);
      adjoints_[out] = adjoint;
      if (options_.stop_gradient.count(out)) continue;
      propagate(*it, adjoint);
    }

    Result r;
    for (const auto& w : wrt) {
      auto c = contributions_.find(w);
      std::string name = reserved[w];
      if (c == contributions_.end() || options_.stop_gradient.count(w)) {
        b_.zeros(w, prefix_, name + "_zeros");
        b_.rename_last(name);
      } else {
        finalize(c->second, name);
      }
      r.gradients.push_back(name);
      adjoints_[w] = name;
    }
    b_.program.outputs = r.gradients;
    r.zero_adjoints.assign(zero_.begin(), zero_.end());
    if (options_.all_adjoints) {
      for (const auto& z : zero_) adjoints_[z] = b_.zeros(z, prefix_, "D" + z);
      for (const auto& [tensor, adjoint] : adjoints_) {
        if (std::find(b_.program.outputs.begin(), b_.program.outputs.end(), adjoint) != b_.program.outputs.end()) continue;
        bool is_input = false;
        for (const auto& p : b_.program.inputs) is_input |= p.name == adjoint;
        if (is_input) continue;
        b_.program.outputs.push_back(adjoint);
      }
      r.adjoints = adjoints_;
    } else {
      for (const auto& w : wrt) r.adjoints[w] = adjoints_[w];
    }
    b_.eliminate_dead_code();
    if (options_.reduce_and_defract) b_.program = poly::reduce_and_defract(b_.program, poly::PassContext{nullptr, options_.verify});
    b_.program = eliminate_common_subexpressions(b_.program);
    validate(b_.program);
    r.program = b_.program;
    return r;
  }

  Builder& builder() { return b_; }

 private:
  // Which tensors carry adjoint: those depending on a wrt input (through overrides' dependencies too), less
  // those whose adjoint is proven zero (invariance.h): no statement computes it, and what depends on a wrt
  // input only through them carries none either.
  void mark_requirements(const std::vector<std::string>& wrt, const std::set<std::string>& observed) {
    mark_dependents(wrt);
    if (!options_.prove_zero_adjoints || options_.hook) return;  // a hook's derivatives are unknown here
    InvarianceQuery query;
    query.program = &forward_;
    query.shapes = &b_.shapes;
    query.observed = observed;
    query.constant = options_.stop_gradient;
    for (const auto& [name, ov] : options_.overrides) {
      query.opaque.insert(name);
      query.dependencies[name] = ov.dependencies;
    }
    // Candidates: tensors between a wrt input and an observed output (an adjoint would reach them).
    std::set<std::string> reaching = observed;
    for (auto it = forward_.statements.rbegin(); it != forward_.statements.rend(); ++it) {
      const std::string& out = statement_output(*it);
      if (!reaching.count(out)) continue;
      for (const auto& d : statement_operands(*it)) reaching.insert(d);
      auto ov = options_.overrides.find(out);
      if (ov != options_.overrides.end()) reaching.insert(ov->second.dependencies.begin(), ov->second.dependencies.end());
    }
    std::set<std::string> candidates;
    for (const auto& st : forward_.statements) {
      const std::string& out = statement_output(st);
      if (requires_.count(out) && reaching.count(out) && !options_.stop_gradient.count(out)) candidates.insert(out);
    }
    zero_ = tensors_observed_outputs_ignore(query, candidates);
    if (zero_.empty()) return;
    requires_.clear();
    mark_dependents(wrt);
  }

  void mark_dependents(const std::vector<std::string>& wrt) {
    requires_.insert(wrt.begin(), wrt.end());
    for (const auto& st : forward_.statements) {
      const std::string& out = statement_output(st);
      if (zero_.count(out)) continue;
      std::vector<std::string> deps = statement_operands(st);
      auto ov = options_.overrides.find(out);
      if (ov != options_.overrides.end()) deps = ov->second.dependencies;
      for (const auto& d : deps)
        if (requires_.count(d) && !options_.stop_gradient.count(d)) requires_.insert(out);
    }
  }

  void contribute(const std::string& tensor, const std::string& name) {
    if (!name.empty() && requires_.count(tensor)) contributions_[tensor].push_back(name);
  }

  // The adjoint goes into D<input>.
  void finalize(const std::vector<std::string>& parts, const std::string& name) {
    if (parts.size() > 1) {
      Expr e = T(parts[0]);
      for (size_t i = 1; i < parts.size(); ++i) e = bin(BinaryOp::add, e, T(parts[i]));
      b_.add(Elementwise{name, e});
      return;
    }
    // Only contributions made for this adjoint may be renamed (not a forward tensor or a head).
    if (contributions_made_.count(parts[0])) {
      b_.bind_name(parts[0], name);
    } else {
      b_.add(Elementwise{name, Expr::call(Intrinsic::ident, {T(parts[0])})});
    }
  }



  std::string made(const std::string& name) {
    contributions_made_.insert(name);
    return name;
  }

  std::vector<Polynomial> with_prefix(const std::vector<std::string>& pv, const std::vector<Polynomial>& idx) const {
    std::vector<Polynomial> out;
    for (const auto& v : pv) out.push_back(Polynomial::index(v));
    out.insert(out.end(), idx.begin(), idx.end());
    return out;
  }

  std::vector<DimExpr> prefixed(const std::string& tensor) const {
    std::vector<DimExpr> s = prefix_;
    const auto& shape = b_.shapes.at(tensor);
    s.insert(s.end(), shape.begin(), shape.end());
    return s;
  }

  // A sum contraction writing the adjoint of `target`'s tensor at target's index expressions.
  std::string flip(const Contraction& c, const std::vector<std::string>& pv, const TensorAccess& target,
                   CombinationOp comb, std::vector<TensorAccess> body, std::vector<Constraint> extra = {}) {
    Contraction g;
    g.output = b_.fresh("D" + target.tensor);
    g.output_indices = with_prefix(pv, target.indices);
    g.output_shape = prefixed(target.tensor);
    g.aggregation = AggregationOp::sum;
    g.combination = comb;
    g.inputs = std::move(body);
    g.constraints = c.constraints;
    g.constraints.insert(g.constraints.end(), extra.begin(), extra.end());
    return made(b_.add(std::move(g)));
  }

  std::string unbroadcast_to(const std::string& name, const std::string& tensor) {
    std::string r = b_.unbroadcast(name, prefixed(tensor), prefix_.size(), "D" + tensor);
    if (r != name) made(r);
    return r;
  }

  [[noreturn]] void refuse(const Contraction& c, const std::string& why) {
    user_error("cannot differentiate contraction ", c.output, ": ", why);
  }

  void propagate(const Statement& st, const std::string& dt) {
    const std::string& out = statement_output(st);
    auto ov = options_.overrides.find(out);
    if (ov != options_.overrides.end()) {
      Context ctx(b_, dt, prefix_.size());
      std::vector<std::string> parts = ov->second.derivative(ctx);
      const auto& deps = ov->second.dependencies;
      if (parts.size() != deps.size())
        user_error("the override of ", out, " returned ", parts.size(), " adjoints for ", deps.size(), " dependencies");
      for (size_t i = 0; i < deps.size(); ++i) contribute(deps[i], made(parts[i]));
      return;
    }
    if (options_.hook) {
      Context ctx(b_, dt, prefix_.size());
      if (auto parts = options_.hook(st, ctx)) {
        for (const auto& [tensor, name] : *parts) contribute(tensor, made(name));
        return;
      }
    }
    if (const auto* e = std::get_if<Elementwise>(&st)) {
      elementwise_rule(*e, dt);
    } else {
      contraction_rule(std::get<Contraction>(st), dt);
    }
  }

  void elementwise_rule(const Elementwise& e, const std::string& dt) {
    auto partials = partials_.find(e.output);
    if (partials != partials_.end()) {  // mixed mode: DX = unbroadcast(DT * P)
      for (const auto& [x, p] : partials->second) {
        if (!requires_.count(x)) continue;
        std::string g = made(b_.elementwise("D" + x, bin(BinaryOp::mul, T(dt), p)));
        contribute(x, unbroadcast_to(g, x));
      }
      return;
    }
    std::map<std::string, Expr> parts;
    backprop(e.expr, T(dt), parts);
    for (const auto& [x, expr] : parts) {
      if (!requires_.count(x)) continue;
      std::string g = b_.elementwise("D" + x, expr);
      if (g != dt) made(g);
      contribute(x, unbroadcast_to(g, x));
    }
  }

  void contraction_rule(const Contraction& c, const std::string& dt) {
    std::vector<std::string> vars = c.index_variables();
    std::vector<std::string> pv = Builder::prefix_indices(prefix_.size(), {vars.begin(), vars.end()});
    const TensorAccess dt_access{dt, with_prefix(pv, c.output_indices)};
    const TensorAccess out_access{c.output, c.output_indices};
    switch (c.aggregation) {
      case AggregationOp::sum:
      case AggregationOp::assign: {
        for (size_t t = 0; t < c.inputs.size(); ++t) {
          const TensorAccess& target = c.inputs[t];
          if (!requires_.count(target.tensor)) continue;
          switch (c.combination) {
            case CombinationOp::none: contribute(target.tensor, flip(c, pv, target, CombinationOp::none, {dt_access})); break;
            case CombinationOp::mul:
              // The other operand first: with no shapes known, reduce ranks basis candidates by appearance,
              // and the other operand (typically a kernel) holds the tight ranges.
              contribute(target.tensor, flip(c, pv, target, CombinationOp::mul, {c.inputs[1 - t], dt_access}));
              break;
            case CombinationOp::add: {
              std::vector<Constraint> extra;
              std::vector<TensorAccess> body{dt_access};
              CombinationOp comb = CombinationOp::none;
              b_.keep_bounds(c.inputs[1 - t], extra, body, comb);
              contribute(target.tensor, flip(c, pv, target, comb, body, extra));
              break;
            }
            case CombinationOp::cond:
              if (t == 2)
                contribute(target.tensor, flip(c, pv, target, CombinationOp::cond, {c.inputs[0], c.inputs[1], dt_access}));
              break;  // the compared operands: piecewise constant
            case CombinationOp::eq: break;  // piecewise constant
          }
        }
        if (c.init && requires_.count(*c.init)) {
          if (c.aggregation == AggregationOp::sum) {
            contribute(*c.init, unbroadcast_to(dt, *c.init));
          } else {  // assign: the default survives where nothing was written
            TensorAccess first = c.inputs[0];
            std::string ones = b_.ones(first.tensor);
            Contraction count;
            count.output = b_.fresh("W" + c.output);
            count.output_indices = c.output_indices;
            count.output_shape = c.output_shape;
            count.inputs = {{ones, first.indices}};
            for (size_t i = 1; i < c.inputs.size(); ++i) count.inputs.push_back(c.inputs[i]);
            count.combination = c.inputs.size() == 1 ? CombinationOp::none : c.combination;
            if (count.combination != CombinationOp::none && count.combination != CombinationOp::mul)
              refuse(c, "assign with a default and a " + to_string(c.combination) + " combination");
            if (count.combination == CombinationOp::mul) count.inputs[1] = {b_.ones(c.inputs[1].tensor), c.inputs[1].indices};
            count.constraints = c.constraints;
            std::string w = b_.add(std::move(count));
            std::string g = made(b_.elementwise("D" + *c.init, sel(bin(BinaryOp::eq, T(w), ilit(0)), T(dt), lit(0))));
            contribute(*c.init, unbroadcast_to(g, *c.init));
          }
        }
        return;
      }
      case AggregationOp::max:
      case AggregationOp::min: {
        if (c.combination != CombinationOp::none)
          refuse(c, to_string(c.aggregation) + " of a " + to_string(c.combination) +
                        " combination; compute the combination in a statement of its own first");
        const TensorAccess& a = c.inputs[0];
        Contraction count;
        count.output = b_.fresh("N" + c.output);
        count.output_indices = c.output_indices;
        count.output_shape = c.output_shape;
        count.combination = CombinationOp::eq;
        count.inputs = {a, out_access};
        count.constraints = c.constraints;
        std::string n = b_.add(std::move(count));
        if (c.init) n = b_.elementwise("N" + c.output, bin(BinaryOp::add, T(n), bin(BinaryOp::eq, T(*c.init), T(c.output))));
        std::string g = b_.elementwise("G" + c.output, bin(BinaryOp::div, T(dt), T(n)));
        if (requires_.count(a.tensor))
          contribute(a.tensor, flip(c, pv, a, CombinationOp::cond, {a, out_access, {g, with_prefix(pv, c.output_indices)}}));
        if (c.init && requires_.count(*c.init)) {
          std::string d = made(b_.elementwise("D" + *c.init, sel(bin(BinaryOp::eq, T(*c.init), T(c.output)), T(g), lit(0))));
          contribute(*c.init, unbroadcast_to(d, *c.init));
        }
        return;
      }
      case AggregationOp::product: {
        if (c.combination != CombinationOp::none)
          refuse(c, "product of a " + to_string(c.combination) + " combination; compute it in a statement of its own first");
        if (c.init) refuse(c, "product with a default tensor; multiply by it in an elementwise statement instead");
        const TensorAccess& a = c.inputs[0];
        if (!requires_.count(a.tensor)) return;
        const Expr A = T(a.tensor), is_zero = bin(BinaryOp::eq, A, ilit(0));
        std::string zero = b_.elementwise("ZERO", ilit(0));
        Contraction zc;  // zeros per output element
        zc.output = b_.fresh("Z" + c.output);
        zc.output_indices = c.output_indices;
        zc.output_shape = c.output_shape;
        zc.combination = CombinationOp::eq;
        zc.inputs = {a, {zero, {}}};
        zc.constraints = c.constraints;
        std::string z = b_.add(std::move(zc));
        std::string nz = b_.elementwise("NZ" + a.tensor, sel(is_zero, ilit(1), A));
        Contraction pc;  // product of the non-zero elements
        pc.output = b_.fresh("P" + c.output);
        pc.output_indices = c.output_indices;
        pc.output_shape = c.output_shape;
        pc.aggregation = AggregationOp::product;
        pc.inputs = {{nz, a.indices}};
        pc.constraints = c.constraints;
        std::string p = b_.add(std::move(pc));
        Expr scaled = bin(BinaryOp::mul, T(dt), T(p));
        std::string w0 = b_.elementwise("W0" + c.output, sel(bin(BinaryOp::eq, T(z), ilit(0)), scaled, lit(0)));
        std::string w1 = b_.elementwise("W1" + c.output, sel(bin(BinaryOp::eq, T(z), ilit(1)), scaled, lit(0)));
        std::string rinv = b_.elementwise("R" + a.tensor, sel(is_zero, lit(0), bin(BinaryOp::div, lit(1), A)));
        std::string isz = b_.elementwise("S" + a.tensor, sel(is_zero, lit(1), lit(0)));
        contribute(a.tensor, flip(c, pv, a, CombinationOp::mul, {{rinv, a.indices}, {w0, with_prefix(pv, c.output_indices)}}));
        contribute(a.tensor, flip(c, pv, a, CombinationOp::mul, {{isz, a.indices}, {w1, with_prefix(pv, c.output_indices)}}));
        return;
      }
    }
  }

  // Mixed mode: after each elementwise statement that carries adjoint, its partials as dual numbers.
  void insert_partials() {
    std::vector<Statement> forward = b_.program.statements;
    b_.program.statements.clear();
    for (const auto& st : forward) {
      b_.program.statements.push_back(st);
      const auto* e = std::get_if<Elementwise>(&st);
      if (!e || !requires_.count(e->output) || options_.overrides.count(e->output)) continue;
      std::vector<std::string> leaves;
      e->expr.collect_tensors(leaves);
      for (const auto& x : leaves) {
        if (!requires_.count(x)) continue;
        std::optional<Expr> p = tangent(e->expr, [&x](const std::string& name) -> std::optional<Expr> {
          if (name == x) return Expr::literal(1, false);
          return std::nullopt;
        });
        if (!p) continue;
        // A partial that reads no tensor is a weak constant: stored, it would become an f32 tensor and
        // round an f64 gradient; multiplied in where it is used, it takes the adjoint's type.
        std::vector<std::string> reads;
        p->collect_tensors(reads);
        if (reads.empty()) {
          partials_[e->output].emplace_back(x, *p);
          continue;
        }
        std::string name = b_.fresh("P" + e->output + "_" + x);
        b_.add(Elementwise{name, *p});
        partial_of_.insert(name);
        partials_[e->output].emplace_back(x, T(name));
      }
    }
  }

  const Program& forward_;
  const Options& options_;
  Builder b_;
  std::vector<DimExpr> prefix_;
  std::set<std::string> requires_;
  std::set<std::string> zero_;  // tensors whose adjoint is proven zero
  std::map<std::string, std::vector<std::string>> contributions_;
  std::set<std::string> contributions_made_;
  std::map<std::string, std::string> adjoints_;
  std::map<std::string, std::vector<std::pair<std::string, Expr>>> partials_;  // statement -> (operand, partial)
  std::set<std::string> partial_of_;
};

std::vector<std::string> wrt_of(const Program& p, const Options& options) {
  if (!options.wrt.empty()) return options.wrt;
  std::vector<std::string> all;
  for (const auto& in : p.inputs) all.push_back(in.name);
  return all;
}

const std::vector<DimExpr>& output_shape(const Builder& b, const std::string& output) {
  auto it = b.shapes.find(output);
  if (it == b.shapes.end()) user_error("no tensor named ", output, " to differentiate");
  return it->second;
}

}  // namespace

Result vjp(const Program& program, const Options& options) {
  validate(program);
  ReverseMode m(program, options);
  Builder& b = m.builder();
  std::map<std::string, std::string> seeds;
  for (const auto& o : program.outputs) {
    std::string head = b.fresh("D" + o);
    b.program.inputs.push_back(Param{head, output_shape(b, o)});
    b.shapes[head] = output_shape(b, o);
    seeds[o] = head;
  }
  return m.run({}, seeds, wrt_of(program, options));
}

Result gradient(const Program& program, const Options& options) {
  validate(program);
  if (program.outputs.size() != 1)
    user_error("gradient needs a program with one scalar output (a loss); it has ", program.outputs.size(),
               " outputs: use vjp or differentiate");
  ReverseMode m(program, options);
  Builder& b = m.builder();
  const std::string& loss = program.outputs[0];
  if (!output_shape(b, loss).empty())
    user_error("gradient needs a scalar loss, but output ", loss, " has rank ", output_shape(b, loss).size(),
               ": use vjp or differentiate with a head");
  std::string one = b.elementwise("ONE", Expr::literal(1, false));
  return m.run({}, {{loss, one}}, wrt_of(program, options));
}

Result differentiate(const Program& program, const std::string& output, const Options& options,
                     std::optional<size_t> head_prefix_rank) {
  validate(program);
  ReverseMode m(program, options);
  Builder& b = m.builder();
  const std::vector<DimExpr> oshape = output_shape(b, output);
  std::vector<DimExpr> prefix;
  std::string seed;
  if (head_prefix_rank) {
    std::vector<DimExpr> hdims;
    for (size_t k = 0; k < *head_prefix_rank; ++k) {
      std::string d = b.fresh("HP" + std::to_string(k));
      prefix.push_back(DimExpr::symbol(d));
    }
    hdims = prefix;
    hdims.insert(hdims.end(), oshape.begin(), oshape.end());
    seed = b.fresh("H");
    b.program.inputs.push_back(Param{seed, hdims});
    b.shapes[seed] = hdims;
  } else {
    // The identity on O's elements: the full Jacobian.
    prefix = oshape;
    std::string one = b.elementwise("ONE", Expr::literal(1, false));
    Contraction id;
    id.output = b.fresh("ID" + output);
    id.aggregation = AggregationOp::assign;
    for (size_t k = 0; k < oshape.size(); ++k) id.output_indices.push_back(Polynomial::index("i" + std::to_string(k)));
    for (size_t k = 0; k < oshape.size(); ++k) id.output_indices.push_back(Polynomial::index("i" + std::to_string(k)));
    id.output_shape = prefix;
    id.output_shape.insert(id.output_shape.end(), oshape.begin(), oshape.end());
    id.inputs = {{one, {}}};
    seed = b.add(std::move(id));
  }
  return m.run(prefix, {{output, seed}}, wrt_of(program, options));
}

}  // namespace polytile::ad
