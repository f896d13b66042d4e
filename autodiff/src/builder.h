// Private: a Program under construction for the differentiation passes. It starts as a copy of the
// forward program, knows the symbolic shape of every tensor (broadcast dims are max(a, b), exact because
// broadcasting only pairs equal sizes or 1 with n), hands out fresh names, and offers the few building
// blocks every rule needs: elementwise statements, sums of contributions, zeros, and the adjoint of
// broadcasting (a sum over the broadcast dims).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "polytile/ir.h"

namespace polytile::ad {

std::vector<DimExpr> broadcast(const std::vector<DimExpr>& a, const std::vector<DimExpr>& b);

class Builder {
 public:
  explicit Builder(const Program& forward);

  Program program;
  std::map<std::string, std::vector<DimExpr>> shapes;

  std::string fresh(const std::string& base);
  bool taken(const std::string& name) const { return names_.count(name) != 0; }
  void reserve(const std::string& name) { names_.insert(name); }

  // Appends a statement whose output name is already fresh; records its shape.
  const std::string& add(Statement s);
  std::string elementwise(const std::string& base, const Expr& e);
  std::vector<DimExpr> expr_shape(const Expr& e) const;

  // parts[0] + parts[1] + ...; the single part itself when there is one.
  std::string sum(const std::vector<std::string>& parts, const std::string& base);
  // A tensor of zeros shaped prefix + shape(like), with like's dtype.
  std::string zeros(const std::string& like, const std::vector<DimExpr>& prefix, const std::string& base);
  // Sums `name` (shape `from`) down to `to` (numpy broadcasting in reverse). Both start with the same
  // prefix of `prefix_rank` dims.
  std::string unbroadcast(const std::string& name, const std::vector<DimExpr>& to, size_t prefix_rank,
                          const std::string& base);
  // Index variable names for `n` prefix dims not clashing with `used`.
  static std::vector<std::string> prefix_indices(size_t n, const std::set<std::string>& used);

  // A tensor of ones shaped like `tensor` (its elements' values never matter, NaN included).
  std::string ones(const std::string& tensor);
  // The bounds an access imposed, for a contraction that no longer reads it: constraints when its index
  // expressions are integral, else a read of a ones tensor at the same indices (turning `comb` into mul).
  void keep_bounds(const TensorAccess& a, std::vector<Constraint>& extra, std::vector<TensorAccess>& body,
                   CombinationOp& comb);

  // Renames the output of the last statement (a no-op when it already has that name).
  void rename_last(const std::string& name) { rename(program.statements.back(), name); }

  // Gives `value`'s statement the output name `name` when `value` is a statement output that no other
  // statement reads; otherwise appends name = ident(value).
  void bind_name(const std::string& value, const std::string& name);

  // Drops statements that no output depends on.
  void eliminate_dead_code();

 private:
  void rename(Statement& st, const std::string& name);
  std::set<std::string> names_;
};

}  // namespace polytile::ad
