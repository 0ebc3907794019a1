"""Tasks on top of `Model`: image classification, SSD-style detection, and raw outputs.

Each task takes a decoded image (HxW gray or HxWx3 RGB uint8), applies the model's stored
preprocessing and returns plain results. `task_for(model)` picks the task a model was built for.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.metadata import read_custom_op_outputs
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import InputEncoder, PreprocessSpec, crop_box
from edgekit.runtime.quant import dequantize

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
    """"detect" for models ending in the detection post-processing op, "classify" for one
    (1, K) output, "raw" otherwise."""
    if DETECTION_OP in model.custom_ops:
        return "detect"
    if len(model.outputs) == 1 and len(model.outputs[0].shape) == 2 and model.outputs[0].shape[1] > 1:
        return "classify"
    return "raw"


def _as_model(model: Model | str, num_threads: int | None) -> Model:
    return model if isinstance(model, Model) else Model(model, num_threads=num_threads)


class _ImageTask:
    def __init__(self, model: Model | str, *, num_threads: int | None = None):
        self.model = _as_model(model, num_threads)
        if len(self.model.inputs) != 1:
            raise UsageError(f"image tasks need a model with one input, this one has {len(self.model.inputs)}")
        self.spec: PreprocessSpec = self.model.preprocess
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


class Classifier(_ImageTask):
    """Top-k classes of an image, with the labels stored in the model."""

    def __init__(self, model: Model | str, *, num_threads: int | None = None):
        super().__init__(model, num_threads=num_threads)
        if task_for(self.model) != "classify":
            raise UsageError(f"model output {self.model.outputs[0].shape} is not a (1, classes) classifier")

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
        """The `top_k` classes of one sample's raw (still quantized) first output."""
        out = self.model.outputs[0]
        if top_k == 1:  # argmax of the raw output: dequantization is monotonic (scale > 0)
            i = int(raw.argmax())
            score = float(raw[i])
            if out.quantized:
                score = (score - out.zero_point) * out.scale
            return [Classification(i, self.label(i), score)]
        scores = dequantize(raw, out)
        k = min(top_k, len(scores))
        best = np.argsort(-scores, kind="stable")[:k]
        return [Classification(int(i), self.label(int(i)), float(scores[i])) for i in best]


class Detector(_ImageTask):
    """Boxes, classes and scores from a model ending in TFLite_Detection_PostProcess."""

    def __init__(self, model: Model | str, *, num_threads: int | None = None):
        super().__init__(model, num_threads=num_threads)
        if task_for(self.model) != "detect":
            raise UsageError("model does not end in the TFLite_Detection_PostProcess op")
        self._order = self._output_order()

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
        rest.sort(key=lambda i: outs[i].name.rsplit(":", 1)[-1] if ":" in outs[i].name else "0")
        return boxes[0], rest[0], rest[1], count[0]

    def _to_image(self, box: np.ndarray, h: int, w: int) -> tuple[float, float, float, float]:
        """Normalised (ymin, xmin, ymax, xmax) of the model input -> pixel (x0, y0, x1, y1)."""
        ymin, xmin, ymax, xmax = (float(v) for v in box)
        H, W = self.spec.height, self.spec.width
        if self.spec.resize == "stretch":
            sx, sy, ox, oy = w, h, 0.0, 0.0
        elif self.spec.resize == "letterbox":
            s = min(H / h, W / w)
            sx, sy = W / s, H / s
            ox = -((W - max(1, round(w * s))) // 2) / s
            oy = -((H - max(1, round(h * s))) // 2) / s
        else:
            y0, y1, x0, x1 = crop_box(h, w, H, W)
            sx, sy, ox, oy = x1 - x0, y1 - y0, float(x0), float(y0)
        clip = lambda v, hi: min(max(v, 0.0), float(hi))
        return (clip(xmin * sx + ox, w), clip(ymin * sy + oy, h), clip(xmax * sx + ox, w), clip(ymax * sy + oy, h))

    def detect(self, image: np.ndarray, threshold: float = 0.5) -> list[Detection]:
        """Detections scoring at least `threshold`, best first, boxes in pixels of `image`."""
        return self.detect_input(self.encode_image(image), image.shape[:2], threshold)

    def detect_input(self, x: np.ndarray, image_size: tuple[int, int], threshold: float = 0.5) -> list[Detection]:
        """`detect` for an input already made by `encode_image`; `image_size` is the frame's (h, w)."""
        outs = self._dequantized(self.model.invoke_one(x))
        b, c, s, n = self._order
        boxes, classes, scores = outs[b][0], outs[c][0], outs[s][0]
        count = int(min(round(float(outs[n].reshape(-1)[0])), len(scores)))
        h, w = image_size
        found = []
        for i in range(count):
            if scores[i] >= threshold:
                k = int(round(float(classes[i])))
                found.append(Detection(self._to_image(boxes[i], h, w), k, self.label(k), float(scores[i])))
        return sorted(found, key=lambda d: -d.score)


class RawTask(_ImageTask):
    """All outputs, dequantized, for models that are neither classifiers nor detectors."""

    def run(self, image: np.ndarray) -> list[np.ndarray]:
        return self.run_input(self.encode_image(image))

    def run_input(self, x: np.ndarray) -> list[np.ndarray]:
        return self._dequantized(self.model.invoke_one(x))
