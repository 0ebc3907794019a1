"""Load a Keras 3 `.keras`, a legacy `.h5` or a SavedModel folder behind one small interface."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgekit.converters._tf import import_tf
from edgekit.converters.model_safety import check_model_file
from edgekit.errors import ModelFormatError, UnsafeModelError, one_line

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
FORMATS = ("keras", "h5", "saved_model")


def sha256_of(path: Path) -> str:
    """sha256 of a file, or of a folder's files (relative path and content, in sorted order)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def detect_format(path: Path) -> str:
    if not path.exists():
        raise ModelFormatError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            return "saved_model"
        raise ModelFormatError(f"{path}: a folder, but not a SavedModel (no saved_model.pb)")
    with path.open("rb") as fh:
        head = fh.read(8)
    if head.startswith(HDF5_SIGNATURE):
        return "h5"
    if head.startswith(b"PK") and zipfile.is_zipfile(path):
        return "keras"  # model_safety reads (with caps) and checks its config.json
    raise ModelFormatError(f"{path}: not a Keras model (.keras, .h5) or a SavedModel folder")


@dataclass
class SourceModel:
    """A float model ready for conversion and for reference predictions."""

    path: Path
    format: str
    sha256: str
    input_shape: tuple[int | None, ...]
    output_shape: tuple[int | None, ...]
    keras_model: Any = None
    handle: Any = field(default=None, repr=False)  # keeps a loaded SavedModel's variables alive
    _fn: Callable[[Any], Any] | None = field(default=None, repr=False)
    _converter_factory: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def device(self) -> str:
        tf = import_tf()
        gpus = tf.config.list_logical_devices("GPU")
        return gpus[0].name if gpus else "/device:CPU:0"

    def predict(self, x: np.ndarray, batch_size: int = 64) -> np.ndarray:
        """Float outputs in TensorFlow graph mode (tf.function), on a GPU when one is visible."""
        tf = import_tf()
        outs = []
        try:
            with tf.device(self.device):
                for i in range(0, len(x), batch_size):
                    y = self._fn(tf.constant(np.asarray(x[i : i + batch_size], np.float32)))
                    outs.append(np.asarray(y))
        except Exception as exc:  # noqa: BLE001 - a config that loads but cannot run (TF raises many types)
            raise ModelFormatError(f"{self.path}: the float model fails on its input: {one_line(exc)}") from None
        return np.concatenate(outs, axis=0)

    def tflite_converter(self):
        return self._converter_factory()


def _first_output(y):
    if isinstance(y, dict):
        return y[sorted(y)[0]]
    if isinstance(y, (list, tuple)):
        return y[0]
    return y


def _from_keras(path: Path, fmt: str, model) -> SourceModel:
    tf = import_tf()
    if len(model.inputs) != 1:
        raise ModelFormatError(f"{path}: models with {len(model.inputs)} inputs are not supported yet")
    if len(model.outputs) != 1:
        raise ModelFormatError(
            f"{path}: models with {len(model.outputs)} outputs are not supported yet (edgekit cannot yet "
            "match each Keras output to its TFLite output); export one output per model"
        )
    fn = tf.function(lambda x: _first_output(model(x, training=False)), reduce_retracing=True)
    return SourceModel(
        path=path,
        format=fmt,
        sha256=sha256_of(path),
        input_shape=tuple(model.inputs[0].shape),
        output_shape=tuple(_first_output(model.outputs).shape),
        keras_model=model,
        _fn=fn,
        _converter_factory=lambda: tf.lite.TFLiteConverter.from_keras_model(model),
    )


def _load_keras(path: Path, fmt: str):
    import_tf()
    import keras

    try:
        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except ValueError as exc:
        text = str(exc)
        if "safe_mode" in text or "lambda" in text.lower():
            raise UnsafeModelError(f"{path}: Keras refused to deserialise code in it (safe_mode): {one_line(exc)}") from None
        if fmt == "h5":
            return _load_tf_keras_h5(path, exc)
        raise ModelFormatError(f"{path}: Keras cannot load it: {one_line(exc)}") from None
    except Exception as exc:  # Keras raises many types for damaged archives
        if fmt == "h5":
            return _load_tf_keras_h5(path, exc)
        raise ModelFormatError(f"{path}: Keras cannot load it: {one_line(exc)}") from None


def _load_tf_keras_h5(path: Path, first_error: Exception):
    """A Keras 2 .h5 that Keras 3 refuses: load it with tf_keras."""
    try:
        import tf_keras

        return tf_keras.models.load_model(path, compile=False)
    except Exception as exc:
        raise ModelFormatError(
            f"{path}: neither Keras 3 ({one_line(first_error)}) nor tf_keras ({one_line(exc)}) can load it"
        ) from None


def _from_saved_model(path: Path) -> SourceModel:
    tf = import_tf()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise ModelFormatError(f"{path}: TensorFlow cannot load the SavedModel: {one_line(exc)}") from None
    sigs = getattr(loaded, "signatures", {})
    key = "serving_default" if "serving_default" in sigs else next(iter(sigs), None)
    if key is None:
        raise ModelFormatError(f"{path}: the SavedModel has no serving signature to convert")
    sig = sigs[key]
    specs = sig.structured_input_signature[1]
    if len(specs) != 1:
        raise ModelFormatError(f"{path}: signatures with {len(specs)} inputs are not supported yet")
    (arg_name, spec), = specs.items()
    out_specs = sig.structured_outputs
    n_out = len(out_specs) if isinstance(out_specs, (dict, list, tuple)) else 1
    if n_out != 1:
        raise ModelFormatError(f"{path}: signatures with {n_out} outputs are not supported yet")
    out_spec = out_specs[sorted(out_specs)[0]] if isinstance(out_specs, dict) else _first_output(out_specs)
    fn = tf.function(lambda x: _first_output(sig(**{arg_name: x})))
    return SourceModel(
        path=path,
        format="saved_model",
        sha256=sha256_of(path),
        input_shape=tuple(spec.shape.as_list()),
        output_shape=tuple(out_spec.shape.as_list()),
        handle=loaded,
        _fn=fn,
        # from the loaded signature, not from_saved_model: that path leaves the variables of a
        # tf.saved_model.save()d Keras 3 model as VAR_HANDLE ops, and the model outputs NaN
        _converter_factory=lambda: tf.lite.TFLiteConverter.from_concrete_functions([sig], loaded),
    )


def load_model(path: str | Path, *, trust: bool = False) -> SourceModel:
    """Load a float model for conversion; every failure is a one-line ModelFormatError. The Keras
    config is checked before Keras is imported (see model_safety)."""
    path = Path(path)
    fmt = detect_format(path)
    check_model_file(path, fmt, trust=trust)
    if fmt == "saved_model":
        return _from_saved_model(path)
    return _from_keras(path, fmt, _load_keras(path, fmt))


def trained_source(original: SourceModel, model) -> SourceModel:
    """A SourceModel for a tf_keras model edgekit trained from `original` (pruned or QAT): predictions in
    eval mode, conversion from its traced call (one batch dimension left open)."""
    tf = import_tf()
    fn = tf.function(lambda x: _first_output(model(x, training=False)), reduce_retracing=True)
    spec = tf.TensorSpec((None,) + tuple(original.input_shape[1:]), model.inputs[0].dtype)

    def converter():
        return tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function(spec)], model)

    return SourceModel(path=original.path, format=original.format, sha256=original.sha256,
                       input_shape=original.input_shape, output_shape=original.output_shape,
                       keras_model=model, _fn=fn, _converter_factory=converter)


def keras_model_of_saved_model(path: Path, *, trust: bool = False):
    """The tf_keras model inside a SavedModel that tf_keras wrote (`model.save(dir)`), for training stages.
    Its layer configs (keras_metadata.pb) are checked like a .keras config before tf_keras reads them."""
    from edgekit.converters.model_safety import check_config

    meta = Path(path) / "keras_metadata.pb"
    if not meta.is_file():
        raise ModelFormatError(
            f"{path}: this SavedModel holds no Keras layers (written by model.export() or tf.saved_model.save); "
            "pruning and QAT need the Keras model: pass its .keras/.h5 file or a SavedModel from tf_keras model.save"
        )
    import_tf()
    import json

    from tf_keras.protobuf import saved_metadata_pb2

    saved = saved_metadata_pb2.SavedMetadata()
    try:
        saved.ParseFromString(meta.read_bytes())
        configs = [json.loads(node.metadata) for node in saved.nodes if node.metadata]
    except Exception as exc:  # protobuf DecodeError, bad JSON
        raise ModelFormatError(f"{meta}: unreadable Keras metadata ({one_line(exc)})") from None
    check_config(configs, str(path), trust=trust)
    import tf_keras

    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as exc:
        raise ModelFormatError(f"{path}: tf_keras cannot load this SavedModel: {one_line(exc)}") from None
