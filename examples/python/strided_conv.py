"""A strided, dilated convolution from Python: its gradient reduced and defracted, forward and backward
run on numpy arrays in place, and the result checked against numpy (python examples/python/strided_conv.py
in the environment polytile is installed in, e.g. build/python-venv/bin/python)."""

import numpy as np

import polytile

conv = polytile.Program("""
function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
  O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);
}""")

# The gradient as autodiff writes it: DI's indices are sums of two variables scaled by 3 and 2 ...
print(conv.grad(wrt="I", reduce_and_defract=False))
# ... and after reduce and defract: one variable per index, no fractions, every element written once.
grad = conv.grad()
print(grad)

rng = np.random.default_rng(0)
I = rng.standard_normal((8, 57, 57, 32), dtype=np.float32)
K = rng.standard_normal((2, 2, 32, 64), dtype=np.float32)
forward = conv.compile(I=I, K=K)
O = forward(I, K)
backward = grad.compile(I=I, K=K, DO=O)
DO = np.ones_like(O)  # the gradient of sum(O)
DI, DK = backward(I, K, DO)

# numpy: the same convolution as a sum over the kernel's taps, and its gradient.
ref_O, ref_DI, ref_DK = np.zeros(O.shape), np.zeros(I.shape), np.zeros(K.shape)
for j in range(2):
    for i in range(2):
        rows = (2 * j + 3 * np.arange(19))[:, None]
        cols = (2 * i + 3 * np.arange(19))[None, :]
        taps = I[:, rows, cols, :]
        ref_O += np.einsum("nyxc,co->nyxo", taps, K[j, i])
        ref_DI[:, rows, cols, :] += np.einsum("nyxo,co->nyxc", DO, K[j, i])
        ref_DK[j, i] = np.einsum("nyxc,nyxo->co", taps, DO)
for name, got, want in [("O", O, ref_O), ("DI", DI, ref_DI), ("DK", DK, ref_DK)]:
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    print(f"{name}{list(got.shape)}: max relative error against numpy {err:.1e}")
    assert err < 1e-4, name
print("inputs used in place:", forward.last_binding["I"] == I.ctypes.data)
