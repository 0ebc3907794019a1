"""Shared fixtures: the bundled digits data and a digits CNN trained once per session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "EDGEKIT_CACHE_DIR" not in os.environ:  # the probe verdicts of this run (runtime/verdicts.py), not the user's
    os.environ["EDGEKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgekit-test-cache-")
    atexit.register(shutil.rmtree, os.environ["EDGEKIT_CACHE_DIR"], True)

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "calibration_data" / "digits"
PHOTOS = ROOT / "calibration_data" / "photos"

# A runtime-only venv (no TensorFlow: the LiteRT 1.4.0 and tflite-runtime 2.14 floors in CI) points this at
# models built beforehand by tests/build_models.py; the tests that need TensorFlow itself are deselected.
PREBUILT = os.environ.get("EDGEKIT_TEST_MODELS")
TF_FIXTURES = {"digits_keras", "face_like", "swept"}
DIGIT_MODELS = [("float32", "float32"), ("float16", "float32"), ("dynamic", "float32"), ("int8", "float32"),
                ("int8", "int8"), ("int8", "uint8")]


def pytest_report_header(config):
    from sshd import server_kind

    return f"--on HOST tests: {server_kind()}"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: the runtime's test venvs (ARM, floor) have none
def pytest_xdist_make_scheduler(config, log):
    """`-n 2` without a `--dist` of its own sends whole modules to a worker (xdist's loadscope), not single
    tests: a module's tests on both workers had each build the module-scoped fixtures (a trained model, six
    conversions), and the README's run took 837 s against 715 s (session 55). A `--dist` given stands."""
    if config.getvalue("dist") != "load" or any(a.startswith(("--dist", "-d")) for a in config.invocation_params.args):
        return None
    from xdist.scheduler import LoadScopeScheduling

    return LoadScopeScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if not PREBUILT:
        return
    dropped = [item for item in items if TF_FIXTURES & set(getattr(item, "fixturenames", ()))]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def _prebuilt(name: str) -> Path:
    path = Path(PREBUILT) / name
    if not path.is_file():
        pytest.fail(f"{name} is not among the prebuilt models in {PREBUILT}: add it to tests/build_models.py")
    return path


def convert_digits(keras_model: Path, out: Path, mode: str, io: str = "float32") -> Path:
    """The digits model in one mode, as the tests use it: digits.MODE.IO.tflite in `out`."""
    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe

    path = out / f"digits.{mode}.{io}.tflite"
    convert(ConvertRecipe(model=keras_model, mode=mode, io=io, calib=DIGITS / "train", output=path))
    return path


@pytest.fixture(scope="session")
def digits_dir() -> Path:
    return DIGITS


@pytest.fixture(scope="session")
def photos_dir() -> Path:
    return PHOTOS


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Path:
    """A folder all pytest-xdist workers of this run share (the parent of their base temp folders), for
    files one worker builds and the others read: `built(shared, name, build)`."""
    root = tmp_path_factory.getbasetemp()
    return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "shared"


def built(folder: Path, name: str, build) -> Path:
    """folder/name, made once by `build(path)` in whichever worker asks first; the others wait for it
    (a lock file), then read it. Read only: a test that changes such a file copies it first."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = folder / f"{name}.partial{path.suffix}"
            build(partial)
            partial.rename(path)
    return path


@pytest.fixture(scope="session")
def digits_keras(shared, work) -> Path:
    """The demo's digits CNN, trained with a fixed seed and saved as a Keras 3 .keras file (trained once per
    run; each worker gets its own copy, so files written beside it by default stay the worker's)."""
    from edgekit.converters.demo_model import train_digits

    def build(path: Path) -> None:
        model, _ = train_digits(DIGITS / "train", epochs=20, seed=0)
        model.save(path)

    path = work / "digits.keras"
    shutil.copyfile(built(shared, "digits.keras", build), path)
    return path


@pytest.fixture(scope="session")
def converted(shared, request):
    """Convert the digits model in a given mode once per run: converted("int8") -> Path."""
    if PREBUILT:
        return lambda mode, io="float32": _prebuilt(f"digits.{mode}.{io}.tflite")
    digits_keras = request.getfixturevalue("digits_keras")

    def get(mode: str, io: str = "float32") -> Path:
        def build(path: Path) -> None:
            folder = path.parent / f"{path.name}.d"
            folder.mkdir(exist_ok=True)  # a failed earlier build (under the lock) may have left it
            convert_digits(digits_keras, folder, mode, io).rename(path)

        return built(shared, f"digits.{mode}.{io}.tflite", build)

    return get


@pytest.fixture(scope="session")
def swept(work, digits_keras, digits_dir):
    """One `edgekit sweep --out` of the digits model per session: (out folder, summary)."""
    from edgekit.sweeper import SweepSettings, sweep

    out = work / "sweep"
    return out, sweep(SweepSettings(model=digits_keras, calib=digits_dir / "train", eval_data=digits_dir / "test",
                                    out=out, threads=1, runs=200))


@pytest.fixture(scope="session")
def face_like(work):
    """A three-head model (box regression 4, 10 landmark coordinates, a 2-way softmax) trained briefly on
    the digits so its heads are confident: score = digit is even, box and landmarks = pixel statistics in
    [0, 1]. Saved as .keras: (path, model)."""
    import keras
    import numpy as np

    from edgekit.runtime import ImageFolder, read_image

    folder = ImageFolder.scan(DIGITS / "train")
    x = np.stack([read_image(f) for f in folder.files])[..., None].astype(np.float32)
    digit = np.asarray([int(folder.classes[i]) for i in folder.labels])
    q = x[..., 0] / 255.0
    box = np.stack([q[:, :4, :4].mean((1, 2)), q[:, :4, 4:].mean((1, 2)), q[:, 4:, :4].mean((1, 2)),
                    q[:, 4:, 4:].mean((1, 2))], 1)
    marks = q[:, ::2, ::2].reshape(len(q), -1)[:, :10]
    keras.utils.set_random_seed(4)
    inp = keras.Input((8, 8, 1), name="face")
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(keras.layers.Rescaling(1 / 255.0)(inp))
    h = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(h))
    outs = [keras.layers.Dense(4, name="box")(h), keras.layers.Dense(10, name="landmarks")(h),
            keras.layers.Dense(2, activation="softmax", name="score")(h)]
    model = keras.Model(inp, outs)
    model.compile("adam", ["mse", "mse", "sparse_categorical_crossentropy"])
    model.fit(x, [box, marks, digit % 2], epochs=15, batch_size=32, verbose=0)
    path = work / "face.keras"
    model.save(path)
    return path, model


@pytest.fixture(scope="session")
def detector_tflite(work) -> Path:
    """A tiny float32 SSD-style model ending in TFLite_Detection_PostProcess (see tests/detection_model.py):
    the score of class 0/1/2 in each cell of a 4x4 grid is the mean red/green/blue of that cell."""
    if PREBUILT:
        return _prebuilt("detector.tflite")
    from detection_model import build_tiny_detector

    return build_tiny_detector(work / "detector.tflite", input_size=64)


def make_video(path: Path, frames, fps: float = 30.0) -> Path:
    """Write RGB frames to an MJPG .avi with OpenCV (no download, no codec packs)."""
    import cv2

    first = frames[0]
    h, w = first.shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (w, h))
    assert writer.isOpened()
    for frame in frames:
        bgr = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR if frame.ndim == 2 else cv2.COLOR_RGB2BGR)
        writer.write(bgr)
    writer.release()
    return path


class FakeCapture:
    """A camera for tests: the OpenCV VideoCapture protocol over a list of BGR frames, delivered at
    `fps`, that can fail after `fail_after` frames (read returns False) or hang for `hang_after`."""

    def __init__(self, frames, *, fps: float = 30.0, fail_after: int | None = None,
                 hang_after: int | None = None, opens: bool = True):
        import time

        self.frames = frames
        self.period = 1.0 / fps
        self.fail_after = fail_after
        self.hang_after = hang_after
        self.opens = opens
        self.count = 0
        self.released = False
        self._next = time.monotonic()

    def isOpened(self):  # noqa: N802
        return self.opens

    def read(self):
        import time

        if self.fail_after is not None and self.count >= self.fail_after:
            return False, None
        if self.hang_after is not None and self.count >= self.hang_after:
            time.sleep(3600)
        self._next += self.period
        delay = self._next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        frame = self.frames[self.count % len(self.frames)]
        self.count += 1
        return True, frame

    def release(self):
        self.released = True
