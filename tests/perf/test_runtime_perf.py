"""Runtime benchmarks, run on demand: `python -m pytest -m perf -s tests/perf/test_runtime_perf.py`.
Each prints ratios measured in one run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import FakeCapture
from edgekit.runtime.timing import _rss_bytes
from edgekit.run import run_stream
from edgekit.runtime import Camera, Model

pytestmark = pytest.mark.perf


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_run_on_a_folder_costs_little_more_than_decode_plus_invoke(converted, digits_dir, mode):
    """Baseline: cv2.imread + set_tensor + invoke + get_tensor per file, serially. `edgekit run`'s
    engine adds preprocessing, quantization, top-1, timing and frame bookkeeping, and overlaps
    decoding with inference in a reader thread. Measured in fresh processes without TensorFlow
    (as on a device), three times."""
    script = Path(__file__).with_name("run_overhead.py")
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, str(script), str(converted(mode)), str(digits_dir / "test"), "15"],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out))
    ratios = sorted(r["ratio"]["run"] for r in runs)
    serial = sorted(r["ratio"]["run_serial"] for r in runs)
    us = [r["us_per_frame"] for r in runs]
    print(f"\n{mode} digits model, {runs[0]['frames']} PNGs: edgekit run / (decode + invoke) = {ratios} "
          f"(median {ratios[1]:.3f}); without the reader thread {serial}; us/frame per run: {us}")
    assert ratios[1] <= 1.10


def _slow_model(tmp_path):
    """A float32 CNN on 160x160x3 that takes well over 33 ms per invoke on one thread."""
    import keras

    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe

    keras.utils.set_random_seed(0)
    inputs = keras.Input((160, 160, 3))
    x = inputs
    for _ in range(6):
        x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    keras.Model(inputs, outputs).save(tmp_path / "slow.keras")
    return convert(ConvertRecipe(model=tmp_path / "slow.keras", output=tmp_path / "slow.tflite")).path


def test_capture_overlaps_inference_on_a_30_fps_camera(tmp_path):
    model = Model(_slow_model(tmp_path), num_threads=1)
    x = np.random.default_rng(0).uniform(0, 255, model.inputs[0].shape).astype(np.float32)
    model.runner.set(model.inputs[0].index, x)
    invokes = []
    for _ in range(12):
        t0 = time.perf_counter()
        model.runner.invoke()
        invokes.append(time.perf_counter() - t0)
    invoke_s = float(np.median(invokes[2:]))
    assert invoke_s > 1 / 30, f"the model must be slower than a 30 FPS camera ({invoke_s * 1e3:.1f} ms)"
    frames = [np.random.default_rng(i).integers(0, 255, (480, 640, 3), dtype=np.uint8) for i in range(8)]
    camera = Camera("sim30", opener=lambda d: FakeCapture(frames, fps=30), backoff=0.01)
    rss = []
    summary = run_stream(model, camera, max_frames=60,
                         on_result=lambda f, r, ms: rss.append(_rss_bytes()) if f.index % 10 == 0 else None)
    fps = summary.frames / summary.seconds
    ratio = fps * invoke_s
    growth = (max(rss) - rss[0]) / 2**20
    print(f"\ninvoke {invoke_s * 1e3:.1f} ms -> invoke-bound {1 / invoke_s:.1f} FPS; camera 30 FPS; "
          f"achieved {fps:.1f} FPS = {ratio:.2f}x the invoke-bound rate; dropped {summary.source['dropped']}; "
          f"RSS growth over the run {growth:.1f} MiB")
    assert ratio >= 0.9
    assert growth < 20
