"""Raw detection heads: YOLO (Ultralytics) and SSD (TF Object Detection API) decoding, NMS, the mapping back to
the frame, and `edgekit run --task detect` on tiny .tflite heads whose outputs are known constants."""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime import Detector, Model, PreprocessSpec, read_image, task_for
from edgekit.runtime.decoders import (DecodeOptions, SsdDecoder, YoloDecoder, detect_layout, nms, nms_numpy,
                                      to_frame, yolo_anchor_count)
from helpers import run_cli

SIZE = 64
LABELS = ["cat", "dog"]
# YOLO rows: centre-x, centre-y, width, height (fractions of the input), class, score
YOLO_ROWS = [
    (0.50, 0.50, 0.4, 0.3, 0, 0.9),  # A, cat
    (0.51, 0.50, 0.4, 0.3, 0, 0.8),  # A again, cat: removed by NMS
    (0.50, 0.50, 0.4, 0.3, 1, 0.7),  # A, dog: another class, kept
    (0.20, 0.80, 0.2, 0.2, 1, 0.4),  # under the 0.5 threshold
    (0.80, 0.30, 0.2, 0.2, 0, 0.6),  # B, cat
]
# what survives at threshold 0.5: (ymin, xmin, ymax, xmax) of the input, class, score; best first
YOLO_EXPECTED = [((0.35, 0.3, 0.65, 0.7), 0, 0.9), ((0.35, 0.3, 0.65, 0.7), 1, 0.7), ((0.2, 0.7, 0.4, 0.9), 0, 0.6)]


def yolo_head(rows=YOLO_ROWS, classes: int = 2, n: int | None = None, pixels: bool = False) -> np.ndarray:
    """[1, 4 + C, N] (Ultralytics' layout) with `rows` first and zero scores elsewhere."""
    n = n or yolo_anchor_count((SIZE, SIZE))
    out = np.zeros((1, 4 + classes, n), np.float32)
    out[0, :4, :] = 0.1  # the empty rows still hold a small box
    for i, (cx, cy, w, h, k, score) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        out[0, 4 + k, i] = score
    if pixels:
        out[0, :4] *= SIZE
    return out


def grid_anchors(grid: int = 4) -> np.ndarray:
    centres = (np.arange(grid) + 0.5) / grid
    yc, xc = np.meshgrid(centres, centres, indexing="ij")
    return np.stack([yc.ravel(), xc.ravel(), np.full(grid * grid, 1 / grid), np.full(grid * grid, 1 / grid)], 1)


def ssd_head() -> tuple[np.ndarray, np.ndarray]:
    """Box encodings [1, 16, 4] and logits [1, 16, 3] (background, cat, dog) on a 4x4 grid of anchors."""
    enc = np.zeros((1, 16, 4), np.float32)
    logits = np.full((1, 16, 3), -8.0, np.float32)
    logits[0, 0, 0] = 5.0  # background: never a detection
    logits[0, 5, 1] = 2.0  # cat on anchor 5 (row 1, col 1) itself: box (0.25, 0.25, 0.5, 0.5)
    logits[0, 6, 1] = 1.0  # cat on anchor 6 moved onto anchor 5's box: removed by NMS
    enc[0, 6, 1] = (0.385 - 0.625) * 10 / 0.25
    logits[0, 10, 2] = 0.5  # dog on anchor 10 (centre 0.625), 0.025 lower, twice as tall
    enc[0, 10, 0] = 1.0
    enc[0, 10, 2] = 5 * math.log(2)
    logits[0, 15, 2] = -1.0  # under the threshold
    return enc, logits


sigmoid = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
SSD_EXPECTED = [((0.25, 0.25, 0.5, 0.5), 0, sigmoid(2.0)), ((0.4, 0.5, 0.9, 0.75), 1, sigmoid(0.5))]


def assert_decoded(found, expected, atol=1e-5):
    assert len(found.scores) == len(expected), found
    for box, k, score, (ebox, ek, escore) in zip(found.boxes, found.classes, found.scores, expected):
        np.testing.assert_allclose(box, ebox, atol=atol)
        assert k == ek and score == pytest.approx(escore, abs=1e-6)


# -- (a) decoders on hand-made tensors ------------------------------------------------------------------
def test_yolo_keeps_the_best_of_overlapping_duplicates_other_classes_and_drops_low_scores():
    decoder = YoloDecoder([(1, 6, 84)], input_hw=(SIZE, SIZE))
    assert_decoded(decoder([yolo_head()], 0.5), YOLO_EXPECTED)


def test_yolo_threshold_is_inclusive_and_lower_thresholds_let_more_through():
    decoder = YoloDecoder([(1, 6, 84)], input_hw=(SIZE, SIZE))
    assert [round(s, 6) for s in decoder([yolo_head()], 0.6).scores] == [0.9, 0.7, 0.6]
    assert [round(s, 6) for s in decoder([yolo_head()], 0.3).scores] == [0.9, 0.7, 0.6, 0.4]
    assert len(decoder([yolo_head()], 0.95).scores) == 0


def test_yolo_rows_last_layout_gives_the_same_detections():
    decoder = YoloDecoder([(1, 84, 6)], input_hw=(SIZE, SIZE))
    assert decoder.axis == 2
    assert_decoded(decoder([yolo_head().transpose(0, 2, 1)], 0.5), YOLO_EXPECTED)


def test_yolo_pixel_boxes_are_read_as_pixels_of_the_input():
    decoder = YoloDecoder([(1, 6, 84)], input_hw=(SIZE, SIZE))
    assert_decoded(decoder([yolo_head(pixels=True)], 0.5), YOLO_EXPECTED)
    forced = YoloDecoder([(1, 6, 84)], input_hw=(SIZE, SIZE), options=DecodeOptions(box_units="pixels"))
    assert_decoded(forced([yolo_head(pixels=True)], 0.5), YOLO_EXPECTED)


def test_nms_iou_threshold_and_max_detections():
    loose = YoloDecoder([(1, 6, 84)], input_hw=(SIZE, SIZE), options=DecodeOptions(iou=0.99))
    assert len(loose([yolo_head()], 0.5).scores) == 4  # the duplicate overlaps by less than 0.99
    capped = YoloDecoder([(1, 6, 84)], input_hw=(SIZE, SIZE), options=DecodeOptions(max_detections=2))
    assert_decoded(capped([yolo_head()], 0.5), YOLO_EXPECTED[:2])


def test_numpy_nms_agrees_with_opencv():
    rng = np.random.default_rng(0)
    yx = rng.uniform(0, 0.8, (300, 2))
    boxes = np.concatenate([yx, yx + rng.uniform(0.05, 0.3, (300, 2))], axis=1)
    scores = rng.uniform(0.01, 1, 300).astype(np.float32)
    classes = rng.integers(0, 3, 300)
    for iou in (0.3, 0.45, 0.7):
        np.testing.assert_array_equal(nms(boxes, scores, classes, iou, 100), nms_numpy(boxes, scores, classes, iou, 100))


def test_ssd_decodes_anchors_applies_sigmoid_to_logits_and_skips_the_background():
    enc, logits = ssd_head()
    decoder = SsdDecoder([enc.shape, logits.shape], anchors=grid_anchors(), labels=LABELS)
    assert decoder.skip == 1  # three score columns, two labels
    assert_decoded(decoder([enc, logits], 0.5), SSD_EXPECTED)


def test_ssd_probabilities_and_explicit_background():
    enc, logits = ssd_head()
    probs = 1 / (1 + np.exp(-logits))
    decoder = SsdDecoder([enc.shape, probs.shape], anchors=grid_anchors(), options=DecodeOptions(background=True))
    assert_decoded(decoder([enc, probs], 0.5), SSD_EXPECTED)
    # without labels and without --background, column 0 is a class like the others
    plain = SsdDecoder([enc.shape, probs.shape], anchors=grid_anchors())
    assert [int(k) for k in plain([enc, probs], 0.5).classes] == [0, 1, 2]


def test_ssd_outputs_in_either_order_and_bad_anchors():
    enc, logits = ssd_head()
    swapped = SsdDecoder([logits.shape, enc.shape], anchors=grid_anchors(), labels=LABELS)
    assert_decoded(swapped([logits, enc], 0.5), SSD_EXPECTED)
    with pytest.raises(InputShapeError, match=r"\[9, 4\].*need \[16, 4\]"):
        SsdDecoder([enc.shape, logits.shape], anchors=np.zeros((9, 4)))
    with pytest.raises(UsageError, match="needs its anchors: anchors, a .npy"):
        SsdDecoder([enc.shape, logits.shape], anchors=None)


@pytest.mark.parametrize("resize, box, frame, expected", [
    # 128x256 into 64x64: scale 0.25, 16 rows of padding on top; input rows 16..48 are frame rows 0..128
    ("letterbox", (0.25, 0.0, 0.75, 0.5), (128, 256), (0, 0, 128, 128)),
    ("letterbox", (0.0, 0.5, 1.0, 1.0), (128, 256), (128, 0, 256, 128)),  # the padding is clipped away
    ("stretch", (0.25, 0.0, 0.75, 0.5), (128, 256), (0, 32, 128, 96)),
    # centre crop: 128x128 kept from columns 64..192
    ("crop", (0.0, 0.0, 0.5, 0.5), (128, 256), (64, 0, 128, 64)),
])
def test_boxes_map_back_to_the_frame_through_the_resize_mode(resize, box, frame, expected):
    spec = PreprocessSpec(SIZE, SIZE, 3, resize=resize)
    np.testing.assert_allclose(to_frame(np.array([box]), spec, frame)[0], expected, atol=1e-9)


def test_layouts_are_detected_only_where_the_shapes_say_so():
    assert detect_layout([(1, 6, 84)], input_hw=(SIZE, SIZE)) == "yolo"  # N is the anchor count of 64x64
    assert detect_layout([(1, 84, 6)], input_hw=(SIZE, SIZE)) == "yolo"
    assert detect_layout([(1, 84, 8400)], input_hw=(640, 640)) == "yolo"  # YOLOv8 COCO
    assert detect_layout([(1, 6, 50)], labels=LABELS) == "yolo"  # 4 + 2 labels
    assert detect_layout([(1, 6, 50)], input_hw=(SIZE, SIZE)) is None  # neither labels nor the anchor count
    assert detect_layout([(1, 84)], input_hw=(SIZE, SIZE)) is None  # a classifier stays a classifier
    assert detect_layout([(1, 16, 4), (1, 16, 3)]) == "ssd"
    assert detect_layout([(1, 16, 4), (1, 12, 3)]) is None
    assert detect_layout([(1, 10, 4), (1, 10), (1, 10), (1,)]) is None


# -- (b) tiny .tflite heads through `edgekit run` ----------------------------------------------------------
def _constant_tflite(path, outputs, labels=None, resize=None):
    """A Keras 3 model whose outputs are `outputs` whatever the image: GlobalAveragePooling -> Dense with a zero
    kernel and the flattened output as bias -> Reshape; converted with TFLiteConverter.from_keras_model."""
    import keras
    import tensorflow as tf

    from edgekit.converters.metadata_writer import add_metadata

    image = keras.Input((SIZE, SIZE, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(image)
    heads = []
    for i, value in enumerate(outputs):
        value = np.asarray(value, np.float32)
        dense = keras.layers.Dense(value.size, kernel_initializer="zeros",
                                   bias_initializer=keras.initializers.Constant(value.ravel()), name=f"dense{i}")
        heads.append(keras.layers.Reshape(value.shape[1:], name=f"head{i}")(dense(pooled)))
    model = keras.Model(image, heads if len(heads) > 1 else heads[0])
    with contextlib.redirect_stdout(io.StringIO()):  # the converter prints the SavedModel it writes
        flatbuffer = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    entry = {}
    if labels:
        entry["labels"] = labels
    if resize:
        entry["preprocessing"] = PreprocessSpec(SIZE, SIZE, 3, resize=resize).to_dict()
    if entry:
        flatbuffer = add_metadata(flatbuffer, entry)
    path.write_bytes(flatbuffer)
    return path


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    enc, logits = ssd_head()
    np.save(d / "anchors.npy", grid_anchors())
    return {
        "yolo": _constant_tflite(d / "yolo.tflite", [yolo_head()], labels=LABELS, resize="letterbox"),
        "yolo_pixels": _constant_tflite(d / "yolo_pixels.tflite", [yolo_head(pixels=True).transpose(0, 2, 1)]),
        "ssd": _constant_tflite(d / "ssd.tflite", [enc, logits], labels=LABELS),
        "classifier": _constant_tflite(d / "classifier.tflite", [np.linspace(0, 1, 84)[None]]),
        "anchors": d / "anchors.npy",
    }


def expected_pixels(box, h, w, resize):
    """(ymin, xmin, ymax, xmax) of the 64x64 input -> x0, y0, x1, y1 of an h x w photo, clipped."""
    y0, x0, y1, x1 = (v * SIZE for v in box)
    if resize == "letterbox":
        s = min(SIZE / h, SIZE / w)
        top, left = (SIZE - round(h * s)) // 2, (SIZE - round(w * s)) // 2
        px = [(x0 - left) / s, (y0 - top) / s, (x1 - left) / s, (y1 - top) / s]
    else:
        px = [x0 * w / SIZE, y0 * h / SIZE, x1 * w / SIZE, y1 * h / SIZE]
    return np.clip(px, 0, [w, h, w, h])


def check_run(result, photos_dir, save_dir, expected, labels, resize):
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    frames, summary = lines[:-1], lines[-1]["summary"]
    photos = sorted(p for p in photos_dir.iterdir() if p.suffix == ".jpg")
    assert summary["task"] == "detect" and len(frames) == len(photos) == summary["frames"]
    for frame in frames:
        h, w = read_image(photos_dir / frame["name"]).shape[:2]
        got = frame["results"]
        assert [(r["index"], r["label"]) for r in got] == [(k, labels[k]) for _, k, _ in expected]
        for r, (box, _, score) in zip(got, expected):
            assert r["score"] == pytest.approx(score, abs=1e-6)
            np.testing.assert_allclose(r["box"], expected_pixels(box, h, w, resize), atol=0.006)
    saved = sorted(save_dir.glob("*.jpg"))
    assert len(saved) == len(photos)
    import cv2

    assert all(cv2.imread(str(p)) is not None for p in saved)


def test_yolo_head_through_edgekit_run_boxes_on_each_photo(heads, photos_dir, tmp_path):
    out = tmp_path / "annotated"
    result = run_cli("run", heads["yolo"], "--source", photos_dir, "--task", "detect", "--save-dir", out, "--json")
    check_run(result, photos_dir, out, YOLO_EXPECTED, LABELS, "letterbox")


def test_yolo_rows_last_pixel_head_without_metadata_is_found_from_its_shape(heads, photos_dir, tmp_path):
    out = tmp_path / "annotated"
    result = run_cli("run", heads["yolo_pixels"], "--source", photos_dir, "--save-dir", out, "--json")
    check_run(result, photos_dir, out, YOLO_EXPECTED, ["0", "1"], "stretch")


def test_ssd_head_through_edgekit_run_with_anchors(heads, photos_dir, tmp_path):
    out = tmp_path / "annotated"
    result = run_cli("run", heads["ssd"], "--source", photos_dir, "--task", "detect", "--decode", "ssd",
                     "--anchors", heads["anchors"], "--save-dir", out, "--json")
    check_run(result, photos_dir, out, SSD_EXPECTED, LABELS, "stretch")


def test_task_follows_the_head_and_a_classifier_stays_a_classifier(heads):
    assert task_for(Model(heads["yolo"])) == "detect"
    assert task_for(Model(heads["yolo_pixels"])) == "detect"
    assert task_for(Model(heads["ssd"])) == "detect"
    assert task_for(Model(heads["classifier"])) == "classify"  # (1, 84): 84 is also the anchor count of 64x64
    assert Detector(heads["yolo"]).decode == "yolo"
    with pytest.raises(UsageError, match="set decode='yolo' or decode='ssd'"):
        Detector(heads["classifier"])
    with pytest.raises(UsageError, match="anchors: is for decode='ssd'"):
        Detector(heads["yolo"], anchors=heads["anchors"])
    with pytest.raises(InputShapeError, match="TFLite_Detection_PostProcess"):
        Detector(heads["yolo"], decode="postprocess")


# -- (c) mistakes are one-line errors -----------------------------------------------------------------------
def test_yolo_decoder_on_an_ssd_head_is_exit_6_naming_the_shapes(heads, photos_dir):
    result = run_cli("run", heads["ssd"], "--source", photos_dir / "astronaut.jpg", "--decode", "yolo")
    assert result.returncode == 6, result.stderr
    assert len(result.error_lines) == 1 and "Traceback" not in result.stderr
    assert "--decode yolo" in result.error_lines[0] and "[1, 16, 4]" in result.error_lines[0]


def test_ssd_head_without_anchors_is_a_usage_error_naming_anchors(heads, photos_dir):
    result = run_cli("run", heads["ssd"], "--source", photos_dir / "astronaut.jpg", "--task", "detect")
    assert result.returncode == 2, result.stderr
    assert len(result.error_lines) == 1 and "--anchors" in result.error_lines[0]
