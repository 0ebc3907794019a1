"""What fine-tuning trains each output towards (converters/targets.py): judged from the targets' shape and
values against the output's, with a one-line error naming the output when they cannot fit."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.converters.targets import Target, outputs_of, primary, target_for
from edgekit.errors import CalibrationError

RNG = np.random.default_rng(0)


def _probs(n, k):
    e = np.exp(RNG.normal(size=(n, k)))
    return e / e.sum(-1, keepdims=True)


def test_class_indices_for_a_classifier_and_per_pixel():
    t = target_for("probs", (None, 10), np.arange(20) % 10, _probs(8, 10), source="d.npz", param="training.data")
    assert (t.kind, t.from_logits, t.metric) == ("classes", False, "top-1")
    logits = target_for("seg", (None, None, None, 3), RNG.integers(0, 3, (5, 4, 4)), RNG.normal(size=(2, 4, 4, 3)),
                        source="d.npz", param="training.data")
    assert (logits.kind, logits.from_logits) == ("classes", True)
    predicted = np.eye(3)[logits.y]  # one-hot of the targets themselves: all right
    assert logits.score(predicted) == 1.0
    with pytest.raises(CalibrationError, match="run 0..10; the output scores 10 classes"):
        target_for("probs", (None, 10), np.arange(11), _probs(4, 10), source="d.npz", param="training.data")


def test_a_mask_without_its_channel_axis_is_binary_and_scored_per_pixel():
    mask = (RNG.random((6, 8, 8)) > 0.5).astype(np.float32)
    t = target_for("mask", (None, None, None, 1), mask, RNG.random((2, 8, 8, 1)), source="d.npz",
                   param="training.data")
    assert (t.kind, t.from_logits, t.metric, t.y.shape) == ("binary", False, "accuracy", (6, 8, 8, 1))
    flipped = t.y.copy()
    flipped[0, 0, 0, 0] = 1 - flipped[0, 0, 0, 0]
    assert t.score(flipped) == pytest.approx(1 - 1 / mask.size)
    logits = target_for("mask", (None, 8, 8, 1), mask, RNG.normal(size=(2, 8, 8, 1)), source="d.npz",
                        param="training.data")
    assert logits.from_logits and logits.score(np.where(logits.y > 0.5, 3.0, -3.0)) == 1.0


def test_other_values_are_regressed_and_scored_by_squared_error():
    amp = RNG.uniform(0.5, 2.0, 10)
    t = target_for("amplitude", (None, 1), amp, RNG.normal(size=(3, 1)), source="d.npz", param="training.data")
    assert (t.kind, t.metric, t.accuracy) == ("values", "mse", False)
    assert t.score(t.y + 0.1) == pytest.approx(0.01)
    assert primary({"amplitude": 0.01, "band": 0.9},
                   [t, Target("band", "classes", np.zeros(1, np.int64))]) == 0.9


@pytest.mark.parametrize("y, shape, said", [
    (np.zeros((4, 3)), (None, 8), "have the shape (3,) per sample; the output is (8)"),
    (np.array([0.0, np.nan]), (None, 1), "must be finite numbers"),
])
def test_targets_that_cannot_fit_name_the_output(y, shape, said):
    with pytest.raises(CalibrationError, match=r"'head'") as info:
        target_for("head", shape, y, np.zeros((1,) + shape[1:]), source="d.npz", param="training.data")
    assert said in str(info.value) and info.value.param == "training.data"


def test_outputs_come_in_output_order_from_any_form():
    a, b = np.zeros((2, 3)), np.ones((2, 1))
    assert [o.shape for o in outputs_of({"b": b, "a": a}, ["a", "b"])] == [(2, 3), (2, 1)]
    assert [o.shape for o in outputs_of([a, b])] == [(2, 3), (2, 1)]
    assert outputs_of(a)[0] is not None and len(outputs_of(a)) == 1
