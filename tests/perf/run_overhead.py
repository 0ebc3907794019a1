"""Per-frame cost of `edgekit run` on an image folder against a bare decode + invoke loop.

The baseline knows nothing of edgekit: its own `ai_edge_litert` interpreter loaded from the file,
cv2.imread + resize + set_tensor + invoke + get_tensor per file, serially. Each round runs every variant
once, the order reversed every other round so that drift falls on all of them alike.

Run in its own process (no TensorFlow loaded, as on a device):
    python tests/perf/run_overhead.py MODEL.tflite FOLDER [ROUNDS]
Prints one JSON line: microseconds per frame for each variant (medians over the rounds) and the ratios.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from ai_edge_litert.interpreter import Interpreter


def bare_loop(model_path: str, files: list[str]):
    """The reference: what one would write by hand with LiteRT and OpenCV, no edgekit involved."""
    interp = Interpreter(model_path=model_path, num_threads=1)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    buf = np.zeros(inp["shape"], inp["dtype"])
    view = buf[0] if inp["shape"][-1] != 1 else buf[0, :, :, 0]
    h, w = (int(d) for d in inp["shape"][1:3])
    index, out_index = inp["index"], out["index"]

    def run():
        for f in files:
            img = cv2.imread(f, cv2.IMREAD_UNCHANGED)
            if img.shape[:2] != (h, w):
                img = cv2.resize(img, (w, h))
            view[...] = img
            interp.set_tensor(index, buf)
            interp.invoke()
            interp.get_tensor(out_index)

    return run


def main(model_path: str, folder: str, rounds: int = 15) -> dict:
    from edgekit.run import run_stream
    from edgekit.runtime import ImageFiles, Model

    files = sorted(str(p) for p in Path(folder).rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    model = Model(model_path, num_threads=1)
    variants = {
        "baseline": bare_loop(model_path, files),
        "run": lambda: run_stream(model, ImageFiles(files), top_k=1),
        "run_prefetch": lambda: run_stream(model, ImageFiles(files, prefetch=True), top_k=1),
        "run_serial": lambda: run_stream(model, ImageFiles(files, prefetch=False), top_k=1),
    }
    for fn in variants.values():  # warm caches, threads and the batch interpreter before timing
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for k in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            t0 = time.perf_counter()
            variants[k]()
            times[k].append(time.perf_counter() - t0)
    per = {k: float(np.median(v)) / len(files) * 1e6 for k, v in times.items()}
    return {"frames": len(files), "us_per_frame": {k: round(v, 2) for k, v in per.items()},
            "ratio": {k: round(per[k] / per["baseline"], 3) for k in per if k != "baseline"}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))))
