// NumPy .npz archives (np.savez, np.savez_compressed): a zip of .npy files, read with libzip.
#pragma once

#include <map>
#include <string>

#include "polytile/buffer.h"

namespace polytile {

// Every array in the archive by its name (the member's name without ".npy"), each parsed as a .npy file
// (npy.h's dtypes and layouts). UserError naming the file, and the member where one is at fault, for a
// file that cannot be opened or is not a zip archive, a damaged member, a member that is not a .npy
// file, and two members of one name.
std::map<std::string, Buffer> read_npz(const std::string& path);

}  // namespace polytile
