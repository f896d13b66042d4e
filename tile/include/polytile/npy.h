// NumPy .npy files (format versions 1.0-3.0, C order, little-endian): float32, float64, int32 and bool.
#pragma once

#include <string>

#include "polytile/buffer.h"

namespace polytile {

// UserError naming the file when it is missing, truncated, Fortran-ordered, big-endian or of another dtype.
Buffer read_npy(const std::string& path);
void write_npy(const std::string& path, const Buffer& buffer);

// The same on bytes (for tests and embedding).
Buffer parse_npy(const std::string& bytes, const std::string& what);
std::string format_npy(const Buffer& buffer);

}  // namespace polytile
