"""The raw task: every output, dequantized, for models that are neither classifiers nor detectors."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from edgekit.runtime.model import Model
from edgekit.runtime.stream import FrameStream
from edgekit.runtime.tasks.base import ImageTask, RunSettings

if TYPE_CHECKING:
    from edgekit.runtime.sources import Frame, Source


class RawResult(NamedTuple):
    output: int
    shape: list[int]
    values: list[float]  # the first 16 values, for a log line
    name: str = ""  # the output's name (Keras output / signature key)

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    def to_text(self) -> str:
        """Its values when it has at most 4 (a value, a small score vector), else its shape."""
        name = self.name or f"output {self.output}"
        if math.prod(self.shape) <= 4:
            return f"{name} " + " ".join(f"{v:.4g}" for v in self.values)
        return f"{name} {self.shape}"


def raw_results(outputs: list[np.ndarray], names: list[str]) -> list[RawResult]:
    """One RawResult per output: its shape and first 16 values."""
    return [RawResult(i, list(o.shape), o.reshape(-1)[:16].round(6).tolist(), names[i]) for i, o in enumerate(outputs)]


class RawTask(ImageTask):
    """All outputs, dequantized, for models that are neither classifiers nor detectors."""

    name = "raw"
    samples = True

    def __init__(self, model: Model | str, *, num_threads: int | Literal["auto"] | None = None):
        super().__init__(model, num_threads=num_threads)
        self.model.say_preprocessing(self.model.inputs[0])

    @classmethod
    def matches(cls, model: Model) -> bool:
        """Any model: the task of last resort."""
        return True

    @classmethod
    def sample_results(cls, model: Model, outputs: list[np.ndarray], settings: RunSettings) -> list[RawResult]:
        return raw_results(outputs, [o.name for o in model.outputs])

    def run(self, image: np.ndarray) -> list[np.ndarray]:
        return self.run_input(self.encode_image(image))

    def run_input(self, x: np.ndarray) -> list[np.ndarray]:
        return self._dequantized(self.model.invoke_one(x))

    def infer(self, frame: Frame, settings: RunSettings) -> list[RawResult]:
        return self.present(self.run_input(self.input_of(frame)))

    def present(self, results: Any) -> list[RawResult]:
        """RawResult rows of the dequantized outputs."""
        return raw_results(results, [o.name for o in self.model.outputs])

    def stream(self, source: Source, *, full_frames: bool = True) -> FrameStream:
        """(frame, dequantized outputs) for every frame of `source`, on threads of their own (`full_frames`:
        see Classifier.stream)."""
        return self._stream(source, lambda frame, interp: self._dequantized(self._outputs(interp)), full_frames)

    def run_stream(self, source: Source, settings: RunSettings, full_frames: bool) -> FrameStream:
        return self.stream(source, full_frames=full_frames)
