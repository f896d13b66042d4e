import numpy as np
import polytile

matmul = polytile.Program("""
function (A[M, K], B[K, N]) -> (C) {
  C[i, j : M, N] = +(A[i, k] * B[k, j]);
}""")
A = np.random.rand(256, 128).astype(np.float32)
B = np.random.rand(128, 64).astype(np.float32)
f = matmul.compile(A=A, B=B)     # types from arrays, (shape, dtype) pairs or shapes
C = f(A, B)                      # A and B read in place, C a new numpy array
f(A, B, out=C)                   # or written into the caller's array
assert np.allclose(C, A @ B, rtol=1e-4)
print(matmul.grad(wrt="A"))      # function (A, B, DC) -> (DA)
print(matmul.lower("loops", A=A, B=B)[:400])
try:
    f(A.T, B)
except polytile.Error as e:      # a ValueError with the command line's message
    print("polytile.Error:", e)
