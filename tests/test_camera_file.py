"""Real video files through the sources with the default OpenCV opener (no FakeCapture).

What runtime/sources.py promises: a video *file* (`VideoFile`) is read once, every frame in order, then
ends; it never reconnects. A *stream* (`Camera`: a device, a URL, anything with "://") is reopened when a
read fails, with backoff, and gives up with SourceDisconnectedError after `max_reconnects` failed tries in
a row. A file:// URL is such a stream: OpenCV plays the file, and at its end the source reopens it."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import make_video
from edgekit.errors import SourceDisconnectedError
from edgekit.runtime import Camera, VideoFile, open_source


def levels(frames) -> list[int]:
    """The grey level of each frame (MJPG is lossy: rounded to the nearest 10)."""
    return [int(round(float(f.image.mean()) / 10) * 10) for f in frames]


def grey_video(path, values, size=(48, 64)):
    return make_video(path, [np.full((*size, 3), v, np.uint8) for v in values])


def test_a_video_file_delivers_every_frame_in_order_then_ends(tmp_path):
    values = [10 * i for i in range(1, 21)]
    video = grey_video(tmp_path / "clip.avi", values)
    source = open_source(video)
    assert isinstance(source, VideoFile)
    with source:
        frames = list(source)
    assert levels(frames) == values
    assert [f.index for f in frames] == list(range(20))
    assert frames[0].name == "clip_000000" and frames[-1].name == "clip_000019"
    assert frames[0].image.shape == (48, 64, 3) and frames[0].image.dtype == np.uint8
    assert source.stats.to_dict() == {"captured": 20, "delivered": 20, "dropped": 0, "reconnects": 0,
                                      "stalls": 0, "errors": 0, "decoded": None}


def test_colours_come_back_in_rgb_order(tmp_path):
    red = np.zeros((32, 32, 3), np.uint8)
    red[..., 0] = 200
    video = make_video(tmp_path / "red.avi", [red] * 3)
    frames = list(VideoFile(video))
    r, g, b = frames[1].image.reshape(-1, 3).mean(axis=0)
    assert r > 180 and g < 30 and b < 30


def test_a_video_file_replaced_while_it_plays_is_not_reconnected(tmp_path):
    """A VideoFile keeps the file it opened: replacing the path mid-read changes nothing, and the end of
    the file is the end of the source."""
    video = grey_video(tmp_path / "clip.avi", [50] * 10)
    replacement = grey_video(tmp_path / "other.avi", [200] * 30)
    source = VideoFile(video)
    got = []
    for frame in source:
        got.append(frame)
        if len(got) == 3:
            os.replace(replacement, video)
    assert levels(got) == [50] * 10
    assert source.stats.reconnects == 0


def test_a_stream_is_reopened_at_its_end_and_picks_up_a_replaced_file(tmp_path):
    video = grey_video(tmp_path / "live.avi", [60] * 8)
    replacement = grey_video(tmp_path / "next.avi", [180] * 8)
    source = open_source(f"file://{video}", backoff=0.01)
    assert isinstance(source, Camera)
    seen, replaced_at = [], None
    started = time.monotonic()
    with source:
        for frame in source:
            seen.append(int(round(float(frame.image.mean()) / 10) * 10))
            if replaced_at is None and len(seen) >= 3:
                os.replace(replacement, video)  # the open capture keeps reading the old file
                replaced_at = len(seen)
            if seen[-1] == 180 or time.monotonic() - started > 20:
                break
    assert seen[-1] == 180, seen  # the reopened stream is the new file
    assert set(seen) <= {60, 180}
    assert source.stats.reconnects >= 1
    assert source.stats.errors == 0 and source.stats.stalls == 0


def test_a_stream_whose_file_is_gone_gives_up_after_the_retries(tmp_path):
    video = grey_video(tmp_path / "live.avi", [90] * 5)
    source = Camera(f"file://{video}", backoff=0.02, backoff_max=0.05, max_reconnects=3)
    frames, gone = 0, None
    with pytest.raises(SourceDisconnectedError) as err:
        with source:
            for _ in source:
                frames += 1
                if frames == 2:
                    video.unlink()
                    gone = time.monotonic()
    waited = time.monotonic() - gone
    assert str(err.value) == f"camera file://{video}: could not be opened after 4 tries (it did not open)"
    # what was left of the open file, then nothing (the reader thread may have looped it once before the unlink)
    assert 2 <= frames <= 10
    assert waited < 3, waited  # 0.02 + 0.04 + 0.05 s of backoff, not the default 0.25 s doubling


def test_a_camera_given_a_plain_path_plays_the_file_over_and_over(tmp_path):
    """Camera(path) with the default opener: OpenCV opens a file path as readily as a device."""
    video = grey_video(tmp_path / "loop.avi", [30, 90, 150])
    source = Camera(str(video), backoff=0.01)
    with source:
        got = [f for _, f in zip(range(12), source)]
    assert len(got) == 12 and set(levels(got)) <= {30, 90, 150}
    assert source.stats.reconnects >= 1 and source.stats.delivered == 12
    assert [f.index for f in got] == list(range(12)) and got[0].name == "frame_000000"
