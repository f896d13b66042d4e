// Automatic differentiation of Tile programs. Every result is an ordinary Program: printable as Tile text,
// runnable by the interpreter, and (by default) passed through reduce + defract.
//
// Reverse mode (vjp, gradient, differentiate) walks the statements backwards. Contractions use the
// "flip" of seed 000: the adjoint of an input writes that input's index expressions and reads the
// output's adjoint, keeping every constraint and the bounds of every access. Aggregations:
//   sum, assign   the flip (combinations none, mul, add; cond differentiates its third operand; eq and the
//                 compared operands of cond are piecewise constant: zero derivative, no contribution);
//   max, min      the adjoint goes to the elements equal to the result; ties share it equally (as JAX
//                 does): DA = +(A == O ? DO / COUNT), COUNT = +(A == O), no mask tensor is materialized;
//   product       exact with zeros: with no zero in a reduction the derivative is prod/A[a]; with exactly
//                 one zero only that element gets the product of the others; with more, zero;
//   default (init) tensors are differentiated for sum, assign, max and min.
// Elementwise statements are differentiated node by node; broadcast operands get their adjoint summed
// over the broadcast dimensions. Comparisons, floor, ceil, round, sign and casts to integers have
// derivative zero. Anything else is refused with a UserError naming the statement, never silently zero.
// A tensor whose adjoint is proven zero (the outputs do not change when it moves: softmax's row maxima;
// Options::prove_zero_adjoints) gets no adjoint statements at all.
//
// Forward mode (jvp) propagates tangents through the same rules. Mixed mode (Options::mixed_mode, after
// seed 003): for each elementwise statement T = f(X1..XN) the N partials df/dXi are computed as dual
// numbers right after the primal, so the reverse step is only DXi = unbroadcast(DT * Pi). It holds N
// tensors of T's shape from the forward to the reverse pass instead of recomputing f's subexpressions in
// the reverse pass: more memory, less recomputation. Results are identical to plain reverse mode.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "polytile/ir.h"

namespace polytile::ad {

// What a custom derivative sees: the adjoint of the tensor being differentiated, and a way to add Tile
// statements to the gradient program.
class DerivativeContext {
 public:
  virtual ~DerivativeContext() = default;
  // The adjoint of the tensor: a tensor of shape prefix + shape(tensor).
  virtual const std::string& head() const = 0;
  // Leading dims of every adjoint (empty for gradients and vjps; the output's shape for Jacobians).
  virtual size_t prefix_rank() const = 0;
  // Appends Tile statements (they may use every tensor and dim defined so far).
  virtual void emit(const std::string& tile_statements) = 0;
  // A tensor name not used yet, starting with `base`.
  virtual std::string fresh(const std::string& base) = 0;
};

// A custom derivative: receives the adjoint of the overridden tensor and returns, for each dependency in
// order, the name of a tensor holding its adjoint contribution (shape prefix + shape(dependency)), or ""
// for none.
using DerivativeFn = std::function<std::vector<std::string>(DerivativeContext&)>;

struct Override {
  std::vector<std::string> dependencies;  // need not be immediate operands
  DerivativeFn derivative;
};

// A per-statement hook tried before the built-in rules: returns contributions per operand tensor name, or
// nullopt to fall back to the built-in rule.
using DerivativeHook =
    std::function<std::optional<std::map<std::string, std::string>>(const Statement&, DerivativeContext&)>;

struct Options {
  std::vector<std::string> wrt;                  // inputs to differentiate with respect to; empty: all
  std::map<std::string, Override> overrides;     // by tensor name
  DerivativeHook hook;
  std::set<std::string> stop_gradient;           // tensors whose adjoint is not propagated further
  bool all_adjoints = false;                     // also output the adjoint of every intermediate tensor
                                                 // (zeros for those proven zero)
  bool mixed_mode = false;                       // dual-number partials for elementwise statements
  // Tensors that the differentiated outputs provably do not depend on (the outputs are unchanged by any
  // shift of them, followed exactly through the forward statements: softmax's and log-softmax's row
  // maxima) get no adjoint statements: their adjoint is zero in exact arithmetic, and the rules would spend
  // a reduction, a comparison per element and a scatter computing it as rounding noise. Off: every
  // adjoint as the rules write it. Not with a hook (its derivatives are unknown to the proof).
  bool prove_zero_adjoints = true;
  bool reduce_and_defract = true;                // clean up the gradient contractions
  bool verify = false;                           // prove that clean-up with isl for all sizes (passes.h)
};

struct Result {
  Program program;
  std::vector<std::string> gradients;          // program outputs holding d/d(wrt[i]), in order
  std::map<std::string, std::string> adjoints;  // tensor -> program output holding its adjoint
  std::vector<std::string> zero_adjoints;       // tensors whose adjoint (jvp: tangent) was proven zero
};

// function (inputs..., D<outputs>...) -> (D<wrt>...): vector-Jacobian products of all outputs.
Result vjp(const Program& program, const Options& options = {});

// The gradient of a scalar (rank-0) loss, the program's only output: function (inputs...) -> (D<wrt>...).
Result gradient(const Program& program, const Options& options = {});

// TVM's differentiate for one output O. With head_prefix_rank = nullopt: the full Jacobian, each result of
// shape shape(O) + shape(input). With head_prefix_rank = P: the program gains an input H of shape
// (P new dims) + shape(O), and each result, of shape (those P dims) + shape(input), is H times the
// Jacobian contracted over O's dims.
Result differentiate(const Program& program, const std::string& output, const Options& options = {},
                     std::optional<size_t> head_prefix_rank = std::nullopt);

// Forward mode: function (inputs..., T<tangent inputs>...) -> (T<outputs>...): Jacobian-vector products.
// `tangents` lists the inputs that get a tangent (empty: all); `verify` proves the clean-up with isl;
// `prove_zero_tangents`: tensors the outputs provably do not depend on (as Options::prove_zero_adjoints)
// get no tangent statements (their tangents' contributions cancel exactly), listed in Result::zero_adjoints.
Result jvp(const Program& program, const std::vector<std::string>& tangents = {}, bool verify = false,
           bool prove_zero_tangents = true);

}  // namespace polytile::ad
