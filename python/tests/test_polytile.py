"""The Python package against numpy, the reference interpreter and the command line: values, zero-copy
(the arrays' own data pointers reach the compiled code), DLPack in and out, threads, and one clear
polytile.Error for everything a caller can get wrong."""

import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import polytile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = os.environ.get("POLYTILE_CLI", str(ROOT / "build" / "polytile"))
SEED_CONV = ROOT / "examples" / "conv2d_strided_dilated.tile"
MATMUL = """function (A[M, K], B[K, N]) -> (C) {
  C[i, j : M, N] = +(A[i, k] * B[k, j]);
}"""


def cli(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)


def rng(seed=0):
    return np.random.default_rng(seed)


# The seed conv and its gradient in numpy: O[n, y, x, co] = sum I[n, 3y + 2j, 3x + 2i, ci] * K[j, i, ci, co].
def windows(H, W, j, i):
    rows = 2 * j + 3 * np.arange(H // 3)
    cols = 2 * i + 3 * np.arange(W // 3)
    return rows[:, None], cols[None, :]


def conv_ref(I, K):
    N, H, W, _ = I.shape
    O = np.zeros((N, H // 3, W // 3, K.shape[3]))
    for j in range(K.shape[0]):
        for i in range(K.shape[1]):
            r, c = windows(H, W, j, i)
            O += np.einsum("nyxc,co->nyxo", I[:, r, c, :], K[j, i])
    return O


def conv_grad_ref(I, K, DO):
    DI, DK = np.zeros(I.shape), np.zeros(K.shape)
    for j in range(K.shape[0]):
        for i in range(K.shape[1]):
            r, c = windows(I.shape[1], I.shape[2], j, i)
            DI[:, r, c, :] += np.einsum("nyxo,co->nyxc", DO, K[j, i])
            DK[j, i] = np.einsum("nyxc,nyxo->co", I[:, r, c, :], DO)
    return DI, DK


def test_version_is_the_command_lines():
    # "polytile 0.1.0, sources <digest>, LLVM 16.0.6, isl-0.25-GMP"
    assert polytile.__version__ == cli("--version").stdout.split(",")[0].split()[-1]


def test_program_text_round_trips_and_names_its_tensors():
    p = polytile.Program(MATMUL)
    assert p.inputs == ["A", "B"] and p.outputs == ["C"]
    assert polytile.Program(p.text).text == p.text
    f = polytile.Program.from_file(SEED_CONV)
    assert f.inputs == ["I", "K"] and f.outputs == ["O"]
    assert f.types(I=((2, 9, 9, 5), "f32"), K=((2, 2, 5, 7), "f32"))["O"] == ((2, 3, 3, 7), "f32")


def test_gradient_is_the_command_lines_reduced_and_defracted_one():
    conv = polytile.Program.from_file(SEED_CONV)
    for wrt, mode in [(None, "reverse"), ("I", "reverse"), (["K"], "mixed"), ("I", "forward")]:
        args = ["grad", SEED_CONV, "--mode", mode] + (["--wrt", wrt if isinstance(wrt, str) else ",".join(wrt)] if wrt else [])
        expected = cli(*args)
        assert expected.returncode == 0, expected.stderr
        assert conv.grad(wrt=wrt, mode=mode).text == expected.stdout
    # The post's result: the input gradient's output indices are single variables with cosets, no fractions.
    dI = conv.grad(wrt="I").text
    assert "DI[v0, v1_0 + 3*v1_1, v2_0 + 3*v2_1, v3 : N, H, W, CI]" in dI and "/" not in dI.split("=", 1)[1]
    raw = conv.grad(wrt="I", reduce_and_defract=False).text
    assert raw == cli("grad", SEED_CONV, "--wrt", "I", "--emit", "tile").stdout and raw != dI


def test_zero_adjoints_are_left_out_unless_kept():
    softmax = polytile.Program.from_file(ROOT / "examples" / "softmax.tile")
    pruned, kept = softmax.grad().text, softmax.grad(keep_zero_adjoints=True).text
    assert pruned == cli("grad", ROOT / "examples" / "softmax.tile").stdout
    assert "== M[" not in pruned and "== M[" in kept


def test_every_stage_is_the_command_lines():
    shapes = {"I": ((2, 9, 9, 5), "f32"), "K": ((2, 2, 5, 7), "f32")}
    conv = polytile.Program.from_file(SEED_CONV)
    assert polytile.stages()[:4] == ["tile", "isl", "reduced", "defracted"]
    for stage in polytile.stages():
        target = "sm_80" if stage == "ptx" else None
        text = conv.lower(stage, target=target, **shapes)
        args = ["lower", SEED_CONV, "--emit", stage, "--shape", "I=2x9x9x5", "--shape", "K=2x2x5x7"]
        expected = cli(*args, *(["--target", target] if target else []))
        assert expected.returncode == 0, expected.stderr
        assert text == expected.stdout, stage
    assert "domain: { S_O[n, y, x, co, j, i, ci]" in conv.lower("isl", **shapes)


def test_code_for_a_named_cpu():
    # target="cpu:NAME": SSE4.2 code (x86-64-v2, which every x86-64 machine of the last decade runs) gives
    # numpy's product, lower shows its 4-lane micro-kernel as the command line does, an unknown CPU is an error.
    p = polytile.Program.from_file(ROOT / "examples" / "matmul.tile")
    A = rng(1).standard_normal((96, 64)).astype(np.float32)
    B = rng(2).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_allclose(p.compile(target="cpu:x86-64-v2", A=A, B=B)(A, B), A @ B, rtol=1e-4, atol=1e-4)
    text = p.lower("loops", target="cpu:x86-64-v2", A=A, B=B)
    assert "micro-kernel 6x2x4" in text
    expected = cli("lower", ROOT / "examples" / "matmul.tile", "--emit", "loops", "--shape", "A=96x64", "--shape", "B=64x64",
                   "--cpu", "x86-64-v2")
    assert text == expected.stdout
    assert "unknown CPU 'pentium-9000'" in error(lambda: p.compile(target="cpu:pentium-9000", A=A, B=B))


def test_cache_sizes_after_the_cpus_name(tmp_path):
    # target="cpu:NAME,l1=SIZE,...": the schedule blocked for those caches (a padded 3x3 conv's reduction
    # tiles shorter in a smaller L1 and L2), the same loops as the command line's, numpy's results; a
    # malformed size is an error naming it.
    text = """function (I[N, H, W, C], K[KH, KW, C, CO]) -> (O) {
  O[n, y, x, co : N, H, W, CO] = +(I[n, y + j - 1, x + i - 1, c] * K[j, i, c, co]);
}"""
    conv = polytile.Program(text)
    I = rng(3).standard_normal((2, 12, 12, 64)).astype(np.float32)
    K = rng(4).standard_normal((3, 3, 64, 64)).astype(np.float32)
    small = conv.lower("loops", target="cpu:host,l1=8K,l2=96K", I=I, K=K)
    assert small != conv.lower("loops", I=I, K=K)
    path = tmp_path / "conv.tile"
    path.write_text(text)
    expected = cli("lower", path, "--emit", "loops", "--shape", "I=2x12x12x64", "--shape", "K=3x3x64x64",
                   "--cpu", "host,l1=8K,l2=96K")
    assert small == expected.stdout, expected.stderr
    padded = np.pad(I, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = sum(np.einsum("nhwc,cd->nhwd", padded[:, j:j + 12, i:i + 12, :], K[j, i]) for j in range(3) for i in range(3))
    got = conv.compile(target="cpu:host,l1=8K,l2=96K", I=I, K=K)(I, K)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert "l2=1Q is not a cache size" in error(lambda: conv.compile(target="cpu:host,l2=1Q", I=I, K=K))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_matmul_matches_numpy(dtype):
    A = (rng(1).standard_normal((37, 19)) * 4).astype(dtype)
    B = (rng(2).standard_normal((19, 23)) * 4).astype(dtype)
    f = polytile.Program(MATMUL).compile(A=A, B=B)
    C = f(A, B)
    assert isinstance(C, np.ndarray) and C.dtype == np.dtype(dtype) and C.shape == (37, 23)
    if dtype.startswith("int"):
        np.testing.assert_array_equal(C, A @ B)
    else:
        np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(f(B=B, A=A), C)  # by name


def test_seed_conv_forward_and_backward_match_numpy():
    I = rng(3).standard_normal((2, 11, 10, 5)).astype(np.float32)
    K = rng(4).standard_normal((2, 2, 5, 7)).astype(np.float32)
    conv = polytile.Program.from_file(SEED_CONV)
    O = conv.compile(I=I, K=K)(I, K)
    np.testing.assert_allclose(O, conv_ref(I, K), rtol=1e-4, atol=1e-4)
    DO = rng(5).standard_normal(O.shape).astype(np.float32)
    grad = conv.grad()
    DI, DK = grad.compile(I=I, K=K, DO=DO)(I, K, DO)
    ref_DI, ref_DK = conv_grad_ref(I, K, DO)
    np.testing.assert_allclose(DI, ref_DI, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(DK, ref_DK, rtol=1e-4, atol=1e-3)
    # The interpreter, the semantics' definition, agrees.
    iDI, iDK = grad.interpret(I=I, K=K, DO=DO)
    np.testing.assert_allclose(DI, iDI, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(DK, iDK, rtol=1e-4, atol=1e-3)


def test_arrays_are_used_in_place():
    A = rng(6).standard_normal((8, 4)).astype(np.float32)
    B = rng(7).standard_normal((4, 3)).astype(np.float32)
    f = polytile.Program(MATMUL).compile(A=A, B=B)
    C = f(A, B)
    bound = f.last_binding
    assert bound["A"] == A.ctypes.data and bound["B"] == B.ctypes.data and bound["C"] == C.ctypes.data
    # An output the package allocates starts on a cache line (64-byte vector stores stay within one).
    assert C.ctypes.data % 64 == 0 and C.flags.c_contiguous and C.flags.writeable and C.shape == (8, 3)
    # out=: the caller's array is written, and returned, not a copy of it.
    out = np.full((8, 3), np.nan, dtype=np.float32)
    assert f(A, B, out=out) is out
    assert f.last_binding["C"] == out.ctypes.data
    np.testing.assert_allclose(out, A @ B, rtol=1e-5, atol=1e-5)
    # A view into a larger buffer is used where it lies, not gathered.
    big = np.zeros((10, 3), dtype=np.float32)
    f(A, B, out={"C": big[1:9]})
    assert f.last_binding["C"] == big[1:9].ctypes.data
    np.testing.assert_allclose(big[1:9], A @ B, rtol=1e-5, atol=1e-5)
    assert not big[0].any() and not big[9].any()


class OnlyDLPack:
    """An array from some framework: nothing but the DLPack protocol."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_in_and_out():
    A = rng(8).standard_normal((5, 6))
    B = rng(9).standard_normal((6, 2))
    f = polytile.Program(MATMUL).compile(A=A, B=B)
    C = f(OnlyDLPack(A), OnlyDLPack(B))
    assert f.last_binding["A"] == A.ctypes.data
    np.testing.assert_allclose(C, A @ B)
    back = np.from_dlpack(C)  # the result exports __dlpack__ too
    assert np.shares_memory(back, C)
    # The interpreter's results are numpy arrays that own polytile's buffers.
    R = polytile.Program(MATMUL).interpret(A, B)
    assert R.flags.owndata is False and R.base is not None
    np.testing.assert_allclose(R, A @ B)


def test_int64_and_float16_arrays_in_place():
    # numpy's default integers: exact beyond 2^53, wrapping like numpy's own int64 arithmetic.
    A = np.array([2**62 + 3, -(2**63), 2**53 + 1, -7], dtype=np.int64)
    B = np.array([5, -1, 3, 2], dtype=np.int64)
    f = polytile.Program("function (A[N], B[N]) -> (O) { O = A * B + A; }").compile(A=A, B=B)
    O = np.empty_like(A)
    f(A, B, out=O)
    assert f.last_binding["A"] == A.ctypes.data and f.last_binding["O"] == O.ctypes.data
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(O, A * B + A)
    # Half precision: elementwise operations are IEEE half arithmetic (numpy's float16 too); a matmul
    # accumulates in f32 and rounds once.
    X = rng(3).standard_normal(64).astype(np.float16)
    Y = rng(4).standard_normal(64).astype(np.float16)
    g = polytile.Program("function (X[N], Y[N]) -> (O) { O = X * Y - X / Y; }").compile(X=X, Y=Y)
    H = g(X, Y)
    assert H.dtype == np.float16 and g.last_binding["X"] == X.ctypes.data
    np.testing.assert_array_equal(H, X * Y - X / Y)
    M = rng(5).standard_normal((16, 300)).astype(np.float16)
    N = rng(6).standard_normal((300, 8)).astype(np.float16)
    C = polytile.Program(MATMUL).compile(A=M, B=N)(M, N)
    assert C.dtype == np.float16
    want = (M.astype(np.float64) @ N.astype(np.float64)).astype(np.float16)
    np.testing.assert_allclose(C.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_torch_tensors_in_place():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed in this environment")
    A = torch.randn(4, 5)
    B = torch.randn(5, 3)
    f = polytile.Program(MATMUL).compile(A=A, B=B)
    out = torch.empty(4, 3)
    f(A, B, out=out)
    assert f.last_binding["A"] == A.data_ptr() and f.last_binding["C"] == out.data_ptr()
    torch.testing.assert_close(out, A @ B)


def test_jax_arrays_in_place():
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed in this environment")
    A = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    B = jnp.ones((4, 2), dtype=jnp.float32)
    f = polytile.Program(MATMUL).compile(A=A, B=B)
    C = f(A, B)
    assert f.last_binding["A"] == A.unsafe_buffer_pointer()
    np.testing.assert_allclose(C, np.asarray(A) @ np.asarray(B))


def test_booleans_and_empty_dims():
    p = polytile.Program("""function (A[N], B[N]) -> (C, S) {
      C = select(A > B, A, B);
      S[] = +(A[i]);
    }""")
    A = np.array([1, 5, 2, 8], dtype=np.float32)
    B = np.array([3, 1, 2, 9], dtype=np.float32)
    C, S = p.compile(A=A, B=B)(A, B)
    np.testing.assert_array_equal(C, np.maximum(A, B))
    assert S.shape == () and S == A.sum()
    mask = polytile.Program("function (A[N], B[N]) -> (M) { M = A > B; }")
    M = mask.compile(A=A, B=B)(A, B)
    assert M.dtype == np.bool_
    np.testing.assert_array_equal(M, A > B)
    empty = np.zeros((0, 4), dtype=np.float32)
    f = polytile.Program(MATMUL).compile(A=empty, B=np.ones((4, 3), np.float32))
    assert f(empty, np.ones((4, 3), np.float32)).shape == (0, 3)
    g = polytile.Program(MATMUL).compile(A=((3, 0), "f32"), B=((0, 2), "f32"))
    np.testing.assert_array_equal(g(np.ones((3, 0), np.float32), np.ones((0, 2), np.float32)), np.zeros((3, 2)))


def test_concurrent_calls_from_threads():
    A = [rng(10 + t).standard_normal((64, 32)).astype(np.float32) for t in range(4)]
    B = rng(20).standard_normal((32, 48)).astype(np.float32)
    f = polytile.Program(MATMUL).compile(A=A[0], B=B)
    results = [None] * 4

    def work(t):
        for _ in range(20):
            results[t] = f(A[t], B)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in range(4):
        np.testing.assert_allclose(results[t], A[t] @ B, rtol=1e-5, atol=1e-4)


def error(call):
    with pytest.raises(polytile.Error) as e:
        call()
    assert isinstance(e.value, ValueError)
    return str(e.value)


def test_user_errors_are_polytile_errors_naming_the_object(tmp_path):
    A = np.ones((2, 3), np.float32)
    B = np.ones((3, 4), np.float32)
    p = polytile.Program(MATMUL)
    f = p.compile(A=A, B=B)
    # The command line's message, word for word.
    bad = tmp_path / "bad.tile"
    bad.write_text("function (A[N]) -> (B) { B[i : N] = +(A[i] }")
    msg = error(lambda: polytile.Program.from_file(bad))
    assert msg in cli("check", bad).stderr and "1:44" in msg
    assert "no_such.tile" in error(lambda: polytile.Program.from_file(tmp_path / "no_such.tile"))
    assert "input A" in error(lambda: f(A.astype(np.float64), B))
    assert "input B" in error(lambda: f(A, np.ones((3, 5), np.float32)))
    assert "not contiguous" in error(lambda: f(A, np.asfortranarray(B)))
    msg = error(lambda: f(A.astype(np.int64), B))
    assert "input A" in msg and "i64" in msg
    assert "uint8 is not one polytile computes in" in error(lambda: f(A.astype(np.uint8), B))
    assert "got list" in error(lambda: f([[1.0] * 3] * 2, B))
    readonly = np.empty((2, 4), np.float32)
    readonly.flags.writeable = False
    msg = error(lambda: f(A, B, out=readonly))
    assert "output C" in msg and "writable" in msg
    assert "output C" in error(lambda: f(A, B, out=np.empty((2, 4), np.float64)))
    buf = np.zeros(16, np.float32)
    overlapping = buf[:6].reshape(2, 3)
    assert "output C" in error(lambda: f(overlapping, B, out=buf[4:12].reshape(2, 4)))
    assert "takes 2 inputs" in error(lambda: f(A, B, A))
    assert "input B is missing" in error(lambda: f(A))
    assert "no input X" in error(lambda: f(A, X=B))
    assert "given twice" in error(lambda: f(A, A=B))
    assert "out= has 2" in error(lambda: f(A, B, out=(A, B)))
    assert "unknown stage 'sass'" in error(lambda: p.lower("sass"))
    assert "needs the dtype and shape" in error(lambda: p.lower("loops"))
    assert "unknown gradient mode 'sideways'" in error(lambda: p.grad(mode="sideways"))
    assert "unknown target 'tpu'" in error(lambda: p.compile(target="tpu", A=A, B=B))
    assert "tensor A" in error(lambda: p.compile(A=((2, 3), "u8"), B=B))
    assert "tensor A" in error(lambda: p.compile(A="not a type", B=B))
    assert "B" in error(lambda: p.compile(A=A))
    assert "K" in error(lambda: p.compile(A=A, B=np.ones((4, 4), np.float32)))
    assert "threads -1: give 0" in error(lambda: p.compile(threads=-1, A=A, B=B))
    assert "threads 1025: give 0" in error(lambda: p.compile(threads=1025, A=A, B=B))
    assert "directory" in error(lambda: polytile.Program.from_file(tmp_path))
    assert "with respect to A twice" in error(lambda: p.grad(wrt=["A", "B", "A"]))
    # A failed call loses nothing: the compiled program still runs.
    np.testing.assert_allclose(f(A, B), A @ B)


def test_training_step_gradients_match_the_interpreter():
    # bench/train_step.py's program at small sizes: the compiled gradients of the whole CNN's loss against
    # the reference interpreter's, and a finite difference of the loss along a random direction.
    cnn = polytile.Program.from_file(ROOT / "examples" / "small_cnn.tile")
    wrt = ["K1", "B1", "K2", "B2", "W", "B3"]
    shapes = {"X": (2, 8, 8, 1), "K1": (3, 3, 1, 4), "B1": (4,), "K2": (3, 3, 4, 6), "B2": (6,), "W": (2, 2, 6, 3),
              "B3": (3,), "Y": (2, 3)}
    x = {n: rng(30 + k).standard_normal(s).astype(np.float64) for k, (n, s) in enumerate(shapes.items())}
    x["Y"] = np.eye(3)[[0, 2]]
    grad = cnn.grad(wrt=wrt)
    inputs = dict(x, DL=np.ones(()))
    compiled = grad.compile(**inputs)(**inputs)
    interpreted = grad.interpret(**inputs)
    for name, got, want in zip(grad.outputs, compiled, interpreted):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=name)
    loss = cnn.compile(**x)
    direction = {n: rng(40 + k).standard_normal(x[n].shape) for k, n in enumerate(wrt)}
    h = 1e-6
    plus = loss(**{n: x[n] + h * direction[n] if n in direction else x[n] for n in x})
    minus = loss(**{n: x[n] - h * direction[n] if n in direction else x[n] for n in x})
    along = sum(float(np.sum(g * direction[n])) for n, g in zip(wrt, compiled))
    assert abs((plus - minus) / (2 * h) - along) < 1e-6 * max(1.0, abs(along))
