"""Quantization-aware training with tensorflow-model-optimization, on tf_keras models (see bridge.py).

Two things tfmot leaves to the user are done here:
- Layers outside tfmot's registry are refused with their name and class unless skipped; `Rescaling`, which
  Keras recommends putting inside the model and tfmot refuses, gets an output-only quantize config.
- tfmot starts every activation range at [-6, 6] and moves it by an EMA with decay 0.999, so a short
  fine-tune on a small dataset ends with ranges far from the data (the digits model loses 90 points
  before training and 1.1 after 3 epochs). The ranges are first set from the float model's activations on
  training samples, at the value the EMA settles at for the training batch size, and QAT refines them.
"""

from __future__ import annotations

import re

import numpy as np

from edgekit.converters._tf import import_tfmot
from edgekit.errors import ModelFormatError

_UNSUPPORTED = re.compile(r"Layer (\S+):<class '([\w.]+)'> is not supported")
_OUTPUT_ONLY = frozenset({"Rescaling"})  # affine layers tfmot refuses: quantize their output
_ACTIVATION_VARS = ("post_activation", "pre_activation", "output")


def _output_quantize_config():
    tfmot = import_tfmot()

    class OutputQuantizeConfig(tfmot.quantization.keras.QuantizeConfig):
        """Quantize only the layer's output (asymmetric, per tensor), like an activation."""

        def get_weights_and_quantizers(self, layer):
            return []

        def get_activations_and_quantizers(self, layer):
            return []

        def set_quantize_weights(self, layer, quantize_weights):
            pass

        def set_quantize_activations(self, layer, quantize_activations):
            pass

        def get_output_quantizers(self, layer):
            return [tfmot.quantization.keras.quantizers.MovingAverageQuantizer(
                num_bits=8, per_axis=False, symmetric=False, narrow_range=False)]

        def get_config(self):
            return {}

    return OutputQuantizeConfig


def quantize_aware(model, *, skip: frozenset[str], preserve_sparsity: bool):
    """A QAT copy of a float tf_keras model (the input model is left untouched)."""
    tfmot = import_tfmot()
    import tf_keras

    config_cls = _output_quantize_config()
    annotate = tfmot.quantization.keras.quantize_annotate_layer

    def annotated(layer):
        name = type(layer).__name__
        clone = layer.__class__.from_config(layer.get_config())
        if layer.name in skip or name == "InputLayer":
            return clone
        if name in _OUTPUT_ONLY:
            return annotate(clone, quantize_config=config_cls())
        return annotate(clone)

    copy = tf_keras.models.clone_model(model, clone_function=annotated)
    copy.set_weights(model.get_weights())
    scheme = (tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme() if preserve_sparsity
              else tfmot.quantization.keras.default_8bit.Default8BitQuantizeScheme())
    try:
        with tfmot.quantization.keras.quantize_scope({"OutputQuantizeConfig": config_cls}):
            return tfmot.quantization.keras.quantize_apply(copy, scheme)
    except RuntimeError as exc:
        # tfmot decides support after its layout transforms (a BatchNormalization after a conv is folded
        # into it, one on its own is not), so its verdict is the one to report
        found = _UNSUPPORTED.search(str(exc))
        if found is None:
            raise
        name, cls = found.group(1), found.group(2).rsplit(".", 1)[-1]
        raise ModelFormatError(
            f"layer {name!r} ({cls}) is not supported by quantization-aware training; pass --skip-layers "
            f"{name} to keep it in float"
        ) from None


def _range(values: np.ndarray, batch_size: int) -> tuple[float, float]:
    """The range tfmot's EMA settles at when training on batches of `batch_size`: the mean over batches of
    each batch's min and max (0 always inside, as TFLite requires)."""
    batches = max(1, len(values) // batch_size)
    per_batch = values[: batches * batch_size].reshape(batches, -1)
    return min(0.0, float(per_batch.min(axis=1).mean())), max(0.0, float(per_batch.max(axis=1).mean()))


def calibrate_ranges(qat_model, float_model, x: np.ndarray, batch_size: int) -> dict[str, tuple[float, float]]:
    """Set the QAT model's activation ranges from the float model's activations on `x` (as the EMA
    would settle for this batch size, so that training refines them instead of dragging them); returns
    them."""
    import tf_keras

    probe_model = tf_keras.models.clone_model(float_model)  # fresh layers: one graph node each
    probe_model.set_weights(float_model.get_weights())
    layers = [layer for layer in probe_model.layers if type(layer).__name__ != "InputLayer"]
    probe = tf_keras.Model(probe_model.inputs, [layer.output for layer in layers] + [layer.input for layer in layers])
    values = probe.predict(x, verbose=0, batch_size=64)
    outputs = {layer.name: v for layer, v in zip(layers, values[: len(layers)])}
    inputs = {layer.name: v for layer, v in zip(layers, values[len(layers):])}
    ranges: dict[str, tuple[float, float]] = {}

    def pre_activation(name: str) -> np.ndarray:
        layer = probe_model.get_layer(name)
        activation = layer.activation
        layer.activation = tf_keras.activations.linear
        try:
            return np.asarray(layer(inputs[name]))
        finally:
            layer.activation = activation

    model_inputs = {id(t) for t in qat_model.inputs}
    for wrapper in qat_model.layers:
        kind = type(wrapper).__name__
        if kind == "QuantizeLayer":
            if id(wrapper.input) not in model_inputs:
                continue  # after a float layer: tfmot's EMA sets it during training
            low_high = _range(x, batch_size)
            target = wrapper.name
        elif kind == "QuantizeWrapperV2" and wrapper.layer.name in outputs:
            target = wrapper.layer.name  # (a layer tfmot made by folding others keeps its EMA start)
        else:
            continue
        for var in wrapper.non_trainable_weights:
            base = var.name.split("/")[-1].split(":")[0]
            stem, _, end = base.rpartition("_")
            if end not in ("min", "max"):
                continue
            if kind == "QuantizeWrapperV2":
                if stem not in _ACTIVATION_VARS:
                    continue  # weight quantizers take the weights' own range at every step
                low_high = _range(pre_activation(target) if stem == "pre_activation" else outputs[target],
                                  batch_size)
            var.assign(np.full(var.shape, low_high[0] if end == "min" else low_high[1], np.float32))
            ranges[f"{wrapper.name}/{stem}"] = low_high
    return ranges
