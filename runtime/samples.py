"""One reader of sample data, with one set of rules, behind calibration (`calib`), bench (`data`),
fine-tuning (`training.data`, `training.val_data`) and the accuracy budget (`budget.eval_data`).

A source is read once (`SampleData`), raw; `for_inputs` prepares it for a model's inputs:
- an image folder: every image under it; the first level of sub-folders names the classes (labels). It
  feeds one image input, each image through that input's preprocessing.
- a .npy: the samples of one input, no labels.
- a .npz: arrays keyed by input name (for a single input also `x`, `images` or `inputs`, or its only
  array) and `y`, one class index per sample. Fine-tuning reads targets too: arrays keyed by output name
  (a mask, a value, classes per pixel), or `y` for a single output.
- arrays in memory (the Python API): an array, or {key: array}, with optional labels.
Arrays: uint8 arrays of an image input are raw images (N, H, W[, C]) and go through its preprocessing;
integer arrays of an integer input (token ids) keep its type; anything else is finished float32 input,
and must be finite. (N, H, W) fits a one-channel input. Samples must fit the input's shape (open
dimensions take any size). Errors are of the class and name the parameter the caller says.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError, InputShapeError
from edgekit.runtime.arrays import check_arrays, load_arrays
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.preprocess import PreprocessSpec, load_and_prepare, prepare

SINGLE_KEYS = ("x", "images", "inputs")  # what a .npz may call the samples of a model's only input
LABEL_KEY = "y"
ARRAY_SUFFIXES = (".npz", ".npy")


@dataclass(frozen=True)
class Slot:
    """One model input as the reader fills it."""

    name: str
    shape: tuple[int | None, ...]  # batch first; None where the size is open
    dtype: np.dtype = np.dtype(np.float32)  # float32 unless the input takes integers itself (token ids)
    spec: PreprocessSpec | None = None  # how images become this input; None: not an image input

    @property
    def integer(self) -> bool:
        return np.issubdtype(self.dtype, np.integer)


@dataclass
class Prepared:
    """Samples ready for a model: one array per input (in the slots' order), the labels aligned with them
    (None: none; -1: a sample without a class), and the images that could not be read."""

    inputs: tuple[np.ndarray, ...]
    names: tuple[str, ...]
    labels: np.ndarray | None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    targets: dict[str, np.ndarray] = field(default_factory=dict)  # output name -> its training targets

    def __len__(self) -> int:
        return len(self.inputs[0])


class SampleData:
    """Raw samples of one source: image files with their labels, or arrays by key with optional labels."""

    def __init__(self, source: str, *, folder: ImageFolder | None = None, arrays: dict[str, np.ndarray] | None = None,
                 labels: np.ndarray | None = None, error: type[EdgekitError] = InputShapeError,
                 param: str | None = None):
        self.source, self.folder, self.arrays = source, folder, arrays
        self.error, self.param = error, param
        self.y = None  # `y` as given, when it is not class indices (a mask, values): a target, not a class
        if folder is not None:
            self.labels = np.asarray(folder.labels, np.int64) if folder.classes else None
        else:
            self.labels = None if labels is None else self._checked_labels(labels)
            if labels is not None and self.labels is None:
                self.y = np.asarray(labels)
        self._prepared: dict[Hashable, Prepared] = {}

    # -- reading ----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, error: type[EdgekitError] = InputShapeError,
             param: str | None = None) -> SampleData:
        """An image folder, a .npy or a .npz."""
        path = Path(path)
        folder = cls.check(path, error=error, param=param, headers=False)
        if folder is not None:
            return cls(str(path), folder=folder, error=error, param=param)
        try:
            loaded = load_arrays(path, error=error)  # headers first: bounded, numeric, no pickles
        except EdgekitError as exc:
            raise error(str(exc), param=param) from None
        arrays = {"": loaded} if isinstance(loaded, np.ndarray) else dict(loaded)
        labels = arrays.pop(LABEL_KEY, None)
        return cls.of_arrays(arrays, labels, str(path), error=error, param=param)

    @staticmethod
    def check(path: str | Path, *, error: type[EdgekitError] = InputShapeError, param: str | None = None,
              headers: bool = True) -> ImageFolder | None:
        """What `open` refuses without reading samples: a folder without images, a missing file, another
        suffix, and (with `headers`) a .npy/.npz whose headers `check_arrays` refuses. The folder's scan for
        a folder, else None."""
        path = Path(path)
        if path.is_dir():
            try:
                return ImageFolder.scan(path)
            except EdgekitError as exc:
                raise error(str(exc), param=param) from None
        if not path.exists():
            raise error(f"{path}: no such file or folder", param=param)
        if path.suffix.lower() not in ARRAY_SUFFIXES:
            raise error(f"{path}: an image folder (class sub-folders give labels) or a .npy/.npz file", param=param)
        if headers:
            try:
                check_arrays(path, error=error)
            except EdgekitError as exc:
                raise error(str(exc), param=param) from None
        return None

    @classmethod
    def of_arrays(cls, arrays: dict[str, np.ndarray] | np.ndarray, labels: np.ndarray | None, source: str, *,
                  error: type[EdgekitError] = InputShapeError, param: str | None = None) -> SampleData:
        """Arrays in memory ({key: array}, or one array), each the samples of one input."""
        arrays = {"": arrays} if isinstance(arrays, np.ndarray) else dict(arrays)
        if not arrays:
            raise error(f"{source}: holds only {LABEL_KEY!r}; put the samples under the input names or 'x'",
                        param=param)
        for key, a in arrays.items():
            a = np.asarray(a)
            where = f"{source}[{key}]" if key else source
            if a.dtype == object or not np.issubdtype(a.dtype, np.number) or a.ndim == 0:
                raise error(f"{where}: not an array of numeric samples ({a.dtype}, shape {a.shape})", param=param)
            if len(a) == 0:
                raise error(f"{where}: holds no samples", param=param)
            arrays[key] = a
        counts = {len(a) for a in arrays.values()}
        if len(counts) > 1:
            raise error(f"{source}: the arrays hold different numbers of samples "
                        f"({', '.join(f'{k} {len(a)}' for k, a in arrays.items())})", param=param)
        return cls(source, arrays=arrays, labels=labels, error=error, param=param)

    def _checked_labels(self, y: Any) -> np.ndarray | None:
        """`y` as class indices; None when it holds other targets (per-element, or values that are not whole)."""
        y = np.asarray(y)
        if y.ndim == 0 or len(y) != len(self):
            raise self.error(f"{self.source}: {LABEL_KEY!r} holds {y.shape[0] if y.ndim else 'no'} samples, the "
                             f"inputs {len(self)}", param=self.param)
        if not np.issubdtype(y.dtype, np.number) or not np.all(np.isfinite(y)):
            raise self.error(f"{self.source}: {LABEL_KEY!r} must hold finite numbers", param=self.param)
        if np.issubdtype(y.dtype, np.floating) and y.size and np.all(y == np.round(y)):
            y = y.astype(np.int64)  # class indices saved as floats (a pandas column, keras' y as float32)
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            return None
        if (y < 0).any():
            raise self.error(f"{self.source}: {LABEL_KEY!r} must hold one class index (integer >= 0) per sample",
                             param=self.param)
        return y.astype(np.int64)

    # -- what it holds ------------------------------------------------------------------------------------
    @property
    def format(self) -> str:
        if self.folder is not None:
            return "folder"
        return "npy" if self.source.lower().endswith(".npy") else "npz" if self.source.lower().endswith(".npz") \
            else "arrays"

    def __len__(self) -> int:
        return len(self.folder.files) if self.folder is not None else len(next(iter(self._held().values())))

    def _held(self) -> dict[str, np.ndarray]:
        """The arrays by key (the callers of a folder's samples take the folder's branch first)."""
        if self.arrays is None:
            raise TypeError(f"{self.source}: an image folder holds no arrays")
        return self.arrays

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names: folder names, or "0".."K-1" for `y` labels."""
        if self.folder is not None:
            return self.folder.classes
        return tuple(str(i) for i in range(int(self.labels.max()) + 1)) if self.labels is not None else ()

    @property
    def labelled(self) -> bool:
        """Every sample has a class."""
        return self.labels is not None and bool((self.labels >= 0).all())

    def shuffled(self, limit: int | None, seed: int) -> SampleData:
        """A seeded shuffle of the samples, cut to `limit` (all when None)."""
        if self.folder is not None:
            return SampleData(self.source, folder=self.folder.sample(limit, seed), error=self.error, param=self.param)
        return self.take(np.random.default_rng(seed).permutation(len(self))[:limit])

    def held_out(self, limit: int | None, seed: int, count: int) -> SampleData:
        """Up to `count` samples that `shuffled(limit, seed)` did not take: the next ones in the same seeded
        shuffle (it shuffles every sample, then cuts), so they are never among those."""
        if limit is None or limit >= len(self):
            return self.take([])
        if self.folder is not None:
            rest = self.folder.sample(None, seed)
            f = type(rest)(rest.root, rest.files[limit: limit + count], rest.labels[limit: limit + count],
                           rest.classes)
            return SampleData(self.source, folder=f, error=self.error, param=self.param)
        return self.take(np.random.default_rng(seed).permutation(len(self))[limit: limit + count])

    def take(self, order: Sequence[int] | np.ndarray) -> SampleData:
        """The samples at `order` (one permutation applied to every input's source keeps them paired)."""
        at = np.asarray(order, np.int64)
        if self.folder is not None:
            f = self.folder
            return SampleData(self.source, folder=type(f)(f.root, tuple(f.files[i] for i in at),
                                                          tuple(f.labels[i] for i in at), f.classes),
                              error=self.error, param=self.param)
        labels = self.y if self.labels is None else self.labels
        return SampleData(self.source, arrays={k: a[at] for k, a in self._held().items()},
                          labels=None if labels is None else labels[at], error=self.error, param=self.param)

    # -- for a model --------------------------------------------------------------------------------------
    def keys_for(self, names: Sequence[str], outputs: Sequence[str] = ()) -> dict[str, str]:
        """{input name: array key}: by name; for a single input also x, images, inputs or the only array.
        Keys named after `outputs` hold targets, not inputs."""
        keys = [k for k in self._held() if k not in outputs or k in names]
        if len(names) == 1:
            key = next((k for k in (names[0], *SINGLE_KEYS) if k in keys), keys[0] if len(keys) == 1 else None)
            if key is None:
                raise self.error(f"{self.source} holds {keys}: name the samples {names[0]!r} or 'x'", param=self.param)
            return {names[0]: key}
        if keys == [""]:
            raise self.error(f"{self.source}: one array; the model takes the inputs {', '.join(names)}: give a .npz "
                             "keyed by input names", param=self.param)
        missing, unknown = [n for n in names if n not in keys], [k for k in keys if k not in names]
        if missing or unknown:
            said = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                         f"unknown {', '.join(unknown)}" if unknown else "") if p)
            raise self.error(f"{self.source}: {said}; the model takes {', '.join(names)} (and {LABEL_KEY!r} for "
                             "labels)", param=self.param)
        return {n: n for n in names}

    def targets_for(self, outputs: Sequence[str], inputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """{output name: its targets}: the array keyed by the output's name, or `y` for a single output (class
        indices, or any other target); outputs without one are left out."""
        arrays = self._held()
        found = {name: arrays[name] for name in outputs if name in arrays and name not in inputs}
        y = self.labels if self.labels is not None else self.y
        if len(outputs) == 1 and not found and y is not None:
            found[outputs[0]] = y
        return found

    def for_inputs(self, slots: Sequence[Slot], *, strict: bool = False, outputs: Sequence[str] = ()) -> Prepared:
        """The samples prepared for these inputs (kept: a second call with the same slots is free), with the
        targets of `outputs` (`targets_for`). An image that cannot be read is skipped and reported (an error
        with `strict`); the labels and targets stay aligned."""
        key = (tuple((s.name, s.shape, s.dtype.str, s.spec) for s in slots), tuple(outputs))
        if key not in self._prepared:
            self._prepared[key] = (self._folder(self.folder, slots, strict, outputs) if self.folder is not None
                                   else self._arrays(slots, outputs))
        return self._prepared[key]

    def _folder(self, folder: ImageFolder, slots: Sequence[Slot], strict: bool,
                outputs: Sequence[str] = ()) -> Prepared:
        if len(slots) != 1:
            raise self.error(f"{self.source}: an image folder feeds one image input; the model takes "
                             f"{', '.join(s.name for s in slots)}: give a .npz keyed by input names", param=self.param)
        slot = slots[0]
        if slot.spec is None:
            raise self.error(f"{self.source}: an image folder feeds an image input; the model's input "
                             f"{slot.name!r} {_shown(slot.shape)} is not one: give a .npy/.npz", param=self.param)
        arrays, kept, skipped = [], [], []
        for i, path in enumerate(folder.files):
            try:
                arrays.append(load_and_prepare(path, slot.spec))
                kept.append(i)
            except InputShapeError as exc:
                if strict:
                    raise self.error(f"{exc} (`strict`)", param=self.param) from None
                skipped.append((str(path), str(exc)))
        if not arrays:
            raise self.error(f"{self.source}: no readable images ({len(skipped)} skipped; first: {skipped[0][1]})",
                             param=self.param)
        x = self._fits(np.stack(arrays).astype(np.float32, copy=False), slot, self.source)
        labels = None if self.labels is None else self.labels[kept]
        targets = {outputs[0]: labels} if len(outputs) == 1 and labels is not None else {}
        return Prepared((x,), (slot.name,), labels, skipped, targets)

    def _arrays(self, slots: Sequence[Slot], outputs: Sequence[str]) -> Prepared:
        names = [s.name for s in slots]
        keys = self.keys_for(names, outputs)
        inputs = []
        for slot in slots:
            key = keys[slot.name]
            where = f"{self.source}[{key}]" if key else self.source
            inputs.append(self._fits(self._array(self._held()[key], slot, where), slot, where))
        targets = self.targets_for(outputs, list(keys.values())) if outputs else {}
        return Prepared(tuple(inputs), tuple(names), self.labels, targets=targets)

    def _array(self, a: np.ndarray, slot: Slot, where: str) -> np.ndarray:
        if a.dtype == np.uint8 and slot.spec is not None:
            if a.ndim not in (3, 4):
                raise self.error(f"{where}: uint8 images must be (N, H, W) or (N, H, W, C), got {a.shape}",
                                 param=self.param)
            return np.stack([prepare(img, slot.spec) for img in a]).astype(np.float32, copy=False)
        if slot.integer:
            if not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
                raise self.error(f"{where}: holds {a.dtype} values; the input {slot.name!r} takes {slot.dtype} "
                                 "(integer ids)", param=self.param)
            info = np.iinfo(slot.dtype)
            if a.size and (a.min() < info.min or a.max() > info.max):
                raise self.error(f"{where}: values {a.min()}..{a.max()} do not fit {slot.dtype}", param=self.param)
            return a.astype(slot.dtype, copy=False)
        x = np.asarray(a, np.float32)
        if not np.all(np.isfinite(x)):
            bad = int(np.argwhere(~np.isfinite(x).reshape(len(x), -1).all(axis=1))[0][0])
            raise self.error(f"{where}: holds NaN or infinity (first in sample {bad})", param=self.param)
        return x

    def _fits(self, x: np.ndarray, slot: Slot, where: str) -> np.ndarray:
        if x.ndim == len(slot.shape) - 1 and slot.shape[-1] == 1:
            x = x[..., None]  # (N, H, W) for a one-channel input
        want = slot.shape[1:]
        if x.ndim - 1 != len(want) or any(w is not None and w != g for w, g in zip(want, x.shape[1:])):
            raise self.error(f"{where}: samples of shape {tuple(x.shape[1:])} do not fit the input {slot.name!r} "
                             f"{_shown(slot.shape)}", param=self.param)
        return x


def _shown(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape[1:]) + ")"
