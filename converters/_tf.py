"""Import TensorFlow once, with a clear message when the convert extra is missing.

Nothing here turns logs down: TensorFlow's C++ log level (TF_CPP_MIN_LOG_LEVEL) and its Python loggers are
the caller's to set; the `edgekit` command silences them for its own run (edgekit.runtime.quiet).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from edgekit.errors import MissingDependencyError

INSTALL_HINT = "pip install 'edgekit[convert]'"


def import_tf() -> Any:  # the modules: untyped (no stubs), so Any to a type checker
    """`tensorflow`, or MissingDependencyError with the install hint."""
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise MissingDependencyError(f"this needs TensorFlow ({exc}): {INSTALL_HINT}") from None
    return tf


def import_tfmot() -> Any:
    """`tensorflow_model_optimization` without its import-time side effect: it sets TF_USE_LEGACY_KERAS=1
    for the whole process, and reads `tf.keras` while it is set, which makes `tf.keras` (the user's too)
    Keras 2 for good. `tf.keras` is resolved first, under the caller's setting, and the variable restored."""
    tf = import_tf()
    before = os.environ.get("TF_USE_LEGACY_KERAS")
    getattr(tf.keras, "__name__", None)  # the lazy loader picks Keras 3 or 2 now, once
    try:
        import tensorflow_model_optimization as tfmot
    except ImportError as exc:
        raise MissingDependencyError(f"pruning and QAT need tensorflow-model-optimization ({exc}): "
                                     f"{INSTALL_HINT}") from None
    finally:
        if before is None:
            os.environ.pop("TF_USE_LEGACY_KERAS", None)
        else:
            os.environ["TF_USE_LEGACY_KERAS"] = before
    return tfmot


def import_keras() -> Any:
    import_tf()
    import keras

    return keras


@contextlib.contextmanager
def keras_prints_to_logging() -> Iterator[None]:
    """Keras 3 prints some messages on sys.stdout ("Saved artifact at ...", when a TFLiteConverter exports
    a Keras model); inside, they go to absl logging at INFO instead, so a library call writes nothing to the
    caller's stdout (`edgekit convert --json -` keeps a clean stdout). Keras keeps this switch per thread:
    other threads are not affected."""
    try:
        from keras import config
    except ImportError:
        yield
        return
    was = config.is_interactive_logging_enabled()
    config.disable_interactive_logging()
    try:
        yield
    finally:
        if was:
            config.enable_interactive_logging()
