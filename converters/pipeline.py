"""convert(): every input checked, then the stages (converters/stages.py) composed, their records made the
file's metadata, and the file written atomically. Nothing is written when any step fails."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgekit._version import __version__
from edgekit.converters import stages
from edgekit.converters._tf import import_tf
from edgekit.converters.labels import class_names
from edgekit.converters.loading import detect_format
from edgekit.converters.metadata_writer import add_metadata
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.results import ConvertResult
from edgekit.converters.standard_metadata import standard_metadata
from edgekit.errors import CalibrationError, ModelFormatError, UsageError
from edgekit.files import atomic_write_bytes, check_writable
from edgekit.runtime.model import Model
from edgekit.runtime.probe import trust
from edgekit.runtime.samples import SampleData
from edgekit.runtime.tflite_metadata import with_metadata

METADATA_SCHEMA = "edgekit.metadata/1"


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


def convert(recipe: ConvertRecipe, *, progress=None) -> ConvertResult:
    """Run one conversion and write the .tflite: load -> [train] -> calibrate -> quantize -> [budget] ->
    verify -> [target] -> write. Each stage returns the model and its record; the metadata is the records."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    out = preflight(recipe)
    loaded = stages.load(recipe, say)
    trained = stages.train(recipe, loaded, progress, say) if recipe.trains else None
    source = trained.source if trained is not None else loaded.source
    calibrated = stages.calibrate(recipe, source, loaded, say)
    quantized = stages.quantize(recipe, source, loaded, calibrated, say)
    tflite, budget = quantized.tflite, None
    if recipe.budget is not None:
        tflite, budget = stages.within_budget(recipe, source, loaded, calibrated.calib, tflite, say, quantized.basis,
                                              quantized.shapes)
    if recipe.qat:
        stages.survives_the_interpreter(tflite)
    verified = stages.verify(recipe, source, loaded, tflite, calibrated, say)
    targeted = stages.target(recipe, tflite) if recipe.target is not None else None
    out_dim = source.output_shape[-1] if source.output_shape else None
    metadata: dict[str, Any] = {
        "schema": METADATA_SCHEMA, "mode": recipe.mode, "io": recipe.io,
        **loaded.metadata(recipe), **calibrated.metadata(recipe, quantized, out_dim, loaded.labels),
        **verified.metadata(),
        "tools": tool_versions(), "recipe": recipe.stored(),
        **(targeted.metadata() if targeted is not None else {}),
        **({"autopilot": budget.to_dict()} if budget is not None else {}),
    }
    if trained is not None:
        say("measuring the exported model (sparsity, gzip sizes, accuracy)")
        metadata.update(trained.metadata(recipe, tflite, quantized.seconds, quantized.shapes))
    changes = [*recipe.notes, *loaded.notes, *quantized.notes]  # what edgekit chose: said, nothing to do
    warnings = [*verified.warnings, *quantized.warnings, *calibrated.warnings,
                *(targeted.warnings if targeted is not None else []), *stages.budget_warnings(recipe, budget)]
    # what a MediaPipe reader cannot take is a note: it asks nothing of a user who does not use MediaPipe
    standard, files, notes = standard_metadata(recipe, tflite, loaded.specs, metadata["labels"], verified.names)
    data = with_metadata(add_metadata(tflite, metadata), standard, files)  # the zip of files goes last
    written = Model(data, delegate="cpu", probe=False)  # the file we write must load
    atomic_write_bytes(out, data, force=recipe.force)
    trust(data, written.runtime)  # loaded and run here (on the CPU): run and bench need not probe it again
    return ConvertResult(out, len(data), metadata, time.perf_counter() - started, tuple(warnings), tuple(notes),
                         tuple(changes))
