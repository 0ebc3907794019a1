"""The bench harness: latency from the interpreter that runs the model, accuracy on labelled data, and
the gap to the float model, per output. `--data` is an image folder (class sub-folders) or a .npz/.npy
of samples; TensorFlow is imported only for a Keras or SavedModel `--reference` (a .tflite one runs here)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.metrics import looks_like_scores, output_role
from edgekit.reference import Reference
from edgekit.runtime import device
from edgekit.runtime.model import Model, TensorInfo
from edgekit.runtime.samples import Prepared, SampleData, Slot
from edgekit.runtime.sparsity import sparse_weights
from edgekit.runtime.timing import BenchSettings, measure_latency

BENCH_SCHEMA = "edgekit.bench/1"

Inputs = np.ndarray | dict[str, np.ndarray]


class EvalData:
    """`data` for bench: any source the one sample reader takes (runtime/samples.py), prepared once per
    distinct way a model takes it (its preprocessing, input shapes and types)."""

    def __init__(self, data: SampleData, *, strict: bool = False):
        self.data, self.strict = data, strict
        self.path = data.source
        self.skipped: dict[str, str] = {}  # file -> reason, over every preparation

    @property
    def format(self) -> str:
        return self.data.format

    @property
    def samples(self) -> int:
        return len(self.data)

    @property
    def classes(self) -> int:
        """Class folders, or the distinct `y` labels of an array file (0 without them)."""
        if self.data.folder is not None:
            return len(self.data.classes)
        return 0 if self.data.labels is None else len(np.unique(self.data.labels))

    @property
    def labelled(self) -> bool:
        return self.data.labels is not None

    def for_model(self, model: Model) -> tuple[Hashable, Inputs, Prepared, str | None]:
        """(cache key, the model's input: an array, or a dict by name for several inputs, the prepared samples
        with their labels, where the preprocessing of images came from: None when none was used)."""
        listed = {t.get("name"): t for t in (model.metadata or {}).get("inputs") or () if isinstance(t, dict)}
        slots, used = [], []
        for info in model.inputs:
            slot, where = _slot(model, info, listed.get(info.name))
            slots.append(slot)
            images = self.data.folder is not None or (self.data.arrays is not None and slot.spec is not None and
                                                     self._array_of(model, info).dtype == np.uint8)
            if where and images:
                used.append(where)
        prepared = self.data.for_inputs(slots, strict=self.strict)
        self.skipped.update(prepared.skipped)
        x = prepared.inputs[0] if len(slots) == 1 else dict(zip(prepared.names, prepared.inputs))
        key = tuple((s.name, s.shape, s.dtype.str, s.spec) for s in slots)
        return key, x, prepared, ("metadata" if "metadata" in used else used[0] if used else None)

    def _array_of(self, model: Model, info: TensorInfo) -> np.ndarray:
        assert self.data.arrays is not None  # asked of array data only (for the type checker)
        return self.data.arrays[self.data.keys_for(model.input_names)[info.name]]

    def labels_for(self, prepared: Prepared, model_labels: tuple[str, ...], outputs: int) -> np.ndarray | None:
        """The samples' classes as indices of the scored output (None without labels): folder names by the
        model's labels when it has them, folders named 0..K-1 as those indices, else the sorted folder names
        in output order when their number matches; `y` indices as they are."""
        labels = prepared.labels
        if labels is None:
            return None
        if self.data.folder is None:
            if int(labels.max()) >= outputs:
                raise UsageError(f"{self.path}: 'y' holds class {int(labels.max())}, the scored output has {outputs} "
                                 "values (pick another with `output`)", param="data")
            return labels
        classes = self.data.classes
        if model_labels:
            index = {name: i for i, name in enumerate(model_labels)}
        elif all(c.isdigit() and int(c) < outputs for c in classes):
            index = {c: int(c) for c in classes}
        elif len(classes) == outputs:
            index = {c: i for i, c in enumerate(classes)}
        else:
            raise UsageError(f"has {len(classes)} class folders ({', '.join(classes[:4])}...) but the model has "
                             f"{outputs} outputs and no labels to match them by name", param="data")
        missing = [c for c in classes if c not in index]
        if missing:
            raise UsageError(f"classes {missing[:5]} are not among the model's labels", param="data")
        return np.asarray([index[classes[i]] if i >= 0 else -1 for i in labels])  # -1: an image beside the classes

    def per_class_top1(self, outputs: np.ndarray, labels: np.ndarray, prepared: Prepared,
                       model_labels: tuple[str, ...]) -> dict[str, float]:
        """top-1 within each class: keyed by the folder name, or by the model's label for a `y` index."""
        if self.data.folder is not None:
            assert prepared.labels is not None  # `labels` were made from them (for the type checker)
            return _per_group_top1(outputs, labels, prepared.labels, self.data.classes)
        names = tuple(model_labels[i] if i < len(model_labels) else str(i) for i in range(int(labels.max()) + 1))
        return _per_group_top1(outputs, labels, labels, names)


def _slot(model: Model, info: TensorInfo, listed: dict | None) -> tuple[Slot, str | None]:
    """How bench fills one input of `model`, and where its image preprocessing comes from (Model.preprocessing_of:
    edgekit's metadata, the standard TFLite Metadata, or defaults for its shape); none for a `tensor` input."""
    shape = tuple(None if s < 0 else d for d, s in zip(info.shape, info.shape_signature))
    integer = np.issubdtype(info.dtype, np.integer) and not info.quantized  # token ids, not quantized values
    dtype = np.dtype(info.dtype) if integer else np.dtype(np.float32)
    spec, where = None, None
    if (listed or {}).get("role") != "tensor" and not integer:
        try:
            spec, where = model.preprocessing_of(info)
        except InputShapeError:
            pass  # an open size or not image-shaped: the values are the input
    return Slot(info.name, shape, dtype, spec), where


def open_data(path: Path, *, strict: bool = False) -> EvalData:
    """`data`: an image folder (class sub-folders give labels), or a .npz/.npy of samples."""
    return EvalData(SampleData.open(path, error=InputShapeError, param="data"), strict=strict)


def _top1(outputs: np.ndarray, labels: np.ndarray) -> float | None:
    """top-1 over the samples that have a class (-1: an image lying beside the class folders); None if none has."""
    known = labels >= 0
    if not known.any():
        return None
    return float(np.mean(outputs.reshape(len(outputs), -1)[known].argmax(axis=1) == labels[known]))


def _per_group_top1(outputs: np.ndarray, labels: np.ndarray, groups: np.ndarray,
                    names: tuple[str, ...]) -> dict[str, float]:
    right = outputs.reshape(len(outputs), -1).argmax(axis=1) == labels
    return {name: float(np.mean(right[groups == i])) for i, name in enumerate(names) if np.any(groups == i)}


def _as_dict(model: Model, outputs: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return outputs if isinstance(outputs, dict) else {model.output_names[0]: outputs}


def check_output(model: Model, path: Path, output: str | None) -> None:
    """`--output NAME` must name one of the model's outputs."""
    if output is not None and output not in model.output_names:
        raise UsageError(f"{output}: {path.name} has the outputs {', '.join(model.output_names)}", param="output")


def scored_output(model: Model, outputs: dict[str, np.ndarray], output: str | None) -> str:
    """The output whose top-1 and agreement the main columns show: `output` when given, else the first
    whose role is scores (from the metadata, else from its values on the data), else the first."""
    if output is not None:
        return output
    roles = {t.get("name"): t.get("role") for t in (model.metadata or {}).get("outputs") or () if isinstance(t, dict)}
    for name, values in outputs.items():
        if roles.get(name) == "scores" or (roles.get(name) is None and looks_like_scores(values)):
            return name
    return model.output_names[0]


def per_output_errors(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Error statistics of every output against the float model; agreement only where the float output
    looks like class scores or a mask (per element there; null otherwise), and that role."""
    from edgekit.metrics import compare_outputs

    stats = {}
    for name, ref in reference.items():
        cmp = compare_outputs(ref, candidate[name])
        role = output_role(ref)
        stats[name] = {"max_abs_error": cmp["max_abs_error"], "mean_abs_error": cmp["mean_abs_error"],
                       "snr_db": cmp["snr_db"], "agreement": cmp["top1_agreement"] if role != "values" else None,
                       "role": role}
    return stats


def _first_sample(model: Model, x: Inputs | None) -> np.ndarray | None:
    """A real sample of the first input for timing, when it fits the input (its written shape, or any size
    on an open axis: the timing interpreter is resized to it)."""
    if x is None:
        return None
    first = x if isinstance(x, np.ndarray) else x[model.input_names[0]]
    info = model.inputs[0]
    fits = len(first.shape) == len(info.shape) and all(
        s < 0 or d == w for d, w, s in zip(first.shape[1:], info.shape[1:], info.shape_signature[1:]))
    return first[0] if fits else None


def bench(paths: list[Path], settings: BenchSettings, *, data: Path | None = None,
          reference: Path | None = None, output: str | None = None,
          progress: Callable[[str, int], Any] | None = None, strict: bool = False,
          baseline: Path | None = None, per_sample: bool = False) -> dict[str, Any]:
    """Benchmark each .tflite; returns the JSON-serialisable report (schema edgekit.bench/1). `output`
    names the output whose top-1 and agreement the main figures show (default: the first class-score one).
    `baseline`: a .tflite benched first (unless among `paths`), every model's `speedup` against its p50.
    `per_sample`: each model's `accuracy.per_sample_correct` too (the sweep compares the files pairwise)."""
    from edgekit._version import __version__

    if reference is not None and data is None:
        raise UsageError("needs `data`: the models are compared on its samples", param="reference")
    if output is not None and data is None:
        raise UsageError("picks the output scored on `data`: pass `data`", param="output")

    if baseline is not None:
        paths = [baseline, *(p for p in paths if Path(p).resolve() != Path(baseline).resolve())]
    eval_data = open_data(data, strict=strict) if data is not None else None
    ref = Reference(reference) if reference is not None else None
    report: dict[str, Any] = {
        "schema": BENCH_SCHEMA,
        "edgekit": __version__,
        "settings": {"threads": settings.threads, "runs": settings.runs, "warmup": settings.warmup},
        "data": None if eval_data is None else {"path": str(data), "samples": eval_data.samples,
                                                 "classes": eval_data.classes},
        "reference": None,
        "models": [],
    }
    for path in paths:
        preview = Model(path)  # preflight, output names and preprocessing before timing
        check_output(preview, path, output)
        key, x, prepared, where = eval_data.for_model(preview) if eval_data is not None else (None,) * 4
        sample = _first_sample(preview, x)
        del preview
        tick = progress(f"bench {path.name}", settings.runs) if progress else None
        before = device.state()
        model, entry = measure_latency(path, settings, sample, tick)
        machine = device.during(before, device.state())
        meta = model.metadata or {}
        entry = {
            "path": str(path),
            "size_bytes": model.size_bytes,
            "threads": settings.threads,
            "backend": model.backend.name,
            "backend_version": model.backend.version,
            "accelerator": model.delegate.accelerator,
            "fallbacks": model.delegate.fallbacks,
            "sparse_weights": sparse_weights(model.view),
            "mode": meta.get("mode"),
            "preprocessing": where,
            **entry,
            "accuracy": None,
            "device": machine,
        }
        if eval_data is not None:
            entry["accuracy"] = _accuracy(model, x, prepared, key, eval_data, ref, output, report, per_sample)
        report["models"].append(entry)
    if eval_data is not None:
        report["data"]["samples"] = eval_data.samples - len(eval_data.skipped)
        report["data"]["format"] = eval_data.format
        report["data"]["labelled"] = eval_data.labelled
        report["data"]["skipped"] = [{"file": f, "reason": r} for f, r in list(eval_data.skipped.items())[:20]]
        report["data"]["skipped_count"] = len(eval_data.skipped)
    if baseline is not None:
        _speedups(report, baseline)
    return report


def _accuracy(model, x, prepared, key, eval_data, ref, output, report: dict[str, Any],
              per_sample: bool = False) -> dict[str, Any]:
    """One model's top-1 on the data, and with a reference its comparison (the report's `reference` is set
    by the first model); with `per_sample`, whether it classified each sample that has a class right."""
    from edgekit.metrics import collapse_check, compare_outputs

    outputs = _as_dict(model, model.predict(x))
    head = scored_output(model, outputs, output)
    scored = outputs[head]
    labels = eval_data.labels_for(prepared, model.labels, int(np.prod(scored.shape[1:])))
    acc: dict[str, Any] = {
        "samples": len(scored),
        "top1": None if labels is None else _top1(scored, labels),
        "per_class_top1": {} if labels is None else eval_data.per_class_top1(scored, labels, prepared,
                                                                              model.labels),
    }
    if per_sample and labels is not None:
        known = labels >= 0
        acc["per_sample_correct"] = (scored.reshape(len(scored), -1).argmax(axis=1) == labels)[known].tolist()
    if ref is not None:
        ref_out = ref.outputs(key, model, x, outputs)
        ref_acc = None if labels is None else _top1(ref_out[head], labels)
        if report["reference"] is None:
            report["reference"] = ref.describe(ref_acc)
        per_output = per_output_errors(ref_out, outputs)
        cmp = compare_outputs(ref_out[head], scored)
        # the scored output is taken as class scores when named, alone or scores-like (as before)
        as_classes = output is not None or len(outputs) == 1 or per_output[head]["role"] == "scores"
        acc.update({
            "reference_top1": ref_acc,
            "reference_per_class_top1": {} if labels is None else
            eval_data.per_class_top1(ref_out[head], labels, prepared, model.labels),
            "top1_delta_points": None if acc["top1"] is None or ref_acc is None else
            100.0 * (acc["top1"] - ref_acc),
            "agreement": cmp["top1_agreement"] if as_classes else None,
            "max_abs_error": cmp["max_abs_error"],
            "mean_abs_error": cmp["mean_abs_error"],
            "snr_db": cmp["snr_db"],
            "outputs": per_output,
            "comparison": _paired(ref_out[head], scored, labels, as_classes and per_output[head]["role"] != "mask"),
            "collapse": collapse_check(ref_out[head], scored),
        })
    acc["output"] = head
    for info in model.inputs:  # said after the data and labels were found to fit
        model.say_preprocessing(info)
    return acc


def _paired(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray | None,
            as_classes: bool) -> dict[str, Any] | None:
    """The paired top-1 change (labelled samples) and agreement (class scores) with their 95 % intervals and
    verdict (edgekit/intervals.py); over the samples that have a class when there are labels. None when
    neither applies."""
    from edgekit.intervals import compare

    ref_top = reference.reshape(len(reference), -1).argmax(axis=1)
    cand_top = candidate.reshape(len(candidate), -1).argmax(axis=1)
    known = np.ones(len(ref_top), bool) if labels is None else labels >= 0
    if not known.any() or (labels is None and not as_classes):
        return None
    correct = {} if labels is None else {"reference_correct": ref_top[known] == labels[known],
                                         "candidate_correct": cand_top[known] == labels[known]}
    agree = (ref_top == cand_top)[known] if as_classes else None
    return compare(**correct, agree=agree).to_dict()


def _speedups(report: dict[str, Any], baseline: Path) -> None:
    """Each model's p50 against the baseline's (the first model benched)."""
    report["baseline"] = str(baseline)
    base = report["models"][0]["latency_ms"]["p50"]
    for m in report["models"]:
        p50 = m["latency_ms"]["p50"]
        m["speedup"] = round(base / p50, 3) if base and p50 else None
