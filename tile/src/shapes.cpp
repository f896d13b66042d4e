#include "polytile/shapes.h"

#include "polytile/error.h"

namespace polytile {

int64_t TensorType::bytes() const {
  int64_t n = static_cast<int64_t>(dtype_bytes(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorType::str() const {
  std::string s = to_string(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

std::vector<int64_t> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                      const std::string& what) {
  size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1)
      user_error("cannot broadcast shapes ", shape_str(a), " and ", shape_str(b), " in ", what);
    out[i] = x == 1 ? y : x;
  }
  return out;
}

ExprType combine_types(ExprType a, ExprType b) {
  if (a.weak == b.weak) return {promote(a.dtype, b.dtype), a.weak};
  ExprType w = a.weak ? a : b, s = a.weak ? b : a;
  if (is_float(w.dtype) && !is_float(s.dtype)) return {DType::f32, false};
  return s;
}

static ExprType arithmetic(ExprType t) {
  if (t.dtype == DType::boolean) t.dtype = DType::i32;
  return t;
}

ExprType expr_type(const Expr& e, const std::map<std::string, TensorType>& tensors) {
  switch (e.kind()) {
    case Expr::Kind::tensor: {
      auto it = tensors.find(e.name());
      POLYTILE_CHECK(it != tensors.end(), "untyped tensor ", e.name());
      return {it->second.dtype, false};
    }
    case Expr::Kind::literal: return {e.literal_is_integer() ? DType::i32 : DType::f32, true};
    case Expr::Kind::dim: return {DType::i32, true};
    case Expr::Kind::unary:
      if (e.unary_op() == UnaryOp::logical_not) return {DType::boolean, false};
      return arithmetic(expr_type(e.args()[0], tensors));
    case Expr::Kind::binary: {
      ExprType t = combine_types(expr_type(e.args()[0], tensors), expr_type(e.args()[1], tensors));
      switch (e.binary_op()) {
        case BinaryOp::add:
        case BinaryOp::sub:
        case BinaryOp::mul:
        case BinaryOp::div:
        case BinaryOp::mod: return arithmetic(t);
        default: return {DType::boolean, false};
      }
    }
    case Expr::Kind::call: {
      const auto& args = e.args();
      switch (e.intrinsic()) {
        case Intrinsic::cast: return {e.cast_type(), false};
        case Intrinsic::select:
          return combine_types(expr_type(args[1], tensors), expr_type(args[2], tensors));
        case Intrinsic::max:
        case Intrinsic::min: return combine_types(expr_type(args[0], tensors), expr_type(args[1], tensors));
        case Intrinsic::ident: return expr_type(args[0], tensors);
        case Intrinsic::abs:
        case Intrinsic::sign:
        case Intrinsic::relu:
        case Intrinsic::floor:
        case Intrinsic::ceil:
        case Intrinsic::round: return arithmetic(expr_type(args[0], tensors));
        case Intrinsic::pow: {
          ExprType t = combine_types(expr_type(args[0], tensors), expr_type(args[1], tensors));
          if (!is_float(t.dtype)) t.dtype = DType::f32;
          return t;
        }
        default: {  // transcendental: floats only
          ExprType t = expr_type(args[0], tensors);
          if (!is_float(t.dtype)) t.dtype = DType::f32;
          return t;
        }
      }
    }
  }
  POLYTILE_CHECK(false, "bad expr kind");
}

std::vector<int64_t> expr_shape(const Expr& e, const std::map<std::string, TensorType>& tensors, const std::string& what) {
  std::vector<std::string> used;
  e.collect_tensors(used);
  std::vector<int64_t> shape;
  for (const auto& t : used) shape = broadcast_shapes(shape, tensors.at(t).shape, what);
  return shape;
}

void infer_statement_type(const Statement& st, ProgramTypes& pt) {
  auto eval_dim = [&pt](const DimExpr& d, const std::string& tensor, size_t axis) {
    int64_t v = d.evaluate(pt.dims);
    if (v < 0)
      user_error("dim ", axis, " of tensor ", tensor, " evaluates to ", v, " (", d.str(), "); dims must not be negative");
    return v;
  };
  if (const auto* e = std::get_if<Elementwise>(&st)) {
    TensorType t;
    t.shape = expr_shape(e->expr, pt.tensors, "elementwise statement " + e->output);
    ExprType et = expr_type(e->expr, pt.tensors);
    t.dtype = et.dtype;
    pt.tensors[e->output] = t;
    return;
  }
  const auto& c = std::get<Contraction>(st);
  TensorType t;
  for (size_t k = 0; k < c.output_shape.size(); ++k) t.shape.push_back(eval_dim(c.output_shape[k], c.output, k));
  auto in = [&](size_t i) { return pt.tensors.at(c.inputs[i].tensor).dtype; };
  switch (c.combination) {
    case CombinationOp::none: t.dtype = in(0); break;
    case CombinationOp::mul:
    case CombinationOp::add: t.dtype = promote(promote(in(0), in(1)), DType::i32); break;
    case CombinationOp::eq: t.dtype = DType::boolean; break;
    case CombinationOp::cond: t.dtype = in(2); break;
  }
  if (t.dtype == DType::boolean && (c.aggregation == AggregationOp::sum || c.aggregation == AggregationOp::product))
    t.dtype = DType::i32;
  if (c.init) {
    auto shape = broadcast_shapes(pt.tensors.at(*c.init).shape, t.shape, "the default of contraction " + c.output);
    if (shape != t.shape)
      user_error("default tensor ", *c.init, " of shape ", shape_str(pt.tensors.at(*c.init).shape),
                 " does not broadcast to the shape ", shape_str(t.shape), " of ", c.output);
  }
  pt.tensors[c.output] = t;
}

ProgramTypes infer_types(const Program& program, const std::map<std::string, TensorType>& inputs) {
  ProgramTypes pt;
  for (const auto& [name, type] : inputs) {
    bool known = false;
    for (const auto& p : program.inputs) known |= p.name == name;
    if (!known) user_error("unknown input ", name, ": the program's inputs are declared in its function header");
  }
  std::map<std::string, std::string> bound_by;  // dim -> input that bound it
  for (const auto& p : program.inputs) {
    auto it = inputs.find(p.name);
    if (it == inputs.end()) user_error("missing input ", p.name);
    const TensorType& t = it->second;
    if (t.shape.size() != p.dims.size())
      user_error("input ", p.name, " is declared with rank ", p.dims.size(), " but got shape ", shape_str(t.shape));
    for (size_t k = 0; k < p.dims.size(); ++k) {
      const DimExpr& d = p.dims[k];
      if (t.shape[k] < 0) user_error("input ", p.name, " has a negative dim ", t.shape[k], " at axis ", k);
      if (d.kind() == DimExpr::Kind::symbol && !pt.dims.count(d.name())) {
        pt.dims[d.name()] = t.shape[k];
        bound_by[d.name()] = p.name;
        continue;
      }
      int64_t want = d.evaluate(pt.dims);
      if (want != t.shape[k]) {
        std::string from = d.kind() == DimExpr::Kind::symbol ? " (bound by input " + bound_by[d.name()] + ")" : "";
        user_error("dims disagree: axis ", k, " of input ", p.name, " is ", t.shape[k], " but ", d.str(), " = ", want,
                   from);
      }
    }
    pt.tensors[p.name] = t;
  }

  for (const auto& st : program.statements) infer_statement_type(st, pt);
  return pt;
}

}  // namespace polytile
