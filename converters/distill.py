"""Knowledge distillation for the fine-tuning that follows pruning: the pruned model learns the original
model's outputs as well as the labels (Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a Neural
Network"): what the labels do not say (which wrong classes the original found close) is there to learn.
Measured, it is not reliably better than the labels alone (docs/convert.md), hence `training.distill` = 0 by
default.

Per output, with `weight` w and temperature T:
- classes: (1 - w) * cross-entropy(label, student) + w * T^2 * cross-entropy(softmax(teacher / T),
  softmax(student / T)), on logits (an output that is already a softmax is turned back into log-probabilities);
- binary: the same with sigmoids;
- values: (1 - w) * mse(y, student) + w * mse(teacher, student) (T does not apply).
The teacher's outputs on the training samples are computed once, before pruning, and travel with the labels in
one array (the label in the last channel), so tf_keras' fit needs nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgekit.converters.targets import Target

TEMPERATURE = 4.0  # Hinton et al.'s range is 2-20; 4 is the common choice for ImageNet-size class counts
MAX_TEACHER_BYTES = 1 << 30  # the teacher's outputs on the training set are held in memory, beside the samples
_EPS = 1e-7  # the student's floor, as Keras' cross-entropy clips probabilities
_TINY = float(np.finfo(np.float32).tiny)  # the teacher's: its log-probabilities as they are, only 0 floored


@dataclass(frozen=True)
class Distilled:
    """A training target: `target`'s labels beside the teacher's outputs on the same samples (what `_fit`
    compiles: `.y`, `.loss()`, `.fit_metrics()`)."""

    target: Target
    y: np.ndarray  # teacher's logits (or values), then the label, along the last axis
    weight: float
    temperature: float = TEMPERATURE

    @classmethod
    def of(cls, target: Target, teacher: np.ndarray, weight: float, temperature: float = TEMPERATURE) -> Distilled:
        teacher = np.asarray(teacher, np.float32)
        if target.kind == "classes":
            logits = teacher if target.from_logits else np.log(np.clip(teacher, _TINY, 1.0))
            packed = np.concatenate([logits, np.asarray(target.y, np.float32)[..., None]], axis=-1)
        else:
            y = np.asarray(target.y, np.float32).reshape(teacher.shape)
            if target.kind == "binary" and not target.from_logits:
                teacher = np.log(np.clip(teacher, _TINY, None)) - np.log(np.clip(1.0 - teacher, _TINY, None))
            packed = np.concatenate([teacher, y], axis=-1)
        return cls(target, packed, weight, temperature)

    def loss(self):
        import tensorflow as tf

        kind, logits, w, t = self.target.kind, self.target.from_logits, self.weight, self.temperature

        def distilled(packed, predicted):
            if kind == "classes":
                teacher, label = packed[..., :-1], tf.cast(packed[..., -1], tf.int32)
                student = predicted if logits else tf.math.log(tf.clip_by_value(predicted, _EPS, 1.0))
                hard = tf.nn.sparse_softmax_cross_entropy_with_logits(label, student)
                soft = tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(teacher / t), student / t)
                return tf.reduce_mean((1.0 - w) * hard + w * t * t * soft)
            size = packed.shape[-1] // 2
            teacher, y = packed[..., :size], packed[..., size:]
            if kind == "binary":
                p = tf.clip_by_value(predicted, _EPS, 1.0 - _EPS)
                student = predicted if logits else tf.math.log(p) - tf.math.log1p(-p)
                hard = tf.nn.sigmoid_cross_entropy_with_logits(y, student)
                soft = tf.nn.sigmoid_cross_entropy_with_logits(tf.sigmoid(teacher / t), student / t)
                return tf.reduce_mean((1.0 - w) * hard + w * t * t * soft)
            return tf.reduce_mean((1.0 - w) * tf.square(y - predicted) + w * tf.square(teacher - predicted))

        return distilled

    def fit_metrics(self) -> list:
        """The label's accuracy, read from the packed array (Keras' "accuracy" would read the teacher's part)."""
        import tensorflow as tf

        if not self.target.accuracy:
            return []
        kind, threshold = self.target.kind, 0.0 if self.target.from_logits else 0.5

        def accuracy(packed, predicted):
            if kind == "classes":
                label = tf.cast(packed[..., -1], tf.int64)
                return tf.reduce_mean(tf.cast(tf.equal(tf.argmax(predicted, axis=-1), label), tf.float32))
            y = packed[..., packed.shape[-1] // 2:]
            return tf.reduce_mean(tf.cast(tf.equal(predicted > threshold, y > 0.5), tf.float32))

        return [accuracy]

