// Private to scheduler/: affine expressions over a named isl tuple and the maps between tuples, built
// through isl's API. isl's text parser turns every expression into piecewise affine arithmetic,
// intersections and hulls: building the micro-kernel nests' maps from isl text was a sixth of their
// scheduling time.
#pragma once

#include <isl/aff.h>
#include <isl/cpp.h>
#include <isl/map.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "polytile/error.h"
#include "polytile/isl_support.h"

namespace polytile::sched::internal {

// A tuple name[d0, d1, ...]: its dimensions by name, and affine expressions over them. A dimension named
// "" is unnamed (isl prints it as i<k>), as a tuple position given by an expression in isl text is.
class Tuple {
 public:
  Tuple(isl::ctx ctx, const std::string& name, std::vector<std::string> dims)
      : space_(isl_support::set_space(ctx, name, dims)), dims_(std::move(dims)) {}
  const isl::space& space() const { return space_; }
  const std::vector<std::string>& dims() const { return dims_; }

  size_t index(const std::string& dim) const {
    auto it = std::find(dims_.begin(), dims_.end(), dim);
    POLYTILE_CHECK(it != dims_.end() && !dim.empty(), "no dimension ", dim, " in a tuple");
    return static_cast<size_t>(it - dims_.begin());
  }
  isl::aff var(size_t k) const {
    return isl::manage(isl_aff_var_on_domain(isl_local_space_from_space(space_.copy()), isl_dim_set, static_cast<unsigned>(k)));
  }
  isl::aff var(const std::string& dim) const { return var(index(dim)); }
  // The points where lo <= dim <= hi.
  isl::set where(const std::string& dim, int64_t lo, int64_t hi) const {
    return isl_support::bound(isl::set::universe(space_), static_cast<unsigned>(index(dim)), lo, hi);
  }
  std::vector<isl::aff> vars(const std::vector<std::string>& dims) const {
    std::vector<isl::aff> out;
    for (const auto& d : dims) out.push_back(var(d));
    return out;
  }
  isl::aff constant(int64_t v) const {
    isl_local_space* ls = isl_local_space_from_space(space_.copy());
    return isl::manage(isl_aff_val_on_domain(ls, isl_val_int_from_si(space_.ctx().get(), v)));
  }

  // { this[dims] -> target[exprs] }: exprs are over this tuple, one per dimension of target.
  isl::map to(const Tuple& target, const std::vector<isl::aff>& exprs) const {
    POLYTILE_CHECK(exprs.size() == target.dims_.size(), "a map to a tuple of ", target.dims_.size(), " dims with ",
                   exprs.size(), " expressions");
    isl_space* s = isl_space_map_from_domain_and_range(space_.copy(), target.space_.copy());
    isl_aff_list* list = isl_aff_list_alloc(space_.ctx().get(), static_cast<int>(exprs.size()));
    for (const isl::aff& e : exprs) list = isl_aff_list_add(list, e.copy());
    return isl::manage(isl_map_from_multi_aff(isl_multi_aff_from_aff_list(s, list)));
  }

 private:
  isl::space space_;
  std::vector<std::string> dims_;
};

inline isl::aff plus(const isl::aff& a, int64_t c) {
  return isl::manage(isl_aff_add_constant_val(a.copy(), isl_val_int_from_si(a.ctx().get(), c)));
}
inline isl::aff times(const isl::aff& a, int64_t c) {
  return isl::manage(isl_aff_scale_val(a.copy(), isl_val_int_from_si(a.ctx().get(), c)));
}
// floor((a - lo) / d)
inline isl::aff floor_div(const isl::aff& a, int64_t lo, int64_t d) {
  isl_aff* shifted = isl_aff_add_constant_val(a.copy(), isl_val_int_from_si(a.ctx().get(), -lo));
  return isl::manage(isl_aff_floor(isl_aff_scale_down_val(shifted, isl_val_int_from_si(a.ctx().get(), d))));
}
// { name[vars] : 0 <= var_k < shape_k }
inline isl::set box(isl::ctx ctx, const std::string& name, const std::vector<std::string>& vars, const std::vector<int64_t>& shape) {
  isl::set s = isl::set::universe(isl_support::set_space(ctx, name, vars));
  for (size_t k = 0; k < vars.size(); ++k) s = isl_support::bound(s, static_cast<unsigned>(k), 0, shape[k] - 1);
  return s;
}

}  // namespace polytile::sched::internal
