"""convert(): load -> calibrate -> convert -> verify -> add metadata -> write atomically."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit import __version__
from edgekit.converters._tf import import_tf
from edgekit.converters.calibration import CalibrationSet, load_calibration
from edgekit.converters.loading import SourceModel, load_model
from edgekit.converters.metadata_writer import add_metadata
from edgekit.converters.quantize import configure, run_converter
from edgekit.converters.verify import check_not_collapsed, compare_outputs
from edgekit.errors import InputShapeError
from edgekit.files import atomic_write_bytes, check_writable
from edgekit.recipe import ConvertRecipe
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import PreprocessSpec

METADATA_SCHEMA = "edgekit.metadata/1"


@dataclass(frozen=True)
class ConvertResult:
    path: Any
    size_bytes: int
    metadata: dict[str, Any]
    seconds: float


def image_spec(source: SourceModel, recipe: ConvertRecipe) -> PreprocessSpec | None:
    """The preprocessing for an NHWC image input with 1 or 3 channels; None for other inputs."""
    shape = source.input_shape
    if len(shape) != 4 or shape[-1] not in (1, 3) or None in shape[1:]:
        return None
    return PreprocessSpec.for_input_shape(shape, resize=recipe.resize, mean=recipe.mean, std=recipe.std)


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


def _verification(source: SourceModel, tflite: bytes, calib: CalibrationSet) -> dict[str, Any]:
    model = Model(tflite)
    expected = tuple(model.inputs[0].shape[1:])
    if tuple(calib.x.shape[1:]) != expected:
        raise InputShapeError(f"samples of shape {calib.x.shape[1:]} do not fit the converted input {expected}")
    reference = source.predict(calib.x)
    candidate = model.predict(calib.x)
    check_not_collapsed(reference, candidate, str(source.path))
    stats = compare_outputs(reference, candidate)
    stats["reference_device"] = source.device
    return stats


def convert(recipe: ConvertRecipe, *, progress=None) -> ConvertResult:
    """Run one conversion and write the .tflite; nothing is written when any step fails."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    out = recipe.output_path
    check_writable(out, recipe.force)
    say(f"loading {recipe.model}")
    source = load_model(recipe.model)
    spec = image_spec(source, recipe)
    calib = None
    if recipe.calib is not None:
        say(f"reading calibration data from {recipe.calib}")
        calib = load_calibration(recipe.calib, input_shape=source.input_shape, spec=spec,
                                 samples=recipe.calib_samples, seed=recipe.seed)
    say(f"converting to {recipe.mode}")
    converter = configure(source.tflite_converter(), recipe.mode, recipe.io,
                          calib.representative_dataset if calib is not None else None)
    tflite = run_converter(converter)
    verification = None
    if calib is not None:
        say(f"verifying against the float model on {len(calib)} samples")
        verification = _verification(source, tflite, calib)
    probe = Model(tflite)
    out_dim = source.output_shape[-1] if source.output_shape else None
    labels = list(calib.classes) if calib is not None and len(calib.classes) == out_dim else []
    metadata = {
        "schema": METADATA_SCHEMA,
        "mode": recipe.mode,
        "io": recipe.io,
        "preprocessing": spec.to_dict() if spec is not None else None,
        "labels": labels,
        "inputs": [t.to_dict() for t in probe.inputs],
        "outputs": [t.to_dict() for t in probe.outputs],
        "source": {"file": recipe.model.name, "format": source.format, "sha256": source.sha256},
        "calibration": None if calib is None else {
            "source": str(recipe.calib), "samples": len(calib), "seed": recipe.seed,
        },
        "verification": verification,
        "tools": tool_versions(),
    }
    data = add_metadata(tflite, metadata)
    Model(data)  # the file we write must load
    atomic_write_bytes(out, data, force=recipe.force)
    return ConvertResult(out, len(data), metadata, time.perf_counter() - started)
