"""QAT past what tfmot's default scheme covers (issue 12): layers it has no config for stay float with a
quantized output and are reported; DenseNet's transition (an AveragePooling2D after a conv) keeps its
scale; MobileNetV3's hard-swish, its keras.ops hard-sigmoid (`relu6(x + 3) * (1 / 6)`) and squeeze-excite
cross the bridge. Small stand-ins of each family, trained one epoch on the bundled digits."""

from __future__ import annotations

import pytest

import edgekit
from edgekit.runtime.inspect import analyze

KEPT_FLOAT_OPS = {"SUB", "MUL", "ADD", "FILL", "MEAN", "SQUARED_DIFFERENCE", "RSQRT", "TRANSPOSE", "RESHAPE",
                  "HARD_SWISH", "RELU6", "LOGISTIC"}


def _efficient_and_convnext_like(path):
    """Normalization at the input (EfficientNet), a BatchNormalization after a Concatenate (DenseNet),
    a LayerNormalization (ConvNeXt)."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Normalization(mean=[120.0] * 3, variance=[3600.0] * 3, name="norm")(inp)
    c = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.Concatenate()([x, c])
    x = keras.layers.BatchNormalization(name="bn_after_concat")(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.Conv2D(16, 1)(x)
    x = keras.layers.AveragePooling2D(2)(x)
    x = keras.layers.LayerNormalization(name="ln")(x)
    out = keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(x))
    keras.Model(inp, out).save(path)
    return path


def _dense_like(path):
    """DenseNet's block and transition: BN -> ReLU -> conv, concatenated; conv -> AveragePooling2D."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Activation("relu")(keras.layers.BatchNormalization()(
        keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)))
    y = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(
        keras.layers.Activation("relu")(keras.layers.BatchNormalization()(x)))
    x = keras.layers.Concatenate()([x, y])
    x = keras.layers.Conv2D(8, 1, use_bias=False)(keras.layers.Activation("relu")(keras.layers.BatchNormalization()(x)))
    x = keras.layers.AveragePooling2D(2, strides=2)(x)
    y = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(
        keras.layers.Activation("relu")(keras.layers.BatchNormalization()(x)))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Concatenate()([x, y]))
    keras.Model(inp, keras.layers.Dense(10, activation="softmax")(x)).save(path)
    return path


def _mobilenet_v3_like(path):
    """MobileNetV3's pieces as keras.applications writes them: Activation("hard_swish"), the hard sigmoid
    as keras.ops on a ReLU(6), squeeze-excite with a Multiply, and a Rescaling at the input."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Rescaling(1 / 255.0)(inp)
    x = keras.layers.Activation("hard_swish")(keras.layers.Conv2D(16, 3, padding="same")(x))
    se = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    se = keras.layers.Conv2D(16, 1)(keras.layers.ReLU()(keras.layers.Conv2D(4, 1)(se)))
    se = keras.layers.ReLU(6.0)(se + 3.0) * (1.0 / 6.0)
    x = keras.layers.Multiply()([x, se])
    x = keras.layers.GlobalAveragePooling2D()(x)
    keras.Model(inp, keras.layers.Dense(10, activation="softmax")(x)).save(path)
    return path


def _efficient_se_like(path):
    """EfficientNet's convs with a swish that TFLite cannot fuse (the squeeze-excite reduce conv has
    activation="swish" on the layer itself): the bridge splits it off so that the conv runs int8."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="swish")(keras.layers.Rescaling(1 / 255.0)(inp))
    se = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    se = keras.layers.Conv2D(2, 1, activation="swish", name="se_reduce")(se)
    se = keras.layers.Conv2D(8, 1, activation="sigmoid", name="se_expand")(se)
    x = keras.layers.Multiply(name="se_excite")([x, se])
    x = keras.layers.Dense(8, activation="gelu")(keras.layers.GlobalAveragePooling2D()(x))
    keras.Model(inp, keras.layers.Dense(10, activation="softmax")(x)).save(path)
    return path


@pytest.mark.parametrize("build, kept", [
    (_efficient_and_convnext_like, {"norm": "Normalization", "bn_after_concat": "BatchNormalization",
                                    "ln": "LayerNormalization"}),
    (_dense_like, {"BatchNormalization": 3}),
    (_mobilenet_v3_like, {"Activation": 1, "ScaleShift": 2, "Multiply": 1, "Rescaling": 1}),
    (_efficient_se_like, {"Multiply": 1, "Rescaling": 1}),
])
def test_qat_keeps_what_tfmot_cannot_quantize_in_float_and_says_so(build, kept, tmp_path, digits_dir):
    model = build(tmp_path / "m.keras")
    result = edgekit.convert(model, mode="int8", output=tmp_path / "m.qat.tflite",
                             training=edgekit.TrainingSpec(data=digits_dir / "train", qat=True, epochs=1, batch_size=64))
    got = result.metadata["compression"]["qat"]["kept_float"]
    if all(k[0].islower() for k in kept):
        assert got == kept
    else:
        counts = {}
        for kind in got.values():
            counts[kind] = counts.get(kind, 0) + 1
        assert counts == kept
    assert result.metadata["compression"]["bridge"]["max_abs_error"] <= 1e-4
    float_ops = {o["op"] for o in analyze(result.path.read_bytes(), gpu=False)["float_ops"]}
    assert float_ops <= KEPT_FLOAT_OPS, float_ops  # convs, dense, pooling, concat: all int8
    assert result.metadata["compression"]["qat"]["other_float_ops"] == 0  # each float op is a kept layer's
    assert result.metadata["verification"]["top1_agreement"] is not None


def test_a_relu_dead_on_every_training_image_still_converts(tmp_path, digits_dir):
    """A conv whose ReLU output is 0 on all training data ends QAT with the range [0, 0], which the
    converter writes as an int8 scale of 0 (TFLite refuses the file: MobileNetV2's last conv did this at
    96x96); the range is widened and reported."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(keras.layers.Rescaling(1 / 255.0)(inp))
    dead = keras.layers.Conv2D(4, 1, activation="relu", name="dead")
    pooled = [keras.layers.GlobalAveragePooling2D()(t) for t in (x, dead(x))]
    out = keras.layers.Dense(10, activation="softmax")(keras.layers.Concatenate()(pooled))
    model = keras.Model(inp, out)
    kernel, bias = dead.get_weights()
    dead.set_weights([kernel, np.full_like(bias, -1e3)])
    model.save(tmp_path / "dead.keras")
    result = edgekit.convert(tmp_path / "dead.keras", mode="int8", output=tmp_path / "dead.tflite",
                             training=edgekit.TrainingSpec(data=digits_dir / "train", qat=True, epochs=1))
    assert any("dead" in name for name in result.metadata["compression"]["qat"]["dead_ranges"])
    assert result.metadata["verification"]["top1_agreement"] is not None
