// C++ Tile eDSL, after the PlaidML tutorial: write a function of Tensors, then turn it into a Program.
//
//   using namespace polytile::edsl;
//   Tensor matmul(const Tensor& A, const Tensor& B) {
//     TensorDim I, J, K;
//     TensorIndex i, j, k;
//     A.bind_dims(I, K);
//     B.bind_dims(K, J);
//     auto C = TensorOutput(I, J);
//     C(i, j) += A(i, k) * B(k, j);
//     return C;
//   }
//   Tensor A = Placeholder("A", 2), B = Placeholder("B", 2);
//   polytile::Program p = make_program("matmul", {A, B}, {matmul(A, B).named("C")});
//
// Contractions: O(idx...) followed by += (sum), *= (product), >= (max), <= (min) or = (assign), and a
// right-hand side A(...), A(...) * B(...), A(...) + B(...), A(...) == B(...) or cond(A(...), B(...),
// C(...)). Constraints: O.add_constraint(j < 2). Elementwise: the usual operators and the intrinsics
// below; integers, doubles and TensorDims mix with Tensors as scalars.
//
// Naming: tensors, dims and indices may be given names (Placeholder names are required); unnamed ones get
// deterministic names when the Program is made (dims D0.., tensors T0.., indices x0.. per contraction),
// so the same construction always prints the same text. An unnamed elementwise tensor used once by
// another elementwise op is inlined into it. Errors (rank mismatch at bind_dims, redefinition, an input
// missing from make_program, ...) are UserErrors naming the object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "polytile/ir.h"

namespace polytile::edsl {

// ---------------------------------------------------------------------------------------- dims
class TensorDim {
 public:
  TensorDim();                              // unnamed, bound later by bind_dims
  explicit TensorDim(const std::string& name);
  TensorDim(int64_t value);                 // NOLINT: a constant dim
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  TensorDim(T value) : TensorDim(static_cast<int64_t>(value)) {}  // NOLINT

  bool is_bound() const;
  DimExpr expr() const;  // UserError if unbound

  struct State;
  std::shared_ptr<State> state;
};

TensorDim operator+(const TensorDim& a, const TensorDim& b);
TensorDim operator-(const TensorDim& a, const TensorDim& b);
TensorDim operator*(const TensorDim& a, const TensorDim& b);
TensorDim operator/(const TensorDim& a, const TensorDim& b);  // floor division
TensorDim operator-(const TensorDim& a);
TensorDim max(const TensorDim& a, const TensorDim& b);
TensorDim min(const TensorDim& a, const TensorDim& b);
// Integers mix with dims directly (TensorDim(n) on the integer side).
#define POLYTILE_EDSL_DIM_INT(OP)                                                                      \
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>                              \
  TensorDim operator OP(const TensorDim& a, T b) { return a OP TensorDim(static_cast<int64_t>(b)); }   \
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>                              \
  TensorDim operator OP(T a, const TensorDim& b) { return TensorDim(static_cast<int64_t>(a)) OP b; }
POLYTILE_EDSL_DIM_INT(+)
POLYTILE_EDSL_DIM_INT(-)
POLYTILE_EDSL_DIM_INT(*)
POLYTILE_EDSL_DIM_INT(/)
#undef POLYTILE_EDSL_DIM_INT

// ---------------------------------------------------------------------------------------- indices
class IndexPoly;

class TensorIndex {
 public:
  TensorIndex();
  explicit TensorIndex(const std::string& name);
  IndexPoly poly() const;
  struct State;
  std::shared_ptr<State> state;
};

// An affine index expression: rational coefficients over TensorIndex, plus dims and constants.
class IndexPoly {
 public:
  IndexPoly(const TensorIndex& i);  // NOLINT
  IndexPoly(const TensorDim& d);    // NOLINT
  IndexPoly(int64_t c);             // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  IndexPoly(T c) : IndexPoly(static_cast<int64_t>(c)) {}  // NOLINT
  explicit IndexPoly(Polynomial p) : poly(std::move(p)) {}
  Polynomial poly;
};

IndexPoly operator+(const IndexPoly& a, const IndexPoly& b);
IndexPoly operator-(const IndexPoly& a, const IndexPoly& b);
IndexPoly operator-(const IndexPoly& a);
IndexPoly operator*(int64_t c, const IndexPoly& a);
IndexPoly operator*(const IndexPoly& a, int64_t c);
IndexPoly operator/(const IndexPoly& a, int64_t c);  // exact (rational) division
// The same operators for TensorIndex operands resolve through IndexPoly's implicit constructors:
IndexPoly operator+(const TensorIndex& a, const TensorIndex& b);
IndexPoly operator-(const TensorIndex& a, const TensorIndex& b);
IndexPoly operator*(int64_t c, const TensorIndex& a);
IndexPoly operator*(const TensorIndex& a, int64_t c);
IndexPoly operator/(const TensorIndex& a, int64_t c);

// 0 <= poly < bound
struct IndexConstraint {
  IndexPoly poly;
  TensorDim bound;
};
IndexConstraint operator<(const IndexPoly& poly, const TensorDim& bound);
IndexConstraint operator<(const TensorIndex& index, const TensorDim& bound);

// ---------------------------------------------------------------------------------------- tensors
class Tensor;
struct ContractionRhs;

// O(i, j) or A(2*i + k): a tensor with index expressions.
class IndexedTensor {
 public:
  IndexedTensor(std::shared_ptr<struct Node> node, std::vector<IndexPoly> indices);
  IndexedTensor(const IndexedTensor&) = default;
  // Defining a contraction on a TensorOutput.
  void operator+=(const ContractionRhs& rhs) const;
  void operator*=(const ContractionRhs& rhs) const;
  void operator>=(const ContractionRhs& rhs) const;
  void operator<=(const ContractionRhs& rhs) const;
  void operator=(const ContractionRhs& rhs) const;   // NOLINT: assign aggregation
  void operator=(const IndexedTensor& rhs) const;    // NOLINT: O(i) = I(i) is an assign contraction

  std::shared_ptr<struct Node> node;
  std::vector<IndexPoly> indices;
};

struct ContractionRhs {
  ContractionRhs(const IndexedTensor& a);  // NOLINT: single access, combination none
  ContractionRhs(CombinationOp op, std::vector<IndexedTensor> accesses);
  CombinationOp combination;
  std::vector<IndexedTensor> accesses;
};
ContractionRhs operator*(const IndexedTensor& a, const IndexedTensor& b);
ContractionRhs operator+(const IndexedTensor& a, const IndexedTensor& b);
ContractionRhs operator==(const IndexedTensor& a, const IndexedTensor& b);
// a == b ? c : (no contribution)
ContractionRhs cond(const IndexedTensor& a, const IndexedTensor& b, const IndexedTensor& c);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<struct Node> n) : node(std::move(n)) {}

  size_t rank() const;
  // Binds dims to this tensor's sizes; a rank mismatch or a dim bound to a different size expression is a
  // UserError.
  template <typename... Dims>
  void bind_dims(Dims&&... dims) const {
    std::vector<TensorDim> v{TensorDim(dims)...};
    bind_dims_vector(v);
  }
  void bind_dims_vector(std::vector<TensorDim>& dims) const;

  template <typename... Idx>
  IndexedTensor operator()(Idx&&... idx) const {
    return IndexedTensor(node, std::vector<IndexPoly>{IndexPoly(idx)...});
  }
  IndexedTensor index(std::vector<IndexPoly> idx) const { return IndexedTensor(node, std::move(idx)); }

  void add_constraint(const IndexConstraint& c) const;
  void add_constraints(const std::vector<IndexConstraint>& cs) const;
  // The contraction's accumulator starts from `init` (broadcast to the output shape).
  void set_default(const Tensor& init) const;
  // Gives the tensor a name (shared by every copy of this handle) and returns it.
  Tensor& named(const std::string& name);
  const Tensor& named(const std::string& name) const;

  std::shared_ptr<struct Node> node;
};

// An input of the program, with a required name and a rank; dtypes and sizes come at run time.
Tensor Placeholder(const std::string& name, size_t rank);
// A contraction output of the given shape; define it with O(...) += ... .
Tensor make_tensor_output(const std::vector<TensorDim>& dims);
template <typename... Dims>
Tensor TensorOutput(Dims&&... dims) {
  return make_tensor_output(std::vector<TensorDim>{TensorDim(dims)...});
}

// Elementwise operators and intrinsics.
Tensor scalar(double value);     // float literal
Tensor scalar_int(int64_t value);  // integer literal
Tensor as_tensor(const TensorDim& d);  // a dim used as an integer value

Tensor operator-(const Tensor& a);
Tensor operator!(const Tensor& a);
#define POLYTILE_EDSL_BINARY(OP)                                                         \
  Tensor operator OP(const Tensor& a, const Tensor& b);                                  \
  Tensor operator OP(const Tensor& a, const TensorDim& b);                               \
  Tensor operator OP(const TensorDim& a, const Tensor& b);                               \
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>              \
  Tensor operator OP(const Tensor& a, T b) {                                             \
    return a OP(std::is_integral_v<T> ? scalar_int(static_cast<int64_t>(b)) : scalar(static_cast<double>(b))); \
  }                                                                                      \
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>              \
  Tensor operator OP(T a, const Tensor& b) {                                             \
    return (std::is_integral_v<T> ? scalar_int(static_cast<int64_t>(a)) : scalar(static_cast<double>(a))) OP b; \
  }
POLYTILE_EDSL_BINARY(+)
POLYTILE_EDSL_BINARY(-)
POLYTILE_EDSL_BINARY(*)
POLYTILE_EDSL_BINARY(/)
POLYTILE_EDSL_BINARY(%)
POLYTILE_EDSL_BINARY(==)
POLYTILE_EDSL_BINARY(!=)
POLYTILE_EDSL_BINARY(<)
POLYTILE_EDSL_BINARY(>)
POLYTILE_EDSL_BINARY(<=)
POLYTILE_EDSL_BINARY(>=)
POLYTILE_EDSL_BINARY(&&)
POLYTILE_EDSL_BINARY(||)
#undef POLYTILE_EDSL_BINARY

Tensor call(Intrinsic fn, const std::vector<Tensor>& args);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, const Tensor& y);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);
Tensor max(const Tensor& x, const Tensor& y);
Tensor min(const Tensor& x, const Tensor& y);
Tensor ident(const Tensor& x);
Tensor select(const Tensor& c, const Tensor& t, const Tensor& f);
Tensor cast(const Tensor& x, DType dtype);
#define POLYTILE_EDSL_SCALAR_FN(FN)                                                             \
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>                     \
  Tensor FN(const Tensor& a, T b) {                                                             \
    return FN(a, std::is_integral_v<T> ? scalar_int(static_cast<int64_t>(b)) : scalar(static_cast<double>(b))); \
  }                                                                                             \
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>                     \
  Tensor FN(T a, const Tensor& b) {                                                             \
    return FN(std::is_integral_v<T> ? scalar_int(static_cast<int64_t>(a)) : scalar(static_cast<double>(a)), b); \
  }
POLYTILE_EDSL_SCALAR_FN(max)
POLYTILE_EDSL_SCALAR_FN(min)
POLYTILE_EDSL_SCALAR_FN(pow)
#undef POLYTILE_EDSL_SCALAR_FN

// Turns the graph reachable from `outputs` into a validated Program.
Program make_program(const std::string& name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);

}  // namespace polytile::edsl
