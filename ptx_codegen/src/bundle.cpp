// Kernel bundles on disk: manifest.txt (read by people and by parse) and kernels.ptx.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "polytile/cuda_runtime.h"
#include "polytile/error.h"
#include "polytile/ir.h"

namespace polytile::cuda {

namespace {

constexpr const char* kHeader = "polytile kernel bundle 1";

const char* role_name(BundleBuffer::Role r) {
  switch (r) {
    case BundleBuffer::Role::input: return "input";
    case BundleBuffer::Role::output: return "output";
    case BundleBuffer::Role::scratch: return "scratch";
  }
  return "?";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? "x" : "") + std::to_string(shape[k]);
  return s;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) user_error("cannot read ", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `text` as a whole decimal integer in [lo, hi].
std::optional<int64_t> parse_integer(const std::string& text, int64_t lo, int64_t hi) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

// One manifest line's words, with the position for messages.
class Line {
 public:
  Line(std::string where, int number, const std::string& text) : where_(std::move(where)), number_(number) {
    std::istringstream in(text);
    for (std::string w; in >> w;) words_.push_back(w);
  }
  bool empty() const { return words_.empty() || words_[0][0] == '#'; }
  size_t size() const { return words_.size(); }
  const std::string& operator[](size_t k) const {
    if (k >= words_.size()) fail("too few fields");
    return words_[k];
  }
  int64_t integer(size_t k, int64_t lo, int64_t hi, const char* what) const {
    const std::string& w = (*this)[k];
    std::optional<int64_t> v = parse_integer(w, lo, hi);
    if (!v) fail(std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" + w + "'");
    return *v;
  }
  [[noreturn]] void fail(const std::string& why) const { user_error(where_, ":", number_, ": ", why); }

 private:
  std::string where_;
  int number_;
  std::vector<std::string> words_;
};

std::vector<int64_t> parse_shape(const Line& l, size_t k) {
  const std::string& w = l[k];
  std::vector<int64_t> shape;
  if (w == "scalar") return shape;
  std::istringstream in(w);
  for (std::string part; std::getline(in, part, 'x');) {
    std::optional<int64_t> v = parse_integer(part, 0, int64_t{1} << 40);
    if (!v) l.fail("shape '" + w + "' is not DIMxDIMx... of non-negative integers (or 'scalar')");
    shape.push_back(*v);
  }
  if (shape.empty()) l.fail("empty shape");
  return shape;
}

}  // namespace

std::string KernelBundle::manifest() const {
  std::ostringstream m;
  m << kHeader << "\n";
  m << "target " << target << "\n";
  for (const BundleBuffer& b : buffers)
    m << "buffer " << b.name << " " << role_name(b.role) << " " << to_string(b.type.dtype) << " " << shape_text(b.type.shape) << "\n";
  for (const BundleKernel& k : kernels) {
    m << "kernel " << k.name << " grid " << k.grid[0] << " " << k.grid[1] << " " << k.grid[2] << " block " << k.block[0] << " "
      << k.block[1] << " " << k.block[2] << " shared " << k.shared_bytes << " args";
    for (const std::string& a : k.args) m << " " << a;
    m << "\n";
  }
  return m.str();
}

void KernelBundle::write(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) user_error("cannot create the bundle directory ", dir, ": ", ec.message());
  for (const auto& [file, text] : {std::pair{"manifest.txt", manifest()}, std::pair{"kernels.ptx", ptx}}) {
    const std::filesystem::path p = std::filesystem::path(dir) / file;
    std::ofstream out(p, std::ios::binary);
    out << text;
    if (!out) user_error("cannot write ", p.string());
  }
}

KernelBundle KernelBundle::read(const std::string& dir) {
  const std::filesystem::path d(dir);
  if (!std::filesystem::is_directory(d)) user_error("kernel bundle ", dir, " is not a directory");
  return parse(read_file(d / "manifest.txt"), read_file(d / "kernels.ptx"), (d / "manifest.txt").string());
}

KernelBundle KernelBundle::parse(const std::string& manifest, std::string ptx, const std::string& where) {
  KernelBundle b;
  b.ptx = std::move(ptx);
  std::istringstream in(manifest);
  std::string text;
  int number = 0;
  bool header = false;
  std::map<std::string, size_t> buffer_index;
  std::set<std::string> kernel_names;
  while (std::getline(in, text)) {
    ++number;
    if (!header) {
      if (text != kHeader) Line(where, number, text).fail(std::string("not a kernel bundle manifest (the first line must be '") + kHeader + "')");
      header = true;
      continue;
    }
    Line l(where, number, text);
    if (l.empty()) continue;
    const std::string& what = l[0];
    if (what == "target") {
      if (l.size() != 2) l.fail("expected: target sm_XY");
      const std::string& t = l[1];
      bool digits = t.size() > 3 && t.rfind("sm_", 0) == 0 && t.find_first_not_of("0123456789", 3) == std::string::npos;
      if (!digits) l.fail("target '" + t + "' is not sm_XY");
      if (!b.target.empty()) l.fail("a second target");
      b.target = t;
    } else if (what == "buffer") {
      if (l.size() != 5) l.fail("expected: buffer NAME input|output|scratch DTYPE SHAPE");
      BundleBuffer buf;
      buf.name = l[1];
      if (buffer_index.count(buf.name)) l.fail("buffer " + buf.name + " is declared twice");
      if (l[2] == "input") buf.role = BundleBuffer::Role::input;
      else if (l[2] == "output") buf.role = BundleBuffer::Role::output;
      else if (l[2] == "scratch") buf.role = BundleBuffer::Role::scratch;
      else l.fail("buffer " + buf.name + ": role '" + l[2] + "' is not input, output or scratch");
      auto dtype = parse_dtype(l[3]);
      if (!dtype) l.fail("buffer " + buf.name + ": unknown dtype '" + l[3] + "'");
      buf.type = TensorType{*dtype, parse_shape(l, 4)};
      buffer_index[buf.name] = b.buffers.size();
      b.buffers.push_back(buf);
    } else if (what == "kernel") {
      BundleKernel k;
      k.name = l[1];
      if (!kernel_names.insert(k.name).second) l.fail("kernel " + k.name + " is declared twice");
      if (l.size() < 13 || l[2] != "grid" || l[6] != "block" || l[10] != "shared" || l[12] != "args")
        l.fail("expected: kernel NAME grid X Y Z block X Y Z shared BYTES args BUFFER...");
      for (size_t d = 0; d < 3; ++d) {
        k.grid[d] = l.integer(3 + d, 1, d == 0 ? (int64_t{1} << 31) - 1 : 65535, "grid size");
        k.block[d] = l.integer(7 + d, 1, d == 2 ? 64 : 1024, "block size");
      }
      if (k.block[0] * k.block[1] * k.block[2] > 1024) l.fail("kernel " + k.name + " has more than 1024 threads per block");
      k.shared_bytes = l.integer(11, 0, int64_t{1} << 20, "shared bytes");
      for (size_t a = 13; a < l.size(); ++a) {
        if (!buffer_index.count(l[a])) l.fail("kernel " + k.name + " takes buffer " + l[a] + ", which is not declared above");
        k.args.push_back(l[a]);
      }
      b.kernels.push_back(k);
    } else {
      l.fail("unknown field '" + what + "' (expected target, buffer or kernel)");
    }
  }
  if (!header) user_error(where, ": empty manifest");
  if (b.target.empty()) user_error(where, ": no target line");
  if (b.kernels.empty()) user_error(where, ": no kernel");
  for (const BundleKernel& k : b.kernels) {
    bool found = false;
    const std::string entry = ".entry " + k.name;
    for (size_t at = b.ptx.find(entry); at != std::string::npos && !found; at = b.ptx.find(entry, at + 1)) {
      const size_t next = at + entry.size();
      found = next < b.ptx.size() && (b.ptx[next] == '(' || std::isspace(static_cast<unsigned char>(b.ptx[next])));
    }
    if (!found) user_error(where, ": kernel ", k.name, " has no .entry in the bundle's PTX");
  }
  return b;
}

const BundleBuffer* KernelBundle::find(const std::string& name) const {
  for (const BundleBuffer& b : buffers)
    if (b.name == name) return &b;
  return nullptr;
}

const BundleBuffer& KernelBundle::buffer(const std::string& name, BundleBuffer::Role role) const {
  const BundleBuffer* b = find(name);
  if (!b) user_error("the bundle has no ", role_name(role), " ", name);
  if (b->role != role) {
    const std::string is = b->role == BundleBuffer::Role::scratch ? "scratch" : std::string("an ") + role_name(b->role);
    user_error("the bundle has no ", role_name(role), " ", name, " (it is ", is, ")");
  }
  return *b;
}

void KernelBundle::check_input(const std::string& name, const Buffer& value) const {
  const BundleBuffer& b = buffer(name, BundleBuffer::Role::input);
  if (value.dtype() != b.type.dtype || value.shape() != b.type.shape)
    user_error("input ", name, " must be ", b.type.str(), ", not ", TensorType{value.dtype(), value.shape()}.str());
}

void KernelBundle::check_inputs(const TensorMap& inputs) const {
  for (const auto& [name, value] : inputs) check_input(name, value);
  for (const BundleBuffer& b : buffers)
    if (b.role == BundleBuffer::Role::input && !inputs.count(b.name)) user_error("missing input ", b.name, " (", b.type.str(), ")");
}

}  // namespace polytile::cuda
