#include "polytile/npy.h"

#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "polytile/error.h"
#include "read_file.h"

namespace polytile {
namespace {

std::string dict_value(const std::string& header, const std::string& key, const std::string& what) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) user_error(what, ": .npy header has no '", key, "' entry");
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) user_error(what, ": malformed .npy header");
  size_t start = header.find_first_not_of(" ", colon + 1);
  if (start == std::string::npos) user_error(what, ": malformed .npy header");
  size_t end;
  if (header[start] == '(') {
    end = header.find(')', start);
    if (end == std::string::npos) user_error(what, ": malformed shape in .npy header");
    return header.substr(start, end - start + 1);
  }
  if (header[start] == '\'') {
    end = header.find('\'', start + 1);
    if (end == std::string::npos) user_error(what, ": malformed .npy header");
    return header.substr(start + 1, end - start - 1);
  }
  end = header.find_first_of(",}", start);
  return header.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// NumPy's little-endian type string of a dtype.
const char* npy_descr(DType t) {
  switch (t) {
    case DType::f16: return "<f2";
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::boolean: return "|b1";
  }
  return "";
}

}  // namespace

Buffer parse_npy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) user_error(what, " is not a .npy file");
  unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) user_error(what, " is truncated");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    offset = 12;
  } else {
    user_error(what, ": unsupported .npy format version ", major);
  }
  if (bytes.size() < offset + header_len) user_error(what, " is truncated (header)");
  std::string header = bytes.substr(offset, header_len);
  std::string descr = dict_value(header, "descr", what);
  std::string fortran = dict_value(header, "fortran_order", what);
  std::string shape_text = dict_value(header, "shape", what);
  if (fortran.find("True") != std::string::npos)
    user_error(what, ": Fortran-ordered arrays are not supported; save with numpy.ascontiguousarray");
  std::optional<DType> dtype;
  for (DType t : kDTypes)
    if (descr == npy_descr(t)) dtype = t;
  if (!dtype)
    user_error(what, ": unsupported dtype '", descr,
               "' (supported: float16 <f2, float32 <f4, float64 <f8, int32 <i4, int64 <i8, bool |b1)");
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')')
    user_error(what, ": malformed shape '", shape_text, "' in .npy header (expected a tuple such as (2, 3))");
  std::vector<int64_t> shape;
  std::string inner = shape_text.substr(1, shape_text.size() - 2);
  std::stringstream ss(inner);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" ");
    if (a == std::string::npos) continue;
    item = item.substr(a, item.find_last_not_of(" L") - a + 1);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      shape.push_back(v);
    } catch (const std::exception&) {
      user_error(what, ": bad shape entry '", item, "' in .npy header");
    }
  }
  // The data must be there before anything is allocated: a header may claim any shape.
  const size_t data = offset + header_len;
  const size_t available = bytes.size() - data;
  const size_t element = dtype_bytes(*dtype);
  size_t needed = element;
  for (int64_t d : shape) {
    if (d != 0 && needed > available / static_cast<size_t>(d)) {
      needed = available + 1;  // more than there is; stop before the product overflows
      break;
    }
    needed *= static_cast<size_t>(d);
  }
  for (int64_t d : shape)
    if (d == 0) needed = 0;
  if (needed > available) {
    std::string dims;
    for (size_t k = 0; k < shape.size(); ++k) dims += (k ? ", " : "") + std::to_string(shape[k]);
    user_error(what, " is truncated: its header claims shape (", dims, ") of ", to_string(*dtype), " but only ", available,
               " data bytes follow");
  }
  Buffer b(*dtype, shape);
  if (b.byte_size() > 0) std::memcpy(b.data(), bytes.data() + data, b.byte_size());  // an empty array has no storage
  return b;
}

std::string format_npy(const Buffer& b) {
  const char* descr = npy_descr(b.dtype());
  std::string shape = "(";
  for (size_t i = 0; i < b.rank(); ++i) shape += std::to_string(b.shape()[i]) + (b.rank() == 1 || i + 1 < b.rank() ? "," : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(static_cast<const char*>(b.data()), b.byte_size());
  return out;
}

Buffer read_npy(const std::string& path) {
  return parse_npy(internal::read_whole_file(path, ".npy file"), path);
}

void write_npy(const std::string& path, const Buffer& buffer) {
  std::ofstream out(path, std::ios::binary);
  if (!out) user_error("cannot write .npy file ", path);
  std::string bytes = format_npy(buffer);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) user_error("failed writing .npy file ", path);
}

}  // namespace polytile
