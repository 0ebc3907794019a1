"""Frame sources: image files, folders and globs, video files, cameras (OpenCV or picamera2).

Cameras are read in a capture thread into a buffer that holds only the newest frame (memory stays
bounded, stale frames are dropped and counted). A read that stalls times out; a lost camera is
reopened with exponential backoff and, after `max_reconnects` failed tries in a row, the source
raises SourceDisconnectedError instead of hanging.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from edgekit.errors import InputShapeError, MissingDependencyError, SourceDisconnectedError, UsageError, one_line
from edgekit.runtime.datasets import IMAGE_SUFFIXES, image_files
from edgekit.runtime.preprocess import read_image, to_rgb_or_gray


class Frame(NamedTuple):
    image: np.ndarray  # uint8, HxW gray or HxWx3 RGB
    index: int  # type: ignore[assignment]  # the public field's name; it shadows tuple.index(), unused here
    timestamp: float  # time.monotonic() when captured
    name: str
    input: np.ndarray | None = None  # the model input, when the source was given a `transform`
    size: tuple[int, int] | None = None  # (h, w) of the whole frame when `image` was decoded scaled down

    @property
    def whole_size(self) -> tuple[int, int]:
        """(h, w) of the frame as captured: results in pixels (boxes) are in these."""
        return self.size if self.size is not None else self.image.shape[:2]


@dataclass
class SourceStats:
    captured: int = 0
    delivered: int = 0
    dropped: int = 0
    reconnects: int = 0
    stalls: int = 0
    errors: int = 0
    failures: list[str] = field(default_factory=list)
    decoded: str | None = None  # "320x240 of 640x480 (JPEG at 1/2)" when frames come scaled down

    def to_dict(self) -> dict[str, Any]:
        return {"captured": self.captured, "delivered": self.delivered, "dropped": self.dropped,
                "reconnects": self.reconnects, "stalls": self.stalls, "errors": self.errors,
                "decoded": self.decoded}


class Source:
    """Iterate for frames; use as a context manager so cameras are always released."""

    name = "source"

    def __init__(self) -> None:
        self.stats = SourceStats()

    def __iter__(self) -> Iterator[Frame]:
        raise NotImplementedError

    @contextlib.contextmanager
    def reading(self, min_size: tuple[int, int] | None = None) -> Iterator[Callable[[np.ndarray | None], Frame | None]]:
        """`read(buffer)` -> the next frame, or None at the end. Sources that can decode into `buffer` (the
        image of a frame the caller is done with) do, so that a steady stream allocates no image; the
        others ignore it. With `min_size` (height, width) the caller needs no more than that: a source may
        deliver its frames scaled down to no less in either dimension (a JPEG video decodes at 1/8, 1/4, 3/8 ...
        of its size for a fraction of the work; the frame's `size` is then the whole one); without, frames
        come as captured."""
        frames = iter(self)
        try:
            yield lambda buffer: next(frames, None)
        finally:
            close = getattr(frames, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        pass

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ImageFiles(Source):
    """Image files in order, decoded ahead in a reader thread (OpenCV decodes without the GIL, so
    decoding overlaps inference) and handed over in small chunks; at most `ahead` chunks wait in
    memory. A missing or corrupt file goes to `on_error` (default: raise)."""

    def __init__(self, paths: Sequence[str | Path], *, on_error: Callable[[Path, Exception], None] | None = None,
                 name: str = "images", prefetch: bool = True, chunk: int = 16, ahead: int = 4,
                 transform: Callable[[np.ndarray], np.ndarray] | None = None):
        super().__init__()
        self.transform = transform  # e.g. a task's encoder: runs in the reader thread too
        self.paths = [os.fspath(p) for p in paths]
        self.on_error = on_error
        self.name = name
        self.prefetch = prefetch and len(self.paths) > 1
        self.chunk = max(1, chunk)
        self.ahead = max(1, ahead)
        self._stop = threading.Event()

    def _decode(self, path: str) -> tuple[np.ndarray | None, np.ndarray | None, Exception | None, float]:
        try:
            image = read_image(path)
            x = self.transform(image) if self.transform is not None else None
            return image, x, None, time.monotonic()
        except InputShapeError as exc:
            return None, None, exc, time.monotonic()
        except Exception as exc:  # OpenCV out of memory on a decompression bomb, and the like  # noqa: BLE001
            error = InputShapeError(f"{path}: cannot decode ({type(exc).__name__}: {one_line(exc)})")
            return None, None, error, time.monotonic()

    def _chunks(self) -> Iterator[list[tuple]]:
        paths, n = self.paths, self.chunk
        if not self.prefetch:
            for i in range(0, len(paths), n):
                yield [self._decode(p) for p in paths[i : i + n]]
            return
        q: queue.Queue = queue.Queue(maxsize=self.ahead)

        def reader() -> None:
            try:
                for i in range(0, len(paths), n):
                    if self._stop.is_set():
                        return
                    q.put([self._decode(p) for p in paths[i : i + n]])
            finally:
                q.put(None)  # the consumer always gets the end of the stream

        thread = threading.Thread(target=reader, daemon=True, name="edgekit-image-reader")
        thread.start()
        try:
            while (item := q.get()) is not None:
                yield item
        finally:
            self._stop.set()
            while thread.is_alive():  # unblock a reader waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.01)

    def __iter__(self) -> Iterator[Frame]:
        stats, sep, index = self.stats, os.sep, 0
        paths = self.paths
        for chunk in self._chunks():
            for image, x, error, stamp in chunk:
                path = paths[index]
                index += 1
                if error is not None:
                    stats.errors += 1
                    stats.failures.append(str(error))
                    if self.on_error is None:
                        raise error
                    self.on_error(Path(path), error)
                    continue
                stats.captured += 1
                stats.delivered += 1
                yield Frame(image, index - 1, stamp, path.rpartition(sep)[2], x)

    def close(self) -> None:
        self._stop.set()


class VideoFile(Source):
    """Every frame of a video file, in order."""

    def __init__(self, path: Path, *, opener: Callable[[str], Any] | None = None):
        super().__init__()
        self.path = Path(path)
        self.name = str(path)
        self._opener = opener or _cv2_capture

    def __iter__(self) -> Iterator[Frame]:
        with self.reading() as read:
            while (frame := read(None)) is not None:
                yield frame

    @contextlib.contextmanager
    def reading(self, min_size: tuple[int, int] | None = None) -> Iterator[Callable[[np.ndarray | None], Frame | None]]:
        scaled = None
        if min_size is not None and self._opener is _cv2_capture:
            scaled = _ScaledJpeg.open(self.path, min_size, self.stats)
        if scaled is not None:
            try:
                yield scaled  # read(buffer) as below, and take() + frame() for several threads decoding
            finally:
                scaled.cap.release()
            return
        cap = self._opener(str(self.path))
        count = [0]
        stem, stats = self.path.stem, self.stats
        into = type(cap).__module__.startswith("cv2")  # OpenCV decodes into a buffer; other openers may not

        def read(buffer: np.ndarray | None) -> Frame | None:
            ok, image = cap.read(buffer) if into and buffer is not None else cap.read()
            if not ok or image is None:
                if count[0] == 0:
                    raise InputShapeError(f"{self.path}: no frames could be decoded")
                return None
            i = count[0]
            count[0] = i + 1
            stats.captured += 1
            stats.delivered += 1
            return Frame(_bgr_to_rgb(image), i, time.monotonic(), f"{stem}_{i:06d}")

        try:
            if not cap.isOpened():
                raise InputShapeError(f"{self.path}: cannot open as a video")
            yield read
        finally:
            cap.release()


class _ScaledJpeg:
    """The frames of a Motion-JPEG video decoded by libjpeg-turbo (simplejpeg) at the smallest of its scales
    (1/8, 1/4, 3/8, 1/2 ... 1) that still covers `min_size`: the IDCT computes only the coefficients it
    needs, so decoding and the resize after it take a fraction of the time. OpenCV hands over the
    compressed packets (its FFmpeg reader in raw mode). The frame is RGB straight from the decoder, into
    the caller's buffer.

    `reader(buffer)` gives the next frame (None at the end). Every packet decodes on its own, so several
    threads can share the work: `take()` (one thread at a time) hands out the next packet in file order,
    `frame(packet, buffer)` (any thread; libjpeg-turbo releases the GIL) decodes it."""

    def __init__(self, cap, first: np.ndarray, decoder, header, min_size: tuple[int, int], stats: SourceStats,
                 path: Path):
        self.cap, self._decoder, self._header = cap, decoder, header
        self._first: np.ndarray | None = first  # the first packet, handed out by the first take()
        self._h, self._w = min_size
        self._stats, self._path, self._stem = stats, path, path.stem
        self._taken = 0  # packets handed out
        self._counting = threading.Lock()  # the stats, from the threads that decode

    @classmethod
    def open(cls, path: Path, min_size: tuple[int, int], stats: SourceStats) -> _ScaledJpeg | None:
        """A reader when the file is Motion-JPEG and its first frame decodes this way; else None (and the
        caller decodes every frame whole, as without `min_size`)."""
        try:
            import cv2
            import simplejpeg
        except ImportError:  # 32-bit ARM has no simplejpeg wheel: frames are decoded whole
            return None
        cap = _cv2_capture(str(path))
        try:
            ok = cap.isOpened() and cap.set(cv2.CAP_PROP_FORMAT, -1)  # -1: the demuxed packets, undecoded
            ok, first = cap.read() if ok else (False, None)
            if not ok or first is None or first.size < 4 or first.reshape(-1)[:2].tobytes() != b"\xff\xd8":
                cap.release()
                return None
            first = first.reshape(-1)
            h, w = simplejpeg.decode_jpeg_header(first)[:2]
            image = simplejpeg.decode_jpeg(first, "RGB", min_height=min_size[0], min_width=min_size[1])
        except Exception:  # not a JPEG this decoder reads: the frames are decoded whole  # noqa: BLE001
            cap.release()
            return None
        if image.shape[:2] != (h, w):  # libjpeg-turbo scales by M/8, rounding the sizes up
            scale = Fraction(image.shape[1], w).limit_denominator(8)
            stats.decoded = f"{image.shape[1]}x{image.shape[0]} of {w}x{h} (JPEG at {scale})"
        return cls(cap, first, simplejpeg.decode_jpeg, simplejpeg.decode_jpeg_header, min_size, stats, Path(path))

    def __call__(self, buffer: np.ndarray | None) -> Frame | None:
        while (packet := self.take()) is not None:
            frame = self.frame(packet, buffer)
            if frame is not None:
                return frame
        return None

    def take(self) -> tuple[int, np.ndarray, float] | None:
        """(its number in the file, the next compressed frame, when it was read); None at the end."""
        number = self._taken
        if number == 0:
            ok, packet, self._first = True, self._first, None
        else:
            ok, packet = self.cap.read()
        if not ok or packet is None:
            return None
        self._taken = number + 1
        return number, packet.reshape(-1), time.monotonic()

    def frame(self, taken: tuple[int, np.ndarray, float], buffer: np.ndarray | None) -> Frame | None:
        """The frame of a packet from `take`, decoded into `buffer` (or into a buffer of its own when the video
        changed size); None for a packet libjpeg-turbo cannot read, skipped and counted as a camera's bad frame."""
        number, packet, stamp = taken
        image = None
        for into in (buffer, None) if buffer is not None else (None,):
            try:
                image = self._decoder(packet, "RGB", min_height=self._h, min_width=self._w, buffer=into,
                                      strict=False)
                break
            except ValueError:
                continue
        with self._counting:
            self._stats.captured += 1
            if image is None:
                self._stats.errors += 1
                if len(self._stats.failures) < 100:
                    self._stats.failures.append(f"{self._path}: frame {number} skipped (not a JPEG libjpeg-turbo "
                                                "reads; `full_frames` decodes with FFmpeg)")
                return None
            self._stats.delivered += 1
        if buffer is not None and image.shape == buffer.shape:
            image = buffer  # the same buffer object back, so that the stream's resize plan for it holds
        whole = tuple(self._header(packet)[:2])  # 1.3 us: the video may change size
        return Frame(image, number, stamp, f"{self._stem}_{number:06d}", None,
                     None if whole == image.shape[:2] else whole)


def _bgr_to_rgb(frame: np.ndarray) -> np.ndarray:
    """A decoded BGR frame in RGB order, converted in place when it is a plain 3-channel uint8 image."""
    if frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8 and frame.flags.c_contiguous:
        import cv2

        return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB, dst=frame)
    return to_rgb_or_gray(frame, "BGR")


def _cv2_capture(device: int | str):
    import cv2

    try:  # OpenCV prints a WARN line per failed open; our own error says what happened
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    except AttributeError:
        pass
    cap = cv2.VideoCapture(device)
    if isinstance(device, int) or str(device).startswith("/dev/"):
        cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)
    return cap


class _Picamera2Capture:
    """picamera2 behind the VideoCapture protocol. Its "RGB888" format is [B, G, R] in memory."""

    order = "BGR"

    def __init__(self, size: tuple[int, int] = (640, 480)):
        try:
            from picamera2 import Picamera2
        except ImportError:
            raise MissingDependencyError("picamera2 is not importable (sudo apt install python3-picamera2)") from None
        self._cam = Picamera2()
        self._cam.configure(self._cam.create_preview_configuration(main={"format": "RGB888", "size": size}))
        self._cam.start()

    def isOpened(self) -> bool:
        return True

    def read(self):
        try:
            return True, self._cam.capture_array()
        except Exception:  # noqa: BLE001
            return False, None

    def release(self) -> None:
        try:
            self._cam.stop()
        finally:
            self._cam.close()


class _LatestFrame:
    """A one-slot buffer: put() replaces an unread frame (counted as dropped)."""

    def __init__(self, stats: SourceStats):
        self.cond = threading.Condition()
        self.frame: tuple[np.ndarray, float] | None = None
        self.error: Exception | None = None
        self.stats = stats

    def put(self, frame: np.ndarray) -> None:
        with self.cond:
            if self.frame is not None:
                self.stats.dropped += 1
            self.frame = (frame, time.monotonic())
            self.stats.captured += 1
            self.cond.notify_all()

    def fail(self, error: Exception) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()

    def take(self, timeout: float) -> tuple[np.ndarray, float] | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.frame is None and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            if self.error is not None:
                raise self.error
            frame, self.frame = self.frame, None
            return frame


class Camera(Source):
    """A live camera or stream read in a capture thread.

    `opener(device)` returns an object with the OpenCV VideoCapture protocol (`isOpened()`,
    `read() -> (ok, frame)`, `release()`); the default is cv2.VideoCapture. Frames are BGR unless the
    capture object says `order = "RGB"`.
    """

    def __init__(self, device: int | str, *, opener: Callable[[Any], Any] | None = None,
                 read_timeout: float = 2.0, open_timeout: float = 10.0, max_reconnects: int = 5,
                 backoff: float = 0.25, backoff_max: float = 2.0, name: str | None = None):
        super().__init__()
        if max_reconnects < 0 or read_timeout <= 0 or backoff < 0:
            raise InputShapeError("camera timeouts and retry counts must be positive")
        self.device = device
        self.name = name or f"camera {device}"
        self._opener = opener or _cv2_capture
        self.read_timeout = read_timeout
        self.open_timeout = open_timeout
        self.max_reconnects = max_reconnects
        self.backoff = backoff
        self.backoff_max = backoff_max
        self._buffer = _LatestFrame(self.stats)
        self._stop = threading.Event()
        self._generation = 0
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        self._order = "BGR"

    # -- capture thread ----------------------------------------------------------------------
    def _open(self, generation: int):
        """Open the device, retrying with backoff; None when stopped or superseded."""
        delay = self.backoff
        reason = ""  # what the last try met (every try sets it; max_reconnects >= 0 makes one at least)
        for attempt in range(self.max_reconnects + 1):
            if self._stop.is_set() or generation != self._generation:
                return None
            try:
                cap = self._opener(self.device)
                if cap is not None and cap.isOpened():
                    return cap
                if cap is not None:
                    cap.release()
                reason = "it did not open"
            except MissingDependencyError:
                raise
            except Exception as exc:  # a driver error is one more failed try  # noqa: BLE001
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if attempt < self.max_reconnects:
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff_max)
        raise SourceDisconnectedError(
            f"{self.name}: could not be opened after {self.max_reconnects + 1} tries ({reason})"
        )

    def _capture(self, generation: int) -> None:
        first = True
        empty_sessions = 0  # opens that delivered no frame at all count as failed tries
        delay = self.backoff
        try:
            while not self._stop.is_set() and generation == self._generation:
                cap = self._open(generation)
                if cap is None:
                    return
                if not first:
                    with self._lock:
                        self.stats.reconnects += 1
                first = False
                self._order = getattr(cap, "order", "BGR")
                self._connected.set()
                frames = 0
                try:
                    while not self._stop.is_set() and generation == self._generation:
                        try:
                            ok, frame = cap.read()
                        except Exception:  # a driver hiccup: reopen like a lost camera  # noqa: BLE001
                            ok, frame = False, None
                        if generation != self._generation:
                            return
                        if not ok or frame is None:
                            break  # lost: reopen
                        frames += 1
                        self._buffer.put(frame)
                finally:
                    self._connected.clear()
                    cap.release()
                if frames:
                    empty_sessions, delay = 0, self.backoff
                    continue
                empty_sessions += 1
                if empty_sessions > self.max_reconnects:
                    raise SourceDisconnectedError(
                        f"{self.name}: opens but delivers no frames ({empty_sessions} tries)")
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff_max)
        except Exception as exc:  # noqa: BLE001
            if generation == self._generation:
                self._buffer.fail(exc if isinstance(exc, SourceDisconnectedError) else
                                  SourceDisconnectedError(f"{self.name}: {exc}"))

    def _start(self) -> None:
        with self._lock:
            self._generation += 1
            generation = self._generation
        self._thread = threading.Thread(target=self._capture, args=(generation,), daemon=True,
                                        name=f"edgekit-capture-{self.device}")
        self._thread.start()

    # -- consumer ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Frame]:
        self._start()
        index = 0
        stalls_in_a_row = 0
        try:
            while not self._stop.is_set():
                timeout = self.read_timeout if self._connected.is_set() else self.open_timeout
                got = self._buffer.take(timeout)
                if got is None:
                    # a read that hangs (or an open that hangs): abandon that thread, start over
                    stalls_in_a_row += 1
                    self.stats.stalls += 1
                    if stalls_in_a_row > self.max_reconnects:
                        raise SourceDisconnectedError(
                            f"{self.name}: no frame for {timeout:.1f} s, {stalls_in_a_row} times in a row")
                    self._start()
                    continue
                stalls_in_a_row = 0
                frame, stamp = got
                try:
                    if getattr(frame, "size", 0) == 0:
                        raise InputShapeError("empty frame")
                    image = to_rgb_or_gray(np.asarray(frame), self._order)
                except (InputShapeError, ValueError, TypeError) as exc:
                    self.stats.errors += 1  # a malformed frame is skipped and counted, not fatal
                    if len(self.stats.failures) < 100:
                        self.stats.failures.append(f"{self.name}: frame skipped ({one_line(exc)})")
                    continue
                self.stats.delivered += 1
                yield Frame(image, index, stamp, f"frame_{index:06d}")
                index += 1
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._generation += 1
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.read_timeout)


class ArraySamples(Source):
    """The samples of a .npy or .npz (a signal, a token sequence, a tensor for each input): each is one
    "frame" with nothing to decode or draw. They are read for the model's inputs by the one sample reader
    (runtime/samples.py) when the run starts (`edgekit.run.run_samples`)."""

    def __init__(self, path: Path):
        super().__init__()
        self.path, self.name = Path(path), str(path)

    def __iter__(self) -> Iterator[Frame]:
        raise UsageError(f"{self.path}: array samples run through `edgekit.run.run_samples`, not as frames")


def open_source(spec: int | str | Path, *, on_error: Callable[[Path, Exception], None] | None = None,
                **camera_options: Any) -> Source:
    """A camera index ("0"), device path, stream URL, "picamera2", video file, image file, folder, glob, or
    a .npy/.npz of samples (`ArraySamples`)."""
    text = str(spec)
    if isinstance(spec, int) or text.isdigit():
        return Camera(int(text), **camera_options)
    if text in ("picamera2", "picam"):
        return Camera("picamera2", opener=lambda _: _Picamera2Capture(), name="picamera2", **camera_options)
    if text.startswith("/dev/") or "://" in text:
        return Camera(text, **camera_options)
    path = Path(text)
    if path.is_dir():
        files = image_files(text)
        if not files:
            raise InputShapeError(f"{path}: no images found")
        return ImageFiles(files, on_error=on_error, name=text)
    if path.is_file():
        if path.suffix.lower() in (".npy", ".npz"):
            return ArraySamples(path)
        if path.suffix.lower() in IMAGE_SUFFIXES:
            return ImageFiles([path], on_error=on_error, name=text)
        return VideoFile(path)
    if any(ch in text for ch in "*?["):
        matched = sorted(Path(p) for p in globlib.glob(text, recursive=True)
                         if Path(p).suffix.lower() in IMAGE_SUFFIXES)
        if not matched:
            raise InputShapeError(f"{text}: the pattern matches no images")
        return ImageFiles(matched, on_error=on_error, name=text)
    raise InputShapeError(f"{text}: no such file, folder or camera")
