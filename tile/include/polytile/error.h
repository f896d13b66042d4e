// Two error channels:
//  * UserError: something the user can fix (bad Tile text, shape mismatch, illegal aggregation, bad file).
//    The message names the user's object and, for text, carries "line:column".
//  * InternalError: a broken invariant inside polytile. Raised by POLYTILE_CHECK, which is always on.
// Neither ever calls exit(); the CLI maps them to exit codes 1 and 2.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace polytile {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void internal_check_failed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

// Throws UserError with the streamed arguments as the message.
template <typename... Args>
[[noreturn]] void user_error(Args&&... args) {
  throw UserError(detail::concat(std::forward<Args>(args)...));
}

}  // namespace polytile

#define POLYTILE_CHECK(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond))                                                                                \
      ::polytile::detail::internal_check_failed(#cond, __FILE__, __LINE__,                      \
                                                ::polytile::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
