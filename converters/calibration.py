"""Calibration samples from an image folder or a .npy/.npz array, through the runtime preprocessing.

Image folders are read recursively (class sub-folders give labels). Arrays of uint8 are raw images
and are preprocessed like files; float arrays are taken as finished model input and must match the
input shape exactly. The set is a seeded shuffle cut to `samples`. Empty, image-free or non-finite
data is an error: edgekit never falls back to random data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from edgekit.errors import CalibrationError, InputShapeError
from edgekit.runtime.arrays import load_arrays
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.preprocess import PreprocessSpec, load_and_prepare, prepare


@dataclass(frozen=True)
class CalibrationSet:
    x: np.ndarray  # float32, (N,) + the first (or only) model input's shape
    labels: np.ndarray | None  # int, -1 where unknown
    classes: tuple[str, ...]
    source: str
    skipped: tuple[tuple[str, str], ...] = ()  # (file, reason) of images that could not be used
    others: tuple[np.ndarray, ...] = ()  # the other inputs' samples, in the model's input order
    names: tuple[str, ...] = ()  # the inputs' names when there are several (the converter is fed by name)

    def __len__(self) -> int:
        return len(self.x)

    def arrays(self) -> list[np.ndarray]:
        """Every input's samples, in the model's input order."""
        return [self.x, *self.others]

    def representative_dataset(self) -> Iterator[list[np.ndarray]]:
        """The TFLiteConverter protocol: one single-sample batch per step, one array per input (a dict by
        signature name when there are several: TFLite sorts a signature's inputs by name)."""
        arrays = self.arrays()
        for i in range(len(self.x)):
            batch = [a[i][None] for a in arrays]
            yield dict(zip(self.names, batch)) if self.names else batch


class InMemoryCalibration:
    """Calibration samples handed over in memory (Python API): one array, or the parts an iterable or a
    tf.data.Dataset gave (each one sample or one batch), with optional labels. `str()` names the source."""

    def __init__(self, parts: list[np.ndarray], labels: np.ndarray | None, source: str, whole: bool = False):
        if not parts:
            raise CalibrationError(f"{source}: calibration data is empty")
        self.parts, self.labels, self.source = parts, labels, source
        self.whole = whole  # one array holding every sample (not one element of an iterable)

    def __str__(self) -> str:
        return self.source

    def samples(self, input_rank: int) -> np.ndarray:
        """The parts as one (N, ...) array: batches (parts of the model's input rank) are concatenated,
        single samples stacked."""
        if len(self.parts) == 1 and (self.whole or self.parts[0].ndim == input_rank):
            return self.parts[0]
        ranks = {p.ndim for p in self.parts}
        if len(ranks) != 1 or len({p.shape[1:] if p.ndim == input_rank else p.shape for p in self.parts}) != 1:
            raise CalibrationError(f"{self.source}: its elements differ in shape "
                                   f"({', '.join(str(p.shape) for p in self.parts[:3])}, ...)")
        return np.concatenate(self.parts) if ranks == {input_rank} else np.stack(self.parts)


def in_memory(data: Any, *, limit: int) -> InMemoryCalibration:
    """A numpy array (or an (x, y) pair of arrays), an iterable of arrays or (x, y) pairs, or a
    tf.data.Dataset; of an iterable, the first `limit` elements are read."""
    if isinstance(data, np.ndarray):
        return InMemoryCalibration([data], None, f"numpy array {data.shape} {data.dtype}", whole=True)
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(v, np.ndarray) for v in data):
        return InMemoryCalibration([data[0]], np.asarray(data[1]), f"numpy arrays x {data[0].shape}, y", whole=True)
    kind = "tf.data.Dataset" if hasattr(data, "as_numpy_iterator") else type(data).__name__
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes, dict)):
        raise CalibrationError(f"calibration data of type {kind}: pass a path, a numpy array, an iterable of "
                               "arrays or a tf.data.Dataset")
    elements = data.as_numpy_iterator() if hasattr(data, "as_numpy_iterator") else iter(data)
    parts, labels = [], []
    for element in elements:
        if len(parts) >= limit:
            break
        if isinstance(element, dict):
            raise CalibrationError(f"{kind} yields dicts; yield the input array (or an (x, y) pair)")
        if isinstance(element, (tuple, list)):
            if len(element) > 1:
                labels.append(np.asarray(element[1]))
            element = element[0]
        parts.append(np.asarray(element))
    y = None
    if labels and len(labels) == len(parts):
        y = np.concatenate([np.atleast_1d(v) for v in labels])
    return InMemoryCalibration(parts, y, f"{kind} ({len(parts)} elements)")


def _check_finite(x: np.ndarray, where: str) -> np.ndarray:
    if x.size == 0 or len(x) == 0:
        raise CalibrationError(f"{where}: calibration data is empty")
    bad = ~np.isfinite(x)
    if bad.any():
        first = int(np.argwhere(bad.reshape(len(x), -1).any(axis=1))[0][0])
        raise CalibrationError(f"{where}: calibration data has NaN or infinite values (first in sample {first})")
    return x


def from_folder(path: Path, spec: PreprocessSpec, samples: int | None, seed: int,
                strict: bool = False) -> CalibrationSet:
    """Images that cannot be read are skipped with their reason (an error with `strict`)."""
    folder = ImageFolder.scan(path).sample(samples, seed)
    arrays, labels, skipped = [], [], []
    for file, label in zip(folder.files, folder.labels):
        try:
            arrays.append(load_and_prepare(file, spec))
            labels.append(label)
        except InputShapeError as exc:
            if strict:
                raise CalibrationError(f"calibration image {exc} (--strict)") from None
            skipped.append((str(file), str(exc)))
    if not arrays:
        raise CalibrationError(f"{path}: no readable images ({len(skipped)} skipped; first: {skipped[0][1]})")
    x = np.stack(arrays).astype(np.float32, copy=False)
    return CalibrationSet(_check_finite(x, str(path)), np.asarray(labels) if folder.classes else None,
                          folder.classes, str(path), tuple(skipped))


def _npz_arrays(path: Path) -> dict[str, np.ndarray] | np.ndarray:
    return load_arrays(path, error=CalibrationError)  # headers first: bounded, numeric, no pickles


def _load_array(path: Path, name: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The samples of a .npy, or of a .npz (key: the input's name, 'x', 'images' or 'inputs'; labels 'y')."""
    loaded = _npz_arrays(path)
    if isinstance(loaded, np.ndarray):
        return loaded, None
    keys = list(loaded)
    key = next((k for k in (name, "x", "images", "inputs") if k in keys), None)
    key = key or (keys[0] if len(keys) == 1 else None)
    if key is None:
        raise CalibrationError(f"{path}: .npz holds {keys}; name the samples array 'x'")
    return loaded[key], loaded.get("y")


def from_array(path: Path, input_shape: tuple[int, ...], spec: PreprocessSpec | None,
               samples: int | None, seed: int, name: str | None = None) -> CalibrationSet:
    x, y = _load_array(path, name)
    return from_samples(x, y, str(path), input_shape, spec, samples, seed)


def from_samples(x: np.ndarray, y: np.ndarray | None, path: str, input_shape: tuple[int, ...],
                 spec: PreprocessSpec | None, samples: int | None, seed: int) -> CalibrationSet:
    """Arrays of samples: uint8 ones are raw images (preprocessed like files), float ones finished input."""
    if x.dtype == object or not (np.issubdtype(x.dtype, np.number)):
        raise CalibrationError(f"{path}: array dtype {x.dtype} is not numeric")
    if x.ndim == 0:
        raise CalibrationError(f"{path}: holds a single number, not an array of samples")
    if len(x) == 0:
        raise CalibrationError(f"{path}: calibration data is empty")
    if y is not None and (np.ndim(y) != 1 or len(y) != len(x)):
        raise CalibrationError(f"{path}: 'y' must hold one label per sample of 'x'")
    order = np.random.default_rng(seed).permutation(len(x))[:samples]
    x = x[order]
    y = None if y is None else np.asarray(y)[order]
    if x.dtype == np.uint8 and spec is not None:
        if x.ndim not in (3, 4):
            raise CalibrationError(f"{path}: uint8 images must be (N, H, W) or (N, H, W, C), got {x.shape}")
        x = np.stack([prepare(img, spec) for img in x])
    x = np.asarray(x, np.float32)
    expected = tuple(input_shape[1:])
    if x.ndim == len(expected) and expected and expected[-1] == 1:
        x = x[..., None]
    if x.ndim - 1 != len(expected) or any(e is not None and e != g for e, g in zip(expected, x.shape[1:])):
        raise CalibrationError(
            f"{path}: samples of shape {tuple(x.shape[1:])} do not fit the model input {expected}"
        )
    return CalibrationSet(_check_finite(x, str(path)), None if y is None else y.astype(int), (), str(path))


def load_calibration(path: str | Path | InMemoryCalibration, *, input_shape: tuple[int, ...],
                     spec: PreprocessSpec | None, samples: int | None = 200, seed: int = 0,
                     strict: bool = False, name: str | None = None) -> CalibrationSet:
    if isinstance(path, InMemoryCalibration):
        return from_samples(path.samples(len(input_shape)), path.labels, path.source, tuple(input_shape), spec,
                            samples, seed)
    path = Path(path)
    if not path.exists():
        raise CalibrationError(f"{path}: calibration data not found")
    if path.is_dir():
        if spec is None:
            raise CalibrationError(
                f"the model input {tuple(input_shape)} is not an image; calibrate with a .npy/.npz array"
            )
        return from_folder(path, spec, samples, seed, strict)
    if path.suffix.lower() in (".npy", ".npz"):
        return from_array(path, tuple(input_shape), spec, samples, seed, name)
    raise CalibrationError(f"{path}: calibration data must be an image folder or a .npy/.npz file")


def _per_input(sources: dict[str | None, Any], names: list[str]) -> dict[str, Any]:
    """{input name: source}: named sources as given, or one .npz (or in-memory dict) keyed by input name."""
    if list(sources) != [None]:
        return dict(sources)
    source = sources[None]
    if isinstance(source, (str, Path)) and Path(source).suffix.lower() == ".npz" and Path(source).is_file():
        arrays = _npz_arrays(Path(source))
        if isinstance(arrays, dict):
            labels = arrays.get("y")
            return {k: InMemoryCalibration([v], labels, f"{source}[{k}]", whole=True)
                    for k, v in arrays.items() if k != "y"}
    raise CalibrationError(f"the model has {len(names)} inputs ({', '.join(names)}): calibrate each, "
                           f"--calib NAME=DIR|FILE.npy per input or one .npz whose keys are the input names")


def load_for_inputs(sources: dict[str | None, Any], inputs, specs: dict[str, PreprocessSpec | None], *,
                    samples: int | None = 200, seed: int = 0, strict: bool = False) -> CalibrationSet:
    """Calibration for every input of a model (`inputs`: its TensorSpecs in order). `sources` maps an
    input name (None: the only input, or a .npz keyed by input names) to a folder, a .npy/.npz or an
    in-memory set; each goes through that input's preprocessing. Missing or extra names are errors."""
    names = [t.name for t in inputs]
    if len(names) == 1 and len(sources) == 1:
        (key, source), = sources.items()
        if key not in (None, names[0]):
            raise CalibrationError(f"--calib {key}=...: the model has one input, {names[0]!r}")
        return load_calibration(source, input_shape=inputs[0].shape, spec=specs.get(names[0]), samples=samples,
                                seed=seed, strict=strict, name=names[0])
    per = _per_input(sources, names)
    missing, extra = [n for n in names if n not in per], [k for k in per if k not in names]
    if missing or extra:
        said = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                     f"unknown {', '.join(map(str, extra))}" if extra else "") if p)
        raise CalibrationError(f"calibration data for the inputs {', '.join(names)}: {said}")
    sets = [load_calibration(per[n], input_shape=t.shape, spec=specs.get(n), samples=samples, seed=seed,
                             strict=strict, name=n) for n, t in zip(names, inputs)]
    n = min(len(c) for c in sets)
    labelled = next((c for c in sets if c.labels is not None), None)
    return CalibrationSet(sets[0].x[:n], None if labelled is None else labelled.labels[:n],
                          labelled.classes if labelled is not None else (),
                          ", ".join(f"{name}={c.source}" for name, c in zip(names, sets)),
                          tuple(s for c in sets for s in c.skipped), tuple(c.x[:n] for c in sets[1:]), tuple(names))
