"""convert(): every input checked once (`preflight`), then the stages (converters/stages/) composed, their
records' sections merged into the file's metadata, and the file written atomically. Nothing is written when
any step fails."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit._version import __version__
from edgekit.converters._tf import import_tf
from edgekit.converters.labels import class_names
from edgekit.converters.loading import detect_format
from edgekit.converters.metadata_writer import add_metadata
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.results import ConvertResult
from edgekit.converters.stages import budget, calibrate, load, measure, quantize, reads, target, train, verify
from edgekit.converters.standard_metadata import standard_metadata
from edgekit.errors import CalibrationError, ModelFormatError, UsageError
from edgekit.files import atomic_write_bytes, check_writable
from edgekit.runtime.model import Model
from edgekit.runtime.probe import trust
from edgekit.runtime.samples import SampleData
from edgekit.runtime.tflite_metadata import with_metadata

METADATA_SCHEMA = "edgekit.metadata/1"
OWN_KEYS = ("schema", "mode", "io", "tools", "recipe", "timing")  # the write step's; the rest are the stages' KEYS


def tool_versions() -> dict[str, str]:
    tf = import_tf()
    import keras

    from edgekit.runtime.backend import get_backend

    backend = get_backend()
    return {
        "edgekit": __version__,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        backend.name: backend.version,
    }


def _data_sources(recipe: ConvertRecipe) -> list[tuple[str, Any]]:
    """(parameter, source) of every data source the recipe names, calibration first."""
    calib = recipe.calib if isinstance(recipe.calib, dict) else {None: recipe.calib}
    given = [("calib", c) for c in calib.values()]
    if recipe.training is not None:
        given += [("training.data", recipe.training.data), ("training.val_data", recipe.training.val_data)]
    if recipe.budget is not None:
        given.append(("budget.eval_data", recipe.budget.eval_data))
    return given


def _check_inputs(recipe: ConvertRecipe) -> None:
    """Every file the recipe reads exists, before anything is loaded or an output checked: a missing
    `calib` is said first, not after an output that exists."""
    if not recipe.model.exists():
        raise ModelFormatError(f"{recipe.model}: no such file or folder")
    for param, path in _data_sources(recipe):
        if isinstance(path, Path) and not path.exists():
            raise CalibrationError(f"{path}: no such file or folder", param=param)
    class_names(recipe.info.labels)  # read and checked here; against the model once it is loaded


def _check_sources(recipe: ConvertRecipe) -> None:
    """Every data file the recipe names opens as the sample reader opens it, its headers checked (no data
    read): a bad .npy is refused before TensorFlow starts."""
    for param, path in _data_sources(recipe):
        if isinstance(path, Path):
            SampleData.check(path, error=CalibrationError, param=param)


def preflight(recipe: ConvertRecipe) -> Path:
    """What `convert` refuses before loading anything (no TensorFlow): inputs that do not exist or do not
    open as data, a model file whose bytes are no model, an output it may not write. The output path."""
    _check_inputs(recipe)
    detect_format(recipe.model)  # bytes that are no model are refused here, before TensorFlow starts
    out = _check_output(recipe)
    _check_sources(recipe)
    return out


def _check_output(recipe: ConvertRecipe) -> Path:
    out = recipe.output_path
    calib = recipe.calib if isinstance(recipe.calib, dict) else {None: recipe.calib}
    for given in (recipe.model, *calib.values()):
        if isinstance(given, Path) and out.resolve() == given.resolve():
            raise UsageError(f"{out} would replace an input; choose another", param="output")
    check_writable(out, recipe.force)
    return out


def convert(recipe: ConvertRecipe, *, progress=None, preflighted: Path | None = None) -> ConvertResult:
    """Run one conversion and write the .tflite: load -> [train] -> calibrate -> quantize -> [budget] ->
    verify -> [target] -> [measure] -> write. Each stage reads its declared part of the recipe and the records
    it needs, and returns its record; the metadata is the records' sections. `preflighted`: the output path
    `preflight(recipe)` gave, where the caller ran it (converters/isolated.py, before its child starts)."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    out = preflight(recipe) if preflighted is None else preflighted
    records = _stages(recipe, progress, say)
    loaded, quantized, verified = records.loaded, records.quantized, records.verified
    done = [r for r in (records.targeted, records.budgeted, records.measured) if r is not None]
    mode = records.budgeted.mode if records.budgeted is not None else recipe.mode  # the file's: float16 may win
    metadata = merged({"schema": METADATA_SCHEMA, "mode": mode, "io": recipe.io}, loaded.metadata(),
                      records.calibrated.metadata(), quantized.metadata(), verified.metadata(),
                      {"tools": tool_versions(), "recipe": recipe.stored(), "timing": records.timing},
                      *(r.metadata() for r in done))
    changes = [*recipe.notes, *loaded.notes, *quantized.notes]  # what edgekit chose: said, nothing to do
    warnings = [*verified.warnings, *quantized.warnings, *records.calibrated.warnings,
                *(records.targeted.warnings if records.targeted is not None else []),
                *(records.budgeted.warnings if records.budgeted is not None else []),
                *(records.measured.warnings if records.measured is not None else [])]
    missed = [m for r in done for m in getattr(r, "missed", ())]  # a budget the user gave, missed
    # what a MediaPipe reader cannot take is a note: it asks nothing of a user who does not use MediaPipe
    standard, files, notes = standard_metadata(recipe, records.tflite, loaded.specs, metadata["labels"],
                                               verified.names, mode)
    data = with_metadata(add_metadata(records.tflite, metadata), standard, files)  # the zip of files goes last
    written = Model(data, delegate="cpu", probe=False)  # the file we write must load
    int8_path = None
    if records.budgeted is not None:  # the autopilot may have handed back float16/dynamic: two files
        out, int8_path = budget.file_paths(out, recipe.output is not None, mode)
    if int8_path is not None:
        check_writable(out, recipe.force)  # the default name of the handed-back mode: not preflighted
    beside = _beside(recipe, records, int8_path, metadata)
    if beside is not None:  # first: an output that exists means the int8 file it names does too
        atomic_write_bytes(*beside, force=recipe.force)
    atomic_write_bytes(out, data, force=recipe.force)
    trust(data, written.runtime)  # loaded and run here (on the CPU): run and bench need not probe it again
    return ConvertResult(out, len(data), metadata, time.perf_counter() - started, tuple(warnings), tuple(notes),
                         tuple(changes), tuple(missed))


def _beside(recipe: ConvertRecipe, records: _Records, path: Path | None,
            metadata: dict[str, Any]) -> tuple[Path, bytes] | None:
    """Where the autopilot handed back another mode than int8, the int8 file it found goes to `path`
    (`budget.file_paths`), its metadata the output's with its own mode and verification and its own
    standard metadata (its description says int8); its path is checked writable before either file is
    written."""
    budgeted, verified = records.budgeted, records.beside_verified
    if budgeted is None or budgeted.beside is None or verified is None or path is None:
        return None
    check_writable(path, recipe.force)
    own = {**metadata, "mode": "int8", **verified.metadata()}
    standard, files, _ = standard_metadata(recipe, budgeted.beside, records.loaded.specs, metadata["labels"],
                                           verified.names, "int8")
    return path, with_metadata(add_metadata(budgeted.beside, own), standard, files)


@dataclass(frozen=True)
class _Records:
    """What the stages returned, and the file to write (the budget's, where it ran, else quantize's)."""

    loaded: load.Loaded
    trained: train.Trained | None
    calibrated: calibrate.Calibrated
    quantized: quantize.Quantized
    budgeted: budget.Budgeted | None
    verified: verify.Verified
    targeted: target.Targeted | None
    measured: measure.Measured | None
    beside_verified: verify.Verified | None = None  # the int8 file written beside, where another mode won
    timing: dict[str, float] = field(default_factory=dict)  # each stage that ran -> its seconds

    @property
    def tflite(self) -> bytes:
        return self.budgeted.tflite if self.budgeted is not None else self.quantized.tflite


def _stages(recipe: ConvertRecipe, progress, say) -> _Records:
    """The stages in order, each given `reads(recipe, its READS)` and the records it declares; each one's
    seconds in `timing`."""
    timing: dict[str, float] = {}

    def timed(stage, run, *args):
        name = stage.__name__.rsplit(".", 1)[-1]
        started = time.perf_counter()
        try:
            return run(reads(recipe, stage.READS, name), *args)
        finally:
            timing[name] = round(timing.get(name, 0.0) + time.perf_counter() - started, 2)

    loaded = timed(load, load.load, say)
    trained = timed(train, train.train, loaded, progress, say) if recipe.trains else None
    source = trained.source if trained is not None else loaded.source
    calibrated = timed(calibrate, calibrate.calibrate, source, loaded, say,
                       trained.val if trained is not None else None)
    quantized = timed(quantize, quantize.quantize, source, loaded, calibrated, say)
    budgeted = (timed(budget, budget.within_budget, source, loaded, calibrated, quantized, say,
                      trained.eval if trained is not None else None)
                if recipe.budget is not None and recipe.mode == "int8" else None)
    tflite = budgeted.tflite if budgeted is not None else quantized.tflite
    verified = timed(verify, verify.verify, source, loaded, tflite, calibrated, say)
    mode = budgeted.mode if budgeted is not None else recipe.mode  # the file's: the budget may hand back float16
    targeted = timed(target, target.target, tflite, mode) if recipe.target is not None else None
    measured = timed(measure, measure.measure, trained, quantized, tflite, say) if trained is not None else None
    beside = None if budgeted is None else budgeted.beside
    beside_verified = (None if beside is None else timed(verify, verify.verify, source, loaded, beside, calibrated, say))
    return _Records(loaded, trained, calibrated, quantized, budgeted, verified, targeted, measured, beside_verified,
                    timing)


def merged(*sections: dict[str, Any]) -> dict[str, Any]:
    """The stages' metadata sections as one entry, in order; a key `a.b` goes inside section `a`. A key
    written twice is a bug (each has one owner: a stage's KEYS, or the pipeline's OWN_KEYS)."""
    metadata: dict[str, Any] = {}
    for section in sections:
        for key, value in section.items():
            parent, _, child = key.partition(".")
            into = metadata[parent] if child else metadata
            if (child or key) in into:
                raise RuntimeError(f"metadata key {key!r} written by two stages")
            into[child or key] = value
    return metadata
