#include "polytile/error.h"

namespace polytile::detail {

void internal_check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::string text = concat("internal error: check '", cond, "' failed at ", file, ":", line);
  if (!msg.empty()) text += ": " + msg;
  throw InternalError(text);
}

}  // namespace polytile::detail
