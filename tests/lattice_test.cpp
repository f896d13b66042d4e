// Lattice contracts checked by brute force in small boxes: Hermite forms (A U = H, U unimodular, canonical
// under column operations), kernels, integer solutions, duals, integrality lattices; NTL failures and
// overflows surface as LatticeError.
#include <gtest/gtest.h>

#include <random>

#include "polytile/lattice.h"

namespace polytile::lattice {
namespace {

IntMatrix random_matrix(size_t m, size_t n, std::mt19937_64& rng, int range = 6) {
  IntMatrix A(m, n);
  for (size_t r = 0; r < m; ++r)
    for (size_t c = 0; c < n; ++c) A(r, c) = static_cast<int64_t>(rng() % (2 * range + 1)) - range;
  // Make some inputs rank-deficient: copy a combination of columns.
  if (n >= 2 && rng() % 3 == 0)
    for (size_t r = 0; r < m; ++r) A(r, n - 1) = 2 * A(r, 0) - A(r, 1);
  return A;
}

IntMatrix random_unimodular(size_t n, std::mt19937_64& rng) {
  IntMatrix V = IntMatrix::identity(n);
  for (int k = 0; k < 6 && n >= 2; ++k) {
    size_t a = rng() % n, b = rng() % n;
    if (a == b) continue;
    int64_t q = static_cast<int64_t>(rng() % 5) - 2;
    for (size_t r = 0; r < n; ++r) V(r, a) += q * V(r, b);
  }
  return V;
}

// Is x in the column lattice of H (in column Hermite form with the given pivots)? Independent of the
// library: peel off pivot columns in order.
bool in_hermite_lattice(const IntMatrix& H, const std::vector<size_t>& pivots, std::vector<int64_t> x) {
  for (size_t j = 0; j < pivots.size(); ++j) {
    size_t p = pivots[j];
    for (size_t row = (j ? pivots[j - 1] + 1 : 0); row < p; ++row)
      if (x[row] != 0) return false;
    if (x[p] % H(p, j) != 0) return false;
    int64_t q = x[p] / H(p, j);
    for (size_t r = 0; r < x.size(); ++r) x[r] -= q * H(r, j);
  }
  for (int64_t v : x)
    if (v != 0) return false;
  return true;
}

void expect_hermite_shape(const HermiteForm& h, const std::string& what) {
  for (size_t j = 0; j < h.H.cols(); ++j) {
    if (j >= h.rank) {
      for (size_t r = 0; r < h.H.rows(); ++r) ASSERT_EQ(h.H(r, j), 0) << what;
      continue;
    }
    size_t p = h.pivot_rows[j];
    if (j) {
      ASSERT_LT(h.pivot_rows[j - 1], p) << what;
    }
    for (size_t r = 0; r < p; ++r) ASSERT_EQ(h.H(r, j), 0) << what;
    ASSERT_GT(h.H(p, j), 0) << what;
    for (size_t l = 0; l < j; ++l) {
      ASSERT_GE(h.H(p, l), 0) << what;
      ASSERT_LT(h.H(p, l), h.H(p, j)) << what;
    }
  }
}

TEST(LatticeTest, HermiteFormContractOnRandomMatricesOfEveryShape) {
  const uint64_t seed = 7;
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 400; ++iter) {
    size_t m = 1 + rng() % 4, n = 1 + rng() % 5;
    IntMatrix A = random_matrix(m, n, rng);
    std::string what = "seed " + std::to_string(seed) + " iter " + std::to_string(iter) + " A = " + A.str();
    HermiteForm h = column_hermite(A);
    ASSERT_EQ(A * h.U, h.H) << what;
    ASSERT_EQ(std::abs(determinant(h.U)), 1) << what;
    expect_hermite_shape(h, what);
    // Canonical: the same lattice under any unimodular change of generators has the same H.
    IntMatrix V = random_unimodular(n, rng);
    ASSERT_EQ(column_hermite(A * V).H, h.H) << what << " V = " << V.str();
    // Every small combination of A's columns lies in H's lattice.
    for (int t = 0; t < 20; ++t) {
      std::vector<int64_t> y(n);
      for (auto& v : y) v = static_cast<int64_t>(rng() % 5) - 2;
      ASSERT_TRUE(in_hermite_lattice(h.H, h.pivot_rows, A * y)) << what;
    }
  }
}

TEST(LatticeTest, HermiteOfTheSeedConstraint) {
  // The post's reduced constraint 1/3*v1 - 2/3*v4, scaled: its lattice of integral points.
  HermiteForm h = column_hermite(IntMatrix{{1, -2}});
  EXPECT_EQ(h.H, (IntMatrix{{1, 0}}));
  EXPECT_EQ(h.rank, 1u);
}

TEST(LatticeTest, KernelBasisSpansExactlyTheIntegerKernel) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 200; ++iter) {
    size_t m = 1 + rng() % 3, n = 1 + rng() % 4;
    IntMatrix A = random_matrix(m, n, rng, 3);
    IntMatrix K = kernel_basis(A);
    std::string what = "A = " + A.str() + " K = " + K.str();
    ASSERT_EQ(K.rows(), n);
    ASSERT_TRUE((A * K) == IntMatrix(m, K.cols())) << what;
    HermiteForm hk = column_hermite(K);
    ASSERT_EQ(hk.rank, K.cols()) << what;  // independent columns
    // Brute force: every kernel point in a box is in the lattice, and nothing else is.
    std::vector<int64_t> x(n, -3);
    for (;;) {
      bool zero = true;
      for (int64_t v : A * x) zero &= v == 0;
      ASSERT_EQ(zero, in_hermite_lattice(hk.H, hk.pivot_rows, x)) << what;
      size_t k = 0;
      while (k < n && ++x[k] > 3) x[k++] = -3;
      if (k == n) break;
    }
  }
}

TEST(LatticeTest, SolveFindsIntegerSolutionsOrProvesNone) {
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 300; ++iter) {
    size_t m = 1 + rng() % 3, n = 1 + rng() % 4;
    IntMatrix A = random_matrix(m, n, rng, 5);
    std::vector<int64_t> x0(n);
    for (auto& v : x0) v = static_cast<int64_t>(rng() % 9) - 4;
    std::vector<int64_t> b = A * x0;
    auto x = solve(A, b);
    ASSERT_TRUE(x.has_value()) << A.str();
    ASSERT_EQ(A * *x, b) << A.str();
  }
  EXPECT_FALSE(solve(IntMatrix{{2, 4}}, {3}).has_value());
  EXPECT_FALSE(solve(IntMatrix{{2, 0}, {0, 3}}, {2, 4}).has_value());
  EXPECT_FALSE(solve(IntMatrix{{1, 1}, {1, 1}}, {1, 2}).has_value());  // inconsistent rows
  auto x = solve(IntMatrix{{6, 10, 15}}, {1});  // gcd 1: solvable though no coefficient is +-1
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(6 * (*x)[0] + 10 * (*x)[1] + 15 * (*x)[2], 1);
}

TEST(LatticeTest, DualBasisIsTheInverseTranspose) {
  std::mt19937_64 rng(17);
  for (int iter = 0; iter < 100; ++iter) {
    size_t n = 1 + rng() % 4;
    IntMatrix B = random_matrix(n, n, rng, 4);
    if (determinant(B) == 0) {
      EXPECT_THROW(dual_basis(B), LatticeError);
      continue;
    }
    RatMatrix D = dual_basis(B);
    IntMatrix P = B.transpose() * D.num;
    for (size_t r = 0; r < n; ++r)
      for (size_t c = 0; c < n; ++c) ASSERT_EQ(P(r, c), r == c ? D.den : 0) << B.str();
  }
}

TEST(LatticeTest, IntegralityLatticeMatchesBruteForce) {
  const uint64_t seed = 19;
  std::mt19937_64 rng(seed);
  int nonempty = 0, empty = 0;
  for (int iter = 0; iter < 300; ++iter) {
    size_t m = 1 + rng() % 3, n = 1 + rng() % 3;
    RatMatrix R{random_matrix(m, n, rng, 5), static_cast<int64_t>(1 + rng() % 6)};
    std::vector<int64_t> c(m);
    for (auto& v : c) v = static_cast<int64_t>(rng() % 7) - 3;
    if (rng() % 4 == 0)  // forms like 2x/4 + 1/4 have no integral point
      for (size_t k = 0; k < m; ++k) {
        for (size_t i = 0; i < n; ++i) R.num(k, i) = 2 * R.num(k, i);
        R.den = 4;
        c[k] = 1;
      }
    std::string what = "seed " + std::to_string(seed) + " iter " + std::to_string(iter) + " R = " + R.num.str() +
                       "/" + std::to_string(R.den);
    auto lat = integrality_lattice(R, c);
    if (lat) {
      ++nonempty;
      HermiteForm h = column_hermite(lat->basis);
      ASSERT_EQ(h.H, lat->basis) << what;  // already in Hermite form
      ASSERT_EQ(h.rank, n) << what;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_GE(lat->offset[i], 0) << what;
        ASSERT_LT(lat->offset[i], lat->basis(i, i)) << what;
      }
    } else {
      ++empty;
    }
    std::vector<int64_t> x(n, -6);
    for (;;) {
      bool integral = true;
      for (size_t k = 0; k < m; ++k) {
        int64_t s = c[k];
        for (size_t i = 0; i < n; ++i) s += R.num(k, i) * x[i];
        integral &= s % R.den == 0;
      }
      bool member = false;
      if (lat) {
        std::vector<int64_t> d(n);
        for (size_t i = 0; i < n; ++i) d[i] = x[i] - lat->offset[i];
        std::vector<size_t> pivots(n);
        for (size_t i = 0; i < n; ++i) pivots[i] = i;
        member = in_hermite_lattice(lat->basis, pivots, d);
      }
      ASSERT_EQ(integral, member) << what;
      size_t k = 0;
      while (k < n && ++x[k] > 6) x[k++] = -6;
      if (k == n) break;
    }
  }
  EXPECT_GT(nonempty, 100);
  EXPECT_GT(empty, 10);
}

TEST(LatticeTest, SeedExampleLattice) {
  // 1/3*v1 - 2/3*v4 integral  <=>  (v1, v4) in { v1 = t, v4 = 2t + 3s }.
  auto lat = integrality_lattice(RatMatrix{IntMatrix{{1, -2}}, 3}, {0});
  ASSERT_TRUE(lat.has_value());
  EXPECT_EQ(lat->basis, (IntMatrix{{1, 0}, {2, 3}}));
  EXPECT_EQ(lat->offset, (std::vector<int64_t>{0, 0}));
}

TEST(LatticeTest, UnimodularCompletionStartsWithTheGivenRows) {
  std::mt19937_64 rng(23);
  int completed = 0, refused = 0;
  for (int iter = 0; iter < 300; ++iter) {
    size_t n = 1 + rng() % 4, k = 1 + rng() % n;
    IntMatrix rows = random_matrix(k, n, rng, 4);
    auto full = unimodular_completion(rows);
    // Brute-force criterion: rows complete iff rows * Z^n == Z^k, i.e. the column Hermite form is [I 0].
    HermiteForm h = column_hermite(rows);
    bool saturated = h.rank == k;
    for (size_t j = 0; j < k && saturated; ++j) saturated = h.H(j, j) == 1 && h.pivot_rows[j] == j;
    for (size_t j = 0; j < k && saturated; ++j)
      for (size_t i = 0; i < k; ++i) saturated &= h.H(i, j) == (i == j ? 1 : 0);
    ASSERT_EQ(full.has_value(), saturated) << rows.str();
    if (!full) {
      ++refused;
      continue;
    }
    ++completed;
    ASSERT_EQ(std::abs(determinant(*full)), 1) << rows.str();
    for (size_t r = 0; r < k; ++r)
      for (size_t c = 0; c < n; ++c) ASSERT_EQ((*full)(r, c), rows(r, c)) << rows.str();
  }
  EXPECT_GT(completed, 50);
  EXPECT_GT(refused, 50);
  EXPECT_EQ(unimodular_completion(IntMatrix{{3, 2}})->str().substr(0, 8), "[[3, 2],");
  EXPECT_FALSE(unimodular_completion(IntMatrix{{2, 4}}).has_value());
}

TEST(LatticeTest, NtlErrorsAndOverflowsAreLatticeErrors) {
  try {
    determinant(IntMatrix(2, 3));
    FAIL() << "no error";
  } catch (const LatticeError& e) {
    EXPECT_EQ(e.kind(), LatticeError::Kind::ntl);
    EXPECT_NE(std::string(e.what()).find("NTL error"), std::string::npos) << e.what();
  }
  try {
    determinant(IntMatrix{{int64_t{1} << 40, 0}, {0, int64_t{1} << 40}});
    FAIL() << "no error";
  } catch (const LatticeError& e) {
    EXPECT_EQ(e.kind(), LatticeError::Kind::overflow);
  }
  EXPECT_THROW((IntMatrix{{INT64_MAX}} * IntMatrix{{2}}), LatticeError);
  EXPECT_THROW(solve(IntMatrix{{1}}, {1, 2}), LatticeError);
}

}  // namespace
}  // namespace polytile::lattice
