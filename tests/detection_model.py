"""A tiny, deterministic SSD-style detector whose .tflite ends in `TFLite_Detection_PostProcess`.

Test fixture for code that parses detection outputs. Nothing is trained or downloaded: the "head"
is a fixed function of the image. The image (float32 [1, S, S, 3], raw 0-255 pixels) is cut into a
4x4 grid; for each cell, the score of class k is the mean of colour channel k % 3 (R, G, B for
classes 0, 1, 2) scaled to [0, 1]; the box encodings are zero, so each detection's box is exactly
its anchor, the grid cell. Outputs are those of the post-processing op: boxes [1, N, 4]
(ymin, xmin, ymax, xmax, normalised), classes [1, N], scores [1, N], count [1], all float32.

The op is emitted the way the TF Object Detection API does it (`export_tflite_graph_lib_tf2.py`):
an empty `tf.function` with `experimental_implements` naming the op and its attributes, which the
MLIR converter legalises to the custom op; LiteRT's builtin op resolver ships its kernel.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np

from edgekit.converters._tf import import_tf

GRID = 4
MAX_DETECTIONS = 10
SCORE_THRESHOLD = 0.25
IOU_THRESHOLD = 0.5
# The usual SSD box-coder scales; with zero encodings they do not change the boxes.
SCALES = {"y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
POSTPROCESS_OP = "TFLite_Detection_PostProcess"
# Which signature output is which. As with SSD models exported by the TF2 Object Detection API, the
# placeholder's outputs are reversed, so the "serving_default" signature names come out as below
# and `get_output_details()` lists them in the order scores, boxes, count, classes.
SIGNATURE_OUTPUTS = {"count": "output_0", "scores": "output_1", "classes": "output_2", "boxes": "output_3"}


def grid_anchors(grid: int = GRID) -> np.ndarray:
    """[grid*grid, 4] center-size anchors (ycenter, xcenter, h, w), row-major over the cells."""
    step = 1.0 / grid
    centres = (np.arange(grid, dtype=np.float32) + 0.5) * step
    yc, xc = np.meshgrid(centres, centres, indexing="ij")
    size = np.full(grid * grid, step, np.float32)
    return np.stack([yc.ravel(), xc.ravel(), size, size], axis=1).astype(np.float32)


def _implements_signature(num_classes: int) -> str:
    attrs = [
        f'name: "{POSTPROCESS_OP}"',
        f'attr {{ key: "max_detections" value {{ i: {MAX_DETECTIONS} }} }}',
        'attr { key: "max_classes_per_detection" value { i: 1 } }',
        'attr { key: "detections_per_class" value { i: 100 } }',
        'attr { key: "use_regular_nms" value { b: false } }',
        f'attr {{ key: "nms_score_threshold" value {{ f: {SCORE_THRESHOLD:f} }} }}',
        f'attr {{ key: "nms_iou_threshold" value {{ f: {IOU_THRESHOLD:f} }} }}',
        *(f'attr {{ key: "{k}" value {{ f: {v:f} }} }}' for k, v in SCALES.items()),
        f'attr {{ key: "num_classes" value {{ i: {num_classes} }} }}',
    ]
    return " ".join(attrs)


def save_tiny_detector(folder: str | Path, *, input_size: int = 64, num_classes: int = 3) -> Path:
    """The detector as a SavedModel in `folder` (signature `serving_default`: image -> the four outputs of
    the post-processing op), the way the TF Object Detection API exports one for TFLite."""
    if input_size % GRID or input_size < GRID:
        raise ValueError(f"input_size must be a positive multiple of {GRID}, got {input_size}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    tf = import_tf()
    anchors_np = grid_anchors()
    num_anchors = len(anchors_np)
    channel_of_class = [k % 3 for k in range(num_classes)]

    class TinyDetector(tf.Module):
        @tf.function(experimental_implements=_implements_signature(num_classes))
        def _postprocess(self, box_encodings, class_predictions, anchors):
            # Placeholder body: the converter replaces the whole function with the custom op.
            boxes = tf.constant(0.0, dtype=tf.float32, name="boxes")
            scores = tf.constant(0.0, dtype=tf.float32, name="scores")
            classes = tf.constant(0.0, dtype=tf.float32, name="classes")
            num_detections = tf.constant(0.0, dtype=tf.float32, name="num_detections")
            return boxes, scores, classes, num_detections

        @tf.function(input_signature=[tf.TensorSpec([1, input_size, input_size, 3], tf.float32, name="image")])
        def detect(self, image):
            cell = input_size // GRID
            means = tf.nn.avg_pool2d(image * (1.0 / 255.0), cell, cell, "VALID")  # [1, 4, 4, 3]
            means = tf.reshape(means, [1, num_anchors, 3])
            scores = tf.gather(means, channel_of_class, axis=2)  # [1, A, num_classes]
            background = tf.zeros_like(scores[:, :, :1])
            class_predictions = tf.concat([background, scores], axis=2, name="class_predictions")
            box_encodings = tf.zeros([1, num_anchors, 4], tf.float32, name="box_encodings")
            anchors = tf.constant(anchors_np, name="anchors")
            # As in the OD API: the placeholder's outputs come back reversed.
            return self._postprocess(box_encodings, class_predictions, anchors)[::-1]

    module = TinyDetector()
    folder = Path(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf.saved_model.save(module, str(folder), signatures=module.detect.get_concrete_function())
    return folder


def build_tiny_detector(
    path: str | Path,
    *,
    input_size: int = 64,
    num_classes: int = 3,
    int8: bool = False,
    calib: np.ndarray | None = None,
) -> Path:
    """Build the detector, convert it to .tflite (float32, or int8 calibrated on `calib`, float
    [n, S, S, 3] 0-255 images; random images when None), write it to `path` and return the path."""
    tf = import_tf()
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_tiny_detector(Path(tmp) / "saved", input_size=input_size, num_classes=num_classes)
        converter = tf.lite.TFLiteConverter.from_saved_model(str(Path(tmp) / "saved"))
        converter.allow_custom_ops = True
        if int8:
            if calib is None:
                calib = np.random.default_rng(0).uniform(0, 255, (8, input_size, input_size, 3))
            samples = np.asarray(calib, np.float32).reshape(-1, input_size, input_size, 3)

            def representative():
                for sample in samples:
                    yield [sample[None]]

            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = representative
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                tf.lite.OpsSet.TFLITE_BUILTINS,
            ]
        flatbuffer = converter.convert()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(flatbuffer)
    return path
