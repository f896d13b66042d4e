// eDSL graph construction and its lowering to a Program. Data model: every Tensor handle points at a Node
// (input, contraction output, or elementwise op). Dims, indices and tensors are referred to inside
// DimExprs, Polynomials and Exprs by placeholder names made from a creation counter ("$000000000012" for
// dims, "#000000000007" for indices, "%000000000003" for tensors); make_program renames them to user or
// deterministic automatic names. The counter is zero-padded so that placeholder order is creation order.
#include "polytile/edsl.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "polytile/error.h"

namespace polytile::edsl {

namespace {
std::atomic<uint64_t> g_counter{0};
std::string placeholder(char tag) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%c%012llu", tag, static_cast<unsigned long long>(g_counter++));
  return buf;
}
}  // namespace

struct TensorDim::State {
  std::string name;    // user name, may be empty
  std::string symbol;  // placeholder symbol used when bound by an input
  DimExpr expr;        // null until bound
};

struct TensorIndex::State {
  std::string name;
  std::string key;  // placeholder index name
};

struct Node {
  enum class Kind { input, contraction, elementwise } kind;
  std::string key = placeholder('%');
  std::string name;
  size_t rank = 0;
  std::vector<DimExpr> dims;  // input: bound slots (null = unbound); contraction: output shape
  // contraction
  bool defined = false;
  AggregationOp aggregation = AggregationOp::sum;
  CombinationOp combination = CombinationOp::none;
  std::vector<IndexPoly> out_indices;
  std::vector<std::pair<std::shared_ptr<Node>, std::vector<IndexPoly>>> accesses;
  std::vector<IndexConstraint> constraints;
  std::shared_ptr<Node> init;
  // elementwise: tensor leaves are Expr::tensor(dep->key)
  Expr expr;
  std::vector<std::shared_ptr<Node>> deps;
};

// ------------------------------------------------------------------------------------------ dims

TensorDim::TensorDim() : state(std::make_shared<State>()) {}
TensorDim::TensorDim(const std::string& name) : TensorDim() { state->name = name; }
TensorDim::TensorDim(int64_t value) : TensorDim() { state->expr = DimExpr(value); }
bool TensorDim::is_bound() const { return !state->expr.is_null(); }
DimExpr TensorDim::expr() const {
  if (!is_bound())
    user_error("TensorDim ", state->name.empty() ? std::string("(unnamed)") : state->name,
               " is used before it is bound by bind_dims");
  return state->expr;
}

static TensorDim from_expr(DimExpr e) {
  TensorDim d;
  d.state->expr = std::move(e);
  return d;
}
TensorDim operator+(const TensorDim& a, const TensorDim& b) { return from_expr(a.expr() + b.expr()); }
TensorDim operator-(const TensorDim& a, const TensorDim& b) { return from_expr(a.expr() - b.expr()); }
TensorDim operator*(const TensorDim& a, const TensorDim& b) { return from_expr(a.expr() * b.expr()); }
TensorDim operator/(const TensorDim& a, const TensorDim& b) {
  if (b.expr().is_constant() && b.expr().value() == 0) user_error("TensorDim division by zero");
  return from_expr(a.expr() / b.expr());
}
TensorDim operator-(const TensorDim& a) { return from_expr(-a.expr()); }
TensorDim max(const TensorDim& a, const TensorDim& b) { return from_expr(polytile::max(a.expr(), b.expr())); }
TensorDim min(const TensorDim& a, const TensorDim& b) { return from_expr(polytile::min(a.expr(), b.expr())); }

// ------------------------------------------------------------------------------------------ indices

TensorIndex::TensorIndex() : state(std::make_shared<State>()) { state->key = placeholder('#'); }
TensorIndex::TensorIndex(const std::string& name) : TensorIndex() { state->name = name; }
IndexPoly TensorIndex::poly() const { return IndexPoly(*this); }

namespace {
// Registry of index placeholder key -> state, so make_program can find user names. Weak references: an
// index that no longer exists cannot be in a live graph's polynomials... except through the graph, so
// the graph keeps the names it needs in this map for as long as the process lives (a few bytes each).
std::map<std::string, std::string>& index_names() {
  static std::map<std::string, std::string> names;
  return names;
}
std::map<std::string, std::string>& dim_names() {
  static std::map<std::string, std::string> names;
  return names;
}
}  // namespace

IndexPoly::IndexPoly(const TensorIndex& i) : poly(Polynomial::index(i.state->key)) { index_names()[i.state->key] = i.state->name; }
IndexPoly::IndexPoly(const TensorDim& d) : poly(Polynomial::dim(d.expr())) {}
IndexPoly::IndexPoly(int64_t c) : poly(Rational(c)) {}

IndexPoly operator+(const IndexPoly& a, const IndexPoly& b) { return IndexPoly(a.poly + b.poly); }
IndexPoly operator-(const IndexPoly& a, const IndexPoly& b) { return IndexPoly(a.poly - b.poly); }
IndexPoly operator-(const IndexPoly& a) { return IndexPoly(-a.poly); }
IndexPoly operator*(int64_t c, const IndexPoly& a) { return IndexPoly(a.poly * Rational(c)); }
IndexPoly operator*(const IndexPoly& a, int64_t c) { return IndexPoly(a.poly * Rational(c)); }
IndexPoly operator/(const IndexPoly& a, int64_t c) {
  if (c == 0) user_error("index expression divided by zero");
  return IndexPoly(a.poly * Rational(1, c));
}
IndexPoly operator+(const TensorIndex& a, const TensorIndex& b) { return IndexPoly(a) + IndexPoly(b); }
IndexPoly operator-(const TensorIndex& a, const TensorIndex& b) { return IndexPoly(a) - IndexPoly(b); }
IndexPoly operator*(int64_t c, const TensorIndex& a) { return c * IndexPoly(a); }
IndexPoly operator*(const TensorIndex& a, int64_t c) { return IndexPoly(a) * c; }
IndexPoly operator/(const TensorIndex& a, int64_t c) { return IndexPoly(a) / c; }

IndexConstraint operator<(const IndexPoly& poly, const TensorDim& bound) {
  bound.expr();  // must be bound
  return IndexConstraint{poly, bound};
}
IndexConstraint operator<(const TensorIndex& index, const TensorDim& bound) { return IndexPoly(index) < bound; }

// ------------------------------------------------------------------------------------------ tensors

// A dim expression for messages: placeholders become the user's names.
static std::string pretty(const DimExpr& e) {
  std::vector<std::string> symbols;
  e.collect_symbols(symbols);
  std::map<std::string, DimExpr> subst;
  for (const auto& s : symbols) {
    auto it = dim_names().find(s);
    if (it != dim_names().end()) subst[s] = DimExpr::symbol(it->second.empty() ? "(unnamed dim)" : it->second);
  }
  return e.substitute(subst).str();
}

static std::string display_name(const Node& n) { return n.name.empty() ? std::string("(unnamed tensor)") : n.name; }

// The symbolic size of axis k of a node, or null when it is only known at run time.
static DimExpr node_dim(const Node& n, size_t k) {
  if (n.kind != Node::Kind::elementwise) return n.dims[k];
  DimExpr result;
  for (const auto& d : n.deps) {
    if (d->rank + k < n.rank) continue;  // broadcast-prepended axis
    DimExpr e = node_dim(*d, k - (n.rank - d->rank));
    if (e.is_null()) return DimExpr();
    if (e.is_constant() && e.value() == 1) continue;
    if (result.is_null()) {
      result = e;
    } else if (result != e) {
      return DimExpr();
    }
  }
  return result.is_null() ? DimExpr(1) : result;
}

size_t Tensor::rank() const { return node->rank; }

void Tensor::bind_dims_vector(std::vector<TensorDim>& dims) const {
  Node& n = *node;
  if (dims.size() != n.rank)
    user_error("bind_dims on ", display_name(n), ": the tensor has rank ", n.rank, " but ", dims.size(),
               " dims were given");
  for (size_t k = 0; k < dims.size(); ++k) {
    TensorDim& d = dims[k];
    DimExpr slot = node_dim(n, k);
    if (slot.is_null()) {
      if (n.kind != Node::Kind::input)
        user_error("bind_dims on ", display_name(n), ": the size of axis ", k,
                   " depends on run-time broadcasting and cannot be bound");
      if (!d.is_bound()) {
        d.state->symbol = placeholder('$');
        dim_names()[d.state->symbol] = d.state->name;
        d.state->expr = DimExpr::symbol(d.state->symbol);
      }
      n.dims[k] = d.state->expr;
      continue;
    }
    if (!d.is_bound()) {
      d.state->expr = slot;
    } else if (d.state->expr != slot) {
      user_error("bind_dims on ", display_name(n), ": axis ", k, " has size ", pretty(slot), " but the dim ",
                 d.state->name.empty() ? std::string("given") : d.state->name, " is already bound to ",
                 pretty(d.state->expr));
    }
  }
}

static Node& contraction_node(const Tensor& t, const char* what) {
  if (t.node->kind != Node::Kind::contraction)
    user_error(what, " on ", display_name(*t.node), ": only a TensorOutput holds a contraction");
  return *t.node;
}

void Tensor::add_constraint(const IndexConstraint& c) const { contraction_node(*this, "add_constraint").constraints.push_back(c); }
void Tensor::add_constraints(const std::vector<IndexConstraint>& cs) const {
  for (const auto& c : cs) add_constraint(c);
}
void Tensor::set_default(const Tensor& init) const {
  Node& n = contraction_node(*this, "set_default");
  if (init.rank() > n.rank)
    user_error("set_default on ", display_name(n), ": default tensor has rank ", init.rank(), ", more than ", n.rank);
  n.init = init.node;
}
Tensor& Tensor::named(const std::string& name) {
  node->name = name;
  return *this;
}
const Tensor& Tensor::named(const std::string& name) const {
  node->name = name;
  return *this;
}

Tensor Placeholder(const std::string& name, size_t rank) {
  if (name.empty()) user_error("Placeholder needs a name");
  auto n = std::make_shared<Node>();
  n->kind = Node::Kind::input;
  n->name = name;
  n->rank = rank;
  n->dims.assign(rank, DimExpr());
  return Tensor(n);
}

Tensor make_tensor_output(const std::vector<TensorDim>& dims) {
  auto n = std::make_shared<Node>();
  n->kind = Node::Kind::contraction;
  n->rank = dims.size();
  for (const auto& d : dims) n->dims.push_back(d.expr());
  return Tensor(n);
}

IndexedTensor::IndexedTensor(std::shared_ptr<Node> n, std::vector<IndexPoly> idx)
    : node(std::move(n)), indices(std::move(idx)) {
  if (indices.size() != node->rank)
    user_error("tensor ", display_name(*node), " has rank ", node->rank, " but is indexed with ", indices.size(),
               " index expression(s)");
}

static void define(const IndexedTensor& lhs, AggregationOp agg, const ContractionRhs& rhs) {
  Node& n = *lhs.node;
  if (n.kind != Node::Kind::contraction)
    user_error("cannot write ", display_name(n), " with a contraction: only a TensorOutput can be written");
  if (n.defined) user_error("TensorOutput ", display_name(n), " is already defined by a contraction");
  n.defined = true;
  n.aggregation = agg;
  n.combination = rhs.combination;
  n.out_indices = lhs.indices;
  for (const auto& a : rhs.accesses) n.accesses.emplace_back(a.node, a.indices);
}

void IndexedTensor::operator+=(const ContractionRhs& rhs) const { define(*this, AggregationOp::sum, rhs); }
void IndexedTensor::operator*=(const ContractionRhs& rhs) const { define(*this, AggregationOp::product, rhs); }
void IndexedTensor::operator>=(const ContractionRhs& rhs) const { define(*this, AggregationOp::max, rhs); }
void IndexedTensor::operator<=(const ContractionRhs& rhs) const { define(*this, AggregationOp::min, rhs); }
void IndexedTensor::operator=(const ContractionRhs& rhs) const { define(*this, AggregationOp::assign, rhs); }
void IndexedTensor::operator=(const IndexedTensor& rhs) const {
  define(*this, AggregationOp::assign, ContractionRhs(rhs));
}

ContractionRhs::ContractionRhs(const IndexedTensor& a) : combination(CombinationOp::none), accesses{a} {}
ContractionRhs::ContractionRhs(CombinationOp op, std::vector<IndexedTensor> a) : combination(op), accesses(std::move(a)) {}
ContractionRhs operator*(const IndexedTensor& a, const IndexedTensor& b) { return {CombinationOp::mul, {a, b}}; }
ContractionRhs operator+(const IndexedTensor& a, const IndexedTensor& b) { return {CombinationOp::add, {a, b}}; }
ContractionRhs operator==(const IndexedTensor& a, const IndexedTensor& b) { return {CombinationOp::eq, {a, b}}; }
ContractionRhs cond(const IndexedTensor& a, const IndexedTensor& b, const IndexedTensor& c) {
  return {CombinationOp::cond, {a, b, c}};
}

// ------------------------------------------------------------------------------------------ elementwise

static Tensor elementwise(Expr e, std::vector<Tensor> deps) {
  auto n = std::make_shared<Node>();
  n->kind = Node::Kind::elementwise;
  n->expr = std::move(e);
  for (const auto& d : deps) {
    if (!d.node) user_error("an elementwise operation got an empty Tensor handle");
    n->rank = std::max(n->rank, d.node->rank);
    n->deps.push_back(d.node);
  }
  return Tensor(n);
}

// A leaf expression for a tensor operand (constants stay literals so they inline everywhere).
static Expr leaf(const Tensor& t) {
  if (!t.node) user_error("an elementwise operation got an empty Tensor handle");
  return Expr::tensor(t.node->key);
}

static Expr dim_to_expr(const DimExpr& d) {
  using K = DimExpr::Kind;
  switch (d.kind()) {
    case K::constant: return Expr::literal(static_cast<double>(d.value()), true);
    case K::symbol: return Expr::dim(d.name());
    case K::neg: return Expr::unary(UnaryOp::neg, dim_to_expr(d.lhs()));
    case K::add: return Expr::binary(BinaryOp::add, dim_to_expr(d.lhs()), dim_to_expr(d.rhs()));
    case K::sub: return Expr::binary(BinaryOp::sub, dim_to_expr(d.lhs()), dim_to_expr(d.rhs()));
    case K::mul: return Expr::binary(BinaryOp::mul, dim_to_expr(d.lhs()), dim_to_expr(d.rhs()));
    case K::div: return Expr::binary(BinaryOp::div, dim_to_expr(d.lhs()), dim_to_expr(d.rhs()));
    case K::max: return Expr::call(Intrinsic::max, {dim_to_expr(d.lhs()), dim_to_expr(d.rhs())});
    case K::min: return Expr::call(Intrinsic::min, {dim_to_expr(d.lhs()), dim_to_expr(d.rhs())});
  }
  POLYTILE_CHECK(false, "bad dim kind");
}

Tensor scalar(double value) { return elementwise(Expr::literal(value, false), {}); }
Tensor scalar_int(int64_t value) { return elementwise(Expr::literal(static_cast<double>(value), true), {}); }
Tensor as_tensor(const TensorDim& d) { return elementwise(dim_to_expr(d.expr()), {}); }

Tensor operator-(const Tensor& a) { return elementwise(Expr::unary(UnaryOp::neg, leaf(a)), {a}); }
Tensor operator!(const Tensor& a) { return elementwise(Expr::unary(UnaryOp::logical_not, leaf(a)), {a}); }

#define POLYTILE_EDSL_BINARY_IMPL(OP, KIND)                                                               \
  Tensor operator OP(const Tensor& a, const Tensor& b) {                                                  \
    return elementwise(Expr::binary(BinaryOp::KIND, leaf(a), leaf(b)), {a, b});                           \
  }                                                                                                       \
  Tensor operator OP(const Tensor& a, const TensorDim& b) { return a OP as_tensor(b); }                   \
  Tensor operator OP(const TensorDim& a, const Tensor& b) { return as_tensor(a) OP b; }
POLYTILE_EDSL_BINARY_IMPL(+, add)
POLYTILE_EDSL_BINARY_IMPL(-, sub)
POLYTILE_EDSL_BINARY_IMPL(*, mul)
POLYTILE_EDSL_BINARY_IMPL(/, div)
POLYTILE_EDSL_BINARY_IMPL(%, mod)
POLYTILE_EDSL_BINARY_IMPL(==, eq)
POLYTILE_EDSL_BINARY_IMPL(!=, ne)
POLYTILE_EDSL_BINARY_IMPL(<, lt)
POLYTILE_EDSL_BINARY_IMPL(>, gt)
POLYTILE_EDSL_BINARY_IMPL(<=, le)
POLYTILE_EDSL_BINARY_IMPL(>=, ge)
POLYTILE_EDSL_BINARY_IMPL(&&, logical_and)
POLYTILE_EDSL_BINARY_IMPL(||, logical_or)
#undef POLYTILE_EDSL_BINARY_IMPL

Tensor call(Intrinsic fn, const std::vector<Tensor>& args) {
  std::vector<Expr> leaves;
  for (const auto& a : args) leaves.push_back(leaf(a));
  return elementwise(Expr::call(fn, std::move(leaves)), args);
}
Tensor abs(const Tensor& x) { return call(Intrinsic::abs, {x}); }
Tensor sign(const Tensor& x) { return call(Intrinsic::sign, {x}); }
Tensor exp(const Tensor& x) { return call(Intrinsic::exp, {x}); }
Tensor log(const Tensor& x) { return call(Intrinsic::log, {x}); }
Tensor sqrt(const Tensor& x) { return call(Intrinsic::sqrt, {x}); }
Tensor pow(const Tensor& x, const Tensor& y) { return call(Intrinsic::pow, {x, y}); }
Tensor sin(const Tensor& x) { return call(Intrinsic::sin, {x}); }
Tensor cos(const Tensor& x) { return call(Intrinsic::cos, {x}); }
Tensor tan(const Tensor& x) { return call(Intrinsic::tan, {x}); }
Tensor asin(const Tensor& x) { return call(Intrinsic::asin, {x}); }
Tensor acos(const Tensor& x) { return call(Intrinsic::acos, {x}); }
Tensor atan(const Tensor& x) { return call(Intrinsic::atan, {x}); }
Tensor sinh(const Tensor& x) { return call(Intrinsic::sinh, {x}); }
Tensor cosh(const Tensor& x) { return call(Intrinsic::cosh, {x}); }
Tensor tanh(const Tensor& x) { return call(Intrinsic::tanh, {x}); }
Tensor erf(const Tensor& x) { return call(Intrinsic::erf, {x}); }
Tensor sigmoid(const Tensor& x) { return call(Intrinsic::sigmoid, {x}); }
Tensor relu(const Tensor& x) { return call(Intrinsic::relu, {x}); }
Tensor floor(const Tensor& x) { return call(Intrinsic::floor, {x}); }
Tensor ceil(const Tensor& x) { return call(Intrinsic::ceil, {x}); }
Tensor round(const Tensor& x) { return call(Intrinsic::round, {x}); }
Tensor max(const Tensor& x, const Tensor& y) { return call(Intrinsic::max, {x, y}); }
Tensor min(const Tensor& x, const Tensor& y) { return call(Intrinsic::min, {x, y}); }
Tensor ident(const Tensor& x) { return call(Intrinsic::ident, {x}); }
Tensor select(const Tensor& c, const Tensor& t, const Tensor& f) { return call(Intrinsic::select, {c, t, f}); }
Tensor cast(const Tensor& x, DType dtype) { return elementwise(Expr::call(Intrinsic::cast, {leaf(x)}, dtype), {x}); }

// ------------------------------------------------------------------------------------------ make_program

namespace {

std::vector<Node*> node_deps(const Node& n) {
  std::vector<Node*> out;
  for (const auto& a : n.accesses) out.push_back(a.first.get());
  if (n.init) out.push_back(n.init.get());
  for (const auto& d : n.deps) out.push_back(d.get());
  return out;
}

// prefix0, prefix1, ...: the first not taken from `counter` on.
std::string numbered_name(const std::string& prefix, int& counter, const std::set<std::string>& taken) {
  for (;;) {
    std::string n = prefix + std::to_string(counter++);
    if (!taken.count(n)) return n;
  }
}

// make_program's steps, in order: the nodes in dependence order, the checks of inputs and outputs,
// which nodes become statements, tensor names, dim names (and the program's parameters), then one
// statement per materialized node.
class ProgramAssembler {
 public:
  ProgramAssembler(const std::string& name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs)
      : name_(name), inputs_(inputs), outputs_(outputs) {
    p_.name = name;
  }

  Program assemble() {
    order_nodes();
    check_inputs_and_outputs();
    count_uses();
    name_tensors();
    name_dims();
    for (Node* n : order_) by_key_[n->key] = n;
    for (Node* n : order_) {
      if (n->kind == Node::Kind::input || !materialized(n)) continue;
      if (n->kind == Node::Kind::elementwise) {
        p_.statements.push_back(elementwise(n));
      } else {
        p_.statements.push_back(contraction(n));
      }
    }
    for (const auto& o : outputs_) p_.outputs.push_back(names_.at(o.node.get()));
    validate(p_);
    return std::move(p_);
  }

 private:
  // Topological order by depth-first search from the outputs.
  void order_nodes() {
    std::set<Node*> visited, on_stack;
    std::function<void(Node*)> visit = [&](Node* n) {
      if (visited.count(n)) return;
      if (on_stack.count(n)) user_error("tensor ", display_name(*n), " depends on itself");
      on_stack.insert(n);
      for (Node* d : node_deps(*n)) visit(d);
      on_stack.erase(n);
      visited.insert(n);
      order_.push_back(n);
    };
    for (const auto& o : outputs_) {
      if (!o.node) user_error("make_program ", name_, ": an output is an empty Tensor handle");
      visit(o.node.get());
    }
  }

  void check_inputs_and_outputs() {
    for (const auto& i : inputs_) {
      if (!i.node || i.node->kind != Node::Kind::input)
        user_error("make_program ", name_, ": input ", i.node ? display_name(*i.node) : "", " is not a Placeholder");
      if (!input_set_.insert(i.node.get()).second)
        user_error("make_program ", name_, ": input ", i.node->name, " is listed twice");
    }
    for (const auto& o : outputs_) output_set_.insert(o.node.get());
    for (Node* n : order_) {
      if (n->kind == Node::Kind::input && !input_set_.count(n))
        user_error("make_program ", name_, ": tensor ", n->name, " is used but is not among the program's inputs");
      if (n->kind == Node::Kind::contraction && !n->defined)
        user_error("make_program ", name_, ": TensorOutput ", display_name(*n), " is never written by a contraction");
    }
  }

  // Which nodes become statements, and how often each is used.
  void count_uses() {
    for (Node* n : order_) {
      for (Node* d : node_deps(*n)) {
        ++uses_[d];
        if (n->kind == Node::Kind::contraction) used_by_contraction_.insert(d);
      }
    }
  }

  bool materialized(Node* n) {
    if (n->kind != Node::Kind::elementwise) return true;
    return !n->name.empty() || output_set_.count(n) || used_by_contraction_.count(n) || uses_[n] != 1;
  }

  // Inputs keep their names, named tensors theirs (distinct), the others become T0, T1, ...
  void name_tensors() {
    for (const auto& i : inputs_) {
      names_[i.node.get()] = i.node->name;
      taken_.insert(i.node->name);
    }
    for (Node* n : order_) {
      if (n->kind == Node::Kind::input || !materialized(n) || n->name.empty()) continue;
      if (!taken_.insert(n->name).second) user_error("make_program ", name_, ": two tensors are named ", n->name);
      names_[n] = n->name;
    }
    int count = 0;
    for (Node* n : order_)
      if (materialized(n) && !names_.count(n)) {
        names_[n] = numbered_name("T", count, taken_);
        taken_.insert(names_[n]);
      }
  }

  // Placeholders of input-bound dims become user names or D0, D1, ... in order of appearance; the
  // program's parameters get them.
  void name_dims() {
    std::set<std::string> dim_taken;
    std::map<std::string, std::string> user_dim_owner;  // user name -> placeholder
    for (const auto& i : inputs_)
      for (auto& d : i.node->dims)
        if (d.is_null()) d = DimExpr::symbol(placeholder('$'));
    std::vector<std::string> symbols;
    for (const auto& i : inputs_)
      for (const auto& d : i.node->dims) d.collect_symbols(symbols);
    for (const auto& s : symbols) {
      const std::string& user = dim_names()[s];
      if (user.empty()) continue;
      auto [it, fresh] = user_dim_owner.emplace(user, s);
      if (!fresh && it->second != s) user_error("make_program ", name_, ": two distinct TensorDims are named ", user);
      if (taken_.count(user)) user_error("make_program ", name_, ": dim ", user, " has the name of a tensor");
      dim_rename_[s] = user;
      dim_taken.insert(user);
    }
    int count = 0;
    for (const auto& s : symbols)
      if (!dim_rename_.count(s)) {
        std::set<std::string> all = dim_taken;
        all.insert(taken_.begin(), taken_.end());
        dim_rename_[s] = numbered_name("D", count, all);
        dim_taken.insert(dim_rename_[s]);
      }
    for (const auto& [from, to] : dim_rename_) dim_subst_[from] = DimExpr::symbol(to);
    for (const auto& i : inputs_) {
      Param param{i.node->name, {}};
      for (const auto& d : i.node->dims) param.dims.push_back(d.substitute(dim_subst_));
      p_.inputs.push_back(param);
    }
  }

  void check_dims_known(const std::vector<std::string>& used, const std::string& where) {
    for (const auto& s : used)
      if (!dim_rename_.count(s))
        user_error("make_program ", name_, ": ", where, " uses a dim bound by a tensor that is not an input");
  }

  // A node's expression with tensor leaves (node keys) as names or inlined expressions, and dim
  // placeholders with their names.
  Expr expand(Node* n) {
    return n->expr.replace_leaves([&](const Expr& leaf) -> std::optional<Expr> {
      if (leaf.kind() == Expr::Kind::dim) {
        auto it = dim_rename_.find(leaf.name());
        if (it == dim_rename_.end()) return std::nullopt;
        return Expr::dim(it->second);
      }
      Node* d = by_key_.at(leaf.name());
      if (materialized(d)) return Expr::tensor(names_.at(d));
      return expand(d);
    });
  }

  Statement elementwise(Node* n) {
    const std::string& out = names_.at(n);
    std::vector<std::string> used;
    std::vector<Expr> stack{n->expr};
    while (!stack.empty()) {
      Expr x = stack.back();
      stack.pop_back();
      if (x.kind() == Expr::Kind::dim) used.push_back(x.name());
      for (const auto& a : x.args()) stack.push_back(a);
    }
    check_dims_known(used, "elementwise " + out);
    return Elementwise{out, expand(n)};
  }

  // Index placeholders become user names or x0, x1, ... in order of appearance.
  Statement contraction(Node* n) {
    const std::string& out = names_.at(n);
    Contraction c;
    c.output = out;
    c.aggregation = n->aggregation;
    c.combination = n->combination;
    for (const auto& ix : n->out_indices) c.output_indices.push_back(ix.poly);
    for (const auto& [dep, idx] : n->accesses) {
      TensorAccess a{names_.at(dep.get()), {}};
      for (const auto& ix : idx) a.indices.push_back(ix.poly);
      c.inputs.push_back(a);
    }
    for (const auto& k : n->constraints) c.constraints.push_back({k.poly.poly, k.bound.expr()});
    std::map<std::string, std::string> idx_rename;
    std::map<std::string, std::string> user_owner;
    std::set<std::string> idx_taken;
    std::vector<std::string> vars = c.index_variables();
    for (const auto& v : vars) {
      const std::string& user = index_names()[v];
      if (user.empty()) continue;
      auto [it, fresh] = user_owner.emplace(user, v);
      if (!fresh && it->second != v) user_error("contraction ", out, " uses two distinct TensorIndex objects named ", user);
      idx_rename[v] = user;
      idx_taken.insert(user);
    }
    int count = 0;
    for (const auto& v : vars)
      if (!idx_rename.count(v)) idx_rename[v] = numbered_name("x", count, idx_taken);
    std::vector<std::string> used_dims;
    auto fix = [&](const Polynomial& poly) {
      poly.collect_dim_symbols(used_dims);
      return poly.rename_indices(idx_rename).substitute_dims(dim_subst_);
    };
    for (auto& ix : c.output_indices) ix = fix(ix);
    for (auto& a : c.inputs)
      for (auto& ix : a.indices) ix = fix(ix);
    for (auto& k : c.constraints) {
      k.poly = fix(k.poly);
      k.bound.collect_symbols(used_dims);
      k.bound = k.bound.substitute(dim_subst_);
    }
    for (const auto& d : n->dims) {
      d.collect_symbols(used_dims);
      c.output_shape.push_back(d.substitute(dim_subst_));
    }
    check_dims_known(used_dims, "contraction " + out);
    if (n->init) c.init = names_.at(n->init.get());
    return c;
  }

  const std::string& name_;
  const std::vector<Tensor>& inputs_;
  const std::vector<Tensor>& outputs_;
  Program p_;
  std::vector<Node*> order_;
  std::set<Node*> input_set_, output_set_, used_by_contraction_;
  std::map<Node*, int> uses_;
  std::set<std::string> taken_;                 // tensor names
  std::map<Node*, std::string> names_;
  std::map<std::string, std::string> dim_rename_;  // placeholder -> dim name
  std::map<std::string, DimExpr> dim_subst_;
  std::map<std::string, Node*> by_key_;
};

}  // namespace

Program make_program(const std::string& name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  return ProgramAssembler(name, inputs, outputs).assemble();
}

}  // namespace polytile::edsl
