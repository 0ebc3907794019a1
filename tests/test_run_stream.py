"""runtime/stream.py: frames through a model on three threads, with the same answers as one frame at a time,
the same bytes as the one preprocessing path, and no memory growth in steady state."""

from __future__ import annotations

import gc
import hashlib
import itertools
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from conftest import PHOTOS, make_video
from edgekit.runtime import Classifier, VideoFile, read_image
from edgekit.runtime.preprocess import PreprocessSpec, geometry
from edgekit.runtime.stream import FrameStream, Slot
from edgekit.runtime.tasks import top_indices
from edgekit.runtime.timing import _rss_bytes


@pytest.mark.parametrize("size", [(480, 640), (720, 1280), (1080, 1920), (479, 641), (300, 1000), (224, 224),
                                  (100, 90)])
@pytest.mark.parametrize("mode", ["stretch", "letterbox", "crop"])
def test_the_banded_resize_gives_the_bytes_of_the_one_preprocessing_path(size, mode):
    import cv2

    photo = cv2.resize(read_image(PHOTOS / "astronaut.jpg"), size[::-1], interpolation=cv2.INTER_LINEAR)
    spec = PreprocessSpec(224, 224, 3, resize=mode)
    lut = np.random.default_rng(0).normal(size=(1, 256, 3)).astype(np.float32)
    slot = Slot((224, 224, 3), lut)
    slot.plan(photo, spec)
    slot.start()
    slot.finish()
    if mode == "stretch" and size in ((480, 640), (720, 1280), (1080, 1920)):
        assert len(slot.jobs) == 8  # camera sizes split into bands the two threads share
    np.testing.assert_array_equal(slot.small, geometry(photo, spec))
    np.testing.assert_array_equal(slot.encoded, cv2.LUT(geometry(photo, spec), lut))  # the border too


def test_top_k_by_argpartition_ranks_like_a_stable_sort():
    rng = np.random.default_rng(0)
    for dtype in (np.uint8, np.int8, np.float32):
        for _ in range(50):
            raw = rng.integers(0, 6, size=40).astype(dtype)  # many ties
            for k in (1, 2, 5, 40, 50):
                expected = np.argsort(-raw.astype(np.float64), kind="stable")[:k].tolist()
                assert top_indices(raw, k) == expected
    with_nan = np.array([0.5, np.nan, 0.9, 0.1], np.float32)
    assert top_indices(with_nan, 2) == [2, 0]


@pytest.fixture(scope="module")
def photo_video(tmp_path_factory):
    import cv2

    photos = [cv2.resize(read_image(p), (320, 240)) for p in sorted(PHOTOS.glob("*.jpg"))]
    frames = [np.roll(photos[i % len(photos)], 3 * i, axis=1) for i in range(1100)]
    return make_video(tmp_path_factory.mktemp("video") / "photos.avi", frames)


def test_streamed_results_equal_one_frame_at_a_time(converted, photo_video):
    classifier = Classifier(converted("int8"), num_threads=1)
    one_by_one = [classifier.classify(f.image, top_k=3) for f in itertools.islice(VideoFile(photo_video), 200)]
    streamed = []
    for frame, results in classifier.stream(VideoFile(photo_video), top_k=3):
        streamed.append(results)
        if len(streamed) == 200:
            break
    assert streamed == one_by_one


@pytest.mark.parametrize("full_frames", [True, False])
def test_a_steady_stream_allocates_no_frame_buffers_and_rss_stays_flat(converted, photo_video, full_frames):
    """1,000 frames after 100 of warm-up: numpy's own allocations hold the same bytes, nothing per frame
    peaks above 64 KiB (one 320x240 frame is 225 KiB, its gray copy 75 KiB), RSS grows < 1 MiB. Scaled-down
    JPEG decoding (full_frames=False) holds each compressed packet for the time of its decode. Measured in a
    fresh interpreter: a test worker's RSS also moves with what earlier tests left running."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from test_run_stream import _steady; "
            "print(json.dumps(_steady(sys.argv[2], sys.argv[3], sys.argv[4] == 'True')))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(converted("int8")),
                           str(photo_video), str(full_frames)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads(done.stdout.strip().splitlines()[-1])
    assert m["after"] <= m["before"]
    assert m["peak"] - max(m["start"], m["end"]) < 64 * 1024, m  # timing arrays growing: ~40 KiB
    assert m["rss_growth"] < 1024 * 1024, m
    assert m["decoded"] == (None if full_frames else "40x30 of 320x240 (JPEG at 1/8)")


def _steady(model: str, video_path: str, full_frames: bool) -> dict:
    """The measurements of the steady-stream test, in the interpreter that runs it."""
    numpy_domain = np.lib.tracemalloc_domain
    gc.collect()
    classifier = Classifier(model, num_threads=1)
    video = VideoFile(video_path)
    stream = classifier.stream(video, top_k=1, full_frames=full_frames)
    tracemalloc.start()
    try:
        for count, (frame, results) in enumerate(stream, 1):
            if count == 100:
                before = _numpy_bytes(numpy_domain)
                rss = _rss_bytes()
                tracemalloc.reset_peak()
                start, _ = tracemalloc.get_traced_memory()
            elif count == 1100:
                end, peak = tracemalloc.get_traced_memory()
                after = _numpy_bytes(numpy_domain)
                rss_growth = _rss_bytes() - rss
                break
    finally:
        tracemalloc.stop()
    return {"before": before, "after": after, "start": start, "end": end, "peak": peak, "rss_growth": rss_growth,
            "decoded": video.stats.decoded}


@pytest.fixture(scope="module")
def camera_video(tmp_path_factory):
    """640x480 Motion-JPEG of the photos, as a USB camera or a phone records it."""
    import cv2

    photos = [cv2.resize(read_image(p), (640, 480), interpolation=cv2.INTER_AREA) for p in sorted(PHOTOS.glob("*.jpg"))]
    frames = [np.roll(photos[i % len(photos)], 8 * i, axis=1) for i in range(12)]
    return make_video(tmp_path_factory.mktemp("video") / "camera.avi", frames)


@pytest.mark.parametrize("min_size, decoded", [((224, 224), (240, 320)), ((120, 100), (120, 160)),
                                               ((60, 80), (60, 80)), ((61, 80), (120, 160)),
                                               ((481, 10), (480, 640))])
def test_a_motion_jpeg_video_decodes_at_the_smallest_scale_that_covers_the_input(camera_video, min_size, decoded):
    with VideoFile(camera_video).reading(min_size) as read:
        frames = []
        while (frame := read(frames[-1].image if frames else None)) is not None:
            frames.append(frame._replace(image=frame.image.copy()))
    assert len(frames) == 12 and [f.index for f in frames] == list(range(12))
    assert {f.image.shape for f in frames} == {decoded + (3,)}


def test_scaled_down_decoding_stays_as_close_to_the_whole_frame_as_two_whole_frame_decoders_are(camera_video):
    """What the model sees (area-resized to 224x224): the frame decoded at 1/2 against FFmpeg's whole frame
    (what `cv2.VideoCapture` and --full-frames give), beside libjpeg-turbo's whole frame against FFmpeg's:
    JPEG frames have no one true decode, and the scaled one must stay within that spread."""
    import cv2
    import simplejpeg

    spec = PreprocessSpec(224, 224, 3)
    with VideoFile(camera_video).reading((224, 224)) as scaled, VideoFile(camera_video).reading() as whole:
        packets = cv2.VideoCapture(str(camera_video))
        assert packets.set(cv2.CAP_PROP_FORMAT, -1)
        gaps, spread = [], []
        while (small := scaled(None)) is not None:
            full = geometry(whole(None).image, spec).astype(np.int16)
            other = simplejpeg.decode_jpeg(packets.read()[1].reshape(-1), "RGB")
            gaps.append(np.abs(geometry(small.image, spec) - full).mean())
            spread.append(np.abs(geometry(other, spec) - full).mean())
    gap, between = float(np.mean(gaps)), float(np.mean(spread))
    print(f"mean |scaled - whole| {gap:.3f}, |libjpeg - FFmpeg| {between:.3f} (levels of 255, at 224x224)")
    assert 0 < between < gap < 2.5 * between and gap < 1.5


def _numpy_bytes(domain: int) -> int:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, domain)])
    return sum(t.size for t in snapshot.traces)


def _decoded(classifier, video, decoders: int, limit: int | None = None) -> tuple[list, FrameStream]:
    """(frame index, name, whole size, mean level, pixels' digest) of each frame a stream delivers."""
    stream = FrameStream(classifier, video, lambda task, frame, interp: [], full_frames=False, decoders=decoders)
    got = []
    for frame, _ in stream:
        got.append((frame.index, frame.name, frame.whole_size, round(float(frame.image.mean())),
                    hashlib.sha1(frame.image).hexdigest()))
        if len(got) == limit:
            break
    return got, stream


@pytest.mark.parametrize("decoders", [2, 3])
def test_frames_decoded_on_several_threads_arrive_in_file_order_with_their_own_pixels(converted, photo_video,
                                                                                    decoders):
    """A decode-bound run decodes on every core: while the interpreter waits for frames, helper threads take
    the next packet in turn and decode into a slot of their own. The frames still arrive in file order, each
    with its own pixels, as with one reader; a stream stopped early leaves no decoder behind."""
    classifier = Classifier(converted("int8"), num_threads=1)
    one, _ = _decoded(classifier, VideoFile(photo_video), 1)
    many, stream = _decoded(classifier, VideoFile(photo_video), decoders)
    assert len(one) == 1100 and many == one
    assert len({digest for *_, digest in one}) > 1000  # the frames differ: a mix-up would show
    assert stream.rates()["decode"] and stream.decoding >= 2  # helpers join in while the interpreter waits
    early, _ = _decoded(classifier, VideoFile(photo_video), decoders, limit=50)
    assert early == one[:50]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("edgekit-")]


def test_a_packet_that_is_no_jpeg_is_skipped_in_order_by_several_decoders(converted, tmp_path):
    # 48 frames: with 12, one decoder under a loaded machine sometimes took them all before a helper joined
    frames = [np.full((240, 320, 3), 5 * i, np.uint8) for i in range(48)]
    video = make_video(tmp_path / "broken.avi", frames)
    data = bytearray(video.read_bytes())
    starts = [i for i in range(len(data) - 2) if data[i:i + 3] == b"\xff\xd8\xff"]
    data[starts[5]:starts[5] + 2] = b"\0\0"
    video.write_bytes(bytes(data))
    source = VideoFile(video)
    got, stream = _decoded(Classifier(converted("int8"), num_threads=1), source, 3)
    assert stream.decoding >= 2
    assert [index for index, *_ in got] == [i for i in range(48) if i != 5]
    assert all(abs(level - 5 * index) <= 2 for index, _, _, level, _ in got)  # each frame its own pixels
    assert source.stats.errors == 1 and source.stats.delivered == 47 and source.stats.captured == 48
    assert source.stats.failures == [f"{video}: frame 5 skipped (not a JPEG libjpeg-turbo reads; `full_frames` "
                                     "decodes with FFmpeg)"]


@pytest.mark.parametrize("full_frames", [True, False])
def test_a_stream_stopped_early_leaves_no_thread_behind(converted, photo_video, full_frames):
    """A loop that breaks (max frames, a Pi app that stops) closes the stream: the reader, the decoders and
    the inference thread all end, none waits for a frame that will not come, and nothing holds the slots."""
    classifier = Classifier(converted("int8"), num_threads=1)
    for _ in range(3):
        stream = classifier.stream(VideoFile(photo_video), top_k=1, full_frames=full_frames)
        for count, _ in enumerate(stream, 1):
            if count == 20:
                break
        assert stream._threads and not [t.name for t in stream._threads if t.is_alive()]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("edgekit-")]


def test_a_decoder_that_fails_ends_the_stream_with_its_error_not_a_hang(converted, photo_video, monkeypatch):
    """An error other than a bad JPEG (here a RuntimeError standing in for a MemoryError or a lost disk) in one
    of four decoders reaches the caller's loop; the others stop, even those waiting for their turn."""
    from edgekit.runtime import sources

    frame = sources._ScaledJpeg.frame

    def failing(self, taken, buffer):
        if taken[0] == 40:
            raise RuntimeError("the disk went away")
        return frame(self, taken, buffer)

    monkeypatch.setattr(sources._ScaledJpeg, "frame", failing)
    outcome: list = []

    def loop() -> None:
        try:
            for item in FrameStream(Classifier(converted("int8"), num_threads=1), VideoFile(photo_video),
                                    lambda task, f, interp: [], full_frames=False, decoders=4):
                outcome.append(item[0].index)
        except RuntimeError as exc:
            outcome.append(str(exc))

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the stream hung"
    assert outcome[-1] == "the disk went away" and outcome[:-1] == list(range(len(outcome) - 1))
    assert len(outcome) - 1 <= 40
