// Lattice algorithms on NTL big integers. The column Hermite form is computed here by extended-gcd column
// operations because NTL's HNF() neither returns the transform nor accepts wide or rank-deficient input
// (it crashes on wide matrices and is silently wrong with a bad determinant multiple); NTL supplies the
// arithmetic, determinants and inverses. Every NTL call runs under NtlErrors, which turns NTL's
// abort-on-error into a LatticeError.
#include "polytile/lattice.h"

#include <NTL/ZZ.h>
#include <NTL/mat_ZZ.h>
#include <NTL/tools.h>

#include <numeric>
#include <sstream>

namespace polytile::lattice {
namespace {

using NTL::mat_ZZ;
using NTL::ZZ;

[[noreturn]] void throw_ntl_error(const char* message) {
  throw LatticeError(LatticeError::Kind::ntl, std::string("NTL error: ") + message);
}

// Installs the throwing callback for the current thread for the guard's lifetime.
class NtlErrors {
 public:
  NtlErrors() : previous_(NTL::ErrorMsgCallback) { NTL::ErrorMsgCallback = &throw_ntl_error; }
  ~NtlErrors() { NTL::ErrorMsgCallback = previous_; }
  NtlErrors(const NtlErrors&) = delete;
  NtlErrors& operator=(const NtlErrors&) = delete;

 private:
  void (*previous_)(const char*);
};

int64_t to_int64(const ZZ& z, const char* what) {
  if (NTL::NumBits(z) > 63) {
    std::ostringstream os;
    os << what << ": value " << z << " does not fit in 64 bits";
    throw LatticeError(LatticeError::Kind::overflow, os.str());
  }
  return NTL::conv<long>(z);
}

mat_ZZ to_ntl(const IntMatrix& A) {
  mat_ZZ M;
  M.SetDims(static_cast<long>(A.rows()), static_cast<long>(A.cols()));
  for (size_t r = 0; r < A.rows(); ++r)
    for (size_t c = 0; c < A.cols(); ++c) M[r][c] = NTL::conv<ZZ>(static_cast<long>(A(r, c)));
  return M;
}

IntMatrix from_ntl(const mat_ZZ& M, const char* what) {
  IntMatrix A(static_cast<size_t>(M.NumRows()), static_cast<size_t>(M.NumCols()));
  for (size_t r = 0; r < A.rows(); ++r)
    for (size_t c = 0; c < A.cols(); ++c) A(r, c) = to_int64(M[r][c], what);
  return A;
}

// col_a <- s*col_a + t*col_b ; col_b <- u*col_a + v*col_b  (on both M and U)
void column_op(mat_ZZ& M, long a, long b, const ZZ& s, const ZZ& t, const ZZ& u, const ZZ& v) {
  for (long r = 0; r < M.NumRows(); ++r) {
    ZZ x = M[r][a], y = M[r][b];
    M[r][a] = s * x + t * y;
    M[r][b] = u * x + v * y;
  }
}

void add_column_multiple(mat_ZZ& M, long dst, long src, const ZZ& q) {  // col_dst -= q * col_src
  if (NTL::IsZero(q)) return;
  for (long r = 0; r < M.NumRows(); ++r) M[r][dst] -= q * M[r][src];
}

ZZ floor_div(const ZZ& a, const ZZ& b) {
  ZZ q, r;
  NTL::DivRem(q, r, a, b);  // NTL's DivRem floors for positive b
  return q;
}

struct NtlHermite {
  mat_ZZ H, U;
  std::vector<size_t> pivots;
};

NtlHermite hermite_ntl(const mat_ZZ& A) {
  NtlHermite h;
  h.H = A;
  long n = A.NumCols();
  NTL::ident(h.U, n);
  long k = 0;
  for (long i = 0; i < A.NumRows() && k < n; ++i) {
    for (long j = k + 1; j < n; ++j) {
      if (NTL::IsZero(h.H[i][j])) continue;
      ZZ a = h.H[i][k], b = h.H[i][j], g, s, t;
      NTL::XGCD(g, s, t, a, b);  // g = s*a + t*b
      ZZ u = -(b / g), v = a / g;  // [[s, u], [t, v]] has determinant s*v - t*u = (s*a + t*b)/g = 1
      column_op(h.H, k, j, s, t, u, v);
      column_op(h.U, k, j, s, t, u, v);
    }
    if (NTL::IsZero(h.H[i][k])) continue;
    if (h.H[i][k] < 0) {
      for (long r = 0; r < h.H.NumRows(); ++r) NTL::negate(h.H[r][k], h.H[r][k]);
      for (long r = 0; r < n; ++r) NTL::negate(h.U[r][k], h.U[r][k]);
    }
    for (long l = 0; l < k; ++l) {
      ZZ q = floor_div(h.H[i][l], h.H[i][k]);
      add_column_multiple(h.H, l, k, q);
      add_column_multiple(h.U, l, k, q);
    }
    h.pivots.push_back(static_cast<size_t>(i));
    ++k;
  }
  return h;
}

}  // namespace

IntMatrix::IntMatrix(std::initializer_list<std::initializer_list<int64_t>> rows) {
  rows_ = rows.size();
  cols_ = rows_ ? rows.begin()->size() : 0;
  for (const auto& r : rows) {
    if (r.size() != cols_) throw LatticeError(LatticeError::Kind::invalid_argument, "IntMatrix rows differ in length");
    data_.insert(data_.end(), r.begin(), r.end());
  }
}

IntMatrix IntMatrix::identity(size_t n) {
  IntMatrix I(n, n);
  for (size_t i = 0; i < n; ++i) I(i, i) = 1;
  return I;
}

std::vector<int64_t> IntMatrix::column(size_t c) const {
  std::vector<int64_t> v(rows_);
  for (size_t r = 0; r < rows_; ++r) v[r] = (*this)(r, c);
  return v;
}

IntMatrix IntMatrix::operator*(const IntMatrix& o) const {
  if (cols_ != o.rows_) throw LatticeError(LatticeError::Kind::invalid_argument, "matrix product of mismatched shapes");
  IntMatrix R(rows_, o.cols_);
  for (size_t i = 0; i < rows_; ++i)
    for (size_t j = 0; j < o.cols_; ++j) {
      __int128 s = 0;
      for (size_t k = 0; k < cols_; ++k) s += static_cast<__int128>((*this)(i, k)) * o(k, j);
      if (s > INT64_MAX || s < INT64_MIN) throw LatticeError(LatticeError::Kind::overflow, "matrix product overflows");
      R(i, j) = static_cast<int64_t>(s);
    }
  return R;
}

std::vector<int64_t> IntMatrix::operator*(const std::vector<int64_t>& v) const {
  IntMatrix col(v.size(), 1);
  for (size_t i = 0; i < v.size(); ++i) col(i, 0) = v[i];
  return ((*this) * col).column(0);
}

IntMatrix IntMatrix::transpose() const {
  IntMatrix T(cols_, rows_);
  for (size_t r = 0; r < rows_; ++r)
    for (size_t c = 0; c < cols_; ++c) T(c, r) = (*this)(r, c);
  return T;
}

std::string IntMatrix::str() const {
  std::string s = "[";
  for (size_t r = 0; r < rows_; ++r) {
    s += r ? ", [" : "[";
    for (size_t c = 0; c < cols_; ++c) s += (c ? ", " : "") + std::to_string((*this)(r, c));
    s += "]";
  }
  return s + "]";
}

HermiteForm column_hermite(const IntMatrix& A) {
  NtlErrors guard;
  NtlHermite h = hermite_ntl(to_ntl(A));
  HermiteForm out;
  out.H = from_ntl(h.H, "Hermite form");
  out.U = from_ntl(h.U, "Hermite transform");
  out.rank = h.pivots.size();
  out.pivot_rows = h.pivots;
  return out;
}

std::optional<IntMatrix> unimodular_completion(const IntMatrix& rows) {
  const size_t k = rows.rows(), n = rows.cols();
  if (k > n) throw LatticeError(LatticeError::Kind::invalid_argument, "unimodular_completion: more rows than columns");
  NtlErrors guard;
  // rows * U = [H 0]; the rows complete exactly when H is the identity, and then rows = [I 0] * U^{-1}.
  NtlHermite h = hermite_ntl(to_ntl(rows));
  if (h.pivots.size() != k) return std::nullopt;
  for (size_t j = 0; j < k; ++j)
    for (size_t i = 0; i < k; ++i)
      if (h.H[i][j] != (i == j ? 1 : 0)) return std::nullopt;
  ZZ det;
  mat_ZZ X;
  NTL::inv(det, X, h.U, /*deterministic=*/1);  // X = det * U^{-1}, det = +-1
  if (det < 0) NTL::negate(X, X);
  return from_ntl(X, "unimodular completion");
}

int64_t determinant(const IntMatrix& A) {
  NtlErrors guard;
  ZZ d;
  NTL::determinant(d, to_ntl(A), /*deterministic=*/1);
  return to_int64(d, "determinant");
}

IntMatrix kernel_basis(const IntMatrix& A) {
  NtlErrors guard;
  NtlHermite h = hermite_ntl(to_ntl(A));
  long n = A.cols(), r = static_cast<long>(h.pivots.size());
  mat_ZZ K;
  K.SetDims(n, n - r);
  for (long i = 0; i < n; ++i)
    for (long j = r; j < n; ++j) K[i][j - r] = h.U[i][j];
  // Canonical basis: the Hermite form of the kernel vectors themselves.
  NtlHermite hk = hermite_ntl(K);
  mat_ZZ B;
  B.SetDims(n, n - r);
  for (long i = 0; i < n; ++i)
    for (long j = 0; j < n - r; ++j) B[i][j] = hk.H[i][j];
  return from_ntl(B, "kernel basis");
}

std::optional<std::vector<int64_t>> solve(const IntMatrix& A, const std::vector<int64_t>& b) {
  if (b.size() != A.rows()) throw LatticeError(LatticeError::Kind::invalid_argument, "solve: b has the wrong length");
  NtlErrors guard;
  NtlHermite h = hermite_ntl(to_ntl(A));
  // A U = H, so A x = b  <=>  H v = b with x = U v. Forward substitution along the pivots.
  long n = A.cols(), m = A.rows();
  NTL::vec_ZZ v;
  v.SetLength(n);
  size_t j = 0;
  for (long row = 0; row < m; ++row) {
    ZZ rest = NTL::conv<ZZ>(static_cast<long>(b[row]));
    for (size_t l = 0; l < j; ++l) rest -= h.H[row][l] * v[l];
    if (j < h.pivots.size() && static_cast<long>(h.pivots[j]) == row) {
      ZZ q, rem;
      NTL::DivRem(q, rem, rest, h.H[row][j]);
      if (!NTL::IsZero(rem)) return std::nullopt;
      v[j] = q;
      ++j;
    } else if (!NTL::IsZero(rest)) {
      return std::nullopt;
    }
  }
  std::vector<int64_t> x(n);
  for (long i = 0; i < n; ++i) {
    ZZ s;
    for (long k = 0; k < n; ++k) s += h.U[i][k] * v[k];
    x[i] = to_int64(s, "solution");
  }
  return x;
}

RatMatrix dual_basis(const IntMatrix& B) {
  if (B.rows() != B.cols()) throw LatticeError(LatticeError::Kind::invalid_argument, "dual_basis needs a square basis");
  NtlErrors guard;
  ZZ d;
  mat_ZZ X;
  NTL::inv(d, X, to_ntl(B), /*deterministic=*/1);  // X = d * B^{-1}
  if (NTL::IsZero(d))
    throw LatticeError(LatticeError::Kind::invalid_argument, "dual_basis: the basis " + B.str() + " is singular");
  mat_ZZ D = NTL::transpose(X);
  if (d < 0) {
    NTL::negate(d, d);
    NTL::negate(D, D);
  }
  ZZ g = d;  // reduce the common denominator
  for (long r = 0; r < D.NumRows(); ++r)
    for (long c = 0; c < D.NumCols(); ++c) g = NTL::GCD(g, D[r][c]);
  if (!NTL::IsZero(g) && !NTL::IsOne(g)) {
    d /= g;
    for (long r = 0; r < D.NumRows(); ++r)
      for (long c = 0; c < D.NumCols(); ++c) D[r][c] /= g;
  }
  return RatMatrix{from_ntl(D, "dual basis"), to_int64(d, "dual basis denominator")};
}

std::optional<IntegralityLattice> integrality_lattice(const RatMatrix& R, const std::vector<int64_t>& c_num) {
  const size_t m = R.num.rows(), n = R.num.cols();
  if (c_num.size() != m) throw LatticeError(LatticeError::Kind::invalid_argument, "integrality_lattice: c has the wrong length");
  if (R.den <= 0) throw LatticeError(LatticeError::Kind::invalid_argument, "integrality_lattice: denominator must be positive");
  NtlErrors guard;
  const ZZ D = NTL::conv<ZZ>(static_cast<long>(R.den));

  // The lattice Lambda generated by the rows of R and the unit vectors, scaled by D: an integer row
  // lattice, i.e. the column lattice of G = D * [R; I]^T (n x (m + n)). Its Hermite form has rank n.
  mat_ZZ G;
  G.SetDims(static_cast<long>(n), static_cast<long>(m + n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < m; ++k) G[i][k] = NTL::conv<ZZ>(static_cast<long>(R.num(k, i)));
    G[i][m + i] = D;
  }
  NtlHermite lambda = hermite_ntl(G);
  mat_ZZ B;  // n x n basis of D * Lambda (columns)
  B.SetDims(static_cast<long>(n), static_cast<long>(n));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) B[i][j] = lambda.H[i][j];
  // L = dual(Lambda) = columns of (B / D)^{-T} = D * B^{-T}: integral because Lambda contains Z^n.
  ZZ det;
  mat_ZZ X;
  NTL::inv(det, X, B, /*deterministic=*/1);  // X = det * B^{-1}
  mat_ZZ L = NTL::transpose(X);
  for (long r = 0; r < L.NumRows(); ++r)
    for (long c = 0; c < L.NumCols(); ++c) {
      ZZ q, rem;
      NTL::DivRem(q, rem, L[r][c] * D, det);
      if (!NTL::IsZero(rem)) throw LatticeError(LatticeError::Kind::ntl, "integrality_lattice: dual is not integral");
      L[r][c] = q;
    }
  NtlHermite hl = hermite_ntl(L);

  // A point: solve R x + c = z over the integers, i.e. [num(R) | -D I] (x; z) = -c_num.
  mat_ZZ M;
  M.SetDims(static_cast<long>(m), static_cast<long>(n + m));
  for (size_t k = 0; k < m; ++k) {
    for (size_t i = 0; i < n; ++i) M[k][i] = NTL::conv<ZZ>(static_cast<long>(R.num(k, i)));
    M[k][n + k] = -D;
  }
  IntMatrix Mi = from_ntl(M, "integrality system");
  std::vector<int64_t> rhs(m);
  for (size_t k = 0; k < m; ++k) rhs[k] = -c_num[k];
  auto w = solve(Mi, rhs);
  if (!w) return std::nullopt;

  IntegralityLattice out;
  out.basis = from_ntl(hl.H, "integrality lattice basis");
  // Reduce the point along the lower-triangular basis: offset[i] in [0, basis(i, i)).
  std::vector<ZZ> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = NTL::conv<ZZ>(static_cast<long>((*w)[i]));
  for (size_t j = 0; j < n; ++j) {
    ZZ q = floor_div(x[j], hl.H[j][j]);
    for (size_t i = j; i < n; ++i) x[i] -= q * hl.H[i][j];
  }
  for (size_t i = 0; i < n; ++i) out.offset.push_back(to_int64(x[i], "integrality lattice offset"));
  return out;
}

}  // namespace polytile::lattice
