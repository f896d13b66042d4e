#!/usr/bin/env python3
"""Makes a GPU kit: what a GPU machine without LLVM, isl or NTL needs to check and time polytile's kernels.

Usage: bench/gpu_kit.py [KIT] [--target sm_90] [--gpu-model KEY=VALUE,...] [--polytile build/polytile]
                        [--runtime-build build-runtime] [--variant NAME=KEY=VALUE,... ...]

On this machine (with LLVM), for the GPU machine:
  KIT/bin, KIT/lib   polytile-run-bundle, cuda_runtime_test and polytile_gpu_bench from a runtime-only
                     build (configured and built here in --runtime-build), and the Google Benchmark
                     library they load
  KIT/bundles        the benchmark's bundles, one per case and direction of bench/gpu/cases.txt
  KIT/variants/NAME  the benchmark's bundles again with another GPU model (--variant), to time against the
                     default on the same GPU
  KIT/control_args   a check that must fail (an expectation off in one element)
  KIT/check/NAME     every example of examples/ and its gradient (`polytile grad`) as a bundle, with
                     random inputs and the reference interpreter's outputs (.npy), and the arguments of
                     polytile-run-bundle that check the GPU's outputs against them
Then, on the GPU machine, bench/gpu_run.sh KIT runs the runtime's tests, every check (outputs poisoned
with NaN before the launch, so an unwritten element fails) and the benchmark. --gpu-model is passed to
every `polytile compile` (e.g. shared=0,split-blocks=0 for a kit without shared tiles and split
reductions, to compare with).
Needs numpy for the random inputs.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"gpu_kit: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def shape_args(shapes):
    return [a for s in shapes for a in ("--shape", s)]


def compile_bundle(polytile, tile, shapes, out, flags):
    """`flags`: the target and GPU model arguments of `polytile compile`."""
    if os.path.exists(out):
        shutil.rmtree(out)
    run([polytile, "compile", tile, *shape_args(shapes), "-o", out, *flags])


def signature(text):
    """(inputs, outputs) of a program's `function name (A[...], B[...]) -> (C, D)` line."""
    m = re.search(r"function\s*\w*\s*\((.*?)\)\s*->\s*\((.*?)\)", re.sub(r"//[^\n]*", "", text), re.S)
    ins = [re.match(r"\s*(\w+)", a).group(1) for a in re.split(r",(?![^\[]*\])", m.group(1)) if a.strip()]
    outs = [o.strip() for o in m.group(2).split(",") if o.strip()]
    return ins, outs


def check_case(polytile, name, tile, inputs, flags, kit):
    """One check: the bundle, inputs, the interpreter's outputs, and run-bundle's arguments."""
    d = os.path.join(kit, "check", name)
    os.makedirs(d, exist_ok=True)
    args = []
    shapes = []
    for n, value in inputs.items():
        path = os.path.join(d, f"in_{n}.npy")
        np.save(path, value)
        args += ["--input", f"{n}=check/{name}/in_{n}.npy"]
        shapes.append(f"{n}=" + "x".join(str(s) for s in value.shape))
    compile_bundle(polytile, tile, shapes, os.path.join(d, "bundle"), flags)
    _, outs = signature(open(tile).read())
    interp = [polytile, "run", tile, "--backend", "interp"]
    for n in inputs:
        interp += ["--input", f"{n}={d}/in_{n}.npy"]
    for o in outs:
        interp += ["--output", f"{o}={d}/want_{o}.npy"]
        args += ["--expect", f"{o}=check/{name}/want_{o}.npy"]
    run(interp)
    with open(os.path.join(d, "args"), "w") as f:
        f.write(" ".join([f"check/{name}/bundle", *args, "--poison"]) + "\n")
    return {o: np.load(f"{d}/want_{o}.npy") for o in outs}


def bench_sources(polytile, kit):
    """The benchmark's programs, one per case and direction of bench/gpu/cases.txt: (case, direction,
    Tile file, shapes); the gradients are written to KIT/src once."""
    sources = []
    for line in open(os.path.join(here, "gpu", "cases.txt")):
        if not line.strip() or line.startswith("#"):
            continue
        case, directions, tile, *shapes = line.split()
        ins, outs = signature(open(os.path.join(root, tile)).read())
        for direction in directions.split(","):
            src = os.path.join(root, tile)
            if direction != "fwd":
                wrt = ins[0] if direction == "bwd_data" else ins[1]
                src = os.path.join(kit, "src", f"{case}_{direction}.tile")
                os.makedirs(os.path.dirname(src), exist_ok=True)
                with open(src, "w") as f:
                    f.write(run([polytile, "grad", os.path.join(root, tile), "--wrt", wrt]))
                # The gradient's extra input D<output> has the forward output's type, as check prints it.
                fwd_types = run([polytile, "check", os.path.join(root, tile), *shape_args(shapes)])
                m = re.search(rf"^// {outs[0]}: f32\[([0-9, ]*)\]", fwd_types, re.M)
                sources.append((case, direction, src, shapes + [f"D{outs[0]}=" + "x".join(x.strip() for x in m.group(1).split(","))]))
            else:
                sources.append((case, direction, src, shapes))
    return sources


def bench_bundles(polytile, sources, out, kit, flags):
    """The benchmark's bundles under `out`, compiled with `flags`."""
    for case, direction, src, shapes in sources:
        compile_bundle(polytile, src, shapes, os.path.join(out, case, direction), flags)
        print(f"bundle {os.path.relpath(os.path.join(out, case, direction), kit)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kit", nargs="?", default=os.path.join(root, "build", "gpu_kit"))
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--gpu-model", default="")
    ap.add_argument("--polytile", default=os.path.join(root, "build", "polytile"))
    ap.add_argument("--runtime-build", default=os.path.join(root, "build-runtime"))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=MODEL",
                    help="also the benchmark's bundles with GPU model MODEL (KEY=VALUE,...) under KIT/variants/NAME")
    a = ap.parse_args()
    flags = ["--target", a.target] + (["--gpu-model", a.gpu_model] if a.gpu_model else [])
    kit = os.path.abspath(a.kit)
    if os.path.exists(kit):
        shutil.rmtree(kit)
    os.makedirs(kit)

    # The binaries, from a runtime-only build (what a GPU machine without LLVM builds).
    b = a.runtime_build
    run(["cmake", "-S", root, "-B", b, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DPOLYTILE_RUNTIME_ONLY=ON",
         "-DPOLYTILE_BUILD_BENCH=ON"])
    run(["cmake", "--build", b])
    os.makedirs(os.path.join(kit, "bin"))
    os.makedirs(os.path.join(kit, "lib"))
    for exe in ("polytile-run-bundle", "polytile_gpu_bench", "tests/cuda_runtime_test"):
        shutil.copy(os.path.join(b, exe), os.path.join(kit, "bin"))
    for line in run(["ldd", os.path.join(b, "polytile_gpu_bench")]).splitlines():
        if "libbenchmark" in line:
            shutil.copy(line.split("=>")[1].split("(")[0].strip(), os.path.join(kit, "lib"))

    # The benchmark's bundles, with the kit's GPU model and with each variant's.
    sources = bench_sources(a.polytile, kit)
    bench_bundles(a.polytile, sources, os.path.join(kit, "bundles"), kit, flags)
    for v in a.variant:
        name, _, model = v.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not model:
            sys.exit(f"gpu_kit: --variant {v}: expected NAME=KEY=VALUE,... (NAME in letters, digits, _ . -)")
        bench_bundles(a.polytile, sources, os.path.join(kit, "variants", name), kit, ["--target", a.target, "--gpu-model", model])

    # Every example and its gradient, and the benchmark's programs at odd sizes with their gradients, on
    # random inputs, against the reference interpreter.
    rng = np.random.default_rng(7)
    names = []

    def check_with_gradients(name, tile, inputs, wrts):
        """The program, and its gradient with respect to each of `wrts` (None: all inputs at once)."""
        outs = check_case(a.polytile, name, tile, inputs, flags, kit)
        names.append(name)
        for wrt in wrts:
            gname = f"{name}_grad" + (f"_{wrt}" if wrt else "")
            grad = os.path.join(kit, "check", name, gname[len(name) + 1:] + ".tile")
            with open(grad, "w") as f:
                f.write(run([a.polytile, "grad", tile] + (["--wrt", wrt] if wrt else [])))
            ginputs = dict(inputs)
            for n in signature(open(grad).read())[0]:
                if n not in ginputs:  # D<output>, the adjoint of an output
                    ginputs[n] = rng.standard_normal(outs[n[1:]].shape).astype(np.float32)
            check_case(a.polytile, gname, grad, ginputs, flags, kit)
            names.append(gname)
        print(f"check {name} and its gradients")

    for ex in sorted(os.listdir(os.path.join(root, "examples"))):
        if not ex.endswith(".tile"):
            continue
        tile = os.path.join(root, "examples", ex)
        inputs = {}
        for n, dims in re.findall(r"--random (\w+)=([0-9x]*)", open(tile).readline()):
            shape = tuple(int(x) for x in dims.split("x")) if dims else ()
            inputs[n] = rng.standard_normal(shape).astype(np.float32)
        check_with_gradients(ex[:-5], tile, inputs, [None])
    # Partial tiles and blocks, several blocks per axis.
    for name, tile, shapes in (("gpu_conv3x3_odd", "conv3x3.tile", {"I": (3, 17, 19, 12), "K": (3, 3, 12, 10)}),
                               ("gpu_conv1x1_odd", "conv1x1.tile", {"I": (2, 9, 11, 40), "K": (1, 1, 40, 24)}),
                               ("gpu_conv3x3_s2_odd", "conv3x3_s2.tile", {"I": (2, 13, 15, 12), "K": (3, 3, 12, 10)}),
                               ("gpu_conv_seed_odd", "conv_seed.tile", {"I": (2, 14, 17, 6), "K": (2, 2, 6, 5)}),
                               ("gpu_matmul_odd", "matmul.tile", {"A": (67, 130), "B": (130, 45)})):
        inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        check_with_gradients(name, os.path.join(here, "gpu", tile), inputs, list(inputs))
    # A control for the checker itself: the matmul example against an expectation off in one element
    # (by 1e-3 of the output's norm), which --expect must refuse.
    d = os.path.join(kit, "check", "matmul")
    want = np.load(os.path.join(d, "want_C.npy"))
    want.flat[0] += 1e-3 * float(np.linalg.norm(want))
    np.save(os.path.join(d, "wrong_C.npy"), want)
    with open(os.path.join(kit, "control_args"), "w") as f:
        f.write(open(os.path.join(d, "args")).read().replace("want_C.npy", "wrong_C.npy"))
    with open(os.path.join(kit, "checks.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(kit) for f in fs)
    print(f"kit {kit}: {len(names)} checks, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
