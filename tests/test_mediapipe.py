"""The standard TFLite Metadata, with MediaPipe Tasks itself as the client (tests/mediapipe_client.py in a
venv of its own: mediapipe pins absl-py against tensorflow-model-optimization): edgekit's files load in
ImageClassifier, AudioClassifier and ImageSegmenter and give edgekit's answers with edgekit's labels; and
edgekit applies the normalisation MediaPipe's own files state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import edgekit
from edgekit.runtime import Model, prepare, read_image
from edgekit.runtime.tflite_metadata import decode
from conftest import DIGITS

MEDIAPIPE = "mediapipe==1.2.3"  # the client; its wheel is pure Python (ctypes), one for CPython 3.11-3.14
MEDIAPIPE_MODELS = "mediapipe==0.10.21"  # the last wheel that ships MediaPipe's own .tflite files
CACHE = Path(os.environ.get("EDGEKIT_TEST_CACHE", Path.home() / ".cache" / "edgekit-tests"))


@pytest.fixture(scope="session")
def mediapipe_python() -> str:
    """A Python with mediapipe: $EDGEKIT_MEDIAPIPE_PYTHON (.ci/run makes it while other steps run), else a
    venv made once under ~/.cache/edgekit-tests from PyPI."""
    given = os.environ.get("EDGEKIT_MEDIAPIPE_PYTHON")
    if given:
        return given
    venv = CACHE / "mediapipe-venv"
    python = venv / "bin" / "python"
    if not (venv / "ok").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", MEDIAPIPE], check=True, timeout=1200)
        (venv / "ok").write_text(MEDIAPIPE)
    return str(python)


def client(python: str, tmp: Path, task: str, model: Path, inputs: list[np.ndarray], **extra) -> list:
    paths = []
    for i, array in enumerate(inputs):
        paths.append(str(tmp / f"in{i}.npy"))
        np.save(paths[-1], array)
    job = tmp / "job.json"
    job.write_text(json.dumps({"task": task, "model": str(model), "inputs": paths, **extra}))
    proc = subprocess.run([python, str(Path(__file__).with_name("mediapipe_client.py")), str(job)],
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    assert line is not None, proc.stderr[-2000:]
    result = json.loads(line)
    assert result["ok"], result["error"]
    return result["results"]


def _rgb(path: Path) -> np.ndarray:
    return np.repeat(read_image(path)[..., None], 3, axis=-1) if read_image(path).ndim == 2 else read_image(path)


@pytest.fixture(scope="module")
def rgb_digits(tmp_path_factory):
    """The digits as RGB images (8x8x3), a small classifier trained on them, and the test images."""
    import keras

    from edgekit.runtime import ImageFolder

    train = ImageFolder.scan(DIGITS / "train")
    x = np.stack([_rgb(f) for f in train.files])
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255),
                              keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, np.asarray(train.labels), epochs=15, verbose=0)
    folder = tmp_path_factory.mktemp("rgb")
    model.save(folder / "rgb.keras")
    test = ImageFolder.scan(DIGITS / "test")
    return folder, [_rgb(f) for f in test.files]


@pytest.mark.parametrize("mode, io", [("int8", "float32"), ("int8", "uint8"), ("float16", "float32")])
def test_image_classifier_loads_edgekits_file_and_gives_its_answers_and_labels(rgb_digits, mediapipe_python,
                                                                              tmp_path, mode, io):
    folder, images = rgb_digits
    result = edgekit.convert(folder / "rgb.keras", mode=mode, io=io, calib=DIGITS / "train",
                             output=tmp_path / f"rgb.{mode}.{io}.tflite")
    model = Model(result.path)
    ours = [int(np.argmax(model.predict(prepare(img, model.preprocess)[None])[0])) for img in images]
    theirs = client(mediapipe_python, tmp_path, "classify", result.path, images)
    agree = np.mean([o == t["index"] for o, t in zip(ours, theirs)])
    print(f"{mode}/{io}: MediaPipe ImageClassifier agrees with edgekit on {100 * agree:.2f}% of {len(images)} images")
    assert agree >= 0.99
    assert all(t["name"] == model.labels[t["index"]] for t in theirs)  # edgekit's labels, from the associated file
    assert model.labels == tuple(str(i) for i in range(10))


def test_audio_classifier_loads_a_one_dimensional_classifier_with_its_sample_rate(mediapipe_python, tmp_path):
    import keras

    rate, n = 16000, 1600
    t = np.arange(n) / rate
    rng = np.random.default_rng(0)
    tones = (500.0, 1000.0, 2000.0)
    y = rng.integers(0, 3, 300)
    x = np.stack([np.sin(2 * np.pi * tones[k] * t + rng.uniform(0, 6.28)) * rng.uniform(0.3, 0.9) for k in y])
    x = x.astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((n,)), keras.layers.Reshape((n, 1)),
                              keras.layers.Conv1D(8, 16, strides=4, activation="relu"),
                              keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=15, verbose=0)
    model.save(tmp_path / "tones.keras")
    np.savez(tmp_path / "tones.npz", x=x, y=y)
    result = edgekit.convert(tmp_path / "tones.keras", mode="float32", calib=tmp_path / "tones.npz",
                             output=tmp_path / "tones.tflite", info=edgekit.ModelInfo(sample_rate=rate))
    meta = decode(Model(result.path).view.metadata["TFLITE_METADATA"])
    audio = meta["subgraph_metadata"][0]["input_tensor_metadata"][0]["content"]["content_properties"]
    assert audio == {"$type": "AudioProperties", "sample_rate": rate, "channels": 1}
    clips = list(x[:20])
    theirs = client(mediapipe_python, tmp_path, "audio", result.path, clips, sample_rate=rate)
    ours = np.argmax(Model(result.path).predict(np.stack(clips)), axis=-1)
    assert [t["index"] for t in theirs] == ours.tolist()
    assert [t["name"] for t in theirs] == [str(k) for k in ours]


def test_image_segmenter_loads_a_segmenter_and_gives_its_masks(mediapipe_python, tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    h = keras.layers.Rescaling(1 / 255)(inp)
    logits = keras.layers.Conv2D(2, 1, kernel_initializer=keras.initializers.Constant([[[[4.0, -4.0]] * 3]]),
                                 bias_initializer=keras.initializers.Constant([-6.0, 6.0]))(h)
    model = keras.Model(inp, keras.layers.Softmax()(logits))
    model.save(tmp_path / "seg.keras")
    rng = np.random.default_rng(1)
    images = (rng.random((40, 16, 16, 3)) * 255).astype(np.uint8)
    np.savez(tmp_path / "calib.npz", x=images, y=np.arange(40) % 2)
    result = edgekit.convert(tmp_path / "seg.keras", mode="float32", calib=tmp_path / "calib.npz",
                             output=tmp_path / "seg.tflite")
    theirs = client(mediapipe_python, tmp_path, "segment", result.path, list(images[:3]))
    model = Model(result.path)
    for image, t in zip(images[:3], theirs):
        ours = model.predict(image[None].astype(np.float32))[0]
        np.testing.assert_allclose(np.stack(t["confidence"], axis=-1).reshape(ours.shape), ours, atol=1e-4)
        assert t["labels"] == ["0", "1"]


def _iou(a, b) -> float:
    y0, x0 = max(a[0], b[0]), max(a[1], b[1])
    y1, x1 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, y1 - y0) * max(0.0, x1 - x0)
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def test_object_detector_loads_a_detector_with_the_post_processing_op(mediapipe_python, tmp_path):
    """The TF Object Detection API's way: a SavedModel whose graph only names TFLite_Detection_PostProcess.
    edgekit converts it (the float graph's placeholder outputs are not compared, and it says so), names the
    four outputs as MediaPipe matches them, and MediaPipe's boxes and classes are edgekit run's."""
    from detection_model import save_tiny_detector

    from edgekit.runtime.tasks import Detector

    result = edgekit.convert(save_tiny_detector(tmp_path / "detector"), mode="float32", output=tmp_path / "det.tflite")
    assert any("not compared" in w for w in result.warnings)
    rng = np.random.default_rng(2)
    images = []
    for _ in range(6):
        image = np.zeros((64, 64, 3), np.uint8)
        for _ in range(2):
            y, x, c = rng.integers(0, 4), rng.integers(0, 4), rng.integers(0, 3)
            image[16 * y:16 * y + 16, 16 * x:16 * x + 16, c] = rng.integers(150, 256)
        images.append(image)
    theirs = client(mediapipe_python, tmp_path, "detect", result.path, images, threshold=0.5)
    detector = Detector(Model(result.path))
    for image, found in zip(images, theirs):
        ours = [d.to_dict() for d in detector.detect(image, threshold=0.5)]
        assert len(ours) == len(found) >= 1
        for o in ours:
            x0, y0, x1, y1 = o["box"]
            match = max(found, key=lambda t: _iou(t["box"], (y0, x0, y1, x1)))
            assert _iou(match["box"], (y0, x0, y1, x1)) >= 0.9 and match["index"] == o["index"]


# -- reading: MediaPipe's own files ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def mediapipe_models() -> Path:
    """hand_landmark_full.tflite and selfie_segmentation.tflite from the mediapipe wheel that ships them."""
    folder = CACHE / "mediapipe-models"
    wanted = ("hand_landmark/hand_landmark_full.tflite", "selfie_segmentation/selfie_segmentation.tflite")
    if not all((folder / Path(w).name).exists() for w in wanted):
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(folder),
                        MEDIAPIPE_MODELS], check=True, timeout=1200)
        wheel = next(folder.glob("mediapipe-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            for w in wanted:
                (folder / Path(w).name).write_bytes(zf.read(f"mediapipe/modules/{w}"))
        wheel.unlink()
    return folder


@pytest.mark.parametrize("name", ["hand_landmark_full.tflite", "selfie_segmentation.tflite"])
def test_edgekit_applies_the_normalisation_mediapipes_files_state(mediapipe_models, photos_dir, name):
    """Both files state mean 0, std 255 for their float image input. edgekit used to feed raw 0..255 pixels
    (landmarks off by up to 49 px, the mask saturated); it now gives exactly what the interpreter gives on
    the stated input: the same resized pixels, divided by 255."""
    from ai_edge_litert.interpreter import Interpreter

    from edgekit.runtime.preprocess import PreprocessSpec

    path = mediapipe_models / name
    model = Model(path, num_threads=1)
    spec = model.preprocess
    assert model.preprocess_source == "TFLite metadata"
    assert set(spec.mean) == {0.0} and set(spec.std) == {255.0}
    photo = read_image(sorted(photos_dir.iterdir())[0])
    raw = prepare(photo, PreprocessSpec(spec.height, spec.width, spec.channels))  # resized pixels, 0..255
    bare = Interpreter(model_path=str(path), num_threads=1)
    bare.allocate_tensors()
    bare.set_tensor(bare.get_input_details()[0]["index"], (raw / 255.0)[None].astype(np.float32))
    bare.invoke()
    ours = model.invoke_raw([prepare(photo, spec)[None].astype(np.float32)])
    for info, got in zip(model.outputs, ours):
        np.testing.assert_allclose(got, bare.get_tensor(info.index), atol=1e-4)
    unnormalised = model.invoke_raw([raw[None].astype(np.float32)])
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, unnormalised)) > 1e-2  # the old behaviour differs
    # hand_landmark lists its outputs' metadata in another order than its subgraph: the 2 handedness labels
    # (Left, Right) are not names for the 63-wide landmark output they would fall on; the selfie mask's are
    assert model.labels == {"hand_landmark_full.tflite": (), "selfie_segmentation.tflite": ("selfie",)}[name]


def test_what_mediapipe_cannot_take_is_said_at_conversion(rgb_digits, digits_keras, tmp_path):
    """As notes (`convert -v`), not warnings: they ask nothing of a user who does not use MediaPipe."""
    folder, _ = rgb_digits
    gray = edgekit.convert(digits_keras, mode="float32", output=tmp_path / "gray.tflite")
    assert any("grayscale: MediaPipe's image tasks take 3-channel images only" in w for w in gray.notes)
    assert not any("MediaPipe" in w for w in gray.warnings)
    per_channel = edgekit.convert(folder / "rgb.keras", mode="float32", output=tmp_path / "pc.tflite",
                                  preprocessing=edgekit.Preprocessing(mean=(120.0, 110.0, 100.0), std=(60.0,)))
    assert any("per-channel mean/std are written to the TFLite Metadata, but MediaPipe applies one value" in w
               for w in per_channel.notes)
    norm = decode(Model(per_channel.path).view.metadata["TFLITE_METADATA"])
    unit = norm["subgraph_metadata"][0]["input_tensor_metadata"][0]["process_units"][0]["options"]
    assert unit == {"$type": "NormalizationOptions", "mean": [120.0, 110.0, 100.0], "std": [60.0]}
    int8_io = edgekit.convert(folder / "rgb.keras", mode="int8", io="int8", calib=DIGITS / "train",
                              output=tmp_path / "i8.tflite")
    assert any("MediaPipe Tasks read uint8 or float32 inputs and outputs, not int8" in w for w in int8_io.notes)
    assert not any("MediaPipe" in w for w in edgekit.convert(folder / "rgb.keras", mode="float16",
                                                              output=tmp_path / "ok.tflite").notes)


def test_inspect_shows_the_standard_metadata_beside_edgekits(rgb_digits, tmp_path):
    folder, _ = rgb_digits
    result = edgekit.convert(folder / "rgb.keras", mode="float32", calib=DIGITS / "train", output=tmp_path / "r.tflite",
                             preprocessing=edgekit.Preprocessing(mean=127.5, std=127.5),
                             info=edgekit.ModelInfo(name="digits-rgb", author="edgekit tests"))
    standard = edgekit.inspect(result.path).to_dict()["metadata"]["tflite"]
    assert standard["name"] == "digits-rgb" and standard["author"] == "edgekit tests"
    image, = standard["inputs"]
    assert image["content"] == "ImageProperties" and image["color_space"] == "RGB"
    assert image["normalization"] == {"mean": [127.5], "std": [127.5]}
    probs, = standard["outputs"]
    assert probs["files"] == [{"name": "labels.txt", "type": "TENSOR_AXIS_LABELS", "lines": 10}]
