#!/usr/bin/env python3
"""Runs build/polytile_bench, writes bench/results.json, prints polytile/peer ratios and each rate as a fraction
of the machine's limits measured in the same run (peak/fma, peak/triad) as a table, and plots the ratios and
the absolute rates with those limits as lines to bench/ratios.png (matplotlib, from Debian's python3-matplotlib).

Usage: bench/run_bench.py [--filter REGEX] [--min-time SECONDS] [--binary BENCH] [--out DIR] [--frameworks]
                          [--framework-passes N] [--reuse] [-- BENCH ARGS]
A case "<name>/polytile" is paired with "<name>/<peer>" (onednn, onednn_reorders, openblas, no_defract,
no_prefetch, unfused, unsplit, alone, cached, through_max; on a GPU cublas, cudnn, cudnn_tf32);
the ratio is polytile's rate over the peer's (above 1: polytile is faster). With --frameworks, JAX and
PyTorch (bench/framework_peers.py, where they import: run with build/python-venv/bin/python) time the same
cases right after, as the peers "jax" and "torch" of the same table and plot (frameworks.json keeps them),
each rate the median over N passes through all the cases (3 by default). The summary table -- a row per
conv or kernel, polytile against its library peer, PyTorch and JAX, and the machine's limits -- goes to
table.md in --out too (the README's table). --reuse runs nothing and tabulates and plots the results
already in --out.
The GPU benchmark: bench/run_bench.py --binary build/polytile_gpu_bench -- --bundles KIT/bundles
Every library in the run gets its large allocations on transparent huge pages where the kernel gives them,
as polytile's buffers do (GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for malloc, THP_MEM_ALLOC_ENABLE=1 for
PyTorch; the script sets both and runs itself again).
"""
import argparse
import json
import os
import re
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def rate(b):
    for key in ("GFLOP/s", "GB/s", "compiles/s"):
        if key in b:
            return b[key], key
    return 1.0 / b["real_time"], "1/time"


# The peers a user would pick instead of polytile (the summary table's columns), and the pairings of
# polytile against itself (a switch off, another input or size), which only the long table shows.
LIBRARY_PEERS = ("onednn", "onednn_reorders", "openblas", "cublas", "cudnn", "cudnn_tf32")
SELF_PEERS = ("no_defract", "no_prefetch", "unfused", "unsplit", "alone", "cached", "through_max")
FRAMEWORK_PEERS = ("torch", "jax")
ITEM_ORDER = ("fwd", "bwd_data", "bwd_weights", "bwd", "bwd_stop_max", "rows", "columns", "total", "columns_max")


def group_of(case):
    """(row, item) of a case in the summary table: a conv's directions, the sizes of a matrix product and
    the variants of a kernel share a row."""
    parts = case.split("/")
    if parts[0] in ("conv", "conv_nchw") and len(parts) == 3:
        return "/".join(parts[:2]), parts[2]
    if parts[0].startswith("sgemm") and len(parts) >= 2:
        return parts[0], parts[1]
    return parts[0], "/".join(parts[1:])


def summary_table(rows, of_limit):
    """The README's table: a row per conv (its directions) or kernel (its sizes or variants), each column
    its cases' values joined by " / ": polytile's rate, the library peer's (oneDNN, OpenBLAS, cuBLAS or
    cuDNN: the one the bench pairs with the case), PyTorch's and JAX's, polytile's ratio to each, and
    polytile's fraction of the machine's limit. Compile times as ms. Then how many cases polytile ran at
    least as fast as every peer."""
    by_case = {}
    for case, peer, mine, theirs, unit, ratio in rows:
        entry = by_case.setdefault(case, {"mine": mine, "unit": unit, "peers": {}})
        if peer in LIBRARY_PEERS + FRAMEWORK_PEERS:
            entry["peers"][peer] = (theirs, ratio)
    groups = {}
    for case, entry in by_case.items():
        if entry["peers"]:
            group, item = group_of(case)
            groups.setdefault(group, []).append((item, case))

    def order(item):
        if item in ITEM_ORDER:
            return (0, ITEM_ORDER.index(item), "")
        return (1, int(item), "") if item.isdigit() else (2, 0, item)

    def value(rate, unit):
        return f"{1e3 / rate:.0f}" if unit == "compiles/s" else f"{rate:.1f}"

    lines = ["| case | unit | polytile | oneDNN / OpenBLAS | PyTorch | JAX | polytile / oneDNN, OpenBLAS | "
             "polytile / PyTorch | polytile / JAX | polytile / limit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for group in sorted(groups):
        items = sorted(groups[group], key=lambda ic: order(ic[0]))
        unit = by_case[items[0][1]]["unit"]
        cols = {k: [] for k in ("mine", "lib", "torch", "jax", "r_lib", "r_torch", "r_jax", "limit")}
        for _, case in items:
            entry = by_case[case]
            cols["mine"].append(value(entry["mine"], unit))
            cols["limit"].append(of_limit(entry["mine"], unit))
            lib = next((entry["peers"][p] for p in LIBRARY_PEERS if p in entry["peers"]), None)
            for key, got in (("lib", lib), ("torch", entry["peers"].get("torch")), ("jax", entry["peers"].get("jax"))):
                cols[key].append(value(got[0], unit) if got else "-")
                cols["r_" + key].append(f"{got[1]:.2f}" if got else "-")
        label = " ".join([group] + [" / ".join(item.replace("_", "-") if item in ITEM_ORDER else item for item, _ in items)]).strip()
        shown_unit = "ms" if unit == "compiles/s" else unit
        lines.append(f"| {label} | {shown_unit} | " + " | ".join(" / ".join(cols[k]) for k in
                     ("mine", "lib", "torch", "jax", "r_lib", "r_torch", "r_jax", "limit")) + " |")
    paired = [e for e in by_case.values() if e["peers"]]
    ahead = sum(1 for e in paired if min(r for _, r in e["peers"].values()) >= 1.0)
    lines.append("")
    lines.append(f"polytile at least as fast as every peer on {ahead} of the {len(paired)} cases with a peer")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", default=".")
    ap.add_argument("--min-time", default="0.2")
    ap.add_argument("--binary", default=os.path.join(root, "build", "polytile_bench"))
    ap.add_argument("--out", default=here, help="folder for results.json and ratios.png")
    ap.add_argument("--frameworks", action="store_true", help="also time JAX and PyTorch on the same cases")
    ap.add_argument("--framework-passes", type=int, default=3,
                    help="passes of JAX and PyTorch through the cases; each rate is the median over them")
    ap.add_argument("--cpu", help="polytile's code for this CPU as LLVM names it (e.g. znver3: AVX2 code on an AVX-512 machine)")
    ap.add_argument("--peers-isa", choices=["avx2"],
                    help="hold oneDNN, OpenBLAS and PyTorch to this instruction set (JAX's XLA keeps its own choice)")
    ap.add_argument("--reuse", action="store_true",
                    help="run nothing: tabulate and plot the results.json (and frameworks.json) already in --out")
    ap.add_argument("rest", nargs="*", help="arguments for the benchmark binary (after --)")
    args = ap.parse_args()
    if args.cpu:
        os.environ["POLYTILE_BENCH_CPU"] = args.cpu
    if args.peers_isa == "avx2":
        amd = "AuthenticAMD" in open("/proc/cpuinfo").read()
        os.environ.update(ONEDNN_MAX_CPU_ISA="AVX2", OPENBLAS_CORETYPE="Zen" if amd else "Haswell", ATEN_CPU_CAPABILITY="avx2")
    # Every peer's large allocations on transparent huge pages, as polytile's buffers are (Buffer): glibc's
    # malloc advises its mmap'ed memory (the frameworks', oneDNN's own), PyTorch's CPU allocator its own
    # (THP_MEM_ALLOC_ENABLE); both are read at start, so the script runs itself again with them set.
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" not in tunables or os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        env = dict(os.environ, THP_MEM_ALLOC_ENABLE="1")
        if "glibc.malloc.hugetlb=" not in tunables:
            env["GLIBC_TUNABLES"] = (tunables + ":" if tunables else "") + "glibc.malloc.hugetlb=1"
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, "results.json")
    status = 0
    if not args.reuse:
        r = subprocess.run([args.binary, "--benchmark_filter=" + args.filter, "--benchmark_min_time=" + args.min_time,
                            "--benchmark_out=" + out, "--benchmark_out_format=json", *args.rest])
        status = 1 if r.returncode else 0  # a failed check still leaves the other cases' numbers
    if not os.path.exists(out):
        if args.reuse:
            sys.exit(f"run_bench: --reuse found no {out}: run the bench with this --out first")
        sys.exit(f"run_bench: {args.binary} failed (exit {r.returncode}) and wrote no results")
    with open(out) as f:
        benches = json.load(f)["benchmarks"]
    # With --benchmark_repetitions (after --), each case's median over its repetitions: on a shared machine
    # whose speed drifts, interleaved repetitions (--benchmark_enable_random_interleaving=true) pair
    # polytile and its peers over the same stretch of time.
    by_name = {}
    medians = {}
    repetitions = {}  # name -> every repetition's entry
    for b in benches:
        name = re.sub(r"/iterations:\d+", "", b["run_name"] if "run_name" in b else b["name"])
        name = name.replace("/real_time", "").replace("/manual_time", "")
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = b
        else:
            by_name[name] = b
            repetitions.setdefault(name, []).append(b)
    by_name.update(medians)
    rows = []
    for name, b in sorted(by_name.items()):
        parts = name.split("/")
        if "polytile" not in parts:
            continue
        i = parts.index("polytile")
        case = "/".join(parts[:i] + parts[i + 1:])
        mine, unit = rate(b)
        for peer in LIBRARY_PEERS + SELF_PEERS:
            other = by_name.get("/".join(parts[:i] + [peer] + parts[i + 1:]))
            if other:
                theirs, _ = rate(other)
                rows.append((case, peer, mine, theirs, unit, mine / theirs))
        if not any(r[0] == case for r in rows):
            rows.append((case, "-", mine, float("nan"), unit, float("nan")))
    frameworks_json = os.path.join(args.out, "frameworks.json")
    if args.reuse and args.frameworks and not os.path.exists(frameworks_json):
        sys.exit(f"run_bench: --reuse --frameworks needs {frameworks_json}, which a run with --frameworks writes")
    if args.frameworks or (args.reuse and os.path.exists(frameworks_json)):
        if args.reuse:
            with open(frameworks_json) as f:
                measured = {(m["case"], m["peer"]): (m["rate"], m["unit"]) for m in json.load(f)}
        else:
            sys.path.insert(0, here)
            import framework_peers

            cases = sorted({r[0] for r in rows})
            measured, unknown = framework_peers.measure(cases, log=lambda line: print(line, file=sys.stderr),
                                                         rounds=max(1, args.framework_passes))
            if unknown:
                print("frameworks: no spec in bench/framework_peers.py for " + ", ".join(unknown), file=sys.stderr)
        polytile_rate = {r[0]: r[2] for r in rows}
        for (case, peer), (theirs, unit) in sorted(measured.items()):
            rows.append((case, peer, polytile_rate[case], theirs, unit, polytile_rate[case] / theirs))
        rows.sort(key=lambda r: (r[0], r[1]))
        rows = [r for r in rows if r[1] != "-" or not any(o[0] == r[0] and o[1] != "-" for o in rows)]
        if not args.reuse:
            with open(frameworks_json, "w") as f:
                json.dump([{"case": c, "peer": p, "rate": t, "unit": u} for (c, p), (t, u) in sorted(measured.items())], f, indent=1)
    # The machine's limits, measured in the same run (bench/machine_bench.cpp): each rate as a fraction.
    # A limit is the best of its repetitions, not their median: what the machine can do, which a
    # repetition that shared the cores or the memory with another guest of the host (half the FMA rate,
    # 33 instead of 60 GB/s) only hides. (The triad's arrays are 4x the L3: no repetition finds them there.)
    limits = {}
    for name, unit in (("peak/fma", "GFLOP/s"), ("peak/triad", "GB/s")):
        if name in repetitions:
            limits[unit] = max(b[unit] for b in repetitions[name])
    if limits:
        print("machine limits in this run: " + ", ".join(f"{v:.1f} {k}" for k, v in sorted(limits.items())) +
              " (GFLOP/s: f32 FMA peak on the bench threads; GB/s: STREAM triad on 128 MiB arrays; each the best of its repetitions)\n")
    # Not a limit: which hours the run had. On a guest whose host moves its vCPUs, writing lines that every
    # thread has just read ran at 20-26 GB/s where they sat near each other and 4-9 where they sat far apart
    # (a micro-kernel's packed panels are that case; docs/benchmarks.md). Each repetition, in run order.
    if "peak/shared_writes" in repetitions:
        print("writes to lines every bench thread holds (peak/shared_writes): " +
              ", ".join(f"{b['GB/s']:.1f}" for b in repetitions["peak/shared_writes"]) +
              " GB/s\n")

    def of_limit(rate_, unit):
        return f"{rate_ / limits[unit]:.2f}" if unit in limits else "-"

    print("| case | peer | polytile | peer | unit | polytile/peer | polytile/limit |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case, peer, mine, theirs, unit, ratio in rows:
        print(f"| {case} | {peer} | {mine:.1f} | {theirs:.1f} | {unit} | {ratio:.2f} | {of_limit(mine, unit)} |")
    summary = summary_table(rows, of_limit)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(summary) + "\n")
    print("\n" + "\n".join(summary) + "\n(also in " + os.path.join(args.out, "table.md") + ")")
    for b in benches:
        if b["name"].startswith("compile/"):
            stages = {k: round(v, 1) for k, v in b.items() if k.endswith("_ms")}
            print(f"\ncompile time per stage (ms), {b['name']}: {stages}")
    for case, peer, mine, theirs, unit, ratio in rows:
        if unit == "compiles/s":
            print(f"compile time, {case}: polytile {1e3 / mine:.0f} ms, {peer} {1e3 / theirs:.0f} ms")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (apt-get install python3-matplotlib): no plot", file=sys.stderr)
        return status
    paired = [row for row in rows if row[1] != "-"]
    # Absolute rates per unit: polytile's bar, each peer a dot, the machine's limit a dashed line.
    units = [u for u in ("GFLOP/s", "GB/s") if any(r[4] == u for r in rows)]
    panels = ([("ratios", paired)] if paired else []) + [(u, [r for r in rows if r[4] == u]) for u in units]
    if panels:
        heights = [0.3 * len({(r[0], r[1]) if name == "ratios" else r[0] for r in part}) + 1.2 for name, part in panels]
        fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)), gridspec_kw={"height_ratios": heights},
                                 squeeze=False)
        for ax, (name, part) in zip(axes[:, 0], panels):
            if name == "ratios":
                labels = [f"{c} vs {p}" for c, p, *_ in part]
                # Ratios on a log scale, clipped to [1/20, 20] (a clipped bar ends at the edge; the table has the value).
                ax.barh(labels, [min(max(r[5], 0.05), 20) for r in part])
                ax.set_xscale("log")
                ax.set_xlim(0.05, 20)
                ax.axvline(1.0, color="black", linewidth=0.8)
                ax.axvline(0.5, color="red", linewidth=0.8, linestyle="--")
                ax.set_xlabel("polytile / peer, log scale (higher is better; dashed: 0.5x)")
                continue
            cases = sorted({r[0] for r in part})
            ax.barh(cases, [next(r[2] for r in part if r[0] == c) for c in cases], label="polytile")
            peers = sorted({r[1] for r in part if r[1] != "-"})
            for k, peer in enumerate(peers):
                got = [(r[3], r[0]) for r in part if r[1] == peer]
                ax.scatter([g[0] for g in got], [g[1] for g in got], s=14, zorder=3, label=peer,
                           marker="osD^v<>"[k % 7])
            if name in limits:
                what = "f32 FMA peak" if name == "GFLOP/s" else "triad bandwidth"
                ax.axvline(limits[name], color="red", linewidth=0.8, linestyle="--", label=f"{what} {limits[name]:.0f}")
            ax.set_xlabel(name + " (higher is better)")
            ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "ratios.png"), dpi=100)
        print("plot: " + os.path.join(args.out, "ratios.png"))
    return status


if __name__ == "__main__":
    sys.exit(main())
