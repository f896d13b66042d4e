"""The bench's Python side without running a benchmark: the README's summary table (run_bench.py), how
the frameworks are timed (framework_peers.py: the mean of a pass's runs, the median over passes) and
run_bench.py --reuse on a finished run's files. Neither JAX nor PyTorch is needed: the frameworks are
replaced by a fake peer on a fake clock."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

import framework_peers  # noqa: E402
import run_bench  # noqa: E402


def test_cases_share_a_row_by_conv_product_or_kernel():
    assert run_bench.group_of("conv/conv3x3_64_56/bwd_data") == ("conv/conv3x3_64_56", "bwd_data")
    assert run_bench.group_of("conv_nchw/conv7x7_s2_3to64_224/fwd") == ("conv_nchw/conv7x7_s2_3to64_224", "fwd")
    assert run_bench.group_of("sgemm/1000/1000") == ("sgemm", "1000")
    assert run_bench.group_of("sgemm_tn/2048/2048") == ("sgemm_tn", "2048")
    assert run_bench.group_of("softmax/bwd_stop_max") == ("softmax", "bwd_stop_max")
    assert run_bench.group_of("bias_grad") == ("bias_grad", "")


def test_summary_table_joins_each_rows_cases_in_order():
    rows = [  # (case, peer, polytile, peer's rate, unit, ratio), as main() builds them
        ("conv/c/bwd_data", "onednn", 300.0, 310.0, "GFLOP/s", 300 / 310),
        ("conv/c/bwd_data", "torch", 300.0, 150.0, "GFLOP/s", 2.0),
        ("conv/c/fwd", "jax", 320.0, 100.0, "GFLOP/s", 3.2),
        ("conv/c/fwd", "onednn", 320.0, 300.0, "GFLOP/s", 320 / 300),
        ("sgemm/1000/1000", "openblas", 280.0, 290.0, "GFLOP/s", 280 / 290),
        ("sgemm/256/256", "openblas", 300.0, 200.0, "GFLOP/s", 1.5),
        ("softmax/fwd", "cached", 20.0, 25.0, "GB/s", 0.8),  # polytile against itself: not in the table
        ("softmax/bwd", "torch", 30.0, 20.0, "GB/s", 1.5),
        ("compile/c/fwd+bwd", "jax", 10.0, 7.5, "compiles/s", 10 / 7.5),
    ]
    lines = run_bench.summary_table(rows, lambda rate, unit: f"L{rate:g}")
    assert lines[2:] == [
        "| compile c/fwd+bwd | ms | 100 | - | - | 133 | - | - | 1.33 | L10 |",
        "| conv/c fwd / bwd-data | GFLOP/s | 320.0 / 300.0 | 300.0 / 310.0 | - / 150.0 | 100.0 / - | 1.07 / 0.97 | - / 2.00 | 3.20 / - | L320 / L300 |",
        "| sgemm 256 / 1000 | GFLOP/s | 300.0 / 280.0 | 200.0 / 290.0 | - / - | - / - | 1.50 / 0.97 | - / - | - / - | L300 / L280 |",
        "| softmax bwd | GB/s | 30.0 | - | 20.0 | - | - | 1.50 | - | L30 |",
        "",
        "polytile at least as fast as every peer on 4 of the 6 cases with a peer",
    ]


class FakeClock:
    """time.perf_counter for framework_peers: a step advances it by the seconds it is given."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def step(self, seconds):
        def run():
            self.now += seconds() if callable(seconds) else seconds
        return run


def test_a_pass_is_the_mean_of_its_runs(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(framework_peers.time, "perf_counter", clock)
    durations = iter([5.0, 1.0, 1.0, 1.0, 7.0])  # the warm-up, then four runs
    seconds = framework_peers.mean_seconds(clock.step(lambda: next(durations)), lambda r: r, repeats=4, min_seconds=0)
    assert seconds == pytest.approx(2.5)  # (1 + 1 + 1 + 7) / 4, not the median's 1; the warm-up left out


def test_each_rate_is_the_median_over_passes_of_the_fastest_variant(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(framework_peers.time, "perf_counter", clock)
    made = []
    # Variant "a" takes 1 s a run in the first pass, 9 in the second, 2 in the third (median 2); "b" 3 s.
    per_pass = {"a": [1.0, 9.0, 2.0], "b": [3.0, 3.0, 3.0]}

    def make(kind, args):
        made.append(kind)
        k = len(made) - 1
        return {label: clock.step(times[k]) for label, times in per_pass.items()}

    monkeypatch.setattr(framework_peers, "available", lambda: ({"fake": (make, lambda r: r)}, ["fake 1.0"]))
    lines = []
    rates, unknown = framework_peers.measure(["sgemm/1024/1024", "no/such/case"], repeats=1, log=lines.append, rounds=3)
    assert made == ["sgemm", "sgemm", "sgemm"]
    assert unknown == ["no/such/case"]
    work = 2.0 * 1024 ** 3
    assert rates == {("sgemm/1024/1024", "fake"): (pytest.approx(work * 1e-9 / 2.0), "GFLOP/s")}
    assert lines[-1] == f"  sgemm/1024/1024 fake: {work * 1e-9 / 2:.1f} GFLOP/s (passes {work * 1e-9 / 9:.1f}-{work * 1e-9:.1f}; a; b {work * 1e-9 / 3:.1f})"


def run_reuse(out, *extra):
    return subprocess.run([sys.executable, os.path.join(BENCH, "run_bench.py"), "--reuse", "--out", str(out), *extra],
                          capture_output=True, text=True)


def test_reuse_tabulates_a_finished_run_without_running_it(tmp_path):
    def entry(run_name, rate, aggregate=None):  # as Google Benchmark's JSON names repetitions and aggregates
        b = {"name": run_name + (f"_{aggregate}" if aggregate else ""), "run_name": run_name, "real_time": 1.0, "GFLOP/s": rate}
        b.update({"run_type": "aggregate", "aggregate_name": aggregate} if aggregate else {"run_type": "iteration"})
        return b

    # polytile's repetitions 290 and 310 with a median of 300 (the median is used); the FMA peak's best
    # repetition (400) is the limit.
    benches = [entry("conv/c/fwd/polytile/real_time", r) for r in (290.0, 310.0)]
    benches += [entry("conv/c/fwd/polytile/real_time", 300.0, "median"),
                entry("conv/c/fwd/onednn/real_time", 250.0), entry("conv/c/fwd/onednn/real_time", 250.0, "median"),
                entry("peak/fma/real_time", 400.0), entry("peak/fma/real_time", 380.0)]
    (tmp_path / "results.json").write_text(json.dumps({"benchmarks": benches}))
    frameworks = [{"case": "conv/c/fwd", "peer": "torch", "rate": 200.0, "unit": "GFLOP/s"}]
    (tmp_path / "frameworks.json").write_text(json.dumps(frameworks))
    before = (tmp_path / "frameworks.json").read_text()
    r = run_reuse(tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "table.md").read_text().splitlines()[2:] == [
        "| conv/c fwd | GFLOP/s | 300.0 | 250.0 | 200.0 | - | 1.20 | 1.50 | - | 0.75 |",
        "",
        "polytile at least as fast as every peer on 1 of the 1 cases with a peer",
    ]
    assert (tmp_path / "frameworks.json").read_text() == before  # read, not written again


def test_reuse_says_what_is_missing(tmp_path):
    r = run_reuse(tmp_path)
    assert r.returncode != 0 and "--reuse found no" in r.stderr and "results.json" in r.stderr
    (tmp_path / "results.json").write_text(json.dumps({"benchmarks": []}))
    r = run_reuse(tmp_path, "--frameworks")
    assert r.returncode != 0 and "frameworks.json" in r.stderr
