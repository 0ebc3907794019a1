"""The classify task: top-k classes of an image, with the labels stored in the model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from edgekit.errors import UsageError
from edgekit.runtime.model import Model
from edgekit.runtime.stream import FrameStream
from edgekit.runtime.tasks.base import ImageTask, RunSettings

if TYPE_CHECKING:
    from edgekit.runtime.sources import Frame, Source


class Classification(NamedTuple):
    index: int  # type: ignore[assignment]  # the class index, public API: it hides tuple.index, which none call
    label: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    def to_text(self) -> str:
        return f"{self.label} {self.score:.3f}"


def is_classifier(model: Model) -> bool:
    """One (1, K) output with K > 1."""
    return len(model.outputs) == 1 and len(model.outputs[0].shape) == 2 and model.outputs[0].shape[1] > 1


class Classifier(ImageTask):
    """Top-k classes of an image, with the labels stored in the model."""

    name = "classify"
    batches = True
    samples = True

    def __init__(self, model: Model | str, *, num_threads: int | Literal["auto"] | None = None):
        super().__init__(model, num_threads=num_threads)
        if not is_classifier(self.model):
            raise UsageError(f"model output {self.model.outputs[0].shape} is not a (1, classes) classifier")
        self.model.say_preprocessing(self.model.inputs[0])

    @classmethod
    def matches(cls, model: Model) -> bool:
        """One (1, K) output, and no detection post-processing op (that model is a detector's, as it always
        was: detect is asked first for it)."""
        from edgekit.runtime.tasks.detect import DETECTION_OP

        return DETECTION_OP not in model.custom_ops and is_classifier(model)

    @classmethod
    def sample_results(cls, model: Model, outputs: list[np.ndarray], settings: RunSettings) -> list[Classification]:
        """The top-k classes of one sample's (dequantized) first output."""
        scores = outputs[0][0]
        return [Classification(k, model.labels[k] if k < len(model.labels) else str(k), float(scores[k]))
                for k in top_indices(scores, settings.top_k)]

    def scores(self, image: np.ndarray) -> np.ndarray:
        """Dequantized scores of every class."""
        return self._dequantized(self.model.invoke_one(self.encode_image(image)))[0][0]

    def classify(self, image: np.ndarray, top_k: int = 1) -> list[Classification]:
        """The `top_k` best classes, best first (ties keep the lower index first)."""
        return self.classify_input(self.encode_image(image), top_k)

    def classify_input(self, x: np.ndarray, top_k: int = 1) -> list[Classification]:
        """`classify` for an input already made by `encode_image` (e.g. in a reader thread)."""
        if top_k < 1:
            raise UsageError(f"top-k must be at least 1, got {top_k}")
        return self.top(self.model.invoke_one(x)[0][0], top_k)

    def infer(self, frame: Frame, settings: RunSettings) -> list[Classification]:
        return self.classify_input(self.input_of(frame), settings.top_k)

    def rows(self, raw: np.ndarray, settings: RunSettings) -> list[list[Classification]]:
        return self.top_rows(raw, settings.top_k)

    def top_rows(self, raw: np.ndarray, top_k: int) -> list[list[Classification]]:
        """`top` for every row of a batch of raw first outputs; top-1 in one vectorised pass."""
        if top_k != 1:
            return [self.top(row, top_k) for row in raw]
        out = self.model.outputs[0]
        best = raw.argmax(axis=1)
        scores = raw[np.arange(len(raw)), best].astype(np.float64)
        if out.quantized:
            scores = (scores - out.zero_point) * out.scale
        label = self.label
        return [[Classification(i, label(i), s)] for i, s in zip(best.tolist(), scores.tolist())]

    def top(self, raw: np.ndarray, top_k: int) -> list[Classification]:
        """The `top_k` classes of one sample's raw (still quantized) first output. Ranked on the raw values:
        dequantization is monotonic (scale > 0)."""
        out = self.model.outputs[0]
        best = [int(raw.argmax())] if top_k == 1 else top_indices(raw, top_k)
        scale, zero = (out.scale, out.zero_point) if out.quantized else (1.0, 0)
        return [Classification(i, self.label(i), (float(raw[i]) - zero) * scale) for i in best]

    def stream(self, source: Source, *, top_k: int = 1, full_frames: bool = True) -> FrameStream:
        """(frame, top-k classes) for every frame of `source`, decoded, resized and classified on threads of
        their own (runtime/stream.py); the scores are read from the interpreter's output without a copy.
        `full_frames=False` when the loop does not use the frame's pixels: a Motion-JPEG video then decodes
        at the smallest of libjpeg-turbo's scales (1/8, 1/4, 3/8 ...) that covers the model's input."""
        if top_k < 1:
            raise UsageError(f"top-k must be at least 1, got {top_k}")
        own = self.model.runner
        view = own.view
        index = self.model.outputs[0].index

        def results(frame: Frame, interp) -> list[Classification]:
            raw = view(index)[0] if interp is own else interp.get(index)[0]
            return self.top(raw, top_k)  # plain numbers: nothing keeps the view alive past this call

        return self._stream(source, results, full_frames)

    def run_stream(self, source: Source, settings: RunSettings, full_frames: bool) -> FrameStream:
        return self.stream(source, top_k=settings.top_k, full_frames=full_frames)

    def draw(self, bgr: np.ndarray, results: list, scale: float) -> None:
        """The classes, one line each, top left."""
        import cv2

        for i, r in enumerate(results):
            cv2.putText(bgr, f"{r.label} {r.score:.2f}", (6, 20 + 20 * i), cv2.FONT_HERSHEY_SIMPLEX,
                        0.6, (0, 255, 0), 1, cv2.LINE_AA)


def top_indices(raw: np.ndarray, k: int) -> list[int]:
    """Indices of the `k` largest values, largest first, ties in index order (a stable sort's answer):
    argpartition finds the k-th value, then only the values at least that large are sorted."""
    n = raw.shape[0]
    if k < n:
        kth = raw[np.argpartition(raw, n - k)[n - k]]
        candidates = np.flatnonzero(raw >= kth)
        if len(candidates) >= k:  # else NaN scores: the full sort below ranks them last
            order = np.argsort(-raw[candidates].astype(np.float64), kind="stable")[:k]
            return candidates[order].tolist()
    return np.argsort(-np.asarray(raw, np.float64), kind="stable")[:k].tolist()
