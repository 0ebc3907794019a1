"""`edgekit tune`: a multi-objective search -- accuracy change against the float model, p50 on each device,
file size -- over mode, calibration, float islands, pruning and QAT, on Optuna (its samplers and its study
storage; edgekit schedules nothing itself). A trial converts one file and benches it: accuracy here, on the
evaluation data against the float model; latency on each device (`hosts`, over SSH; this machine without
them) while holding that device's lease. The same command on many machines joins one study in PostgreSQL.

Every run ends by writing `pareto.json` and `report.html` from every finished trial of the study (any
worker's): the front under the sweep's dominance (smaller, no slower on every device, accuracy matched
within the paired interval) and the file chosen per device and budget (tune_front.py)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.declare import option, required
from edgekit.errors import EdgekitError, UsageError
from edgekit.params import CONNECT_TIMEOUT_HELP, HOST_METAVAR, REMOTE_PYTHON_HELP
from edgekit.progress import Step
from edgekit.tune_store import GRACE_SECONDS, retry_callback

FAILURES_IN_A_ROW = 3
SETTING_FAILURES_IN_A_ROW = 10
WAIT_SECONDS = 1.0  # how often a worker waiting for other workers' last trials looks again
LOCAL = "local"  # the device name of this machine where no `hosts` are given


def _not_negative(v: int) -> str | None:
    return None if v >= 0 else f"must be >= 0, got {v}"


@dataclass(frozen=True)
class TuneSettings:
    """What `edgekit tune` takes, each option declared once (the CLI's flags are made from them)."""

    model: Path
    calib: Path = required("Calibration data: an image folder or a .npy/.npz file (as convert's --calib).",
                           kind=Path)
    eval_data: Path = required("Labelled data every trial is judged on: class folders, or a .npz with labels.",
                               kind=Path)
    trials: int = required("Finished trials the study holds when this run stops (run again with more to go on: "
                           "finished trials are kept; 0 creates the study and queues its first trials).",
                           kind=int, check=_not_negative)
    out: Path = required("Write models/, pareto.json and report.html here (and the study, without --storage).",
                         kind=Path)
    hosts: tuple[str, ...] = option((), "Time every trial's file on this device over SSH, with its own edgekit; "
                                    "each device is an objective. NAME=HOST names it: the same NAME on several "
                                    "hosts is one kind of device (a trial times on whichever is free; workers "
                                    "may each bring their own) [this machine].", flag="--on", repeat=True,
                                    metavar=f"[NAME=]{HOST_METAVAR}")
    remote_python: str = option("python3", REMOTE_PYTHON_HELP)
    storage: str | None = option(None, "Optuna storage: sqlite:///PATH, postgresql://USER@HOST/DB (workers on "
                                 "many machines join one study), or a journal file (.log) [OUT/study.db].",
                                 metavar="URL")
    study: str | None = option(None, "Study name [the model file's stem].")
    max_drop: float = option(1.0, "Accuracy budget (top-1 points) of the file chosen per device, judged on its "
                             "interval; the float islands of the first trials keep within it.", kind=float)
    train_data: Path | None = option(None, "Add pruning (unstructured, 2:4, channels) and QAT, with their epochs, to "
                                     "the search.", kind=Path)
    threads: int | None = option(None, "Interpreter threads for the latency runs [all cores].", kind=int)
    runs: int = option(50, "Timed invokes per file and device.", kind=int)
    connect_timeout: float = option(10.0, CONNECT_TIMEOUT_HELP, kind=float)
    seed: int = 0
    isolated: bool = False  # each trial converts in a child process (converters/isolated.py)
    grace: int = field(default=GRACE_SECONDS)  # seconds without a heartbeat before a trial's worker counts as dead

    def __post_init__(self) -> None:
        from edgekit.runtime.samples import SampleData

        if not self.max_drop >= 0:
            raise UsageError(f"must be >= 0, got {self.max_drop:g}", param="max_drop")
        if self.trials < 0:
            raise UsageError(f"must be >= 0, got {self.trials}", param="trials")
        if self.runs < 1:
            raise UsageError(f"must be >= 1, got {self.runs}", param="runs")
        self.pools  # noqa: B018 - checked here, before anything runs
        for name in ("calib", "eval_data"):
            SampleData.check(getattr(self, name), error=UsageError, param=name)
        if self.train_data is not None:
            SampleData.check(self.train_data, error=UsageError, param="train_data")

    @property
    def study_name(self) -> str:
        return self.study or (self.model.stem if self.model.suffix in (".keras", ".h5") else self.model.name)

    @property
    def pools(self) -> dict[str, tuple[str, ...]]:
        """Device name -> the hosts of that kind (`NAME=HOST`; a bare HOST is its own name)."""
        found: dict[str, tuple[str, ...]] = {}
        for spec in self.hosts:
            name, given, host = spec.partition("=")
            name, host = (name, host) if given else (spec, spec)
            if not name or not host or any(c.isspace() for c in name):
                raise UsageError(f"takes [NAME=][USER@]HOST[:PORT], got {spec!r}", param="hosts")
            found[name] = (*found.get(name, ()), host)
        hosts = [h for pool in found.values() for h in pool]
        if len(set(hosts)) < len(hosts):
            raise UsageError("each host once", param="hosts")
        return found

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.pools) or (LOCAL,)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Run:
    """What every trial of one worker shares."""

    s: TuneSettings
    url: str
    models: Path
    say: Callable[[Any], None]
    goal: int
    converter: Any = None  # an IsolatedConverter where trials convert in a child process (the CLI)
    failures: list[EdgekitError] = field(default_factory=list)  # this worker's, since its last finished trial
    stopped: bool = False  # too many failures in a row
    started: float = field(default_factory=time.perf_counter)


def tune(s: TuneSettings, *, progress: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Run trials until the study holds `s.trials` finished ones, then write pareto.json and report.html from
    the whole study; returns the pareto.json document."""
    from edgekit.tune_store import import_optuna, open_storage, storage_url

    optuna = import_optuna()
    s.out.mkdir(parents=True, exist_ok=True)
    run = _Run(s, storage_url(s.storage, s.out), s.out / "models", progress or (lambda _m: None), s.trials)
    run.models.mkdir(exist_ok=True)
    study = _study(optuna, run, open_storage(run.url, grace=s.grace))
    done = _finished(optuna, study)
    if done < s.trials:
        import contextlib

        from edgekit.converters.isolated import IsolatedConverter

        run.say(f"study {s.study_name}: {done} of {s.trials} trials finished; {s.trials - done} to run")
        # the CLI's trials convert in one child (TensorFlow imported once there); the library's in this process
        with IsolatedConverter() if s.isolated else contextlib.nullcontext() as converter:
            run.converter = converter
            _run_trials(optuna, study, run)
    summary = _write_reports(optuna, study, run)
    if run.stopped:
        last = run.failures[-1]  # its class keeps its exit code (a device's failure: 10)
        last.args = (f"{len(run.failures)} trials in a row failed; the last: {last.args[0] if last.args else ''}",)
        raise last
    return summary


def _run_trials(optuna: Any, study: Any, run: _Run) -> None:
    """Trials one at a time until the study holds `run.goal` finished ones. A trial is started only where the
    finished and running ones together fall short of the goal: where other workers' running trials would
    reach it, this one waits for them rather than start one too many; should one of them die, its trial is
    failed (its heartbeat stopped, or its process is gone from this machine) and queued again, and a waiting
    worker runs it."""
    state = optuna.trial.TrialState
    waiting = False
    while not run.stopped:
        _recover_local(optuna, study)
        done = _finished(optuna, study)
        running = len(study.get_trials(deepcopy=False, states=(state.RUNNING,)))
        if done >= run.goal:
            return
        if done + running >= run.goal:
            optuna.storages.fail_stale_trials(study)  # as each trial's start does (Optuna), while none starts
            if not waiting:
                run.say(f"{done} of {run.goal} finished, {running} running on other workers: waiting for them")
            waiting = True
            time.sleep(WAIT_SECONDS)
            continue
        waiting = False
        study.optimize(lambda t: _trial(t, run), n_trials=1, catch=(EdgekitError,))


def _study(optuna: Any, run: _Run, storage: Any) -> Any:
    """The study, created with its first trials (the sweep's variants) queued where it is new."""
    from edgekit.tune_space import first_trials

    s = run.s
    directions = ["minimize"] * (2 + len(s.devices))  # drop, size, p50 per device
    sampler = optuna.samplers.TPESampler(seed=(s.seed * 1_000_003 + os.getpid()) % 2**32, n_startup_trials=8)
    try:
        study = optuna.create_study(storage=storage, study_name=s.study_name, directions=directions,
                                    sampler=sampler, load_if_exists=True)
    except ValueError as exc:  # a study of this name with other objectives (other devices)
        raise UsageError(f"study {s.study_name!r}: {exc}", param="study") from None
    known = study.user_attrs.get("devices")
    if known is None:
        channels = open_image_channels(s.model)
        study.set_user_attr("model", str(s.model))
        study.set_user_attr("open_image_channels", channels)
        for params in first_trials(trainable=s.train_data is not None, max_drop=s.max_drop, sizes=bool(channels)):
            study.enqueue_trial(params, skip_if_exists=True)
        study.set_user_attr("devices", list(s.devices))  # last: a study with it has its first trials
    elif known != list(s.devices):
        raise UsageError(f"study {s.study_name!r} times on {', '.join(known)}; this run names "
                         f"{', '.join(s.devices)} (another --study for other devices)", param="hosts")
    return study


def open_image_channels(model: Path) -> int | None:
    """The channels of the model's one image input where its height and width are open (the input size is
    searched then), else None."""
    from edgekit.converters.loading import load_model
    from edgekit.converters.shapes import is_image

    inputs = load_model(model).inputs
    if len(inputs) != 1 or not is_image(inputs[0]) or inputs[0].shape[1:3] != (None, None):
        return None
    return int(inputs[0].shape[3])  # type: ignore[arg-type]


def _finished(optuna: Any, study: Any) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def _recover_local(optuna: Any, study: Any) -> None:
    """Trials left RUNNING by a worker of this machine that is gone (killed): failed, and queued again with
    the same settings. On a journal file there is no heartbeat, so this is how its trials come back; on a
    database it saves waiting out the grace period."""
    from edgekit.files import process_alive

    host = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        who = str(t.user_attrs.get("worker", ""))
        name, _, pid = who.rpartition(":")
        if name != host or not pid.isdigit() or process_alive(int(pid)):
            continue
        try:
            study._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            continue  # another worker got there first
        retry_callback()(study, study._storage.get_trial(t._trial_id))  # as a stopped heartbeat is retried


def _trial(trial: Any, run: _Run) -> tuple[float, ...]:
    """One trial; a failure is kept on it (`error`) and counted. A worker stops after FAILURES_IN_A_ROW
    failures in a row (a device that never answers, data the model cannot read), or SETTING_FAILURES_IN_A_ROW
    where each was a conversion its settings could not make (int16x8 of an op TFLite has no int16 kernel
    for): the rest of the space may still convert."""
    from optuna import TrialPruned

    from edgekit.errors import CalibrationError, ConversionError, InputShapeError

    try:
        values = _trial_values(trial, run)
    except KeyboardInterrupt:  # Ctrl-C: Optuna fails the trial; its settings are queued for the next run,
        retry_callback()(trial.study, trial.study._storage.get_trial(trial._trial_id))  # as a dead worker's
        raise
    except EdgekitError as exc:
        trial.set_user_attr("error", str(exc))
        run.say(f"trial {trial.number}: failed: {exc}")
        run.failures.append(exc)
        settings_fault = (ConversionError, CalibrationError, InputShapeError)
        of_settings = all(isinstance(e, settings_fault) for e in run.failures)
        if len(run.failures) >= (SETTING_FAILURES_IN_A_ROW if of_settings else FAILURES_IN_A_ROW):
            run.stopped = True
        if isinstance(exc, settings_fault):  # pruned, not failed: TPE counts a pruned trial as a bad one and
            raise TrialPruned(str(exc)) from exc  # moves away; a failed one it ignores, and proposes it again
        raise
    run.failures.clear()
    return values


def _finished_like(trial: Any) -> tuple[int, Any]:
    """(finished trials of the study, the first of them with this trial's settings or None)."""
    from optuna.trial import TrialState

    finished = trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return len(finished), next((t for t in finished if t.params == trial.params), None)


def _failed_before(trial: Any, params: dict[str, Any]) -> None:
    """The settings of a trial that failed to convert before: the same error again, without building."""
    from optuna.trial import TrialState

    from edgekit.errors import ConversionError

    for t in trial.study.get_trials(deepcopy=False, states=(TrialState.PRUNED, TrialState.FAIL)):
        if t.params == trial.params and "error" in t.user_attrs and "converted" not in t.user_attrs:
            raise ConversionError(f"as trial {t.number} ({params['mode']}...): {t.user_attrs['error']}")


def _trial_values(trial: Any, run: _Run) -> tuple[float, ...]:
    """Convert and bench one trial's file: (drop in points, size in bytes, p50 per device)."""
    from edgekit.tune_space import describe, suggest

    s = run.s
    trial.set_user_attr("worker", worker_id())
    channels = trial.study.user_attrs.get("open_image_channels")
    params = suggest(trial, trainable=s.train_data is not None, sizes=bool(channels))
    words = describe(params)
    trial.set_user_attr("settings", words)
    _failed_before(trial, params)
    done, same = _finished_like(trial)
    if same is not None:  # a discrete space is sampled again: the file exists, its figures stand
        for key, value in same.user_attrs.items():
            if key not in ("worker", "same_as"):
                trial.set_user_attr(key, value)
        trial.set_user_attr("same_as", same.number)
        run.say(f"trial {trial.number}: {words}: as trial {same.number} (the same settings; not built again)")
        return tuple(same.values)
    run.say(Step(f"trial {trial.number}: {words} [{done} of {run.goal} finished]", stage="tune", done=done,
                 total=run.goal))
    path = run.models / f"{s.study_name}.trial{trial.number}.tflite"
    converted = _convert(run, params, path, channels or 3)
    trial.set_user_attr("converted", True)  # a failure from here on is not the settings' (_failed_before)
    measured = _measure(run, path)
    record = {**converted, **measured, "file": str(path)}
    for key, value in record.items():
        trial.set_user_attr(key, value)
    p50 = [measured["p50_ms"][d] for d in s.devices]
    run.say(Step(f"trial {trial.number}: {words}: {_result_line(measured, s.devices)}", stage="tune",
                 done=done + 1, total=run.goal))  # a line that stays in a log
    return (measured["drop_points"], float(measured["size_bytes"]), *p50)


def _result_line(m: dict[str, Any], devices: tuple[str, ...]) -> str:
    times = ", ".join(f"p50 {m['p50_ms'][d]:.3f} ms on {d}" for d in devices)
    low, high = m["change_interval"] or (None, None)
    interval = "" if low is None else f" ({low:+.2f} to {high:+.2f})"
    return f"top-1 {100 * m['top1']:.2f} %, change {-m['drop_points']:+.2f}{interval}, {m['size_bytes']:,} bytes, {times}"


def _convert(run: _Run, params: dict[str, Any], path: Path, channels: int) -> dict[str, Any]:
    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe
    from edgekit.tune_space import recipe_keywords

    s = run.s
    kw = recipe_keywords(params, calib=s.calib, eval_data=s.eval_data, train_data=s.train_data, seed=s.seed,
                         channels=channels)
    recipe = ConvertRecipe(model=s.model, output=path, force=True, **kw)
    t0 = time.perf_counter()
    result = (run.converter.convert(recipe, progress=run.say) if run.converter is not None
              else convert(recipe, progress=run.say))
    autopilot = result.metadata.get("autopilot") or {}
    if autopilot.get("int8_file"):  # the autopilot handed back a float file: the trial is the int8 mix it found
        result.path.unlink()
        result.path.with_name(autopilot["int8_file"]).rename(path)
    return {"convert_seconds": round(time.perf_counter() - t0, 2), "mode": params["mode"],
            "float_ops": len(autopilot.get("float_ops") or [])}


def _measure(run: _Run, path: Path) -> dict[str, Any]:
    """Accuracy here against the float model (paired, per sample), then p50 on each device under its lease."""
    from edgekit.harness import BenchSettings, bench
    from edgekit.tune_store import lease

    s = run.s
    p50: dict[str, float] = {}
    timed_on: dict[str, str] = {}
    if s.hosts:  # accuracy here (the latency of this run is not used: a few invokes), latency on each device
        report = bench([path], BenchSettings(threads=s.threads, runs=1, warmup=0), data=s.eval_data,
                       reference=s.model, per_sample=True)
        for name, pool in s.pools.items():
            run.say(f"timing on {name} (waiting while other trials hold {'it' if len(pool) == 1 else 'them'})")
            with lease(run.url, pool) as host:
                p50[name], timed_on[name] = _remote_p50(run, host, path), host
    else:
        unit = f"{LOCAL}:{socket.gethostname()}"
        with lease(run.url, [unit]):
            report = bench([path], BenchSettings(threads=s.threads, runs=s.runs), data=s.eval_data,
                           reference=s.model, per_sample=True)
        p50[LOCAL], timed_on[LOCAL] = report["models"][0]["latency_ms"]["p50"], unit
    return _accuracy(report["models"][0]) | {"p50_ms": p50, "timed_on": timed_on}


def _accuracy(m: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    acc = m["accuracy"] or {}
    correct = acc.get("per_sample_correct")
    comparison = acc.get("comparison") or {}
    if correct is None or acc.get("top1_delta_points") is None:
        raise UsageError("the evaluation data has no labels the model's classes match", param="eval_data")
    return {"size_bytes": m["size_bytes"], "top1": acc["top1"], "drop_points": -acc["top1_delta_points"],
            "change_interval": comparison.get("change_interval"), "comparison": comparison,
            "correct": np.packbits(np.asarray(correct, dtype=bool)).tobytes().hex(), "n": len(correct)}


def _remote_p50(run: _Run, host: str, path: Path) -> float:
    from edgekit.errors import RemoteError
    from edgekit.remote import Session, bench_on

    s = run.s
    session = Session(remote_python=s.remote_python, connect_timeout=s.connect_timeout, timeout=600.0)
    args = [*(["--threads", str(s.threads)] if s.threads else []), "--runs", str(s.runs)]
    (result,) = bench_on([host], [path], session, bench_args=args)
    if not result.ok or result.report is None:
        raise RemoteError(f"{host}: {result.error}")
    return float(result.report["models"][0]["latency_ms"]["p50"])


def _write_reports(optuna: Any, study: Any, run: _Run) -> dict[str, Any]:
    import json

    from edgekit.files import atomic_write_text
    from edgekit.html_report import tune_html
    from edgekit.tune_front import summary_of

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    counts = {state.name.lower(): len(study.get_trials(deepcopy=False, states=(state,)))
              for state in optuna.trial.TrialState}
    summary = summary_of(run.s, complete, counts, storage=run.url,
                         seconds=round(time.perf_counter() - run.started, 1))
    atomic_write_text(run.s.out / "pareto.json", json.dumps(summary, indent=2), force=True)
    atomic_write_text(run.s.out / "report.html", tune_html(summary), force=True)
    return summary
