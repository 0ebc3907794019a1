"""Issue 16's acceptance, run on demand: `python -m pytest -m perf -s tests/perf/test_video_speed.py`.

MobileNetV2 224x224 (keras.applications, weights=None) converted by edgekit to int8 with float32 and with
uint8 I/O; MJPEG videos of the scikit-image photos at 640x480, 1280x720 and 1920x1080 (no downloads). Every
figure comes from one run of tests/perf/video_speed.py (no TensorFlow loaded, as on a device), variants
interleaved, medians of three rounds. Each acceptance line is printed with its numbers, then asserted. The
floors against `edgekit bench`'s invoke-bound rate hold where decoding has a core of its own (the issue's
premise): with as many interpreter threads as cores the figures are printed, not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import PHOTOS, make_video

pytestmark = pytest.mark.perf

SIZES = {"640x480": (640, 480), "1280x720": (1280, 720), "1920x1080": (1920, 1080)}
CORES = len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory) -> dict[str, str]:
    import keras

    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe, Preprocessing

    folder = tmp_path_factory.mktemp("mobilenet")
    keras.utils.set_random_seed(0)
    keras.applications.MobileNetV2(input_shape=(224, 224, 3), weights=None).save(folder / "mnv2.keras")
    out = {}
    for io in ("float32", "uint8"):
        path = folder / f"mnv2.int8.{io}.tflite"
        convert(ConvertRecipe(model=folder / "mnv2.keras", mode="int8", io=io, calib=PHOTOS, output=path,
                              preprocessing=Preprocessing(mean=(127.5,), std=(127.5,))))
        out[io] = str(path)
    return out


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, str]:
    import cv2
    import skimage.data

    folder = tmp_path_factory.mktemp("videos")
    photos = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee(), skimage.data.rocket()]
    out = {}
    for name, size in SIZES.items():
        scaled = [cv2.resize(p, size, interpolation=cv2.INTER_AREA) for p in photos]
        frames = [np.roll(scaled[(i // 30) % len(scaled)], 4 * i, axis=1) for i in range(300)]
        out[name] = str(make_video(folder / f"cam{name}.avi", frames))
    return out


def test_video_runs_at_the_interpreters_pace(mobilenet, videos):
    script = Path(__file__).with_name("video_speed.py")
    out = subprocess.run([sys.executable, str(script), json.dumps(mobilenet), json.dumps(videos), "3"],
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    med = {k: float(np.median([_fps(v) for v in vs])) for k, vs in got.items()}
    lines, failed = [], []

    def check(name: str, value: float, floor: float, ceiling: float | None = None) -> None:
        ok = value >= floor and (ceiling is None or value <= ceiling)
        lines.append(f"{'met ' if ok else 'MISS'} {name}: {value:.3f} (floor {floor}"
                     f"{'' if ceiling is None else f', ceiling {ceiling}'})")
        if not ok:
            failed.append(name)

    for io in ("float32", "uint8"):
        for t in (1, 2):
            key = f"{io}/t{t}"
            run, serial = med[f"run/{key}/640x480"], med[f"serial/{key}/640x480"]
            bench_p50 = float(np.median([b["p50"] for b in got[f"bench/{key}"]]))
            run_p50 = float(np.median([r["latency_ms"]["p50"] for r in got[f"run/{key}/640x480"]]))
            check(f"640x480 {key} run / serial ({run:.0f} / {serial:.0f} FPS)", run / serial, 1.10)
            if CORES > t:  # the invoke-bound rate needs a core the interpreter leaves to the decoder
                check(f"640x480 {key} run / bench rate ({run:.0f} / {med[f'bench/{key}']:.0f} FPS)",
                      run / med[f"bench/{key}"], 0.90)
                check(f"640x480 {key} run invoke p50 / bench p50 ({run_p50:.2f} / {bench_p50:.2f} ms)",
                      run_p50 / bench_p50, 0.95, 1.05)
            else:
                lines.append(f"n/a  640x480 {key}: {CORES} cores, all taken by the interpreter's {t} threads, none "
                             f"left to decode: run / bench rate {run / med[f'bench/{key}']:.3f} ({run:.0f} / "
                             f"{med[f'bench/{key}']:.0f} FPS), invoke p50 / bench p50 {run_p50 / bench_p50:.3f} "
                             f"({run_p50:.2f} / {bench_p50:.2f} ms)")
            pi = med[f"pi/{key}/640x480"]
            check(f"640x480 {key} Pi app / serial ({pi:.0f} / {serial:.0f} FPS)", pi / serial, 1.10)
        for size in ("1280x720", "1920x1080"):
            run, serial = med[f"run/{io}/t1/{size}"], med[f"serial/{io}/t1/{size}"]
            check(f"{size} {io}/t1 run / serial ({run:.0f} / {serial:.0f} FPS)", run / serial, 1.10)
    bounds = {k: [r["bound"] for r in v] for k, v in got.items() if k.startswith("run/")}
    print("\n" + "\n".join(lines) + f"\nbounds: {json.dumps(bounds)}\nraw: {json.dumps(got)}")
    assert not failed, f"{len(failed)} of {len(lines)} floors missed on this machine"


def _fps(value) -> float:
    if isinstance(value, dict):
        return float(value["fps"])
    return float(value)
