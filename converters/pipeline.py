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
from edgekit.errors import InputShapeError, UsageError
from edgekit.files import atomic_write_bytes, check_writable
from edgekit.recipe import ConvertRecipe
from edgekit.runtime.delegates import NNAPI_DEPRECATED, hints_for
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import PreprocessSpec

METADATA_SCHEMA = "edgekit.metadata/1"


@dataclass(frozen=True)
class ConvertResult:
    path: Any
    size_bytes: int
    metadata: dict[str, Any]
    seconds: float
    warnings: tuple[str, ...] = ()


def _gpu_check(tflite: bytes) -> dict[str, Any]:
    """TFLite's analyzer on the converted model: what the GPU delegate would leave on the CPU."""
    from edgekit.runtime.inspect import analyze

    gpu = analyze(tflite, gpu=True)["gpu"]
    return {k: gpu[k] for k in ("checked", "compatible", "fallback_ops", "op_share", "weight_share") if k in gpu}


def image_spec(source: SourceModel, recipe: ConvertRecipe) -> PreprocessSpec | None:
    """The preprocessing for an NHWC image input with 1 or 3 channels; None for other inputs."""
    shape = source.input_shape
    if None in shape[1:]:
        raise InputShapeError(
            f"{source.path}: the input shape {tuple(shape)} has a dynamic size; re-save the model with a "
            "fixed input size (e.g. keras.Input((224, 224, 3)))"
        )
    if len(shape) == 4 and shape[-1] in (1, 3):
        return PreprocessSpec.for_input_shape(shape, resize=recipe.resize, mean=recipe.mean, std=recipe.std)
    if recipe.mean != (0.0,) or recipe.std != (1.0,) or recipe.resize != "stretch":
        raise UsageError(
            f"--mean, --std and --resize apply to image inputs; this model's input is {tuple(shape)}"
        )
    return None


def _probe_finite(source: SourceModel, model: Model) -> None:
    """Without calibration data, still refuse a model that outputs NaN: run one mid-grey (or zero)
    input through both models."""
    info = model.inputs[0]
    x = np.full((1,) + tuple(info.shape[1:]), 127.0 if len(info.shape) == 4 else 0.0, np.float32)
    check_not_collapsed(source.predict(x), model.predict(x), str(source.path))


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


def _verification(source: SourceModel, model: Model, calib: CalibrationSet) -> dict[str, Any]:
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
    for given in (recipe.model, recipe.calib):
        if given is not None and out.resolve() == given.resolve():
            raise UsageError(f"the output {out} would replace an input; choose another -o")
    check_writable(out, recipe.force)
    say(f"loading {recipe.model}")
    source = load_model(recipe.model, trust=recipe.trust_model)
    spec = image_spec(source, recipe)
    calib = None
    if recipe.calib is not None:
        say(f"reading calibration data from {recipe.calib}")
        calib = load_calibration(recipe.calib, input_shape=source.input_shape, spec=spec,
                                 samples=recipe.calib_samples, seed=recipe.seed, strict=recipe.strict)
    say(f"converting to {recipe.mode}")
    converter = configure(source.tflite_converter(), recipe.mode, recipe.io,
                          calib.representative_dataset if calib is not None else None)
    tflite = run_converter(converter)
    probe = Model(tflite, delegate="cpu")  # verification always runs on the CPU
    verification = None
    if calib is not None:
        say(f"verifying against the float model on {len(calib)} samples")
        verification = _verification(source, probe, calib)
    else:
        _probe_finite(source, probe)
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
            "source": str(recipe.calib), "samples": len(calib), "requested": recipe.calib_samples,
            "seed": recipe.seed, "skipped": len(calib.skipped),
            "skipped_files": [{"file": f, "reason": r} for f, r in calib.skipped[:20]],
        },
        "verification": verification,
        "tools": tool_versions(),
    }
    warnings: list[str] = []
    if calib is not None and calib.skipped:
        warnings.append(f"skipped {len(calib.skipped)} unreadable calibration image(s) (--strict makes this an "
                        f"error); first: {calib.skipped[0][1]}")
    if recipe.target is not None:
        metadata["target"] = recipe.target
        metadata["delegates"] = hints_for(recipe.target, recipe.mode)
        if recipe.target in ("gpu", "nnapi"):
            metadata["gpu_compatibility"] = _gpu_check(tflite)
            fallback = metadata["gpu_compatibility"].get("fallback_ops") or []
            if fallback:
                warnings.append(f"the GPU delegate would leave {len(fallback)} op(s) on the CPU: "
                                + ", ".join(sorted({o["op"] for o in fallback})))
        if recipe.target == "nnapi":
            warnings.append(NNAPI_DEPRECATED)
        if recipe.target == "gpu" and recipe.mode not in ("float16", "float32"):
            warnings.append(metadata["delegates"][0]["reason"])
    data = add_metadata(tflite, metadata)
    Model(data, delegate="cpu")  # the file we write must load
    atomic_write_bytes(out, data, force=recipe.force)
    return ConvertResult(out, len(data), metadata, time.perf_counter() - started, tuple(warnings))
