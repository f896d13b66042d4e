// The `polytile` command line, as a function so tests can run it in-process.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace polytile {

// args excludes the program name. Returns the exit code: 0 success, 1 user error, 2 internal error.
// Errors are one line on `err`; results go to `out`.
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace polytile
