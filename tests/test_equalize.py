"""Cross-layer equalisation (converters/int8/equalization.py) on the converter's calibrated TFLite model: which layer
pairs it finds in TFLite's graph of Keras models, that the equalised float model computes what the float model
does with the moved tensors' ranges measured again, and that a weight shared by two ops is left alone (the
outlier CNN in test_ranges.py is where `auto` keeps it)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import run_cli

import edgekit
from edgekit.converters.int8 import equalization as equalize
from edgekit.errors import ConversionError


def _randomised(model, seed=0):
    """Random weights everywhere, BatchNorm statistics included, with a few channels 100x (the imbalance
    equalisation exists for): an untrained model's channels are alike and would prove little."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        value = rng.normal(0, 0.5, v.shape).astype("float32")
        if "moving_variance" in v.path:
            value = np.abs(value) + 0.1
        if v.path.endswith("kernel") and len(v.shape) >= 2:
            value[..., :2] *= 100.0
        v.assign(value)
    return model


def _functional():
    import keras
    from keras import layers

    inp = keras.Input((12, 12, 3))
    a = layers.Conv2D(8, 3, activation="relu", name="conv_relu")(inp)
    a = layers.MaxPooling2D(name="pool")(a)
    b = layers.Conv2D(8, 3, padding="same", name="conv_bn")(a)
    b = layers.BatchNormalization(name="bn")(b)
    b = layers.ReLU(name="relu")(b)
    c = layers.Conv2D(8, 3, padding="same", activation="relu6", name="conv_relu6")(b)  # ReLU6: not homogeneous
    d = layers.Conv2D(8, 1, name="conv_into_add")(c)
    d = layers.Add(name="residual")([d, c])  # a residual Add reads it: left alone
    t = layers.Reshape((25, 8))(d)
    h = layers.LayerNormalization(name="ln_attention")(t)
    t = t + layers.MultiHeadAttention(2, 4, name="mha")(h, h)
    h = layers.LayerNormalization(name="ln_mlp")(t)
    h = layers.Dense(16, activation="gelu", name="mlp_in")(h)
    t = t + layers.Dense(8, name="mlp_out")(h)
    flat = layers.GlobalAveragePooling1D()(t)
    hidden = layers.Dense(12, activation="relu", name="fc")(flat)
    out = layers.Dense(5, name="logits")(hidden)
    return keras.Model(inp, [out, hidden])  # `fc` is also an output: left alone


def _calibrated(model, samples: list):
    """The converter's calibrated float model of `model` on `samples` (TFLite's graph: BatchNorm folded)."""
    import tensorflow as tf

    from edgekit.converters.int8 import ranges

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(samples)
    return ranges.calibrated_model(converter)


def _samples(shape, n=12, seed=1):
    rng = np.random.default_rng(seed)
    return [[rng.uniform(0, 1, (1, *shape)).astype("float32")] for _ in range(n)]


def _found(plan) -> dict[str, list[str]]:
    """Producer -> consumers, by the Keras layer names in TFLite's op names."""
    def layer(name):  # the first Keras layer of ours named in any of the fused ops' names
        parts = [part.rsplit("_", 1)[0] for fused in name.split(";") for part in fused.split("/")[1:]]
        return next((part for part in parts if part in LAYERS), name)

    return {layer(p.producer): sorted({layer(c) for c in p.consumer_names}) for p in plan.pairs}


LAYERS = {"conv_relu", "conv_bn", "conv_relu6", "conv_into_add", "ln_attention", "ln_mlp", "mha", "mlp_in",
          "mlp_out", "fc", "logits", "c", "d", "a", "b", "shared", "inner_b"}


def test_pairs_are_found_through_relu_pooling_and_batchnorm_and_nowhere_else():
    model = _randomised(_functional())
    plan = equalize.plan(_calibrated(model, _samples((12, 12, 3))))
    # the Keras version's four pairs, read from TFLite's graph: BatchNorm folded into conv_bn, the attention's
    # query / key / value projections three FULLY_CONNECTED, mlp_in a Dense on a sequence (through a RESHAPE);
    # not through ReLU6, not into the residual Add, not past `fc` (also an output)
    assert _found(plan) == {"conv_relu": ["conv_bn"], "conv_bn": ["conv_relu6"], "ln_attention": ["mha"],
                            "ln_mlp": ["mlp_in"]}
    assert plan.worth_it and plan.largest > equalize.WORTH


def test_the_equalised_float_model_computes_the_same_and_its_moved_ranges_are_measured_again():
    from ai_edge_litert.interpreter import Interpreter

    from edgekit.converters.int8.ranges import ranged_tensors

    model = _randomised(_functional())
    samples = _samples((12, 12, 3))
    calibrated = _calibrated(model, samples)
    plan = equalize.plan(calibrated)
    made = equalize.equalised(calibrated, plan, samples)
    assert len(plan.weights) >= 10 and plan.moved  # kernels, biases, gamma and beta, the projections
    outputs = []
    for tflite in (calibrated, made):
        interp = Interpreter(model_content=tflite)
        interp.allocate_tensors()
        got = []
        for (x,) in samples[:3]:
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
            got.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
        outputs.append(np.concatenate(got))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-4, atol=1e-4 * np.abs(outputs[0]).max())
    before, after = ranged_tensors(calibrated), ranged_tensors(made)
    assert set(before) == set(after)
    changed = {t for t in before if before[t] != after[t]}
    assert changed and changed <= set(plan.moved)  # only the moved tensors' ranges, and they did move
    spans = [(after[t][1] - after[t][0]) / (before[t][1] - before[t][0]) for t in changed]
    assert min(spans) < 0.5  # the 100x channels came down


def test_global_pooling_and_a_sequential_model():
    import keras
    from keras import layers

    model = _randomised(keras.Sequential([keras.Input((6, 6, 2)), layers.Conv2D(4, 3, activation="relu", name="c"),
                                          layers.GlobalAveragePooling2D(), layers.Dense(3, name="d")]))
    plan = equalize.plan(_calibrated(model, _samples((6, 6, 2))))
    assert list(_found(plan)) == ["c"] and len(plan.pairs[0].consumers) == 1  # `d` writes the output: its name


def test_conv1d_pairs_are_read_through_the_reshapes_tflite_puts_around_them():
    """Keras' Conv1D is a CONV_2D between an EXPAND_DIMS and a RESHAPE in TFLite: they keep the last axis, so
    channel c stays channel c (found by trying the families' 1-D conv model: nothing to equalise before)."""
    import keras
    from keras import layers

    model = _randomised(keras.Sequential([keras.Input((20, 3)), layers.Conv1D(8, 3, activation="relu", name="c"),
                                          layers.Conv1D(4, 3, name="d"), layers.GlobalAveragePooling1D()]))
    samples = _samples((20, 3))
    calibrated = _calibrated(model, samples)
    plan = equalize.plan(calibrated)
    assert list(_found(plan)) == ["c"] and plan.largest > equalize.WORTH
    equalize.equalised(calibrated, plan, samples)  # the float function checked inside: raises if it moved


def test_a_model_it_cannot_read_gives_an_empty_plan():
    import keras
    from keras import layers

    model = keras.Sequential([keras.Input((8,)), layers.Dense(4, activation="relu6"), layers.Dense(2)])
    assert equalize.plan(_calibrated(model, _samples((8,)))).pairs == []


def test_explicit_equalize_refuses_a_model_with_nothing_to_equalise(tmp_path, digits_dir):
    import keras
    from keras import layers

    model = keras.Sequential([keras.Input((8, 8, 1)), layers.Flatten(), layers.Dense(10, activation="softmax")])
    model.save(tmp_path / "flat.keras")
    with pytest.raises(ConversionError, match="nothing to equalise"):
        edgekit.convert(tmp_path / "flat.keras", mode="int8", calib=digits_dir / "train", output=tmp_path / "x.tflite",
                        calibration=edgekit.CalibrationSpec(method="equalize"))
    assert not (tmp_path / "x.tflite").exists()
    cli = run_cli("convert", tmp_path / "flat.keras", "--int8", "--calib", digits_dir / "train",
                  "--calib-method", "equalize", "-o", tmp_path / "y.tflite")
    assert cli.returncode == ConversionError.exit_code and "nothing to equalise" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert not (tmp_path / "y.tflite").exists()


def test_a_weight_two_ops_read_is_not_equalised():
    """Found by a review of the Keras version: scaling a layer the graph calls twice would change the other
    call's output. TFLite inlines nested models; a kernel read by two ops is left alone."""
    import keras
    from keras import layers

    shared = layers.Conv2D(8, 3, padding="same", activation="relu", name="shared")
    inner_in = keras.Input((6, 6, 2))
    inner = keras.Model(inner_in, layers.Conv2D(4, 1, name="inner_b")(shared(inner_in)))
    outer_in = keras.Input((6, 6, 2))
    model = _randomised(keras.Model(outer_in, [inner(outer_in), layers.Flatten()(shared(outer_in))]))
    found = _found(equalize.plan(_calibrated(model, _samples((6, 6, 2)))))
    assert "shared" not in found
