"""The stages of a conversion. Each takes the model and its part of the recipe and returns the model plus a
typed record; a record's `metadata()` is its part of the file's `edgekit.metadata/1` entry and its
`warnings` what the user is told. converters/pipeline.py composes them:

    load -> [train] -> calibrate -> quantize -> [budget] -> verify -> [target] -> write
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters import recurrent
from edgekit.converters.calibration import CalibrationSet, labelled_data, load_for_inputs, load_held_out
from edgekit.converters.collapsed import widen_collapsed_outputs
from edgekit.converters.compression import compression_report
from edgekit.converters.finetune import FinetuneResult, FinetuneSpec, LabelledData, finetune
from edgekit.converters.labels import check_count, check_folders, class_names
from edgekit.converters.loading import SourceModel, TensorSpec, keras_model_of_saved_model, load_model, trained_source
from edgekit.converters.pruning import Structure
from edgekit.converters.quantize import configure, run_converter
from edgekit.converters.recipe import NEEDS_CALIBRATION, ConvertRecipe
from edgekit.converters.shapes import (
    batch_for_target,
    batch_of_one,
    check_open_image_sources,
    fixed_inputs,
    given_inputs,
    is_image,
    keep_open_hint,
    open_batches,
    open_size_hint,
    preprocessing,
    sample_input,
)
from edgekit.converters.verify import check_not_collapsed, comparable, compare_per_output, match_outputs
from edgekit.errors import CalibrationError, ConversionError, InputShapeError, UsageError, one_line
from edgekit.runtime.delegates import NNAPI_DEPRECATED, hints_for
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import PreprocessSpec

Say = Callable[[str], Any]
VERIFY_SAMPLES = 200  # held-out samples verification runs on, when the calibration source has them
MIN_HELD_OUT = 20     # fewer: verification runs on the calibration samples (and says so)


# -- load ---------------------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """The float model, its inputs at the sizes conversion uses, and how images become each input."""

    source: SourceModel
    inputs: tuple[TensorSpec, ...]
    specs: dict[str, PreprocessSpec | None]
    labels: tuple[str, ...] = ()  # the class names given (`info.labels`), checked against the outputs
    given: frozenset[str] = frozenset()  # the inputs `input_shape` sizes: their batch is the user's
    notes: list[str] = field(default_factory=list)

    @property
    def spec(self) -> PreprocessSpec | None:
        """The preprocessing of a single-input model (None for several inputs, or no image)."""
        return self.specs[self.inputs[0].name] if len(self.inputs) == 1 else None

    @property
    def shapes(self) -> dict[str, tuple]:
        """The input sizes fixed for conversion (`input_shape`), by input name."""
        return {t.name: t.shape for t, given in zip(self.inputs, self.source.inputs) if t.shape != given.shape}

    def metadata(self, recipe: ConvertRecipe) -> dict[str, Any]:
        return {"preprocessing": self.spec.to_dict() if self.spec is not None else None,
                "source": {"file": recipe.model.name, "format": self.source.format, "sha256": self.source.sha256}}


def load(recipe: ConvertRecipe, say: Say) -> Loaded:
    say(f"loading {recipe.model}")
    source = load_model(recipe.model, trust=recipe.trust_model)
    if (len(source.inputs) > 1 or len(source.outputs) > 1) and recipe.budget is not None:
        raise UsageError(f"`budget` works on single-input, single-output models for now; {recipe.model} has "
                         f"{len(source.inputs)} input(s) and {len(source.outputs)} output(s)")
    labels = class_names(recipe.info.labels)
    check_count(labels, source.outputs, str(recipe.info.labels) if isinstance(recipe.info.labels, Path)
                else "the class names given")
    given = given_inputs(source, recipe.input_shape)
    inputs, fixed = recurrent.fixed_batch(source, fixed_inputs(source, recipe.input_shape), given)
    if fixed:
        say(fixed)
    inputs, closed = batch_for_target(inputs, recipe.target, given)
    if recipe.mode in NEEDS_CALIBRATION and not recipe.trains:
        source, unrolled = recurrent.unrolled(source, inputs, recipe.mode)
        if unrolled:
            say(unrolled)
    _check_int16_inputs(recipe.mode, inputs)
    prep = recipe.preprocessing
    return Loaded(source, inputs, preprocessing(inputs, resize=prep.resize, mean=prep.mean, std=prep.std), labels,
                  given, [closed] if closed else [])


def _labelled(source, loaded: Loaded, param: str, recipe: ConvertRecipe, targets: bool = False) -> LabelledData:
    """Every sample of labelled data (class folders, or arrays with `y`), read as calibration data is; with
    `targets`, each output's training targets (converters/targets.py) too."""
    outputs = tuple(t.name for t in loaded.source.outputs) if targets else ()
    data = labelled_data(source, loaded.inputs, loaded.specs, param=param, seed=recipe.seed, strict=recipe.strict,
                         outputs=outputs)
    if isinstance(source, Path) and source.is_dir():  # class folders name classes
        check_folders(loaded.labels, data.classes, source, param)
    classes = data.classes or (() if data.labels is None else tuple(str(i) for i in range(int(data.labels.max()) + 1)))
    return LabelledData(data.x, data.labels, classes, str(source), data.others,
                        {name: data.targets[name] for name in outputs if name in data.targets},
                        tuple(t.name for t in loaded.inputs))


# -- train --------------------------------------------------------------------------------------------------
@dataclass
class Trained:
    """Pruning and/or QAT: the trained model to convert and what the stages measured."""

    source: SourceModel
    original: SourceModel
    tuned: FinetuneResult
    val: LabelledData | None
    shapes: dict[str, tuple] = field(default_factory=dict)  # the input sizes conversion uses (Loaded.shapes)
    sample_sizes: dict[str, tuple] | None = None  # open inputs at the training samples' size

    def metadata(self, recipe: ConvertRecipe, tflite: bytes, convert_seconds: float,
                 shapes: dict[str, tuple] | None = None) -> dict[str, Any]:
        """`shapes`: the input sizes the file was converted at, when not `self.shapes` (an open size that only
        converts at the calibration samples' size): the float and pruned files it is compared with too."""
        return {"compression": compression_report(recipe, self.original, self.tuned, tflite, self.val,
                                                  convert_seconds, self.shapes if shapes is None else shapes,
                                                  self.sample_sizes)}


def train(recipe: ConvertRecipe, loaded: Loaded, progress, say: Say) -> Trained:
    training, pruning = recipe.training, recipe.pruning
    say(f"reading training data from {training.data}")
    train_data = _labelled(training.data, loaded, "training.data", recipe, targets=True)
    val = (None if training.val_data is None
           else _labelled(training.val_data, loaded, "training.val_data", recipe, targets=True))
    source = loaded.source
    if source.keras_model is None:
        source.keras_model = keras_model_of_saved_model(source.path, trust=recipe.trust_model)
    tuned = finetune(source.keras_model, FinetuneSpec(
        prune=recipe.prune or 0.0, schedule="polynomial" if pruning is None else pruning.schedule,
        structure=Structure.parse(None if pruning is None else pruning.structure), qat=recipe.qat,
        epochs=training.epochs, batch_size=training.batch_size, lr=training.lr,
        skip_layers=frozenset(training.skip_layers), logdir=training.logdir, seed=recipe.seed,
        distill=training.distill), train_data, val,
        progress=progress)
    inputs = train_data.inputs if isinstance(train_data.inputs, list) else [train_data.inputs]
    return Trained(trained_source(source, tuned.model), source, tuned, val, loaded.shapes,
                   _sample_sizes(loaded, inputs))


# -- calibrate ----------------------------------------------------------------------------------------------
@dataclass
class Calibrated:
    """The calibration samples (None without calibration data) and where they came from."""

    calib: CalibrationSet | None
    source: Any = None
    held_out: CalibrationSet | None = None  # samples of the same source not drawn for calibration
    ranking: CalibrationSet | None = None  # more of them, past the held-out ones: auto ranks on these too

    @property
    def verification_set(self) -> tuple[CalibrationSet | None, str]:
        """What verification runs on: held-out samples when there are enough, else the calibration ones."""
        if self.held_out is not None and len(self.held_out) >= MIN_HELD_OUT:
            return self.held_out, "held-out"
        return self.calib, "calibration"

    @property
    def warnings(self) -> list[str]:
        if self.calib is None:
            return []
        skipped = [f"skipped {len(self.calib.skipped)} unreadable calibration image(s) (`strict` makes this an "
                   f"error); first: {self.calib.skipped[0][1]}"] if self.calib.skipped else []
        return [*self.calib.notes, *skipped]

    def metadata(self, recipe: ConvertRecipe, quantized: Quantized, out_dim: int | None,
                 given: tuple[str, ...] = ()) -> dict[str, Any]:
        """`given`: the class names of `info.labels`, which stand for the data's own (checked to agree)."""
        calib = self.calib
        labels = list(given) or (list(calib.classes) if calib is not None and len(calib.classes) == out_dim else [])
        if calib is None:
            return {"calibration": None, "labels": labels}
        return {"labels": labels, "calibration": {
            "source": str(self.source), "used_for": "verification" if recipe.qat else "quantization",
            "samples": len(calib), "requested": recipe.calibration.samples,
            "seed": recipe.seed, "skipped": len(calib.skipped),
            "skipped_files": [{"file": f, "reason": r} for f, r in calib.skipped[:20]],
            **({"range_setting": quantized.range_setting} if quantized.range_setting is not None else {}),
        }}


def calibrate(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, say: Say) -> Calibrated:
    calib_source = recipe.calib or (recipe.train_data if recipe.mode in NEEDS_CALIBRATION else None)
    if calib_source is None:
        return Calibrated(None)
    sources = calib_source if isinstance(calib_source, dict) else {None: calib_source}
    check_open_image_sources(loaded.inputs, sources)
    say(f"reading calibration data from {calib_source}")
    calib = load_for_inputs(sources, loaded.inputs, loaded.specs, samples=recipe.calibration.samples,
                            seed=recipe.seed, strict=recipe.strict)
    if any(isinstance(s, Path) and s.is_dir() for s in sources.values()):  # class folders name classes
        check_folders(loaded.labels, calib.classes, calib_source, "calib" if recipe.calib else "training.data")
    _check_token_ids(source, calib)
    held = ranking = None
    if not recipe.trains:  # after training, every training sample has been seen: none is held out
        held = load_held_out(sources, loaded.inputs, loaded.specs, after=recipe.calibration.samples,
                             count=VERIFY_SAMPLES, seed=recipe.seed, strict=recipe.strict)
        if held is not None:
            _check_token_ids(source, held)
        ranking = _ranking_extra(recipe, sources, loaded, calib)
        if ranking is not None:
            _check_token_ids(source, ranking)
    return Calibrated(calib, calib_source, held, ranking)


def _ranking_extra(recipe: ConvertRecipe, sources: dict, loaded: Loaded, calib) -> CalibrationSet | None:
    """Samples past the calibration and verification ones, for `auto` to rank range methods on as well
    (up to `calibration.ranking_samples` in all); None where nothing is ranked or the source has no more."""
    spec = recipe.calibration
    extra = spec.ranking_samples - len(calib)
    if recipe.mode != "int8" or recipe.qat or spec.method == "minmax" or extra <= 0:
        return None
    return load_held_out(sources, loaded.inputs, loaded.specs, after=spec.samples + VERIFY_SAMPLES,
                         count=extra, seed=recipe.seed, strict=recipe.strict)


def _check_token_ids(source: SourceModel, calib: CalibrationSet) -> None:
    """Token ids an Embedding fed by a model input cannot look up: said as bad calibration data (exit 4), not
    left to the converter's calibration, whose GATHER fails with "index out of bounds" (exit 5)."""
    inputs = list(getattr(source.keras_model, "inputs", None) or ())
    for layer in getattr(source.keras_model, "layers", ()):
        size = getattr(layer, "input_dim", None)
        if type(layer).__name__ != "Embedding" or not isinstance(size, int):
            continue
        try:
            fed = next((i for i, t in enumerate(inputs) if t is layer.input), None)
        except (AttributeError, ValueError):  # a shared layer has no single input
            continue
        if fed is None or fed >= len(calib.arrays()):
            continue
        ids = calib.arrays()[fed]
        if np.issubdtype(ids.dtype, np.integer) and ids.size and int(ids.max()) >= size:
            raise CalibrationError(f"{calib.source}: token ids go up to {int(ids.max())}, but input "
                                   f"{source.inputs[fed].name!r} feeds Embedding {layer.name!r} of {size} ids "
                                   f"(0..{size - 1})", param="calib")


# -- quantize -----------------------------------------------------------------------------------------------
@dataclass
class Quantized:
    """The converted file, how its int8 ranges were set, what the conversion took, and the QAT output scales
    stored at what LiteRT's kernel takes."""

    tflite: bytes
    range_setting: dict[str, Any] | None = None
    seconds: float = 0.0
    widened: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was chosen for the user (ConvertResult.changes)
    shapes: dict[str, tuple] = field(default_factory=dict)  # the input sizes it was converted at (Loaded.shapes)
    basis: bytes | None = None  # the calibrated model int8 ranges chose the file from (ranges.RangeChoice.basis)

    @property
    def warnings(self) -> list[str]:
        widened = [f"quantization-aware training left {w['op']} {w['tensor']!r} an output scale of "
                   f"{w['scale']:.3g}, past what LiteRT's int8 kernel takes: stored at {w['to']:.3g} (its range had "
                   "collapsed; train the float model first)" for w in self.widened]
        return widened


def _converter(source: SourceModel, shapes: dict):
    """The TFLiteConverter; a size the graph cannot take fails while it is traced (Keras and TF raise
    ValueError, TypeError, ...): a conversion error, not an internal one."""
    try:
        return source.tflite_converter(shapes)
    except Exception as exc:  # noqa: BLE001 - TF raises many types while tracing
        raise ConversionError(f"{source.path}: cannot trace the model for conversion: {one_line(exc)}") from None


def _first_output(tflite: bytes, samples: list) -> np.ndarray:
    """A model's first output (dequantized) on representative-dataset samples, stacked."""
    from types import SimpleNamespace

    from edgekit.converters.feeding import size_open_inputs
    from edgekit.runtime.backend import get_backend
    from edgekit.runtime.quant import dequantize, quantize

    def params(d):
        scale, zero = d["quantization"]
        return SimpleNamespace(dtype=d["dtype"], scale=scale, zero_point=zero, quantized=bool(scale))

    interp = get_backend().interpreter(model_content=tflite, num_threads=None)
    if size_open_inputs(interp, samples[0]):  # an open-size model, at the samples' size
        interp.allocate_tensors()
    if isinstance(samples[0], dict):  # several inputs: fed by signature name
        runner = interp.get_signature_runner()
        first = sorted(runner.get_output_details())[0]
        return np.concatenate([runner(**s)[first] for s in samples]).astype(np.float32)
    ins, out = interp.get_input_details(), interp.get_output_details()[0]
    outputs = []
    for sample in samples:
        for d, x in zip(ins, sample):
            interp.set_tensor(d["index"], quantize(x, params(d)))
        interp.invoke()
        outputs.append(dequantize(interp.get_tensor(out["index"]), params(out)))
    return np.concatenate(outputs)


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


def _check_int16_inputs(mode: str, inputs: tuple[TensorSpec, ...]) -> None:
    """TFLite's int16x8 quantizer wants a float range for every input and gets none for integer ones (token
    ids): the plain converter fails there too ("Empty min/max for tensor ...")."""
    ints = [t for t in inputs if "int" in t.dtype]
    if mode == "int16x8" and ints:
        names = ", ".join(f"integer input {t.name!r} ({t.dtype})" for t in ints)
        raise ConversionError(f"`mode=int16x8` quantizes every activation to int16, and TFLite's int16x8 quantizer "
                              f"cannot take an {names}: use `mode=int8` (its token ids stay integers) or "
                              "`mode=dynamic`")


def quantize(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calibrated: Calibrated, say: Say) -> Quantized:
    """The .tflite in the recipe's mode. int8 after post-training calibration goes through converters/ranges.py:
    activation ranges by `calibration.method`, measured on the calibration data."""
    say(f"converting to {recipe.mode}" + (" (ranges from quantization-aware training)" if recipe.qat else ""))
    started = time.perf_counter()
    calib = calibrated.calib
    notes: list[str] = []
    shapes = loaded.shapes
    first, shapes, cause = _first_conversion(recipe, source, loaded, calibrated, say, notes)
    tflite, range_setting, basis = first if first is not None else (None, None, None)
    closed = _batch_closed(loaded, shapes, tflite, cause, lambda fixed: _converted(
        recipe, source, fixed, calib, say, calibrated.ranking), say)
    if closed is not None:
        (tflite, range_setting, basis), shapes, note = closed
        notes.append(note)
    if recipe.mode == "float16" and not recipe.qat:
        tflite = _float16_held(recipe, source, shapes, tflite, notes)
    quantized = Quantized(tflite, range_setting, time.perf_counter() - started, notes=notes, shapes=shapes,
                          basis=basis)
    if recipe.qat:  # a QAT range that collapsed can be past what an int8 ADD/SUB kernel takes
        quantized.tflite, quantized.widened = widen_collapsed_outputs(tflite)
    return quantized


def _first_conversion(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calibrated: Calibrated, say: Say,
                      notes: list[str]) -> tuple[tuple | None, dict, _BatchCause | None]:
    """The conversion at the loaded sizes or, where the model does not convert at an open size, at the
    calibration samples' (said in `notes`): (what `_converted` gave, the sizes, None), or (None, the sizes,
    the cause) where an int8 conversion's calibrated model showed that the open batch must close."""
    calib, shapes = calibrated.calib, loaded.shapes
    try:
        try:
            return _converted(recipe, source, shapes, calib, say, calibrated.ranking,
                              _BatchCause.probe(loaded, shapes)), shapes, None
        except ConversionError as exc:
            hint = open_size_hint(loaded.inputs)
            if hint is None:
                raise
            sized = _calibration_sizes(loaded, calib)
            if sized is None:
                raise ConversionError(f"{exc} ({hint})", exc.ops) from None
            note = (f"the model does not convert at an open size ({one_line(exc)[:100]}): converted at the "
                    f"calibration samples' size, {', '.join(f'{n}={list(s)}' for n, s in sized.items())}; the file "
                    "takes that size only (`input_shape` sets another)")
            say(note)
            notes.append(note)
            shapes = {**loaded.shapes, **sized}
            return _converted(recipe, source, shapes, calib, say, calibrated.ranking,
                              _BatchCause.probe(loaded, shapes)), shapes, None
    except _ShapeFromBatch as stop:
        return None, shapes, stop.cause


class _ShapeFromBatch(Exception):
    """Raised on an int8 conversion's calibrated model, before its ranges are scored, where the open batch
    leaves ops on the GPU delegate's CPU (`_BatchCause`): the conversion starts again at batch 1 at once."""

    def __init__(self, cause: _BatchCause):
        super().__init__("the open batch computes shapes at run time")
        self.cause = cause


@dataclass(frozen=True)
class _BatchCause:
    """Ops that compute a shape at run time from an open batch, which the GPU rules leave on the CPU
    (runtime/open_dims.py): `names` the inputs to close, `before` every op left on the CPU, `ops` the caused."""

    names: list[str]
    before: list[dict[str, Any]]
    ops: list[int]

    @classmethod
    def of(cls, loaded: Loaded, shapes: dict, tflite: bytes) -> _BatchCause | None:
        from edgekit.runtime.gpu_compat import check_model
        from edgekit.runtime.open_dims import open_dimension

        names = open_batches(_current(loaded, shapes), loaded.given)
        before = [r for r in check_model(tflite) if not r["compatible"]] if names else []
        cause = open_dimension(tflite, before) if before else None
        if cause is None or not cause["batch_only"]:  # other open dimensions: batch 1 alone would not fix the ops
            return None
        return cls(names, before, cause["ops"])

    @staticmethod
    def probe(loaded: Loaded, shapes: dict) -> Callable[[bytes], None]:
        """What `_converted` runs on an int8 conversion's calibrated model: stops it where the batch must close."""
        def probe(calibrated: bytes) -> None:
            if (cause := _BatchCause.of(loaded, shapes, calibrated)) is not None:
                raise _ShapeFromBatch(cause)
        return probe


def _current(loaded: Loaded, shapes: dict) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, shapes.get(t.name, t.shape), t.dtype) for t in loaded.inputs)


def _batch_closed(loaded: Loaded, shapes: dict, tflite: bytes | None, cause: _BatchCause | None,
                  convert: Callable[[dict], tuple], say: Say) -> tuple[tuple, dict, str] | None:
    """An open batch that leaves ops on the CPU of the GPU delegate because they compute a shape at run time
    (a Flatten's or a Reshape's): converted again at batch 1 and kept where the GPU rules leave fewer ops on
    the CPU. `cause`: found on an int8 conversion's calibrated model (`tflite` None: nothing to keep, the
    ranges were never scored at the open batch). (what `convert` gave, the shapes, what to say), or None."""
    from edgekit.runtime.gpu_compat import check_model

    cause = cause or (_BatchCause.of(loaded, shapes, tflite) if tflite is not None else None)
    if cause is None:
        return None
    current = _current(loaded, shapes)
    closed = {**shapes, **{t.name: t.shape for t in batch_of_one(current, cause.names) if t.name in cause.names}}
    say(f"converting {'again ' if tflite else ''}at batch 1: {len(cause.ops)} op(s) compute a shape at run time "
        "from the open batch")
    again = convert(closed)
    after = [r for r in check_model(again[0]) if not r["compatible"]]
    if tflite is not None and len(after) >= len(cause.before):
        return None
    ops = ", ".join(dict.fromkeys(r["op"] for r in cause.before if r["index"] in cause.ops))
    return again, closed, (f"converted at batch 1: with the batch open, {len(cause.ops)} op(s) ({ops}) compute "
                           f"a shape at run time and the GPU delegate leaves them on the CPU ({len(cause.before)} "
                           f"op(s) on the CPU -> {len(after)}); {keep_open_hint(current, cause.names)}")


def _converted(recipe: ConvertRecipe, source: SourceModel, shapes: dict, calib: CalibrationSet | None,
               say: Say, ranking: CalibrationSet | None = None,
               probe: Callable[[bytes], None] | None = None) -> tuple[bytes, dict[str, Any] | None, bytes | None]:
    """The converter's file at `shapes`, and where int8 ranges were chosen, how, and the calibrated model the
    file was quantized from (`ranges.RangeChoice.basis`). `probe` sees the calibrated model before its ranges
    are scored (and may raise to stop there)."""
    representative = calib.representative_dataset if calib is not None and not recipe.qat else None
    converter = configure(_converter(source, shapes), recipe.mode, recipe.io, representative, qat=recipe.qat,
                          sparse=_zeros_stay(recipe))
    if recipe.mode != "int8" or recipe.qat or representative is None:
        return run_converter(converter), None, None
    from edgekit.converters import ranges

    method = recipe.calibration.method
    calibrated = ranges.calibrated_model(converter)
    if probe is not None:
        probe(calibrated)
    variants, equalization = _equalized(recipe, source, calibrated, representative, say)
    choice = ranges.choose(calibrated, recipe.io, method, list(representative()),
                           _first_output, seed=recipe.seed, say=say, variants=variants,
                           extra=list(ranking.representative_dataset()) if ranking is not None else [])
    if equalization is not None:
        choice.entry["equalization"] = equalization
    return choice.tflite, choice.entry, choice.basis


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
    """A maker of the calibrated model with cross-layer equalised weights (converters/equalize.py), for `auto`
    where a channel moves by `equalize.WORTH` or more and for `equalize`; and what was equalised."""
    from edgekit.converters import equalize

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
    def equalised() -> bytes:  # made where `ranges.choose` scores or keeps it
        try:
            return equalize.equalised(calibrated, plan, list(representative()))
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - a graph it did not foresee: one line, auto goes on
            raise ConversionError(f"cross-layer equalisation failed on this model: {one_line(exc)[:200]}") from None

    return {equalize.NAME: equalised}, {**plan.describe(), "candidate": True}


def _calibration_sizes(loaded: Loaded, calib: CalibrationSet | None) -> dict[str, tuple] | None:
    """The open inputs at their calibration samples' size (batch 1), None without calibration arrays."""
    return None if calib is None else _sample_sizes(loaded, calib.arrays())


def _sample_sizes(loaded: Loaded, arrays: list[np.ndarray]) -> dict[str, tuple] | None:
    """The open inputs at the size of these samples (one array per input; batch 1), None when none is open."""
    sized = {}
    for t, a in zip(loaded.inputs, arrays):
        if any(d is None for d in t.shape[1:]):
            sized[t.name] = (1, *a.shape[1:])
    return sized or None


# -- budget -------------------------------------------------------------------------------------------------
def within_budget(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calib: CalibrationSet, plain: bytes,
                  say: Say, basis: bytes | None = None, shapes: dict[str, tuple] | None = None):
    """The accuracy-budget autopilot: measure int8 on the evaluation data and keep sensitive layers in float;
    its mixes are made from `basis`, the calibrated model `plain` was quantized from (its chosen ranges, its
    corrected biases or equalised weights), where given; the sensitivity ranking is the converter's model's,
    at `shapes`, the input sizes `plain` was converted at (Quantized.shapes; default Loaded.shapes)."""
    from edgekit.converters.autopilot import autopilot

    data = _labelled(recipe.budget.eval_data, loaded, "budget.eval_data", recipe)
    float_classes = np.argmax(source.predict(data.x), axis=-1)
    float_top1 = float(np.mean(float_classes == data.y))
    say(f"checking the accuracy budget of {recipe.max_drop:g} points on {data.source}")

    def evaluate(tflite: bytes) -> tuple[float, float]:
        classes = np.argmax(Model(tflite, delegate="cpu", probe=False).predict(data.x), axis=-1)
        return float(np.mean(classes == data.y)), float(np.mean(classes == float_classes))

    converter = configure(source.tflite_converter(loaded.shapes if shapes is None else shapes), recipe.mode, recipe.io,
                          calib.representative_dataset)
    result = autopilot(converter, calib.representative_dataset, plain, evaluate, float_top1, recipe.max_drop,
                       eval_samples=len(data.y), int16=recipe.budget.int16, progress=say, calibrated=basis)
    result.eval_data = data.source
    return result.tflite, result


def budget_warnings(recipe: ConvertRecipe, budget) -> list[str]:
    if budget is None or budget.met:
        return []
    every = "" if budget.every_op_float_drop is None else (
        f"; not even every op in float does ({budget.every_op_float_drop:.2f} points: the float model's own "
        "difference from Keras on this data)")
    kinds = "int8, int16x8 and float" if recipe.budget.int16 else "int8 and float"
    return [f"no mix of {kinds} layers met `budget.max_drop` {recipe.max_drop:g}: kept the best found "
            f"({budget.drop:.2f} points, {len(budget.float_ops)} op(s) in float){every}"]


# -- verify -------------------------------------------------------------------------------------------------
@dataclass
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
    verification, notes = None, []
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
                  kind: str = "calibration") -> tuple[dict[str, Any], list[str]]:
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


# -- target -------------------------------------------------------------------------------------------------
@dataclass
class Targeted:
    """Delegate hints and GPU compatibility for `target`, with the warnings they call for."""

    entries: dict[str, Any]
    warnings: list[str]

    def metadata(self) -> dict[str, Any]:
        return dict(self.entries)


def target(recipe: ConvertRecipe, tflite: bytes) -> Targeted:
    from edgekit.runtime.inspect import fallback_line

    entries: dict[str, Any] = {"target": recipe.target, "delegates": hints_for(recipe.target, recipe.mode)}
    warnings: list[str] = []
    if recipe.target in ("gpu", "nnapi"):
        entries["gpu_compatibility"] = _gpu_check(tflite)
        fallback = entries["gpu_compatibility"].get("fallback_ops") or []
        if fallback:
            warnings.append(fallback_line(f"the GPU delegate would leave {len(fallback)} op(s) on the CPU",
                                          entries["gpu_compatibility"]))
    if recipe.target == "nnapi":
        warnings.append(NNAPI_DEPRECATED)
    if recipe.target == "gpu" and recipe.mode not in ("float16", "float32"):
        warnings.append(entries["delegates"][0]["reason"])
    return Targeted(entries, warnings)


def _gpu_check(tflite: bytes) -> dict[str, Any]:
    """TFLite's analyzer on the converted model: what the GPU delegate would leave on the CPU."""
    from edgekit.runtime.inspect import analyze

    gpu = analyze(tflite, gpu=True)["gpu"]
    return {k: gpu[k] for k in ("checked", "compatible", "fallback_ops", "op_share", "weight_share", "open_dimension")
            if k in gpu}
