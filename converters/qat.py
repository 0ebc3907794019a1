"""Quantization-aware training with tensorflow-model-optimization, on tf_keras models (see bridge.py).

Two things tfmot leaves to the user are done here:
- Layers tfmot's default scheme has no config for -- `Rescaling` and `Normalization` at the input, a
  BatchNormalization that does not follow a conv or dense layer (tfmot folds only those), LayerNormalization,
  activations outside relu/relu6/swish/gelu/linear/softmax/sigmoid/tanh, anything else its registry refuses
  -- stay float with a quantized output (an output-only quantize config), and are reported; `--skip-layers`
  keeps a layer fully float. Where tfmot still refuses a layer after its layout transforms, that layer gets
  the same fallback and quantization is applied again.
- tfmot starts every activation range at [-6, 6] and moves it by an EMA with decay 0.999, so a short
  fine-tune on a small dataset ends with ranges far from the data (the digits model loses 90 points
  before training and 1.1 after 3 epochs). The ranges are first set from the float model's activations on
  training samples, at the value the EMA settles at for the training batch size, and QAT refines them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from edgekit.converters._tf import import_tfmot
from edgekit.converters.bridge import custom_objects
from edgekit.errors import ModelFormatError

_UNSUPPORTED = re.compile(r"Layer (\S+):<class '([\w.]+)'> is not supported")
_OUTPUT_ONLY = frozenset({"Rescaling"})  # affine layers tfmot refuses: quantize their output
_ACTIVATIONS = frozenset({"relu", "relu6", "swish", "gelu", "linear", "softmax", "sigmoid", "tanh"})  # tfmot's
_FOLDS_BN = frozenset({"Conv2D", "DepthwiseConv2D", "Dense"})  # tfmot folds a BatchNormalization right after
# tfmot quantizes these outputs on their own, but TFLite's int8 kernels need the input's scale kept
_SAME_SCALE = frozenset({"AveragePooling2D"})
MAX_RETRIES = 20
_ACTIVATION_VARS = ("post_activation", "pre_activation", "output")
DEAD_RANGE = 1e-6  # an activation range narrower than this saw only zeros
DEAD_RANGE_WIDTH = 1.0  # what such a range becomes


def _output_quantize_config(quantize_output: bool = True):
    tfmot: Any = import_tfmot()  # untyped: its classes are Any to a type checker

    class OutputQuantizeConfig(tfmot.quantization.keras.QuantizeConfig):
        """Quantize only the layer's output (asymmetric, per tensor), like an activation; or nothing, for
        ops whose int8 kernel keeps its input's scale (AVERAGE_POOL_2D): TFLite then carries the input's."""

        def get_weights_and_quantizers(self, layer):
            return []

        def get_activations_and_quantizers(self, layer):
            return []

        def set_quantize_weights(self, layer, quantize_weights):
            pass

        def set_quantize_activations(self, layer, quantize_activations):
            pass

        def get_output_quantizers(self, layer):
            if not quantize_output:
                return []
            return [tfmot.quantization.keras.quantizers.MovingAverageQuantizer(
                num_bits=8, per_axis=False, symmetric=False, narrow_range=False)]

        def get_config(self):
            return {}

    if not quantize_output:  # its own name: tfmot rebuilds configs by class name inside quantize_scope
        return type("SameScaleQuantizeConfig", (OutputQuantizeConfig,), {})
    return OutputQuantizeConfig


def _follows_foldable(layer) -> bool:
    """A BatchNormalization whose input is a conv/dense layer's output read by nothing else: tfmot folds it."""
    nodes = getattr(layer, "_inbound_nodes", [])
    if len(nodes) != 1:
        return False
    inbound = nodes[0].inbound_layers
    producer = inbound[0] if isinstance(inbound, (list, tuple)) and len(inbound) == 1 else inbound
    if isinstance(producer, (list, tuple)) or type(producer).__name__ not in _FOLDS_BN:
        return False
    return len(getattr(producer, "_outbound_nodes", [])) == 1


def fallback_layers(model) -> dict[str, str]:
    """Layer name -> class of the layers tfmot's default 8-bit scheme has no config for: they stay float
    with a quantized output."""
    import_tfmot()  # first: it settles which Keras tfmot sees
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry_module,
    )

    registry = registry_module.Default8BitQuantizeRegistry()
    found = {}
    for layer in model.layers:
        kind = type(layer).__name__
        if kind == "InputLayer":
            continue
        if kind == "BatchNormalization":
            unsupported = not _follows_foldable(layer)
        elif kind == "Activation":
            unsupported = getattr(layer.activation, "__name__", None) not in _ACTIVATIONS
        else:
            unsupported = kind in _OUTPUT_ONLY or not registry.supports(layer)
        if unsupported:
            found[layer.name] = kind
    return found


# attention layers take query, value (and key) tensors, which tfmot's QuantizeWrapper cannot build on (it
# asks compute_output_shape for one input shape): kept float without their output quantized, and listed
_SEVERAL_INPUTS = frozenset({"MultiHeadAttention", "Attention", "AdditiveAttention", "GroupQueryAttention"})


def quantize_aware(model, *, skip: frozenset[str], preserve_sparsity: bool):
    """(a QAT copy of a float tf_keras model, {layer: class} kept float with a quantized output). The
    input model is left untouched."""
    fallback = {name: kind for name, kind in fallback_layers(model).items() if name not in skip}
    for _ in range(MAX_RETRIES):
        try:
            return _apply(model, skip, fallback, preserve_sparsity), fallback
        except RuntimeError as exc:
            # tfmot decides support after its layout transforms, so its verdict can name one more layer
            found = _UNSUPPORTED.search(str(exc))
            if found is None:
                raise
            name, cls = found.group(1), found.group(2).rsplit(".", 1)[-1]
            if name in fallback or name in skip:
                raise ModelFormatError(
                    f"layer {name!r} ({cls}) is not supported by quantization-aware training, even with its "
                    f"output only quantized; add it to `training.skip_layers` to keep it in float") from None
            fallback[name] = cls
        except ValueError as exc:
            raise ModelFormatError(f"quantization-aware training cannot wrap this model: {exc}") from None
    raise ModelFormatError(f"quantization-aware training refused {MAX_RETRIES} layers in turn; "
                           f"the last were {', '.join(list(fallback)[-3:])}")


def _integer_input(layer) -> bool:
    """The layer reads an integer tensor (an Embedding fed token ids)."""
    try:
        inputs = layer.input
    except (AttributeError, ValueError):  # a layer used several times, or not in a graph
        return False
    inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return any(getattr(getattr(t, "dtype", None), "is_integer", False) for t in inputs)


def _apply(model, skip: frozenset[str], fallback: dict[str, str], preserve_sparsity: bool):
    tfmot = import_tfmot()
    import tf_keras

    config_cls = _output_quantize_config()
    same_scale_cls = _output_quantize_config(quantize_output=False)
    annotate = tfmot.quantization.keras.quantize_annotate_layer

    def annotated(layer):
        clone = layer.__class__.from_config(layer.get_config())
        if layer.name in skip or type(layer).__name__ == "InputLayer":
            return clone
        if _integer_input(layer):  # token ids: tfmot would put a QuantizeLayer on the int32 input
            fallback.setdefault(layer.name, type(layer).__name__)
            return clone
        if layer.name in fallback:
            if type(layer).__name__ in _SEVERAL_INPUTS:  # tfmot's wrapper builds on one input shape only
                return clone
            return annotate(clone, quantize_config=config_cls())
        if type(layer).__name__ in _SAME_SCALE:
            return annotate(clone, quantize_config=same_scale_cls())
        return annotate(clone)

    with tf_keras.utils.custom_object_scope(custom_objects()):
        copy = tf_keras.models.clone_model(model, clone_function=annotated)
    copy.set_weights(model.get_weights())
    scheme = (tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme() if preserve_sparsity
              else tfmot.quantization.keras.default_8bit.Default8BitQuantizeScheme())
    with tfmot.quantization.keras.quantize_scope({"OutputQuantizeConfig": config_cls,
                                                  "SameScaleQuantizeConfig": same_scale_cls, **custom_objects()}):
        return tfmot.quantization.keras.quantize_apply(copy, scheme)


def _batches(n: int, batch_size: int) -> list[slice]:
    """The training batches tfmot's EMA sees: whole batches of `batch_size` (all `n` when fewer)."""
    if n <= batch_size:
        return [slice(0, n)]
    return [slice(i * batch_size, (i + 1) * batch_size) for i in range(n // batch_size)]


class _RangeMeter:
    """The range tfmot's EMA settles at when training on batches of `batch_size`: the mean over batches of
    each batch's min and max (0 always inside, as TFLite requires). Fed one batch at a time, so that a
    large model's activations never all sit in memory (every layer of MobileNetV2 at 96x96 for 200 images: gigabytes)."""

    def __init__(self) -> None:
        self.lows: list[float] = []
        self.highs: list[float] = []
        self.dead = False  # saw only zeros

    def add(self, values) -> None:
        values = np.asarray(values)
        self.lows.append(float(values.min()))
        self.highs.append(float(values.max()))

    def range(self) -> tuple[float, float]:
        """The settled range; one that saw only zeros (a ReLU dead on every sample) gets the width
        DEAD_RANGE_WIDTH: the converter writes [0, 0] as an int8 scale of 0, which the interpreter refuses."""
        low, high = min(0.0, float(np.mean(self.lows))), max(0.0, float(np.mean(self.highs)))
        self.dead = high - low < DEAD_RANGE
        return (low, low + DEAD_RANGE_WIDTH) if self.dead else (low, high)


def _stem_end(var) -> tuple[str, str]:
    """("post_activation", "min") for a tfmot variable named "quant_conv/post_activation_min:0"."""
    stem, _, end = var.name.split("/")[-1].split(":")[0].rpartition("_")
    return stem, end


def _range_targets(qat_model, layer_names: set[str]) -> list[tuple[Any, Any, str, str]]:
    """(wrapper, min/max variable, source, end) for every activation range to start from data: source is
    "input:<i>" (the QuantizeLayer of model input i), "pre_activation:<layer>" or "output:<layer>"."""
    model_inputs = {id(t): i for i, t in enumerate(qat_model.inputs)}
    targets = []
    for wrapper in qat_model.layers:
        kind = type(wrapper).__name__
        if kind == "QuantizeLayer" and id(wrapper.input) not in model_inputs:
            continue  # after a float layer: tfmot's EMA sets it during training
        if kind == "QuantizeWrapperV2" and wrapper.layer.name not in layer_names:
            continue  # a layer tfmot made by folding others keeps its EMA start
        if kind not in ("QuantizeLayer", "QuantizeWrapperV2"):
            continue
        for var in wrapper.non_trainable_weights:
            stem, end = _stem_end(var)
            if end not in ("min", "max"):
                continue
            if kind == "QuantizeLayer":
                targets.append((wrapper, var, f"input:{model_inputs[id(wrapper.input)]}", end))
            elif stem in _ACTIVATION_VARS:  # weight quantizers take the weights' own range at every step
                source = "pre_activation" if stem == "pre_activation" else "output"
                targets.append((wrapper, var, f"{source}:{wrapper.layer.name}", end))
    return targets


def calibrate_ranges(qat_model, float_model, x: np.ndarray | list[np.ndarray],
                     batch_size: int) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Set the QAT model's activation ranges from the float model's activations on `x` (one array per
    input; as the EMA would settle for this batch size, so that training refines them instead of dragging
    them); returns them, and the names of those that saw only zeros (started as [0, 1])."""
    import tf_keras

    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    with tf_keras.utils.custom_object_scope(custom_objects()):
        probe_model = tf_keras.models.clone_model(float_model)  # fresh layers: one graph node each
    probe_model.set_weights(float_model.get_weights())
    names = {layer.name for layer in probe_model.layers if type(layer).__name__ != "InputLayer"}
    targets = _range_targets(qat_model, names)
    sources = sorted({source for _, _, source, _ in targets if not source.startswith("input:")})
    layers = [probe_model.get_layer(source.split(":", 1)[1]) for source in sources]
    probe = tf_keras.Model(probe_model.inputs, [layer.input if source.startswith("pre_") else layer.output
                                                for source, layer in zip(sources, layers)])
    meters = {source: _RangeMeter() for source in [*(f"input:{i}" for i in range(len(xs))), *sources]}
    for batch in _batches(len(xs[0]), batch_size):
        feed = [a[batch] for a in xs]
        for i, a in enumerate(feed):
            meters[f"input:{i}"].add(a)
        values = probe.predict_on_batch(feed if len(feed) > 1 else feed[0]) if sources else []
        values = values if isinstance(values, (list, tuple)) else [values]
        for source, layer, value in zip(sources, layers, values):
            meters[source].add(_pre_activation(layer, value) if source.startswith("pre_") else value)
    ranges: dict[str, tuple[float, float]] = {}
    dead: list[str] = []
    for wrapper, var, source, end in targets:
        low_high = meters[source].range()
        var.assign(np.full(var.shape, low_high[0] if end == "min" else low_high[1], np.float32))
        name = f"{wrapper.name}/{_stem_end(var)[0]}"
        ranges[name] = low_high
        if meters[source].dead and name not in dead:
            dead.append(name)
    return ranges, dead


def widen_dead_ranges(qat_model) -> list[str]:
    """Give every activation range that shrank to nothing in training (the EMA of a ReLU dead on all
    training data tends to [0, 0]) the width [min, min + 1]: the converter writes a [0, 0] range as an int8
    scale of 0, which TFLite refuses; a tensor that is all zeros quantizes exactly with any scale. Returns
    the ranges it changed."""
    widened = []
    for wrapper in qat_model.layers:
        pairs: dict[str, dict[str, Any]] = {}
        for var in wrapper.non_trainable_weights:
            stem, end = _stem_end(var)
            if end in ("min", "max") and (type(wrapper).__name__ == "QuantizeLayer" or stem in _ACTIVATION_VARS):
                pairs.setdefault(stem, {})[end] = var
        for stem, pair in pairs.items():
            if len(pair) != 2:
                continue
            low, high = pair["min"].numpy(), pair["max"].numpy()
            dead = (high - low) < DEAD_RANGE
            if np.any(dead):
                pair["max"].assign(np.where(dead, low + DEAD_RANGE_WIDTH, high).astype(np.float32))
                widened.append(f"{wrapper.name}/{stem}")
    return widened


def _pre_activation(layer, inputs) -> np.ndarray:
    """`layer`'s output on `inputs` before its activation."""
    import tf_keras

    activation = layer.activation
    layer.activation = tf_keras.activations.linear
    try:
        return np.asarray(layer(inputs))
    finally:
        layer.activation = activation
