"""Frame sources: files, folders, globs, videos and cameras that stall, fail and come back."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import FakeCapture, make_video
from edgekit.errors import InputShapeError, SourceDisconnectedError
from edgekit.runtime import Camera, ImageFiles, VideoFile, open_source, read_image


def _bgr_frames(n: int, h: int = 48, w: int = 64) -> list[np.ndarray]:
    return [np.full((h, w, 3), (i * 10) % 256, np.uint8) for i in range(n)]


def test_folder_source_yields_every_image_in_sorted_order(digits_dir):
    with open_source(digits_dir / "test") as frames:
        names = [f.name for f in frames]
    assert len(names) == 360
    assert frames.stats.delivered == 360 and frames.stats.errors == 0


def test_glob_and_single_image_sources(digits_dir):
    assert sum(1 for _ in open_source(str(digits_dir / "test" / "7" / "*.png"))) == 36
    (frame,) = list(open_source(next((digits_dir / "test" / "3").glob("*.png"))))
    assert frame.image.shape == (8, 8)


def test_corrupt_file_in_a_folder_is_reported_and_the_rest_still_run(tmp_path, digits_dir):
    good = sorted((digits_dir / "test" / "1").glob("*.png"))[:3]
    for i, p in enumerate(good):
        (tmp_path / f"{i}.png").write_bytes(p.read_bytes())
    (tmp_path / "1b.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    seen = []
    source = open_source(tmp_path, on_error=lambda path, exc: seen.append((path.name, str(exc))))
    frames = list(source)
    assert [f.name for f in frames] == ["0.png", "1.png", "2.png"]
    assert seen and seen[0][0] == "1b.png" and "not a readable image" in seen[0][1]
    assert source.stats.errors == 1
    with pytest.raises(InputShapeError, match="1b.png"):
        list(open_source(tmp_path))  # without a handler the first bad file stops the run


def test_missing_sources_are_clear_errors(tmp_path):
    with pytest.raises(InputShapeError, match="no such file, folder or camera"):
        open_source(tmp_path / "nothing.mp4")
    with pytest.raises(InputShapeError, match="matches no images"):
        open_source(str(tmp_path / "*.jpg"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputShapeError, match="no images found"):
        open_source(tmp_path / "empty")


def test_video_file_frames_come_back_in_rgb(tmp_path):
    rgb = [np.zeros((32, 32, 3), np.uint8) for _ in range(5)]
    for f in rgb:
        f[..., 0] = 200  # red
    video = make_video(tmp_path / "clip.avi", rgb)
    frames = list(open_source(video))
    assert len(frames) == 5
    assert frames[0].image[..., 0].mean() > 150 and frames[0].image[..., 2].mean() < 50


def test_a_file_that_is_not_a_video_is_a_clear_error(tmp_path):
    bad = tmp_path / "clip.mp4"
    bad.write_bytes(b"not a video at all")
    with pytest.raises(InputShapeError, match="clip.mp4"):
        list(VideoFile(bad))


def test_camera_frames_are_converted_from_bgr_and_released_at_the_end():
    bgr = np.zeros((4, 4, 3), np.uint8)
    bgr[..., 0] = 255  # blue in OpenCV order
    captures = []

    def opener(device):
        captures.append(FakeCapture([bgr], fps=200))
        return captures[-1]

    with Camera(0, opener=opener) as cam:
        frame = next(iter(cam))
    assert frame.image[0, 0].tolist() == [0, 0, 255]
    time.sleep(0.05)
    assert captures[0].released


def test_camera_that_fails_mid_stream_is_reconnected_and_counted():
    frames = _bgr_frames(3)
    opened = []

    def opener(device):
        opened.append(device)
        return FakeCapture(frames, fps=200, fail_after=10)  # every capture dies after 10 frames

    cam = Camera("fake", opener=opener, backoff=0.01, read_timeout=1.0)
    got = []
    for frame in cam:
        got.append(frame)
        if len(got) == 25:
            break
    assert cam.stats.reconnects >= 2 and len(opened) == cam.stats.reconnects + 1
    assert cam.stats.delivered == 25


def test_camera_that_never_opens_gives_up_with_a_clear_error_quickly():
    tries = []

    def opener(device):
        tries.append(time.monotonic())
        return FakeCapture([], opens=False)

    started = time.monotonic()
    with pytest.raises(SourceDisconnectedError, match="could not be opened after 4 tries"):
        list(Camera(0, opener=opener, max_reconnects=3, backoff=0.05))
    assert len(tries) == 4
    assert time.monotonic() - started < 2.0
    gaps = np.diff(tries)
    assert gaps[1] > gaps[0] * 1.5  # exponential backoff


def test_stalled_read_times_out_and_the_camera_is_reopened():
    frames = _bgr_frames(2)
    opened = []

    def opener(device):
        opened.append(device)
        # the first capture hangs inside read() after 3 frames; the next ones work
        return FakeCapture(frames, fps=200, hang_after=3 if len(opened) == 1 else None)

    cam = Camera(0, opener=opener, read_timeout=0.3, backoff=0.01)
    started = time.monotonic()
    got = []
    for frame in cam:
        got.append(frame)
        if len(got) == 10:
            break
    assert cam.stats.stalls == 1 and len(opened) == 2
    assert time.monotonic() - started < 3.0


def test_slow_consumer_sees_the_newest_frame_and_drops_are_counted():
    frames = _bgr_frames(50)
    cam = Camera(0, opener=lambda d: FakeCapture(frames, fps=100), backoff=0.01)
    got = []
    for frame in cam:
        got.append(frame)
        time.sleep(0.05)  # a 20 FPS consumer on a 100 FPS camera
        if len(got) == 8:
            break
    assert cam.stats.dropped >= 15
    assert cam.stats.captured >= cam.stats.delivered + cam.stats.dropped
    # only the newest frame is ever buffered: delivered frames skip ahead
    values = [int(f.image[0, 0, 0]) for f in got]
    assert all(b != a for a, b in zip(values, values[1:]))


def test_camera_thread_stops_when_the_consumer_stops():
    cam = Camera("stop-test", opener=lambda d: FakeCapture(_bgr_frames(2), fps=200), backoff=0.01)
    for _ in zip(range(3), cam):
        pass
    time.sleep(0.1)
    assert not any(t.name == "edgekit-capture-stop-test" and t.is_alive() for t in threading.enumerate())


def test_image_reader_thread_stops_when_the_consumer_stops(digits_dir):
    source = open_source(digits_dir / "test")
    for _ in zip(range(5), source):
        pass
    source.close()
    time.sleep(0.1)
    assert not any(t.name == "edgekit-image-reader" and t.is_alive() for t in threading.enumerate())


def test_prefetch_and_plain_reading_give_the_same_frames(digits_dir):
    paths = sorted((digits_dir / "test" / "4").glob("*.png"))
    a = [f.image for f in ImageFiles(paths, prefetch=True, chunk=5)]
    b = [f.image for f in ImageFiles(paths, prefetch=False)]
    assert len(a) == len(b) == len(paths)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.array_equal(a[0], read_image(paths[0]))
