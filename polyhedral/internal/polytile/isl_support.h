// Build-internal (never installed, never included by a public header): the one RAII owner of an isl_ctx
// and the printing helper shared by the rooms that use isl (polyhedral, scheduler). isl objects must be
// destroyed before their IslContext, so declare the context first in every scope.
#pragma once

#include <isl/ast_build.h>
#include <isl/cpp.h>
#include <isl/options.h>

#include <sstream>
#include <string>
#include <vector>

#include "polytile/error.h"

namespace polytile::isl_support {

// The shared object this process runs isl from (its isl_ctx_alloc).
std::string isl_library();
// Throws InternalError, naming both, when isl's functions come from two libraries (libLLVM's copy of
// isl first on the link line); checked once per process, by the first IslContext.
void check_one_isl();

class IslContext {
 public:
  IslContext() : raw_((check_one_isl(), isl_ctx_alloc())) {
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

// The C calls the isl 0.25 C++ bindings lack, wrapped once so that every other use of isl is RAII.
inline isl::set set_tuple_id(isl::set s, const isl::id& id) {
  return isl::manage(isl_set_set_tuple_id(s.release(), id.copy()));
}
// Drops every constraint on set dimension `pos` (the dimension stays, unbounded).
inline isl::set eliminate(isl::set s, unsigned pos) {
  return isl::manage(isl_set_eliminate(s.release(), isl_dim_set, pos, 1));
}

// The points of `s` whose set dimension `pos` lies in [lo, hi].
inline isl::set bound(isl::set s, unsigned pos, int64_t lo, int64_t hi) {
  isl_ctx* ctx = isl_set_get_ctx(s.get());
  isl_set* b = isl_set_lower_bound_val(s.release(), isl_dim_set, pos, isl_val_int_from_si(ctx, lo));
  return isl::manage(isl_set_upper_bound_val(b, isl_dim_set, pos, isl_val_int_from_si(ctx, hi)));
}

// The map without input dimension `pos` (projected out: related where some value of it relates).
inline isl::map project_out_input(isl::map m, unsigned pos) {
  return isl::manage(isl_map_project_out(m.release(), isl_dim_in, pos, 1));
}
// The map without output dimension `pos`.
inline isl::map project_out_output(isl::map m, unsigned pos) {
  return isl::manage(isl_map_project_out(m.release(), isl_dim_out, pos, 1));
}
// A band's partial schedule from a union map (one piece per statement).
inline isl::multi_union_pw_aff partial_schedule(const isl::union_map& m) {
  return isl::manage(isl_multi_union_pw_aff_from_union_map(m.copy()));
}
// The space of unnamed sets with `dims` dimensions.
inline isl::space set_space(isl::ctx ctx, unsigned dims) {
  return isl::manage(isl_space_set_alloc(ctx.get(), 0, dims));
}
// The space of sets name[dims...] ("" leaves the tuple or a dimension unnamed).
inline isl::space set_space(isl::ctx ctx, const std::string& name, const std::vector<std::string>& dims) {
  isl_space* s = isl_space_set_alloc(ctx.get(), 0, static_cast<unsigned>(dims.size()));
  if (!name.empty()) s = isl_space_set_tuple_name(s, isl_dim_set, name.c_str());
  for (size_t k = 0; k < dims.size(); ++k)
    if (!dims[k].empty()) s = isl_space_set_dim_name(s, isl_dim_set, static_cast<unsigned>(k), dims[k].c_str());
  return isl::manage(s);
}
// The number of schedule dimensions above a node: the first loop a band at `n` generates is c<depth>.
inline int schedule_depth(const isl::schedule_node& n) { return isl_schedule_node_get_schedule_depth(n.get()); }
inline isl::id mark_id(const isl::schedule_node& mark) { return isl::manage(isl_schedule_node_mark_get_id(mark.get())); }
inline isl::schedule_node delete_node(isl::schedule_node n) {
  return isl::manage(isl_schedule_node_delete(n.release()));
}
// An AST build whose loop over schedule dimension k has iterator ids[k].
inline isl::ast_build with_iterators(isl::ast_build build, const std::vector<isl::id>& ids) {
  isl::id_list list(build.ctx(), static_cast<int>(ids.size()));
  for (const isl::id& id : ids) list = list.add(id);
  return isl::manage(isl_ast_build_set_iterators(build.release(), list.release()));
}

// Parts joined by `sep`, for building isl text (tuples, constraint lists).
inline std::string join(const std::vector<std::string>& parts, const std::string& sep = ", ") {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
  return s;
}

// isl's text form of any isl object.
template <typename T>
std::string text(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace polytile::isl_support
