"""The tasks share one interface (runtime/tasks/base.py): a task added in a test module, by one class and its
entry in TASKS, is served by `edgekit run`'s code (`run_stream`) on a real model, with no change to run.py;
run.py never branches on a task's name; the results render to JSON and text as `edgekit run` prints them."""

from __future__ import annotations

import ast
from typing import Any, NamedTuple

import numpy as np
import pytest
from conftest import ROOT, make_video

from edgekit.errors import UsageError
from edgekit.run import run_stream
from edgekit.runtime import ImageFiles, Model, VideoFile, image_files
from edgekit.runtime.tasks import TASKS, Classification, Detection, ImageTask, RawResult, task_class, task_for


class Brightness(NamedTuple):
    mean: float  # the mean of the frame's pixels
    first: float  # the model's first raw output value

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    def to_text(self) -> str:
        return f"brightness {self.mean:.1f} (output {self.first:.3g})"


class BrightnessTask(ImageTask):
    """A task no model is built for: each frame's mean pixel beside the model's first output value."""

    name = "brightness"

    def results(self, raw: list[np.ndarray], frame, settings) -> list[Brightness]:
        return [Brightness(float(frame.image.mean()), float(raw[0].reshape(-1)[0]))]

    def draw(self, bgr: np.ndarray, results: list, scale: float) -> None:
        bgr[:4] = 255  # a white band on top


@pytest.fixture
def brightness(monkeypatch):
    """BrightnessTask registered for one test: a dict entry, as a caller outside the library adds a task."""
    monkeypatch.setitem(TASKS, "brightness", BrightnessTask)
    return BrightnessTask


def test_a_task_added_in_a_test_runs_on_image_files(brightness, converted, digits_dir, tmp_path):
    files = image_files(digits_dir / "test" / "3")[:5]
    seen = []
    summary = run_stream(Model(converted("int8")), ImageFiles(files), task="brightness", save_dir=tmp_path / "out",
                         on_result=lambda frame, results, ms: seen.append(results))
    assert summary.task == "brightness" and summary.frames == 5 and summary.batch == 1  # it does not batch
    import cv2

    for results, path in zip(seen, files):
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        assert [type(r) for r in results] == [Brightness]
        assert results[0].mean == pytest.approx(float(image.mean()))
    drawn = sorted((tmp_path / "out").glob("*.jpg"))
    assert len(drawn) == 5 and cv2.imread(str(drawn[0]))[:4].min() >= 250  # its own drawing


def test_a_task_added_in_a_test_streams_a_video(brightness, detector_tflite, tmp_path):
    frames = [np.full((64, 64, 3), 40 * i, np.uint8) for i in range(4)]
    video = make_video(tmp_path / "grey.avi", frames)
    seen = []
    summary = run_stream(Model(detector_tflite), VideoFile(video), task="brightness",
                         on_result=lambda frame, results, ms: seen.append(results[0]))
    assert summary.task == "brightness" and summary.frames == 4 and summary.rates is not None
    assert [round(r.mean / 40) for r in seen] == [0, 1, 2, 3]  # MJPEG moves a grey level by a step or two


def test_task_for_asks_the_tasks_in_order_and_a_new_task_can_claim_models(monkeypatch, converted, detector_tflite):
    assert task_for(Model(converted("int8"))) == "classify"
    assert task_for(Model(detector_tflite)) == "detect"

    class Claims(BrightnessTask):
        @classmethod
        def matches(cls, model: Model) -> bool:
            return True

    monkeypatch.setitem(TASKS, "brightness", Claims)
    assert task_for(Model(converted("int8"))) == "classify"  # an earlier entry still wins
    assert task_for(Model(detector_tflite)) == "detect"
    assert list(TASKS)[:3] == ["classify", "detect", "raw"]


def test_an_unknown_task_and_a_foreign_option_are_refused(converted, digits_dir):
    model = Model(converted("int8"))
    source = ImageFiles(image_files(digits_dir / "test" / "3")[:1])
    with pytest.raises(UsageError, match="must be one of classify, detect, raw"):
        run_stream(model, source, task="segment")
    with pytest.raises(UsageError, match=r"iou is for task='detect', this run is task='classify'"):
        run_stream(model, source, iou=0.5)


def test_every_declared_task_is_importable_and_says_its_name():
    for name in TASKS:
        cls = task_class(name)
        assert cls.name == name and issubclass(cls, ImageTask)


def test_run_py_never_compares_with_a_task_name():
    """`edgekit run` reads the Task interface only: no `== "classify"`, `in ("classify", "raw")` ..."""
    tree = ast.parse((ROOT / "edgekit" / "run.py").read_text())
    compared = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(_task_names(side) for side in [node.left, *node.comparators])]
    assert not compared, compared
    assert not any(isinstance(n, ast.Constant) and n.value in ("classify", "detect") for n in ast.walk(tree))


def _task_names(node: ast.expr) -> list[object]:
    """Task names written in `node`: a string constant, or the constants of a tuple, list or set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in TASKS]


def test_results_render_as_run_prints_them():
    assert Classification(3, "three", 0.98765).to_text() == "three 0.988"
    assert Detection((1.0, 2.344, 30.0, 40.5), 1, "cat", 0.876).to_text() == "cat 0.88 at [1.0, 2.34, 30.0, 40.5]"
    assert RawResult(0, [1, 2], [0.5, 0.25], "score").to_text() == "score 0.5 0.25"
    assert RawResult(1, [1, 10], list(range(10)), "").to_text() == "output 1 [1, 10]"
    assert Detection((1.0, 2.0, 3.0, 4.0), 0, "a", 0.5).to_dict()["box"] == [1.0, 2.0, 3.0, 4.0]


def test_the_cli_offers_the_declared_tasks():
    from edgekit.cli import main

    option = next(p for p in main.commands["run"].params if p.name == "task")
    assert list(option.type.choices) == list(TASKS)
