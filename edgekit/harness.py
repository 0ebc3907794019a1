"""The bench harness: latency from the interpreter that runs the model, accuracy on labelled images,
and the gap to the float Keras model. TensorFlow is imported only for `--reference`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import PreprocessSpec, load_and_prepare
from edgekit.runtime.timing import BenchSettings, measure_latency

BENCH_SCHEMA = "edgekit.bench/1"


class EvalData:
    """Labelled images, preprocessed once per distinct preprocessing spec."""

    def __init__(self, folder: ImageFolder, *, strict: bool = False):
        if not folder.labelled:
            raise UsageError(f"{folder.root}: --data needs images in class sub-folders")
        self.folder = folder
        self.strict = strict
        self.skipped: list[tuple[str, str]] = []  # (file, reason) of images that could not be read
        self._cache: dict[PreprocessSpec, np.ndarray] = {}

    def inputs(self, spec: PreprocessSpec) -> np.ndarray:
        """The images through `spec`. An unreadable one is skipped with its reason (an error when strict);
        the folder then keeps only the images read, so that labels stay aligned."""
        if spec not in self._cache:
            arrays, kept = [], []
            for i, path in enumerate(self.folder.files):
                try:
                    arrays.append(load_and_prepare(path, spec))
                    kept.append(i)
                except InputShapeError as exc:
                    if self.strict:
                        raise InputShapeError(f"evaluation image {exc} (--strict)") from None
                    self.skipped.append((str(path), str(exc)))
            if not arrays:
                raise UsageError(f"{self.folder.root}: no readable images ({len(self.skipped)} skipped)")
            if len(kept) < len(self.folder.files):
                f = self.folder
                self.folder = ImageFolder(f.root, tuple(f.files[i] for i in kept), tuple(f.labels[i] for i in kept),
                                          f.classes)
                self._cache.clear()
            self._cache[spec] = np.stack(arrays).astype(np.float32, copy=False)
        return self._cache[spec]

    def labels_for(self, model_labels: tuple[str, ...], outputs: int) -> np.ndarray:
        """Folder labels as the model's output indices: by name when the model carries labels; for
        a model without labels, folders named 0..K-1 are those indices, otherwise the sorted
        folder names are taken as the output order when their number matches the outputs."""
        classes = self.folder.classes
        if model_labels:
            index = {name: i for i, name in enumerate(model_labels)}
        elif all(c.isdigit() and int(c) < outputs for c in classes):
            index = {c: int(c) for c in classes}
        elif len(classes) == outputs:
            index = {c: i for i, c in enumerate(classes)}
        else:
            raise UsageError(f"--data has {len(classes)} class folders ({', '.join(classes[:4])}...) but the "
                             f"model has {outputs} outputs and no labels to match them by name")
        missing = [c for c in classes if c not in index]
        if missing:
            raise UsageError(f"--data classes {missing[:5]} are not among the model's labels")
        return np.asarray([index[classes[i]] for i in self.folder.labels])


def _top1(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(outputs.reshape(len(outputs), -1).argmax(axis=1) == labels))


def _per_class_top1(outputs: np.ndarray, labels: np.ndarray, folder: ImageFolder) -> dict[str, float]:
    """top-1 within each class folder, keyed by the folder name."""
    right = outputs.reshape(len(outputs), -1).argmax(axis=1) == labels
    folders = np.asarray(folder.labels)
    return {name: float(np.mean(right[folders == i])) for i, name in enumerate(folder.classes)
            if np.any(folders == i)}


class Reference:
    """The float model behind `--reference`, evaluated in TensorFlow graph mode."""

    def __init__(self, path: Path):
        from edgekit.converters.loading import load_model

        self.source = load_model(path)
        self.path = path
        self._cache: dict[PreprocessSpec, np.ndarray] = {}

    def outputs(self, spec: PreprocessSpec, x: np.ndarray, expected: tuple[int, ...]) -> np.ndarray:
        """Float outputs on the same preprocessed inputs; shapes must match the .tflite's."""
        want_in = tuple(self.source.input_shape[1:])
        if tuple(x.shape[1:]) != want_in:
            raise InputShapeError(f"--reference {self.path} takes inputs of shape {want_in}, the .tflite "
                                  f"takes {tuple(x.shape[1:])}: not the same model")
        if spec not in self._cache:
            self._cache[spec] = self.source.predict(x)
        out = self._cache[spec]
        if tuple(out.shape[1:]) != tuple(expected):
            raise InputShapeError(f"--reference {self.path} outputs shape {tuple(out.shape[1:])}, the .tflite "
                                  f"outputs {tuple(expected)}: not the same model")
        return out


def bench(paths: list[Path], settings: BenchSettings, *, data: Path | None = None,
          reference: Path | None = None, progress: Callable[[str, int], Any] | None = None,
          strict: bool = False) -> dict[str, Any]:
    """Benchmark each .tflite; returns the JSON-serialisable report (schema edgekit.bench/1)."""
    from edgekit._version import __version__
    from edgekit.metrics import compare_outputs

    if reference is not None and data is None:
        raise UsageError("--reference needs --data: accuracy is compared on labelled images")

    eval_data = EvalData(ImageFolder.scan(data), strict=strict) if data is not None else None
    ref = Reference(reference) if reference is not None else None
    report: dict[str, Any] = {
        "schema": BENCH_SCHEMA,
        "edgekit": __version__,
        "settings": {"threads": settings.threads, "runs": settings.runs, "warmup": settings.warmup},
        "data": None if data is None else {"path": str(data), "samples": len(eval_data.folder.files),
                                            "classes": len(eval_data.folder.classes)},
        "reference": None,
        "models": [],
    }
    ref_top1: float | None = None
    for path in paths:
        preview = Model(path)  # preflight and preprocessing before timing
        spec = preview.preprocess if eval_data is not None else None
        stored = bool((preview.metadata or {}).get("preprocessing"))
        x = eval_data.inputs(spec) if eval_data is not None else None
        del preview
        tick = progress(f"bench {path.name}", settings.runs) if progress else None
        model, entry = measure_latency(path, settings, None if x is None else x[0], tick)
        meta = model.metadata or {}
        entry = {
            "path": str(path),
            "size_bytes": model.size_bytes,
            "threads": settings.threads,
            "backend": model.backend.name,
            "backend_version": model.backend.version,
            "accelerator": model.delegate.accelerator,
            "fallbacks": model.delegate.fallbacks,
            "mode": meta.get("mode"),
            "preprocessing": None if spec is None else ("metadata" if stored else "input-shape defaults"),
            **entry,
            "accuracy": None,
        }
        if eval_data is not None:
            outputs = model.predict(x)
            labels = eval_data.labels_for(model.labels, int(np.prod(outputs.shape[1:])))
            acc: dict[str, Any] = {"samples": len(labels), "top1": _top1(outputs, labels),
                                   "per_class_top1": _per_class_top1(outputs, labels, eval_data.folder)}
            if ref is not None:
                ref_out = ref.outputs(spec, x, outputs.shape[1:])
                ref_acc = _top1(ref_out, labels)
                if ref_top1 is None:
                    ref_top1 = ref_acc
                    report["reference"] = {"path": str(reference), "format": ref.source.format,
                                           "device": ref.source.device, "top1": ref_acc}
                cmp = compare_outputs(ref_out, outputs)
                acc.update({
                    "reference_top1": ref_acc,
                    "reference_per_class_top1": _per_class_top1(ref_out, labels, eval_data.folder),
                    "top1_delta_points": 100.0 * (acc["top1"] - ref_acc),
                    "agreement": cmp["top1_agreement"],
                    "max_abs_error": cmp["max_abs_error"],
                    "mean_abs_error": cmp["mean_abs_error"],
                    "snr_db": cmp["snr_db"],
                })
            entry["accuracy"] = acc
        report["models"].append(entry)
    if eval_data is not None:
        report["data"]["samples"] = len(eval_data.folder.files)
        report["data"]["skipped"] = [{"file": f, "reason": r} for f, r in eval_data.skipped[:20]]
        report["data"]["skipped_count"] = len(eval_data.skipped)
    return report
