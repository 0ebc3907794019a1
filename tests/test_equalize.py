"""Cross-layer equalisation (converters/equalize.py): which layer pairs it finds in Keras graphs, that the
float function stays the same while it is applied, that the weights come back after, and that `auto` scores
the equalised model where a channel moves far (the outlier CNN in test_ranges.py is where it wins)."""

from __future__ import annotations

import numpy as np
import pytest

import edgekit
from edgekit.converters import equalize
from edgekit.errors import ConversionError
from helpers import run_cli


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


def test_pairs_are_found_through_relu_pooling_and_batchnorm_and_nowhere_else():
    plan = equalize.plan(_randomised(_functional()))
    found = {p.producer: sorted(set(p.consumers)) for p in plan.pairs}
    assert found == {"conv_relu": ["conv_bn"], "conv_bn": ["conv_relu6"], "ln_attention": ["mha"],
                     "ln_mlp": ["mlp_in"]}
    assert plan.worth_it and plan.largest > equalize.WORTH


def test_the_float_function_is_unchanged_while_applied_and_the_weights_come_back():
    model = _randomised(_functional())
    x = np.random.default_rng(1).uniform(0, 1, (4, 12, 12, 3)).astype("float32")
    before = [y.numpy() for y in model(x)]
    weights = [np.array(v.numpy()) for v in model.weights]
    plan = equalize.plan(model)
    with plan.applied():
        during = [y.numpy() for y in model(x)]
        moved = sum(not np.array_equal(a, v.numpy()) for a, v in zip(weights, model.weights))
    assert moved >= 12  # kernels, biases, gamma and beta of four pairs, and the attention's projections
    for a, b in zip(before, during):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * np.abs(a).max())
    for a, v in zip(weights, model.weights):
        assert np.array_equal(a, v.numpy())


def test_models_nested_in_a_model_are_equalised_in_their_own_graph():
    import keras
    from keras import layers

    inner_in = keras.Input((6,))
    inner = keras.Model(inner_in, layers.Dense(3, name="inner_b")(layers.Dense(8, activation="relu",
                                                                               name="inner_a")(inner_in)))
    outer_in = keras.Input((6,))
    model = _randomised(keras.Model(outer_in, layers.Softmax()(inner(layers.Rescaling(0.5)(outer_in)))))
    plan = equalize.plan(model)
    assert [(p.producer, p.consumers) for p in plan.pairs] == [("inner_a", ["inner_b"])]


def test_global_pooling_passes_channels_through_and_a_sequential_model_is_read():
    import keras
    from keras import layers

    model = _randomised(keras.Sequential([keras.Input((6, 6, 2)), layers.Conv2D(4, 3, activation="relu", name="c"),
                                          layers.GlobalAveragePooling2D(), layers.Dense(3, name="d")]))
    plan = equalize.plan(model)
    assert [(p.producer, p.consumers) for p in plan.pairs] == [("c", ["d"])]
    x = np.random.default_rng(2).uniform(0, 1, (3, 6, 6, 2)).astype("float32")
    before = model(x).numpy()
    with plan.applied():
        np.testing.assert_allclose(model(x).numpy(), before, rtol=1e-4, atol=1e-4 * np.abs(before).max())


def test_a_model_it_cannot_read_gives_an_empty_plan():
    assert equalize.plan(object()).pairs == []


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


def test_a_layer_shared_with_a_nested_model_is_not_equalised_and_a_nested_model_is_read_once():
    """Found by a review: scaling a layer that the outer graph also calls would change the outer output;
    a nested model called twice has its pairs once."""
    import keras
    from keras import layers

    shared = layers.Conv2D(8, 3, padding="same", activation="relu", name="shared")
    inner_in = keras.Input((6, 6, 2))
    inner = keras.Model(inner_in, layers.Conv2D(4, 1, name="inner_b")(shared(inner_in)))
    outer_in = keras.Input((6, 6, 2))
    model = _randomised(keras.Model(outer_in, [inner(outer_in), layers.Flatten()(shared(outer_in))]))
    assert equalize.plan(model).pairs == []
    twice_in = keras.Input((6,))
    hidden = layers.Dense(8, activation="relu", name="a")(twice_in)
    twice_inner = keras.Model(twice_in, layers.Dense(3, name="b")(hidden))
    both = keras.Input((6,))
    twice = _randomised(keras.Model(both, layers.Add()([twice_inner(both), twice_inner(both)])))
    assert [(p.producer, p.consumers) for p in equalize.plan(twice).pairs] == [("a", ["b"])]
