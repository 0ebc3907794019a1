"""Tasks on top of `Model`: image classification, detection, and raw outputs.

Each task takes a decoded image (HxW gray or HxWx3 RGB uint8), applies the model's stored
preprocessing and returns plain results. `task_for(model)` picks the task a model was built for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.decoders import Decoded, DecodeOptions, SsdDecoder, YoloDecoder, detect_layout, to_frame
from edgekit.runtime.metadata import read_custom_op_outputs
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import InputEncoder, PreprocessSpec
from edgekit.runtime.quant import dequantize
from edgekit.runtime.sources import Frame, Source
from edgekit.runtime.stream import FrameStream, auto_threads

DETECTION_OP = "TFLite_Detection_PostProcess"
TASKS = ("classify", "detect", "raw")


class Classification(NamedTuple):
    index: int
    label: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class Detection(NamedTuple):
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels of the original image
    index: int
    label: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"box": [round(v, 2) for v in self.box], "index": self.index, "label": self.label,
                "score": self.score}


def task_for(model: Model) -> str:
    """"detect" for models ending in the detection post-processing op or with a raw YOLO or SSD head
    (`decoders.detect_layout`), "classify" for one (1, K) output, "raw" otherwise."""
    if DETECTION_OP in model.custom_ops:
        return "detect"
    if len(model.outputs) == 1 and len(model.outputs[0].shape) == 2 and model.outputs[0].shape[1] > 1:
        return "classify"
    if _raw_layout(model) is not None:
        return "detect"
    return "raw"


def _raw_layout(model: Model) -> str | None:
    shape = model.inputs[0].shape if model.inputs else ()
    input_hw = (int(shape[1]), int(shape[2])) if len(shape) == 4 else None
    return detect_layout([o.shape for o in model.outputs], [o.name for o in model.outputs], model.labels, input_hw)


def _as_model(model: Model | str, num_threads: int | str | None) -> Model:
    """`num_threads="auto"`: every core but one, which decodes frames (`stream.auto_threads`)."""
    if isinstance(model, Model):
        return model
    return Model(model, num_threads=auto_threads() if num_threads == "auto" else num_threads)


class _ImageTask:
    def __init__(self, model: Model | str, *, num_threads: int | str | None = None):
        self.model = _as_model(model, num_threads)
        if len(self.model.inputs) != 1:
            raise UsageError(f"image tasks need a model with one input, this one has {len(self.model.inputs)}")
        self.spec: PreprocessSpec = self.model.preprocessing_of(self.model.inputs[0])[0]  # said after the checks
        self.encode = InputEncoder(self.spec, self.model.inputs[0])
        self.labels = self.model.labels

    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    def encode_image(self, image: np.ndarray) -> np.ndarray:
        """An HxW or HxWx3 uint8 image -> this model's typed input batch of one."""
        if image.ndim not in (2, 3):
            raise InputShapeError(f"expected an HxW or HxWx3 image, got shape {image.shape}")
        return self.encode(image)

    def _dequantized(self, raw: list[np.ndarray]) -> list[np.ndarray]:
        return [dequantize(r, o) for r, o in zip(raw, self.model.outputs)]

    def _stream(self, source: Source, results: Callable[[Frame, Any], list], full_frames: bool = True) -> FrameStream:
        return FrameStream(self, source, lambda task, frame, interp: results(frame, interp), full_frames=full_frames)

    def _outputs(self, interp) -> list[np.ndarray]:
        """Copies of the raw outputs just computed (call with the model's lock held)."""
        return [interp.get_tensor(o.index) for o in self.model.outputs]


class Classifier(_ImageTask):
    """Top-k classes of an image, with the labels stored in the model."""

    def __init__(self, model: Model | str, *, num_threads: int | str | None = None):
        super().__init__(model, num_threads=num_threads)
        if task_for(self.model) != "classify":
            raise UsageError(f"model output {self.model.outputs[0].shape} is not a (1, classes) classifier")
        self.model.say_preprocessing(self.model.inputs[0])

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
        own, view = self.model.interpreter, self.model.interpreter.tensor(self.model.outputs[0].index)
        index = self.model.outputs[0].index

        def results(frame: Frame, interp) -> list[Classification]:
            raw = view()[0] if interp is own else interp.get_tensor(index)[0]
            return self.top(raw, top_k)  # plain numbers: nothing keeps the view alive past this call

        return self._stream(source, results, full_frames)


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


class Detector(_ImageTask):
    """Boxes, classes and scores: read from a model ending in TFLite_Detection_PostProcess, or decoded from
    a raw YOLO or SSD head (runtime/decoders.py). `decode` is "postprocess", "yolo" or "ssd"; None picks
    it from the model (the op, else the output shapes). `anchors` (an (N, 4) array or .npy path) are for
    ssd; `options` (NMS IoU, background, ...) are for yolo and ssd: the op applies its own."""

    def __init__(self, model: Model | str, *, num_threads: int | str | None = None, decode: str | None = None,
                 anchors: np.ndarray | str | Path | None = None, options: DecodeOptions | None = None):
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

    def _postprocess(self, outs: list[np.ndarray], threshold: float) -> Decoded:
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

    def stream(self, source: Source, *, threshold: float = 0.5, full_frames: bool = True) -> FrameStream:
        """(frame, detections) for every frame of `source`, on threads of their own (runtime/stream.py).
        `full_frames=False`: see Classifier.stream; the boxes are still in pixels of the whole frame
        (`frame.whole_size`), as with full frames, not of the smaller image decoded."""
        return self._stream(source, lambda frame, interp: self.detect_outputs(
            self._outputs(interp), frame.image.shape[:2], threshold, frame.size), full_frames)

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


class RawTask(_ImageTask):
    """All outputs, dequantized, for models that are neither classifiers nor detectors."""

    def __init__(self, model: Model | str, *, num_threads: int | str | None = None):
        super().__init__(model, num_threads=num_threads)
        self.model.say_preprocessing(self.model.inputs[0])

    def run(self, image: np.ndarray) -> list[np.ndarray]:
        return self.run_input(self.encode_image(image))

    def run_input(self, x: np.ndarray) -> list[np.ndarray]:
        return self._dequantized(self.model.invoke_one(x))

    def stream(self, source: Source, *, full_frames: bool = True) -> FrameStream:
        """(frame, dequantized outputs) for every frame of `source`, on threads of their own (`full_frames`:
        see Classifier.stream)."""
        return self._stream(source, lambda frame, interp: self._dequantized(self._outputs(interp)), full_frames)
