"""`edgekit run`: a model over frames from a camera, video, image, folder or glob."""

from __future__ import annotations

import itertools
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgekit.errors import InputShapeError, MissingDependencyError, UsageError
from edgekit.runtime.model import Model
from edgekit.runtime.sources import ArraySamples, Frame, ImageFiles, Source
from edgekit.runtime.tasks import FALLBACK, TASKS, task_class, task_for
from edgekit.runtime.tasks.base import RunSettings, Task

# A batched invoke may round differently from a single one (XNNPACK picks other kernels for 16 rows: on
# aarch64 an int8 digits model's softmax differs by 2 steps of 1/256, a float32 one by 3e-9): a batch is
# the same function when every row of the first chunk has the single run's top-1 (ties within the
# tolerance excepted) and differs by at most this share of the outputs' range.
BATCH_TOLERANCE = 0.02


@dataclass
class RunSummary:
    task: str
    frames: int = 0
    seconds: float = 0.0
    latencies_ms: array = field(default_factory=lambda: array("d"))  # each frame's whole path
    source: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    interrupted: bool = False
    batch: int = 1  # frames per invoke (image folders: a resized interpreter); 1 = frame by frame
    threads: int | None = None  # interpreter threads
    invoke_ms: array = field(default_factory=lambda: array("d"))  # the interpreter's invoke alone, per frame
    age_ms: array = field(default_factory=lambda: array("d"))  # cameras, videos: capture to result
    rates: dict[str, float | None] | None = None  # FPS each stage could sustain (frame-by-frame runs)
    bound: str | None = None  # "decode-bound", "invoke-bound" or "output-bound"
    decoders: int = 1  # threads that decoded frames at once (a Motion-JPEG video decoded scaled down)
    # batched image folders: the first chunk checked against single invokes (rows, largest difference,
    # tolerance, whether it passed); a failed check is why `batch` is 1
    batch_check: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "frames": self.frames,
            "seconds": round(self.seconds, 4),
            "fps": round(self.frames / self.seconds, 2) if self.seconds > 0 else None,
            "latency_ms": _percentiles(self.invoke_ms or self.latencies_ms, (50, 90, 99)),
            "per_frame_ms": _percentiles(self.latencies_ms, (50, 90, 99)),
            "age_ms": _percentiles(self.age_ms, (50, 99)) if self.age_ms else None,
            "rates": self.rates,
            "bound": self.bound,
            "threads": self.threads,
            "decoders": self.decoders,
            "source": self.source,
            "interrupted": self.interrupted,
            "batch": self.batch,
            "batch_check": self.batch_check,
        }

    def check(self) -> None:
        """InputShapeError (exit 6) when some inputs could not be read: a run is not clean if any was skipped."""
        if self.failures:
            raise InputShapeError(f"{len(self.failures)} input(s) could not be read; first: {self.failures[0]}")


def _percentiles(ms, points: tuple[int, ...]) -> dict[str, float]:
    values = np.array(ms, np.float64) if len(ms) else np.zeros(1)
    out = {"mean": round(float(values.mean()), 4)}
    out.update({f"p{p}": round(float(np.percentile(values, p)), 4) for p in points})
    return out


def open_model(model: str | Path, *, threads: int | Literal["auto"] | None = None, delegate: str | None = None,
               probe: bool | None = None) -> Model:
    """The model `edgekit run` uses: probed in a child process first unless its bytes were probed before
    (`probe=True`: always, False: never; see Model), loaded with all cores unless `threads` says otherwise;
    "auto" leaves one core to the frame decoder."""
    from edgekit.runtime.stream import auto_threads
    from edgekit.runtime.timing import resolve_threads

    return Model(model, num_threads=auto_threads() if threads == "auto" else resolve_threads(threads),
                 delegate=delegate, probe=probe)


def make_task(model: Model, task: str | None, **options: Any) -> Task:
    """The task `task` (None: the one the model was built for, or the one its options pick) of TASKS, built
    with its own run options; an option given (not None) that the task does not take is a UsageError."""
    given = [name for name, v in options.items() if v is not None]
    task = task or _chosen_by(given) or task_for(model)
    if task not in TASKS:
        raise UsageError(f"must be one of {', '.join(TASKS)}", param="task")
    cls = task_class(task)
    foreign = [name for name in given if name not in cls.options]
    if foreign:
        owners = " or ".join(f"`task={n}`" for n in TASKS if set(foreign) & set(task_class(n).options))
        raise UsageError(f"{', '.join(f'`{n}`' for n in foreign)} {'is' if len(foreign) == 1 else 'are'} for "
                         f"{owners}, this run is `task={task}`")
    return cls.for_run(model, **{name: options.get(name) for name in cls.options})


def _chosen_by(given: list[str]) -> str | None:
    """The first task of TASKS that one of the options given picks (`decode` picks detect)."""
    return next((n for n in TASKS if set(given) & set(task_class(n).chosen_by)), None)


def make_infer(task: Task, settings: RunSettings) -> Callable[[Frame], list]:
    """frame -> results (objects with `.to_dict()` for JSON and `.to_text()`). Uses `frame.input` when the
    source already encoded the frame."""
    infer = task.infer
    return lambda f: infer(f, settings)


# Opens and closes a window in a child process: OpenCV builds with a Qt or GTK GUI (Debian's python3-opencv)
# abort the whole process when there is no display, where a headless build raises cv2.error.
_WINDOW_PROBE = """
import cv2
try:
    cv2.namedWindow("edgekit")
    cv2.destroyWindow("edgekit")
except cv2.error:
    raise SystemExit(3)
"""
NO_GUI = "`show` needs an OpenCV build with GUI support and a display (pip install opencv-python)"


def check_display(timeout: float = 60.0) -> None:
    """MissingDependencyError (exit 9) unless this OpenCV can open a window here: tried in a child process
    first, so a GUI toolkit that aborts for want of a display takes only the child with it."""
    import subprocess
    import sys

    try:
        probe = subprocess.run([sys.executable, "-c", _WINDOW_PROBE], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise MissingDependencyError(f"opening a window took over {timeout:.0f} s; is the display reachable?",
                                     param="show") from None
    if probe.returncode == 3:
        raise MissingDependencyError(NO_GUI)
    if probe.returncode != 0:
        why = next((ln.strip() for ln in probe.stderr.splitlines() if ln.strip()), f"exit {probe.returncode}")
        raise MissingDependencyError(f"this OpenCV cannot open a window here ({why[:200]}): run where a display "
                                     "is (DISPLAY or WAYLAND_DISPLAY set), or without `show`", param="show")
    import cv2

    try:
        cv2.namedWindow("edgekit")
    except cv2.error:
        raise MissingDependencyError(NO_GUI) from None


def run_stream(model: Model, source: Source, *, task: str | None = None, top_k: int = 1,
               threshold: float = 0.5, max_frames: int | None = None, save_dir: Path | None = None,
               force: bool = False, show: bool = False,
               on_result: Callable[[Frame, list, float], None] | None = None, batch: int = 16,
               decode: str | None = None, anchors: str | Path | None = None, iou: float | None = None,
               background: bool | None = None, stop: Callable[[], bool] | None = None,
               full_frames: bool | None = None) -> RunSummary:
    """Run the model on every frame; returns the summary. The source is always closed.
    `decode`, `anchors`, `iou` and `background` choose how detections are decoded (see `Detector`).
    `stop` is asked after each delivered frame: True ends the run there, as interrupted. `on_result`
    runs on the caller's thread while the next frames are decoded and inferred; a frame's image is a reused
    buffer, valid during the call (copy it to keep it).

    Image files are classified `batch` at a time through a second interpreter resized to take them
    together (the same numbers, checked on the first chunk; fewer calls into the interpreter). Cameras,
    videos and everything else run frame by frame through `runtime.stream` (decode, invoke and output
    overlapped on three threads), where latency matters more than throughput.

    `full_frames` False lets a Motion-JPEG video decode at the smallest of libjpeg-turbo's scales (1/8, 1/4,
    3/8 ...) that covers the model's input (`on_result` then gets those frames; boxes stay in pixels of the
    whole frame). None does the same; frames that are drawn (`save_dir`, `show`) are always whole."""
    if max_frames is not None and max_frames < 1:
        raise UsageError(f"must be at least 1, got {max_frames}", param="max_frames")
    if isinstance(source, ArraySamples):
        return run_samples(model, source, task=task, top_k=top_k, max_frames=max_frames, on_result=on_result,
                           stop=stop, drawn=save_dir is not None or show or decode is not None)
    if batch < 1:
        raise UsageError(f"must be at least 1, got {batch}", param="batch")
    if top_k < 1:
        raise UsageError(f"must be at least 1, got {top_k}", param="top_k")
    runner = make_task(model, task, decode=decode, anchors=anchors, iou=iou, background=background)
    settings = RunSettings(top_k=top_k, threshold=threshold)
    summary = RunSummary(runner.name, threads=model.num_threads)
    if save_dir is not None:
        if save_dir.exists() and not save_dir.is_dir():
            raise UsageError(f"{save_dir} is a file; give a folder", param="save_dir")
        save_dir.mkdir(parents=True, exist_ok=True)
    if show:
        check_display()
    deliver = _deliverer(summary, runner.annotate, on_result, save_dir, force, show, stop)
    batched = None
    if batch > 1 and runner.batches and isinstance(source, ImageFiles):
        batched = model.batch_interpreter(batch)
        if batched is not None and source.transform is None:
            source.transform = runner.encode_image  # encode in the reader thread, off the inference path
    limit = max_frames or 0
    import cv2  # noqa: F401 - imported (~20 ms) before the clock starts: the rate is the frames', not Python's

    started = time.perf_counter()
    try:
        with source:
            if batched is not None:
                _run_batched(runner, settings, batched, source, batch, limit, deliver, summary)
            else:
                full = bool(full_frames) or save_dir is not None or show  # drawn frames are whole ones
                _run_streamed(runner, settings, source, limit, deliver, summary, full)
    except KeyboardInterrupt:
        summary.interrupted = True  # Ctrl-C ends a camera run: the summary is still wanted
    finally:
        summary.seconds = time.perf_counter() - started
        summary.frames = len(summary.latencies_ms)
        summary.source = source.stats.to_dict()
        summary.failures = list(source.stats.failures)
    return summary


def run_samples(model: Model, source: ArraySamples, *, task: str | None = None, top_k: int = 1,
                max_frames: int | None = None, on_result: Callable[[Frame, list, float], None] | None = None,
                stop: Callable[[], bool] | None = None, drawn: bool = False) -> RunSummary:
    """Every sample of a .npy/.npz through the model, one invoke each (`run_stream` for array sources): the
    one sample reader fills each input (by input name, or `x` for one input; integer inputs keep their ids,
    uint8 images go through the input's preprocessing), open sizes take the samples' size. Classifiers give
    their top-k classes, anything else its outputs (`task=raw`): the model's task where it takes samples,
    else FALLBACK; a frame's `image` is empty."""
    from edgekit.runtime.samples import SampleData, Slot

    if drawn:  # run_stream's save_dir, show or decode
        raise UsageError(f"{source.path}: array samples have no image to draw or detect in; drop `save_dir`, "
                         "`show` and `decode`")
    if top_k < 1:
        raise UsageError(f"must be at least 1, got {top_k}", param="top_k")
    takes = [name for name in TASKS if task_class(name).samples]
    task_name = task or task_for(model)
    if task is None and task_name not in takes:
        task_name = FALLBACK  # a detector's outputs, say: shown raw
    if task_name not in takes:
        why = f"; `task={task_name}` reads images" if task_name in TASKS else ""
        raise UsageError(f"array samples run {' or '.join(f'`task={n}`' for n in takes)}{why}", param="task")
    results_of = task_class(task_name).sample_results
    settings = RunSettings(top_k=top_k)
    slots = [Slot(t.name, (None, *(None if s < 0 else d for d, s in zip(t.shape[1:], t.shape_signature[1:]))),
                  t.dtype if np.issubdtype(t.dtype, np.integer) and not t.quantized else np.dtype(np.float32),
                  _image_spec(model, t)) for t in model.inputs]
    prepared = SampleData.open(source.path, param="source").for_inputs(slots)
    summary = RunSummary(task_name, threads=model.num_threads)
    deliver = _deliverer(summary, None, on_result, None, False, False, stop)
    names, empty = [o.name for o in model.outputs], np.zeros((0, 0), np.uint8)
    count = len(prepared) if max_frames is None else min(max_frames, len(prepared))
    started = time.perf_counter()
    try:
        for i in range(count):
            began = time.perf_counter()
            got = model.predict({n: x[i:i + 1] for n, x in zip(prepared.names, prepared.inputs)})
            outputs = [got[n] for n in names] if isinstance(got, dict) else [got]
            ms = 1000 * (time.perf_counter() - began)
            results = results_of(model, outputs, settings)
            deliver(Frame(empty, i, time.monotonic(), f"{source.path.name}[{i}]"), results, ms, ms)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        summary.seconds = time.perf_counter() - started
        summary.frames = len(summary.latencies_ms)
        summary.source = source.stats.to_dict()
    return summary


def _image_spec(model: Model, info):
    """How uint8 images in an array become input `info`: for an image input of fixed size, else None
    (the arrays are the input's values)."""
    if len(info.shape) != 4 or info.shape[-1] not in (1, 3) or any(s < 0 for s in info.shape_signature[1:]):
        return None
    return model.preprocessing_of(info)[0]


def _deliverer(summary: RunSummary, annotate: Callable[[np.ndarray, list], np.ndarray] | None, on_result,
               save_dir: Path | None, force: bool, show: bool, stop) -> Callable[..., None]:
    """deliver(frame, results, ms, invoke_ms, age_ms): count the frame, hand it to `on_result`, draw it
    (`annotate`: the task's) or save it, and end the run (KeyboardInterrupt) when `stop` says so."""
    from edgekit.files import atomic_write_bytes

    draw = annotate if save_dir is not None or show else None
    latencies, invokes, ages = summary.latencies_ms, summary.invoke_ms, summary.age_ms

    def deliver(frame: Frame, results: list, ms: float, invoke_ms: float, age_ms: float | None = None) -> None:
        latencies.append(ms)
        invokes.append(invoke_ms)
        if age_ms is not None:
            ages.append(age_ms)
        if on_result is not None:
            on_result(frame, results, ms)
        if draw is not None:
            _emit(frame, draw(frame.image, results), save_dir, force, show, atomic_write_bytes)
        if stop is not None and stop():  # a Ctrl-C the caller caught: end here, at a frame boundary
            raise KeyboardInterrupt

    return deliver


def _run_streamed(runner: Task, settings: RunSettings, source: Source, limit: int, deliver, summary: RunSummary,
                  full_frames: bool = True) -> None:
    """Frame by frame through the task's FrameStream: decode, invoke and delivery on three threads."""
    from edgekit.runtime.stream import bound

    stream = runner.run_stream(source, settings, full_frames)
    present = runner.present
    ages = not isinstance(source, ImageFiles)  # glass-to-result: cameras and videos
    frames = iter(stream)
    try:
        for count, (frame, results) in enumerate(frames, 1):
            results = present(results)
            deliver(frame, results, stream.frame_ms[-1], stream.invoke_ms[-1], stream.age_ms[-1] if ages else None)
            if count == limit:
                break
    finally:
        frames.close()
        summary.rates = stream.rates()
        summary.bound = bound(summary.rates)
        summary.decoders = stream.decoding


def _run_batched(runner: Task, settings: RunSettings, batched, source: Source, batch: int, limit: int, deliver,
                 summary: RunSummary) -> None:
    """Image files `batch` per invoke; frame by frame (on the caller's thread) when batching gave a chunk back."""
    frames = iter(source)
    summary.batch = batch
    pending = _infer_in_chunks(runner, settings, batched, frames, batch, limit, deliver, time.perf_counter, summary)
    if not pending:
        return
    summary.batch = 1
    infer = make_infer(runner, settings)
    clock = time.perf_counter
    for frame in itertools.chain(pending, frames):
        t0 = clock()
        results = infer(frame)
        ms = (clock() - t0) * 1e3
        deliver(frame, results, ms, ms)
        if len(summary.latencies_ms) == limit:
            break


def _infer_in_chunks(runner: Task, settings: RunSettings, interp, frames, size: int, limit: int, deliver,
                     clock, summary: RunSummary) -> list[Frame]:
    """Infer `size` frames per invoke (the task's `rows` of the first output); each frame is charged its share
    of the chunk's time. The first chunk is also run frame by frame (`batch_agrees`): if the answers differ,
    that chunk comes back undelivered and the caller goes on frame by frame. Returns [] when every frame was
    delivered."""
    model = runner.model
    info = model.inputs[0]
    stacked = np.zeros((size,) + tuple(info.shape[1:]), info.dtype)
    checked = False
    done = 0
    while not limit or done < limit:
        chunk = list(itertools.islice(frames, size if not limit else min(size, limit - done)))
        if not chunk:
            break
        t0 = clock()
        for i, frame in enumerate(chunk):
            stacked[i] = frame.input[0] if frame.input is not None else runner.encode_image(frame.image)[0]
        t1 = clock()
        raw = model.invoke_one(stacked, interp)[0]
        invoke_ms = (clock() - t1) * 1e3 / len(chunk)
        results = runner.rows(raw[: len(chunk)], settings)
        ms = (clock() - t0) * 1e3 / len(chunk)
        if not checked:
            checked = True
            single = np.concatenate([model.invoke_one(stacked[i: i + 1])[0] for i in range(len(chunk))])
            summary.batch_check = batch_agrees(single, raw[: len(chunk)], model.outputs[0])
            if not summary.batch_check["ok"]:
                return chunk
        for frame, result in zip(chunk, results):
            deliver(frame, result, ms, invoke_ms)
        done += len(chunk)
    return []


def batch_agrees(single: np.ndarray, batched: np.ndarray, info) -> dict[str, Any]:
    """Whether rows of a batched invoke are the single invokes' answers up to rounding (BATCH_TOLERANCE of
    the range, in dequantized units for a quantized output), with the same top-1 unless the single run's
    top two are within that tolerance."""
    def values(x):
        x = x.reshape(len(x), -1).astype(np.float64)
        return (x - info.zero_point) * info.scale if info.quantized else x

    a, b = values(single), values(batched)
    span = float(a.max() - a.min()) if a.size else 0.0
    tolerance = BATCH_TOLERANCE * span if span > 0 else 0.0
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    ok = bool(np.isfinite(b).all()) and diff <= tolerance
    if ok and a.shape[1] > 1:
        top = np.argmax(a, 1)
        moved = np.argmax(b, 1) != top
        ordered = np.sort(a, 1)
        ok = not (moved & (ordered[:, -1] - ordered[:, -2] > tolerance)).any()
    return {"rows": len(a), "max_difference": diff, "tolerance": tolerance, "ok": ok}


def _emit(frame: Frame, bgr: np.ndarray, save_dir: Path | None, force: bool, show: bool, write) -> None:
    import cv2

    if save_dir is not None:
        # the frame index keeps names unique: a folder may hold a/x.png and b/x.png
        name = f"{frame.index:06d}_{Path(frame.name).stem}"
        ok, data = cv2.imencode(".png" if max(bgr.shape[:2]) > 65500 else ".jpg", bgr)
        if not ok:
            raise InputShapeError(f"{frame.name}: the annotated frame could not be encoded for --save-dir")
        write(save_dir / f"{name}.{'png' if max(bgr.shape[:2]) > 65500 else 'jpg'}", data.tobytes(), force=force)
    if show:
        cv2.imshow("edgekit", bgr)
        if cv2.waitKey(1) & 0xFF == ord("q"):
            raise KeyboardInterrupt
