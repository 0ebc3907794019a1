"""`edgekit run` on camera-size video against a plain serial loop and `edgekit bench`, in one process.

The serial loop knows nothing of edgekit (issue 16): its own LiteRT interpreter, cv2.VideoCapture.read ->
cv2.resize -> cvtColor -> normalise -> set_tensor -> invoke -> argmax. `edgekit run` is the real CLI in a
child process (its summary's FPS, invoke p50); `edgekit bench` gives the invoke-bound rate. The Pi app is
the README's loop (Classifier + open_source + stream). Every round runs every variant once, in an order
reversed every other round; the medians of `rounds` are compared.

    python tests/perf/video_speed.py MODELS_JSON VIDEOS_JSON [ROUNDS]
Prints one JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import cv2
import numpy as np
from ai_edge_litert.interpreter import Interpreter

CLI = [sys.executable, "-m", "edgekit.cli"]


def serial_loop(model: str, video: str, threads: int, mean: float = 127.5, std: float = 127.5) -> float:
    """FPS of the plain loop."""
    interp = Interpreter(model_path=model, num_threads=threads)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    h, w = (int(d) for d in inp["shape"][1:3])
    scale, zero = inp["quantization"]
    cap = cv2.VideoCapture(video)
    frames, t0 = 0, time.perf_counter()
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        x = cv2.cvtColor(cv2.resize(frame, (w, h)), cv2.COLOR_BGR2RGB)
        x = (x.astype(np.float32) - mean) / std
        if inp["dtype"] != np.float32:
            x = np.clip(np.round(x / scale + zero), 0, 255).astype(inp["dtype"])
        interp.set_tensor(inp["index"], x[None])
        interp.invoke()
        int(interp.get_tensor(out["index"]).argmax())
        frames += 1
    cap.release()
    return frames / (time.perf_counter() - t0)


def edgekit_run(model: str, video: str, threads: int | str) -> dict:
    out = subprocess.run([*CLI, "run", model, "--source", video, "--threads", str(threads), "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["summary"]


def edgekit_bench(model: str, threads: int) -> dict:
    out = subprocess.run([*CLI, "bench", model, "--threads", str(threads), "--runs", "200", "--json", "-"],
                         capture_output=True, text=True, check=True).stdout
    row = json.loads(out)["models"][0]
    return {"p50": row["latency_ms"]["p50"], "fps": 1000.0 / row["latency_ms"]["mean"]}


def pi_app(model: str, video: str, threads: int) -> float:
    from edgekit.runtime import Classifier, open_source

    classifier = Classifier(model, num_threads=threads)
    lines = []
    t0 = time.perf_counter()
    with open_source(video) as frames:
        for frame, (best,) in classifier.stream(frames, top_k=1, full_frames=False):
            lines.append(f"{frame.index} {best.label} {best.score:.2f}")
    return len(lines) / (time.perf_counter() - t0)


def variants(models: dict[str, str], videos: dict[str, str]) -> dict:
    small = videos["640x480"]
    out = {}
    for io, model in models.items():
        for threads in (1, 2):
            key = f"{io}/t{threads}"
            out[f"serial/{key}/640x480"] = lambda m=model, t=threads: serial_loop(m, small, t)
            out[f"run/{key}/640x480"] = lambda m=model, t=threads: edgekit_run(m, small, t)
            out[f"bench/{key}"] = lambda m=model, t=threads: edgekit_bench(m, t)
            out[f"pi/{key}/640x480"] = lambda m=model, t=threads: pi_app(m, small, t)
        for size in ("1280x720", "1920x1080"):
            out[f"serial/{io}/t1/{size}"] = lambda m=model, v=videos[size]: serial_loop(m, v, 1)
            out[f"run/{io}/t1/{size}"] = lambda m=model, v=videos[size]: edgekit_run(m, v, 1)
    return out


def main(models: dict[str, str], videos: dict[str, str], rounds: int = 3) -> dict:
    todo = variants(models, videos)
    got: dict[str, list] = {k: [] for k in todo}
    for r in range(rounds):
        for k in (list(todo) if r % 2 == 0 else list(reversed(todo))):
            got[k].append(todo[k]())
    return {k: v for k, v in got.items()}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]), json.loads(sys.argv[2]), *(int(a) for a in sys.argv[3:]))))
