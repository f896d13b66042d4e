// A structured random program generator for differential fuzzing: whole Tile programs with every
// aggregation (+ * > < =), every combination (none, mul, add, eq, cond), index expressions with rational
// coefficients and constant offsets, constraints (rational too), defaults, and elementwise chains with
// broadcasting over f32, f64, i32 and bool. Programs are well-formed Tile text; some are refused by the
// compiler (an assign that may write twice, an unbounded variable): the interpreter must refuse those too.
// With `differentiable`, only f64 tensors and ops that have derivatives everywhere the random data lands.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace polytile::testing::fuzz {

struct Generated {
  std::string text;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> dtypes;  // "f16", "f32", "f64", "i32", "i64", "bool"
};

class ProgramGenerator {
 public:
  ProgramGenerator(uint64_t seed, bool differentiable) : rng_(seed), diff_(differentiable) {}

  Generated next() {
    tensors_.clear();
    Generated g;
    std::ostringstream body;
    const int inputs = pick(1, 3);
    std::vector<std::string> params;
    for (int i = 0; i < inputs; ++i) {
      Tensor t;
      t.name = std::string(1, static_cast<char>('A' + i));
      int rank = pick(0, 3);
      for (int k = 0; k < rank; ++k) t.shape.push_back(pick(1, 5));
      t.dtype = diff_ ? "f64" : choose<std::string>({"f64", "f64", "f32", "i32", "bool", "i64", "f16"});
      std::vector<std::string> dims;
      for (size_t k = 0; k < t.shape.size(); ++k) dims.push_back(t.name + "D" + std::to_string(k));
      params.push_back(t.name + "[" + join(dims) + "]");
      g.shapes[t.name] = t.shape;
      g.dtypes[t.name] = t.dtype;
      tensors_.push_back(t);
    }
    const int statements = pick(1, 4);
    for (int s = 0; s < statements; ++s) {
      std::string name = "T" + std::to_string(s);
      body << "  " << (pick(0, 2) == 0 ? elementwise(name) : contraction(name)) << "\n";
    }
    g.text = "function (" + join(params) + ") -> (" + tensors_.back().name + ") {\n" + body.str() + "}\n";
    return g;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::string dtype;
  };

  int pick(int lo, int hi) { return lo + static_cast<int>(rng_() % static_cast<uint64_t>(hi - lo + 1)); }
  template <typename T>
  T choose(const std::vector<T>& v) { return v[rng_() % v.size()]; }
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  }
  const Tensor& any_tensor() { return tensors_[rng_() % tensors_.size()]; }

  // An affine index over `vars`: small integer coefficients, sometimes a rational one with an offset.
  std::string index(const std::vector<std::string>& vars) {
    std::string a = choose(vars);
    switch (pick(0, 5)) {
      case 0: return a + " + " + std::to_string(pick(0, 2));
      case 1: return a + " + " + choose(vars);
      case 2: return a + " - " + choose(vars) + " + " + std::to_string(pick(0, 3));
      case 3: return "(" + a + " + " + choose(vars) + " + " + std::to_string(pick(0, 2)) + ")/" + std::to_string(pick(2, 3));
      case 4: return std::to_string(pick(1, 2)) + "*" + a;
      default: return a;
    }
  }

  std::string contraction(const std::string& name) {
    std::vector<std::string> vars = {"i", "j", "k"};
    std::string agg = diff_ ? choose<std::string>({"+", "+", "*", ">", "<"}) : choose<std::string>({"+", "*", ">", "<", "="});
    // Combinations the autodiff handles: max/min/product of a single access; + of any.
    std::string combo = agg == "+" || !diff_ ? choose<std::string>({"none", "none", "mul", "add", "eq", "cond"}) : "none";
    if (diff_ && combo == "eq") combo = "mul";
    if (combo != "none" && agg != "+" && agg != "=" && diff_) combo = "none";
    int nin = combo == "none" ? 1 : combo == "cond" ? 3 : 2;
    std::vector<std::string> reads;
    for (int r = 0; r < nin; ++r) {
      const Tensor& t = any_tensor();
      std::vector<std::string> idx;
      for (size_t k = 0; k < t.shape.size(); ++k) idx.push_back(index(vars));
      reads.push_back(t.name + "[" + join(idx) + "]");
    }
    int orank = pick(0, 2);
    std::vector<std::string> out_idx, out_dims;
    Tensor out{name, {}, "f64"};
    for (int k = 0; k < orank; ++k) {
      out_idx.push_back(k == 0 && pick(0, 3) == 0 ? index(vars) : vars[static_cast<size_t>(k)]);
      out.shape.push_back(pick(1, 5));
      out_dims.push_back(std::to_string(out.shape.back()));
    }
    std::string combined = combo == "none" ? reads[0]
                           : combo == "mul" ? reads[0] + " * " + reads[1]
                           : combo == "add" ? reads[0] + " + " + reads[1]
                           : combo == "eq"  ? reads[0] + " == " + reads[1]
                                            : reads[0] + " == " + reads[1] + " ? " + reads[2];
    // Every variable bounded: a constraint on each one (sometimes rational), and sometimes another.
    std::vector<std::string> cons;
    for (const auto& v : vars)
      cons.push_back((pick(0, 4) == 0 ? "(" + v + " + 1)/2" : v) + " < " + std::to_string(pick(1, 4)));
    if (pick(0, 2) == 0) cons.push_back("i + j < " + std::to_string(pick(2, 5)));
    std::string text = name + "[" + join(out_idx) + (orank ? " : " + join(out_dims) : "") + "] = " + agg + "(" + combined + "), " + join(cons);
    if (pick(0, 4) == 0 && !(diff_ && (agg == "*" || agg == "=" || agg == ">" || agg == "<"))) {
      // A default broadcast to the output: a scalar input or a tensor of the output's shape.
      for (const auto& t : tensors_)
        if (t.shape.empty() || t.shape == out.shape) {
          text += " default " + t.name;
          break;
        }
    }
    tensors_.push_back(out);
    return text + ";";
  }

  std::string operand(const std::vector<int64_t>& shape, int depth) {
    // A tensor whose shape broadcasts into `shape` (the same, or a scalar), a literal, or a subexpression.
    std::vector<const Tensor*> fit;
    for (const auto& t : tensors_)
      if (t.shape == shape || t.shape.empty()) fit.push_back(&t);
    int what = pick(0, depth > 0 ? 4 : 2);
    if (what <= 1 && !fit.empty()) return fit[rng_() % fit.size()]->name;
    if (what == 2) return diff_ ? choose<std::string>({"0.5", "1.5", "2"}) : choose<std::string>({"0.5", "2", "3", "1.5"});
    return expression(shape, depth - 1);
  }

  std::string expression(const std::vector<int64_t>& shape, int depth) {
    std::string a = operand(shape, depth), b = operand(shape, depth);
    if (diff_) {
      switch (pick(0, 7)) {
        case 0: return "(" + a + " + " + b + ")";
        case 1: return "(" + a + " - " + b + ")";
        case 2: return "(" + a + " * " + b + ")";
        case 3: return "(" + a + " / (" + b + " * " + b + " + 1))";
        case 4: return "tanh(" + a + ")";
        case 5: return "exp(" + a + " * 0.25)";
        case 6: return "sqrt(" + a + " * " + a + " + 1)";
        default: return "select(" + a + " > " + b + ", " + a + ", " + b + " * 2)";
      }
    }
    switch (pick(0, 11)) {
      case 0: return "(" + a + " + " + b + ")";
      case 1: return "(" + a + " - " + b + ")";
      case 2: return "(" + a + " * " + b + ")";
      case 3: return "(" + a + " / " + b + ")";
      case 4: return "(" + a + " % " + b + ")";
      case 5: return "(" + a + " < " + b + ")";
      case 6: return "(" + a + " == " + b + " || " + a + " >= " + b + ")";
      case 7: return "max(" + a + ", " + b + ")";
      case 8: return "relu(" + a + ")";
      case 9: return "cast(" + a + ", " + choose<std::string>({"i32", "f32", "bool", "f64", "i64", "f16"}) + ")";
      case 10: return "select(" + a + " > " + b + ", " + a + ", " + b + ")";
      default: return "tanh(" + a + ")";
    }
  }

  std::string elementwise(const std::string& name) {
    const Tensor& base = any_tensor();
    Tensor out{name, base.shape, "f64"};
    std::string e = expression(base.shape, pick(1, 2));
    // Mention a tensor of the chosen shape so that the statement has it.
    e = "(" + e + " + " + base.name + " * 0)";
    if (diff_) e = "(" + e + " + " + base.name + ")";
    tensors_.push_back(out);
    return name + " = " + e + ";";
  }

  std::mt19937_64 rng_;
  bool diff_;
  std::vector<Tensor> tensors_;
};

}  // namespace polytile::testing::fuzz
