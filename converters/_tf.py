"""Import TensorFlow quietly, once, with a clear message when the convert extra is missing."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Iterator

from edgekit.errors import MissingDependencyError

INSTALL_HINT = "pip install 'edgekit[convert]'"


def import_tf():
    """`tensorflow`, with its C++ and Python logging turned down to errors."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        with captured_output():
            import tensorflow as tf
    except ImportError as exc:
        raise MissingDependencyError(f"this needs TensorFlow ({exc}): {INSTALL_HINT}") from None
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:
        pass
    tf.get_logger().setLevel("ERROR")
    return tf


def import_tfmot():
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


def import_keras():
    import_tf()
    import keras

    return keras


@contextlib.contextmanager
def captured_output() -> Iterator[list[str]]:
    """Capture what C++ and Python write to stdout/stderr (the TFLite converter and Keras export
    print a lot); the captured text is appended to the yielded list on exit."""
    sink: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            with contextlib.redirect_stdout(sys.stderr):
                yield sink
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))
