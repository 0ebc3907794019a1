"""Calibration, fine-tuning and evaluation samples, read by the one sample reader (runtime/samples.py):
image folders (class sub-folders give labels), .npy/.npz arrays and in-memory data, through the runtime
preprocessing, in a seeded shuffle cut to `samples`. Empty, image-free or non-finite data is an error:
edgekit never falls back to random data.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters.recipe import InMemorySource
from edgekit.errors import CalibrationError
from edgekit.runtime.preprocess import PreprocessSpec
from edgekit.runtime.samples import LABEL_KEY, Prepared, SampleData, Slot


@dataclass(frozen=True)
class CalibrationSet:
    x: np.ndarray  # float32, (N,) + the first (or only) model input's shape
    labels: np.ndarray | None  # int, -1 where unknown
    classes: tuple[str, ...]
    source: str
    skipped: tuple[tuple[str, str], ...] = ()  # (file, reason) of images that could not be used
    others: tuple[np.ndarray, ...] = ()  # the other inputs' samples, in the model's input order
    names: tuple[str, ...] = ()  # the inputs' names when there are several (the converter is fed by name)
    notes: tuple[str, ...] = ()  # what the user is told about how the samples were drawn
    targets: dict[str, np.ndarray] = field(default_factory=dict)  # output name -> training targets (`outputs`)

    def __len__(self) -> int:
        return len(self.x)

    def arrays(self) -> list[np.ndarray]:
        """Every input's samples, in the model's input order."""
        return [self.x, *self.others]

    def representative_dataset(self) -> Iterator[list[np.ndarray] | dict[str, np.ndarray]]:
        """The TFLiteConverter protocol: one single-sample batch per step, one array per input (a dict by
        signature name when there are several: TFLite sorts a signature's inputs by name)."""
        arrays = self.arrays()
        for i in range(len(self.x)):
            batch = [a[i][None] for a in arrays]
            yield dict(zip(self.names, batch)) if self.names else batch


class InMemoryCalibration(InMemorySource):
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
    parts: list[np.ndarray] = []
    labels: list[np.ndarray] = []
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


def slots_of(inputs, specs: dict[str, PreprocessSpec | None]) -> list[Slot]:
    """How the sample reader fills a model's inputs: float32, or the input's own integer type (token ids)."""
    out = []
    for t in inputs:
        dtype = np.dtype(t.dtype) if t.dtype else np.dtype(np.float32)
        out.append(Slot(t.name, tuple(t.shape), dtype if np.issubdtype(dtype, np.integer) else np.dtype(np.float32),
                        specs.get(t.name)))
    return out


def sample_data(source: Any, *, param: str, error: type = CalibrationError, rank: int = 4) -> SampleData:
    """A source of samples (a path or in-memory samples of an input of this rank) as the one reader reads it."""
    if isinstance(source, InMemoryCalibration):
        return SampleData.of_arrays(source.samples(rank), source.labels, source.source, error=error, param=param)
    if isinstance(source, SampleData):
        return source
    return SampleData.open(Path(source), error=error, param=param)


def _set(prepared: Prepared, data: SampleData, source: str) -> CalibrationSet:
    classes = data.classes if prepared.labels is not None else ()
    return CalibrationSet(prepared.inputs[0], prepared.labels, classes, source, tuple(prepared.skipped),
                          prepared.inputs[1:], prepared.names if len(prepared.names) > 1 else (),
                          targets=prepared.targets)


def load_calibration(path: str | Path | InMemoryCalibration, *, input_shape: tuple[int, ...],
                     spec: PreprocessSpec | None, samples: int | None = 200, seed: int = 0,
                     strict: bool = False, name: str | None = None, dtype: str = "float32") -> CalibrationSet:
    """The calibration samples of a single input from one source."""
    from edgekit.converters.loading import TensorSpec

    t = TensorSpec(name or "input", tuple(input_shape), dtype)
    return load_for_inputs({None: path}, (t,), {t.name: spec}, samples=samples, seed=seed, strict=strict)


def load_for_inputs(sources: dict[str | None, Any], inputs, specs: dict[str, PreprocessSpec | None], *,
                    samples: int | None = 200, seed: int = 0, strict: bool = False,
                    param: str = "calib", error: type = CalibrationError, paired_only: bool = False,
                    outputs: tuple[str, ...] = ()) -> CalibrationSet:
    """Samples for every input of a model (`inputs`: its TensorSpecs in order), read by the one sample reader
    (runtime/samples.py). `sources` maps an input name (None: the only input, or one .npz keyed by input
    names) to a folder, a .npy/.npz or in-memory samples; each goes through that input's preprocessing, in
    a seeded shuffle cut to `samples`, one for all inputs when their sources hold as many samples (then sample
    i of each goes together); sources of other sizes are drawn each on their own (calibration only needs the
    ranges), an error with `paired_only`. Missing or extra names are errors. With `outputs` (names), the
    samples' training targets come along (`SampleData.targets_for`)."""
    slots = slots_of(inputs, specs)
    names = [s.name for s in slots]
    if list(sources) == [None] or (len(sources) == 1 and len(names) == 1):
        (key, source), = sources.items()
        if key not in (None, names[0]) and len(names) == 1:
            raise error(f"{key}=...: the model has one input, {names[0]!r}", param=param)
        data = sample_data(source, param=param, error=error, rank=len(slots[0].shape)).shuffled(samples, seed)
        return _checked(_set(data.for_inputs(slots, strict=strict, outputs=outputs), data, str(source)), param, error)
    missing, extra = [n for n in names if n not in sources], [k for k in sources if k not in names]
    if missing or extra:
        said = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                     f"unknown {', '.join(map(str, extra))}" if extra else "") if p)
        raise error(f"samples for the inputs {', '.join(names)}: {said}", param=param)
    return _several(sources, slots, samples=samples, seed=seed, strict=strict, param=param, error=error,
                    paired_only=paired_only, outputs=outputs)


def load_held_out(sources: dict[str | None, Any], inputs, specs: dict[str, PreprocessSpec | None], *,
                  after: int | None, count: int, seed: int = 0, strict: bool = False,
                  param: str = "calib") -> CalibrationSet | None:
    """Samples of the one source of `sources` that `load_for_inputs(..., samples=after, seed=seed)` did not
    draw (up to `count`, the same seeded shuffle), to verify on; None when it has none or there are several
    sources (drawn each on their own: no common shuffle to continue)."""
    slots = slots_of(inputs, specs)
    if len(sources) != 1 or (list(sources) != [None] and len(slots) != 1):
        return None
    (_, source), = sources.items()
    data = sample_data(source, param=param, rank=len(slots[0].shape)).held_out(after, seed, count)
    if len(data) == 0:
        return None
    held = _set(data.for_inputs(slots, strict=strict), data, str(source))
    return held if len(held) else None


def held_out_count(sources: dict[str | None, Any], inputs, specs: dict[str, PreprocessSpec | None], *, after: int,
                   param: str = "calib") -> int:
    """How many samples `load_held_out(..., after=after)` could give in all (0 where it gives none)."""
    slots = slots_of(inputs, specs)
    if len(sources) != 1 or (list(sources) != [None] and len(slots) != 1):
        return 0
    (_, source), = sources.items()
    return max(0, len(sample_data(source, param=param, rank=len(slots[0].shape))) - after)


def _several(sources: dict, slots: list[Slot], *, samples: int | None, seed: int, strict: bool, param: str,
             error: type, paired_only: bool, outputs: tuple[str, ...] = ()) -> CalibrationSet:
    """`load_for_inputs` from one source per input: one seeded permutation for all when they pair up."""
    names = [s.name for s in slots]
    every = {slot.name: sample_data(sources[slot.name], param=param, error=error, rank=len(slot.shape))
             for slot in slots}
    counts = {name: len(data) for name, data in every.items()}
    paired = len(set(counts.values())) == 1  # as many samples each: sample i of every input belongs together
    notes: tuple[str, ...] = ()
    if not paired:
        said = ", ".join(f"{n} has {c}" for n, c in counts.items())
        if paired_only:
            raise error(f"the inputs' samples must pair up, one per input: {said}", param=param)
        notes = (f"`{param}`: the inputs' samples do not pair up ({said}): each input's are drawn on their own, "
                 "as many as the fewest",)
    n = min(counts.values())
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)[:samples]  # one permutation for every input
    parts = []
    for slot in slots:
        data = every[slot.name]
        data = data.take(order if paired else rng.permutation(len(data))[:len(order)])
        if data.arrays is not None and slot.name not in data.arrays:  # one array (or one key) for this input
            data = SampleData.of_arrays(data.arrays[data.keys_for([slot.name])[slot.name]], data.labels,
                                        f"{sources[slot.name]}", error=error, param=param)
        prepared = data.for_inputs([slot], strict=strict, outputs=outputs if paired else ())
        if prepared.skipped:  # dropping one input's sample would pair the rest wrongly
            file, reason = prepared.skipped[0]
            raise error(f"{file}: {reason} (with several inputs every sample must read)", param=param)
        parts.append((data, prepared))
    # labels go with the samples of their own source: with unpaired sources, only the first input's
    labelled = next(((d, p) for d, p in (parts if paired else parts[:1]) if p.labels is not None), None)
    targets = {name: y for _, p in parts for name, y in p.targets.items()}
    return _checked(CalibrationSet(
        parts[0][1].inputs[0], None if labelled is None else labelled[1].labels,
        labelled[0].classes if labelled is not None else (),
        ", ".join(f"{slot.name}={sources[slot.name]}" for slot in slots),
        (), tuple(p.inputs[0] for _, p in parts[1:]), tuple(names), notes, targets), param, error)


def _checked(calib: CalibrationSet, param: str, error: type) -> CalibrationSet:
    if len(calib) == 0:
        raise error(f"{calib.source}: holds no samples", param=param)
    return calib


def from_folder(path: Path, spec: PreprocessSpec, samples: int | None, seed: int,
                strict: bool = False) -> CalibrationSet:
    """The images of a folder through `spec` (the demo's and tests' shortcut to the reader)."""
    data = SampleData.open(path, error=CalibrationError, param="calib").shuffled(samples, seed)
    slot = Slot("image", (None, spec.height, spec.width, spec.channels), spec=spec)
    return _set(data.for_inputs([slot], strict=strict), data, str(path))


def labelled_data(source: Any, inputs, specs: dict[str, PreprocessSpec | None], *, param: str, seed: int = 0,
                  strict: bool = False, outputs: tuple[str, ...] = ()) -> CalibrationSet:
    """Every sample of a labelled source (fine-tuning and evaluation data), by the same rules as calibration:
    class labels of at least two classes, every sample in one; or, with `outputs` (the model's output
    names), targets for every output (arrays keyed by output name, or a `y` that is not classes)."""
    sources = source if isinstance(source, dict) else {None: source}
    data = load_for_inputs(sources, inputs, specs, samples=None, seed=seed, strict=strict, param=param,
                           paired_only=True, outputs=outputs)
    if outputs and (len(outputs) > 1 or (data.targets and data.labels is None)):
        missing = [name for name in outputs if name not in data.targets]
        if missing:
            raise CalibrationError(f"{data.source}: no targets for the output(s) {', '.join(missing)}: key each "
                                   f"output's targets by its name in a .npz (the model outputs "
                                   f"{', '.join(outputs)})", param=param)
        return data
    if data.labels is None or len(np.unique(data.labels)) < 2 or (data.labels < 0).any():
        raise CalibrationError(f"{data.source}: needs labelled samples of at least two classes (class sub-folders, "
                               f"or {LABEL_KEY!r} in a .npz), or targets keyed by the output's name", param=param)
    return data
