"""Training data for fine-tuning: image class folders through the runtime preprocessing into a seeded
tf.data pipeline (shuffle from the seed alone, batch, prefetch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.converters._tf import import_tf
from edgekit.errors import CalibrationError
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.preprocess import PreprocessSpec, load_batch


def load_image_folder(path: str | Path, spec: PreprocessSpec) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Every image of a class-folder tree through the runtime preprocessing: (x, y, classes)."""
    folder = ImageFolder.scan(path)
    if not folder.labelled:
        raise CalibrationError(f"{path}: training data needs images in class sub-folders")
    x = load_batch(folder.files, spec)
    return x, np.asarray(folder.labels, np.int64), folder.classes


def dataset(x: np.ndarray, y: np.ndarray, *, batch_size: int, seed: int):
    """Shuffled batches whose order comes from `seed` alone (a numpy generator; tf.data's shuffle mixes in
    TensorFlow's global seed, which any caller may have set): one seed trains alike whatever else ran in
    the process; the same for the demo's model and for fine-tuning."""
    tf = import_tf()
    rng = np.random.default_rng(seed)
    xs, ys = tf.constant(x), tf.constant(y)

    def order():
        yield from rng.permutation(len(x))  # a new order every pass, the same sequence for a seed

    indices = tf.data.Dataset.from_generator(order, output_signature=tf.TensorSpec((), tf.int64))
    indices = indices.apply(tf.data.experimental.assert_cardinality(len(x)))  # Keras then knows an epoch
    ds = indices.batch(batch_size).map(lambda i: (tf.gather(xs, i), tf.gather(ys, i)))
    return ds.prefetch(tf.data.AUTOTUNE)
