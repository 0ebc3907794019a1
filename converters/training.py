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


def dataset(x, y, *, batch_size: int, seed: int):
    """Shuffled batches whose order comes from `seed` alone (a numpy generator; tf.data's shuffle mixes in
    TensorFlow's global seed, which any caller may have set): one seed trains alike whatever else ran in
    the process; the same for the demo's model and for fine-tuning. `x` and `y` are arrays, or lists of
    them (several inputs, several outputs)."""
    tf = import_tf()
    rng = np.random.default_rng(seed)
    x, y = (tuple(v) if isinstance(v, list) else v for v in (x, y))  # tf.data would stack a list into one tensor
    xs, ys = tf.nest.map_structure(tf.constant, x), tf.nest.map_structure(tf.constant, y)
    first = tf.nest.flatten(x)[0]

    def order():
        yield from rng.permutation(len(first))  # a new order every pass, the same sequence for a seed

    def gather(i):
        return tuple(tf.nest.map_structure(lambda t: tf.gather(t, i), part) for part in (xs, ys))

    indices = tf.data.Dataset.from_generator(order, output_signature=tf.TensorSpec((), tf.int64))
    indices = indices.apply(tf.data.experimental.assert_cardinality(len(first)))  # Keras then knows an epoch
    ds = indices.batch(batch_size).map(gather)
    return ds.prefetch(tf.data.AUTOTUNE)
