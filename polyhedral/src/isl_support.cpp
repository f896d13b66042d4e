#include "polytile/isl_support.h"

#include <dlfcn.h>
#include <isl/fixed_box.h>
#include <isl/map.h>

#include <mutex>

namespace polytile::isl_support {

namespace {

// The shared object a function of this process was resolved to ("" when dladdr cannot say).
std::string library_of(void* function) {
  Dl_info info{};
  if (dladdr(function, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace

std::string isl_library() { return library_of(reinterpret_cast<void*>(&isl_ctx_alloc)); }

void check_one_isl() {
  static std::once_flag once;
  static std::string problem;
  std::call_once(once, [] {
    // libLLVM-16 exports the isl Polly bundles (0.24, IMath integers) under the same names as the system
    // libisl (0.25, GMP) polytile is compiled against. A program whose link line names libLLVM first gets
    // Polly's copy for most functions and the system one for those Polly lacks (the fixed boxes), which
    // then meet objects of the other copy, whose integers are laid out differently.
    const std::string core = isl_library();
    const std::string box = library_of(reinterpret_cast<void*>(&isl_map_get_range_simple_fixed_box_hull));
    if (core != box)
      problem = "isl is loaded from two libraries: isl_ctx_alloc from " + core +
                ", isl_map_get_range_simple_fixed_box_hull from " + box +
                " (libLLVM exports Polly's copy of isl: link libisl before libLLVM, as polytile::polyhedral's "
                "link options do)";
  });
  POLYTILE_CHECK(problem.empty(), problem);
}

}  // namespace polytile::isl_support
