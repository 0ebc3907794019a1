"""What training achieved, measured on the exported file: sparsity per kernel and layer, gzip sizes, accuracy
per stage on the held-out data with each stage's paired comparison against the original model, the drop
judged against `training.warn_drop`, the layers QAT kept in float (the `compression` metadata entry)."""

from __future__ import annotations

import gzip
from typing import Any

import numpy as np

from edgekit.converters.drop_advice import Run, advise
from edgekit.converters.finetune import FinetuneResult, LabelledData, per_sample_output, scores_of
from edgekit.converters.loading import SourceModel, trained_source
from edgekit.converters.pruning import Structure
from edgekit.converters.quantize import configure, run_converter
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.targets import primary
from edgekit.errors import ConversionError
from edgekit.intervals import PairedComparison, compare
from edgekit.runtime.model import Model


def _layer_of(tensor: str, layer_names: list[str]) -> str | None:
    """The Keras layer a converted tensor came from, by the name scope TensorFlow gave it."""
    for name in layer_names:  # longest first: conv2d_1 before conv2d
        if f"/{name}/" in tensor or f"/quant_{name}/" in tensor:
            return name
    return None


def _weighted_sparsity(kernels: list[dict[str, Any]]) -> float | None:
    sizes = [int(np.prod(k["shape"])) for k in kernels]
    return round(sum(k["sparsity"] * n for k, n in zip(kernels, sizes)) / sum(sizes), 4) if sizes else None


def _float32_gzip(source: SourceModel, shapes: dict[str, tuple], fallback: dict[str, tuple] | None) -> int:
    """The gzip size of `source` as a float32 .tflite at `shapes`; a model that converts only at a fixed size
    (an open-size U-Net with UpSampling2D, which the trained copy converted open) at `fallback`'s."""
    try:
        tflite = run_converter(configure(source.tflite_converter(shapes), "float32", "float32", None))
    except ConversionError:
        if not fallback:
            raise
        tflite = run_converter(configure(source.tflite_converter({**shapes, **fallback}), "float32", "float32",
                                         None))
    return len(gzip.compress(tflite))


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


def comparisons_of(classes: dict[str, np.ndarray], labels: np.ndarray) -> dict[str, PairedComparison]:
    """Each stage's top-1 classes (`FinetuneResult.classes`) against the original model's (`float`) on the
    same samples: the top-1 change and the agreement, with their intervals."""
    ref = classes.get("float")
    if ref is None:
        return {}
    return {stage: compare(reference_correct=ref == labels, candidate_correct=c == labels, agree=c == ref)
            for stage, c in classes.items() if stage != "float"}


def _held_out(recipe: ConvertRecipe, tuned: FinetuneResult, classes: dict[str, np.ndarray],
              accuracy: dict[str, float]) -> dict[str, Any]:
    """The paired comparisons, the held-out curve and the drop's judgement (`compression.comparisons`,
    `held_out_curve`, `drop`), where the primary output scores one class per sample."""
    at = per_sample_output(tuned.val_targets)
    if at is None:
        return {}
    training = recipe.training
    assert training is not None
    comparisons = comparisons_of(classes, tuned.val_targets[at].y)
    run = Run(epochs=training.epochs, sparsity=recipe.prune or 0.0, distill=training.distill, qat=recipe.qat,
              channels=bool(tuned.channels), int8=recipe.mode == "int8")
    drop = advise(comparisons, training.warn_drop, tuned.curve, run, accuracy.get("float"))
    return {"comparisons": {stage: c.to_dict() for stage, c in comparisons.items()},
            **({"held_out_curve": tuned.curve} if tuned.curve else {}), **({"drop": drop} if drop else {})}


def compression_report(recipe: ConvertRecipe, original: SourceModel, tuned: FinetuneResult,
                        tflite: bytes, val: LabelledData | None, convert_seconds: float,
                        shapes: dict[str, tuple] | None = None,
                        fallback: dict[str, tuple] | None = None, val_from: str | None = None) -> dict[str, Any]:
    """What training achieved, measured on the exported file: sparsity per kernel, gzip sizes, accuracy and
    its comparisons on the held-out data (`val`, from `val_from`: a path or the split)."""
    from edgekit.runtime.sparsity import kernel_sparsity

    pruning = recipe.pruning
    structure = Structure.parse(None if pruning is None else pruning.structure)
    training = recipe.training
    assert training is not None  # the recipe checks that a conversion that trains has training data
    kernels = kernel_sparsity(tflite, group=structure.n if structure.kind == "m:n" else None)
    shapes = shapes or {}
    gzip_bytes = {"float": _float32_gzip(original, shapes, fallback)}
    if tuned.pruned is not None:
        gzip_bytes["pruned"] = _float32_gzip(trained_source(original, tuned.pruned), shapes, fallback)
    gzip_bytes["final"] = len(gzip.compress(tflite))
    accuracy, scores, classes = dict(tuned.accuracy), dict(tuned.scores), dict(tuned.classes)
    if val is not None and tuned.val_targets:
        exported = Model(tflite, delegate="cpu", probe=False)
        scores["final"] = scores_of(lambda _: exported.predict(val.by_name()), val, tuned.val_targets, classes,
                                    "final")
        final = primary(scores["final"], tuned.val_targets)
        if final is not None:
            accuracy["final"] = final
    names = sorted({getattr(layer, "layer", layer).name for layer in tuned.model.layers}, key=len, reverse=True)
    for k in kernels:
        k["layer"] = _layer_of(k["tensor"], names)
    pruned_kernels = [k for k in kernels if k["layer"] in tuned.pruned_layers]
    return {
        "prune": None if not recipe.prune or pruning is None else {
            "sparsity": recipe.prune, "schedule": pruning.schedule, "structure": str(structure),
            "layers": tuned.pruned_layers,
            "achieved": None if tuned.channels else _weighted_sparsity(pruned_kernels),
            **({"channels": tuned.channels} if tuned.channels else {}),
        },
        "qat": None if not recipe.qat else {"range_samples": tuned.range_samples,
                                            "activation_ranges": len(tuned.qat_ranges),
                                            "kept_float": tuned.kept_float,
                                            "dead_ranges": tuned.widened_ranges,
                                            **_float_in_file(tflite, tuned.kept_float)},
        "skipped_layers": list(training.skip_layers),
        "train_data": str(recipe.train_data), "val_data": None if val is None else (val_from or str(val.source)),
        **({"val_samples": len(val.x)} if val is not None else {}),
        "epochs": training.epochs, "batch_size": training.batch_size, "replicas": tuned.replicas,
        **({"distill": tuned.distill} if tuned.distill else {}),
        **({"weight_average": tuned.weight_average} if tuned.weight_average else {}),
        "bridge": tuned.bridge,
        "kernels": kernels,
        "gzip_bytes": gzip_bytes,
        "accuracy": accuracy,
        **(_held_out(recipe, tuned, classes, accuracy) if val is not None else {}),
        **({"scores": scores, "metrics": {t.output: t.metric for t in tuned.targets}}
           if len(tuned.targets) > 1 or any(t.kind != "classes" for t in tuned.targets) else {}),
        "stages": tuned.stages + [{"stage": "convert", "seconds": round(convert_seconds, 2)}],
    }
