"""`edgekit tune` on a MobileNetV2 (alpha 0.35, 64x64, trained here on the digits), issue 51's acceptance in one
run: one worker against two on one PostgreSQL study (tests/postgres.py), each worker on its own core with one
interpreter thread and its own loopback device (tests/sshd.py aliases, the device's Python pinned to that core
too), the same twelve trials in both studies (sweep's six variants and six int8 calibration methods, queued):
wall time of two <= 0.65x one's. Then the one-worker study's front against `sweep`'s files of the same model:
all timed on the same device in one bench run, accuracy paired on the same 360 images: every Pareto row of
the sweep is matched by a front file at least as good on every objective (no larger, no slower, top-1 within
the interval). `python -m pytest -m perf -s tests/perf/test_tune_scaling.py` (about 8 minutes on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from postgres import EmbeddedPostgres
from sshd import LoopbackSSHD

import edgekit
from tests.perf.test_int8_ranges import _mobilenet

pytestmark = pytest.mark.perf

ROOT = Path(__file__).resolve().parents[2]
EXTRA = ("minmax", "percentile", "mse", "ema", "bias", "equalize")  # int8 trials queued after sweep's six

WORKER = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
import edgekit
model, calib, evals, out, storage, study, trials, device, python = sys.argv[2:]
edgekit.tune(model, calib=calib, eval_data=evals, out=out, storage=storage, study=study, trials=int(trials),
             hosts=("dev=" + device,), remote_python=python, threads=1, runs=30,
             progress=lambda m: print(m, flush=True))
"""


def _pinned_python(folder: Path, core: int) -> str:
    """The device's Python, pinned to one core: the worker's loopback device shares its core."""
    path = folder / f"python-core{core}"
    path.write_text(f"#!/bin/sh\nexec taskset -c {core} {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def _queued(model: Path, digits_dir: Path, out: Path, storage: str, study: str) -> int:
    """A study with sweep's six trials (tune's first) and the EXTRA int8 ones queued: the trials in all."""
    import optuna

    from edgekit.tune_store import open_storage, storage_url

    edgekit.tune(model, calib=digits_dir / "train", eval_data=digits_dir / "test", out=out, storage=storage,
                 study=study, trials=0, hosts=("dev=devA",))
    s = optuna.load_study(study_name=study, storage=open_storage(storage_url(storage, out)))
    for method in EXTRA:
        s.enqueue_trial({"mode": "int8", "calib_method": method, "float_islands": False})
    return len(s.get_trials(deepcopy=False))


def _workers(n: int, model: Path, digits_dir: Path, tmp: Path, storage: str, study: str, trials: int,
             env: dict) -> float:
    """Wall seconds of `n` workers (worker i on core i with device devA/devB) finishing the study."""
    procs = []
    start = time.monotonic()
    for i in range(n):
        device = ("devA", "devB")[i]
        args = [str(i), str(model), str(digits_dir / "train"), str(digits_dir / "test"), str(tmp / f"{study}-{i}"),
                storage, study, str(trials), device, _pinned_python(tmp, i)]
        log = open(tmp / f"{study}-{i}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append((subprocess.Popen([sys.executable, "-c", WORKER, *args], stdout=log, stderr=subprocess.STDOUT,
                                       cwd=ROOT, env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}), log))
    for proc, log in procs:
        code = proc.wait(timeout=3600)
        log.close()
        assert code == 0, Path(log.name).read_text()[-3000:]
    return time.monotonic() - start


def test_two_workers_on_one_study_and_the_front_against_sweep(digits_dir, tmp_path):
    model = _mobilenet(tmp_path / "mnv2.keras", digits_dir)
    (tmp_path / "ssh").mkdir()
    with EmbeddedPostgres() as pg, LoopbackSSHD(tmp_path / "ssh", aliases=("devA", "devB")) as sshd:
        trials = _queued(model, digits_dir, tmp_path / "q1", pg.url, "one")
        assert _queued(model, digits_dir, tmp_path / "q2", pg.url, "two") == trials == 12
        one = _workers(1, model, digits_dir, tmp_path, pg.url, "one", trials, sshd.env)
        two = _workers(2, model, digits_dir, tmp_path, pg.url, "two", trials, sshd.env)
        print(f"\n{trials} trials of a MobileNetV2 0.35 at 64x64, each worker one core and one thread with its own "
              f"loopback device: one worker {one:.0f} s, two workers {two:.0f} s: {two / one:.2f}x")
        _front_against_sweep(model, digits_dir, tmp_path, pg.url, sshd.env)
    assert two <= 0.65 * one, f"two workers took {two / one:.2f}x one worker's time (bound 0.65x)"


def _front_against_sweep(model: Path, digits_dir: Path, tmp: Path, storage: str, env: dict) -> None:
    from edgekit.harness import BenchSettings, bench
    from edgekit.intervals import matches, no_slower

    front = edgekit.tune(model, calib=digits_dir / "train", eval_data=digits_dir / "test", out=tmp / "one-0",
                         storage=storage, study="one", trials=12, hosts=("dev=devA",)).front
    swept = edgekit.sweep(model, calib=digits_dir / "train", eval_data=digits_dir / "test", out=tmp / "sweep",
                          threads=1).to_dict()
    pareto = [r for r in swept["rows"] if r["pareto"]]
    files = [Path(r["file"]) for r in pareto] + [Path(r["file"]) for r in front]
    old = os.environ.get("EDGEKIT_SSH_COMMAND")
    os.environ["EDGEKIT_SSH_COMMAND"] = env["EDGEKIT_SSH_COMMAND"]
    try:  # every file on the one device, in one run
        timed = edgekit.bench_on(["devA"], files, threads=1, runs=200, remote_python=sys.executable).models
    finally:
        if old is None:
            os.environ.pop("EDGEKIT_SSH_COMMAND")
        else:
            os.environ["EDGEKIT_SSH_COMMAND"] = old
    p50 = {Path(m["path"]): m["latency_ms"]["p50"] for m in timed}
    local = bench(files, BenchSettings(threads=1, runs=1, warmup=0), data=digits_dir / "test", reference=model,
                  per_sample=True)["models"]
    correct = {f: m["accuracy"]["per_sample_correct"] for f, m in zip(files, local)}
    print(f"sweep's Pareto rows against tune's front ({len(front)} files), p50 on devA, one thread:")
    for r in pareto:
        s = Path(r["file"])
        best = [f for f in front if Path(f["file"]).stat().st_size <= s.stat().st_size
                and no_slower(p50[Path(f["file"])], p50[s]) and matches(correct[Path(f["file"])], correct[s])]
        print(f"  sweep {r['variant']}: {s.stat().st_size:,} bytes, p50 {p50[s]:.3f} ms, top-1 {100 * r['top1']:.2f} %"
              f" -> tune trial(s) {', '.join(str(f['trial']) for f in best) or 'none'} at least as good")
        assert best, f"no file on tune's front is at least as good as sweep's {r['variant']}"
