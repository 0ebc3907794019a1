"""The Keras 3 -> tf_keras bridge and the pruning masks, on their own."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.converters.pruning import Structure, mask_for, sparsity_at
from edgekit.errors import ModelFormatError, UsageError
from edgekit.runtime.sparsity import group_zeros


def _backbone():
    import keras
    from keras import layers

    i = keras.Input((16, 16, 3))
    y = layers.Conv2D(8, 3, padding="same", use_bias=False)(i)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU(6.0)(y)
    z = layers.DepthwiseConv2D(3, padding="same")(y)
    z = layers.Activation("relu")(z)
    y = layers.Add()([y, z])
    y = layers.SeparableConv2D(8, 3, padding="same")(y)
    y = layers.ZeroPadding2D(1)(y)
    y = layers.AveragePooling2D(2)(y)
    return keras.Model(i, y, name="backbone")


def test_bridge_flattens_a_nested_backbone_and_keeps_outputs_equal():
    import keras
    from keras import layers

    from edgekit.converters.bridge import to_tf_keras

    keras.utils.set_random_seed(1)
    backbone = _backbone()
    for layer in backbone.layers:  # non-trivial batch-norm statistics
        if isinstance(layer, layers.BatchNormalization):
            layer.moving_variance.assign(np.random.uniform(0.5, 2.0, 8).astype(np.float32))
            layer.moving_mean.assign(np.random.normal(0, 0.3, 8).astype(np.float32))
    i = keras.Input((16, 16, 3))
    y = layers.Rescaling(1 / 127.5, offset=-1)(i)
    y = backbone(y, training=False)
    y = layers.Concatenate()([y, y])
    y = layers.Flatten()(y)
    y = layers.Dropout(0.2)(y)
    y = layers.Dense(5)(y)
    model = keras.Model(i, layers.Softmax()(y))
    x = np.random.default_rng(0).uniform(0, 255, (8, 16, 16, 3)).astype(np.float32)
    result = to_tf_keras(model, x)
    assert result.flattened == ("backbone",) and result.source_api == "keras3"
    import tf_keras

    assert isinstance(result.model, tf_keras.Model)
    assert not any(isinstance(layer, tf_keras.Model) for layer in result.model.layers)  # tfmot needs it flat
    assert result.max_abs_error <= 1e-5
    np.testing.assert_allclose(np.asarray(result.model(x)), np.asarray(model(x)), atol=1e-5)


def test_bridge_rebuilds_a_sequential_model():
    import keras
    from keras import layers

    from edgekit.converters.bridge import to_tf_keras

    model = keras.Sequential([keras.Input((8, 8, 1)), layers.Flatten(), layers.Dense(10, activation="relu"),
                              layers.Dense(3)])
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 1)).astype(np.float32)
    assert to_tf_keras(model, x).max_abs_error <= 1e-6


def test_a_tf_keras_model_is_copied_so_training_leaves_the_reference_alone():
    """A tf_keras (Keras 2) model is trained as a copy: the loaded model stays the float reference the budget
    and the reports compare with (issue 49: the budget once measured the pruned model against itself)."""
    import tf_keras

    from edgekit.converters.bridge import to_tf_keras

    model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(3)])
    x = np.random.default_rng(0).random((8, 4), np.float32)
    before = model.predict(x, verbose=0)
    bridged = to_tf_keras(model, x)
    assert bridged.model is not model and bridged.source_api == "tf_keras"
    np.testing.assert_array_equal(bridged.model.predict(x, verbose=0), before)
    bridged.model.layers[-1].kernel.assign(np.zeros((4, 3), np.float32))  # what pruning does to its weights
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)


def test_bridge_refuses_keras_ops_calls_by_name():
    import keras
    from keras import layers

    from edgekit.converters.bridge import to_tf_keras

    i = keras.Input((4,))
    y = layers.Dense(4)(i)
    model = keras.Model(i, keras.ops.sin(y))
    with pytest.raises(ModelFormatError, match=r"keras\.ops call, not a layer"):
        to_tf_keras(model, np.zeros((2, 4), np.float32))
    # a tensor and a number (MobileNetV3's `relu6(x + 3) * (1 / 6)`) become ScaleShift layers, exactly
    affine = keras.Model(i, 3.0 - (keras.ops.add(y, 1.0) * 0.5) / 4.0)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    bridged = to_tf_keras(affine, x)
    np.testing.assert_allclose(np.asarray(bridged.model(x)), np.asarray(affine(x)), atol=1e-6)


def test_bridge_refuses_subclassed_models():
    import keras

    from edgekit.converters.bridge import to_tf_keras

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(np.zeros((1, 3), np.float32))
    with pytest.raises(ModelFormatError, match="subclassed model"):
        to_tf_keras(net, np.zeros((2, 3), np.float32))


def test_masks_unstructured_remove_the_smallest_weights():
    w = np.random.default_rng(0).normal(size=(3, 3, 16, 8)).astype(np.float32)
    m = mask_for(w, 0.5, Structure.parse(None))
    assert m.mean() == 0.5
    assert np.abs(w[m == 0]).max() <= np.abs(w[m == 1]).min()


def test_masks_m_of_n_along_the_input_axis_with_a_partial_group():
    w = np.random.default_rng(1).normal(size=(3, 3, 10, 4)).astype(np.float32)  # 10 inputs: 2 groups + 2
    m = mask_for(w, 0.5, Structure.parse("2:4"))
    tflite_layout = np.moveaxis(w * m, -1, 0)  # [out, h, w, in], as TFLite stores CONV_2D filters
    assert group_zeros(tflite_layout, 4).min() >= 2
    assert np.all(m[..., 8:, :] == 1)  # the partial group's padding counts as its zeros
    assert mask_for(w, 0.25, Structure.parse("2:4")).mean() == pytest.approx(1 - 0.25 * 8 / 10)


def test_masks_block_zero_runs_along_the_input_axis():
    w = np.random.default_rng(2).normal(size=(64, 32)).astype(np.float32)  # Dense [in, out]
    m = mask_for(w, 0.5, Structure.parse("block:16"))
    per_block = m.T.reshape(32, 4, 16)
    assert np.all((per_block.min(-1) == per_block.max(-1)))  # whole blocks kept or dropped
    assert m.mean() == 0.5


def test_separable_convs_cross_the_bridge_as_depthwise_and_pointwise():
    """tfmot has no QAT config for SeparableConv2D (Xception, NASNet): the bridge rebuilds it as the
    DepthwiseConv2D + 1x1 Conv2D it computes, so both train and run int8; the 1x1 keeps the name."""
    import keras

    from edgekit.converters.bridge import to_tf_keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.SeparableConv2D(8, 3, padding="same", activation="relu", depth_multiplier=2, name="sep1")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.SeparableConv2D(16, 3, strides=2, use_bias=False, name="sep2")(x)
    model = keras.Model(inp, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))
    x = np.random.default_rng(0).uniform(0, 1, (4, 16, 16, 3)).astype(np.float32)
    result = to_tf_keras(model, x)
    kinds = {layer.name: type(layer).__name__ for layer in result.model.layers}
    assert kinds["sep1_depthwise"] == "DepthwiseConv2D" and kinds["sep1"] == "Conv2D"
    assert "SeparableConv2D" not in kinds.values()
    assert result.model.get_layer("sep1_depthwise").depth_multiplier == 2
    assert result.max_abs_error <= 1e-5


def test_convnext_pieces_cross_the_bridge():
    """keras.applications.convnext's own LayerScale and StochasticDepth, its residual (keras.ops add of two
    tensors), and a Dense on an image's channels, rebuilt as the equal 1x1 Conv2D (tf_keras would run it
    as a tensordot that int8 leaves float)."""
    import keras
    from keras.src.applications import convnext

    from edgekit.converters.bridge import to_tf_keras

    keras.utils.set_random_seed(0)
    model = convnext.ConvNeXt(depths=[1, 1, 1, 1], projection_dims=[8, 16, 16, 16], drop_path_rate=0.1,
                              layer_scale_init_value=0.5, weights=None, input_shape=(32, 32, 3), classes=10,
                              classifier_activation=None, name="cnx")
    x = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    result = to_tf_keras(model, x)
    kinds = [type(layer).__name__ for layer in result.model.layers]
    assert {"LayerScale", "StochasticDepth", "Add"} <= set(kinds)
    assert kinds.count("Dense") == 1  # the head; the 8 pointwise layers are 1x1 convs
    assert result.max_abs_error <= 1e-4 * max(1.0, float(np.abs(np.asarray(model(x))).max()))
    assert float(np.abs(np.asarray(model(x))).std()) > 0.01  # the residual branches count (LayerScale 0.5)


def test_zero_sparsity_is_an_all_ones_mask():
    w = np.random.default_rng(3).normal(size=(4, 4)).astype(np.float32)
    for structure in ("unstructured", "2:4", "block:2"):
        assert np.all(mask_for(w, 0.0, Structure.parse(structure)) == 1)


def test_polynomial_schedule_ramps_to_the_target_and_constant_holds_it():
    assert sparsity_at(0, target=0.5, schedule="polynomial", end_step=100) == 0.0
    assert sparsity_at(50, target=0.5, schedule="polynomial", end_step=100) == pytest.approx(0.4375)
    assert sparsity_at(100, target=0.5, schedule="polynomial", end_step=100) == 0.5
    assert sparsity_at(500, target=0.5, schedule="polynomial", end_step=100) == 0.5
    assert sparsity_at(0, target=0.5, schedule="constant", end_step=100) == 0.5


@pytest.mark.parametrize("text", ["4:2", "0:4", "2:2", "block:1", "block:x", "1x4", ""])
def test_bad_structures_are_usage_errors(text):
    with pytest.raises(UsageError):
        Structure.parse(text)


def test_a_frozen_backbone_keeps_its_batch_norm_in_inference_mode():
    """`backbone(x, training=False)` inside a model: its layers, once flattened, still ignore training=True
    (Keras 2 semantics, and what the transfer-learning pattern means; Keras 3 lets an outer
    training=True override it unless the layers are also frozen)."""
    import keras
    from keras import layers

    from edgekit.converters.bridge import to_tf_keras

    keras.utils.set_random_seed(2)
    backbone = _backbone()
    i = keras.Input((16, 16, 3))
    model = keras.Model(i, layers.Flatten()(backbone(i, training=False)))
    x = np.random.default_rng(1).normal(size=(8, 16, 16, 3)).astype(np.float32)
    twin = to_tf_keras(model, x).model
    np.testing.assert_allclose(np.asarray(twin(x, training=True)), np.asarray(twin(x, training=False)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(twin(x, training=False)), np.asarray(model(x, training=False)), atol=1e-5)


def test_block_masks_count_weights_not_groups_when_the_last_group_is_partial():
    w = np.random.default_rng(4).normal(size=(5, 8)).astype(np.float32)  # Dense, 5 inputs, block:4
    m = mask_for(w, 0.5, Structure.parse("block:4"))
    assert 1 - m.mean() <= 0.5  # never more than asked


def test_structured_pruning_refuses_kernels_whose_input_axis_is_not_innermost_in_tflite():
    import tf_keras

    from edgekit.converters.pruning import prunable_variables

    i = tf_keras.Input((8, 8, 4))
    model = tf_keras.Model(i, tf_keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw")(i))
    with pytest.raises(ModelFormatError, match="add it to training.skip_layers"):
        prunable_variables(model, frozenset(), Structure.parse("2:4"))
    assert len(prunable_variables(model, frozenset(), Structure.parse(None))) == 1


def test_m_of_n_structures_with_repeating_sparsity_are_accepted():
    from edgekit.converters.recipe import ConvertRecipe, PruningSpec, TrainingSpec

    recipe = ConvertRecipe(model="m.keras", pruning=PruningSpec(0.6667, structure="1:3"), training=TrainingSpec(data="t"))
    assert recipe.prune == pytest.approx(2 / 3, abs=1e-3)
