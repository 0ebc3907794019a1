"""`edgekit run` on image folders classifies a chunk of images per invoke: same answers, fewer calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgekit.run import run_stream
from edgekit.runtime import Classifier, ImageFiles, Model, image_files, read_image


def _answers(model_path, folder, **kw):
    model = Model(model_path, num_threads=1)
    seen = []
    summary = run_stream(model, ImageFiles(image_files(folder)), top_k=3,
                         on_result=lambda f, r, ms: seen.append((f.name, [(c.index, c.score) for c in r])), **kw)
    return summary, seen


def _same_up_to_rounding(batched, by_frame, tolerance):
    """The batch's answers are the frame-by-frame ones: same files in order, scores within `tolerance`, and
    the same classes except where two classes' scores are within `tolerance` of each other."""
    assert [name for name, _ in batched] == [name for name, _ in by_frame]
    for (name, got), (_, want) in zip(batched, by_frame):
        scores = dict(want)
        for (cls, score), (want_cls, want_score) in zip(got, want):
            assert abs(score - want_score) <= tolerance, (name, got, want)
            assert cls == want_cls or abs(scores.get(cls, 0.0) - want_score) <= tolerance, (name, got, want)


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_batched_run_gives_the_frame_by_frame_answers(converted, digits_dir, mode):
    """Bit for bit on x86; on aarch64 XNNPACK's batched kernels round differently (2 steps of 1/256 on the
    int8 model's softmax, 3e-9 in float32), which the check allows and reports."""
    path = converted(mode)
    one, by_frame = _answers(path, digits_dir / "test", batch=1)
    many, batched = _answers(path, digits_dir / "test", batch=16)
    assert one.batch == 1 and one.batch_check is None
    assert many.batch == 16 and many.batch_check["ok"] and many.batch_check["rows"] == 16
    assert many.batch_check["max_difference"] <= many.batch_check["tolerance"] <= 0.02
    assert len(batched) == len(by_frame) == 360
    _same_up_to_rounding(batched, by_frame, many.batch_check["tolerance"])


# Scores: with int8 outputs (io int8) both paths dequantize the same int8 value in float64, so they are
# equal; with float outputs, the batch interpreter's answers are checked bit for bit on the first chunk
# only, and one float32 ulp near 1 is 1.2e-7.
@pytest.mark.parametrize("mode, io, tol", [("int8", "float32", 1e-6), ("float32", "float32", 1e-6),
                                           ("int8", "int8", 0.0)])
def test_vectorised_top1_of_a_batch_gives_classify_answers_image_by_image(converted, digits_dir, mode, io, tol):
    """`edgekit run`'s default top_k=1 on a folder goes through Classifier.top_rows; every image's label and
    score must be what Classifier.classify says for that image alone."""
    model = Model(converted(mode, io), num_threads=1)
    assert model.outputs[0].quantized == (io == "int8")  # int8 io takes top_rows' dequantizing branch
    files = image_files(digits_dir / "test")
    batched = {}
    summary = run_stream(model, ImageFiles(files), top_k=1, batch=16,
                         on_result=lambda f, r, ms: batched.__setitem__(f.index, (f.name, r)))
    assert summary.batch == 16 and summary.frames == len(batched) == len(files) == 360
    alone = Classifier(Model(converted(mode, io), num_threads=1))
    labels = set()
    rounding = max(tol, summary.batch_check["max_difference"])  # 0 on x86; see the test above for aarch64
    assert rounding <= summary.batch_check["tolerance"]
    for i, path in enumerate(files):
        expected = alone.classify(read_image(path), top_k=2)
        name, [got] = batched[i]
        assert name == Path(path).name
        assert got.score == pytest.approx(expected[0].score, abs=rounding, rel=0), path
        if (got.index, got.label) != (expected[0].index, expected[0].label):  # a tie within the rounding
            assert (got.index, got.label) == (expected[1].index, expected[1].label), path
            assert expected[0].score - expected[1].score <= 2 * rounding, path
        labels.add(got.index)
    assert labels == set(range(10))  # every class answered: not one label for all


def test_batched_run_stops_at_max_frames_inside_a_chunk(converted, digits_dir):
    summary, seen = _answers(converted("int8"), digits_dir / "test", batch=16, max_frames=37)
    assert summary.frames == len(seen) == 37 and summary.batch == 16


def test_models_that_cannot_take_a_batch_run_frame_by_frame(detector_tflite, photos_dir):
    model = Model(detector_tflite, num_threads=1)
    summary = run_stream(model, ImageFiles(image_files(photos_dir)), batch=16)
    assert summary.batch == 1 and summary.frames == len(image_files(photos_dir))


def test_batch_must_be_positive(converted, digits_dir):
    from edgekit.errors import UsageError

    with pytest.raises(UsageError, match="batch: must be at least 1"):
        run_stream(Model(converted("int8")), ImageFiles(image_files(digits_dir / "test")), batch=0)


class _Skewed:
    """A batch interpreter that computes another function than the model run alone (fault injection): each
    row's scores move one class on. (Rolling the batch axis instead is no fault on this folder: the first
    chunk is sixteen zeros, whose answers differ by less than the tolerance.)"""

    def __init__(self, interp):
        self._interp = interp

    def __getattr__(self, name):
        return getattr(self._interp, name)

    def get(self, index):
        return np.roll(self._interp.get(index), 1, axis=-1)


def test_a_batch_that_disagrees_with_a_single_run_falls_back_to_frame_by_frame(converted, digits_dir):
    _, expected = _answers(converted("int8"), digits_dir / "test", batch=1)
    model = Model(converted("int8"), num_threads=1)
    model._batched[16] = _Skewed(model.batch_interpreter(16))
    seen = []
    summary = run_stream(model, ImageFiles(image_files(digits_dir / "test")), top_k=3, batch=16,
                         on_result=lambda f, r, ms: seen.append((f.name, [(c.index, c.score) for c in r])))
    assert summary.batch == 1 and summary.batch_check["ok"] is False
    assert summary.batch_check["max_difference"] > summary.batch_check["tolerance"]
    assert seen == expected


def test_the_cli_says_when_a_batch_fell_back(converted, digits_dir, monkeypatch):
    from click.testing import CliRunner

    from edgekit.cli import main

    original = Model.batch_interpreter
    monkeypatch.setattr(Model, "batch_interpreter", lambda self, n, *a: _Skewed(original(self, n, *a)))
    result = CliRunner().invoke(main, ["run", str(converted("int8")), "--source", str(digits_dir / "test" / "3")])
    assert result.exit_code == 0, result.stderr
    assert "16 images per invoke did not give the single invokes' answers" in result.stderr
    assert "ran them one by one" in result.stderr and result.stdout.count("\n") == 37
