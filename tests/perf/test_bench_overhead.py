"""Benchmarks, run on demand: `python -m pytest -m perf -s tests/perf`. They print ratios measured in
one run; absolute times on these machines are noise."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from edgekit.runtime.timing import BenchSettings, measure_latency

pytestmark = pytest.mark.perf


def _bare_loop_p50(path, threads: int, runs: int, warmup: int) -> float:
    """The reference knows nothing of edgekit: LiteRT's own interpreter from the file, seeded inputs in
    range, each invoke() timed alone with perf_counter_ns. Milliseconds."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path), num_threads=threads)
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interp.get_input_details():
        if np.issubdtype(d["dtype"], np.integer):
            lim = np.iinfo(d["dtype"])
            x = rng.integers(lim.min, lim.max, size=d["shape"], endpoint=True).astype(d["dtype"])
        else:
            x = rng.standard_normal(d["shape"]).astype(d["dtype"])
        interp.set_tensor(d["index"], x)
    for _ in range(warmup):
        interp.invoke()
    times = np.empty(runs, np.int64)
    clock = time.perf_counter_ns
    for i in range(runs):
        t0 = clock()
        interp.invoke()
        times[i] = clock() - t0
    return float(np.median(times)) / 1e6


@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_bench_p50_is_within_5_percent_of_a_bare_invoke_loop(converted, mode):
    path = converted(mode)
    settings = BenchSettings(threads=1, runs=2000, warmup=200)
    bare, bench = [], []
    for i in range(6):  # interleaved, the order swapped every round so that drift falls on both alike
        for which in (("bare", "bench") if i % 2 == 0 else ("bench", "bare")):
            if which == "bare":
                bare.append(_bare_loop_p50(path, settings.threads, settings.runs, settings.warmup))
            else:
                bench.append(measure_latency(path, settings, None)[1]["latency_ms"]["p50"])
    ratio = float(np.median(bench)) / float(np.median(bare))
    print(f"\n{mode}: edgekit bench p50 / bare LiteRT invoke() p50 = {ratio:.3f} (medians of 6 rounds; "
          f"bench {[round(b * 1e3, 1) for b in bench]} us, bare {[round(b * 1e3, 1) for b in bare]} us)")
    assert 0.95 <= ratio <= 1.05


def test_import_runtime_cost():
    code = "import time; t = time.perf_counter(); import edgekit.runtime; print(time.perf_counter() - t)"
    runtime = min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout) for _ in range(5))
    code_np = "import time; t = time.perf_counter(); import numpy; print(time.perf_counter() - t)"
    numpy_only = min(float(subprocess.run([sys.executable, "-c", code_np], capture_output=True, text=True,
                                          check=True).stdout) for _ in range(5))
    print(f"\nimport edgekit.runtime: {runtime:.3f} s (numpy alone {numpy_only:.3f} s, ratio {runtime / numpy_only:.2f})")
    assert runtime <= 0.5


def test_int8_vs_float32_latency_is_reported_as_measured(converted):
    """XNNPACK's int8 kernels can lose to float32 on small models on x86; print the ratio, whichever way."""
    settings = BenchSettings(threads=1, runs=2000, warmup=200)
    p50 = {m: measure_latency(converted(m), settings, None)[1]["latency_ms"]["p50"] for m in ("float32", "int8")}
    print(f"\nint8 p50 / float32 p50 = {p50['int8'] / p50['float32']:.2f}")
