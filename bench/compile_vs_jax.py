#!/usr/bin/env python3
"""Compile time against JAX, alternating: polytile's bench case compile/conv3x3_64_56/fwd+bwd (the conv's
forward and both gradients compiled from scratch) and JAX's jit of the same pair, round after round in one
process, so that both see the same stretch of a machine whose speed drifts (run_bench.py --frameworks times
JAX after the whole C++ run). Prints each round and the medians; the ratio is in compiles per second
(JAX's time over polytile's: above 1, polytile compiles faster).

Usage: build/python-venv/bin/python bench/compile_vs_jax.py [--rounds N] [--binary BENCH]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import framework_peers  # noqa: E402

CASE = "compile/conv3x3_64_56/fwd+bwd"


def polytile_ms(binary):
    """The median of 3 repetitions of the bench's compile case, in ms."""
    r = subprocess.run([binary, "--benchmark_filter=^compile/", "--benchmark_repetitions=3", "--benchmark_format=json"],
                       capture_output=True, text=True, check=True)
    medians = [b for b in json.loads(r.stdout)["benchmarks"] if b.get("aggregate_name") == "median"]
    if not medians:
        sys.exit(f"compile_vs_jax: {binary} reported no median for {CASE}")
    return medians[0]["real_time"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(here), "build", "polytile_bench"))
    args = ap.parse_args()
    peers, versions = framework_peers.available()
    if "jax" not in peers:
        sys.exit("compile_vs_jax: JAX does not import here (run with build/python-venv/bin/python)")
    print("frameworks: " + ", ".join(versions))
    kind, spec, _, _ = framework_peers.parse(CASE)
    step = framework_peers.jax_step(kind, spec)
    step()  # JAX's one-time start-up
    mine, theirs = [], []
    for r in range(args.rounds):
        theirs.append(framework_peers.mean_seconds(step, lambda x: x.block_until_ready(), 5) * 1e3)
        mine.append(polytile_ms(args.binary))
        print(f"round {r}: polytile {mine[-1]:.1f} ms, jax {theirs[-1]:.1f} ms, ratio {theirs[-1] / mine[-1]:.2f}", flush=True)
    ratios = [t / m for m, t in zip(mine, theirs)]
    print(f"medians: polytile {statistics.median(mine):.1f} ms, jax {statistics.median(theirs):.1f} ms; "
          f"per-round ratio median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
          f"{sum(x >= 1 for x in ratios)} of {len(ratios)} rounds at 1.0 or above)")


if __name__ == "__main__":
    main()
