// The Tile IR: a Program is a function from named input tensors (with symbolic dims) to named output
// tensors, computed by a sequence of statements in single-assignment form. Two statement kinds exist:
//
//  * Contraction  O[out_indices : out_shape] = AGG(COMBINATION of input accesses), constraints [, default D]
//      Semantics (the "valid indices" rule of the Tile tutorial): the contraction ranges over every
//      assignment of *integers* to its index variables such that
//        1. every index expression of every access -- the output access included -- evaluates to an
//           integer (coefficients and constants are rational, so this can fail) in [0, dim),
//        2. every constraint `poly < bound` holds as 0 <= poly < bound (poly may be fractional there).
//      For each valid point the combined input value is aggregated into O[out_indices]. Aggregations:
//        sum (+), product (*), max (>), min (<), assign (=: at most one valid point may write an element;
//        a second write is a user error). Output elements written by no valid point are 0, or the
//        default (init) tensor's value when one is given. With an init tensor D the accumulator of every
//        element starts at D's value (broadcast to O's shape), so e.g. sum computes D + sum(...), and
//        assign overwrites D where written.
//      Combinations: none (one access), mul (a*b), add (a+b), eq (a==b, bool), cond (a==b ? c : no
//      contribution: the point is skipped when a != b).
//      The set of valid points must be finite; a variable left unbounded by the accesses and constraints
//      is a user error.
//  * Elementwise  O = expr
//      expr is a tree over tensors, scalar literals and dims (used as integer values), with numpy
//      broadcasting: shapes are right-aligned and each dim pair must be equal or contain a 1.
//
// Dtypes and promotion: bool < i32 < i64 < f16 < f32 < f64 (as PyTorch promotes tensors). Binary arithmetic
// takes the larger operand type (bool operands of arithmetic become i32). Literals and dims are *weak*: they adopt the type of the tensor
// they meet (an integer literal never widens a tensor; a float literal makes an integer tensor f32).
// A tensor computed from literals alone is f32 (float literal) or i32 (integer literal / dims).
// Comparisons and logical ops give bool. Float intrinsics (exp, sin, ...) on integers compute in f32.
// Integer division and modulo floor (Python semantics); integer division by zero gives 0; i32 and i64
// arithmetic wraps. round() rounds half away from zero.
// f16 (IEEE binary16) is computed in f32 and rounded: every elementwise operation whose result is f16 gives
// the f32 result rounded to the nearest half (so +, -, *, / and sqrt are exactly IEEE half arithmetic),
// while a contraction whose result is f16 combines and accumulates in f32 and rounds once, when the
// element is final (as half-precision GEMMs and convolutions accumulate).
//
// Dims: a DimExpr is an integer expression over dim names bound by the input declarations
// (`function (I[N, M])` binds N and M; a repeated name requires equal sizes). `/` in a DimExpr is floor
// division. Every tensor dim must evaluate to a non-negative integer at run time; a dim of 0 (an empty
// batch) makes an empty tensor, and a contraction over an empty domain writes only zeros or its default.
//
// Nodes are immutable values; everything prints deterministically (print() and the str() methods below).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace polytile {

enum class DType { f16, f32, f64, i32, i64, boolean };
inline constexpr DType kDTypes[] = {DType::f16, DType::f32, DType::f64, DType::i32, DType::i64, DType::boolean};
std::string to_string(DType t);
// Parses "f16", "f32", "f64", "i32", "i64", "bool"; nullopt otherwise.
std::optional<DType> parse_dtype(const std::string& s);
// "f16, f32, f64, i32, i64, bool": the names parse_dtype accepts, for messages.
std::string dtype_list();
// The promotion lattice bool < i32 < i64 < f16 < f32 < f64.
DType promote(DType a, DType b);
bool is_float(DType t);    // f16, f32, f64
bool is_integer(DType t);  // i32, i64
// Bytes of one element: f64 and i64 8, f32 and i32 4, f16 2, bool 1.
size_t dtype_bytes(DType t);

// Exact rational number num/den with den > 0 and gcd(num, den) == 1. Arithmetic that overflows int64
// throws UserError.
class Rational {
 public:
  Rational(int64_t n = 0) : num_(n), den_(1) {}  // NOLINT: implicit from integers on purpose
  Rational(int64_t n, int64_t d);
  int64_t num() const { return num_; }
  int64_t den() const { return den_; }
  bool is_integer() const { return den_ == 1; }
  bool is_zero() const { return num_ == 0; }
  Rational operator+(const Rational& o) const;
  Rational operator-(const Rational& o) const;
  Rational operator*(const Rational& o) const;
  Rational operator/(const Rational& o) const;
  Rational operator-() const;
  bool operator==(const Rational& o) const { return num_ == o.num_ && den_ == o.den_; }
  bool operator<(const Rational& o) const;
  std::string str() const;  // "3", "-2/3"

 private:
  int64_t num_, den_;
};

// ---------------------------------------------------------------------------------------------------
// DimExpr: integer expression over dim names. Immutable, shared; constructors fold constants.
class DimExpr {
 public:
  enum class Kind { constant, symbol, add, sub, mul, div, max, min, neg };
  DimExpr() = default;                 // null; only as a placeholder
  DimExpr(int64_t value);              // NOLINT: a constant
  static DimExpr symbol(const std::string& name);
  static DimExpr binary(Kind k, const DimExpr& a, const DimExpr& b);

  bool is_null() const { return !node_; }
  Kind kind() const;
  int64_t value() const;               // constant only
  const std::string& name() const;     // symbol only
  const DimExpr& lhs() const;          // binary / neg
  const DimExpr& rhs() const;          // binary
  bool is_constant() const { return node_ && kind() == Kind::constant; }

  // Evaluates with the given dim values; an unknown name or a division by zero is a UserError.
  int64_t evaluate(const std::map<std::string, int64_t>& dims) const;
  // Names in order of first appearance (left to right).
  void collect_symbols(std::vector<std::string>& out) const;
  // Replaces symbols by expressions (used for renaming).
  DimExpr substitute(const std::map<std::string, DimExpr>& subst) const;
  // Shape-context text: `/` is floor division, e.g. "(N + 1)/2", "X - 2*(KX - 1)", "max(A, B)".
  std::string str() const;
  bool operator==(const DimExpr& o) const;
  bool operator!=(const DimExpr& o) const { return !(*this == o); }

 private:
  struct Node;
  std::shared_ptr<const Node> node_;
};

DimExpr operator+(const DimExpr& a, const DimExpr& b);
DimExpr operator-(const DimExpr& a, const DimExpr& b);
DimExpr operator*(const DimExpr& a, const DimExpr& b);
DimExpr operator/(const DimExpr& a, const DimExpr& b);  // floor division
DimExpr operator-(const DimExpr& a);
DimExpr max(const DimExpr& a, const DimExpr& b);
DimExpr min(const DimExpr& a, const DimExpr& b);

// ---------------------------------------------------------------------------------------------------
// Polynomial: affine form  sum_k c_k * v_k + sum_d c_d * D_d + c_0  with rational coefficients, over index
// variables v_k and dim atoms D_d (a dim atom is a DimExpr; linear combinations of dim names are kept as
// separate symbol atoms, so only non-linear dims such as floor divisions form compound atoms).
class Polynomial {
 public:
  Polynomial() = default;
  Polynomial(Rational c) : constant_(c) {}  // NOLINT
  static Polynomial index(const std::string& name);
  static Polynomial dim(const DimExpr& d);  // splits linear structure into symbol atoms

  Polynomial operator+(const Polynomial& o) const;
  Polynomial operator-(const Polynomial& o) const;
  Polynomial operator*(const Rational& r) const;
  Polynomial operator-() const { return *this * Rational(-1); }

  const std::map<std::string, Rational>& index_terms() const { return index_terms_; }
  Rational coefficient(const std::string& index) const;
  Rational constant() const { return constant_; }
  bool has_index_vars() const { return !index_terms_.empty(); }
  bool has_dims() const { return !dim_terms_.empty(); }
  bool is_constant() const { return index_terms_.empty() && dim_terms_.empty(); }
  // The variable, when the polynomial is one index variable and nothing else (coefficient 1).
  std::optional<std::string> variable() const;
  // The dim part as a DimExpr (only when the dim part has integer coefficients).
  std::optional<DimExpr> dims_as_expr() const;
  // Folds dim atoms into the constant with concrete dim values.
  Polynomial bind_dims(const std::map<std::string, int64_t>& dims) const;
  Polynomial rename_indices(const std::map<std::string, std::string>& renames) const;
  Polynomial substitute_dims(const std::map<std::string, DimExpr>& subst) const;
  void collect_dim_symbols(std::vector<std::string>& out) const;
  // Index-context text: "2*j + 3*y", "1/3*v1 - 2/3*v4 + 1", "x + div(N + 1, 2)".
  std::string str() const;
  bool operator==(const Polynomial& o) const;

 private:
  std::map<std::string, Rational> index_terms_;  // non-zero coefficients only
  // key: printed atom, value: (atom, coefficient)
  std::map<std::string, std::pair<DimExpr, Rational>> dim_terms_;
  Rational constant_;
};

// ---------------------------------------------------------------------------------------------------
// Elementwise expressions.
enum class UnaryOp { neg, logical_not };
enum class BinaryOp { add, sub, mul, div, mod, eq, ne, lt, gt, le, ge, logical_and, logical_or };
enum class Intrinsic {
  abs, sign, exp, log, sqrt, pow, sin, cos, tan, asin, acos, atan, sinh, cosh, tanh, erf, sigmoid, relu,
  floor, ceil, round, max, min, ident, select, cast
};
std::string to_string(UnaryOp op);
std::string to_string(BinaryOp op);
std::string to_string(Intrinsic fn);
std::optional<Intrinsic> parse_intrinsic(const std::string& name);
int intrinsic_arity(Intrinsic fn);  // cast counts its value argument only

class Expr {
 public:
  enum class Kind { tensor, literal, dim, unary, binary, call };
  Expr() = default;
  static Expr tensor(const std::string& name);
  static Expr literal(double value, bool is_integer);
  static Expr dim(const std::string& name);
  static Expr unary(UnaryOp op, const Expr& a);
  static Expr binary(BinaryOp op, const Expr& a, const Expr& b);
  static Expr call(Intrinsic fn, std::vector<Expr> args, DType cast_to = DType::f32);

  bool is_null() const { return !node_; }
  Kind kind() const;
  const std::string& name() const;      // tensor or dim
  double value() const;                 // literal
  bool literal_is_integer() const;      // literal
  UnaryOp unary_op() const;
  BinaryOp binary_op() const;
  Intrinsic intrinsic() const;
  DType cast_type() const;              // call of cast
  const std::vector<Expr>& args() const;  // unary: 1, binary: 2, call: arity

  void collect_tensors(std::vector<std::string>& out) const;
  // A copy with every tensor and dim leaf replaced by fn(leaf); leaves for which fn returns nullopt stay.
  Expr replace_leaves(const std::function<std::optional<Expr>(const Expr& leaf)>& fn) const;
  std::string str() const;

 private:
  struct Node;
  std::shared_ptr<const Node> node_;
};

// ---------------------------------------------------------------------------------------------------
// Statements.
enum class AggregationOp { sum, product, max, min, assign };
enum class CombinationOp { none, mul, add, eq, cond };
std::string to_string(AggregationOp op);
std::string to_string(CombinationOp op);
char aggregation_marker(AggregationOp op);  // '+', '*', '>', '<', '='
int combination_arity(CombinationOp op);

struct TensorAccess {
  std::string tensor;
  std::vector<Polynomial> indices;
  std::string str() const;
};

// 0 <= poly < bound.
struct Constraint {
  Polynomial poly;
  DimExpr bound;
  std::string str() const;
};

struct Contraction {
  std::string output;
  std::vector<Polynomial> output_indices;
  std::vector<DimExpr> output_shape;  // same length as output_indices
  AggregationOp aggregation = AggregationOp::sum;
  CombinationOp combination = CombinationOp::none;
  std::vector<TensorAccess> inputs;   // combination_arity(combination) accesses
  std::vector<Constraint> constraints;
  std::optional<std::string> init;    // default tensor, broadcast to the output shape

  // Index variables in order of first appearance: output indices, inputs, constraints.
  std::vector<std::string> index_variables() const;
};

struct Elementwise {
  std::string output;
  Expr expr;
};

using Statement = std::variant<Contraction, Elementwise>;
const std::string& statement_output(const Statement& s);
// A name for something a pass adds (a tensor, a variable): `base` when `taken` lacks it, else `base` with
// underscores appended until it is free. The name is added to `taken`.
std::string fresh_name(std::string base, std::set<std::string>& taken);
// The tensors a statement reads, in order and with repetition: a contraction's inputs then its default
// tensor; an elementwise statement's leaves.
std::vector<std::string> statement_operands(const Statement& s);

struct Param {
  std::string name;
  std::vector<DimExpr> dims;  // a bare, not-yet-bound name binds it; anything else is checked
};

struct Program {
  std::string name;  // may be empty
  std::vector<Param> inputs;
  std::vector<std::string> outputs;
  std::vector<Statement> statements;
};

// The names a program's tensors take: its inputs and every statement's output (what fresh_name must avoid
// for a new tensor).
std::set<std::string> tensor_names(const Program& p);

// Symbolic checks shared by both front ends: names defined before use and assigned once, ranks agree,
// dims bound before use, combination arity, no dim/tensor name clash, outputs defined. UserError naming
// the offending object otherwise.
void validate(const Program& program);

// Normalized Tile text; print(parse(print(p))) == print(p).
std::string print(const Program& program);
std::string print(const Statement& statement);

}  // namespace polytile
