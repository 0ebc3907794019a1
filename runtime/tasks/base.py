"""What `edgekit run` needs of any task (the `Task` interface), and `ImageTask`, the base of the image tasks.

A task is chosen for a model (`matches`), built with its own run options (`for_run`), infers one frame
(`infer`), a stream (`run_stream`) and, where it `batches`, rows of one batched invoke (`rows`); its results
render to JSON (`to_dict`) and text (`to_text`), and it draws them on a frame (`draw`). `edgekit.run` reads
only this surface, so a new task is one class plus its line in `edgekit.runtime.tasks.TASKS`: an `ImageTask`
with a `name`, `results` (one frame's results from its raw outputs) and, to be picked without `task=`,
`matches`; `draw` to be drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import InputEncoder, PreprocessSpec
from edgekit.runtime.quant import dequantize
from edgekit.runtime.stream import FrameStream, auto_threads

if TYPE_CHECKING:
    from edgekit.runtime.sources import Frame, Source

ANNOTATE_MIN_SIDE = 256  # drawn frames are enlarged until their short side is at least this


@dataclass(frozen=True)
class RunSettings:
    """Per-run numbers a task may read: top-k classes (classify), the minimum detection score (detect)."""

    top_k: int = 1
    threshold: float = 0.5


class Result(Protocol):
    """One result of a frame: a JSON object (`edgekit run --json`) and a text line's part."""

    def to_dict(self) -> dict[str, Any]: ...

    def to_text(self) -> str: ...


class Task(Protocol):
    """What `edgekit run` needs of a task; `ImageTask` gives the defaults."""

    name: ClassVar[str]  # its `task=` name, as in TASKS
    options: ClassVar[tuple[str, ...]]  # run options only this task takes (detect: decode, anchors, iou, ...)
    chosen_by: ClassVar[tuple[str, ...]]  # of those, the ones that pick this task when no task is named
    batches: ClassVar[bool]  # image files may go several per invoke (`rows`)
    samples: ClassVar[bool]  # runs .npy/.npz samples (`sample_results`), where there is no image
    model: Model
    spec: PreprocessSpec

    @classmethod
    def matches(cls, model: Model) -> bool: ...

    @classmethod
    def for_run(cls, model: Model, **options: Any) -> Task: ...

    @classmethod
    def sample_results(cls, model: Model, outputs: list[np.ndarray], settings: RunSettings) -> list: ...

    def encode_image(self, image: np.ndarray) -> np.ndarray: ...

    def infer(self, frame: Frame, settings: RunSettings) -> list: ...

    def run_stream(self, source: Source, settings: RunSettings, full_frames: bool) -> FrameStream: ...

    def present(self, results: Any) -> list: ...

    def rows(self, raw: np.ndarray, settings: RunSettings) -> list[list]: ...

    def annotate(self, image: np.ndarray, results: list) -> np.ndarray: ...


def _as_model(model: Model | str, num_threads: int | Literal["auto"] | None) -> Model:
    """`num_threads="auto"`: every core but one, which decodes frames (`stream.auto_threads`)."""
    if isinstance(model, Model):
        return model
    return Model(model, num_threads=auto_threads() if num_threads == "auto" else num_threads)


class ImageTask:
    """A task on one image input with the model's stored preprocessing; the defaults of `Task`."""

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    chosen_by: ClassVar[tuple[str, ...]] = ()
    batches: ClassVar[bool] = False
    samples: ClassVar[bool] = False

    def __init__(self, model: Model | str, *, num_threads: int | Literal["auto"] | None = None):
        self.model = _as_model(model, num_threads)
        if len(self.model.inputs) != 1:
            raise UsageError(f"image tasks need a model with one input, this one has {len(self.model.inputs)}")
        self.spec: PreprocessSpec = self.model.preprocessing_of(self.model.inputs[0])[0]  # said after the checks
        self.encode = InputEncoder(self.spec, self.model.inputs[0])
        self.labels = self.model.labels

    # -- choosing and building -------------------------------------------------------------------------
    @classmethod
    def matches(cls, model: Model) -> bool:
        """Whether a model was built for this task (`task_for` asks every task in TASKS' order)."""
        return False

    @classmethod
    def for_run(cls, model: Model, *args: Any, **options: Any) -> ImageTask:
        """The task `edgekit run` uses; `options` are this class's `options`, None where not given (typed
        `*args: Any, **options: Any`, the signature any override may narrow: each task has its own)."""
        return cls(model, *args, **options)

    @classmethod
    def sample_results(cls, model: Model, outputs: list[np.ndarray], settings: RunSettings) -> list:
        """Results of one sample's (dequantized) outputs (`samples` tasks only)."""
        raise NotImplementedError(f"{cls.__name__} runs no array samples")

    # -- inference ---------------------------------------------------------------------------------------
    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    def encode_image(self, image: np.ndarray) -> np.ndarray:
        """An HxW or HxWx3 uint8 image -> this model's typed input batch of one."""
        if image.ndim not in (2, 3):
            raise InputShapeError(f"expected an HxW or HxWx3 image, got shape {image.shape}")
        return self.encode(image)

    def input_of(self, frame: Frame) -> np.ndarray:
        """The frame's model input: `frame.input` when the source already encoded it."""
        return frame.input if frame.input is not None else self.encode_image(frame.image)

    def results(self, raw: list[np.ndarray], frame: Frame, settings: RunSettings) -> list:
        """One frame's results from its raw (still quantized) outputs: all a new task must write to run
        (`infer` and `run_stream` call it)."""
        raise NotImplementedError(f"{type(self).__name__} defines neither `results` nor `infer`")

    def infer(self, frame: Frame, settings: RunSettings) -> list:
        """One frame's results."""
        return self.results(self.model.invoke_one(self.input_of(frame)), frame, settings)

    def run_stream(self, source: Source, settings: RunSettings, full_frames: bool) -> FrameStream:
        """(frame, results) for every frame of `source` on threads of their own; `present` finishes them."""
        return self._stream(source, lambda frame, interp: self.results(self._outputs(interp), frame, settings),
                            full_frames)

    def present(self, results: Any) -> list:
        """A stream's results as `edgekit run` hands them on (the caller's thread)."""
        return results

    def rows(self, raw: np.ndarray, settings: RunSettings) -> list[list]:
        """Each row's results from the first output of one batched invoke (`batches` tasks only)."""
        raise NotImplementedError(f"{type(self).__name__} does not batch")

    def _dequantized(self, raw: list[np.ndarray]) -> list[np.ndarray]:
        return [dequantize(r, o) for r, o in zip(raw, self.model.outputs)]

    def _stream(self, source: Source, results: Callable[[Frame, Any], list], full_frames: bool = True) -> FrameStream:
        return FrameStream(self, source, lambda task, frame, interp: results(frame, interp), full_frames=full_frames)

    def _outputs(self, interp) -> list[np.ndarray]:
        """Copies of the raw outputs just computed (call with the model's lock held)."""
        return [interp.get(o.index) for o in self.model.outputs]

    # -- drawing -------------------------------------------------------------------------------------------
    def annotate(self, image: np.ndarray, results: list) -> np.ndarray:
        """A BGR copy of the frame with the results drawn on it (small frames are enlarged first)."""
        import cv2

        bgr = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR if image.ndim == 2 else cv2.COLOR_RGB2BGR)
        h, w = bgr.shape[:2]
        scale = max(1.0, ANNOTATE_MIN_SIDE / max(1, min(h, w)))
        if scale > 1:
            bgr = cv2.resize(bgr, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_NEAREST)
        self.draw(bgr, results, scale)
        return bgr

    def draw(self, bgr: np.ndarray, results: list, scale: float) -> None:
        """Draw `results` on `bgr` in place; `scale` is how much the frame was enlarged. Default: nothing."""
