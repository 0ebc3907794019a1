"""What fine-tuning trains each output towards, and how each output is scored.

A target is read from the training data (`SampleData.targets_for`: the array keyed by the output's name, or
`y` for a single output) and judged against the output's shape and values on a few samples:
- classes: whole numbers 0..K-1 with the output's shape less its last axis (one class per sample, or per
  pixel of a segmentation map) -> sparse categorical cross-entropy (from logits unless the output sums to
  1), scored by top-1 (per element);
- binary: 0/1 values of the output's shape (a trailing axis of 1 may be left out: a mask) -> binary
  cross-entropy (from logits unless the output lies in [0, 1]), scored by agreement at 0.5 (0 for logits);
- values: any other finite values of the output's shape -> mean squared error, scored by it (lower is
  better).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgekit.errors import CalibrationError

METRICS = {"classes": "top-1", "binary": "accuracy", "values": "mse"}


@dataclass(frozen=True)
class Target:
    output: str
    kind: str  # classes | binary | values
    y: np.ndarray  # aligned with the samples, shaped as the loss wants it
    from_logits: bool = False

    @property
    def metric(self) -> str:
        return METRICS[self.kind]

    @property
    def accuracy(self) -> bool:
        """Scored by a share of right answers (higher is better), not an error."""
        return self.kind != "values"

    def loss(self):
        import tf_keras

        if self.kind == "classes":
            return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=self.from_logits)
        if self.kind == "binary":
            return tf_keras.losses.BinaryCrossentropy(from_logits=self.from_logits)
        return tf_keras.losses.MeanSquaredError()

    def fit_metrics(self) -> list:
        """What Keras reports per epoch while training towards this target."""
        return ["accuracy"] if self.accuracy else []

    def score(self, predicted: np.ndarray, rows: slice | None = None) -> float:
        """The metric of `predicted` (this output on the samples, or on `rows` of them)."""
        y = self.y if rows is None else self.y[rows]
        predicted = np.asarray(predicted, np.float64).reshape((len(y),) + tuple(np.shape(predicted)[1:]))
        if self.kind == "classes":
            return float(np.mean(np.argmax(predicted, axis=-1) == y))
        if self.kind == "binary":
            return float(np.mean((predicted > (0.0 if self.from_logits else 0.5)) == (y > 0.5)))
        return float(np.mean((predicted - y) ** 2))


def outputs_of(values, names: Sequence[str] | None = None) -> list[np.ndarray]:
    """A model's outputs as a list in output order: one array, a Keras list, or a dict (a .tflite's, by
    `names` when it holds them all)."""
    if isinstance(values, dict):
        if names is not None and set(names) <= set(values):
            return [np.asarray(values[n]) for n in names]
        values = list(values.values())
    return [np.asarray(v) for v in values] if isinstance(values, (list, tuple)) else [np.asarray(values)]


def _fits(want: Sequence[int | None], got: Sequence[int]) -> bool:
    return len(want) == len(got) and all(w is None or w == g for w, g in zip(want, got))


def target_for(output: str, shape: Sequence[int | None], y: np.ndarray, sample: np.ndarray, *, source: str,
               param: str) -> Target:
    """The target of one output (`shape`: its shape, batch first; `sample`: its values on a few samples)."""
    y, shape = np.asarray(y), tuple(shape[1:])
    if not np.issubdtype(y.dtype, np.number) or not np.all(np.isfinite(y)):
        raise CalibrationError(f"{source}: the targets of {output!r} must be finite numbers", param=param)
    sample = np.asarray(sample, np.float64)
    bounded = bool(sample.size) and float(sample.min()) >= 0.0 and float(sample.max()) <= 1.0
    whole = np.issubdtype(y.dtype, np.integer) or bool(np.all(y == np.round(y)))
    if shape and shape[-1] not in (None, 1) and whole and _fits(shape[:-1], y.shape[1:]):
        if y.size and (y.min() < 0 or y.max() >= shape[-1]):
            raise CalibrationError(f"{source}: the class labels of {output!r} run {int(y.min())}..{int(y.max())}; "
                                   f"the output scores {shape[-1]} classes (0..{shape[-1] - 1})", param=param)
        probabilities = bounded and bool(np.allclose(sample.sum(axis=-1), 1.0, atol=1e-3))
        return Target(output, "classes", y.astype(np.int64), from_logits=not probabilities)
    if shape and shape[-1] == 1 and _fits(shape[:-1], y.shape[1:]):
        y = y[..., None]  # a mask without its channel axis
    if not _fits(shape, y.shape[1:]):
        want = "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
        raise CalibrationError(
            f"{source}: the targets of {output!r} have the shape {tuple(y.shape[1:])} per sample; the output is "
            f"{want}: give class indices (its shape less the last axis) or values of its shape", param=param)
    y = y.astype(np.float32)
    if y.size and np.all((y == 0) | (y == 1)):
        return Target(output, "binary", y, from_logits=not bounded)
    return Target(output, "values", y)


def primary(scores: dict[str, float], targets: Sequence[Target]) -> float | None:
    """The one accuracy a stage is summed up by: that of the first output scored by accuracy."""
    return next((scores[t.output] for t in targets if t.accuracy), None)
