"""Latency on the interpreter that runs the model: init, first invoke, then timed invokes one by one.
TensorFlow-free; `edgekit.bench` and the autopilot's cost figures both time with it."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import InputShapeError, InvokeError, UsageError, one_line
from edgekit.runtime.backend import Runner
from edgekit.runtime.model import Model, quantize


def resolve_threads(value: int | None) -> int:
    """Interpreter threads: all cores when not given; 0 or less is an error, not a silent default."""
    if value is None:
        return os.cpu_count() or 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"must be at least 1, got {value}", param="threads")
    return value


@dataclass(frozen=True)
class BenchSettings:
    threads: int | None = None  # interpreter threads; None: all cores
    runs: int = 100
    warmup: int = 10
    seed: int = 0
    delegate: str | None = None  # overrides the model's delegate hints: cpu, gpu, npu or a library path

    def __post_init__(self) -> None:
        object.__setattr__(self, "threads", resolve_threads(self.threads))
        if self.runs < 1:
            raise UsageError(f"must be at least 1, got {self.runs}", param="runs")
        if self.warmup < 0:
            raise UsageError(f"must not be negative, got {self.warmup}", param="warmup")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def latency_input(model: Model, seed: int, sample: np.ndarray | None) -> list[np.ndarray]:
    """Typed inputs for timing: a real sample when there is one, else seeded data in range."""
    rng = np.random.default_rng(seed)
    out = []
    for info in model.inputs:
        if sample is not None and info is model.inputs[0]:
            out.append(quantize(sample[None], info))
        elif np.issubdtype(info.dtype, np.integer):
            lim = np.iinfo(info.dtype)
            out.append(rng.integers(lim.min, lim.max, size=info.shape, endpoint=True).astype(info.dtype))
        else:
            out.append(rng.standard_normal(info.shape).astype(info.dtype))
    return out


def _sized_interpreter(model: Model, path: Path, sample: np.ndarray | None) -> Runner:
    """The runner to time: the model's own, or, for an input of open size (a U-Net's height and width),
    one resized to the data's first sample: unsized, LiteRT holds it at 1 and XNNPACK cannot reshape."""
    if sample is not None and len(model.inputs) == 1:
        shape = (1, *sample.shape)
        if shape == tuple(model.inputs[0].shape):
            return model.runner
        with model.lock:
            return model.interpreter_for(shape)
    open_inputs = [i for i in model.inputs  # open and written unsized (1): a real size is the user's to give
                   if any(s < 0 and d <= 1 for s, d in zip(i.shape_signature[1:], i.shape[1:]))]
    if open_inputs:
        said = ", ".join(f"{i.name} {list(i.shape_signature)}" for i in open_inputs)
        raise InputShapeError(f"{path}: the model takes inputs of open size ({said}); bench times a concrete "
                              "size: pass `data`, whose first sample's size is timed")
    return model.runner


def time_invokes(runner: Runner, n: int, tick: Callable[[int], None] | None = None) -> np.ndarray:
    """Milliseconds of `n` invoke() calls, timed one by one; nothing else happens inside the timer."""
    times = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    invoke = runner.invoke
    step = max(1, n // 50)
    for i in range(n):
        t0 = clock()
        invoke()
        times[i] = clock() - t0
        if tick is not None and i % step == step - 1:
            tick(step)
    if tick is not None and n % step:  # the runs past the last whole step: the count ends at n
        tick(n % step)
    return times / 1e6


def measure_latency(path: Path, settings: BenchSettings, sample: np.ndarray | None,
                    tick: Callable[[int], None] | None = None) -> tuple[Model, dict[str, Any]]:
    rss_before = _rss_bytes()
    t0 = time.perf_counter()
    model = Model(path, num_threads=settings.threads, delegate=settings.delegate)
    init_ms = (time.perf_counter() - t0) * 1e3
    interp = _sized_interpreter(model, path, sample)
    try:  # a kernel that fails at invoke (a bad index, a missing operand) is the model's fault: exit 3
        for info, x in zip(model.inputs, latency_input(model, settings.seed, sample)):
            interp.set(info.index, x)
        t0 = time.perf_counter()
        interp.invoke()
        first_ms = (time.perf_counter() - t0) * 1e3
        if settings.warmup:
            time_invokes(interp, settings.warmup)
        ms = time_invokes(interp, settings.runs, tick)
    except (RuntimeError, ValueError) as exc:
        raise InvokeError(f"{path}: inference failed: {one_line(exc)}") from None
    mean = float(ms.mean())
    latency = {
        "init": init_ms,
        "first": first_ms,
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
        "mean": mean,
        "std": float(ms.std()),
        "min": float(ms.min()),
    }
    result = {
        **({"timed_input_shape": [int(d) for d in interp.input_details()[0]["shape"]]}
           if interp is not model.runner else {}),
        "latency_ms": latency,
        "throughput_per_s": 1000.0 / mean if mean > 0 else None,
        "memory": {"rss_delta_bytes": _rss_bytes() - rss_before, "peak_rss_bytes": _peak_rss_bytes()},
    }
    return model, result
