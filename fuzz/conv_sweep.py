#!/usr/bin/env python3
"""Random NCHW convolutions and their data gradients, compiled and compared with the interpreter.

Each case is a conv O[n, co, y, x] = +(I[n, ci, s*y + j - p, s*x + i - p] * K[co, ci, j, i]) of random
images, channels, kernel, stride and padding (f32 or f64), and for about half of them its gradient with
respect to I (`polytile grad`, reduced and defracted). Every program runs on the reference interpreter
and on the CPU backend for each --cpu target (AVX-512 where the host has it, AVX2, SSE), on the same
deterministic random inputs; the outputs must agree to a relative 1e-4 (f32) or 1e-11 (f64).

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


def conv_text(oh, ow, stride, pad):
    shift = f" - {pad}" if pad else ""
    return ("function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {\n"
            f"  O[n, co, y, x : N, CO, {oh}, {ow}] = +(I[n, ci, {stride}*y + j{shift}, {stride}*x + i{shift}] * K[co, ci, j, i]);\n"
            "}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polytile", default=str(ROOT / "build" / "polytile"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=40, help="convolutions to draw")
    ap.add_argument("--cpus", default="host,x86-64-v3,x86-64-v2", help="--cpu targets, comma-separated")
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
            h, w = rnd.randint(kh + 1, 36), rnd.randint(kw + 1, 40)
            oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
            dtype = rnd.choice(["f32", "f32", "f64"])
            forward = d / f"conv{t}.tile"
            forward.write_text(conv_text(oh, ow, stride, pad))
            inputs = [f"I={n}x{ci}x{h}x{w}:{dtype}", f"K={co}x{ci}x{kh}x{kw}:{dtype}"]
            cases = [(forward, inputs, "O")]
            if rnd.random() < 0.5:
                g = subprocess.run([args.polytile, "grad", str(forward), "--wrt", "I"], capture_output=True, text=True, check=True)
                gradient = d / f"grad{t}.tile"
                gradient.write_text(g.stdout)
                cases.append((gradient, inputs + [f"DO={n}x{co}x{oh}x{ow}:{dtype}"], "DI"))
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
                        print(f"case {t} {output} ({' '.join(ins)}, stride {stride}, padding {pad}) --cpu {cpu}: "
                              f"max relative difference {diff.max() if diff.size else 'n/a'} at {where}\n{program.read_text()}")
                        bad += 1
    print(f"seed {args.seed}: {checked} runs compared, {bad} disagreements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
