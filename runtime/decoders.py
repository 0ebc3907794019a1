"""Raw detection heads -> boxes, classes and scores; and the one mapping of boxes back to the frame.

Two layouts besides models that end in TFLite_Detection_PostProcess (tasks.Detector reads those):

- `yolo`: Ultralytics YOLOv8/v11 exports, one output `[1, 4 + C, N]` (their default) or `[1, N, 4 + C]`;
  each of the N rows is centre-x, centre-y, width, height, then C class scores (already sigmoid, no
  objectness). Ultralytics' TFLite export divides the boxes by the input size (`Detect._inference`: "norm"
  for tflite/edgetpu), other routes (ONNX -> onnx2tf, SavedModel) keep pixels of the model input. Box units
  are read from the values by default: every x, y, w, h <= 1.5 -> normalised, else pixels.
- `ssd`: TF Object Detection API heads before post-processing: box encodings `[1, N, 4]` (ty, tx, th, tw
  against anchors given as (ycenter, xcenter, h, w), normalised, box-coder scales 10, 10, 5, 5 as in
  TFLite_Detection_PostProcess) and class scores `[1, N, C]` (probabilities, or logits -> sigmoid; read
  from their range by default); class 0 is background when asked or when C == number of labels + 1.

Both keep each box's best class, drop those under the score threshold, and run class-wise NMS (OpenCV's
`cv2.dnn.NMSBoxesBatched`, or the numpy fallback below). numpy only; never TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.arrays import load_arrays
from edgekit.runtime.preprocess import PreprocessSpec, crop_box

DECODERS = ("yolo", "ssd", "postprocess")
SSD_SCALES = (10.0, 10.0, 5.0, 5.0)  # y, x, h, w: the TF Object Detection API box coder's defaults
YOLO_STRIDES = (8, 16, 32)  # the P3-P5 heads of YOLOv8/v11: N = sum (H / s) * (W / s)
NORMALISED_MAX = 1.5  # YOLO boxes whose values all stay under this are fractions of the input size
BOX_UNITS = ("auto", "normalized", "pixels")
SCORE_KINDS = ("auto", "probabilities", "logits")


@dataclass(frozen=True)
class DecodeOptions:
    """How raw heads are decoded; checked on construction."""

    iou: float = 0.45  # NMS: a box overlapping a better one of its class by more than this is dropped
    max_detections: int = 100
    background: bool | None = None  # ssd: class 0 is background; None: when C == len(labels) + 1
    box_units: str = "auto"  # yolo: "normalized" (fractions of the input), "pixels" (of the input), "auto"
    scores: str = "auto"  # ssd: "probabilities", "logits" (sigmoid applied here) or "auto" (from the range)
    scales: tuple[float, float, float, float] = SSD_SCALES

    def __post_init__(self) -> None:
        if not 0.0 <= self.iou <= 1.0:
            raise UsageError(f"must be in [0, 1], got {self.iou}", param="iou")
        if self.max_detections < 1:
            raise UsageError(f"max detections must be at least 1, got {self.max_detections}")
        if self.box_units not in BOX_UNITS:
            raise UsageError(f"box units must be one of {', '.join(BOX_UNITS)}, got {self.box_units!r}")
        if self.scores not in SCORE_KINDS:
            raise UsageError(f"scores must be one of {', '.join(SCORE_KINDS)}, got {self.scores!r}")
        if len(self.scales) != 4 or not all(s > 0 for s in self.scales):
            raise UsageError(f"box-coder scales must be 4 positive numbers, got {self.scales}")


class Decoded(NamedTuple):
    boxes: np.ndarray  # (K, 4) ymin, xmin, ymax, xmax as fractions of the model input
    classes: np.ndarray  # (K,) int
    scores: np.ndarray  # (K,) float, best first


# -- boxes back to the frame ------------------------------------------------------------------------
def to_frame(boxes: np.ndarray, spec: PreprocessSpec, image_size: tuple[int, int]) -> np.ndarray:
    """Normalised (ymin, xmin, ymax, xmax) of the model input -> (K, 4) pixel (x0, y0, x1, y1) of the
    h x w frame it was made from, undoing the stored resize (stretch, letterbox or crop); clipped."""
    h, w = image_size
    H, W = spec.height, spec.width
    sx: float
    sy: float
    if spec.resize == "stretch":
        sx, sy, ox, oy = w, h, 0.0, 0.0
    elif spec.resize == "letterbox":
        s = min(H / h, W / w)
        sx, sy = W / s, H / s
        ox = -((W - max(1, round(w * s))) // 2) / s
        oy = -((H - max(1, round(h * s))) // 2) / s
    else:
        y0, y1, x0, x1 = crop_box(h, w, H, W)
        sx, sy, ox, oy = x1 - x0, y1 - y0, float(x0), float(y0)
    xyxy = np.asarray(boxes, np.float64).reshape(-1, 4)[:, [1, 0, 3, 2]]
    out = xyxy * np.array([sx, sy, sx, sy]) + np.array([ox, oy, ox, oy])
    return np.clip(out, 0.0, np.array([w, h, w, h], np.float64))


# -- NMS -----------------------------------------------------------------------------------------------
def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float, limit: int) -> np.ndarray:
    """Indices of the boxes kept by class-wise NMS, best first, at most `limit`. `boxes` are (K, 4)
    (ymin, xmin, ymax, xmax); a box is dropped when its IoU with a better box of the same class is above
    `iou`. Scores must be above 0 (OpenCV's rule; the decoders drop the others first)."""
    if len(scores) == 0:
        return np.zeros(0, np.int64)
    try:
        import cv2

        batched = cv2.dnn.NMSBoxesBatched
    except (ImportError, AttributeError):  # OpenCV before 4.7
        return nms_numpy(boxes, scores, classes, iou, limit)
    xywh = np.stack([boxes[:, 1], boxes[:, 0], boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]], axis=1)
    # OpenCV's stubs ask for Sequences; its bindings take these arrays (as they always did)
    boxes64, scores32, classes32 = xywh.astype(np.float64), scores.astype(np.float32), classes.astype(np.int32)
    keep = batched(boxes64, scores32, classes32, 0.0, float(iou))  # type: ignore[arg-type]
    return np.asarray(keep, np.int64).reshape(-1)[:limit]


def nms_numpy(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float, limit: int) -> np.ndarray:
    """`nms` without OpenCV: the same rule (greedy, stable by score, per class)."""
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] > 0]
    b = boxes.astype(np.float64)
    area = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    keep: list[int] = []
    while len(order) and len(keep) < limit:
        i, rest = order[0], order[1:]
        keep.append(int(i))
        top = np.maximum(b[i, :2], b[rest, :2])
        bottom = np.minimum(b[i, 2:], b[rest, 2:])
        inter = np.prod(np.clip(bottom - top, 0, None), axis=1)
        union = area[i] + area[rest] - inter
        overlap = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[(overlap <= iou) | (classes[rest] != classes[i])]
    return np.asarray(keep, np.int64)


def _best(boxes: np.ndarray, scores: np.ndarray, threshold: float, options: DecodeOptions) -> Decoded:
    """Each box's best class, the threshold, then class-wise NMS."""
    if not len(scores):
        return Decoded(np.zeros((0, 4)), np.zeros(0, np.int64), np.zeros(0))
    classes = scores.argmax(axis=1)
    best = scores[np.arange(len(scores)), classes]
    hit = (best >= threshold) & (best > 0)
    boxes, classes, best = boxes[hit], classes[hit], best[hit]
    keep = nms(boxes, best, classes, options.iou, options.max_detections)
    return Decoded(boxes[keep], classes[keep], best[keep].astype(np.float64))


def _shapes(shapes: Sequence[Sequence[int]]) -> str:
    return ", ".join(str(list(s)) for s in shapes)


# -- layouts ---------------------------------------------------------------------------------------------
def yolo_anchor_count(input_hw: tuple[int, int], strides: Sequence[int] = YOLO_STRIDES) -> int:
    """N of a YOLOv8/v11 head on an H x W input: one row per cell of every stride's grid."""
    h, w = input_hw
    return sum(-(-h // s) * -(-w // s) for s in strides)


def yolo_channel_axis(shape: Sequence[int], labels: Sequence[str] = ()) -> int | None:
    """Axis (1 or 2) holding the 4 + C values of a `[1, 4 + C, N]` / `[1, N, 4 + C]` output, or None
    when the shape cannot be one: 4 + len(labels) when that matches one axis, else the smaller axis
    (C is almost always far below N), else axis 1 (Ultralytics' own layout) when both are equal."""
    if len(shape) != 3 or shape[0] != 1:
        return None
    if labels:
        matches = [a for a in (1, 2) if shape[a] == 4 + len(labels)]
        if len(matches) == 1:
            return matches[0]
    axis = 1 if shape[1] <= shape[2] else 2
    return axis if shape[axis] >= 5 else None


def ssd_roles(shapes: Sequence[Sequence[int]], names: Sequence[str] = ()) -> tuple[int, int] | None:
    """(boxes, scores) positions of an SSD head, two outputs `[1, N, 4]` and `[1, N, C]`, or None.
    When both end in 4 the one named like boxes ("box", "loc", "enc") is the boxes, else the first."""
    if len(shapes) != 2 or any(len(s) != 3 or s[0] != 1 for s in shapes) or shapes[0][1] != shapes[1][1]:
        return None
    fours = [i for i in (0, 1) if shapes[i][2] == 4]
    if not fours:
        return None
    if len(fours) == 2:
        named = [i for i in (0, 1) if i < len(names) and any(k in names[i].lower() for k in ("box", "loc", "enc"))]
        boxes = named[0] if len(named) == 1 else 0
    else:
        boxes = fours[0]
    return boxes, 1 - boxes


def detect_layout(shapes: Sequence[Sequence[int]], names: Sequence[str] = (), labels: Sequence[str] = (),
                  input_hw: tuple[int, int] | None = None) -> str | None:
    """"yolo" or "ssd" when the output shapes alone say so, else None (then `--decode` must).

    yolo: one output `[1, a, b]` where 4 + len(labels) is a or b, or (without labels) the larger of a, b
    is the YOLOv8/v11 anchor count of the input size. ssd: two outputs `[1, N, 4]` and `[1, N, C]`."""
    if len(shapes) == 1:
        shape = shapes[0]
        axis = yolo_channel_axis(shape, labels)
        if axis is None or shape[1] == shape[2]:
            return None
        if labels and shape[axis] == 4 + len(labels):
            return "yolo"
        if input_hw is not None and shape[3 - axis] == yolo_anchor_count(input_hw):
            return "yolo"
        return None
    return "ssd" if ssd_roles(shapes, names) is not None else None


# -- decoders -------------------------------------------------------------------------------------------
class YoloDecoder:
    """Ultralytics YOLOv8/v11 `[1, 4 + C, N]` or `[1, N, 4 + C]` -> detections."""

    def __init__(self, shapes: Sequence[Sequence[int]], *, input_hw: tuple[int, int], labels: Sequence[str] = (),
                 options: DecodeOptions | None = None):
        self.options = options or DecodeOptions()
        if self.options.background is not None:
            raise UsageError("is for `decode=ssd`; YOLO heads have no background class", param="background")
        axis = yolo_channel_axis(shapes[0], labels) if len(shapes) == 1 else None
        if axis is None:
            raise InputShapeError(f"`decode=yolo` needs one output [1, 4 + classes, N] or [1, N, 4 + classes]; "
                                  f"this model has {_shapes(shapes)}")
        self.axis = axis
        self.input_hw = input_hw

    def __call__(self, outputs: Sequence[np.ndarray], threshold: float) -> Decoded:
        rows = outputs[0][0]
        rows = rows.T if self.axis == 1 else rows  # (N, 4 + C)
        xywh, scores = rows[:, :4].astype(np.float64), rows[:, 4:]
        units = self.options.box_units
        if units == "auto":
            units = "normalized" if not len(xywh) or np.abs(xywh).max() <= NORMALISED_MAX else "pixels"
        if units == "pixels":
            h, w = self.input_hw
            xywh = xywh / np.array([w, h, w, h], np.float64)
        cx, cy, bw, bh = xywh.T
        boxes = np.stack([cy - bh / 2, cx - bw / 2, cy + bh / 2, cx + bw / 2], axis=1)
        return _best(boxes, scores, threshold, self.options)


class SsdDecoder:
    """TF Object Detection API SSD heads (box encodings + class scores against anchors) -> detections."""

    def __init__(self, shapes: Sequence[Sequence[int]], *, anchors: np.ndarray | str | Path | None,
                 names: Sequence[str] = (), labels: Sequence[str] = (), options: DecodeOptions | None = None):
        self.options = options or DecodeOptions()
        roles = ssd_roles(shapes, names)
        if roles is None:
            raise InputShapeError(f"`decode=ssd` needs two outputs [1, N, 4] (box encodings) and [1, N, classes]; "
                                  f"this model has {_shapes(shapes)}")
        self.boxes_at, self.scores_at = roles
        n, classes = shapes[self.scores_at][1], shapes[self.scores_at][2]
        if anchors is None:
            raise UsageError(f"an SSD head needs its anchors: `anchors`, a .npy holding ({n}, 4) "
                             "(ycenter, xcenter, h, w) normalised")
        self.anchors = load_anchors(anchors) if isinstance(anchors, (str, Path)) else np.asarray(anchors, np.float64)
        if self.anchors.shape != (n, 4):
            raise InputShapeError(f"holds shape {list(self.anchors.shape)}, the model's outputs {_shapes(shapes)} "
                                  f"need [{n}, 4]", param="anchors")
        background = self.options.background
        self.skip = int(background if background is not None else bool(labels) and classes == len(labels) + 1)
        if classes - self.skip < 1:
            raise InputShapeError(f"scores [1, {n}, {classes}] leave no class after the background column")

    def __call__(self, outputs: Sequence[np.ndarray], threshold: float) -> Decoded:
        enc = outputs[self.boxes_at][0].astype(np.float64)
        scores = outputs[self.scores_at][0][:, self.skip:]
        kind = self.options.scores
        if kind == "auto":
            kind = "logits" if scores.size and (scores.min() < 0 or scores.max() > 1) else "probabilities"
        if kind == "logits":
            scores = 1.0 / (1.0 + np.exp(-scores.astype(np.float64)))
        ys, xs, hs, ws = self.options.scales
        ya, xa, ha, wa = self.anchors.T
        yc = enc[:, 0] / ys * ha + ya
        xc = enc[:, 1] / xs * wa + xa
        h = np.exp(enc[:, 2] / hs) * ha
        w = np.exp(enc[:, 3] / ws) * wa
        boxes = np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=1)
        return _best(boxes, scores, threshold, self.options)


def load_anchors(path: str | Path) -> np.ndarray:
    """An (N, 4) anchors array from a .npy file (no pickles)."""
    try:
        anchors = load_arrays(Path(path), error=UsageError)  # headers first: bounded, numeric, no pickles
    except UsageError as exc:
        raise UsageError(str(exc), param="anchors") from None
    if not isinstance(anchors, np.ndarray):  # an .npz: not what anchors are kept in
        raise UsageError(f"{path}: expected a .npy array, got an .npz archive", param="anchors")
    if not np.issubdtype(anchors.dtype, np.number):
        raise UsageError(f"{path}: expected a numeric .npy array", param="anchors")
    return anchors.astype(np.float64)
