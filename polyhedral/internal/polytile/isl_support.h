// Build-internal (never installed, never included by a public header): the one RAII owner of an isl_ctx
// and the printing helper shared by the rooms that use isl (polyhedral, scheduler). isl objects must be
// destroyed before their IslContext, so declare the context first in every scope.
#pragma once

#include <isl/cpp.h>
#include <isl/options.h>

#include <sstream>
#include <string>

#include "polytile/error.h"

namespace polytile::isl_support {

class IslContext {
 public:
  IslContext() : raw_(isl_ctx_alloc()) {
    POLYTILE_CHECK(raw_ != nullptr, "isl_ctx_alloc failed");
    // The C++ bindings throw on errors; isl itself must continue (not abort, not print).
    isl_options_set_on_error(raw_, ISL_ON_ERROR_CONTINUE);
    // Loop generation: single upper bounds and min/max detection give simpler loops.
    isl_options_set_ast_build_atomic_upper_bound(raw_, 1);
    isl_options_set_ast_build_detect_min_max(raw_, 1);
  }
  ~IslContext() { isl_ctx_free(raw_); }
  IslContext(const IslContext&) = delete;
  IslContext& operator=(const IslContext&) = delete;
  isl::ctx get() const { return isl::ctx(raw_); }

 private:
  isl_ctx* raw_;
};

// isl's text form of any isl object.
template <typename T>
std::string text(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace polytile::isl_support
