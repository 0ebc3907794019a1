"""edgekit.runtime: Model, tasks and thread safety on real converted models."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from edgekit.errors import InputShapeError, ModelFormatError, UsageError
from edgekit.runtime import Classifier, Detector, ImageFolder, Model, PreprocessSpec, read_image, task_for
from edgekit.runtime.preprocess import InputEncoder, prepare
from edgekit.runtime.quant import quantize


def test_backend_is_litert_and_is_reported(converted):
    """LiteRT here; the CI floor venvs name theirs (EDGEKIT_EXPECT_BACKEND: tflite_runtime 2.14.0, ...)."""
    name, _, version = os.environ.get("EDGEKIT_EXPECT_BACKEND", "ai_edge_litert").partition(" ")
    info = Model(converted("int8")).describe()
    assert info["backend"] == name and info["backend_version"][0].isdigit()
    assert not version or info["backend_version"] == version
    assert info["mode"] == "int8" and info["inputs"][0]["shape"] == [1, 8, 8, 1]


def test_model_loads_from_bytes_like_from_a_path(converted):
    path = converted("float16")
    x = np.random.default_rng(1).uniform(0, 255, (3, 8, 8, 1)).astype(np.float32)
    np.testing.assert_array_equal(Model(path).predict(x), Model(path.read_bytes()).predict(x))


def test_fused_encoder_gives_exactly_the_prepare_then_quantize_numbers(converted, photos_dir):
    for io in ("float32", "int8", "uint8"):
        model = Model(converted("int8", io))
        spec = model.preprocess
        img = read_image(next(iter(ImageFolder.scan(photos_dir.parent / "digits" / "test").files)))
        np.testing.assert_array_equal(InputEncoder(spec, model.inputs[0])(img)[0],
                                      quantize(prepare(img, spec), model.inputs[0]))
    spec = PreprocessSpec(32, 48, 3, resize="letterbox", mean=(127.5, 120, 110), std=(127.5, 60, 50))
    photo = read_image(photos_dir / "chelsea.jpg")
    info = Model(converted("int8", "int8")).inputs[0]
    np.testing.assert_array_equal(InputEncoder(spec, info)(photo)[0], quantize(prepare(photo, spec), info))


def test_classifier_returns_top_k_labels_best_first(converted, digits_dir):
    clf = Classifier(converted("int8"))
    folder = ImageFolder.scan(digits_dir / "test")
    correct = 0
    for path, label in zip(folder.files, folder.labels):
        top = clf.classify(read_image(path), top_k=3)
        assert len(top) == 3 and top[0].score >= top[1].score >= top[2].score
        assert top[0] == clf.classify(read_image(path))[0]
        correct += top[0].label == folder.classes[label]
    assert correct / len(folder.files) >= 0.95


def test_eight_threads_times_fifty_calls_match_single_thread_answers(converted, digits_dir):
    clf = Classifier(converted("int8", "int8"))
    images = [read_image(p) for p in ImageFolder.scan(digits_dir / "test").files[:50]]
    expected = [clf.scores(img) for img in images]
    failures = []

    def worker(offset: int) -> None:
        for k in range(50):
            i = (k + offset) % len(images)
            if not np.array_equal(clf.scores(images[i]), expected[i]):
                failures.append((offset, i))

    threads = [threading.Thread(target=worker, args=(t * 7,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_task_is_chosen_from_the_model(converted, detector_tflite):
    assert task_for(Model(converted("int8"))) == "classify"
    assert task_for(Model(detector_tflite)) == "detect"
    with pytest.raises(UsageError):
        Classifier(detector_tflite)
    with pytest.raises(UsageError):
        Detector(converted("int8"))


def test_detector_finds_the_coloured_cell_in_original_pixels(detector_tflite):
    det = Detector(detector_tflite)
    img = np.zeros((128, 256, 3), np.uint8)
    img[96:128, 192:256, 2] = 255  # blue, bottom-right cell under stretch
    found = det.detect(img, threshold=0.5)
    assert len(found) == 1
    d = found[0]
    assert d.index == 2 and d.score > 0.9
    np.testing.assert_allclose(d.box, (192, 96, 256, 128), atol=1.0)


@pytest.mark.parametrize("resize, paint, expected", [
    # 128x256 into 64x64 with letterbox: scale 0.25, 16 rows of padding on top; model cell (row 1,
    # col 0) covers original rows 0..64, columns 0..64
    ("letterbox", (slice(0, 64), slice(0, 64)), (0, 0, 64, 64)),
    # with a centre crop: scale 0.5 gives 64x128, 32 columns cut on each side; model cell (0, 0)
    # covers original rows 0..32, columns 64..96
    ("crop", (slice(0, 32), slice(64, 96)), (64, 0, 96, 32)),
])
def test_detection_boxes_undo_letterbox_and_crop(detector_tflite, resize, paint, expected):
    det = Detector(detector_tflite)
    det.spec = PreprocessSpec(64, 64, 3, resize=resize)
    det.encode = InputEncoder(det.spec, det.model.inputs[0])
    img = np.zeros((128, 256, 3), np.uint8)
    img[paint[0], paint[1], 0] = 255
    best = det.detect(img, threshold=0.5)[0]
    assert best.index == 0
    np.testing.assert_allclose(best.box, expected, atol=1.0)


def test_wrong_inputs_are_clear_errors(converted, tmp_path):
    model = Model(converted("float32"))
    with pytest.raises(InputShapeError, match="expects shape"):
        model.run(np.zeros((1, 9, 9, 1), np.float32))
    with pytest.raises(InputShapeError):
        Classifier(model).classify(np.zeros((2, 2, 2, 2), np.uint8))
    (tmp_path / "x.tflite").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ModelFormatError, match="not a TFLite flatbuffer"):
        Model(tmp_path / "x.tflite")
    with pytest.raises(ModelFormatError, match="is a folder"):
        Model(tmp_path)


def test_tflite_runtime_2_14_under_numpy_2_is_detected_and_explained(tmp_path):
    """tflite-runtime 2.14 (its last release) crashes under numpy 2; it cannot be installed beside
    numpy 2 here, so a stand-in package with its version string takes its place on sys.path."""
    import subprocess
    import sys

    pkg = tmp_path / "tflite_runtime"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "2.14.0"\n')
    (pkg / "interpreter.py").write_text("raise SystemExit('must not be imported')\n")
    code = ("from edgekit.runtime.backend import get_backend\n"
            "from edgekit.errors import MissingDependencyError\n"
            "try:\n    get_backend('tflite_runtime')\nexcept MissingDependencyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)}).stdout
    assert "numpy 1 and crashes under numpy 2" in out and "pip install ai-edge-litert" in out
