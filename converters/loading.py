"""Load a Keras 3 `.keras`, a legacy `.h5` or a SavedModel folder behind one small interface."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters._tf import import_tf
from edgekit.converters.model_safety import check_model_file
from edgekit.errors import ModelFormatError, UnsafeModelError, one_line
from edgekit.runtime.model_kind import SUFFIXES, model_kind

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
    """"keras", "h5" or "saved_model", from the bytes whatever the name (runtime/model_kind.py); a .tflite and
    what is no model are refused."""
    kind = model_kind(path)
    if kind == "tflite":
        raise ModelFormatError(f"{path}: already a TFLite model; convert takes a Keras model (.keras, .h5) or a "
                               "SavedModel folder, and bench, inspect and run take this file as it is")
    return kind


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the float model: its name (Keras layer name or signature key) and shape."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str = "float32"


@dataclass
class SourceModel:
    """A float model ready for conversion and for reference predictions: every input and output, named,
    in the model's order (Keras inputs/outputs, or the SavedModel signature's keys)."""

    path: Path
    format: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    keras_model: Any = None
    handle: Any = field(default=None, repr=False)  # keeps a loaded SavedModel's variables alive
    # every loader gives both (keyword-only: they follow the fields with defaults)
    _fn: Callable[..., list] = field(repr=False, kw_only=True)  # inputs in order -> outputs in order
    _converter_factory: Callable[[dict | None], Any] = field(repr=False, kw_only=True)

    @property
    def input_shape(self) -> tuple[int | None, ...]:
        return self.inputs[0].shape

    @property
    def output_shape(self) -> tuple[int | None, ...]:
        return self.outputs[0].shape

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def device(self) -> str:
        tf = import_tf()
        gpus = tf.config.list_logical_devices("GPU")
        return gpus[0].name if gpus else "/device:CPU:0"

    def _arrays(self, x: np.ndarray | dict[str, np.ndarray] | list) -> list[np.ndarray]:
        if isinstance(x, dict):
            missing = [n for n in self.input_names if n not in x]
            if missing:
                raise ModelFormatError(f"{self.path}: no data for input(s) {', '.join(missing)}")
            arrays = [x[n] for n in self.input_names]
        else:
            arrays = list(x) if isinstance(x, (list, tuple)) else [x]
        if len(arrays) != len(self.inputs):
            raise ModelFormatError(f"{self.path}: the model takes {len(self.inputs)} inputs, got {len(arrays)}")
        return [np.asarray(a, _numpy_dtype(t.dtype)) for a, t in zip(arrays, self.inputs)]

    def predict_all(self, x: np.ndarray | dict[str, np.ndarray] | list, batch_size: int = 64) -> dict[str, np.ndarray]:
        """Float outputs by name, in the model's order, in TensorFlow graph mode (tf.function), on a GPU
        when one is visible. `x`: one array for a single-input model, else a dict by input name."""
        tf = import_tf()
        arrays = self._arrays(x)
        fixed = {t.shape[0] for t in self.inputs if t.shape and t.shape[0] is not None}
        if fixed:  # a signature traced at a fixed batch (a SavedModel's (1, N) waveform) takes only that one
            batch_size = min(batch_size, *fixed)
        parts: list[list[np.ndarray]] = [[] for _ in self.outputs]
        try:
            with tf.device(self.device):
                for i in range(0, len(arrays[0]), batch_size):
                    ys = self._fn(*[tf.constant(a[i : i + batch_size]) for a in arrays])
                    for part, y in zip(parts, ys):
                        part.append(np.asarray(y))
        except Exception as exc:  # noqa: BLE001 - a config that loads but cannot run (TF raises many types)
            raise ModelFormatError(f"{self.path}: the float model fails on its input: {one_line(exc)}") from None
        # a graph that only names an op it cannot run (the OD API's post-processing placeholder) gives scalars
        return {t.name: np.concatenate(part, axis=0) if part and part[0].ndim else np.stack(part)
                for t, part in zip(self.outputs, parts)}

    def predict(self, x: np.ndarray | dict[str, np.ndarray] | list, batch_size: int = 64) -> np.ndarray:
        """The first output (the only one of a single-output model)."""
        return next(iter(self.predict_all(x, batch_size).values()))

    def tflite_converter(self, shapes: dict[str, tuple[int, ...]] | None = None):
        """A TFLiteConverter; `shapes` fixes input sizes by name (the rest keep their open dimensions)."""
        return self._converter_factory(shapes or None)


def _numpy_dtype(name: str) -> np.dtype:
    """The input's own dtype (ids and masks are integers); float32 where numpy does not know the name."""
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(np.float32)


def _as_list(y, names: list[str]) -> list:
    if isinstance(y, dict):
        return [y[n] for n in names]
    if isinstance(y, (list, tuple)):
        return list(y)
    return [y]


def _specs(tensors, names: list[str]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(n, tuple(t.shape), str(getattr(t.dtype, "name", t.dtype))) for n, t in zip(names, tensors))


def _keras_converter(model, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]):
    """TFLite's own Keras path. Several outputs, or fixed input sizes: a functional wrapper with new
    inputs of those sizes whose outputs are a dict by Keras name, so the .tflite signature keeps the
    names (TFLite names a list's outputs output_0, output_1, ...)."""
    tf = import_tf()

    def factory(shapes: dict | None):
        if shapes is None and len(inputs) == 1 and len(outputs) == 1:
            return tf.lite.TFLiteConverter.from_keras_model(model)
        if type(model).__module__.split(".")[0] == "tf_keras":
            import tf_keras as k
        else:
            import keras as k
        new = [k.Input(batch_shape=(shapes or {}).get(t.name) or tuple(t.shape), dtype=t.dtype, name=t.name)
               for t in inputs]
        ys = _as_list(model(new[0] if len(new) == 1 else new), [t.name for t in outputs])
        wrapper = k.Model(new[0] if len(new) == 1 else new, {t.name: y for t, y in zip(outputs, ys)})
        return tf.lite.TFLiteConverter.from_keras_model(wrapper)

    return factory


def _from_keras(path: Path, fmt: str, model, sha256: str | None = None) -> SourceModel:
    tf = import_tf()
    input_names = [t.name.split(":")[0] for t in model.inputs]
    output_names = list(getattr(model, "output_names", None) or [f"output_{i}" for i in range(len(model.outputs))])
    if len(set(output_names)) != len(output_names) or len(set(input_names)) != len(input_names):
        raise ModelFormatError(f"{path}: two inputs or outputs share a name ({input_names} -> {output_names})")
    single = len(model.inputs) == 1

    def call(*xs):
        return _as_list(model(xs[0] if single else list(xs), training=False), output_names)

    fn = tf.function(call, reduce_retracing=True)
    inputs, outputs = _specs(model.inputs, input_names), _specs(model.outputs, output_names)
    return SourceModel(path=path, format=fmt, sha256=sha256 or sha256_of(path), inputs=inputs, outputs=outputs,
                       keras_model=model, _fn=fn, _converter_factory=_keras_converter(model, inputs, outputs))


def keras_source(original: SourceModel, model) -> SourceModel:
    """A Keras model edgekit rebuilt from `original` (same inputs and outputs) as the source of its file."""
    return _from_keras(original.path, original.format, model, original.sha256)


@contextlib.contextmanager
def _named_as(path: Path, fmt: str):
    """`path` under the extension Keras reads `fmt` by (it goes by the name: a .keras archive named `.model`
    is "not supported"): itself where it has it, else a link (or copy) of that name in a temporary folder."""
    suffix = SUFFIXES[fmt]
    if path.name.endswith(suffix) or (fmt == "h5" and path.name.endswith(".hdf5")):  # as Keras compares: case too
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="edgekit-model-") as tmp:
        named = Path(tmp) / f"model{suffix}"
        try:
            os.symlink(path.resolve(), named)
        except OSError:  # no symlinks here (some filesystems): a copy
            import shutil

            shutil.copyfile(path, named)
        yield named


def _load_keras(path: Path, fmt: str):
    with _named_as(path, fmt) as named:
        try:
            return _keras_load(named, fmt)
        except ModelFormatError as exc:  # Keras names the file it read: the user's name, not the link's
            exc.args = (str(exc.args[0]).replace(str(named), str(path)),)
            raise


def _keras_load(path: Path, fmt: str):
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
    except Exception as exc:  # Keras raises many types for damaged archives  # noqa: BLE001
        if fmt == "h5":
            return _load_tf_keras_h5(path, exc)
        raise ModelFormatError(f"{path}: Keras cannot load it: {one_line(exc)}") from None


def _load_tf_keras_h5(path: Path, first_error: Exception):
    """A Keras 2 .h5 that Keras 3 refuses: load it with tf_keras."""
    try:
        import tf_keras

        return tf_keras.models.load_model(path, compile=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelFormatError(
            f"{path}: neither Keras 3 ({one_line(first_error)}) nor tf_keras ({one_line(exc)}) can load it"
        ) from None


def _from_saved_model(path: Path) -> SourceModel:
    tf = import_tf()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # noqa: BLE001
        raise ModelFormatError(f"{path}: TensorFlow cannot load the SavedModel: {one_line(exc)}") from None
    sigs = getattr(loaded, "signatures", {})
    key = "serving_default" if "serving_default" in sigs else next(iter(sigs), None)
    if key is None:
        raise ModelFormatError(f"{path}: the SavedModel has no serving signature to convert")
    sig = sigs[key]
    in_specs = sig.structured_input_signature[1]
    out_specs = sig.structured_outputs
    if not isinstance(out_specs, dict):
        out_specs = {f"output_{i}": s for i, s in enumerate(_as_list(out_specs, []))}
    inputs = tuple(TensorSpec(n, tuple(s.shape.as_list()), s.dtype.name) for n, s in in_specs.items())
    outputs = tuple(TensorSpec(n, tuple(s.shape.as_list()), s.dtype.name) for n, s in out_specs.items())
    names = [t.name for t in inputs]

    def call(*xs):
        return _as_list(sig(**dict(zip(names, xs))), [t.name for t in outputs])

    def factory(shapes: dict | None):
        # from the loaded signature, not from_saved_model: that path leaves the variables of a
        # tf.saved_model.save()d Keras 3 model as VAR_HANDLE ops, and the model outputs NaN
        if not shapes:
            return tf.lite.TFLiteConverter.from_concrete_functions([sig], loaded)
        specs = [tf.TensorSpec(shapes.get(t.name) or t.shape, t.dtype, name=t.name) for t in inputs]
        serve = tf.function(lambda *xs: dict(zip([t.name for t in outputs], call(*xs))), input_signature=specs)
        return tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], loaded)

    return SourceModel(path=path, format="saved_model", sha256=sha256_of(path), inputs=inputs, outputs=outputs,
                       handle=loaded, _fn=tf.function(call), _converter_factory=factory)


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
    names = original.output_names
    single = len(original.inputs) == 1

    def call(*xs):
        return _as_list(model(xs[0] if single else list(xs), training=False), names)

    fn = tf.function(call, reduce_retracing=True)

    def converter(shapes: dict | None):
        specs = [tf.TensorSpec((shapes or {}).get(t.name) or (None,) + tuple(t.shape[1:]), t.dtype, name=t.name)
                 for t in original.inputs]
        if len(original.outputs) == 1 and len(specs) == 1:
            return tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function(*specs)], model)
        serve = tf.function(lambda *xs: dict(zip(names, call(*xs))), input_signature=specs)
        return tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], model)

    return SourceModel(path=original.path, format=original.format, sha256=original.sha256, inputs=original.inputs,
                       outputs=original.outputs, keras_model=model, _fn=fn, _converter_factory=converter)


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
    except Exception as exc:  # protobuf DecodeError, bad JSON  # noqa: BLE001
        raise ModelFormatError(f"{meta}: unreadable Keras metadata ({one_line(exc)})") from None
    check_config(configs, str(path), trust=trust)
    import tf_keras

    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelFormatError(f"{path}: tf_keras cannot load this SavedModel: {one_line(exc)}") from None
