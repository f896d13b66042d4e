#!/usr/bin/env python3
"""Random convolutions and their gradients, compiled and compared with the interpreter.

Each case is a conv of random images, channels, kernel, stride, dilation and padding (f32 or f64), in
PyTorch's NCHW layouts, O[n, co, y, x] = +(I[n, ci, s*y + d*j - p, s*x + d*i - p] * K[co, ci, j, i]), or
TensorFlow's NHWC ones, O[n, y, x, co] = +(I[n, s*y + d*j - p, s*x + d*i - p, ci] * K[j, i, ci, co]);
some are depthwise (one channel per group: K[c, j, i] or K[j, i, c]), some have 32-144 channels on small
images. For about half of them one gradient is checked too, with respect to I or K (`polytile grad`,
reduced and defracted). Every program runs on the reference interpreter and on the CPU backend for each
--cpu target (AVX-512 where the host has it, AVX2, SSE), on the same deterministic random inputs; the
outputs must agree to a relative 1e-4 (f32) or 1e-11 (f64). --layouts nchw keeps to NCHW convs and their
data gradients, as the sweep was first written.

    build/python-venv/bin/python fuzz/conv_sweep.py --seed 1 --count 40

needs numpy; exits 1 naming every disagreement.
"""
import argparse
import pathlib
import random
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def dims(shape):
    return "x".join(map(str, shape))


def conv_text(layout, depthwise, oh, ow, stride, dilation, pad):
    shift = f" - {pad}" if pad else ""
    y, x = f"{stride}*y + {dilation}*j{shift}", f"{stride}*x + {dilation}*i{shift}"
    if layout == "nchw" and depthwise:
        return ("function (I[N, C, H, W], K[C, KH, KW]) -> (O) {\n"
                f"  O[n, c, y, x : N, C, {oh}, {ow}] = +(I[n, c, {y}, {x}] * K[c, j, i]);\n}}\n")
    if layout == "nchw":
        return ("function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {\n"
                f"  O[n, co, y, x : N, CO, {oh}, {ow}] = +(I[n, ci, {y}, {x}] * K[co, ci, j, i]);\n}}\n")
    if depthwise:
        return ("function (I[N, H, W, C], K[KH, KW, C]) -> (O) {\n"
                f"  O[n, y, x, c : N, {oh}, {ow}, C] = +(I[n, {y}, {x}, c] * K[j, i, c]);\n}}\n")
    return ("function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n"
            f"  O[n, y, x, co : N, {oh}, {ow}, CO] = +(I[n, {y}, {x}, ci] * K[j, i, ci, co]);\n}}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polytile", default=str(ROOT / "build" / "polytile"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=40, help="convolutions to draw")
    ap.add_argument("--cpus", default="host,x86-64-v3,x86-64-v2", help="--cpu targets, comma-separated")
    ap.add_argument("--layouts", choices=["all", "nchw"], default="all",
                    help="all: NCHW and NHWC, dilations, depthwise convs, data and weight gradients; "
                         "nchw: NCHW convs without dilation and their data gradients only")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    bad = checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)

        def run(program, inputs, output, extra):
            out = d / "out.npy"
            cmd = [args.polytile, "run", str(program), "--output", f"{output}={out}", "--limit", "0", *extra]
            for x in inputs:
                cmd += ["--random", x]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                return None, r.stderr.strip()
            return np.load(out), None

        for t in range(args.count):
            n, ci, co = rnd.randint(1, 3), rnd.randint(1, 20), rnd.choice([8, 16, 24, 32, 48, 64, 80])
            kh, kw, stride, pad = rnd.randint(1, 5), rnd.randint(1, 5), rnd.randint(1, 3), rnd.randint(0, 2)
            if args.layouts == "nchw":
                layout, depthwise, dilation, wrt = "nchw", False, 1, "I"
            else:
                layout, depthwise = rnd.choice(["nchw", "nhwc"]), rnd.random() < 0.2
                dilation, wrt = rnd.choice([1, 1, 2, 3]), rnd.choice(["I", "K"])
                # Now and then channels as wide as a network's (weights and output gradients packed
                # into panels from 128 output channels on), on smaller images.
                wide = rnd.random() < 0.25
                if wide:
                    n, ci, co = rnd.randint(1, 2), rnd.choice([32, 64, 96]), rnd.choice([64, 128, 144])
                if depthwise:
                    ci = co
            span_h, span_w = dilation * (kh - 1) + 1, dilation * (kw - 1) + 1
            if args.layouts == "nchw":  # the draws of the first sweep, so that its seeds still name its cases
                h, w = rnd.randint(kh + 1, 36), rnd.randint(kw + 1, 40)
            else:
                grow = 12 if wide else 36
                h, w = rnd.randint(span_h + 1, span_h + grow - 1), rnd.randint(span_w + 1, span_w + grow + 3)
            oh, ow = (h + 2 * pad - span_h) // stride + 1, (w + 2 * pad - span_w) // stride + 1
            dtype = rnd.choice(["f32", "f32", "f64"])
            forward = d / f"conv{t}.tile"
            forward.write_text(conv_text(layout, depthwise, oh, ow, stride, dilation, pad))
            image = (n, ci, h, w) if layout == "nchw" else (n, h, w, ci)
            if depthwise:
                weights = (co, kh, kw) if layout == "nchw" else (kh, kw, co)
            else:
                weights = (co, ci, kh, kw) if layout == "nchw" else (kh, kw, ci, co)
            seed = (n, co, oh, ow) if layout == "nchw" else (n, oh, ow, co)
            inputs = [f"I={dims(image)}:{dtype}", f"K={dims(weights)}:{dtype}"]
            cases = [(forward, inputs, "O")]
            if rnd.random() < 0.5:
                g = subprocess.run([args.polytile, "grad", str(forward), "--wrt", wrt], capture_output=True, text=True, check=True)
                gradient = d / f"grad{t}.tile"
                gradient.write_text(g.stdout)
                cases.append((gradient, inputs + [f"DO={dims(seed)}:{dtype}"], "D" + wrt))
            for program, ins, output in cases:
                want, err = run(program, ins, output, ["--backend", "interp"])
                if err:
                    print(f"interpreter failed on case {t} ({' '.join(ins)}): {err}")
                    bad += 1
                    continue
                for cpu in args.cpus.split(","):
                    got, err = run(program, ins, output, ["--cpu", cpu, "--no-cache"])
                    checked += 1
                    if err:
                        print(f"case {t} {output} ({' '.join(ins)}) --cpu {cpu}: {err}")
                        bad += 1
                        continue
                    tol = 1e-4 if dtype == "f32" else 1e-11
                    diff = np.abs(got - want) / np.maximum(1, np.abs(want))
                    if got.shape != want.shape or (diff.size and not diff.max() <= tol):
                        where = np.argwhere(diff > tol)[:4].tolist() if got.shape == want.shape else "shape"
                        print(f"case {t} {output} ({' '.join(ins)}, {layout}{' depthwise' if depthwise else ''}, stride {stride}, dilation {dilation}, padding {pad}) --cpu {cpu}: "
                              f"max relative difference {diff.max() if diff.size else 'n/a'} at {where}\n{program.read_text()}")
                        bad += 1
    print(f"seed {args.seed}: {checked} runs compared, {bad} disagreements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
