// Private to the scheduler: the builder of loop nests (isl schedule tree -> isl AST -> LoopNode) shared
// by scheduler.cpp (plain nests, the driver), ast.cpp (AST translation) and microkernel.cpp
// (register-blocked update nests). isl stays behind this header's users.
#pragma once

#include <isl/cpp.h>

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "polytile/isl_support.h"
#include "polytile/polyhedral.h"
#include "polytile/scheduler.h"

namespace polytile::sched::internal {

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ");
// "{ tuple[vars] : 0 <= var_k < shape_k }"
std::string box_text(const std::string& tuple, const std::vector<std::string>& vars, const std::vector<int64_t>& shape);
// An integral polynomial (dims bound) as isl affine text over positional variable names.
std::string affine_text(const Polynomial& p, const std::vector<std::string>& vars, const std::vector<std::string>& positional);

// Statement identity in the schedule trees: every statement's tuple id is one of these (the names are
// for printing only: S in plain nests; Z, L, F, T, E with a p suffix in predicated micro-kernel blocks),
// and the AST translator maps ids back to statement kinds. The "parallel" mark is matched by id too.
class StatementIds {
 public:
  explicit StatementIds(const isl::ctx& ctx);
  const isl::id& id(LoopNode::Statement kind, bool predicated = false) const;
  std::optional<std::pair<LoopNode::Statement, bool>> find(const isl::id& id) const;  // (kind, predicated)
  const isl::id parallel_mark;

 private:
  struct Entry {
    isl::id id;
    LoopNode::Statement kind;
    bool predicated;
  };
  std::vector<Entry> table_;
};

struct NestBuilder {
  explicit NestBuilder(const Target& t) : target(t) {}
  const Target& target;
  isl_support::IslContext ctx;
  StatementIds statements{ctx.get()};
  isl::set blocks_;         // the last micro-kernel's blocks, B[others, Bb, Bv]
  isl::map block_rows_;     // from a block to the points of S its rows and in-range lanes store

  // Builds schedule tree, AST and loop IR for one statement domain. `order` permutes the variables into
  // band order; the first `parallel` band members are marked parallel.
  void build(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
             const std::vector<size_t>& order, size_t parallel, size_t element_bytes, bool tiled = false,
             bool innermost_last = false, bool reduction_outer = false);
  // Generates the AST of `sched` into the nest; `safe`: schedule dims whose loops may run in parallel.
  void generate(Nest& nest, const isl::schedule& sched, const std::set<int>& safe);
  // The runtime splits the outer loop's range: the root must be a parallel loop with constant bounds, or
  // a block of such loops (isl splits the outermost dimension when statements cover different parts).
  static void finish_parallel(Nest& nest);
  // Schedules `nest` (an update of `c`) as a micro-kernel when the plan and the isl checks allow it; with
  // `uncovered`, blocks start from zero and it receives the output elements no block stores (a set over
  // S); `epilogue` is fused when given.
  bool try_microkernel(Nest& nest, const Contraction& c, const ProgramTypes& types, const poly::ContractionAnalysis& a,
                       const isl::set& domain, const std::vector<std::string>& positional, int64_t out_bytes,
                       isl::set* uncovered, const Elementwise* epilogue);
  // Schedules `nest` (an update of `c`) as a vectorized row reduction when `c` qualifies.
  bool try_row_reduction(Nest& nest, const Contraction& c, const ProgramTypes& types, const poly::ContractionAnalysis& a,
                         const isl::set& domain, const std::vector<std::string>& positional, bool parallel);
  void build_microkernel(Nest& nest, const isl::set& domain, const std::vector<std::string>& vars,
                         const std::vector<std::pair<int64_t, int64_t>>& range, bool parallel, bool weight_mode,
                         size_t element_bytes, const std::vector<std::string>& reads, bool zero_init, bool columns_only);
};

}  // namespace polytile::sched::internal
