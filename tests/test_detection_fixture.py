"""The tiny detector fixture: a .tflite ending in TFLite_Detection_PostProcess whose detections
follow the image's colours (red/green/blue mean per 4x4 grid cell -> classes 0/1/2)."""

from __future__ import annotations

import numpy as np
import pytest

from ai_edge_litert.interpreter import Interpreter

from detection_model import POSTPROCESS_OP, SIGNATURE_OUTPUTS, build_tiny_detector

SIZE = 64
CELL = SIZE // 4


def _calibration() -> np.ndarray:
    rng = np.random.default_rng(0)
    images = np.zeros((12, SIZE, SIZE, 3), np.float32)
    for i, image in enumerate(images):
        image[:] = rng.uniform(0, 255, 3)
        y, x = rng.integers(0, 4, 2)
        image[y * CELL : (y + 1) * CELL, x * CELL : (x + 1) * CELL] = 255.0 * (i % 2)
    return images


@pytest.fixture(scope="module", params=["float32", "int8"])
def detector(request, tmp_path_factory):
    int8 = request.param == "int8"
    path = build_tiny_detector(
        tmp_path_factory.mktemp("detector") / f"tiny_{request.param}.tflite",
        input_size=SIZE,
        int8=int8,
        calib=_calibration() if int8 else None,
    )
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    return interpreter


def _one_colour_cell(row: int, col: int, channel: int) -> np.ndarray:
    image = np.zeros((1, SIZE, SIZE, 3), np.float32)
    image[0, row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL, channel] = 255.0
    return image


def test_model_ends_in_the_detection_postprocess_op_with_four_float_outputs(detector):
    ops = [op["op_name"] for op in detector._get_ops_details()]
    assert POSTPROCESS_OP in ops
    outputs = detector.get_output_details()
    assert len(outputs) == 4
    assert all(o["dtype"] == np.float32 for o in outputs)
    assert sorted(tuple(o["shape"]) for o in outputs) == [(1,), (1, 10), (1, 10), (1, 10, 4)]


@pytest.mark.parametrize(
    "row, col, channel, box",
    [(0, 0, 0, [0.0, 0.0, 0.25, 0.25]), (3, 3, 2, [0.75, 0.75, 1.0, 1.0])],
    ids=["red-top-left", "blue-bottom-right"],
)
def test_top_detection_is_the_coloured_cell(detector, row, col, channel, box):
    out = detector.get_signature_runner()(image=_one_colour_cell(row, col, channel))
    count = out[SIGNATURE_OUTPUTS["count"]]
    boxes, classes, scores = (out[SIGNATURE_OUTPUTS[k]] for k in ("boxes", "classes", "scores"))
    assert count.shape == (1,) and boxes.shape == (1, 10, 4)
    assert classes.shape == scores.shape == (1, 10)
    assert int(count[0]) >= 1
    assert int(classes[0, 0]) == channel
    assert scores[0, 0] > 0.5
    np.testing.assert_allclose(boxes[0, 0], box, atol=0.05)
