"""The bench harness: latency from the interpreter that runs the model, accuracy on labelled data, and
the gap to the float model, per output. `--data` is an image folder (class sub-folders) or a .npz/.npy
of samples; TensorFlow is imported only for `--reference`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.metrics import looks_like_scores
from edgekit.runtime import device
from edgekit.runtime.arrays import load_arrays
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.model import Model, TensorInfo
from edgekit.runtime.preprocess import PreprocessSpec, load_and_prepare, prepare
from edgekit.runtime.timing import BenchSettings, measure_latency

BENCH_SCHEMA = "edgekit.bench/1"
ARRAY_SUFFIXES = (".npz", ".npy")

Inputs = np.ndarray | dict[str, np.ndarray]


class EvalData:
    """Labelled images, preprocessed once per distinct preprocessing spec."""

    format = "folder"
    labelled = True

    def __init__(self, folder: ImageFolder, *, strict: bool = False):
        if not folder.labelled:
            raise UsageError(f"{folder.root}: --data needs images in class sub-folders")
        self.folder = folder
        self.path = folder.root
        self.strict = strict
        self.skipped: list[tuple[str, str]] = []  # (file, reason) of images that could not be read
        self._cache: dict[PreprocessSpec, np.ndarray] = {}

    @property
    def samples(self) -> int:
        return len(self.folder.files)

    @property
    def classes(self) -> int:
        return len(self.folder.classes)

    def for_model(self, model: Model) -> tuple[Hashable, Inputs, str | None]:
        """(cache key, the model's input, where the preprocessing came from) for a single image input."""
        if len(model.inputs) != 1:
            raise UsageError(f"--data {self.path}: an image folder feeds one image input; the model takes "
                             f"{', '.join(model.input_names)}: pass an .npz keyed by input names")
        spec = model.preprocess
        stored = bool((model.metadata or {}).get("preprocessing"))
        return spec, self.inputs(spec), "metadata" if stored else "input-shape defaults"

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

    def per_class_top1(self, outputs: np.ndarray, labels: np.ndarray,
                       model_labels: tuple[str, ...]) -> dict[str, float]:
        """top-1 within each class folder, keyed by the folder name."""
        return _per_group_top1(outputs, labels, np.asarray(self.folder.labels), self.folder.classes)


class ArrayData:
    """Samples from a .npz (keys: the input names, or `x` for a single input; optional `y`, class indices)
    or a .npy (one input, no labels). uint8 arrays of an image input are raw images and go through the
    model's stored preprocessing; other arrays are finished model input."""

    def __init__(self, path: Path):
        self.path = path
        self.format = path.suffix.lower().lstrip(".")  # npz or npy
        self.skipped: list[tuple[str, str]] = []
        try:
            loaded = load_arrays(path)  # headers first: bounded, numeric, no pickles
        except InputShapeError as exc:
            raise InputShapeError(f"--data {exc}") from None
        arrays = {"": loaded} if isinstance(loaded, np.ndarray) else loaded
        y = arrays.pop("y", None)
        if not arrays:
            raise InputShapeError(f"--data {path}: holds only 'y'; put the samples under the input names or 'x'")
        for key, a in arrays.items():
            where = f"{path}[{key}]" if key else str(path)
            if a.dtype == object or not np.issubdtype(a.dtype, np.number) or a.ndim == 0:
                raise InputShapeError(f"--data {where}: not an array of numeric samples ({a.dtype}, shape {a.shape})")
            if len(a) == 0:
                raise InputShapeError(f"--data {where}: no samples")
        counts = {len(a) for a in arrays.values()}
        if len(counts) > 1:
            raise InputShapeError(f"--data {path}: the arrays hold different numbers of samples "
                                  f"({', '.join(f'{k} {len(a)}' for k, a in arrays.items())})")
        self.arrays = arrays
        self.samples = counts.pop()
        self.labels: np.ndarray | None = None
        if y is not None:
            if y.ndim != 1 or len(y) != self.samples or not np.issubdtype(y.dtype, np.integer) or (y < 0).any():
                raise InputShapeError(f"--data {path}: 'y' must hold one class index (integer >= 0) per sample")
            self.labels = y.astype(np.int64)
        self._cache: dict[Hashable, np.ndarray] = {}

    @property
    def labelled(self) -> bool:
        return self.labels is not None

    @property
    def classes(self) -> int:
        return 0 if self.labels is None else len(np.unique(self.labels))

    def _keys_for(self, names: tuple[str, ...]) -> dict[str, str]:
        """{input name: array key}: by name; for one input also `x` or the only array."""
        keys = list(self.arrays)
        if len(names) == 1:
            key = next((k for k in (names[0], "x") if k in keys), keys[0] if len(keys) == 1 else None)
            if key is None:
                raise UsageError(f"--data {self.path} holds {keys}: name the samples {names[0]!r} or 'x'")
            taken = {names[0]: key}
        elif keys == [""]:
            raise UsageError(f"--data {self.path}: a .npy holds one array; the model takes the inputs "
                             f"{', '.join(names)}: pass an .npz keyed by input names")
        else:
            taken = {n: n for n in names if n in keys}
        missing = [n for n in names if n not in taken]
        unknown = [k for k in keys if k not in taken.values()]
        if missing or unknown:
            said = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                         f"unknown {', '.join(unknown)}" if unknown else "") if p)
            raise UsageError(f"--data {self.path}: {said}; the model takes {', '.join(names)} (and 'y' for labels)")
        return taken

    def for_model(self, model: Model) -> tuple[Hashable, Inputs, str | None]:
        """(cache key, the model's input: an array, or a dict by name for several inputs, where the
        preprocessing of uint8 images came from: None when every array was finished input)."""
        keys = self._keys_for(model.input_names)
        listed = {t.get("name"): t for t in (model.metadata or {}).get("inputs") or () if isinstance(t, dict)}
        prepared, used, cache_key = {}, [], []
        for info in model.inputs:
            key = keys[info.name]
            spec, source = self._spec(model, info, listed.get(info.name), self.arrays[key])
            if source:
                used.append(source)
            cache_key.append((info.name, key, spec, tuple(info.shape_signature)))
            prepared[info.name] = self._prepared(key, info, spec)
        x = prepared[model.input_names[0]] if len(model.inputs) == 1 else prepared
        where = "metadata" if "metadata" in used else used[0] if used else None
        return tuple(cache_key), x, where

    @staticmethod
    def _spec(model: Model, info: TensorInfo, listed: dict | None, array: np.ndarray):
        """The image preprocessing for a uint8 array of `info` and where it came from; (None, None) for
        finished input (float arrays, and arrays of a `tensor` input)."""
        if array.dtype != np.uint8 or (listed or {}).get("role") == "tensor":
            return None, None
        if listed and listed.get("preprocessing"):
            return PreprocessSpec.from_dict(listed["preprocessing"]), "metadata"
        if len(model.inputs) == 1:
            stored = bool((model.metadata or {}).get("preprocessing"))
            return model.preprocess, "metadata" if stored else "input-shape defaults"
        try:
            return PreprocessSpec.for_input_shape(info.shape), "input-shape defaults"
        except InputShapeError:
            return None, None  # not image-shaped: the values are the input

    def _prepared(self, key: str, info: TensorInfo, spec: PreprocessSpec | None) -> np.ndarray:
        cache = (key, spec, tuple(info.shape), tuple(info.shape_signature))
        if cache in self._cache:
            return self._cache[cache]
        a = self.arrays[key]
        where = f"{self.path}[{key}]" if key else str(self.path)
        if spec is not None:
            if a.ndim not in (3, 4):
                raise InputShapeError(f"--data {where}: uint8 images must be (N, H, W) or (N, H, W, C), "
                                      f"got {a.shape}")
            x = np.stack([prepare(img, spec) for img in a]).astype(np.float32, copy=False)
        else:
            x = np.asarray(a, np.float32)
            if not np.all(np.isfinite(x)):
                raise InputShapeError(f"--data {where}: holds NaN or infinity")
        if x.ndim == len(info.shape) - 1 and info.shape[-1] == 1:
            x = x[..., None]  # (N, H, W) for a one-channel input
        fixed = [None if s < 0 else d for d, s in zip(info.shape[1:], info.shape_signature[1:])]
        if x.ndim != len(info.shape) or any(f is not None and f != g for f, g in zip(fixed, x.shape[1:])):
            shown = "(" + ", ".join("?" if f is None else str(f) for f in fixed) + ")"
            raise InputShapeError(f"--data {where}: samples of shape {tuple(x.shape[1:])} do not fit the "
                                  f"model's input {info.name!r} {shown}")
        self._cache[cache] = x
        return x

    def labels_for(self, model_labels: tuple[str, ...], outputs: int) -> np.ndarray | None:
        """The `y` class indices (None without them); each must be an index of the scored output."""
        if self.labels is not None and int(self.labels.max()) >= outputs:
            raise UsageError(f"--data {self.path}: 'y' holds class {int(self.labels.max())}, the scored output has "
                             f"{outputs} values (pick another with --output)")
        return self.labels

    def per_class_top1(self, outputs: np.ndarray, labels: np.ndarray,
                       model_labels: tuple[str, ...]) -> dict[str, float]:
        """top-1 within each class, keyed by the model's label for it, else by the class index."""
        names = tuple(model_labels[i] if i < len(model_labels) else str(i) for i in range(int(labels.max()) + 1))
        return _per_group_top1(outputs, labels, labels, names)


def open_data(path: Path, *, strict: bool = False) -> EvalData | ArrayData:
    """`--data`: an image folder with class sub-folders, or a .npz/.npy of samples."""
    if path.is_file() and path.suffix.lower() in ARRAY_SUFFIXES:
        return ArrayData(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--data {path}: an image folder (class sub-folders) or a .npz/.npy file")
    return EvalData(ImageFolder.scan(path), strict=strict)


def _top1(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(outputs.reshape(len(outputs), -1).argmax(axis=1) == labels))


def _per_group_top1(outputs: np.ndarray, labels: np.ndarray, groups: np.ndarray,
                    names: tuple[str, ...]) -> dict[str, float]:
    right = outputs.reshape(len(outputs), -1).argmax(axis=1) == labels
    return {name: float(np.mean(right[groups == i])) for i, name in enumerate(names) if np.any(groups == i)}


def _as_dict(model: Model, outputs: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return outputs if isinstance(outputs, dict) else {model.output_names[0]: outputs}


def check_output(model: Model, path: Path, output: str | None) -> None:
    """`--output NAME` must name one of the model's outputs."""
    if output is not None and output not in model.output_names:
        raise UsageError(f"--output {output}: {path.name} has the outputs {', '.join(model.output_names)}")


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


class Reference:
    """The float model behind `--reference`, evaluated in TensorFlow graph mode."""

    def __init__(self, path: Path):
        from edgekit.converters.loading import load_model

        self.source = load_model(path)
        self.path = path
        self._cache: dict[Hashable, dict[str, np.ndarray]] = {}

    def _check_inputs(self, model: Model, x: Inputs) -> None:
        src, names = self.source.inputs, model.input_names
        if len(src) == 1 and len(names) == 1:
            pairs = [(src[0], np.asarray(x))]
        elif sorted(self.source.input_names) == sorted(names):
            pairs = [(t, x[t.name]) for t in src]
        else:
            raise InputShapeError(f"--reference {self.path} takes the inputs {', '.join(self.source.input_names)}, "
                                  f"the .tflite takes {', '.join(names)}: not the same model")
        for spec, a in pairs:
            want = tuple(spec.shape[1:])
            if len(want) != a.ndim - 1 or any(w is not None and w != g for w, g in zip(want, a.shape[1:])):
                raise InputShapeError(f"--reference {self.path} takes inputs of shape {want}, the .tflite "
                                      f"takes {tuple(a.shape[1:])}: not the same model")

    def outputs(self, key: Hashable, model: Model, x: Inputs, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Float outputs on the same inputs, under the .tflite's output names: matched by name (a single
        output by position), never by shape; shapes must match the .tflite's."""
        self._check_inputs(model, x)
        if key not in self._cache:
            self._cache[key] = self.source.predict_all(x)
        ref = self._cache[key]
        if sorted(ref) == sorted(got):
            matched = {name: ref[name] for name in got}
        elif len(ref) == len(got) == 1:
            matched = {next(iter(got)): next(iter(ref.values()))}
        else:
            raise InputShapeError(f"--reference {self.path} has the outputs {', '.join(ref)}, the .tflite has "
                                  f"{', '.join(got)}: cannot match them by name (not the same model?)")
        for name, values in matched.items():
            if tuple(values.shape[1:]) != tuple(got[name].shape[1:]):
                raise InputShapeError(f"--reference {self.path} outputs shape {tuple(values.shape[1:])}"
                                      f"{f' for {name!r}' if len(got) > 1 else ''}, the .tflite outputs "
                                      f"{tuple(got[name].shape[1:])}: not the same model")
        return matched


def per_output_errors(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Error statistics of every output against the float model; agreement only where the float output
    looks like class scores (null otherwise), and that role."""
    from edgekit.metrics import compare_outputs

    stats = {}
    for name, ref in reference.items():
        cmp = compare_outputs(ref, candidate[name])
        scores = looks_like_scores(np.asarray(ref))
        stats[name] = {"max_abs_error": cmp["max_abs_error"], "mean_abs_error": cmp["mean_abs_error"],
                       "snr_db": cmp["snr_db"], "agreement": cmp["top1_agreement"] if scores else None,
                       "role": "scores" if scores else "values"}
    return stats


def _first_sample(model: Model, x: Inputs | None) -> np.ndarray | None:
    """A real sample of the first input for timing, when it has the input's written shape."""
    if x is None:
        return None
    first = x if isinstance(x, np.ndarray) else x[model.input_names[0]]
    return first[0] if tuple(first.shape[1:]) == tuple(model.inputs[0].shape[1:]) else None


def bench(paths: list[Path], settings: BenchSettings, *, data: Path | None = None,
          reference: Path | None = None, output: str | None = None,
          progress: Callable[[str, int], Any] | None = None, strict: bool = False) -> dict[str, Any]:
    """Benchmark each .tflite; returns the JSON-serialisable report (schema edgekit.bench/1). `output`
    names the output whose top-1 and agreement the main figures show (default: the first class-score one)."""
    from edgekit._version import __version__
    from edgekit.metrics import compare_outputs

    if reference is not None and data is None:
        raise UsageError("--reference needs --data: the models are compared on its samples")
    if output is not None and data is None:
        raise UsageError("--output picks the output scored on --data: pass --data")

    eval_data = open_data(data, strict=strict) if data is not None else None
    ref = Reference(reference) if reference is not None else None
    report: dict[str, Any] = {
        "schema": BENCH_SCHEMA,
        "edgekit": __version__,
        "settings": {"threads": settings.threads, "runs": settings.runs, "warmup": settings.warmup},
        "data": None if data is None else {"path": str(data), "samples": eval_data.samples,
                                            "classes": eval_data.classes},
        "reference": None,
        "models": [],
    }
    for path in paths:
        preview = Model(path)  # preflight, output names and preprocessing before timing
        check_output(preview, path, output)
        key, x, where = eval_data.for_model(preview) if eval_data is not None else (None, None, None)
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
            "mode": meta.get("mode"),
            "preprocessing": where,
            **entry,
            "accuracy": None,
            "device": machine,
        }
        if eval_data is not None:
            outputs = _as_dict(model, model.predict(x))
            head = scored_output(model, outputs, output)
            scored = outputs[head]
            labels = eval_data.labels_for(model.labels, int(np.prod(scored.shape[1:])))
            acc: dict[str, Any] = {
                "samples": len(scored),
                "top1": None if labels is None else _top1(scored, labels),
                "per_class_top1": {} if labels is None else eval_data.per_class_top1(scored, labels, model.labels),
            }
            if ref is not None:
                ref_out = ref.outputs(key, model, x, outputs)
                ref_acc = None if labels is None else _top1(ref_out[head], labels)
                if report["reference"] is None:
                    report["reference"] = {"path": str(reference), "format": ref.source.format,
                                           "device": ref.source.device, "top1": ref_acc}
                per_output = per_output_errors(ref_out, outputs)
                cmp = compare_outputs(ref_out[head], scored)
                # the scored output is taken as class scores when named, alone or scores-like (as before)
                as_classes = output is not None or len(outputs) == 1 or per_output[head]["role"] == "scores"
                acc.update({
                    "reference_top1": ref_acc,
                    "reference_per_class_top1": {} if labels is None else
                    eval_data.per_class_top1(ref_out[head], labels, model.labels),
                    "top1_delta_points": None if labels is None else 100.0 * (acc["top1"] - ref_acc),
                    "agreement": cmp["top1_agreement"] if as_classes else None,
                    "max_abs_error": cmp["max_abs_error"],
                    "mean_abs_error": cmp["mean_abs_error"],
                    "snr_db": cmp["snr_db"],
                    "outputs": per_output,
                })
            acc["output"] = head
            entry["accuracy"] = acc
        report["models"].append(entry)
    if eval_data is not None:
        report["data"]["samples"] = eval_data.samples
        report["data"]["format"] = eval_data.format
        report["data"]["labelled"] = eval_data.labelled
        report["data"]["skipped"] = [{"file": f, "reason": r} for f, r in eval_data.skipped[:20]]
        report["data"]["skipped_count"] = len(eval_data.skipped)
    return report
