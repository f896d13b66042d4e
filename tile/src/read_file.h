// Reading a whole file a user names (a Tile program, a .npy array): one place for what can go wrong
// before its bytes are parsed.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "polytile/error.h"

namespace polytile::internal {

// The bytes of `path`; a UserError naming the `what` ("Tile file") and the path where it cannot be
// opened or is a directory (which opens as a stream that reads nothing).
inline std::string read_whole_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("cannot open ", what, " ", path);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) user_error("cannot read ", what, " ", path, ": it is a directory");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace polytile::internal
