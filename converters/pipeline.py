"""convert(): load -> calibrate -> convert -> verify -> add metadata -> write atomically."""

from __future__ import annotations

import gzip
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit._version import __version__
from edgekit.converters._tf import import_tf
from edgekit.converters.calibration import CalibrationSet, labelled_data, load_for_inputs
from edgekit.converters.collapsed import widen_collapsed_outputs
from edgekit.converters.finetune import FinetuneResult, FinetuneSpec, LabelledData, finetune, top1
from edgekit.converters.loading import SourceModel, keras_model_of_saved_model, load_model, trained_source
from edgekit.converters.metadata_writer import add_metadata
from edgekit.converters.quantize import configure, run_converter
from edgekit.converters.shapes import (check_open_image_sources, fixed_inputs, open_size_hint, preprocessing,
                                      sample_input)
from edgekit.converters.verify import check_not_collapsed, compare_per_output, match_outputs
from edgekit.converters.pruning import Structure
from edgekit.errors import CalibrationError, ConversionError, InputShapeError, UsageError, one_line
from edgekit.files import atomic_write_bytes, check_writable
from edgekit.converters.recipe import NEEDS_CALIBRATION, ConvertRecipe
from edgekit.runtime.delegates import NNAPI_DEPRECATED, hints_for
from edgekit.runtime.model import Model
from edgekit.runtime.probe import trust
from edgekit.runtime.preprocess import PreprocessSpec
from edgekit.converters.results import ConvertResult

METADATA_SCHEMA = "edgekit.metadata/1"


def _gpu_check(tflite: bytes) -> dict[str, Any]:
    """TFLite's analyzer on the converted model: what the GPU delegate would leave on the CPU."""
    from edgekit.runtime.inspect import analyze

    gpu = analyze(tflite, gpu=True)["gpu"]
    return {k: gpu[k] for k in ("checked", "compatible", "fallback_ops", "op_share", "weight_share") if k in gpu}


def _tflite_inputs(model: Model, source: SourceModel, arrays: list[np.ndarray]):
    """What the runtime Model takes: one array, or a dict by input name."""
    if len(arrays) == 1:
        return arrays[0]
    return dict(zip(source.input_names, arrays))


def _probe_finite(source: SourceModel, model: Model, inputs) -> None:
    """Without calibration data, still refuse a model that outputs NaN: run one mid-grey (or zero)
    input through both models."""
    arrays = [sample_input(t) for t in inputs]
    reference = source.predict_all(arrays)
    candidate = match_outputs(reference, model.predict(_tflite_inputs(model, source, arrays)), str(source.path))
    for name, ref in reference.items():
        check_not_collapsed(ref, candidate[name], f"{source.path} (output {name})")


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


def _verification(source: SourceModel, model: Model, calib: CalibrationSet,
                  int8: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Float model vs .tflite on the calibration samples, per output (matched by name); the first output's
    figures stand at the top level as well. Returns (verification, notes for the user)."""
    arrays = calib.arrays()
    by_input = {i.name: i for i in model.inputs}
    for i, a in enumerate(arrays):
        info = by_input.get(source.input_names[i]) or _only(model.inputs, source.input_names[i], "input")
        sig = tuple(getattr(info, "shape_signature", None) or info.shape)  # -1: an open dimension
        if len(a.shape) != len(sig) or any(d not in (-1, n) for d, n in zip(sig[1:], a.shape[1:])):
            raise InputShapeError(f"samples of shape {a.shape[1:]} do not fit the converted input {tuple(info.shape[1:])}")
    reference = source.predict_all(arrays)
    candidate = match_outputs(reference, model.predict(_tflite_inputs(model, source, arrays)), str(source.path))
    per_output, notes = compare_per_output(reference, candidate, str(source.path), int8)
    first = dict(next(iter(per_output.values())))
    first.pop("role")
    stats = {**first, "reference_device": source.device}
    if len(per_output) > 1:
        stats["outputs"] = per_output
    return stats, notes


def _labelled(source, inputs, specs, param: str, recipe: ConvertRecipe) -> LabelledData:
    """Every sample of labelled data (class folders, or arrays with `y`), read as calibration data is."""
    data = labelled_data(source, inputs, specs, param=param, seed=recipe.seed, strict=recipe.strict)
    classes = data.classes or tuple(str(i) for i in range(int(data.labels.max()) + 1))
    return LabelledData(data.x, data.labels, classes, str(source))


def _layer_of(tensor: str, layer_names: list[str]) -> str | None:
    """The Keras layer a converted tensor came from, by the name scope TensorFlow gave it."""
    for name in layer_names:  # longest first: conv2d_1 before conv2d
        if f"/{name}/" in tensor or f"/quant_{name}/" in tensor:
            return name
    return None


def _weighted_sparsity(kernels: list[dict[str, Any]]) -> float:
    sizes = [int(np.prod(k["shape"])) for k in kernels]
    return round(sum(k["sparsity"] * n for k, n in zip(kernels, sizes)) / sum(sizes), 4) if sizes else None


def _float32_gzip(source_converter) -> int:
    return len(gzip.compress(run_converter(configure(source_converter, "float32", "float32", None))))


def _float_in_file(tflite: bytes, kept_float: dict[str, str]) -> dict[str, Any]:
    """Which layers kept float by QAT still run float ops in the .tflite, and how many float ops belong to
    none of them. An op is a layer's when its output tensor is named after the layer's QAT wrapper
    (`quant_<layer>/...`; a fused op joins several names with ';')."""
    from edgekit.runtime.inspect import analyze

    in_file: dict[str, str] = {}
    other = 0
    for op in analyze(tflite, gpu=False)["float_ops"]:
        owners = [layer for layer in kept_float if f"quant_{layer}/" in op["output"]]
        other += not owners
        in_file.update({layer: kept_float[layer] for layer in owners})
    return {"float_in_file": dict(sorted(in_file.items())), "other_float_ops": other}


def _compression_report(recipe: ConvertRecipe, original: SourceModel, tuned: FinetuneResult,
                        tflite: bytes, val: LabelledData | None, convert_seconds: float) -> dict[str, Any]:
    """What training achieved, measured on the exported file: sparsity per kernel, gzip sizes, accuracy."""
    from edgekit.runtime.sparsity import kernel_sparsity

    pruning = recipe.pruning
    structure = Structure.parse(None if pruning is None else pruning.structure)
    training = recipe.training
    kernels = kernel_sparsity(tflite, group=structure.n if structure.kind == "m:n" else None)
    gzip_bytes = {"float": _float32_gzip(original.tflite_converter())}
    if tuned.pruned is not None:
        gzip_bytes["pruned"] = _float32_gzip(trained_source(original, tuned.pruned).tflite_converter())
    gzip_bytes["final"] = len(gzip.compress(tflite))
    accuracy = dict(tuned.accuracy)
    if val is not None:
        accuracy["final"] = top1(Model(tflite, delegate="cpu", probe=False).predict, val)
    names = sorted({getattr(layer, "layer", layer).name for layer in tuned.model.layers}, key=len, reverse=True)
    for k in kernels:
        k["layer"] = _layer_of(k["tensor"], names)
    pruned_kernels = [k for k in kernels if k["layer"] in tuned.pruned_layers]
    return {
        "prune": None if not recipe.prune else {
            "sparsity": recipe.prune, "schedule": pruning.schedule, "structure": str(structure),
            "layers": tuned.pruned_layers,
            "achieved": _weighted_sparsity(pruned_kernels),
        },
        "qat": None if not recipe.qat else {"range_samples": tuned.range_samples,
                                            "activation_ranges": len(tuned.qat_ranges),
                                            "kept_float": tuned.kept_float,
                                            "dead_ranges": tuned.widened_ranges,
                                            **_float_in_file(tflite, tuned.kept_float)},
        "skipped_layers": list(training.skip_layers),
        "train_data": str(recipe.train_data), "val_data": None if val is None else str(val.source),
        "epochs": training.epochs, "batch_size": training.batch_size, "replicas": tuned.replicas,
        "bridge": tuned.bridge,
        "kernels": kernels,
        "gzip_bytes": gzip_bytes,
        "accuracy": accuracy,
        "stages": tuned.stages + [{"stage": "convert", "seconds": round(convert_seconds, 2)}],
    }


def _within_budget(recipe: ConvertRecipe, source: SourceModel, inputs, specs, calib: CalibrationSet, plain: bytes,
                   say, shapes: dict | None = None):
    """The accuracy-budget autopilot: measure int8 on the evaluation data and keep sensitive layers in float."""
    from edgekit.converters.autopilot import autopilot

    data = _labelled(recipe.budget.eval_data, inputs, specs, "budget.eval_data", recipe)
    float_classes = np.argmax(source.predict(data.x), axis=-1)
    float_top1 = float(np.mean(float_classes == data.y))
    converter = configure(source.tflite_converter(shapes), recipe.mode, recipe.io, calib.representative_dataset)
    say(f"checking the accuracy budget of {recipe.max_drop:g} points on {data.source}")

    def evaluate(tflite: bytes) -> tuple[float, float]:
        classes = np.argmax(Model(tflite, delegate="cpu", probe=False).predict(data.x), axis=-1)
        return float(np.mean(classes == data.y)), float(np.mean(classes == float_classes))

    result = autopilot(converter, calib.representative_dataset, plain, evaluate, float_top1, recipe.max_drop,
                       eval_samples=len(data.y), progress=say)
    result.eval_data = data.source
    return result.tflite, result


def _fine_tune(recipe: ConvertRecipe, source: SourceModel, inputs, specs, progress, say):
    """Pruning and/or QAT when the recipe asks for them: (trained source, FinetuneResult, val data)."""
    training, pruning = recipe.training, recipe.pruning
    say(f"reading training data from {training.data}")
    train = _labelled(training.data, inputs, specs, "training.data", recipe)
    val = None if training.val_data is None else _labelled(training.val_data, inputs, specs, "training.val_data", recipe)
    if source.keras_model is None:
        source.keras_model = keras_model_of_saved_model(source.path, trust=recipe.trust_model)
    tuned = finetune(source.keras_model, FinetuneSpec(
        prune=recipe.prune or 0.0, schedule="polynomial" if pruning is None else pruning.schedule,
        structure=Structure.parse(None if pruning is None else pruning.structure), qat=recipe.qat,
        epochs=training.epochs, batch_size=training.batch_size, lr=training.lr,
        skip_layers=frozenset(training.skip_layers), logdir=training.logdir, seed=recipe.seed), train, val,
        progress=progress)
    return trained_source(source, tuned.model), tuned, val


def _calibration_entry(recipe: ConvertRecipe, calib: CalibrationSet | None, calib_source,
                       range_setting: dict[str, Any] | None = None) -> dict[str, Any] | None:
    if calib is None:
        return None
    return {
        "source": str(calib_source), "used_for": "verification" if recipe.qat else "quantization",
        "samples": len(calib), "requested": recipe.calibration.samples,
        "seed": recipe.seed, "skipped": len(calib.skipped),
        "skipped_files": [{"file": f, "reason": r} for f, r in calib.skipped[:20]],
        **({"range_setting": range_setting} if range_setting is not None else {}),
    }


def _target_entries(recipe: ConvertRecipe, tflite: bytes, metadata: dict[str, Any], warnings: list[str]) -> None:
    """Delegate hints and GPU compatibility for --target, with the warnings they call for."""
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


def _check_paths(recipe: ConvertRecipe) -> Path:
    out = recipe.output_path
    for given in (recipe.model, recipe.calib):
        if isinstance(given, Path) and out.resolve() == given.resolve():
            raise UsageError(f"{out} would replace an input; choose another", param="output")
    check_writable(out, recipe.force)
    return out


def _converter(source: SourceModel, shapes: dict):
    """The TFLiteConverter; a size the graph cannot take fails while it is traced (Keras and TF raise
    ValueError, TypeError, ...): a conversion error, not an internal one."""
    try:
        return source.tflite_converter(shapes)
    except Exception as exc:  # noqa: BLE001 - TF raises many types while tracing
        raise ConversionError(f"{source.path}: cannot trace the model for conversion: {one_line(exc)}") from None


def _single_io_only(recipe: ConvertRecipe, source: SourceModel) -> None:
    if (len(source.inputs) > 1 or len(source.outputs) > 1) and (recipe.trains or recipe.max_drop is not None):
        raise UsageError(f"`pruning`, `training.qat` and `budget` work on single-input, single-output models for "
                         f"now; {recipe.model} has {len(source.inputs)} input(s) and {len(source.outputs)} output(s)")


def _calibrate(recipe: ConvertRecipe, source: SourceModel, inputs, specs, say) -> tuple[CalibrationSet | None, Any]:
    calib_source = recipe.calib or (recipe.train_data if recipe.mode in NEEDS_CALIBRATION else None)
    if calib_source is None:
        return None, None
    sources = calib_source if isinstance(calib_source, dict) else {None: calib_source}
    check_open_image_sources(inputs, sources)
    say(f"reading calibration data from {calib_source}")
    calib = load_for_inputs(sources, inputs, specs, samples=recipe.calibration.samples, seed=recipe.seed,
                            strict=recipe.strict)
    return calib, calib_source


def _only(infos, name: str, what: str):
    """A converted tensor found by position: only where there is one, never among several."""
    if len(infos) == 1:
        return infos[0]
    raise ConversionError(f"the converted model has no {what} named {name!r} "
                          f"(it has {', '.join(i.name for i in infos)})")


def _tensor_entries(probe: Model, inputs, specs, verification: dict | None, source: SourceModel):
    """Metadata per input (with its preprocessing and role) and per output (role), in the model's order."""
    ins = []
    by_input = {i.name: i for i in probe.inputs}
    for t in inputs:
        info = by_input.get(t.name) or _only(probe.inputs, t.name, "input")
        spec = specs.get(t.name)
        ins.append({**info.to_dict(), "name": t.name, "role": "image" if spec is not None else "tensor",
                    "preprocessing": spec.to_dict() if spec is not None else None})
    by_name = {o.to_dict().get("name"): o.to_dict() for o in probe.outputs}
    per = (verification or {}).get("outputs") or {}
    outs = []
    for t in source.outputs:
        entry = by_name.get(t.name) or _only(probe.outputs, t.name, "output").to_dict()
        role = per.get(t.name, {}).get("role") or (
            "scores" if verification and verification.get("top1_agreement") is not None else "values")
        outs.append({**entry, "name": t.name, "role": role})
    return ins, outs


def _first_output(tflite: bytes, samples: list) -> np.ndarray:
    """A model's first output (dequantized) on representative-dataset samples, stacked."""
    from types import SimpleNamespace

    from edgekit.runtime.backend import get_backend
    from edgekit.runtime.quant import dequantize, quantize

    def params(d):
        scale, zero = d["quantization"]
        return SimpleNamespace(dtype=d["dtype"], scale=scale, zero_point=zero, quantized=bool(scale))

    interp = get_backend().interpreter(model_content=tflite, num_threads=None)
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


def _convert_model(recipe: ConvertRecipe, source: SourceModel, shapes: dict, representative, say):
    """(.tflite, range-setting record or None). int8 after post-training calibration goes through
    converters/ranges.py: activation ranges by --calib-method, measured on the calibration data."""
    converter = configure(_converter(source, shapes), recipe.mode, recipe.io, representative, qat=recipe.qat)
    if recipe.mode != "int8" or recipe.qat or representative is None:
        return run_converter(converter), None
    from edgekit.converters import ranges

    calibrated = ranges.calibrated_model(converter)
    choice = ranges.choose(calibrated, recipe.io, recipe.calibration.method, list(representative()), _first_output,
                           seed=recipe.seed, say=say)
    return choice.tflite, choice.entry


def _survives_the_interpreter(tflite: bytes) -> None:
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


def convert(recipe: ConvertRecipe, *, progress=None) -> ConvertResult:
    """Run one conversion and write the .tflite; nothing is written when any step fails."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    out = _check_paths(recipe)
    say(f"loading {recipe.model}")
    source = original = load_model(recipe.model, trust=recipe.trust_model)
    _single_io_only(recipe, source)
    inputs = fixed_inputs(source, recipe.input_shape)
    prep = recipe.preprocessing
    specs = preprocessing(inputs, resize=prep.resize, mean=prep.mean, std=prep.std)
    spec = specs[inputs[0].name] if len(inputs) == 1 else None
    tuned = val = None
    if recipe.trains:
        source, tuned, val = _fine_tune(recipe, original, inputs, specs, progress, say)
    calib, calib_source = _calibrate(recipe, source, inputs, specs, say)
    say(f"converting to {recipe.mode}" + (" (ranges from quantization-aware training)" if recipe.qat else ""))
    convert_started = time.perf_counter()
    representative = calib.representative_dataset if calib is not None and not recipe.qat else None
    shapes = {t.name: t.shape for t, given in zip(inputs, source.inputs) if t.shape != given.shape}
    try:
        tflite, range_setting = _convert_model(recipe, source, shapes, representative, say)
    except ConversionError as exc:
        hint = open_size_hint(inputs)
        if hint is None:
            raise
        raise ConversionError(f"{exc} ({hint})", exc.ops) from None
    convert_seconds = time.perf_counter() - convert_started
    widened = []
    if recipe.qat:  # a QAT range that collapsed can be past what an int8 ADD/SUB kernel takes
        tflite, widened = widen_collapsed_outputs(tflite)
    budget = None
    if recipe.max_drop is not None:
        tflite, budget = _within_budget(recipe, source, inputs, specs, calib, tflite, say, shapes)
    if recipe.qat:
        _survives_the_interpreter(tflite)
    probe = Model(tflite, delegate="cpu", probe=False)  # verification always runs on the CPU
    verification, notes = None, []
    if calib is not None:
        say(f"verifying against the float model on {len(calib)} samples")
        verification, notes = _verification(source, probe, calib, int8=recipe.mode == "int8")
    else:
        _probe_finite(source, probe, inputs)
    out_dim = source.output_shape[-1] if source.output_shape else None
    tensors_in, tensors_out = _tensor_entries(probe, inputs, specs, verification, source)
    metadata = {
        "schema": METADATA_SCHEMA,
        "mode": recipe.mode,
        "io": recipe.io,
        "preprocessing": spec.to_dict() if spec is not None else None,
        "labels": list(calib.classes) if calib is not None and len(calib.classes) == out_dim else [],
        "inputs": tensors_in,
        "outputs": tensors_out,
        "source": {"file": recipe.model.name, "format": source.format, "sha256": source.sha256},
        "calibration": _calibration_entry(recipe, calib, calib_source, range_setting),
        "verification": verification,
        "tools": tool_versions(),
        "recipe": recipe.stored(),
    }
    warnings: list[str] = list(recipe.notes) + notes + [
        f"quantization-aware training left {w['op']} {w['tensor']!r} an output scale of {w['scale']:.3g}, past "
        f"what LiteRT's int8 kernel takes: stored at {w['to']:.3g} (its range had collapsed; train the float "
        "model first)" for w in widened]
    if calib is not None and calib.skipped:
        warnings.append(f"skipped {len(calib.skipped)} unreadable calibration image(s) (`strict` makes this an "
                        f"error); first: {calib.skipped[0][1]}")
    if recipe.target is not None:
        _target_entries(recipe, tflite, metadata, warnings)
    if budget is not None:
        metadata["autopilot"] = budget.to_dict()
        if not budget.met:
            warnings.append(f"no mix of int8 and float layers met `budget.max_drop` {recipe.max_drop:g}: kept the best "
                            f"found ({budget.drop:.2f} points, {len(budget.float_ops)} op(s) in float)")
    if tuned is not None:
        say("measuring the exported model (sparsity, gzip sizes, accuracy)")
        metadata["compression"] = _compression_report(recipe, original, tuned, tflite, val, convert_seconds)
    data = add_metadata(tflite, metadata)
    written = Model(data, delegate="cpu", probe=False)  # the file we write must load
    atomic_write_bytes(out, data, force=recipe.force)
    trust(data, written.runtime)  # loaded and run here: edgekit run and bench need not probe it again
    return ConvertResult(out, len(data), metadata, time.perf_counter() - started, tuple(warnings))
