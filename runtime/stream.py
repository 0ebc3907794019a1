"""Frames through a model at the interpreter's pace.

Three stages, each on its own thread: a reader decodes frames (OpenCV and libjpeg-turbo release the GIL)
into a ring of preallocated slots, resizes them to the model's input size and, when the interpreter leaves it
a core, passes them through the model's lookup table (normalisation and quantisation in one pass, no float
temporaries); an inference thread copies that into the interpreter's input tensor (or looks it up into it),
invokes and reads the results; the caller's loop formats and prints. The resize and the lookup are cut into
row bands that give the same bytes as one `cv2.resize`, and whichever of the reader and the inference thread
is free takes the next band, so the work lands where a core is idle. Where frames decode independently (a
Motion-JPEG video decoded scaled down), up to one thread per core decodes at once, each frame into its own
slot, handed over in file order: a decode-bound run uses the cores the interpreter leaves idle. In steady
state a video stream allocates no frame buffer.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from array import array
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from edgekit.errors import InvokeError, one_line
from edgekit.runtime.preprocess import geometry, placement
from edgekit.runtime.sources import Frame, Source

BANDS = 8  # row bands per frame the two threads share (fewer when the sizes allow fewer)
AHEAD = 2  # frames waiting between two stages
MAX_DECODERS = 4  # threads decoding frames at once, at most (one per core)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_threads() -> int:
    """Interpreter threads for a video or camera run: every core but the one the decoder needs."""
    return max(1, cores() - 1)


def _band_rows(src_h: int, dst_h: int, count: int) -> list[tuple[int, int, int, int]]:
    """(src y0, y1, dst y0, y1) of row bands whose scale is the whole resize's: the source rows of a band
    are a whole number of output rows' worth, so each band's area weights are the whole image's."""
    g = math.gcd(src_h, dst_h)
    step = math.ceil(g / count)
    unit_in, unit_out = src_h // g, dst_h // g
    return [(i * unit_in, min(g, i + step) * unit_in, i * unit_out, min(g, i + step) * unit_out)
            for i in range(0, g, step)]


class Slot:
    """One frame in flight: the decoded image, its model-size copy, that copy through the model's lookup
    table (`encoded`, when a `lut` is given) and the resize jobs between them."""

    __slots__ = (
        "cond",
        "convert",
        "done",
        "encoded",
        "fallback",
        "frame",
        "jobs",
        "key",
        "lut",
        "next",
        "read_ms",
        "small",
    )

    def __init__(self, shape: tuple[int, ...], lut: np.ndarray | None = None):
        self.frame: Frame | None = None
        self.small = np.zeros(shape, np.uint8)
        self.lut = lut  # (1, 256, channels): normalisation and quantisation of each pixel value, in one lookup
        self.encoded = None if lut is None else np.zeros(shape, lut.dtype)
        self.jobs: list[tuple] = []
        self.key: Any = None
        self.next = self.done = 0
        self.cond = threading.Condition()
        self.read_ms = 0.0
        self.fallback = False
        self.convert: tuple | None = None  # (OpenCV code, source, buffer): gray <-> RGB before the resize

    def plan(self, image: np.ndarray, spec) -> None:
        """The resize of `image` into `small` as jobs (kept while the frame buffer and its shape stay)."""
        key = (id(image), image.shape, image.dtype)
        if key == self.key:
            return
        self.key, self.jobs, self.convert = key, [], None
        self.fallback = image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3)
        if self.fallback:
            return
        small, encoded = self.small, self.encoded if self.encoded is not None else self.small
        if image.ndim != small.ndim:  # the channel conversion comes first, as in preprocess.geometry
            self.convert = _conversion(image)
            image = self.convert[2]
        h, w = image.shape[:2]
        if (h, w) == small.shape[:2]:
            self.jobs = [(image, small, None, None, encoded)]
            return
        (y0, y1, x0, x1), (t, b, left, right), interpolation = placement(h, w, spec.height, spec.width, spec.resize)
        small[...] = 0  # letterbox: the border stays black
        if self.lut is not None:
            encoded[...] = self.lut[0, 0]  # the border's black, through the table
        src, dst, enc = image[y0:y1, x0:x1], small[t:b, left:right], encoded[t:b, left:right]
        rows = [(0, y1 - y0, 0, b - t)]
        if interpolation == _inter_area() and y1 - y0 >= b - t and x1 - x0 >= right - left:
            rows = _band_rows(y1 - y0, b - t, BANDS)
        self.jobs = [(src[a:z], dst[c:d], (right - left, d - c), interpolation, enc[c:d]) for a, z, c, d in rows]

    def start(self) -> None:
        """The frame is in: convert its channels when the model wants others (the reader's thread)."""
        if self.convert is not None:
            import cv2

            code, src, buffer = self.convert
            cv2.cvtColor(src, code, dst=buffer)
        with self.cond:
            self.next = self.done = 0

    def work(self) -> None:
        """Take and run bands until none is left (both threads call this)."""
        import cv2

        jobs, cond = self.jobs, self.cond
        while True:
            with cond:
                i = self.next
                if i >= len(jobs):
                    return
                self.next = i + 1
            src, dst, size, interpolation, encoded = jobs[i]
            if size is None:
                np.copyto(dst, src)
            else:
                cv2.resize(src, size, dst=dst, interpolation=interpolation)
            if self.lut is not None:  # the band's rows through the table, here rather than on the invoke's path
                cv2.LUT(dst, self.lut, dst=encoded)
            with cond:
                self.done += 1
                if self.done == len(jobs):
                    cond.notify_all()

    def finish(self) -> None:
        """Help with the bands left, then wait for those another thread is running."""
        self.work()
        with self.cond:
            while self.done < len(self.jobs):
                self.cond.wait()


def _conversion(image: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """RGB -> gray or gray -> RGB of `image` into a buffer of its own."""
    import cv2

    if image.ndim == 3:
        return cv2.COLOR_RGB2GRAY, image, np.empty(image.shape[:2], np.uint8)
    return cv2.COLOR_GRAY2RGB, image, np.empty(image.shape + (3,), np.uint8)


def _inter_area() -> int:
    import cv2

    return cv2.INTER_AREA


class _End:
    """Queue marker: the stage before has stopped (`error` says why, None at the end of the source)."""

    def __init__(self, error: BaseException | None = None):
        self.error = error


class _Turn:
    """File order among threads that decode at once: packets are numbered as they are taken, and the frame of
    packet n is handed over after those before it."""

    def __init__(self):
        self.taking = threading.Lock()  # around take(): one thread reads the file at a time
        self.taken = 0
        self.ended = False
        self.error: BaseException | None = None
        self._next = 0
        self._cond = threading.Condition()

    def wait(self, number: int, stop: threading.Event) -> bool:
        """Until the frames before `number` were handed over; False when the stream stops first."""
        with self._cond:
            while self._next != number:
                if stop.is_set() or self.error is not None:
                    return False
                self._cond.wait(0.1)
        return True

    def next(self) -> None:
        with self._cond:
            self._next += 1
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.error = self.error or error
            self.ended = True
            self._cond.notify_all()


class FrameStream:
    """Iterate for (frame, results) pairs of `source` through `task` (a Classifier, Detector or RawTask).

    `results(task, frame, interpreter)` reads one frame's results right after invoke, with the model's
    lock held; the interpreter's output views must not outlive it. Each frame's image is a reused
    buffer, valid until the loop asks for the next frame: copy it to keep it. Per-frame timings
    (milliseconds) accumulate in `invoke_ms`, `frame_ms` (the inference thread's whole path), `age_ms`
    (capture to result), `read_ms` (the reader's share) and `output_ms` (the caller's loop).
    `full_frames=False`: the loop needs the frames only as large as the model's input, and a source that
    can deliver them scaled down (a Motion-JPEG video) does; the results are the model's on the frame it
    was given, scaled by the same resize. Such a source is decoded by `decoders` threads at once (default:
    one per core, at most MAX_DECODERS); `decoding` says how many ran."""

    def __init__(self, task, source: Source, results: Callable[[Any, Frame, Any], list], *, ahead: int = AHEAD,
                 full_frames: bool = True, decoders: int | None = None):
        self.task, self.source, self._results = task, source, results
        # threads that decode at once where the source allows it (a Motion-JPEG video decoded scaled down)
        self.decoders = max(1, decoders if decoders is not None else min(cores(), MAX_DECODERS))
        self._decoded = [0]  # frames each decoding thread decoded (one entry per thread when several do)
        self._starving = threading.Event()
        # False: the frames need only cover the model's input (a JPEG video then decodes at a fraction of its size)
        self._min_size = None if full_frames else (task.spec.height, task.spec.width)
        self.model = task.model
        spec = task.spec
        self._shape = (spec.height, spec.width) + ((spec.channels,) if spec.channels == 3 else ())
        self._writer = _InputWriter(task)
        # the table runs with the resize, off the invoke's path, where the interpreter leaves the reader a core:
        # else the lookup's writes fight the invoke for the cores and the memory (-12 % FPS at 2 threads on 2 cores)
        spare = (self.model.num_threads or cores()) < cores()
        lut = self._writer.lut if self._writer.direct and spare else None
        self._slots: queue.Queue = queue.Queue()
        for _ in range(2 * ahead + 2 + self.decoders):  # decoders + inference + caller + both queues full
            self._slots.put(Slot(self._shape, lut))
        self._ready: queue.Queue = queue.Queue(maxsize=ahead)
        self._room = threading.BoundedSemaphore(ahead + 1)  # frames decoded ahead, with several decoders
        self._done: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self.invoke_ms, self.frame_ms, self.age_ms = array("d"), array("d"), array("d")
        self.read_ms, self.output_ms = array("d"), array("d")
        self._threads: list[threading.Thread] = []

    # -- reader ----------------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            with self.source.reading(self._min_size) as read:
                if self.decoders > 1 and hasattr(read, "take"):
                    self._decode_in_parallel(read)
                else:
                    self._read_in_turn(read)
            self._put(self._ready, _End())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._put(self._ready, _End(exc))

    def _read_in_turn(self, read) -> None:
        clock = time.perf_counter
        while (slot := self._free_slot()) is not None:
            t0 = clock()
            frame = read(None if slot.frame is None else slot.frame.image)
            if frame is None or self._stop.is_set():
                break
            self._prepare(slot, frame)
            t1 = clock()
            self._put(self._ready, slot)
            t2 = clock()
            slot.work()
            slot.read_ms = (t1 - t0 + clock() - t2) * 1e3  # waiting to hand the frame over is not reading

    def _decode_in_parallel(self, read) -> None:
        """`decoders` threads (this one and helpers) each take the next packet in turn, decode it into a slot of
        their own at the same time, and hand the frames over in file order: a decode-bound run uses the cores
        the interpreter leaves idle."""
        turn = _Turn()
        self._decoded = [0] * self.decoders
        helpers = [threading.Thread(target=self._decoder, args=(read, turn, i), daemon=True,
                                    name=f"edgekit-decoder-{i}") for i in range(1, self.decoders)]
        for t in helpers:
            t.start()
        self._decoder(read, turn)
        for t in helpers:
            t.join()
        if turn.error is not None:
            raise turn.error

    def _decoder(self, read, turn: _Turn, index: int = 0) -> None:
        """One of the threads that decode at once (index 0 is the reader thread; the others join in only while
        the interpreter waits for frames). A frame is decoded and resized whole here before it is handed over:
        once it is, another decoder may take its slot back from the pool, so this thread no longer touches it."""
        clock, counts = time.perf_counter, self._decoded
        try:
            while not self._stop.is_set() and not turn.ended:
                if index:  # a helper decodes only while the interpreter waits for frames (a decode-bound run):
                    if not self._poll(self._starving.wait, turn):  # else it would only take a core from invoke
                        return
                    self._starving.clear()
                if not self._poll(lambda timeout: self._room.acquire(timeout=timeout), turn):
                    return  # (no more frames decoded ahead than one reader keeps)
                slot = self._free_slot()
                if slot is None:
                    return
                t0 = clock()
                with turn.taking:
                    taken = None if turn.ended else read.take()
                    number = turn.taken
                    turn.taken += 1
                    turn.ended = turn.ended or taken is None
                frame = read.frame(taken, None if slot.frame is None else slot.frame.image) if taken else None
                if frame is not None:
                    self._prepare(slot, frame)
                    slot.finish()
                    slot.read_ms = (clock() - t0) * 1e3
                    counts[index] += 1
                if not turn.wait(number, self._stop):
                    return
                if frame is not None:
                    self._put(self._ready, slot)
                turn.next()
                if frame is None:
                    self._slots.put(slot)  # the end, or a packet skipped: the slot goes back unused
                    self._room.release()
        except BaseException as exc:  # noqa: BLE001 - raised by the reader thread once every decoder stopped
            turn.fail(exc)

    def _free_slot(self) -> Slot | None:
        while not self._stop.is_set():
            try:
                return self._slots.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def _poll(self, acquire: Callable[[float], bool], turn: _Turn) -> bool:
        """`acquire(timeout)` until it succeeds; False once the stream stops, the file ends or a decoder failed
        (one that failed keeps its place: the others must not wait for it)."""
        while not self._stop.is_set() and not turn.ended:
            if acquire(0.1):
                return True
        return False

    def _prepare(self, slot: Slot, frame: Frame) -> None:
        slot.frame = frame
        slot.plan(frame.image, self.task.spec)
        slot.start()

    # -- inference ---------------------------------------------------------------------------------
    def _infer(self) -> None:
        clock, writer, model = time.perf_counter, self._writer, self.model
        results = self._results
        try:
            while not self._stop.is_set():
                if self.invoke_ms and len(self._decoded) > 1 and self._ready.empty():
                    self._starving.set()  # no frame waiting (past the first): a helper decodes the next one
                slot = self._ready.get()
                if isinstance(slot, _End):
                    self._put(self._done, slot)
                    return
                if len(self._decoded) > 1:  # checked once a frame came: set before any is handed over
                    self._room.release()  # the decoders may take one more packet
                t0 = clock()
                slot.finish()
                with model.lock:
                    interp = writer.write(slot)
                    t1 = clock()
                    writer.invoke(interp)
                    t2 = clock()
                    found = results(self.task, slot.frame, interp)
                done = clock()
                timing = ((t2 - t1) * 1e3, (done - t0) * 1e3, (time.monotonic() - slot.frame.timestamp) * 1e3)
                self._put(self._done, (slot, found, timing))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._put(self._done, _End(exc))

    def _put(self, q: queue.Queue, item) -> None:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # -- caller ------------------------------------------------------------------------------------
    def __iter__(self) -> Generator[tuple[Frame, list], None, None]:
        self._threads = [threading.Thread(target=self._read, daemon=True, name="edgekit-reader"),
                         threading.Thread(target=self._infer, daemon=True, name="edgekit-infer")]
        for t in self._threads:
            t.start()
        clock, held = time.perf_counter, None
        try:
            while True:
                item = self._done.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                slot, found, (invoke_ms, frame_ms, age_ms) = item
                if held is not None:
                    self._slots.put(held)  # the frame before is the caller's no more
                held = slot
                self._record(slot.read_ms, invoke_ms, frame_ms, age_ms)
                t0 = clock()
                yield slot.frame, found
                self.output_ms.append((clock() - t0) * 1e3)
        finally:
            self.close()

    def _record(self, read_ms: float, invoke_ms: float, frame_ms: float, age_ms: float) -> None:
        self.read_ms.append(read_ms)
        self.invoke_ms.append(invoke_ms)
        self.frame_ms.append(frame_ms)
        self.age_ms.append(age_ms)

    def close(self) -> None:
        """Stop both threads; frames in flight are dropped."""
        self._stop.set()
        for q in (self._ready, self._done):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for q in (self._ready, self._done):  # the inference thread, or a caller on another thread, may be
            try:  # waiting for a frame that will not come
                q.put_nowait(_End())
            except queue.Full:  # (or one came after all: both look at the stop after that one)
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)

    def rates(self) -> dict[str, float | None]:
        """Frames per second each stage could sustain on its own, from its busy time per frame: the reader's
        decoding and its share of the resize, the interpreter's invoke, the caller's loop."""
        def rate(ms: array) -> float | None:
            mean = sum(ms) / len(ms) if len(ms) else 0.0
            return round(1000.0 / mean, 1) if mean > 0 else None

        decode, counts = rate(self.read_ms), self._decoded
        together = sum(counts) / max(counts) if max(counts) else 1.0  # frames per frame of the busiest decoder
        return {"decode": decode and round(decode * together, 1), "invoke": rate(self.invoke_ms),
                "output": rate(self.output_ms)}

    @property
    def decoding(self) -> int:
        """Threads that decoded frames: helpers join in only while the interpreter waits for frames."""
        return max(1, sum(1 for count in self._decoded if count))


def bound(rates: dict[str, float | None]) -> str | None:
    """"decode-bound", "invoke-bound" or "output-bound": the stage with the lowest sustainable rate."""
    known = {k: v for k, v in rates.items() if v}
    return f"{min(known, key=known.__getitem__)}-bound" if known else None


class _InputWriter:
    """The model-size image -> the interpreter's input tensor, in place: the slot's bands already went through
    the encoder's lookup table, so this is one copy; or, where LiteRT's tensor view cannot be used (a delegate,
    another input size), the encoder and set_tensor."""

    def __init__(self, task):
        model = task.model
        self.task = task
        info = model.inputs[0]
        table = task.encode.table
        shape = (task.spec.height, task.spec.width, task.spec.channels)
        self.direct = (not model.delegate.delegates and tuple(info.shape[1:]) == shape and info.shape[0] == 1
                       and table.dtype in (np.uint8, np.int8, np.float32))
        self.lut = np.ascontiguousarray(table[..., :1] if task.spec.channels == 1 else table)
        self.interp = model.runner
        self.index = info.index
        self.gray = task.spec.channels == 1

    def write(self, slot: Slot):
        """Writes the frame's input (the model's lock held); returns the interpreter to invoke."""
        import cv2

        if slot.fallback:
            assert slot.frame is not None  # the reader filled the slot before it was written (for the type checker)
            np.copyto(slot.small.reshape(-1), geometry(slot.frame.image, self.task.spec).reshape(-1))
        if not self.direct:
            x = self.task.encode(slot.small)
            interp = self.task.model.interpreter_for(x.shape)
            interp.set(self.index, x)
            return interp
        view = self.interp.view(self.index)
        into = view[0, :, :, 0] if self.gray else view[0]
        if slot.fallback or slot.encoded is None:
            cv2.LUT(slot.small, self.lut, dst=into)
        else:
            np.copyto(into, slot.encoded)  # the reader's bands went through the table already
        del view, into  # LiteRT refuses to invoke while a view of its tensors is alive
        return self.interp

    def invoke(self, interp) -> None:
        try:
            interp.invoke()
        except (RuntimeError, ValueError) as exc:
            raise InvokeError(f"{self.task.model.where}: inference failed: {one_line(exc)}") from None
