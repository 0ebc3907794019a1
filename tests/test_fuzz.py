"""Mutated .tflite files through `inspect` and the runtime loader: only edgekit's own errors escape and
no mutation kills the process (the worker runs in a child so that a crash is seen, not suffered)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fuzz_worker.py")
KERAS_WORKER = Path(__file__).with_name("keras_fuzz_worker.py")


def fuzz(paths: list[Path], count: int, worker: Path = WORKER) -> tuple[list[tuple[int, str]], list[str]]:
    crashes, escapes, n = [], [], 0
    while n < count:
        proc = subprocess.run([sys.executable, str(worker), str(n), str(count), *map(str, paths)],
                              capture_output=True, text=True, timeout=1200)
        lines = proc.stdout.splitlines()
        escapes += [line for line in lines if line.startswith("ESCAPE")]
        if lines and lines[-1] == "DONE":
            break
        numbers = [int(line) for line in lines if line.isdigit()]
        last = numbers[-1] if numbers else n
        crashes.append((last, signal.Signals(-proc.returncode).name if proc.returncode < 0 else str(proc.returncode)))
        n = last + 1
    return crashes, escapes


@pytest.fixture(scope="module")
def seeds(converted, detector_tflite):
    return [converted("int8", "int8"), converted("float16"), converted("dynamic"), converted("float32"),
            detector_tflite]


def test_a_hundred_mutations(seeds):
    """The default tier's share (its time budget: 0.2 s a mutation); .ci/run runs the 2000 below too."""
    crashes, escapes = fuzz(seeds, 100)
    assert crashes == [] and escapes == []


@pytest.mark.slow
def test_two_thousand_mutations(seeds):
    crashes, escapes = fuzz(seeds, 2000)
    assert crashes == [] and escapes == []


def test_eighty_keras_archive_mutations(digits_keras):
    """Truncated or bit-flipped zips, config values replaced (huge units, wrong types), classes swapped for
    Lambda or modules for os, damaged weights, dropped or doubled members: the loader and one prediction
    only ever raise edgekit's errors, and the process survives."""
    crashes, escapes = fuzz([digits_keras], 80, KERAS_WORKER)
    assert crashes == [] and escapes == []


@pytest.mark.slow
def test_a_thousand_keras_archive_mutations(digits_keras):
    crashes, escapes = fuzz([digits_keras], 1000, KERAS_WORKER)
    assert crashes == [] and escapes == []


def test_a_crashing_interpreter_is_an_error_in_the_parent(tmp_path, converted):
    """probe_model runs the load in a child: a model whose kernel aborts (tests/test_probe_cli.py) takes the
    child down, and the parent gets a one-line UnsafeModelError."""
    from test_probe_cli import crashing_model

    from edgekit.errors import UnsafeModelError
    from edgekit.runtime.probe import probe_model

    path = tmp_path / "crash.tflite"
    path.write_bytes(crashing_model())
    with pytest.raises(UnsafeModelError, match="crashed \\(SIGABRT\\)") as caught:
        probe_model(path)
    # what happened, without the path, for callers that word their own message (QAT's check of its file)
    assert caught.value.reason == "the interpreter crashed (SIGABRT) while loading or running it"
    assert probe_model(converted("int8"))["ok"]
