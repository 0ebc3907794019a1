"""Knowledge distillation in the fine-tuning after pruning (converters/distill.py): the loss is Hinton et al.'s,
computed here again with numpy for each kind of target; the option's checks."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.converters.distill import Distilled
from edgekit.converters.targets import Target
from helpers import run_cli

RNG = np.random.default_rng(0)


def _softmax(z, t=1.0):
    e = np.exp(z / t - np.max(z / t, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _bce_logits(y, z):
    return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))


def _run(d: Distilled, predicted: np.ndarray) -> tuple[float, float]:
    import tensorflow as tf

    packed, got = tf.constant(d.y), tf.constant(predicted, tf.float32)
    (metric,) = d.fit_metrics() or [None]
    return float(d.loss()(packed, got)), None if metric is None else float(metric(packed, got))


@pytest.mark.parametrize("from_logits", [False, True])
def test_class_outputs_mix_the_labels_with_the_tempered_teacher(from_logits):
    labels = RNG.integers(0, 5, size=(8, 3))  # per-element classes, as a segmentation head has them
    t_logits, s_logits = RNG.normal(size=(8, 3, 5)) * 3, RNG.normal(size=(8, 3, 5)) * 3
    w, t = 0.7, 4.0
    as_output = (lambda z: z) if from_logits else _softmax
    d = Distilled.of(Target("probs", "classes", labels, from_logits), as_output(t_logits), w, t)
    loss, accuracy = _run(d, as_output(s_logits))
    hard = -np.log(np.take_along_axis(_softmax(s_logits), labels[..., None], -1)[..., 0])
    soft = -(_softmax(t_logits, t) * np.log(_softmax(s_logits, t))).sum(-1)
    assert loss == pytest.approx(float(np.mean((1 - w) * hard + w * t * t * soft)), rel=1e-4)
    assert accuracy == pytest.approx(float(np.mean(s_logits.argmax(-1) == labels)))


@pytest.mark.parametrize("from_logits", [False, True])
def test_binary_outputs_mix_the_masks_with_the_tempered_teacher(from_logits):
    masks = (RNG.random((6, 4, 4)) > 0.5).astype(np.float32)  # a mask may leave out the trailing axis of 1
    t_logits, s_logits = RNG.normal(size=(6, 4, 4, 1)) * 2, RNG.normal(size=(6, 4, 4, 1)) * 2
    w, t = 0.5, 2.0
    as_output = (lambda z: z) if from_logits else _sigmoid
    d = Distilled.of(Target("mask", "binary", masks, from_logits), as_output(t_logits), w, t)
    loss, accuracy = _run(d, as_output(s_logits))
    y = masks[..., None]
    expected = (1 - w) * _bce_logits(y, s_logits) + w * t * t * _bce_logits(_sigmoid(t_logits / t), s_logits / t)
    assert loss == pytest.approx(float(np.mean(expected)), rel=1e-3)
    assert accuracy == pytest.approx(float(np.mean((s_logits > 0) == (y > 0.5))))


def test_value_outputs_mix_squared_errors_to_the_targets_and_to_the_teacher():
    y, teacher, student = (RNG.normal(size=(10, 2)) for _ in range(3))
    d = Distilled.of(Target("amplitude", "values", y), teacher, 0.25)
    loss, accuracy = _run(d, student)
    assert loss == pytest.approx(float(np.mean(0.75 * (y - student) ** 2 + 0.25 * (teacher - student) ** 2)), rel=1e-5)
    assert accuracy is None  # an error, not a share of right answers: no accuracy metric


@pytest.mark.parametrize("args, message", [
    (["--qat", "--distill", "0.5"], "--distill: distils the original model into the pruned one: set --prune"),
    (["--prune", "0.5", "--distill", "1.5"], "--distill: must be between 0 and 1"),
])
def test_bad_distill_options_are_one_line_usage_errors(args, message, tmp_path, digits_dir):
    out = tmp_path / "never.tflite"
    r = run_cli("convert", tmp_path / "m.keras", "--int8", "--train-data", digits_dir / "train", *args, "-o", out)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.error_lines) == 1 and not out.exists()


def test_a_distill_weight_not_given_is_the_labels_alone():
    """`TrainingSpec(distill=None)`, as a caller forwarding an unset option writes it, is 0 (the fine-tune
    compared it with 0 and raised TypeError)."""
    from edgekit.converters.recipe import TrainingSpec

    assert TrainingSpec(distill=None).distill == 0.0 == TrainingSpec().distill
    assert TrainingSpec(**TrainingSpec(distill=None).to_dict()).distill == 0.0
