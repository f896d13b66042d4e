"""The Python frameworks as peers of build/polytile_bench: JAX (jit) and PyTorch (eager, channels_last) on the
C++ bench's own cases, timed the way it times polytile (the mean of repeated runs into the framework's own
outputs over at least 0.2 s, after a warm-up that compiles; the median of such repetitions), so that
bench/run_bench.py --frameworks joins their rates with the Google Benchmark JSON in one table and one plot.
Neither framework is needed by the build or the tests: each is used where it imports
(build/python-venv/bin/pip install jax).

The cases mirror bench/cpu_bench.cpp (kConvs, the sgemm sizes (A B, and A^T B as sgemm_tn), max pool 2x2 on 8x112x112x64, softmax on
4096x1000, the GELU and layer norm, the bias gradient of 64x28x28x32 and the transpositions, with the same flop and byte counts); a polytile case with no spec here is reported, never
silently dropped.
"""
import statistics
import time

# name, n, h, w, ci, co, kh, kw, stride, dilation, pad[, groups]: as kConvs in cpu_bench.cpp (a depthwise
# conv: groups = ci = co).
CONVS = {
    "conv3x3_64_56": (8, 56, 56, 64, 64, 3, 3, 1, 1, 1),
    "conv3x3_128_28": (8, 28, 28, 128, 128, 3, 3, 1, 1, 1),
    "conv3x3_256_14": (8, 14, 14, 256, 256, 3, 3, 1, 1, 1),
    "conv1x1_256to64_56": (8, 56, 56, 256, 64, 1, 1, 1, 1, 0),
    "conv3x3_s2_64_56": (8, 56, 56, 64, 64, 3, 3, 2, 1, 1),
    "conv2x2_s3_d2_seed": (8, 57, 57, 64, 64, 2, 2, 3, 2, 0),
    "conv3x3_96_28": (8, 28, 28, 96, 96, 3, 3, 1, 1, 1),
    "dwconv3x3_64_56": (8, 56, 56, 64, 64, 3, 3, 1, 1, 1, 64),
    # conv_nchw/<name> only (cpu_bench.cpp's NCHW cases): PyTorch's default layouts on both sides.
    "conv3x3_64_32": (8, 32, 32, 64, 64, 3, 3, 1, 1, 1),
    "conv7x7_s2_3to64_224": (8, 224, 224, 3, 64, 7, 7, 2, 1, 3),
}
POOL_SHAPE, POOL_BYTES = (8, 112, 112, 64), 4.0 * 8 * 112 * 112 * 64 * 1.25
POOL_GRAD_BYTES = 4.0 * 8 * 112 * 112 * 64 * 2.25  # I and DO read, DI written (as cpu_bench.cpp counts)
BIAS_SHAPE, BIAS_BYTES = (64, 28, 28, 32), 4.0 * 64 * 28 * 28 * 32
# global_pool/<layout>: a ResNet-50's global average pool, 64 images of 2048 channels of 7 x 7.
GLOBAL_POOL_NCHW, GLOBAL_POOL_BYTES = (64, 2048, 7, 7), 4.0 * 64 * 2048 * 7 * 7
SCALE_BYTES = 2 * BIAS_BYTES  # scale_grad: two tensors of BIAS_SHAPE read, a channel's sum of their product
SOFTMAX_SHAPE, SOFTMAX_BYTES = (4096, 1000), 4.0 * 4096 * 1000 * 2
SOFTMAX_GRAD_BYTES = 4.0 * 4096 * 1000 * 3  # X and DO read, DX written
# reduce/<name>: a 64 MiB matrix reduced along axis (None: all of it) with sum or max (as cpu_bench.cpp's).
REDUCE_SHAPE, REDUCE_BYTES = (8192, 2048), 4.0 * 8192 * 2048
REDUCTIONS = {"rows": ("sum", 1), "columns": ("sum", 0), "columns_max": ("max", 0), "total": ("sum", None)}
# gelu/<direction> (tanh form) on 4096 x 1024, layernorm/<direction> (no scale or shift, eps 1e-5) on 8192 x
# 1024: forward X read and Y written, backward X and DY read and DX written (as cpu_bench.cpp counts).
GELU_SHAPE, NORM_SHAPE = (4096, 1024), (8192, 1024)
# attention/<direction>: softmax(Q K^T / 8) V over 16 heads of 512 tokens x 64 (B, L, D); fwd computes O,
# bwd the gradients of Q, K and V (each framework's step runs the forward too). The work is the products'
# FLOPs: 2 of 2 B L^2 D forward, 6 for the step with its gradient (2 forward, 4 backward), for every peer.
ATTENTION_SHAPE = (16, 512, 64)
# transpose/<name>: the input's shape and the permutation of its axes (as kTranspose* in cpu_bench.cpp).
TRANSPOSES = {"2048x2048": ((2048, 2048), (1, 0)), "nhwc_to_nchw": ((8, 56, 56, 64), (0, 3, 1, 2))}


def conv_out(size, k, stride, dilation, pad):
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


def conv_spec(spec):
    """n, h, w, ci, co, kh, kw, stride, dilation, pad, groups of a CONVS entry."""
    return tuple(spec) + (1,) * (11 - len(spec))


def conv_flops(spec):
    n, h, w, ci, co, kh, kw, s, d, p, g = conv_spec(spec)
    return 2.0 * n * conv_out(h, kh, s, d, p) * conv_out(w, kw, s, d, p) * co * (ci // g) * kh * kw


def parse(case):
    """(kind, args, work, unit) of a bench case name such as conv/conv3x3_64_56/bwd_data, sgemm/1024,
    softmax/bwd, compile/conv3x3_64_56/fwd+bwd; None for a case without a framework spec."""
    parts = case.split("/")
    # Compiling a conv's forward and its gradient (both inputs) from scratch, as the C++ case compiles the
    # forward program and the autodiff's gradient program. The work is 1e9 because measure() reports
    # work * 1e-9 per second: here, compilations of the pair per second.
    if parts[0] == "compile" and len(parts) == 3 and parts[1] in CONVS and parts[2] == "fwd+bwd":
        return "compile", (CONVS[parts[1]],), 1e9, "compiles/s"
    if parts[0] in ("conv", "conv_nchw") and len(parts) == 3 and parts[1] in CONVS and parts[2] in ("fwd", "bwd_data", "bwd_weights"):
        return parts[0], (CONVS[parts[1]], parts[2]), conv_flops(CONVS[parts[1]]), "GFLOP/s"
    if parts[0] in ("sgemm", "sgemm_tn") and len(parts) in (2, 3) and parts[1].isdigit():  # sgemm/N or sgemm/N/N
        n = int(parts[1])
        return "sgemm", (n, parts[0] == "sgemm_tn"), 2.0 * n ** 3, "GFLOP/s"
    if case == "bias_grad":
        return "bias_grad", (), BIAS_BYTES, "GB/s"
    if case == "scale_grad":
        return "scale_grad", (), SCALE_BYTES, "GB/s"
    if parts[0] == "global_pool" and len(parts) == 2 and parts[1] in ("nchw", "nhwc"):
        return "global_pool", (parts[1],), GLOBAL_POOL_BYTES, "GB/s"
    if parts[0] in ("gelu", "layernorm") and len(parts) == 2 and parts[1] in ("fwd", "bwd"):
        shape = GELU_SHAPE if parts[0] == "gelu" else NORM_SHAPE
        return parts[0], (parts[1],), 4.0 * shape[0] * shape[1] * (2 if parts[1] == "fwd" else 3), "GB/s"
    if parts[0] == "attention" and len(parts) == 2 and parts[1] in ("fwd", "bwd"):
        b, l, d = ATTENTION_SHAPE
        return "attention", (parts[1],), (2 if parts[1] == "fwd" else 6) * 2.0 * b * l * l * d, "GFLOP/s"
    if parts[0] == "reduce" and len(parts) == 2 and parts[1] in REDUCTIONS:
        return "reduce", REDUCTIONS[parts[1]], REDUCE_BYTES, "GB/s"
    if parts[0] == "transpose" and len(parts) == 2 and parts[1] in TRANSPOSES:
        shape, perm = TRANSPOSES[parts[1]]
        elements = 1
        for d in shape:
            elements *= d
        return "transpose", (shape, perm), 8.0 * elements, "GB/s"
    # softmax/bwd_stop_max: polytile's gradient with the row maxima held constant; the frameworks' own
    # softmax gradients are computed that way, so their step is the same as for softmax/bwd.
    directions = ("fwd", "bwd") if parts[0] == "maxpool" else ("fwd", "bwd", "bwd_stop_max")
    if parts[0] in ("maxpool", "softmax") and len(parts) == 2 and parts[1] in directions:
        forward, backward = (POOL_BYTES, POOL_GRAD_BYTES) if parts[0] == "maxpool" else (SOFTMAX_BYTES, SOFTMAX_GRAD_BYTES)
        return parts[0], (parts[1],), forward if parts[1] == "fwd" else backward, "GB/s"
    return None


def mean_seconds(step, sync, repeats, min_seconds=0.2):
    """Seconds per run of `step`, as Google Benchmark times polytile's repetitions: runs one after another
    for at least `min_seconds` (run_bench.py's --min-time) and `repeats` runs, their total time over their
    count. (A median of single runs would drop the slow ones a repetition's mean keeps: 4-7% less for
    torch.mm on 1024 x 1024 on a 2-core guest, 2026-12-06, which would have favoured the frameworks.)"""
    sync(step())  # warm-up: compiles (JAX) or allocates (PyTorch)
    runs = 0
    start = time.perf_counter()
    while runs < repeats or time.perf_counter() - start < min_seconds:
        sync(step())
        runs += 1
        if runs >= 1000:
            break
    return (time.perf_counter() - start) / runs


def jax_step(kind, args):
    import jax
    import jax.numpy as jnp
    from jax import lax

    key = jax.random.PRNGKey(0)
    if kind == "compile":
        # jit, lower and compile afresh each time: a new function object (JAX caches by function), the
        # shapes as abstract values (nothing runs). The warm-up step pays JAX's one-time start-up.
        ((n, h, w, ci, co, kh, kw, s, d, p),) = args
        x = jax.ShapeDtypeStruct((n, h, w, ci), jnp.float32)
        k = jax.ShapeDtypeStruct((kh, kw, ci, co), jnp.float32)

        def compile_pair():
            def conv(x, k):
                return lax.conv_general_dilated(x, k, (s, s), [(p, p), (p, p)], rhs_dilation=(d, d),
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))

            out = jax.eval_shape(conv, x, k)
            jax.jit(conv).lower(x, k).compile()
            jax.jit(lambda x, k, dy: jax.vjp(conv, x, k)[1](dy)).lower(x, k, out).compile()
            return jnp.zeros(())

        return compile_pair
    if kind in ("conv", "conv_nchw"):
        spec, direction = args
        n, h, w, ci, co, kh, kw, s, d, p, g = conv_spec(spec)
        nchw = kind == "conv_nchw"
        x = jax.random.normal(key, (n, ci, h, w) if nchw else (n, h, w, ci), jnp.float32)
        k = jax.random.normal(jax.random.PRNGKey(1), (co, ci // g, kh, kw) if nchw else (kh, kw, ci // g, co), jnp.float32)
        numbers = ("NCHW", "OIHW", "NCHW") if nchw else ("NHWC", "HWIO", "NHWC")

        def conv(x, k):
            return lax.conv_general_dilated(x, k, (s, s), [(p, p), (p, p)], rhs_dilation=(d, d),
                                            dimension_numbers=numbers, feature_group_count=g)

        if direction == "fwd":
            f = jax.jit(conv)
            return lambda: f(x, k)
        dy = jax.random.normal(jax.random.PRNGKey(2), conv(x, k).shape, jnp.float32)
        wrt = 0 if direction == "bwd_data" else 1
        f = jax.jit(lambda x, k, dy: jax.vjp(conv, x, k)[1](dy)[wrt])
        return lambda: f(x, k, dy)
    if kind == "bias_grad":
        d = jax.random.normal(key, BIAS_SHAPE, jnp.float32)
        f = jax.jit(lambda d: jnp.sum(d, axis=(0, 1, 2)))
        return lambda: f(d)
    if kind == "global_pool":
        n, c, h, w = GLOBAL_POOL_NCHW
        nchw = args[0] == "nchw"
        x = jax.random.normal(key, (n, c, h, w) if nchw else (n, h, w, c), jnp.float32)
        f = jax.jit(lambda x: jnp.mean(x, axis=(2, 3) if nchw else (1, 2)))
        return lambda: f(x)
    if kind == "scale_grad":
        d = jax.random.normal(key, BIAS_SHAPE, jnp.float32)
        x = jax.random.normal(jax.random.PRNGKey(2), BIAS_SHAPE, jnp.float32)
        f = jax.jit(lambda d, x: jnp.sum(d * x, axis=(0, 1, 2)))
        return lambda: f(d, x)
    if kind == "reduce":
        op, axis = args
        x = jax.random.normal(key, REDUCE_SHAPE, jnp.float32)
        f = jax.jit(lambda x: (jnp.sum if op == "sum" else jnp.max)(x, axis=axis))
        return lambda: f(x)
    if kind == "transpose":
        shape, perm = args
        x = jax.random.normal(key, shape, jnp.float32)
        f = jax.jit(lambda x: jnp.transpose(x, perm))
        return lambda: f(x)
    if kind == "sgemm":
        n, transposed_a = args
        a = jax.random.normal(key, (n, n), jnp.float32)
        b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
        f = jax.jit((lambda a, b: jnp.matmul(a.T, b)) if transposed_a else jnp.matmul)
        return lambda: f(a, b)
    (direction,) = args
    if kind == "attention":
        q, k, v, do = (jax.random.normal(jax.random.PRNGKey(s), ATTENTION_SHAPE, jnp.float32) for s in range(4))

        def attention(q, k, v):
            return jax.nn.softmax(jnp.einsum("bid,bjd->bij", q, k) * 0.125, axis=-1) @ v

        if direction == "fwd":
            f = jax.jit(attention)
            return lambda: f(q, k, v)
        f = jax.jit(lambda q, k, v, do: jax.vjp(attention, q, k, v)[1](do))
        return lambda: f(q, k, v, do)
    if kind == "maxpool":
        x = jax.random.normal(key, POOL_SHAPE, jnp.float32)

        def op(x):
            return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    elif kind == "gelu":
        x = jax.random.normal(key, GELU_SHAPE, jnp.float32)

        def op(x):
            return jax.nn.gelu(x, approximate=True)
    elif kind == "layernorm":
        x = jax.random.normal(key, NORM_SHAPE, jnp.float32)

        def op(x):
            d = x - jnp.mean(x, axis=1, keepdims=True)
            return d / jnp.sqrt(jnp.mean(d * d, axis=1, keepdims=True) + 1e-5)
    else:
        x = jax.random.normal(key, SOFTMAX_SHAPE, jnp.float32)

        def op(x):
            return jax.nn.softmax(x, axis=1)

    if direction == "fwd":
        f = jax.jit(op)
        return lambda: f(x)
    dy = jax.random.normal(jax.random.PRNGKey(2), op(x).shape, jnp.float32)
    f = jax.jit(lambda x, dy: jax.vjp(op, x)[1](dy)[0])
    return lambda: f(x, dy)


# PyTorch's 4-d cases run in both memory formats, and the faster one is its rate (as a user would pick).
TORCH_LAYOUTS = ("channels_last", "nchw")


def torch_step(kind, args):
    """{memory format: step} for the 4-d cases (convs, max pool, the bias and scale gradients), else one step; None
    for a case eager PyTorch has no step for (compiling)."""
    if kind in ("conv", "maxpool", "bias_grad", "scale_grad"):
        return {layout: torch_step_in(kind, args, layout) for layout in TORCH_LAYOUTS}
    if kind == "conv_nchw":  # the tensors a caller holds in PyTorch's default layouts
        return torch_step_in("conv", args, "nchw")
    return torch_step_in(kind, args, "nchw")


def torch_step_in(kind, args, layout):
    import torch
    import torch.nn.functional as F

    if kind == "compile":
        return None  # eager PyTorch compiles nothing
    g = torch.Generator().manual_seed(0)
    cl = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    if kind == "conv":
        spec, direction = args
        n, h, w, ci, co, kh, kw, s, d, p, groups = conv_spec(spec)
        x = torch.randn(n, ci, h, w, generator=g).to(memory_format=cl)
        k = torch.randn(co, ci // groups, kh, kw, generator=g).to(memory_format=cl)

        def conv(x, k):
            return F.conv2d(x, k, stride=s, padding=p, dilation=d, groups=groups)

        if direction == "fwd":
            return lambda: conv(x, k)
        x.requires_grad_(direction == "bwd_data")
        k.requires_grad_(direction == "bwd_weights")
        dy = torch.randn(conv(x, k).shape, generator=g).to(memory_format=cl)
        wrt = x if direction == "bwd_data" else k
        return lambda: torch.autograd.grad(conv(x, k), wrt, dy)[0]
    if kind == "bias_grad":
        n, h, w, c = BIAS_SHAPE
        d = torch.randn(n, c, h, w, generator=g).to(memory_format=cl)
        return lambda: d.sum(dim=(0, 2, 3))
    if kind == "global_pool":  # the layout is the case's: NCHW contiguous, or channels_last
        n, c, h, w = GLOBAL_POOL_NCHW
        x = torch.randn(n, c, h, w, generator=g)
        if args[0] == "nhwc":
            x = x.to(memory_format=torch.channels_last)
        return lambda: x.mean(dim=(2, 3))
    if kind == "scale_grad":
        n, h, w, c = BIAS_SHAPE
        d = torch.randn(n, c, h, w, generator=g).to(memory_format=cl)
        x = torch.randn(n, c, h, w, generator=g).to(memory_format=cl)
        return lambda: (d * x).sum(dim=(0, 2, 3))
    if kind == "reduce":
        op, axis = args
        x = torch.randn(*REDUCE_SHAPE, generator=g)
        if axis is None:
            return lambda: x.sum()
        return lambda: x.sum(dim=axis) if op == "sum" else x.amax(dim=axis)
    if kind == "transpose":
        shape, perm = args
        x = torch.randn(*shape, generator=g)
        return lambda: x.permute(*perm).contiguous()
    if kind == "sgemm":
        n, transposed_a = args
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        out = torch.empty(n, n)
        return lambda: torch.matmul(a.t() if transposed_a else a, b, out=out)
    (direction,) = args
    if kind == "attention":  # PyTorch's fused kernel, faster here than softmax(q @ k^T * 0.125) @ v
        q, k, v, do = (torch.randn(*ATTENTION_SHAPE, generator=g) for _ in range(4))
        if direction == "fwd":
            return lambda: F.scaled_dot_product_attention(q, k, v)
        for t in (q, k, v):
            t.requires_grad_(True)
        return lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), do)
    if kind == "maxpool":
        n, h, w, c = POOL_SHAPE
        x = torch.randn(n, c, h, w, generator=g).to(memory_format=cl)

        def op(x):
            return F.max_pool2d(x, 2)
    elif kind == "gelu":
        x = torch.randn(*GELU_SHAPE, generator=g)

        def op(x):
            return F.gelu(x, approximate="tanh")
    elif kind == "layernorm":
        x = torch.randn(*NORM_SHAPE, generator=g)

        def op(x):
            return F.layer_norm(x, (NORM_SHAPE[1],), eps=1e-5)
    else:
        x = torch.randn(*SOFTMAX_SHAPE, generator=g)

        def op(x):
            return torch.softmax(x, dim=1)

    if direction == "fwd":
        return lambda: op(x)
    x.requires_grad_(True)
    dy = torch.randn(op(x).shape, generator=g)
    return lambda: torch.autograd.grad(op(x), x, dy)[0]


def available():
    """{peer name: (make step, sync)} for the frameworks that import here, and the versions as text."""
    peers, versions = {}, []
    try:
        import jax

        peers["jax"] = (jax_step, jax.block_until_ready)
        versions.append(f"jax {jax.__version__} ({jax.devices()[0].platform})")
    except ImportError:
        versions.append("jax: not installed")
    try:
        import torch

        peers["torch"] = (torch_step, lambda r: r)
        versions.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    except ImportError:
        versions.append("torch: not installed")
    return peers, versions


def measure(cases, repeats=10, log=print, rounds=3):
    """{(case, peer): (rate, unit)} for every polytile case a framework computes; the names of cases
    without a spec are returned too, to be reported.

    The cases are timed in `rounds` passes over all of them, and each rate is the median of its passes'
    means (mean_seconds): a framework is timed after the C++ bench, not interleaved with polytile, and on
    a shared machine one pass over a case could fall in a slow minute (PyTorch's 7x7 stem 283 and 143
    GFLOP/s in two passes minutes apart on a 2-core guest, 2026-12-06), which a median over passes spread
    through the run leaves out."""
    peers, versions = available()
    log("frameworks: " + ", ".join(versions) + f"; {rounds} passes over the cases")
    specs, unknown = {}, []
    for case in cases:
        spec = parse(case)
        if spec is None:
            unknown.append(case)
        else:
            specs[case] = spec
    passes = {}  # (case, peer) -> {label: [seconds of each pass]}
    for _ in range(rounds):
        for case, (kind, args, work, unit) in specs.items():
            for peer, (make, sync) in sorted(peers.items()):
                steps = make(kind, args)
                if steps is None:
                    continue
                if not isinstance(steps, dict):
                    steps = {"": steps}
                timed = passes.setdefault((case, peer), {})
                for label, step in steps.items():
                    timed.setdefault(label, []).append(mean_seconds(step, sync, repeats))
                del steps  # the case's tensors go before the next case makes its own
    rates = {}
    for (case, peer), timed in sorted(passes.items()):
        _, _, work, unit = specs[case]
        seconds = {label: statistics.median(t) for label, t in timed.items()}
        label = min(seconds, key=seconds.get)  # the fastest variant (PyTorch: memory format)
        rates[(case, peer)] = (work * 1e-9 / seconds[label], unit)
        spread = f"passes {work * 1e-9 / max(timed[label]):.1f}-{work * 1e-9 / min(timed[label]):.1f}"
        others = ", ".join(f"{k} {work * 1e-9 / v:.1f}" for k, v in seconds.items() if k != label)
        log(f"  {case} {peer}: {work * 1e-9 / seconds[label]:.1f} {unit} ({spread}" + (f"; {label}; {others})" if others else ")"))
    return rates, unknown
