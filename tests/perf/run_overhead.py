"""Per-frame cost of `edgekit run` on an image folder against a bare decode + invoke loop.

Run in its own process (no TensorFlow loaded, as on a device):
    python tests/perf/run_overhead.py MODEL.tflite FOLDER [ROUNDS]
Prints one JSON line: microseconds per frame for each variant and the ratios.
"""

from __future__ import annotations

import json
import sys
import time

import cv2
import numpy as np

from edgekit.run import run_stream
from edgekit.runtime import ImageFiles, Model, image_files


def main(model_path: str, folder: str, rounds: int = 15) -> dict:
    model = Model(model_path, num_threads=1)
    files = image_files(folder)
    interp, inp, out = model.interpreter, model.inputs[0], model.outputs[0]
    buf = np.zeros(inp.shape, inp.dtype)
    view = buf[0] if inp.shape[-1] != 1 else buf[0, :, :, 0]
    h, w = inp.shape[1:3]

    def baseline():
        for f in files:
            img = cv2.imread(f, cv2.IMREAD_UNCHANGED)
            if img.shape[:2] != (h, w):
                img = cv2.resize(img, (w, h))
            view[...] = img
            interp.set_tensor(inp.index, buf)
            interp.invoke()
            interp.get_tensor(out.index)

    variants = {
        "baseline": baseline,
        "run": lambda: run_stream(model, ImageFiles(files), top_k=1),
        "run_prefetch": lambda: run_stream(model, ImageFiles(files, prefetch=True), top_k=1),
        "run_serial": lambda: run_stream(model, ImageFiles(files, prefetch=False), top_k=1),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    per = {k: float(np.median(v)) / len(files) * 1e6 for k, v in times.items()}
    return {"frames": len(files), "us_per_frame": {k: round(v, 2) for k, v in per.items()},
            "ratio": {k: round(per[k] / per["baseline"], 3) for k in per if k != "baseline"}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))))
