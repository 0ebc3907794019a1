"""The Python API behind `import edgekit`: convert, bench, inspect and sweep, keyword-only, with typed
results whose `.to_dict()` is exactly the CLI's JSON. The CLI is a thin layer over these functions.

Nothing heavy is imported here at module level: `convert` and `sweep` import TensorFlow when called,
`bench` only for a `reference`, `inspect` never.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.recipe import BudgetSpec, CalibrationSpec, ModelInfo, Preprocessing, PruningSpec, TrainingSpec
from edgekit.converters.results import ConvertResult
from edgekit.errors import MissingDependencyError, UnsupportedOpsError, UsageError

PathLike = str | os.PathLike


def require_convert_extra() -> None:
    """MissingDependencyError (exit 9) naming the extra when TensorFlow or Keras is not installed."""
    import importlib.util

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True

    missing = [m for m in ("tensorflow", "keras") if absent(m)]
    if missing:
        raise MissingDependencyError(f"this command needs {' and '.join(missing)}: pip install 'edgekit[convert]'")


_IN_CHILD: ContextVar[bool] = ContextVar("edgekit_convert_in_child", default=False)


def convert_in_child(model: PathLike | Any, **options: Any) -> ConvertResult:
    """`convert` as `edgekit convert` runs it: TensorFlow in a child process, so that a native crash in its
    converter or calibrator is a ConversionError (exit 5, nothing written) rather than the end of this
    process. Takes `convert`'s parameters; a model and data given as files (anything else converts here)."""
    token = _IN_CHILD.set(True)
    try:
        return convert(model, **options)
    finally:
        _IN_CHILD.reset(token)


def sweep_in_child(model: PathLike, **options: Any) -> SweepReport:
    """`sweep` as `edgekit sweep` runs it: each variant converts in a child process (`convert_in_child`), so a
    native crash in TensorFlow is that variant's failure, listed with the others, not the end of the sweep."""
    token = _IN_CHILD.set(True)
    try:
        return sweep(model, **options)
    finally:
        _IN_CHILD.reset(token)


def tune_in_child(model: PathLike, **options: Any) -> TuneReport:
    """`tune` as `edgekit tune` runs it: each trial converts in a child process (`convert_in_child`), so a
    native crash in TensorFlow fails that trial, not the search."""
    token = _IN_CHILD.set(True)
    try:
        return tune(model, **options)
    finally:
        _IN_CHILD.reset(token)


def _is_keras_model(model: Any) -> bool:
    return not isinstance(model, (str, bytes, os.PathLike)) and hasattr(model, "save") and hasattr(model, "layers")


def convert(model: PathLike | Any, *, mode: str | None = None, io: str = "float32", output: PathLike | None = None,
            force: bool = False, calib: PathLike | Any = None, input_shape: Sequence[int] | dict | None = None,
            seed: int = 0, strict: bool = False, target: str | None = None, trust_model: bool = False,
            preprocessing: Preprocessing | None = None, calibration: CalibrationSpec | None = None,
            pruning: PruningSpec | None = None, training: TrainingSpec | None = None,
            budget: BudgetSpec | None = None, info: ModelInfo | None = None,
            progress: Callable[[str], Any] | None = None) -> ConvertResult:
    """Convert a Keras model to .tflite, as `edgekit convert` does; returns a ConvertResult
    (`.path`, `.size_bytes`, `.metadata`, `.verification`, `.warnings`, `.notes`, `.changes`, `.to_dict()`).

    `model`: a .keras/.h5 file, a SavedModel folder, or an in-memory `keras.Model` (then `output` is
    required). `mode`: float32, float16, dynamic, int8 or int16x8 (None: float16 for `target="gpu"`,
    else float32). `calib`: an image folder or .npy/.npz path, a numpy array (uint8 images or finished
    input), an `(x, y)` pair of arrays, an iterable of arrays or a `tf.data.Dataset` (of which the first
    `calibration.samples` elements are read); for a model with several inputs, a dict by input name of any
    of these, or one .npz whose keys are the input names. `input_shape`: (1, H, W, C) fixing an open input
    size, or a dict by input name. The specs hold the rest: how images are prepared (`Preprocessing`), how
    calibration samples are drawn and int8 ranges set (`CalibrationSpec`), pruning (`PruningSpec`),
    fine-tuning and QAT (`TrainingSpec`), the int8 accuracy budget (`BudgetSpec`) and what the standard
    TFLite Metadata says about the model (`ModelInfo`). TensorFlow runs in this process; `convert_in_child`
    runs it in a child, as `edgekit convert` does."""
    from edgekit.converters.calibration import in_memory
    from edgekit.converters.recipe import ConvertRecipe

    in_memory_model = _is_keras_model(model)
    if in_memory_model and output is None:
        raise UsageError("an in-memory Keras model needs `output` (where to write the .tflite)")
    limit = (calibration or CalibrationSpec()).samples

    def one(source):
        return source if isinstance(source, (str, os.PathLike)) else in_memory(source, limit=limit)

    if isinstance(calib, dict):
        calib = {name: one(source) for name, source in calib.items()}
    elif calib is not None:
        calib = one(calib)
    options: dict[str, Any] = {  # ConvertRecipe's own arguments, checked and normalised there
        "mode": mode, "io": io, "output": output, "force": force, "calib": calib, "input_shape": input_shape,
        "seed": seed, "strict": strict, "target": target, "trust_model": trust_model, "pruning": pruning,
        "training": training, "budget": budget, "preprocessing": preprocessing or Preprocessing(),
        "calibration": calibration or CalibrationSpec(), "info": info or ModelInfo()}
    # tf_keras (Keras 2) models go through .h5, which the loader reads with tf_keras when Keras 3 cannot
    suffix = ".h5" if type(model).__module__.split(".")[0] == "tf_keras" else ".keras"
    name = f"{getattr(model, 'name', None) or 'model'}{suffix}" if in_memory_model else None
    recipe = ConvertRecipe(model=Path(name or model), **options)  # validated before TensorFlow is imported
    require_convert_extra()
    from edgekit.converters.pipeline import convert as run_convert

    if name is None:  # a model file
        from edgekit.converters.isolated import convert_isolated, picklable

        if _IN_CHILD.get() and picklable(recipe):
            return convert_isolated(recipe, progress=progress)
        return run_convert(recipe, progress=progress)
    with tempfile.TemporaryDirectory(prefix="edgekit-") as tmp:
        saved = _saved_keras(model, Path(tmp) / name)  # the same loader, checks and sha256 as for a file
        return run_convert(ConvertRecipe(model=saved, **options), progress=progress)


def _saved_keras(model: Any, path: Path) -> Path:
    """An in-memory keras.Model written to `path` (.keras, or .h5 for tf_keras), for the file converter."""
    model.save(path)
    return path


@dataclass(frozen=True)
class _Report:
    report: dict[str, Any]  # the JSON document, as the CLI prints it

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.report)


@dataclass(frozen=True)
class BenchReport(_Report):
    """`edgekit bench`'s report; `.to_dict()` is the `edgekit.bench/1` JSON."""

    @property
    def models(self) -> list[dict[str, Any]]:
        return self.report["models"]

    @property
    def reference(self) -> dict[str, Any] | None:
        return self.report["reference"]

    @property
    def failed_hosts(self) -> list[dict[str, Any]]:
        """`bench_on`: the hosts that gave no result, each with its one-line `error`."""
        return [h for h in self.report.get("hosts", []) if not h["ok"]]

    def check_hosts(self) -> None:
        """Raise RemoteError (exit 10) naming the failed hosts, after their results were used."""
        from edgekit.errors import RemoteError

        failed = self.failed_hosts
        if failed:
            raise RemoteError(f"{len(failed)} of {len(self.report['hosts'])} host(s) failed: "
                              + "; ".join(f"{h['host']}: {h['error']}" for h in failed))


def bench(paths: PathLike | Iterable[PathLike], *, data: PathLike | None = None,
          reference: PathLike | None = None, output: str | None = None, threads: int | None = None,
          runs: int = 100, warmup: int = 10, delegate: str | None = None, strict: bool = False,
          progress: Callable[[str, int], Any] | None = None, baseline: PathLike | None = None) -> BenchReport:
    """Latency (and, with `data`, top-1; with `reference`, the gap to the float model -- Keras, SavedModel or
    a float .tflite run without TensorFlow -- per output, with 95 % intervals and a collapse check) of
    one or more .tflite files, as `edgekit bench` measures them. `data`: an image folder of class
    sub-folders, or a .npz (keys: input names, or `x`; optional `y` labels) or .npy of samples. `output`
    names the output whose top-1 and agreement the main figures show (default: the first class-score one).
    `baseline`: a .tflite (a dense file beside a pruned one) benched first; each model's `speedup` is its
    p50 against the baseline's."""
    from edgekit.harness import bench as run_bench
    from edgekit.runtime.timing import BenchSettings

    files = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not files:
        raise UsageError("bench needs at least one .tflite")
    settings = BenchSettings(threads=threads, runs=runs, warmup=warmup, delegate=delegate)
    report = run_bench(files, settings, data=None if data is None else Path(data),
                       reference=None if reference is None else Path(reference), output=output, progress=progress,
                       strict=strict, baseline=None if baseline is None else Path(baseline))
    return BenchReport(report)


def bench_on(hosts: Sequence[str], paths: PathLike | Iterable[PathLike], *, data: PathLike | None = None,
             remote_data: str | None = None, reference: PathLike | None = None, output: str | None = None,
             threads: int | None = None, runs: int = 100, warmup: int = 10, delegate: str | None = None,
             strict: bool = False, remote_python: str = "python3", connect_timeout: float = 10.0,
             timeout: float = 600.0, keep_remote: bool = False) -> BenchReport:
    """`edgekit bench --on`: the same benchmark run by each device's own edgekit over SSH, hosts in
    parallel. `data` is copied to the device (`remote_data`: a path already there); accuracy is measured
    on the device. `reference`, a float .tflite (a Keras model is refused before connecting), is copied
    too and run by the device's runtime: each row gets its comparison and collapse check as `bench` gives
    them. The report has a row per (model, host), each with its `device`, and `hosts`: how each host fared
    (`BenchReport.failed_hosts`). Needs only the OpenSSH client here, no TensorFlow or LiteRT."""
    from edgekit.remote import Session, merged_report
    from edgekit.remote import bench_on as run_on

    files = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not files or not hosts:
        raise UsageError("needs at least one .tflite and one host", param="hosts")
    if data is not None and remote_data is not None:
        raise UsageError("give `data` (copied to the device) or `remote_data` (already there), not both")
    if reference is not None and data is None and remote_data is None:
        raise UsageError("needs `data` or `remote_data`: the models are compared on its samples", param="reference")
    args = [*(["--threads", str(threads)] if threads else []), "--runs", str(runs), "--warmup", str(warmup),
            *(["--output", output] if output else []), *(["--delegate", delegate] if delegate else []),
            *(["--strict"] if strict else []), *(["--data", remote_data] if remote_data else [])]
    session = Session(remote_python=remote_python, connect_timeout=connect_timeout, timeout=timeout, keep=keep_remote)
    ref = None if reference is None else Path(reference)
    results = run_on(list(hosts), files, session, bench_args=args, data=None if data is None else Path(data),
                     reference=ref)
    return BenchReport(merged_report(results, files, data=None if data is None else Path(data),
                                     remote_data=remote_data, reference=ref))


@dataclass(frozen=True)
class InspectReport(_Report):
    """`edgekit inspect`'s report; `.to_dict()` is the `edgekit.inspect/1` JSON."""

    path: str = ""

    @property
    def failing_runtimes(self) -> list[dict[str, Any]]:
        return [c for c in self.report["runtime_checks"] if not c["ok"]]

    def check_runtimes(self) -> None:
        """Raise UnsupportedOpsError (exit 5) naming the ops when a runtime asked about cannot load it."""
        failing = self.failing_runtimes
        if failing:
            ops = sorted({f"{o['op']} v{o['version']}" for c in failing for o in c["unsupported"]}
                         | {r for c in failing for r in c.get("unknown_reasons", [])})
            raise UnsupportedOpsError(f"{', '.join(c['runtime'] for c in failing)} cannot load {self.path}: "
                                      f"{', '.join(ops)}")


def inspect(path: PathLike, *, runtimes: Sequence[str] = (), gpu: bool = True, probe: bool = False,
            target: str | None = None) -> InspectReport:
    """What is inside a .tflite: ops and versions, dtypes, quantization, sparsity, metadata, GPU delegate
    coverage (`gpu`), the runtime it needs and whether each of `runtimes` ("tflite-runtime==2.14") loads
    it; `probe` loads and runs it once in a child process first. `target` (cpu, gpu, nnapi, npu, as
    `convert` takes it) judges the file for that accelerator: the ops it leaves on the CPU and why
    (`report["target"]`); the GPU analysis runs for gpu and nnapi only. Never imports TensorFlow."""
    from edgekit.runtime.compat import check_runtime, runtime_requirements
    from edgekit.runtime.delegates import TARGETS
    from edgekit.runtime.inspect import inspect_file, target_verdict

    if isinstance(runtimes, str):
        runtimes = (runtimes,)
    if target is not None and target not in TARGETS:
        raise UsageError(f"must be one of {', '.join(TARGETS)}, got {target!r}", param="target")
    if target in ("gpu", "nnapi") and not gpu:
        raise UsageError(f"`gpu=False` skips the GPU analysis that `target={target}` asks for")
    report = inspect_file(path, gpu=gpu if target is None else target in ("gpu", "nnapi"))
    if target is not None:
        report["target"] = target_verdict(report, target)
    if probe:
        from edgekit.runtime.probe import probe_model

        report["probe"] = probe_model(path)
    report["runtime_requirements"] = runtime_requirements(report)
    report["runtime_checks"] = [check_runtime(report, spec) for spec in runtimes]
    report.pop("op_list", None)
    return InspectReport(report, str(path))


@dataclass(frozen=True)
class SweepReport(_Report):
    """`edgekit sweep`'s result; `.to_dict()` is the `edgekit.sweep/1` document (with the full bench report)."""

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.report["rows"]

    @property
    def recommendation(self) -> dict[str, Any] | None:
        return self.report["recommendation"]


def sweep(model: PathLike, *, calib: PathLike, eval_data: PathLike, target: str = "cpu", max_drop: float = 1.0,
          train_data: PathLike | None = None, out: PathLike | None = None, force: bool = False,
          threads: int | None = None, runs: int = 100, seed: int = 0,
          progress: Callable[[str], Any] | None = None) -> SweepReport:
    """Every mode of `model` (and QAT variants with `train_data`) built and measured in one bench run,
    Pareto rows marked, one recommended for `target`; returns the `edgekit.sweep/1` document. `calib`: an
    image folder or a .npy/.npz, as `convert` reads it; `eval_data`: class folders or a .npz with labels.
    The parameters are declared on `SweepSettings` (the CLI's flags are made from them)."""
    from edgekit.sweeper import SweepSettings
    from edgekit.sweeper import sweep as run_sweep

    settings = SweepSettings(model=Path(model), calib=Path(calib), eval_data=Path(eval_data), target=target,
                             max_drop=max_drop, train_data=None if train_data is None else Path(train_data),
                             out=None if out is None else Path(out), force=force, threads=threads, runs=runs,
                             seed=seed, isolated=_IN_CHILD.get())
    require_convert_extra()
    from edgekit.converters.loading import detect_format

    detect_format(settings.model)  # bytes that are no model: refused once, not once per variant
    return SweepReport(run_sweep(settings, progress=progress))


@dataclass(frozen=True)
class TuneReport(_Report):
    """`edgekit tune`'s result; `.to_dict()` is the `edgekit.tune/1` document written to `out/pareto.json`."""

    @property
    def front(self) -> list[dict[str, Any]]:
        return self.report["front"]

    @property
    def chosen(self) -> list[dict[str, Any]]:
        """The file chosen per device and budget."""
        return self.report["chosen"]


def tune(model: PathLike, *, calib: PathLike, eval_data: PathLike, trials: int, out: PathLike,
         hosts: Sequence[str] = (), remote_python: str = "python3", storage: str | None = None,
         study: str | None = None, max_drop: float = 1.0, train_data: PathLike | None = None,
         threads: int | None = None, runs: int = 50, connect_timeout: float = 10.0, seed: int = 0,
         grace: int | None = None, progress: Callable[[Any], Any] | None = None) -> TuneReport:
    """Search `model`'s conversions (mode, calibration, float islands; pruning and QAT with `train_data`) for
    the trade-off of accuracy on `eval_data` (with its interval), p50 on each of `hosts` (over SSH; this
    machine without them) and size, until the Optuna study (`storage`: a URL or journal file; `out/study.db`
    by default) holds `trials` finished trials; run it again to go on, or on other machines against one
    PostgreSQL `storage` to share the work. Returns the `edgekit.tune/1` document, also written to
    `out/pareto.json` with `out/report.html`. The parameters are declared on `TuneSettings`."""
    from edgekit.tune_store import GRACE_SECONDS
    from edgekit.tuner import TuneSettings
    from edgekit.tuner import tune as run_tune

    settings = TuneSettings(model=Path(model), calib=Path(calib), eval_data=Path(eval_data), trials=trials,
                            out=Path(out), hosts=tuple(hosts), remote_python=remote_python, storage=storage,
                            study=study, max_drop=max_drop,
                            train_data=None if train_data is None else Path(train_data), threads=threads,
                            runs=runs, connect_timeout=connect_timeout, seed=seed, isolated=_IN_CHILD.get(),
                            grace=GRACE_SECONDS if grace is None else grace)
    require_convert_extra()
    from edgekit.converters.loading import detect_format

    detect_format(settings.model)
    return TuneReport(run_tune(settings, progress=progress))
