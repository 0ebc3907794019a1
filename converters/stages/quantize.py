"""Quantize: the .tflite in the recipe's mode. int8 after post-training calibration goes through
converters/int8/choose.py: activation ranges by `calibration.method`, measured on the calibration data."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from edgekit.converters.collapsed import widen_collapsed_outputs
from edgekit.converters.loading import SourceModel
from edgekit.converters.quantize import configure, run_converter
from edgekit.converters.recipe import ConvertRecipe, Structure
from edgekit.converters.shapes import open_size_hint
from edgekit.converters.stages import Say
from edgekit.converters.stages.batch import BatchCause, ShapeFromBatch, batch_closed
from edgekit.converters.stages.calibrate import Calibrated
from edgekit.converters.stages.load import Loaded
from edgekit.converters.stages.outputs import first_output
from edgekit.errors import ConversionError, one_line

READS = frozenset({"mode", "qat", "io", "calibration", "seed", "prune", "pruning"})
# auto's own work (past the converter's calibration) and the verification after it (foreseen from the float
# model's time on a sample) within this many times the converter's conversion time, unless
# `calibration.effort` is thorough: past it no candidate is started, no round of samples drawn and no weight
# rounding started, so that the default int8 conversion stays within about 3x the plain converter's
# (PaddleOCR's text detector at 320x320: 3.54x with weight rounding, which was not kept; basic-pitch, whose
# verification takes as long as its conversion: 7.06x with six candidates scored and none kept)
TIME_ALLOWED = 1.5
LEAST_ALLOWED = 10.0  # seconds auto may always take: a small model's ranking is not cut by its conversion's time
KEYS = ("calibration.range_setting",)


@dataclass(frozen=True)
class Quantized:
    """The converted file, how its int8 ranges were set, what the conversion took, and the QAT output scales
    stored at what LiteRT's kernel takes."""

    tflite: bytes
    range_setting: dict[str, Any] | None = None
    seconds: float = 0.0
    widened: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was chosen for the user (ConvertResult.changes)
    shapes: dict[str, tuple] = field(default_factory=dict)  # the input sizes it was converted at (Loaded.shapes)
    basis: bytes | None = None  # the calibrated model int8 ranges chose the file from (choose.RangeChoice.basis)
    float_kernels: bytes | None = None  # where the basis's constants were changed for int8: the float ones

    @property
    def warnings(self) -> list[str]:
        widened = [f"quantization-aware training left {w['op']} {w['tensor']!r} an output scale of "
                   f"{w['scale']:.3g}, past what LiteRT's int8 kernel takes: stored at {w['to']:.3g} (its range had "
                   "collapsed; train the float model first)" for w in self.widened]
        return widened

    @property
    def float_head(self) -> tuple[str, ...]:
        """The ops the int8 file keeps in float as its head (converters/int8/float_ops.py), where auto kept one."""
        head = (self.range_setting or {}).get("float_head") or {}
        return tuple(head["ops"]) if head.get("kept") else ()

    def metadata(self) -> dict[str, Any]:
        """How the int8 ranges were set, inside the calibration section (where they were)."""
        return {} if self.range_setting is None else {"calibration.range_setting": self.range_setting}


def quantize(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calibrated: Calibrated, say: Say) -> Quantized:
    """The .tflite in the recipe's mode. int8 after post-training calibration goes through converters/int8/choose.py:
    activation ranges by `calibration.method`, measured on the calibration data. After QAT, the file must run
    (`survives_the_interpreter`)."""
    say(f"converting to {recipe.mode}" + (" (ranges from quantization-aware training)" if recipe.qat else ""))
    started = time.perf_counter()
    notes: list[str] = []
    first, shapes, cause = _first_conversion(recipe, source, loaded, calibrated, say, notes)
    tflite, range_setting, basis, kernels = first if first is not None else (None, None, None, None)
    closed = batch_closed(loaded, shapes, tflite, cause, lambda fixed: _converted(
        recipe, source, fixed, calibrated, say), say)
    if closed is not None:
        (tflite, range_setting, basis, kernels), shapes, note = closed
        notes.append(note)
    if recipe.mode == "float16" and not recipe.qat:
        tflite = _float16_held(recipe, source, shapes, tflite, notes)
    seconds = time.perf_counter() - started
    widened: list[dict[str, Any]] = []
    if recipe.qat:  # a QAT range that collapsed can be past what an int8 ADD/SUB kernel takes
        tflite, widened = widen_collapsed_outputs(tflite)
        survives_the_interpreter(tflite)
    return Quantized(tflite, range_setting, seconds, widened, notes, shapes, basis, kernels)


def _converter(source: SourceModel, shapes: dict):
    """The TFLiteConverter; a size the graph cannot take fails while it is traced (Keras and TF raise
    ValueError, TypeError, ...): a conversion error, not an internal one."""
    try:
        return source.tflite_converter(shapes)
    except Exception as exc:  # noqa: BLE001 - TF raises many types while tracing
        raise ConversionError(f"{source.path}: cannot trace the model for conversion: {one_line(exc)}") from None


def survives_the_interpreter(tflite: bytes) -> None:
    """QAT learns its int8 scales by training, and a scale a kernel cannot take aborts LiteRT natively, past
    any error handling (an untrained MobileNetV3Small's activations fade to 1e-8 and QAT alone gave a file
    that raised SIGABRT in both LiteRT and XNNPACK). The file is loaded and run once in a child process
    (runtime/probe.py) before this process loads it."""
    from edgekit.errors import EdgekitError
    from edgekit.runtime.probe import probe_bytes

    try:
        probe_bytes(tflite, "the converted model")
    except EdgekitError as exc:
        why = getattr(exc, "reason", None) or str(exc)  # what happened, without the model's name
        raise ConversionError(f"quantization-aware training gave a file LiteRT cannot run ({why}); nothing "
                              "was written. An untrained or collapsed network gives QAT int8 scales a kernel "
                              "refuses: train the float model first") from None


def _first_conversion(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calibrated: Calibrated, say: Say,
                      notes: list[str]) -> tuple[tuple | None, dict, BatchCause | None]:
    """The conversion at the loaded sizes or, where the model does not convert at an open size, at the
    calibration samples' (said in `notes`): (what `_converted` gave, the sizes, None), or (None, the sizes,
    the cause) where an int8 conversion's calibrated model showed that the open batch must close."""
    calib, shapes = calibrated.calib, loaded.shapes
    try:
        try:
            return _converted(recipe, source, shapes, calibrated, say, BatchCause.probe(loaded, shapes)), shapes, None
        except ConversionError as exc:
            hint = open_size_hint(loaded.inputs)
            if hint is None:
                raise
            sized = None if calib is None else loaded.sample_sizes(calib.arrays())
            if sized is None:
                raise ConversionError(f"{exc} ({hint})", exc.ops) from None
            note = (f"the model does not convert at an open size ({one_line(exc)[:100]}): converted at the "
                    f"calibration samples' size, {', '.join(f'{n}={list(s)}' for n, s in sized.items())}; the file "
                    "takes that size only (`input_shape` sets another)")
            say(note)
            notes.append(note)
            shapes = {**loaded.shapes, **sized}
            return _converted(recipe, source, shapes, calibrated, say, BatchCause.probe(loaded, shapes)), shapes, None
    except ShapeFromBatch as stop:
        return None, shapes, stop.cause


def _converted(recipe: ConvertRecipe, source: SourceModel, shapes: dict, calibrated: Calibrated, say: Say,
               probe: Callable[[bytes], None] | None = None) -> tuple[bytes, dict[str, Any] | None, bytes | None,
                                                                      bytes | None]:
    """The converter's file at `shapes`, and where int8 ranges were chosen, how, the calibrated model the
    file was quantized from (`choose.RangeChoice.basis`) and its float kernels where they were rounded.
    `probe` sees an int8 conversion's float model before it is calibrated (and may raise to stop there)."""
    calib = calibrated.calib
    representative = calib.representative_dataset if calib is not None and not recipe.qat else None
    converter = configure(_converter(source, shapes), recipe.mode, recipe.io, representative, qat=recipe.qat,
                          sparse=_zeros_stay(recipe))
    if recipe.mode != "int8" or recipe.qat or representative is None:
        return run_converter(converter), None, None, None
    from edgekit.converters.int8 import ranges
    from edgekit.converters.int8.choose import choose

    method = recipe.calibration.method
    ranking = calibrated.ranking
    began = time.perf_counter()
    model = ranges.calibrated_model(converter, before=probe)
    conversion = time.perf_counter() - began
    variants, equalization = _equalized(recipe, source, model, representative, say)
    spec = recipe.calibration
    output = source.output_names[0] if len(source.outputs) > 1 else None  # the model's first, by its name
    choice = choose(model, recipe.io, method, list(representative()), partial(first_output, output=output),
                    seed=recipe.seed, say=say, variants=variants, effort=spec.effort, loss=spec.loss,
                    threshold=spec.threshold, extra=list(ranking.representative_dataset()) if ranking is not None else [],
                    more=calibrated.more, verification=_verification_samples(calibrated), output=output,
                    allowed=None if spec.effort == "thorough" else max(LEAST_ALLOWED, TIME_ALLOWED * conversion))
    if equalization is not None:
        choice.entry["equalization"] = equalization
    return choice.tflite, choice.entry, choice.basis, choice.float_kernels


def _verification_samples(calibrated: Calibrated) -> list:
    """The held-out samples verification runs on, for auto's check of its file against min/max's: none where
    verification runs on the calibration samples (the candidates were fitted there)."""
    data, kind = calibrated.verification_set
    return list(data.representative_dataset()) if data is not None and kind == "held-out" else []


def _float16_held(recipe: ConvertRecipe, source: SourceModel, shapes: dict, tflite: bytes, notes: list[str]) -> bytes:
    """TFLite's float16 file with the constants float16 cannot hold (a log's 1e-10 becomes 0, and the file outputs
    NaN on silence) kept in float32 (converters/fp16_weights.py), said in one note."""
    from edgekit.converters.fp16_weights import keep_float32_constants

    def float32() -> bytes:  # the same model without float16, only where a float16 constant looks lost
        return run_converter(configure(_converter(source, shapes), "float32", recipe.io, None,
                                       sparse=_zeros_stay(recipe)))

    tflite, kept = keep_float32_constants(tflite, float32)
    if kept:
        more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
        notes.append(f"kept {len(kept)} constant(s) in float32 that float16 cannot hold (it rounds values under 3e-08 "
                     f"to 0, keeps few digits under 6.1e-05 and overflows past 65504): {', '.join(kept[:5])}{more}")
    return tflite


def _zeros_stay(recipe: ConvertRecipe) -> bool:
    """Pruning leaves scattered zeros in the kernels (not channel pruning, which removes them; not M:N or
    blocks, whose pattern the sparse format would not keep as such): the file may store them sparse."""
    pruning = recipe.pruning
    return bool(recipe.prune) and Structure.parse(None if pruning is None else pruning.structure).kind == "unstructured"


def _equalized(recipe: ConvertRecipe, source: SourceModel, calibrated: bytes, representative,
               say: Say) -> tuple[dict[str, Callable[[], bytes]], dict[str, Any] | None]:
    """A maker of the calibrated model with cross-layer equalised weights (converters/int8/equalization.py), for `auto`
    where a channel moves by `equalize.WORTH` or more and for `equalize`; and what was equalised."""
    from edgekit.converters.int8 import equalization as equalize

    method = recipe.calibration.method
    if method not in ("auto", equalize.NAME):
        return {}, None
    plan = equalize.plan(calibrated)
    if method == equalize.NAME and not plan.pairs:
        raise ConversionError(f"{source.path}: `calibration.method=equalize` found no layer whose output channels "
                              "reach only convolutions or dense layers through ReLU or pooling: nothing to "
                              "equalise; use `auto` or `minmax`")
    if method == "auto" and not plan.worth_it:
        return {}, {**plan.describe(), "candidate": False} if plan.pairs else None
    say(f"equalised {len(plan.pairs)} layer pair(s): channels move apart by up to {plan.largest:.3g}x")
    def equalised() -> bytes:  # made where `choose.choose` scores or keeps it
        try:
            return equalize.equalised(calibrated, plan, list(representative()))
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - a graph it did not foresee: one line, auto goes on
            raise ConversionError(f"cross-layer equalisation failed on this model: {one_line(exc)[:200]}") from None

    return {equalize.NAME: equalised}, {**plan.describe(), "candidate": True}
