"""Benchmarks, run on demand: `python -m pytest -m perf -s tests/perf`. They print ratios measured in
one run; absolute times on these machines are noise."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from edgekit.bench import BenchSettings, measure_latency

pytestmark = pytest.mark.perf


def _bare_loop_p50(path, threads: int, runs: int, warmup: int) -> float:
    from edgekit.runtime import Model

    model = Model(path, num_threads=threads)
    interp = model.interpreter
    for info in model.inputs:
        interp.set_tensor(info.index, np.zeros(info.shape, info.dtype))
    for _ in range(warmup):
        interp.invoke()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        interp.invoke()
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times)) / 1e6


@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_bench_p50_is_within_5_percent_of_a_bare_invoke_loop(converted, mode):
    path = converted(mode)
    settings = BenchSettings(threads=1, runs=2000, warmup=200)
    ratios = []
    for _ in range(5):  # interleave to cancel drift
        bare = _bare_loop_p50(path, 1, settings.runs, settings.warmup)
        _, result = measure_latency(path, settings, None)
        ratios.append(result["latency_ms"]["p50"] / bare)
    ratio = float(np.median(ratios))
    print(f"\n{mode}: edgekit bench p50 / bare invoke() p50 = {ratio:.3f} (runs: {[f'{r:.3f}' for r in ratios]})")
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
