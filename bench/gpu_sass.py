#!/usr/bin/env python3
"""What a GPU kit's kernels issue, without a GPU: ptxas assembles each bundle's PTX, nvdisasm disassembles
it, and each kernel's innermost loops are counted by instruction (FFMA, shared loads LDS and their 128-bit
ones, global loads LDG, the rest).

Usage: bench/gpu_sass.py KIT [--arch sm_90] [--variant NAME ...] [--filter REGEX]

For each bundle of KIT/bundles (and of KIT/variants/NAME, side by side) and each update kernel, one line
per innermost loop that issues FFMAs (the reduction around a register tile; an unswitched one has two,
without and with the guards) or global loads (a shared tile's copy):
    conv3x3_64_56/fwd  k1_O_update  compute  49 instr  32 FFMA  12 LDS (4 x128)  1.53 instr/FFMA
    ...                             copy     132 instr  8 LDG  16.5 instr/LDG
A proxy for speed where no GPU is lent (fewer instructions and shared loads per FFMA, fewer instructions
per global load); only a GPU's timing says what they are worth. Needs ptxas (CUDA_PATH, /usr/local/cuda)
and nvdisasm (the toolkit's, or NVDISASM=path: Triton's wheel carries one).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def tool(name, env):
    for path in [os.environ.get(env, ""), shutil.which(name) or "",
                 os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "bin", name)]:
        if path and os.path.isfile(path):
            return path
    # Triton's wheel (in the bench's venv) carries nvdisasm.
    for path in glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "python-venv",
                                       "lib", "python3*", "site-packages", "triton", "backends", "nvidia", "bin", name)):
        return path
    sys.exit(f"gpu_sass: no {name} (set {env})")


def sass(ptx_path, arch, ptxas, nvdisasm):
    """{kernel: [instruction text, ...]}, and each kernel's labels {label: index}."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        subprocess.run([ptxas, "-arch", arch, "-o", cubin, ptx_path], check=True)
        text = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    parts = re.split(r"\n\s*\.text\.(\S+):", text)
    kernels = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        insts, labels = [], {}
        for line in body.split("\n"):
            m = re.match(r"^\s*(\.L_x_\d+):", line)
            if m:
                labels[m.group(1)] = len(insts)
                continue
            m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
            if m:
                insts.append(m.group(1))
        kernels[name] = (insts, labels)
    return kernels


def opcode(inst):
    words = inst.split()
    return words[1] if words[0].startswith("@") else words[0]


def innermost_loops(insts, labels):
    """(first, last) of each backward branch's range that holds no other such range."""
    loops = []
    for j, inst in enumerate(insts):
        m = re.search(r"BRA\s.*?(\.L_x_\d+)", inst)
        if m and m.group(1) in labels and labels[m.group(1)] <= j:
            loops.append((labels[m.group(1)], j))
    return [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]


def report(kernels):
    """Lines (kernel, kind, text) for every update kernel's innermost FFMA and copy loops."""
    out = []
    for name, (insts, labels) in kernels.items():
        if "init" in name:
            continue
        for a, z in innermost_loops(insts, labels):
            ops = [opcode(i) for i in insts[a:z + 1]]
            n = len(ops)
            ffma = sum(o.startswith("FFMA") for o in ops)
            lds = sum(o.startswith("LDS") for o in ops)
            wide = sum(o.startswith("LDS.128") for o in ops)
            ldg = sum(o.startswith("LDG") for o in ops)
            if ffma:
                out.append((name, "compute", f"{n:4d} instr {ffma:4d} FFMA {lds:3d} LDS ({wide} x128)  {n / ffma:.2f} instr/FFMA"))
            elif ldg:
                out.append((name, "copy", f"{n:4d} instr {ldg:4d} LDG  {n / ldg:.1f} instr/LDG"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kit")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--filter", default="")
    a = ap.parse_args()
    ptxas, nvdisasm = tool("ptxas", "PTXAS"), tool("nvdisasm", "NVDISASM")
    roots = [("default", os.path.join(a.kit, "bundles"))] + [(v, os.path.join(a.kit, "variants", v)) for v in a.variant]
    for bundle in sorted(glob.glob(os.path.join(a.kit, "bundles", "*", "*"))):
        case = os.path.relpath(bundle, os.path.join(a.kit, "bundles"))
        if a.filter and not re.search(a.filter, case):
            continue
        for model, root in roots:
            ptx = os.path.join(root, case, "kernels.ptx")
            if not os.path.exists(ptx):
                continue
            for kernel, kind, text in report(sass(ptx, a.arch, ptxas, nvdisasm)):
                print(f"{case:34s} {model:10s} {kernel:24s} {kind:8s} {text}")


if __name__ == "__main__":
    main()
