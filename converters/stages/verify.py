"""Verify: the converted file against the float model (on held-out or calibration samples; without them a
probe input), and each input's and output's metadata entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.converters.calibration import CalibrationSet
from edgekit.converters.loading import SourceModel
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.shapes import is_image, sample_input
from edgekit.converters.stages import Say
from edgekit.converters.stages.calibrate import Calibrated
from edgekit.converters.stages.load import Loaded
from edgekit.converters.verify import check_not_collapsed, comparable, compare_per_output, match_outputs
from edgekit.errors import ConversionError, InputShapeError
from edgekit.runtime.model import Model

READS = frozenset({"mode"})
KEYS = ("verification", "inputs", "outputs")


@dataclass(frozen=True)
class Verified:
    """The file against the float model (on the calibration samples; without them a NaN probe on one input),
    and each input's and output's entry."""

    verification: dict[str, Any] | None
    notes: list[str]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    names: dict[int, str]  # tensor index -> the input's or output's name

    @property
    def warnings(self) -> list[str]:
        return list(self.notes)

    def metadata(self) -> dict[str, Any]:
        return {"verification": self.verification, "inputs": self.inputs, "outputs": self.outputs}


def verify(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, tflite: bytes, calibrated: Calibrated,
           say: Say) -> Verified:
    probe = Model(tflite, delegate="cpu", probe=False)  # verification always runs on the CPU
    verification: dict[str, Any] | None = None
    notes: list[str] = []
    data, kind = calibrated.verification_set
    if data is not None:
        say(f"verifying against the float model on {len(data)} {kind} samples")
        verification, notes = _verification(source, probe, data, int8=recipe.mode == "int8", kind=kind)
        if verification is not None:
            verification["data"] = kind
    else:
        notes = _probe_finite(source, probe, loaded.inputs)
    ins, outs, names = _tensor_entries(probe, loaded.inputs, loaded.specs, verification, source)
    return Verified(verification, notes, ins, outs, names)


def _tflite_inputs(model: Model, source: SourceModel, arrays: list[np.ndarray]):
    """What the runtime Model takes: one array, or a dict by input name."""
    if len(arrays) == 1:
        return arrays[0]
    return dict(zip(source.input_names, arrays))


def _probe_finite(source: SourceModel, model: Model, inputs) -> list[str]:
    """Without calibration data, still refuse a model that outputs NaN: run one mid-grey (or zero)
    input through both models. An output the float model itself cannot answer on that input (NaN or
    infinity: the log of a silent clip) proves nothing of the conversion: a note, not a refusal. Returns
    notes on those and on the outputs the float model does not compute."""
    arrays = [sample_input(t) for t in inputs]
    reference = source.predict_all(arrays)
    candidate = match_outputs(reference, model.predict(_tflite_inputs(model, source, arrays)), str(source.path))
    names, notes = comparable(reference, candidate)
    unanswered = [n for n in names if not np.all(np.isfinite(np.asarray(reference[n], np.float64)))]
    probed = f"edgekit's probe input ({_probe_words(inputs)}; no calibration data was given)"
    for name in names:
        if name not in unanswered:
            check_not_collapsed(reference[name], candidate[name], f"{source.path} (output {name})", probed=probed)
    if unanswered:  # a seeded noise input, which a log of silence does not meet
        rng = np.random.default_rng(0)
        noise = [rng.standard_normal(a.shape).astype(a.dtype) if np.issubdtype(a.dtype, np.floating) else a
                 for a in arrays]
        reference = source.predict_all(noise)
        candidate = match_outputs(reference, model.predict(_tflite_inputs(model, source, noise)), str(source.path))
        for name in list(unanswered):
            if np.all(np.isfinite(np.asarray(reference[name], np.float64))):
                check_not_collapsed(reference[name], candidate[name], f"{source.path} (output {name})",
                                    probed="edgekit's probe input (seeded noise; no calibration data was given)")
                unanswered.remove(name)
    if unanswered:
        notes.append(f"the float model itself outputs NaN or infinity for output(s) {', '.join(unanswered)} on "
                     f"edgekit's probe inputs ({_probe_words(inputs)}, and seeded noise), so the converted model "
                     "was not checked there: give calibration data (--calib) to verify it")
    return notes


def _probe_words(inputs) -> str:
    return ", ".join(f"{t.name}: {'mid-grey' if is_image(t) else 'zeros'}" for t in inputs)


def _verification(source: SourceModel, model: Model, calib: CalibrationSet, int8: bool = False,
                  kind: str = "calibration") -> tuple[dict[str, Any] | None, list[str]]:
    """Float model vs .tflite on the calibration samples, per output (matched by name); the first output's
    figures stand at the top level as well. Returns (verification, notes for the user)."""
    arrays = calib.arrays()
    by_input = {i.name: i for i in model.inputs}
    step = 1
    for i, a in enumerate(arrays):
        info = by_input.get(source.input_names[i]) or _only(model.inputs, source.input_names[i], "input")
        sig = tuple(getattr(info, "shape_signature", None) or info.shape)  # -1: an open dimension
        if len(a.shape) != len(sig) or any(d not in (-1, n) for d, n in zip(sig[1:], a.shape[1:])):
            raise InputShapeError(f"samples of shape {a.shape[1:]} do not fit the converted input {tuple(info.shape[1:])}")
        step = max(step, sig[0])
    if step > 1:  # a batch fixed by `input_shape`: whole batches (one, repeating samples, where fewer)
        arrays = [np.resize(a, (len(a) // step * step or step, *a.shape[1:])) for a in arrays]
    reference = source.predict_all(arrays)
    candidate = match_outputs(reference, model.predict(_tflite_inputs(model, source, arrays)), str(source.path))
    per_output, notes = compare_per_output(reference, candidate, str(source.path), int8,
                                           probed=f"{len(arrays[0])} {kind} sample(s)")
    if not per_output:
        return None, notes  # nothing the float model computes to compare with
    first = dict(next(iter(per_output.values())))
    first.pop("role")
    stats = {**first, "reference_device": source.device}
    if len(per_output) > 1:
        stats["outputs"] = per_output
    return stats, notes


def _only(infos, name: str, what: str):
    """A converted tensor found by position: only where there is one, never among several."""
    if len(infos) == 1:
        return infos[0]
    raise ConversionError(f"the converted model has no {what} named {name!r} "
                          f"(it has {', '.join(i.name for i in infos)})")


def _tensor_entries(probe: Model, inputs, specs, verification: dict | None, source: SourceModel):
    """Metadata per input (with its preprocessing and role) and per output (role), in the model's order, and
    {tensor index: that name}."""
    ins, names = [], {}
    by_input = {i.name: i for i in probe.inputs}
    for t in inputs:
        info = by_input.get(t.name) or _only(probe.inputs, t.name, "input")
        spec = specs.get(t.name)
        names[info.index] = t.name
        ins.append({**info.to_dict(), "name": t.name, "role": "image" if spec is not None else "tensor",
                    "preprocessing": spec.to_dict() if spec is not None else None})
    by_name = {o.name: o for o in probe.outputs}
    per = (verification or {}).get("outputs") or {}
    outs = []
    for t in source.outputs:
        info = by_name.get(t.name) or _only(probe.outputs, t.name, "output")
        names[info.index] = t.name
        role = per.get(t.name, {}).get("role") or _role(info, verification)
        outs.append({**info.to_dict(), "name": t.name, "role": role})
    return ins, outs, names


def _role(info, verification: dict | None) -> str:
    """A single output's role from its verification: agreed on per element (mask) when dense, else scores."""
    if not verification or verification.get("top1_agreement") is None:
        return "values"
    shape, signature = tuple(info.shape), tuple(info.shape_signature)  # -1: an open size (a U-Net's)
    dense = len(shape) >= 3 and any(d > 1 or s < 0 for d, s in zip(shape[1:-1], signature[1:-1]))
    return "mask" if dense else "scores"


