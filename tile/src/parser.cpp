// Tile text parser. Text is lexed into tokens, expressions are parsed into a small context-free syntax
// tree (Ast), and the tree is then converted according to where it stands: an index expression becomes a
// Polynomial, a shape or bound becomes a DimExpr, an elementwise right-hand side becomes an Expr. Keeping
// one expression grammar and three converters gives every context the same precedence rules and the same
// line:column diagnostics.
#include "polytile/parser.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#include "polytile/error.h"
#include "read_file.h"

namespace polytile {
namespace {

enum class Tok { ident, integer, real, punct, end };

struct Token {
  Tok kind;
  std::string text;
  size_t offset;
};

struct Ast {
  enum class Kind { integer, real, ident, unary, binary, call } kind;
  std::string text;  // ident name, operator, or call name
  int64_t int_value = 0;
  double real_value = 0;
  std::vector<std::shared_ptr<Ast>> args;
  size_t begin = 0, end = 0;  // source range
  int depth = 1;              // of the tree below, this node included
};
using AstPtr = std::shared_ptr<Ast>;

class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : text_(text), source_(source) { lex(); }

  Program parse() {
    Program p;
    expect_word("function");
    if (peek().kind == Tok::ident) p.name = next().text;
    expect("(");
    if (!accept(")")) {
      do p.inputs.push_back(parse_param());
      while (accept(","));
      expect(")");
    }
    expect("->");
    expect("(");
    std::vector<Token> outs;
    if (!accept(")")) {
      do outs.push_back(expect_ident("an output name"));
      while (accept(","));
      expect(")");
    }
    expect("{");
    while (!accept("}")) p.statements.push_back(parse_statement());
    if (peek().kind != Tok::end) fail(peek(), "unexpected '" + peek().text + "' after the end of the function");
    std::set<std::string> seen;
    for (const auto& o : outs) {
      if (!tensors_.count(o.text)) fail(o, "output " + o.text + " is never defined");
      if (!seen.insert(o.text).second) fail(o, "output " + o.text + " is listed twice");
      p.outputs.push_back(o.text);
    }
    if (p.outputs.empty()) fail(peek(), "the function has no outputs");
    validate(p);
    return p;
  }

 private:
  // ---------------------------------------------------------------------------- lexing
  void lex() {
    size_t i = 0;
    while (i < text_.size()) {
      char c = text_[i];
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
      } else if (c == '#' || (c == '/' && i + 1 < text_.size() && text_[i + 1] == '/')) {
        while (i < text_.size() && text_[i] != '\n') ++i;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[j])) || text_[j] == '_')) ++j;
        tokens_.push_back({Tok::ident, text_.substr(i, j - i), i});
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c)) ||
                 (c == '.' && i + 1 < text_.size() && std::isdigit(static_cast<unsigned char>(text_[i + 1])))) {
        size_t j = i;
        bool real = false;
        while (j < text_.size() && std::isdigit(static_cast<unsigned char>(text_[j]))) ++j;
        if (j < text_.size() && text_[j] == '.') {
          real = true;
          ++j;
          while (j < text_.size() && std::isdigit(static_cast<unsigned char>(text_[j]))) ++j;
        }
        if (j < text_.size() && (text_[j] == 'e' || text_[j] == 'E')) {
          size_t k = j + 1;
          if (k < text_.size() && (text_[k] == '+' || text_[k] == '-')) ++k;
          if (k < text_.size() && std::isdigit(static_cast<unsigned char>(text_[k]))) {
            real = true;
            j = k;
            while (j < text_.size() && std::isdigit(static_cast<unsigned char>(text_[j]))) ++j;
          }
        }
        tokens_.push_back({real ? Tok::real : Tok::integer, text_.substr(i, j - i), i});
        i = j;
      } else {
        static const char* two[] = {"->", "==", "!=", "<=", ">=", "&&", "||"};
        std::string t(1, c);
        for (const char* op : two)
          if (text_.compare(i, 2, op) == 0) t = op;
        if (t.size() == 1 && std::string("()[]{},;:+-*/%<>=!?").find(c) == std::string::npos)
          fail_at(i, std::string("unexpected character '") + c + "'");
        tokens_.push_back({Tok::punct, t, i});
        i += t.size();
      }
    }
    tokens_.push_back({Tok::end, "end of input", text_.size()});
  }

  // ---------------------------------------------------------------------------- diagnostics
  [[noreturn]] void fail_at(size_t offset, const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < offset && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw UserError(source_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + msg);
  }
  [[noreturn]] void fail(const Token& t, const std::string& msg) const { fail_at(t.offset, msg); }
  [[noreturn]] void fail(const Ast& a, const std::string& msg) const { fail_at(a.begin, msg); }
  std::string source_text(const Ast& a) const { return text_.substr(a.begin, a.end - a.begin); }

  // ---------------------------------------------------------------------------- token helpers
  const Token& peek(size_t k = 0) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is(const std::string& p, size_t k = 0) const { return peek(k).kind == Tok::punct && peek(k).text == p; }
  bool accept(const std::string& p) {
    if (!is(p)) return false;
    next();
    return true;
  }
  void expect(const std::string& p) {
    if (!accept(p)) fail(peek(), "expected '" + p + "' but found '" + peek().text + "'");
  }
  void expect_word(const std::string& w) {
    if (peek().kind != Tok::ident || peek().text != w)
      fail(peek(), "expected '" + w + "' but found '" + peek().text + "'");
    next();
  }
  Token expect_ident(const std::string& what) {
    if (peek().kind != Tok::ident) fail(peek(), "expected " + what + " but found '" + peek().text + "'");
    return next();
  }

  // ---------------------------------------------------------------------------- expressions
  // Precedence climbing over C-like levels: || && (== !=) (< > <= >=) (+ -) (* / %) unary primary.
  static int binary_level(const std::string& op) {
    static const std::map<std::string, int> levels = {
        {"||", 1}, {"&&", 2}, {"==", 3}, {"!=", 3}, {"<", 4}, {">", 4}, {"<=", 4}, {">=", 4},
        {"+", 5},  {"-", 5},  {"*", 6},  {"/", 6},  {"%", 6}};
    auto it = levels.find(op);
    return it == levels.end() ? 0 : it->second;
  }

  // Expressions deeper than this are refused: every later stage walks expressions recursively, and ten
  // thousand nested parentheses, calls or chained terms (A + A + ...) would overflow the stack there.
  static constexpr int kMaxDepth = 256;
  int nesting_ = 0;
  struct Nesting {
    Parser& p;
    explicit Nesting(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxDepth)
        p.fail(p.peek(), "expression nested more than " + std::to_string(kMaxDepth) + " levels deep");
    }
    ~Nesting() { --p.nesting_; }
  };
  void set_depth(Ast& n) {
    for (const auto& a : n.args) n.depth = std::max(n.depth, a->depth + 1);
    if (n.depth > kMaxDepth)
      fail(n, "expression nested more than " + std::to_string(kMaxDepth) + " levels deep (split it into statements)");
  }

  AstPtr parse_expr(int min_level = 1) {
    AstPtr lhs = parse_unary();
    while (peek().kind == Tok::punct) {
      int level = binary_level(peek().text);
      if (level == 0 || level < min_level) break;
      std::string op = next().text;
      AstPtr rhs = parse_expr(level + 1);
      auto n = std::make_shared<Ast>();
      n->kind = Ast::Kind::binary;
      n->text = op;
      n->begin = lhs->begin;
      n->end = rhs->end;
      n->args = {lhs, rhs};
      set_depth(*n);
      lhs = n;
    }
    return lhs;
  }

  AstPtr parse_unary() {
    Nesting guard(*this);
    if (is("-") || is("!")) {
      const Token& t = next();
      AstPtr a = parse_unary();
      auto n = std::make_shared<Ast>();
      n->kind = Ast::Kind::unary;
      n->text = t.text;
      n->begin = t.offset;
      n->end = a->end;
      n->args = {a};
      set_depth(*n);
      return n;
    }
    if (accept("+")) return parse_unary();
    return parse_primary();
  }

  AstPtr parse_primary() {
    const Token& t = peek();
    auto n = std::make_shared<Ast>();
    n->begin = t.offset;
    if (t.kind == Tok::integer) {
      next();
      n->kind = Ast::Kind::integer;
      errno = 0;
      n->int_value = std::strtoll(t.text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(t, "integer literal " + t.text + " is too large");
      n->end = t.offset + t.text.size();
      return n;
    }
    if (t.kind == Tok::real) {
      next();
      n->kind = Ast::Kind::real;
      n->real_value = std::strtod(t.text.c_str(), nullptr);
      if (std::isinf(n->real_value)) fail(t, "real literal " + t.text + " is too large (beyond double precision)");
      n->end = t.offset + t.text.size();
      return n;
    }
    if (t.kind == Tok::ident) {
      next();
      n->text = t.text;
      n->end = t.offset + t.text.size();
      if (!accept("(")) {
        n->kind = Ast::Kind::ident;
        return n;
      }
      n->kind = Ast::Kind::call;
      if (!is(")")) {
        do n->args.push_back(parse_expr());
        while (accept(","));
      }
      n->end = peek().offset + 1;
      expect(")");
      set_depth(*n);
      return n;
    }
    if (accept("(")) {
      AstPtr inner = parse_expr();
      expect(")");
      return inner;
    }
    fail(t, "expected an expression but found '" + t.text + "'");
  }

  // ---------------------------------------------------------------------------- converters
  DimExpr to_dim(const Ast& a) const {
    switch (a.kind) {
      case Ast::Kind::integer: return DimExpr(a.int_value);
      case Ast::Kind::real: fail(a, "dim expressions are integers; found " + source_text(a));
      case Ast::Kind::ident:
        if (!dims_.count(a.text)) {
          if (tensors_.count(a.text)) fail(a, "tensor " + a.text + " cannot be used as a dim");
          fail(a, "undefined dim " + a.text);
        }
        return DimExpr::symbol(a.text);
      case Ast::Kind::unary:
        if (a.text == "-") return -to_dim(*a.args[0]);
        break;
      case Ast::Kind::binary: {
        DimExpr x = to_dim(*a.args[0]), y = to_dim(*a.args[1]);
        if (a.text == "+") return x + y;
        if (a.text == "-") return x - y;
        if (a.text == "*") return x * y;
        if (a.text == "/") {
          if (y.is_constant() && y.value() == 0) fail(a, "division by zero in " + source_text(a));
          return x / y;
        }
        break;
      }
      case Ast::Kind::call:
        if ((a.text == "max" || a.text == "min" || a.text == "div") && a.args.size() == 2) {
          DimExpr x = to_dim(*a.args[0]), y = to_dim(*a.args[1]);
          if (a.text == "max") return max(x, y);
          if (a.text == "min") return min(x, y);
          return x / y;
        }
        fail(a, "unknown dim function " + a.text + " (dims allow max(a, b), min(a, b), div(a, b))");
    }
    fail(a, "operator '" + a.text + "' is not allowed in the dim expression " + source_text(a));
  }

  Polynomial to_poly(const Ast& a) const {
    switch (a.kind) {
      case Ast::Kind::integer: return Polynomial(Rational(a.int_value));
      case Ast::Kind::real:
        fail(a, "index expressions take integer or rational coefficients; found " + source_text(a));
      case Ast::Kind::ident:
        if (dims_.count(a.text)) return Polynomial::dim(DimExpr::symbol(a.text));
        if (tensors_.count(a.text)) fail(a, "tensor " + a.text + " cannot be used in an index expression");
        return Polynomial::index(a.text);
      case Ast::Kind::unary:
        if (a.text == "-") return -to_poly(*a.args[0]);
        break;
      case Ast::Kind::binary: {
        Polynomial x = to_poly(*a.args[0]), y = to_poly(*a.args[1]);
        if (a.text == "+") return x + y;
        if (a.text == "-") return x - y;
        if (a.text == "*") {
          if (y.is_constant()) return x * y.constant();
          if (x.is_constant()) return y * x.constant();
          auto dx = x.dims_as_expr(), dy = y.dims_as_expr();
          if (dx && dy) return Polynomial::dim(*dx * *dy);
          if (x.has_index_vars() && y.has_index_vars())
            fail(a, "non-affine index expression " + source_text(a) + ": index variables may not be multiplied");
          fail(a, "index expression " + source_text(a) + " multiplies an index variable by a non-constant");
        }
        if (a.text == "/") {
          if (!y.is_constant())
            fail(a, "division by a non-constant in index expression " + source_text(a) +
                        " (for floor division of dims use div(a, b))");
          if (y.constant().is_zero()) fail(a, "division by zero in " + source_text(a));
          return x * (Rational(1) / y.constant());
        }
        break;
      }
      case Ast::Kind::call:
        if ((a.text == "max" || a.text == "min" || a.text == "div") && a.args.size() == 2)
          return Polynomial::dim(to_dim(a));
        fail(a, "function " + a.text + " is not allowed in an index expression (only div, max, min of dims)");
    }
    fail(a, "operator '" + a.text + "' is not allowed in the index expression " + source_text(a));
  }

  Expr to_expr(const Ast& a) const {
    switch (a.kind) {
      case Ast::Kind::integer:
        // Literal values are doubles (ir.h): every integer up to 2^53 is one exactly.
        if (a.int_value > (int64_t{1} << 53) || a.int_value < -(int64_t{1} << 53))
          fail(a, "integer literal " + source_text(a) + " is too large for a value (at most 2^53 in magnitude)");
        return Expr::literal(static_cast<double>(a.int_value), true);
      case Ast::Kind::real: return Expr::literal(a.real_value, false);
      case Ast::Kind::ident:
        if (tensors_.count(a.text)) return Expr::tensor(a.text);
        if (dims_.count(a.text)) return Expr::dim(a.text);
        fail(a, "undefined name " + a.text);
      case Ast::Kind::unary:
        return Expr::unary(a.text == "-" ? UnaryOp::neg : UnaryOp::logical_not, to_expr(*a.args[0]));
      case Ast::Kind::binary: {
        static const std::map<std::string, BinaryOp> ops = {
            {"+", BinaryOp::add}, {"-", BinaryOp::sub}, {"*", BinaryOp::mul}, {"/", BinaryOp::div},
            {"%", BinaryOp::mod}, {"==", BinaryOp::eq}, {"!=", BinaryOp::ne}, {"<", BinaryOp::lt},
            {">", BinaryOp::gt},  {"<=", BinaryOp::le}, {">=", BinaryOp::ge}, {"&&", BinaryOp::logical_and},
            {"||", BinaryOp::logical_or}};
        return Expr::binary(ops.at(a.text), to_expr(*a.args[0]), to_expr(*a.args[1]));
      }
      case Ast::Kind::call: {
        auto fn = parse_intrinsic(a.text);
        if (!fn) fail(a, "unknown intrinsic " + a.text);
        if (*fn == Intrinsic::cast) {
          if (a.args.size() != 2 || a.args[1]->kind != Ast::Kind::ident || !parse_dtype(a.args[1]->text))
            fail(a, "cast takes a value and a dtype (" + dtype_list() + "): " + source_text(a));
          return Expr::call(*fn, {to_expr(*a.args[0])}, *parse_dtype(a.args[1]->text));
        }
        if (static_cast<int>(a.args.size()) != intrinsic_arity(*fn))
          fail(a, "intrinsic " + a.text + " takes " + std::to_string(intrinsic_arity(*fn)) + " argument(s), got " +
                      std::to_string(a.args.size()));
        std::vector<Expr> args;
        for (const auto& x : a.args) args.push_back(to_expr(*x));
        return Expr::call(*fn, std::move(args));
      }
    }
    fail(a, "bad expression");
  }

  // ---------------------------------------------------------------------------- declarations
  Param parse_param() {
    Token name = expect_ident("an input name");
    if (tensors_.count(name.text)) fail(name, "input " + name.text + " is declared twice");
    declare_tensor(name);
    Param p{name.text, {}};
    expect("[");
    if (!is("]")) {
      do {
        AstPtr a = parse_expr(5);
        if (a->kind == Ast::Kind::ident && !dims_.count(a->text)) {
          if (tensors_.count(a->text)) fail(*a, "name " + a->text + " is used both as a dim and as a tensor");
          dims_.insert(a->text);  // first bare occurrence binds the dim
        }
        p.dims.push_back(to_dim(*a));
      } while (accept(","));
    }
    expect("]");
    tensors_[name.text] = p.dims.size();
    return p;
  }

  void declare_tensor(const Token& name) {
    if (tensors_.count(name.text)) fail(name, "tensor " + name.text + " is assigned more than once");
    if (dims_.count(name.text)) fail(name, "tensor " + name.text + " has the name of a dim");
    if (name.text == "function" || name.text == "default") fail(name, "'" + name.text + "' is a keyword");
  }

  TensorAccess parse_access() {
    Token name = expect_ident("a tensor access");
    auto it = tensors_.find(name.text);
    if (it == tensors_.end()) fail(name, "undefined tensor " + name.text);
    TensorAccess acc{name.text, {}};
    expect("[");
    if (!is("]")) {
      do acc.indices.push_back(to_poly(*parse_expr(5)));
      while (accept(","));
    }
    expect("]");
    if (acc.indices.size() != it->second)
      fail(name, "tensor " + name.text + " has rank " + std::to_string(it->second) + " but is indexed with " +
                     std::to_string(acc.indices.size()) + " index expression(s)");
    return acc;
  }

  Statement parse_statement() {
    Token name = expect_ident("a statement");
    declare_tensor(name);
    if (accept("=")) {
      AstPtr a = parse_expr();
      Elementwise e{name.text, to_expr(*a)};
      expect(";");
      std::vector<std::string> used;
      e.expr.collect_tensors(used);
      size_t rank = 0;
      for (const auto& t : used) rank = std::max(rank, tensors_.at(t));
      tensors_[name.text] = rank;
      return e;
    }
    if (!is("[")) fail(peek(), "expected '=' or '[' after " + name.text);
    next();
    Contraction c;
    c.output = name.text;
    if (!is("]") && !is(":")) {
      do c.output_indices.push_back(to_poly(*parse_expr(5)));
      while (accept(","));
    }
    if (accept(":")) {
      do c.output_shape.push_back(to_dim(*parse_expr(5)));
      while (accept(","));
    }
    const Token& close = peek();
    expect("]");
    if (c.output_indices.size() != c.output_shape.size())
      fail(close, "contraction " + name.text + " has " + std::to_string(c.output_indices.size()) +
                      " output indices but " + std::to_string(c.output_shape.size()) +
                      " dims (write O[i, j : N, M])");
    // "O[i] ==(A[i])" lexes the assign marker together with '='.
    if (accept("==")) {
      c.aggregation = AggregationOp::assign;
    } else {
      expect("=");
      const Token& m = peek();
      static const std::map<std::string, AggregationOp> markers = {{"+", AggregationOp::sum},
                                                                   {"*", AggregationOp::product},
                                                                   {">", AggregationOp::max},
                                                                   {"<", AggregationOp::min},
                                                                   {"=", AggregationOp::assign}};
      auto it = m.kind == Tok::punct ? markers.find(m.text) : markers.end();
      if (it == markers.end())
        fail(m, "expected an aggregation (+, *, >, <, =) for contraction " + name.text + " but found '" + m.text + "'");
      next();
      c.aggregation = it->second;
    }
    expect("(");
    c.inputs.push_back(parse_access());
    if (accept("*")) {
      c.combination = CombinationOp::mul;
      c.inputs.push_back(parse_access());
    } else if (accept("+")) {
      c.combination = CombinationOp::add;
      c.inputs.push_back(parse_access());
    } else if (accept("==")) {
      c.combination = CombinationOp::eq;
      c.inputs.push_back(parse_access());
      if (accept("?")) {
        c.combination = CombinationOp::cond;
        c.inputs.push_back(parse_access());
      }
    }
    if (!is(")"))
      fail(peek(), "expected ')' closing the combination of " + name.text + " (allowed: A, A * B, A + B, A == B, " +
                       "A == B ? C) but found '" + peek().text + "'");
    next();
    while (accept(",")) {
      AstPtr lhs = parse_expr(5);
      expect("<");
      AstPtr rhs = parse_expr(5);
      c.constraints.push_back({to_poly(*lhs), to_dim(*rhs)});
    }
    if (peek().kind == Tok::ident && peek().text == "default") {
      next();
      Token d = expect_ident("a default tensor");
      auto it = tensors_.find(d.text);
      if (it == tensors_.end()) fail(d, "undefined tensor " + d.text);
      if (it->second > c.output_indices.size())
        fail(d, "default tensor " + d.text + " has rank " + std::to_string(it->second) + ", more than the rank of " +
                    name.text);
      c.init = d.text;
    }
    expect(";");
    tensors_[name.text] = c.output_indices.size();
    return c;
  }

  const std::string& text_;
  std::string source_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::set<std::string> dims_;
  std::map<std::string, size_t> tensors_;  // name -> rank
};

}  // namespace

Program parse_program(const std::string& text, const std::string& source_name) {
  Parser p(text, source_name);
  return p.parse();
}

std::vector<Statement> parse_statements(const std::string& body, const Program& context, const std::string& source_name) {
  // The context's statements are re-parsed from their printed form ahead of the new ones; the new
  // statements' positions are reported relative to `body` by parsing it on its own lines at the end.
  Program header = context;
  std::string text = print(header);
  text.erase(text.rfind('}'));
  size_t before = header.statements.size();
  std::string full = text + body + "\n}\n";
  Program p;
  try {
    p = parse_program(full, source_name);
  } catch (const UserError& e) {
    // Re-map "source:LINE:COL" to lines of `body`.
    std::string msg = e.what();
    size_t lines_before = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    size_t a = msg.find(':', source_name.size()), b = msg.find(':', a + 1);
    if (msg.compare(0, source_name.size(), source_name) == 0 && a != std::string::npos && b != std::string::npos) {
      long line = std::strtol(msg.c_str() + a + 1, nullptr, 10) - static_cast<long>(lines_before);
      msg = source_name + ":" + std::to_string(std::max(line, 1L)) + msg.substr(b);
    }
    throw UserError(msg);
  }
  return std::vector<Statement>(p.statements.begin() + static_cast<long>(before), p.statements.end());
}

Program parse_file(const std::string& path) {
  return parse_program(internal::read_whole_file(path, "Tile file"), path);
}

}  // namespace polytile
