"""runtime/stream.py: frames through a model on three threads, with the same answers as one frame at a time,
the same bytes as the one preprocessing path, and no memory growth in steady state."""

from __future__ import annotations

import gc
import itertools
import tracemalloc

import numpy as np
import pytest

from conftest import PHOTOS, make_video
from edgekit.runtime import Classifier, VideoFile, read_image
from edgekit.runtime.preprocess import PreprocessSpec, geometry
from edgekit.runtime.stream import Slot
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
    JPEG decoding (full_frames=False) holds each compressed packet for the time of its decode."""
    numpy_domain = np.lib.tracemalloc_domain
    gc.collect()
    classifier = Classifier(converted("int8"), num_threads=1)
    video = VideoFile(photo_video)
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
    assert after <= before  # (arrays of earlier tests may be collected meanwhile)
    assert peak - max(start, end) < 64 * 1024, (start, end, peak)  # timing arrays growing: ~40 KiB
    assert rss_growth < 1024 * 1024
    assert video.stats.decoded == (None if full_frames else "40x30 of 320x240 (JPEG at 1/8)")


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
