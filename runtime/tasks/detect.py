"""The detect task: boxes, classes and scores, from the TFLite post-processing op or a raw YOLO or SSD head."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.decoders import Decoded, DecodeOptions, SsdDecoder, YoloDecoder, detect_layout, to_frame
from edgekit.runtime.metadata import read_custom_op_outputs
from edgekit.runtime.model import Model
from edgekit.runtime.stream import FrameStream
from edgekit.runtime.tasks.base import ImageTask, RunSettings

if TYPE_CHECKING:
    from edgekit.runtime.sources import Frame, Source

DETECTION_OP = "TFLite_Detection_PostProcess"


class Detection(NamedTuple):
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels of the original image
    index: int  # type: ignore[assignment]  # the class index, public API: it hides tuple.index, which none call
    label: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"box": [round(v, 2) for v in self.box], "index": self.index, "label": self.label,
                "score": self.score}

    def to_text(self) -> str:
        return f"{self.label} {self.score:.2f} at {[round(v, 2) for v in self.box]}"


def _raw_layout(model: Model) -> str | None:
    shape: tuple[int, ...] = model.inputs[0].shape if model.inputs else ()
    input_hw = (int(shape[1]), int(shape[2])) if len(shape) == 4 else None
    return detect_layout([o.shape for o in model.outputs], [o.name for o in model.outputs], model.labels, input_hw)


class Detector(ImageTask):
    """Boxes, classes and scores: read from a model ending in TFLite_Detection_PostProcess, or decoded from
    a raw YOLO or SSD head (runtime/decoders.py). `decode` is "postprocess", "yolo" or "ssd"; None picks
    it from the model (the op, else the output shapes). `anchors` (an (N, 4) array or .npy path) are for
    ssd; `options` (NMS IoU, background, ...) are for yolo and ssd: the op applies its own."""

    name = "detect"
    options = ("decode", "anchors", "iou", "background")
    chosen_by = ("decode",)
    _decoder: Callable[[Sequence[np.ndarray], float], Decoded]  # the op's outputs read, or a raw head decoded

    def __init__(self, model: Model | str, *, num_threads: int | Literal["auto"] | None = None,
                 decode: str | None = None, anchors: np.ndarray | str | Path | None = None,
                 options: DecodeOptions | None = None):
        super().__init__(model, num_threads=num_threads)
        outs = self.model.outputs
        shapes = [o.shape for o in outs]
        if decode is None:
            decode = "postprocess" if DETECTION_OP in self.model.custom_ops else _raw_layout(self.model)
            if decode is None:
                raise UsageError(f"cannot tell how to decode detections from outputs "
                                 f"{', '.join(str(list(s)) for s in shapes)}: set `decode=yolo` or `decode=ssd`")
        self.decode = decode
        if decode != "ssd" and anchors is not None:
            raise UsageError(f"is for `decode=ssd`, not {decode}", param="anchors")
        if decode == "postprocess":
            if DETECTION_OP not in self.model.custom_ops:
                raise InputShapeError(f"`decode=postprocess` needs a model ending in {DETECTION_OP}; this one has "
                                      f"outputs {', '.join(str(list(s)) for s in shapes)} and no such op")
            if options is not None:
                raise UsageError(f"the model's {DETECTION_OP} op applies its own score and NMS settings; "
                                 "`iou` and `background` are for `decode=yolo` or `decode=ssd`")
            self._order = self._output_order()
            self._decoder = self._postprocess
        elif decode == "yolo":
            self._decoder = YoloDecoder(shapes, input_hw=(self.spec.height, self.spec.width), labels=self.labels,
                                        options=options)
        elif decode == "ssd":
            self._decoder = SsdDecoder(shapes, anchors=anchors, names=[o.name for o in outs], labels=self.labels,
                                       options=options)
        else:
            raise UsageError(f"must be one of yolo, ssd, postprocess, got {decode!r}", param="decode")
        self.model.say_preprocessing(self.model.inputs[0])

    @classmethod
    def matches(cls, model: Model) -> bool:
        """Models ending in the detection post-processing op, or with a raw YOLO or SSD head
        (`decoders.detect_layout`)."""
        return DETECTION_OP in model.custom_ops or _raw_layout(model) is not None

    @classmethod
    def for_run(cls, model: Model, *, decode: str | None = None, anchors: str | Path | None = None,
                iou: float | None = None, background: bool | None = None) -> Detector:
        """`iou` and `background` left None keep the decoders' defaults."""
        options = None
        if iou is not None or background is not None:
            options = (DecodeOptions(background=background) if iou is None
                       else DecodeOptions(iou=iou, background=background))
        return cls(model, decode=decode, anchors=anchors, options=options)

    def _output_order(self) -> tuple[int, int, int, int]:
        """Indices of (boxes, classes, scores, count) among the model outputs.

        The op writes boxes, classes, scores, count in that order, but exporters rename and reorder
        the model outputs (TF2 Object Detection API models list scores, boxes, count, classes), so
        the outputs are matched to the op's own output tensors in the flatbuffer."""
        outs = self.model.outputs
        if len(outs) != 4:
            raise UsageError(f"a detection model has 4 outputs, this one has {len(outs)}")
        position = {o.index: i for i, o in enumerate(outs)}
        for op_outputs in read_custom_op_outputs(self.model.view, DETECTION_OP):
            if len(op_outputs) == 4 and all(t in position for t in op_outputs):
                b, c, s, n = (position[t] for t in op_outputs)
                return b, c, s, n
        # the op's outputs pass through other ops: tell them apart by shape, then by name
        boxes = [i for i, o in enumerate(outs) if len(o.shape) == 3 and o.shape[-1] == 4]
        count = [i for i, o in enumerate(outs) if len(o.shape) == 1]
        rest = [i for i in range(4) if i not in boxes + count]
        if len(boxes) != 1 or len(count) != 1 or len(rest) != 2:
            raise UsageError("cannot tell boxes, classes, scores and count apart in the outputs")
        # the op writes classes before scores; its outputs are named op, op:1, op:2, op:3
        rest.sort(key=lambda i: outs[i].tensor_name.rsplit(":", 1)[-1] if ":" in outs[i].tensor_name else "0")
        return boxes[0], rest[0], rest[1], count[0]

    def _postprocess(self, outs: Sequence[np.ndarray], threshold: float) -> Decoded:
        """The op's detections scoring at least `threshold`, best first."""
        b, c, s, n = self._order
        boxes, classes, scores = outs[b][0], outs[c][0], outs[s][0]
        count = int(min(round(float(outs[n].reshape(-1)[0])), len(scores)))
        boxes, classes, scores = boxes[:count], classes[:count], scores[:count]
        hit = np.flatnonzero(scores >= threshold)
        hit = hit[np.argsort(-scores[hit], kind="stable")]
        return Decoded(boxes[hit], np.rint(classes[hit]).astype(np.int64), scores[hit].astype(np.float64))

    def detect(self, image: np.ndarray, threshold: float = 0.5) -> list[Detection]:
        """Detections scoring at least `threshold`, best first, boxes in pixels of `image`."""
        return self.detect_input(self.encode_image(image), image.shape[:2], threshold)

    def detect_input(self, x: np.ndarray, image_size: tuple[int, int], threshold: float = 0.5) -> list[Detection]:
        """`detect` for an input already made by `encode_image`; `image_size` is the frame's (h, w)."""
        return self.detect_outputs(self.model.invoke_one(x), image_size, threshold)

    def infer(self, frame: Frame, settings: RunSettings) -> list[Detection]:
        return self.detect_input(self.input_of(frame), frame.image.shape[:2], settings.threshold)

    def stream(self, source: Source, *, threshold: float = 0.5, full_frames: bool = True) -> FrameStream:
        """(frame, detections) for every frame of `source`, on threads of their own (runtime/stream.py).
        `full_frames=False`: see Classifier.stream; the boxes are still in pixels of the whole frame
        (`frame.whole_size`), as with full frames, not of the smaller image decoded."""
        return self._stream(source, lambda frame, interp: self.detect_outputs(
            self._outputs(interp), frame.image.shape[:2], threshold, frame.size), full_frames)

    def run_stream(self, source: Source, settings: RunSettings, full_frames: bool) -> FrameStream:
        return self.stream(source, threshold=settings.threshold, full_frames=full_frames)  # whole-frame pixels

    def detect_outputs(self, raw: list[np.ndarray], image_size: tuple[int, int], threshold: float,
                       whole_size: tuple[int, int] | None = None) -> list[Detection]:
        """Detections from the raw outputs of one frame of size `image_size` (h, w); boxes in pixels of
        `whole_size` when that image was the frame decoded scaled down."""
        found = self._decoder(self._dequantized(raw), threshold)
        boxes = to_frame(found.boxes, self.spec, image_size)
        if whole_size is not None and tuple(whole_size) != tuple(image_size):  # the resize undone, then the scale
            (h, w), (wh, ww) = image_size, whole_size
            boxes = boxes * np.array([ww / w, wh / h, ww / w, wh / h])
        label = self.label
        return [Detection(tuple(box), k, label(k), score)
                for box, k, score in zip(boxes.tolist(), found.classes.tolist(), found.scores.tolist())]

    def draw(self, bgr: np.ndarray, results: list, scale: float) -> None:
        """Each box with its label and score."""
        import cv2

        for r in results:
            x0, y0, x1, y1 = (int(round(v * scale)) for v in r.box)
            cv2.rectangle(bgr, (x0, y0), (x1, y1), (0, 255, 0), 2)
            cv2.putText(bgr, f"{r.label} {r.score:.2f}", (x0, max(12, y0 - 4)),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 255, 0), 1, cv2.LINE_AA)
