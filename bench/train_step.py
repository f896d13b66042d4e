#!/usr/bin/env python3
"""A whole training step, the comparison users make: the gradients of a model's loss with respect to all
its weights, as one polytile program, against the same step in JAX (jit(grad)) and PyTorch (eager;
loss.backward()) where those are installed, on the same data and threads. Two models: --model cnn (the
default; examples/small_cnn.tile: two blocks of 3x3 conv + bias + relu + 2x2 max pool, a dense layer,
softmax cross-entropy; PyTorch in channels_last) and --model transformer (examples/transformer_block.tile:
a pre-norm transformer block, layer norm, multi-head self-attention, a residual, layer norm, a GELU MLP, a
residual, and the squared error against a target; PyTorch with its fused scaled_dot_product_attention).
Checks that every peer's gradients agree with polytile's, then times them in --rounds interleaved rounds
(each round runs every framework's step repeat / rounds times, the frameworks in turn, in an order that
rotates from round to round, with a pause before each so that threads a framework leaves spinning sleep
again), so that a machine whose speed drifts within minutes moves every framework alike; the median of
all its runs, and prints one table; --json writes the numbers.

    build/python-venv/bin/pip install jax          # the peers are not needed by the build or the tests
    build/python-venv/bin/python bench/train_step.py [--model cnn|transformer] [--batch N] [--repeat 30]
        [--rounds 5] [--json FILE]
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import numpy as np

import polytile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WRT = ["K1", "B1", "K2", "B2", "W", "B3"]
TRANSFORMER_WRT = ["Wq", "Wk", "Wv", "Wo", "W1", "B1", "W2", "B2"]


def data(batch, size, c1, c2, classes, seed=0):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    x = {
        "X": rng.standard_normal((batch, size, size, 1), dtype=f32),
        "K1": (rng.standard_normal((3, 3, 1, c1), dtype=f32) * np.sqrt(2 / 9)).astype(f32),
        "B1": np.full((c1,), 0.01, f32),
        "K2": (rng.standard_normal((3, 3, c1, c2), dtype=f32) * np.sqrt(2 / (9 * c1))).astype(f32),
        "B2": np.full((c2,), 0.01, f32),
        "W": (rng.standard_normal((size // 4, size // 4, c2, classes), dtype=f32) * 0.01).astype(f32),
        "B3": np.zeros((classes,), f32),
    }
    x["Y"] = np.eye(classes, dtype=f32)[rng.integers(0, classes, batch)]
    return x


def transformer_data(batch, tokens, width, heads, hidden, seed=0):
    """Inputs of examples/transformer_block.tile: X and the target T normal, the weights normal with
    variance 1 / fan-in, the biases small."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    per_head = width // heads

    def normal(shape, fan_in):
        return (rng.standard_normal(shape, dtype=f32) / np.sqrt(fan_in)).astype(f32)

    return {
        "X": rng.standard_normal((batch, tokens, width), dtype=f32),
        "Wq": normal((width, heads, per_head), width),
        "Wk": normal((width, heads, per_head), width),
        "Wv": normal((width, heads, per_head), width),
        "Wo": normal((heads, per_head, width), width),
        "W1": normal((width, hidden), width),
        "B1": np.full((hidden,), 0.01, f32),
        "W2": normal((hidden, width), hidden),
        "B2": np.zeros((width,), f32),
        "T": rng.standard_normal((batch, tokens, width), dtype=f32),
    }


def jax_grad_step(loss, arrays, weights):
    """The step jit(grad(loss)) with respect to arguments 1..weights, compiled once (timed): (step, seconds)."""
    import jax
    import jax.numpy as jnp

    g = jax.jit(jax.grad(loss, argnums=tuple(range(1, weights + 1))))
    args = [jnp.asarray(a) for a in arrays]
    t = time.perf_counter()
    jax.block_until_ready(g(*args))
    compile_s = time.perf_counter() - t

    def step():
        return [np.asarray(v) for v in jax.block_until_ready(g(*args))]

    return step, compile_s


def transformer_jax_step(x):
    import jax
    import jax.numpy as jnp

    per_head = x["Wq"].shape[2]

    def norm(v):
        d = v - jnp.mean(v, axis=-1, keepdims=True)
        return d / jnp.sqrt(jnp.mean(d * d, axis=-1, keepdims=True) + 1e-5)

    def loss(X, Wq, Wk, Wv, Wo, W1, B1, W2, B2, T):
        n1 = norm(X)
        q, k, v = (jnp.einsum("bic,che->bhie", n1, w) for w in (Wq, Wk, Wv))
        p = jax.nn.softmax(jnp.einsum("bhie,bhje->bhij", q, k) / np.sqrt(per_head), axis=-1)
        r1 = X + jnp.einsum("bhie,hec->bic", jnp.einsum("bhij,bhje->bhie", p, v), Wo)
        g = jax.nn.gelu(norm(r1) @ W1 + B1, approximate=True)
        return jnp.sum((r1 + g @ W2 + B2 - T) ** 2)

    return jax_grad_step(loss, [x[n] for n in ["X", *TRANSFORMER_WRT, "T"]], len(TRANSFORMER_WRT))


def transformer_torch_step(x, threads):
    import torch
    import torch.nn.functional as F

    if threads:
        torch.set_num_threads(threads)
    X, T = torch.from_numpy(x["X"]), torch.from_numpy(x["T"])
    width = X.shape[2]
    params = {n: torch.from_numpy(x[n]).requires_grad_(True) for n in TRANSFORMER_WRT}

    def step():
        for p in params.values():
            p.grad = None
        n1 = F.layer_norm(X, (width,), eps=1e-5)
        q, k, v = (torch.einsum("bic,che->bhie", n1, params[w]) for w in ("Wq", "Wk", "Wv"))
        r1 = X + torch.einsum("bhie,hec->bic", F.scaled_dot_product_attention(q, k, v), params["Wo"])
        g = F.gelu(F.layer_norm(r1, (width,), eps=1e-5) @ params["W1"] + params["B1"], approximate="tanh")
        loss = ((r1 + g @ params["W2"] + params["B2"] - T) ** 2).sum()
        loss.backward()
        return [params[n].grad.detach().numpy() for n in TRANSFORMER_WRT]

    return step, 0.0


def timed_in_rounds(steps, repeat, rounds, pause=0.2):
    """The median seconds of each of `steps` (name -> step), run repeat // rounds times (at least once) in
    each of `rounds` rounds, the steps in turn, the first of each round one further on; a warm-up run and
    a pause of `pause` seconds before each turn (PyTorch's OpenMP threads spin for a while after its
    step, and on a 2-core machine a step run in that while shares the cores with them)."""
    names = list(steps)
    times = {n: [] for n in names}
    per_round = max(1, repeat // max(1, rounds))
    for r in range(max(1, rounds)):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            time.sleep(pause)
            steps[name]()  # warm-up
            for _ in range(per_round):
                t = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - t)
    return {n: statistics.median(t) for n, t in times.items()}


def polytile_step(x, threads, example="small_cnn", wrt=WRT, head="DL"):
    grad = polytile.Program.from_file(ROOT / "examples" / f"{example}.tile").grad(wrt=wrt)
    inputs = dict(x)
    inputs[head] = np.ones((), np.float32)
    t = time.perf_counter()
    compiled = grad.compile(threads=threads, **inputs)
    compile_s = time.perf_counter() - t
    outs = {n: np.empty(s, np.float32) for n, (s, _) in compiled.output_types.items()}
    ordered = [inputs[n] for n in compiled.inputs]

    def step():
        compiled(*ordered, out=outs)
        return [outs["D" + w] for w in wrt]

    return step, compile_s


def jax_step(x):
    import jax
    import jax.numpy as jnp

    def loss(X, K1, B1, K2, B2, W, B3, Y):
        def block(a, k, b):
            z = jax.lax.conv_general_dilated(a, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            a = jax.nn.relu(z + b)
            return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

        p = block(block(X, K1, B1), K2, B2)
        z = jnp.einsum("nyxc,yxck->nk", p, W) + B3
        return -jnp.sum(Y * jax.nn.log_softmax(z)) / X.shape[0]

    return jax_grad_step(loss, [x[n] for n in ["X", *WRT, "Y"]], len(WRT))


def torch_step(x, threads):
    import torch
    import torch.nn.functional as F

    if threads:
        torch.set_num_threads(threads)
    X = torch.from_numpy(x["X"]).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    Y = torch.from_numpy(x["Y"])
    # OIHW weights (channels_last), the dense weight over the pooled NHWC features.
    params = {
        "K1": torch.from_numpy(x["K1"]).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last),
        "B1": torch.from_numpy(x["B1"]),
        "K2": torch.from_numpy(x["K2"]).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last),
        "B2": torch.from_numpy(x["B2"]),
        "W": torch.from_numpy(x["W"]),
        "B3": torch.from_numpy(x["B3"]),
    }
    for p in params.values():
        p.requires_grad_(True)

    def step():
        for p in params.values():
            p.grad = None
        a = F.max_pool2d(F.relu(F.conv2d(X, params["K1"], params["B1"], padding=1)), 2)
        a = F.max_pool2d(F.relu(F.conv2d(a, params["K2"], params["B2"], padding=1)), 2)
        z = torch.einsum("ncyx,yxck->nk", a, params["W"]) + params["B3"]
        loss = -(Y * F.log_softmax(z, dim=1)).sum() / X.shape[0]
        loss.backward()
        g = {n: p.grad for n, p in params.items()}
        g["K1"], g["K2"] = g["K1"].permute(2, 3, 1, 0), g["K2"].permute(2, 3, 1, 0)  # back to HWIO
        return [g[n].detach().numpy() for n in WRT]

    return step, 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--batch", type=int, help="default: 64 images (cnn), 8 sequences (transformer)")
    ap.add_argument("--tokens", type=int, default=128, help="transformer: tokens per sequence")
    ap.add_argument("--width", type=int, default=256, help="transformer: features per token")
    ap.add_argument("--heads", type=int, default=4, help="transformer: attention heads")
    ap.add_argument("--hidden", type=int, default=1024, help="transformer: the MLP's hidden features")
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--channels", type=int, nargs=2, default=[32, 64])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="0: every core (what each framework does by default)")
    ap.add_argument("--repeat", type=int, default=30, help="timed runs of each framework's step, in all")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds the runs are spread over")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    if args.model == "cnn":
        args.batch = args.batch or 64
        x = data(args.batch, args.size, *args.channels, args.classes)
        c1, c2 = args.channels
        s = args.size
        # The convs' work: conv1 forward and weight gradient (X needs no gradient), conv2 forward and both gradients.
        flops = 2 * args.batch * (s * s * 9 * c1 * 2 + (s // 2) ** 2 * 9 * c1 * c2 * 3)
        wrt = WRT
        peers = {"polytile": lambda: polytile_step(x, args.threads)}
        frameworks = [("jax", lambda: jax_step(x)), ("pytorch", lambda: torch_step(x, args.threads))]
        title = (f"training step of examples/small_cnn.tile: batch {args.batch}, {s}x{s}x1, channels {c1}/{c2}, "
                 f"{args.classes} classes")
        work = "conv work"
    else:
        args.batch = args.batch or 8
        b, n, c, f = args.batch, args.tokens, args.width, args.hidden
        x = transformer_data(b, n, c, args.heads, f)
        # The products' work: forward, Q, K, V and the output projection (4 of B L C^2), the scores and their
        # use (2 of B L^2 C), the MLP (2 of B L C F), 2 flops each; a step with its gradient is 3x that
        # (each product's gradient is two products of its size; X needs none, counted all the same).
        flops = 3 * 2 * b * n * (4 * c * c + 2 * n * c + 2 * c * f)
        wrt = TRANSFORMER_WRT
        peers = {"polytile": lambda: polytile_step(x, args.threads, "transformer_block", TRANSFORMER_WRT, "DLoss")}
        frameworks = [("jax", lambda: transformer_jax_step(x)), ("pytorch", lambda: transformer_torch_step(x, args.threads))]
        title = (f"training step of examples/transformer_block.tile: batch {b}, {n} tokens of {c}, {args.heads} heads, "
                 f"MLP {f}")
        work = "products' work"
    for name, make in frameworks:
        try:
            __import__("jax" if name == "jax" else "torch")
        except ImportError:
            print(f"{name}: not installed here, skipped")
            continue
        peers[name] = make

    steps, compile_seconds, reference = {}, {}, None
    for name, make in peers.items():
        step, compile_s = make()
        grads = step()  # the first run (and, for JAX, its compilation)
        if reference is None:
            reference = grads
        else:
            for w, got, want in zip(wrt, grads, reference):
                err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
                if err > 1e-3:
                    raise SystemExit(f"{name}'s d{w} differs from polytile's: max relative difference {err:.2e}")
        steps[name], compile_seconds[name] = step, compile_s
    results = {}
    for name, seconds in timed_in_rounds(steps, args.repeat, args.rounds).items():
        results[name] = {"ms": seconds * 1e3, "compile_ms": compile_seconds[name] * 1e3, "gflops": flops / seconds * 1e-9}

    print(f"{title}, threads {args.threads or os.cpu_count()} ({platform.machine()}, "
          f"{os.cpu_count()} cores); {work} {flops * 1e-9:.2f} GFLOP per step")
    print(f"| framework | step ms | {work.split()[0]} GFLOP/s | compile ms | polytile speedup |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        speed = results[name]["ms"] / results["polytile"]["ms"]
        compile_text = f"{r['compile_ms']:.0f}" if r["compile_ms"] else "(eager)"
        print(f"| {name} | {r['ms']:.2f} | {r['gflops']:.0f} | {compile_text} | {speed:.2f}x |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
