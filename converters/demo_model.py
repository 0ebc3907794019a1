"""The digits CNN behind `edgekit demo` (and the tests' session model): built and trained here, with no
download, on the bundled digits."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit.converters._tf import import_tf
from edgekit.converters.epochs import epoch_lines
from edgekit.converters.training import dataset, load_image_folder
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.preprocess import PreprocessSpec, read_image


def digits_cnn(input_shape: tuple[int, int, int], classes: int, width: int = 32, *, seed: int = 0):
    """A small CNN that rescales raw 0-255 pixels inside the model, as Keras recommends. Its initial
    weights come from `seed` alone: each kernel initializer gets its seed from a private generator (the
    draws Keras itself makes from Python's global one after `keras.utils.set_random_seed(seed)`, so the
    weights are those of earlier edgekit versions), and no global generator is seeded or used."""
    import_tf()
    import keras
    from keras import layers

    seeds = random.Random(seed)

    def init():
        return keras.initializers.GlorotUniform(seed=seeds.randint(1, int(1e9)))  # in layer order

    inputs = keras.Input(input_shape, name="image")
    x = layers.Rescaling(1.0 / 255.0)(inputs)
    x = layers.Conv2D(width, 3, padding="same", activation="relu", kernel_initializer=init())(x)
    x = layers.Conv2D(2 * width, 3, padding="same", activation="relu", kernel_initializer=init())(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(4 * width, 3, padding="same", activation="relu", kernel_initializer=init())(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(64, activation="relu", kernel_initializer=init())(x)
    outputs = layers.Dense(classes, activation="softmax", name="probs", kernel_initializer=init())(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


def train_digits(train_dir: str | Path, *, epochs: int = 20, seed: int = 0, width: int = 32,
                 verbose: int = 0, progress: Callable[[str], Any] | None = None):
    """Train the digits CNN on a class-folder tree with a fixed seed; returns (model, classes). `progress`
    gets a line per epoch with the time left.
    The seed is passed explicitly (layer initializers, the tf.data shuffle): no global seed is set, so
    the caller's random generators are left as they were, and two calls with one seed train alike."""
    import_tf()
    import keras

    folder = ImageFolder.scan(train_dir)
    h, w = read_image(folder.files[0]).shape[:2]
    spec = PreprocessSpec(height=h, width=w, channels=1)
    x, y, classes = load_image_folder(train_dir, spec)
    model = digits_cnn((h, w, 1), len(classes), width=width, seed=seed)
    # a cosine-decayed rate (to 0.3x) lets the last epochs settle instead of ending on one noisy step
    rate = keras.optimizers.schedules.CosineDecay(3e-3, decay_steps=epochs * -(-len(x) // 32), alpha=0.3)
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    callbacks = [] if progress is None else [epoch_lines("train", epochs, progress, keras.callbacks.Callback)]
    model.fit(dataset(x, y, batch_size=32, seed=seed), epochs=epochs, verbose=verbose, shuffle=False,
              callbacks=callbacks)
    return model, classes
