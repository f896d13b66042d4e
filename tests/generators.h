// Random contraction generators shared by the property tests: input gradients of strided, dilated, padded,
// grouped convolutions (ranks up to 7), transposed convolutions and unpooling, rational index
// expressions. Each returns Tile text and input shapes.
#pragma once

#include <algorithm>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace polytile::testing::generators {

struct Case {
  std::string text;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string kind;
};

inline int64_t pick(std::mt19937_64& rng, int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % (hi - lo + 1)); }

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

inline std::string affine(int64_t a, const std::string& x, int64_t b, const std::string& k, int64_t c) {
  std::ostringstream os;
  os << a << "*" << x << " + " << b << "*" << k;
  if (c > 0) os << " - " << c;
  if (c < 0) os << " + " << -c;
  return os.str();
}

// The input gradient of a strided, dilated, padded, optionally grouped convolution with an optional
// extra "head" axis (ranks up to 7), written by flipping I and O as in the post.
inline Case conv_input_gradient(std::mt19937_64& rng) {
  int dims = static_cast<int>(pick(rng, 1, 3));
  bool grouped = pick(rng, 0, 1), heads = dims == 3 && pick(rng, 0, 1);
  int64_t n = pick(rng, 1, 2), g = grouped ? 2 : 1, ci = pick(rng, 1, 2), co = pick(rng, 1, 2), h = heads ? 2 : 1;
  std::vector<std::string> di, dout, k, out_dims;
  std::vector<int64_t> di_shape, do_shape, k_shape;
  di.push_back("n");
  dout.push_back("n");
  out_dims.push_back("N");
  di_shape.push_back(n);
  do_shape.push_back(n);
  if (heads) {
    di.push_back("h");
    dout.push_back("h");
    out_dims.push_back("2");
    di_shape.push_back(h);
    do_shape.push_back(h);
  }
  for (int s = 0; s < dims; ++s) {
    int64_t stride = pick(rng, 1, 4), dil = pick(rng, 1, 4), ks = pick(rng, 1, 3);
    int64_t size = pick(rng, dims == 3 ? 3 : 4, dims == 3 ? 6 : 9), pad = pick(rng, 0, dil * (ks - 1));
    int64_t out = std::max<int64_t>(1, (size + 2 * pad - dil * (ks - 1) - 1) / stride + 1);
    std::string x = "x" + std::to_string(s), kk = "k" + std::to_string(s);
    di.push_back(affine(stride, x, dil, kk, pad));
    dout.push_back(x);
    k.push_back(kk);
    out_dims.push_back(std::to_string(size));
    di_shape.push_back(size);
    do_shape.push_back(out);
    k_shape.push_back(ks);
  }
  if (grouped) {
    for (auto* v : {&di, &dout, &k}) v->push_back("g");
    out_dims.push_back("2");
    di_shape.push_back(g);
    do_shape.push_back(g);
    k_shape.push_back(g);
  }
  if (heads) {
    k.insert(k.begin(), "h");
    k_shape.insert(k_shape.begin(), h);
  }
  di.push_back("ci");
  out_dims.push_back("CI");
  di_shape.push_back(ci);
  dout.push_back("co");
  do_shape.push_back(co);
  k.push_back("ci");
  k.push_back("co");
  k_shape.push_back(ci);
  k_shape.push_back(co);
  std::vector<std::string> do_decl, k_decl;
  for (size_t i = 0; i < do_shape.size(); ++i) do_decl.push_back("D" + std::to_string(i));
  for (size_t i = 0; i < k_shape.size(); ++i) k_decl.push_back(i + 2 == k_shape.size() ? "CI" : "E" + std::to_string(i));
  do_decl[0] = "N";
  std::string text = "function (DO[" + join(do_decl) + "], K[" + join(k_decl) + "]) -> (DI) {\n  DI[" + join(di) +
                     " : " + join(out_dims) + "] = +(DO[" + join(dout) + "] * K[" + join(k) + "]);\n}\n";
  return {text, {{"DO", do_shape}, {"K", k_shape}}, "conv input gradient " + std::to_string(dims) + "d"};
}

// Transposed convolution / unpooling: O[s*x + k] = +(I[x] * K[k]) or +(I[x]), k < s.
inline Case transposed(std::mt19937_64& rng) {
  int dims = static_cast<int>(pick(rng, 1, 2));
  bool unpool = pick(rng, 0, 1);
  std::vector<std::string> o, i, k, od, cons;
  std::vector<int64_t> i_shape, k_shape;
  for (int s = 0; s < dims; ++s) {
    int64_t stride = pick(rng, 1, 4), ks = pick(rng, 1, 4), size = pick(rng, 2, 6);
    std::string x = "x" + std::to_string(s), kk = "k" + std::to_string(s);
    o.push_back(std::to_string(stride) + "*" + x + " + " + kk);
    i.push_back(x);
    k.push_back(kk);
    od.push_back(std::to_string(stride * size + pick(rng, -1, 2)));
    i_shape.push_back(size);
    k_shape.push_back(ks);
    if (unpool) cons.push_back(kk + " < " + std::to_string(stride));
  }
  std::vector<std::string> idecl, kdecl;
  for (int s = 0; s < dims; ++s) {
    idecl.push_back("X" + std::to_string(s));
    kdecl.push_back("KS" + std::to_string(s));
  }
  std::string body = unpool ? "+(I[" + join(i) + "])" : "+(I[" + join(i) + "] * K[" + join(k) + "])";
  std::string text = "function (I[" + join(idecl) + "]" + (unpool ? "" : ", K[" + join(kdecl) + "]") + ") -> (O) {\n  O[" +
                     join(o) + " : " + join(od) + "] = " + body + (cons.empty() ? "" : ", " + join(cons)) + ";\n}\n";
  Case c{text, {{"I", i_shape}}, unpool ? "unpooling" : "transposed conv"};
  if (!unpool) c.shapes["K"] = k_shape;
  return c;
}

// Rational index expressions: O[i] = +(I[(a*i - j + c)/q]), j < w.
inline Case rational(std::mt19937_64& rng) {
  int64_t q = pick(rng, 2, 4), a = pick(rng, 1, 3), c = pick(rng, 0, 3), w = pick(rng, 1, 4), n = pick(rng, 3, 8);
  std::ostringstream os;
  os << "function (I[N]) -> (O) {\n  O[i : " << pick(rng, 2, 12) << "] = +(I[(" << a << "*i - j + " << c << ")/" << q
     << "]), j < " << w << ";\n}\n";
  return {os.str(), {{"I", {n}}}, "rational"};
}

// Rational output indices with constant offsets and rational constraints, as gradients of rational
// accesses produce: O[(a*l + b*k + c)/q : n] = +(F[l] * G[k]), l < w, k/r < m.
inline Case rational_output(std::mt19937_64& rng) {
  int64_t q = pick(rng, 2, 4), a = pick(rng, 1, 3), b = pick(rng, -2, 2), c = pick(rng, -3, 3), r = pick(rng, 1, 3);
  if (b == 0) b = 1;
  std::ostringstream os;
  os << "function (F[L], G[K]) -> (O) {\n  O[(" << a << "*l + " << b << "*k + " << c << ")/" << q << " : " << pick(rng, 2, 9)
     << "] = +(F[l] * G[k]), l < " << pick(rng, 1, 4) << ", k/" << r << " < " << pick(rng, 1, 3) << ";\n}\n";
  return {os.str(), {{"F", {pick(rng, 3, 6)}}, {"G", {pick(rng, 3, 7)}}}, "rational output"};
}

// One of the above, chosen at random.
inline Case any_case(std::mt19937_64& rng) {
  int which = static_cast<int>(rng() % 5);
  return which <= 1 ? conv_input_gradient(rng) : which == 2 ? transposed(rng) : which == 3 ? rational(rng) : rational_output(rng);
}

}  // namespace polytile::testing::generators
