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
from edgekit.converters.targets import outputs_of
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
# the same calls on two tensors, and the tf_keras merge layer that computes them
_MERGE_OPS = {"Add": "Add", "Subtract": "Subtract", "Multiply": "Multiply"}
# layers with weights and an `activation`, and the activations TFLite fuses into them (tfmot quantizes
# before sigmoid/softmax/tanh, so those run int8 as separate ops)
_WEIGHTED = frozenset({"Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D", "Conv2DTranspose", "Dense"})
_FUSED = frozenset({"linear", "relu", "relu6", "sigmoid", "softmax", "tanh"})
# modules whose own layers (ConvNeXt's LayerScale, StochasticDepth) have a tf_keras twin in custom_objects()
_APPLICATION_MODULES = ("keras.src.applications.",)
# layer config keys that are new in Keras 3 and that tf_keras only lacks at their default value
_DEFAULTED = {"synchronized": False, "quantization_config": None, "lora_rank": None, "lora_alpha": None,
              "sparse": False, "ragged": False, "rms_scaling": False, "use_gate": False, "sliding_window": None}


@dataclass(frozen=True)
class BridgeResult:
    model: Any  # a tf_keras.Model
    max_abs_error: float  # tf_keras vs Keras 3 outputs on the check samples
    flattened: tuple[str, ...]  # names of nested models whose layers now sit in the outer graph
    source_api: str  # "keras3" or "tf_keras" (already Keras 2: nothing to rebuild)


def is_tf_keras(model) -> bool:
    import tf_keras

    return isinstance(model, tf_keras.Model)


def _tf_keras_copy(model):
    """A copy of a tf_keras model with its weights: fine-tuning and pruning change weights in place, and the
    caller's model stays the float reference the budget and the reports measure against (the model itself
    where `clone_model` cannot rebuild it: a subclassed model)."""
    import tf_keras

    try:
        twin = tf_keras.models.clone_model(model)
    except (ValueError, TypeError, NotImplementedError):
        return model
    twin.set_weights(model.get_weights())
    return twin


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
def _constant_op(tf: Any, tf_keras: Any) -> type:
    """The ConstantOp layer class (custom_objects): built on demand, as tf_keras is imported only then."""

    class ConstantOp(tf_keras.layers.Layer):
        """y = x + c, x - c, c - x or x * c for a Keras 3 keras.ops call on a tensor and a constant array that
        broadcasts (a ViT's position table, computed when the model was built); the constant is a frozen
        weight, as it was a constant in the graph."""

        def __init__(self, op: str = "Add", shape=(), reverse: bool = False, value=None, **kwargs):
            super().__init__(**kwargs)
            self.op, self.const_shape, self.reverse, self._value = op, tuple(shape), bool(reverse), value

        def build(self, input_shape):
            init = "zeros" if self._value is None else tf_keras.initializers.Constant(np.asarray(self._value))
            self.value = self.add_weight(name="value", shape=self.const_shape, trainable=False, initializer=init)
            super().build(input_shape)

        def call(self, x):
            c = tf.cast(self.value, x.dtype)
            if self.op == "Add":
                return x + c
            if self.op == "Multiply":
                return x * c
            return c - x if self.reverse else x - c

        def get_config(self):  # the constant itself travels with the weights
            return {**super().get_config(), "op": self.op, "shape": list(self.const_shape), "reverse": self.reverse}

    return ConstantOp


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

    ConstantOp = _constant_op(tf, tf_keras)

    class LayerScale(tf_keras.layers.Layer):
        """keras.applications.convnext.LayerScale: y = x * gamma, one trained factor per channel."""

        def __init__(self, init_values: float, projection_dim: int, **kwargs):
            super().__init__(**kwargs)
            self.init_values, self.projection_dim = init_values, projection_dim

        def build(self, input_shape):
            self.gamma = self.add_weight(name="gamma", shape=(self.projection_dim,), trainable=True,
                                         initializer=tf_keras.initializers.Constant(self.init_values))
            super().build(input_shape)

        def call(self, x):
            return x * self.gamma

        def get_config(self):
            return {**super().get_config(), "init_values": self.init_values, "projection_dim": self.projection_dim}

    class StochasticDepth(tf_keras.layers.Layer):
        """keras.applications.convnext.StochasticDepth: drops the whole residual branch of a batch with
        probability drop_path_rate in training; the identity at inference."""

        def __init__(self, drop_path_rate: float, **kwargs):
            super().__init__(**kwargs)
            self.drop_path_rate = drop_path_rate

        def call(self, x, training=None):
            if not training or not self.drop_path_rate:
                return x
            keep = 1.0 - self.drop_path_rate
            shape = tf.concat([tf.shape(x)[:1], tf.ones([tf.rank(x) - 1], tf.int32)], 0)
            return x / keep * tf.floor(keep + tf.random.uniform(shape))

        def get_config(self):
            return {**super().get_config(), "drop_path_rate": self.drop_path_rate}

    return {"edgekit_hard_sigmoid": edgekit_hard_sigmoid, "edgekit_hard_swish": edgekit_hard_swish,
            "ScaleShift": ScaleShift, "ConstantOp": ConstantOp, "LayerScale": LayerScale, "StochasticDepth": StochasticDepth}


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
    if type(layer).__name__ == "MultiHeadAttention":  # tf_keras's from_config pops these; None: built on call
        for key in ("query_shape", "key_shape", "value_shape"):
            config.setdefault(key, None)
        config.pop("seed", None)  # its dropout's seed: tf_keras's takes none, and fine-tuning reseeds
    return config


# recurrences the twin runs unrolled over a known number of steps: TFLite's fused sequence ops cannot carry
# QAT's fake quantization ("We cannot duplicate the value since it's not constant") and its calibrator
# segfaults on them (converters/recurrent.py unrolls them the same way for post-training int8)
_RECURRENT = frozenset({"LSTM", "GRU", "SimpleRNN"})
MAX_UNROLLED_STEPS = 256


def _unrolled(config: dict[str, Any], kind: str, steps: int | None) -> dict[str, Any]:
    if steps is None or not 0 < steps <= MAX_UNROLLED_STEPS:
        return config
    if kind in _RECURRENT:
        return {**config, "unroll": True}
    if kind == "Bidirectional":
        for key in ("layer", "backward_layer"):
            inner = config.get(key)
            if isinstance(inner, dict) and inner.get("class_name") in _RECURRENT:
                config = {**config, key: {**inner, "config": {**inner["config"], "unroll": True}}}
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
        self.layer_names: set[str] = set()  # every layer name of the model and its nested models
        self.activations: dict[int, Any] = {}  # id(Keras 3 layer) -> the Activation split off its twin

    def layer_for(self, layer, input_rank: int | None = None, steps: int | None = None):
        key = id(layer)
        if key not in self.layers:
            config = _unrolled(_layer_config(layer), type(layer).__name__, steps)
            self.activations[key] = self._split_activation(layer, config)
            self.layers[key] = self._twin(layer, config, input_rank)
            self.pairs.append((layer, self.layers[key]))
        return self.layers[key]

    def _twin(self, layer, config: dict[str, Any], input_rank: int | None):
        if _pointwise_dense(layer, input_rank):
            return self.tfk.layers.Conv2D(kernel_size=1, **_dense_as_conv(config))
        if type(layer).__name__ == "SeparableConv2D" and config.get("data_format") in (None, "channels_last"):
            return self._separable(config)
        name = type(layer).__name__
        twins = custom_objects() if type(layer).__module__.startswith(_APPLICATION_MODULES) else {}
        if not hasattr(self.tfk.layers, name) and name not in twins:
            raise ModelFormatError(
                f"layer {layer.name!r} ({name}) has no tf_keras counterpart, so pruning and QAT cannot "
                "train it; convert without `pruning` and `training.qat`"
            )
        try:
            return self.tfk.layers.deserialize({"class_name": name, "config": config}, custom_objects=twins)
        except (TypeError, ValueError) as exc:
            reason = one_line(exc).split(" using config=")[0][:200]
            raise ModelFormatError(
                f"layer {layer.name!r} ({name}) cannot be rebuilt in tf_keras, so pruning and QAT cannot "
                f"train it: {reason}"
            ) from None

    def _separable(self, config: dict[str, Any]) -> _Chain:
        """SeparableConv2D as the DepthwiseConv2D and 1x1 Conv2D it computes (tfmot has no QAT config for it
        and would leave Xception's and NASNet's convs float; as two layers both train and run int8, and a
        BatchNormalization after it folds into the 1x1 conv). The 1x1 conv keeps the layer's name."""
        tfk = self.tfk.layers
        depthwise = tfk.DepthwiseConv2D(
            config["kernel_size"], strides=config.get("strides", 1), padding=config.get("padding", "valid"),
            depth_multiplier=config.get("depth_multiplier", 1), dilation_rate=config.get("dilation_rate", 1),
            use_bias=False, name=self._unique(f"{config['name']}_depthwise"), dtype=config.get("dtype"),
            trainable=config.get("trainable", True))
        pointwise = tfk.Conv2D(config["filters"], 1, use_bias=config.get("use_bias", True),
                               activation=config.get("activation"), name=config["name"], dtype=config.get("dtype"),
                               trainable=config.get("trainable", True))
        return _Chain(depthwise, pointwise)

    def _split_activation(self, layer, config: dict[str, Any]):
        """A conv/dense layer whose activation TFLite cannot fuse (swish, gelu, hard-swish, ...): tfmot
        quantizes only after such an activation, so the int8 converter leaves the conv float. The twin
        computes linearly and an Activation layer follows (the same math): its input is then quantized
        and the conv runs int8. Returns that Activation layer, or None."""
        value = config.get("activation")
        name = value if isinstance(value, str) else getattr(value, "__name__", None)
        if type(layer).__name__ not in _WEIGHTED or name is None or name in _FUSED:
            return None
        config["activation"] = "linear"
        return self.tfk.layers.Activation(value, name=self._unique(f"{layer.name}_activation"))

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
            scaled = _rebuilt(operation, lambda: self.scalar_op(operation, args))
            if scaled is not None:
                return [scaled]
        if not isinstance(operation, keras.layers.Layer) or isinstance(operation, keras.layers.InputLayer):
            raise ModelFormatError(
                f"operation {operation.name!r} ({type(operation).__name__}) is a keras.ops call, not a layer; "
                "pruning and QAT need models built from keras.layers"
            )
        shape = getattr(args[0], "shape", None) if args else None
        rank = len(shape) if shape is not None else None
        steps = shape[1] if shape is not None and rank == 3 else None
        twin = self.layer_for(operation, rank, steps)
        out = _rebuilt(operation, lambda: twin(*args, **kwargs))
        if self.activations.get(id(operation)) is not None:
            out = self.activations[id(operation)](out)
        return list(out) if isinstance(out, (list, tuple)) else [out]


    def scalar_op(self, operation, args: list):
        """keras.ops on two tensors (`x + y`, ConvNeXt's residual) as the tf_keras merge layer; on a tensor
        and a constant array (a ViT's position table) as a ConstantOp layer; on a tensor and a number (`x + c`, `x * c`, `x / c`) as a ScaleShift layer; None for any other shape of call."""
        kind = type(operation).__name__
        numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        tensors = [a for a in args if not isinstance(a, (int, float))]
        constants = [a for a in tensors if not self.tfk.backend.is_keras_tensor(a)]
        if len(args) == 2 and len(tensors) == 2 and len(constants) == 1 and kind in _MERGE_OPS:
            value = np.asarray(constants[0])
            (symbolic,) = [a for a in tensors if a is not constants[0]]
            return custom_objects()["ConstantOp"](op=kind, shape=value.shape, reverse=args[0] is constants[0],
                                                  value=value, name=self._unique(operation.name))(symbolic)
        if len(args) == 2 and len(tensors) == 2 and kind in _MERGE_OPS:
            merged = getattr(self.tfk.layers, _MERGE_OPS[kind])(name=self._unique(operation.name))
            return merged(tensors)
        if len(args) != 2 or len(numbers) != 1 or len(tensors) != 1:
            return None
        c = float(numbers[0])
        shift_scale = custom_objects()["ScaleShift"]
        if kind in ("Add", "Subtract"):
            sign = 1.0 if kind == "Add" else -1.0
            if kind == "Subtract" and args[0] is numbers[0]:  # c - x
                return shift_scale(scale=-1.0, shift=c)(tensors[0])
            return shift_scale(scale=1.0, shift=sign * c)(tensors[0])
        if kind == "Multiply":
            return shift_scale(scale=c, shift=0.0)(tensors[0])
        if args[0] is numbers[0] or c == 0:  # c / x is not affine
            return None
        return shift_scale(scale=1.0 / c, shift=0.0)(tensors[0])

    def _unique(self, name: str) -> str:
        """`name` for a layer the bridge adds, unless a layer of the model has it (an op and a layer can
        share a name in Keras 3, not in tf_keras)."""
        self.used: set[str] = getattr(self, "used", set())
        candidate, n = name, 0
        while candidate in self.used or candidate in self.layer_names:
            n += 1
            candidate = f"{name}_{n}"
        self.used.add(candidate)
        return candidate


def _rebuilt(operation, make):
    """`make()` (a tf_keras call rebuilding `operation`); what tf_keras raises there is one line naming it
    (a keras.ops add of a (16, 32) position table to (None, 16, 32) patches: tf_keras's Add does not broadcast)."""
    try:
        return make()
    except ModelFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - tf_keras raises many types for a call it cannot make
        raise ModelFormatError(f"{operation.name!r} ({type(operation).__name__}) cannot be rebuilt in tf_keras, "
                               f"so pruning and QAT cannot train it: {one_line(exc)[:200]}") from None


def _pointwise_dense(layer, input_rank: int | None) -> bool:
    """A Dense layer applied to the channels of an image (ConvNeXt's pointwise layers): tf_keras would
    compute it as a tensordot (a dynamic reshape around a float matmul that neither QAT nor the int8
    converter quantize), so the bridge rebuilds it as the equal 1x1 Conv2D. Only for a layer called once."""
    return (type(layer).__name__ == "Dense" and input_rank == 4
            and len(getattr(layer, "_inbound_nodes", ())) == 1)


def _dense_as_conv(config: dict[str, Any]) -> dict[str, Any]:
    renamed = {"units": "filters"}
    kept = ("name", "trainable", "dtype", "units", "activation", "use_bias", "kernel_initializer",
            "bias_initializer", "kernel_regularizer", "bias_regularizer", "activity_regularizer",
            "kernel_constraint", "bias_constraint")
    return {renamed.get(k, k): config[k] for k in kept if k in config}


class _Chain:
    """Layers the bridge calls one after the other in place of one Keras 3 layer."""

    def __init__(self, *layers) -> None:
        self.layers = layers

    def __call__(self, x, **kwargs):
        for layer in self.layers:
            x = layer(x, **kwargs)
        return x

    def set_weights(self, weights: list) -> None:
        """A SeparableConv2D's [depthwise kernel, pointwise kernel, (bias)] onto its two layers."""
        self.layers[0].set_weights(weights[:1])
        self.layers[1].set_weights(weights[1:])

    def get_weights(self) -> list:
        return [w for layer in self.layers for w in layer.get_weights()]


def _copy_weights(pairs) -> None:
    for old, new in pairs:
        weights = old.get_weights()
        if type(old).__name__ == "Dense" and type(new).__name__ == "Conv2D":  # a pointwise Dense as 1x1 conv
            weights = [weights[0].reshape(1, 1, *weights[0].shape), *weights[1:]]
        expected = [tuple(w.shape) for w in new.get_weights()]
        if [tuple(w.shape) for w in weights] != expected:
            raise ModelFormatError(
                f"layer {old.name!r} ({type(old).__name__}): weights {[w.shape for w in weights]} do not fit "
                f"its tf_keras twin {expected}"
            )
        new.set_weights(weights)


def to_tf_keras(model, check_x, *, atol: float = 1e-5) -> BridgeResult:
    """A tf_keras copy of a Keras 3 model (a plain copy when it is tf_keras already), proved to give the same
    outputs on `check_x` (an array, or one per input) within `atol` relative to the output scale."""
    import_tf()
    if is_tf_keras(model):
        return BridgeResult(_tf_keras_copy(model), 0.0, (), "tf_keras")
    _check_graph(model)
    rebuilder = _Rebuilder()
    rebuilder.layer_names = {layer.name for layer in model._flatten_layers(include_self=True, recursive=True)}
    tfk = rebuilder.tfk
    shapes = [tuple(t.shape[1:]) for t in model.inputs]
    dtypes = [str(getattr(t.dtype, "name", t.dtype)) for t in model.inputs]
    inputs = [tfk.Input(shape=s, dtype=d, name=t.name) for s, d, t in zip(shapes, dtypes, model.inputs)]
    outputs = rebuilder.run_graph(model, inputs)
    twin = tfk.Model(inputs, outputs if len(outputs) > 1 else outputs[0], name=model.name)
    _copy_weights(rebuilder.pairs)
    expected = outputs_of(model(check_x, training=False))
    got = outputs_of(_rebuilt(twin, lambda: twin(check_x, training=False)))
    err = max((float(np.max(np.abs(e - g))) if e.size else 0.0 for e, g in zip(expected, got)), default=0.0)
    scale = max([1.0, *(float(np.max(np.abs(e))) for e in expected if e.size)])
    if not np.isfinite(err) or err > atol * scale:
        raise ModelFormatError(
            f"the tf_keras rebuild of {model.name!r} does not match the Keras 3 model (max abs error {err:.3g}); "
            "a layer behaves differently in tf_keras"
        )
    return BridgeResult(twin, err, tuple(rebuilder.flattened), "keras3")
