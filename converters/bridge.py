"""Keras 3 -> tf_keras: rebuild a model layer by layer so that tensorflow-model-optimization can train it.

tfmot only accepts Keras 2 (`tf_keras`) models, and tf_keras cannot read a file Keras 3 wrote. The bridge
walks the Keras 3 functional graph, creates the tf_keras layer of the same class from the same config,
copies the weights and then proves, on real samples, that both models compute the same outputs.
Nested models (a `keras.applications` backbone used as one layer) are flattened into the outer graph,
because tfmot cannot quantize a model inside a model; a layer reused in several places stays shared.
A nested model called with `training=False` (a frozen backbone) keeps its layers in inference mode during
fine-tuning, as in Keras 2; Keras 3 would let fit()'s training=True override it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.converters._tf import import_tf
from edgekit.errors import ModelFormatError, one_line

# keys Keras 3 writes into nested configs that tf_keras does not know (they only affect initialisation,
# and the bridge copies trained weights)
_KERAS3_ONLY_KEYS = {"input_axes", "output_axes", "module", "registered_name", "optional"}
# layer config keys that are Keras 3 spellings, with their tf_keras names
_RENAMED = {"batch_shape": "batch_input_shape"}
# Keras 3 activations that tf_keras lacks, or has with another formula (its hard_sigmoid is 0.2x + 0.5)
_KERAS3_ACTIVATIONS = ("hard_sigmoid", "hard_silu", "hard_swish")
# keras.ops calls with one tensor and one number that the bridge rebuilds as a ScaleShift layer
_SCALAR_OPS = frozenset({"Add", "Subtract", "Multiply", "Divide", "TrueDivide"})
# layer config keys that are new in Keras 3 and that tf_keras only lacks at their default value
_DEFAULTED = {"synchronized": False, "quantization_config": None, "lora_rank": None, "lora_alpha": None,
              "sparse": False, "ragged": False, "rms_scaling": False}


@dataclass(frozen=True)
class BridgeResult:
    model: Any  # a tf_keras.Model
    max_abs_error: float  # tf_keras vs Keras 3 outputs on the check samples
    flattened: tuple[str, ...]  # names of nested models whose layers now sit in the outer graph
    source_api: str  # "keras3" or "tf_keras" (already Keras 2: nothing to rebuild)


def is_tf_keras(model) -> bool:
    import tf_keras

    return isinstance(model, tf_keras.Model)


def _clean(value):
    """A Keras 3 config value in the shape tf_keras deserialises."""
    if isinstance(value, dict):
        if value.get("class_name") in ("DTypePolicy", "FloatDTypePolicy"):
            return value["config"]["name"]
        return {k: _clean(v) for k, v in value.items() if k not in _KERAS3_ONLY_KEYS}
    if isinstance(value, (list, tuple)):
        return type(value)(_clean(v) for v in value)
    return value


@functools.lru_cache(maxsize=1)
def custom_objects() -> dict[str, Any]:
    """tf_keras counterparts the bridge adds (Keras 3's hard_sigmoid / hard_swish, ScaleShift for
    `x * c`, `x + c`): pass to tf_keras.utils.custom_object_scope wherever a bridged model is cloned."""
    import tensorflow as tf
    import tf_keras

    def edgekit_hard_sigmoid(x):
        return tf.nn.relu6(x + 3.0) / 6.0

    def edgekit_hard_swish(x):
        return x * tf.nn.relu6(x + 3.0) / 6.0

    class ScaleShift(tf_keras.layers.Layer):
        """y = x * scale + shift, for a Keras 3 keras.ops call on a tensor and a number."""

        def __init__(self, scale: float = 1.0, shift: float = 0.0, **kwargs):
            super().__init__(**kwargs)
            self.scale, self.shift = float(scale), float(shift)

        def call(self, x):
            return x * self.scale + self.shift

        def get_config(self):
            return {**super().get_config(), "scale": self.scale, "shift": self.shift}

    return {"edgekit_hard_sigmoid": edgekit_hard_sigmoid, "edgekit_hard_swish": edgekit_hard_swish,
            "ScaleShift": ScaleShift}


def _activation(value):
    if isinstance(value, str) and value in _KERAS3_ACTIVATIONS:
        return custom_objects()["edgekit_hard_sigmoid" if value == "hard_sigmoid" else "edgekit_hard_swish"]
    return value


def _layer_config(layer) -> dict[str, Any]:
    config = {}
    for key, value in layer.get_config().items():
        if key == "activation":
            value = _activation(value)
        if key in _DEFAULTED:
            if value != _DEFAULTED[key]:
                raise ModelFormatError(
                    f"layer {layer.name!r} ({type(layer).__name__}) uses {key}={value!r}, which tf_keras "
                    "(and so pruning and QAT) cannot represent"
                )
            continue
        config[_RENAMED.get(key, key)] = value if callable(value) else _clean(value)
    return config


def _check_graph(model) -> None:
    import keras

    if not isinstance(model, keras.Sequential) and getattr(model, "_nodes_by_depth", None) is None:
        raise ModelFormatError(
            f"model {model.name!r} ({type(model).__name__}) is a subclassed model: it has no layer graph "
            "to rebuild for pruning and QAT; build it with the functional API or keras.Sequential"
        )


class _Rebuilder:
    def __init__(self) -> None:
        import tf_keras

        self.tfk = tf_keras
        self.layers: dict[int, Any] = {}  # id(Keras 3 layer) -> tf_keras layer
        self.pairs: list[tuple[Any, Any]] = []
        self.flattened: list[str] = []

    def layer_for(self, layer):
        key = id(layer)
        if key not in self.layers:
            name = type(layer).__name__
            if not hasattr(self.tfk.layers, name):
                raise ModelFormatError(
                    f"layer {layer.name!r} ({name}) has no tf_keras counterpart, so pruning and QAT cannot "
                    "train it; convert without --prune/--qat"
                )
            try:
                new = self.tfk.layers.deserialize({"class_name": name, "config": _layer_config(layer)})
            except (TypeError, ValueError) as exc:
                reason = one_line(exc).split(" using config=")[0][:200]
                raise ModelFormatError(
                    f"layer {layer.name!r} ({name}) cannot be rebuilt in tf_keras, so pruning and QAT cannot "
                    f"train it: {reason}"
                ) from None
            self.layers[key] = new
            self.pairs.append((layer, new))
        return self.layers[key]

    def run_graph(self, model, inputs: list, training: bool | None = None) -> list:
        """Call the tf_keras twin of each node of `model`'s graph on `inputs` (tf_keras tensors). A nested
        model called with `training=...` passes it on to its layers (a frozen backbone's batch norm)."""
        import keras

        forced = {} if training is None else {"training": training}
        if isinstance(model, keras.Sequential):
            x = inputs[0]
            for layer in model.layers:
                x = self.call(layer, [x], dict(forced))[0]
            return [x]
        _check_graph(model)  # a nested model is only seen here
        nodes_by_depth = model._nodes_by_depth
        tensors = {id(t): v for t, v in zip(model.inputs, inputs)}
        for depth in sorted(nodes_by_depth, reverse=True):
            for node in nodes_by_depth[depth]:
                if node.operation is None or node.is_input:
                    continue
                args, kwargs = node.arguments.fill_in(tensors)
                outputs = self.call(node.operation, list(args), {**kwargs, **forced})
                for ref, new in zip(node.outputs, outputs):
                    tensors[id(ref)] = new
        missing = [t.name for t in model.outputs if id(t) not in tensors]
        if missing:
            raise ModelFormatError(f"model {model.name!r}: outputs {missing} are not connected to its inputs")
        return [tensors[id(t)] for t in model.outputs]

    def call(self, operation, args: list, kwargs: dict) -> list:
        import keras

        if isinstance(operation, keras.Model):  # nested model: flatten it into this graph
            self.flattened.append(operation.name)
            inner = args[0] if len(args) == 1 else args
            inner = list(inner) if isinstance(inner, (list, tuple)) else [inner]
            return self.run_graph(operation, inner, kwargs.get("training"))
        if not isinstance(operation, keras.layers.Layer) and type(operation).__name__ in _SCALAR_OPS:
            scaled = self.scalar_op(operation, args)
            if scaled is not None:
                return [scaled]
        if not isinstance(operation, keras.layers.Layer) or isinstance(operation, keras.layers.InputLayer):
            raise ModelFormatError(
                f"operation {operation.name!r} ({type(operation).__name__}) is a keras.ops call, not a layer; "
                "pruning and QAT need models built from keras.layers"
            )
        out = self.layer_for(operation)(*args, **kwargs)
        return list(out) if isinstance(out, (list, tuple)) else [out]


    def scalar_op(self, operation, args: list):
        """`x + c`, `x - c`, `x * c`, `x / c` (keras.ops on a tensor and a number) as a ScaleShift layer;
        None for any other shape of call."""
        kind = type(operation).__name__
        numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        tensors = [a for a in args if not isinstance(a, (int, float))]
        if len(args) != 2 or len(numbers) != 1 or len(tensors) != 1:
            return None
        c = float(numbers[0])
        if kind in ("Add", "Subtract"):
            sign = 1.0 if kind == "Add" else -1.0
            if kind == "Subtract" and args[0] is numbers[0]:  # c - x
                return custom_objects()["ScaleShift"](scale=-1.0, shift=c)(tensors[0])
            return custom_objects()["ScaleShift"](scale=1.0, shift=sign * c)(tensors[0])
        if kind == "Multiply":
            return custom_objects()["ScaleShift"](scale=c, shift=0.0)(tensors[0])
        if args[0] is numbers[0] or c == 0:  # c / x is not affine
            return None
        return custom_objects()["ScaleShift"](scale=1.0 / c, shift=0.0)(tensors[0])


def _copy_weights(pairs) -> None:
    for old, new in pairs:
        weights = old.get_weights()
        expected = [tuple(w.shape) for w in new.get_weights()]
        if [tuple(w.shape) for w in weights] != expected:
            raise ModelFormatError(
                f"layer {old.name!r} ({type(old).__name__}): weights {[w.shape for w in weights]} do not fit "
                f"its tf_keras twin {expected}"
            )
        new.set_weights(weights)


def to_tf_keras(model, check_x: np.ndarray, *, atol: float = 1e-5) -> BridgeResult:
    """A tf_keras copy of a Keras 3 model (or the model itself when it is tf_keras already), proved to give
    the same outputs on `check_x` within `atol` relative to the output scale."""
    import_tf()
    if is_tf_keras(model):
        return BridgeResult(model, 0.0, (), "tf_keras")
    _check_graph(model)
    rebuilder = _Rebuilder()
    tfk = rebuilder.tfk
    shapes = [tuple(t.shape[1:]) for t in model.inputs]
    dtypes = [str(getattr(t.dtype, "name", t.dtype)) for t in model.inputs]
    inputs = [tfk.Input(shape=s, dtype=d, name=t.name) for s, d, t in zip(shapes, dtypes, model.inputs)]
    outputs = rebuilder.run_graph(model, inputs)
    twin = tfk.Model(inputs, outputs if len(outputs) > 1 else outputs[0], name=model.name)
    _copy_weights(rebuilder.pairs)
    expected = np.asarray(model(check_x, training=False))
    got = np.asarray(twin(check_x, training=False))
    err = float(np.max(np.abs(expected - got))) if expected.size else 0.0
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    if not np.isfinite(err) or err > atol * scale:
        raise ModelFormatError(
            f"the tf_keras rebuild of {model.name!r} does not match the Keras 3 model (max abs error {err:.3g}); "
            "a layer behaves differently in tf_keras"
        )
    return BridgeResult(twin, err, tuple(rebuilder.flattened), "keras3")
