"""Structured channel pruning (converters/channels.py): which channels go together (a residual Add's convs,
a squeeze-excite's gate and the features it scales, a depthwise conv's channels), that a model whose removed
channels carried nothing computes the same function once smaller, what is left whole and why, and that it
shrinks the keras.applications families it can read."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.converters import channels
from edgekit.errors import ModelFormatError
from helpers import run_cli


def _block_model():
    """conv -> BN -> ReLU -> depthwise -> BN -> ReLU -> squeeze-excite -> conv -> BN, plus a 1x1 shortcut, joined
    by a residual Add; then a Dense head. Spaces: {a, depthwise, SE gate}, {b, shortcut}, the hidden Dense."""
    import keras
    from keras import layers

    inp = keras.Input((12, 12, 3))
    a = layers.ReLU(name="relu_a")(layers.BatchNormalization(name="bn_a")(layers.Conv2D(16, 3, padding="same",
                                                                                         name="conv_a")(inp)))
    d = layers.DepthwiseConv2D(3, padding="same", name="dw")(a)
    d = layers.ReLU(name="relu_d")(layers.BatchNormalization(name="bn_d")(d))
    g = layers.Reshape((1, 1, 16), name="se_reshape")(layers.GlobalAveragePooling2D(name="se_pool")(d))
    g = layers.Conv2D(16, 1, activation="sigmoid", name="se_expand")(layers.Conv2D(4, 1, activation="relu",
                                                                                      name="se_reduce")(g))
    d = layers.Multiply(name="se_scale")([d, g])
    b = layers.BatchNormalization(name="bn_b")(layers.Conv2D(16, 1, name="conv_b")(d))
    c = layers.BatchNormalization(name="bn_c")(layers.Conv2D(16, 1, name="shortcut")(a))
    s = layers.ReLU(name="relu_s")(layers.Add(name="residual")([b, c]))
    h = layers.Dense(12, activation="relu", name="hidden")(layers.GlobalAveragePooling2D(name="pool")(s))
    return keras.Model(inp, layers.Dense(5, name="logits")(h))


def _silenced(model, rng):
    """Random weights, BatchNorm statistics included; then half of each prunable space's channels made to carry
    exact zeros (their kernels, biases, gamma and beta zero): removing them must change nothing."""
    for v in model.weights:
        value = rng.normal(0, 0.5, v.shape).astype("float32")
        if "moving_variance" in v.path:
            value = np.abs(value) + 0.5
        v.assign(value)
    dead = {"a": [1, 3, 4, 6, 9, 11, 12, 14], "s": [0, 2, 5, 7, 8, 10, 13, 15], "hidden": [0, 2, 4, 6, 8, 10],
            "se": [0, 2]}
    zero = {"conv_a": "a", "se_expand": "a", "conv_b": "s", "shortcut": "s", "hidden": "hidden", "se_reduce": "se"}
    for name, space in zero.items():
        layer = model.get_layer(name)
        for v in layer.weights:
            value = v.numpy()
            value[..., dead[space]] = 0.0
            v.assign(value)
    for name, space in {"bn_a": "a", "bn_d": "a", "bn_b": "s", "bn_c": "s"}.items():
        bn = model.get_layer(name)
        for v in (bn.gamma, bn.beta):
            value = v.numpy()
            value[dead[space]] = 0.0
            v.assign(value)
    dw = model.get_layer("dw")
    bias = dw.bias.numpy()
    bias[dead["a"]] = 0.0
    dw.bias.assign(bias)
    return model


def test_channels_that_carried_nothing_are_removed_and_the_function_stays():
    model = _silenced(_block_model(), np.random.default_rng(0))
    plan = channels.plan(model, 0.5)
    assert plan.kept == {"conv_a": (16, 8), "se_expand": (16, 8), "se_reduce": (4, 2), "conv_b": (16, 8),
                         "shortcut": (16, 8), "hidden": (12, 6), "logits": (5, 5)}
    assert plan.left == {"logits": "a model output"}
    small = channels.shrink(model, plan)
    x = np.random.default_rng(1).uniform(0, 1, (6, 12, 12, 3)).astype("float32")
    want, got = model.predict(x, verbose=0), small.predict(x, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert small.get_layer("dw").kernel.shape[2] == 8 and small.get_layer("se_reduce").kernel.shape[2] == 8
    assert small.count_params() < 0.5 * model.count_params()
    assert channels.macs(small) < 0.4 * channels.macs(model)


def test_what_reads_a_space_it_cannot_follow_keeps_the_space_whole():
    import keras
    from keras import layers

    inp = keras.Input((8, 8, 2))
    a = layers.Conv2D(16, 3, activation="relu", name="into_flatten")(inp)
    b = layers.Conv2D(16, 3, padding="same", activation="relu", name="into_concat")(inp)
    c = layers.Conv2D(16, 3, padding="same", activation="relu", name="beside")(inp)
    joined = layers.Conv2D(8, 1, name="after_concat")(layers.Concatenate(name="cat")([b, c]))
    flat = layers.Dense(4, name="head")(layers.Flatten(name="flat")(a))
    model = keras.Model(inp, [flat, layers.GlobalAveragePooling2D()(joined)])
    plan = channels.plan(model, 0.5)
    assert plan.left["into_flatten"] == "read by flat (Flatten)"
    assert plan.left["into_concat"] == plan.left["beside"] == "read by cat (Concatenate)"
    assert plan.left["head"] == "a model output" and plan.left["after_concat"] == "a model output"
    assert not plan.removes_anything
    assert channels.shrink(model, plan).count_params() == model.count_params()


def test_a_ratio_of_zero_keeps_every_channel_and_widths_round_to_eight():
    model = _block_model()
    assert not channels.plan(model, 0.0).removes_anything
    assert channels._kept(64, 0.3) == 48 and channels._kept(24, 0.9) == 8 and channels._kept(12, 0.5) == 6


@pytest.mark.parametrize("arch", ["MobileNetV2", "EfficientNetB0", "ResNet50V2", "MobileNetV3Small"])
def test_applications_shrink_to_a_quarter_of_their_multiply_adds(arch):
    """keras.applications at 64x64 (weights=None): half the channels of every space go, which removes about
    three quarters of the multiply-adds; the smaller model runs."""
    import keras

    model = getattr(keras.applications, arch)(weights=None, input_shape=(64, 64, 3), classes=10)
    plan = channels.plan(model, 0.5)
    small = channels.shrink(model, plan)
    assert set(plan.left) == {"predictions"} or arch == "MobileNetV3Small"  # its head: a Flatten reads it
    ratio = channels.macs(small) / channels.macs(model)
    print(arch, f"multiply-adds {ratio:.3f}, parameters {small.count_params() / model.count_params():.3f}")
    assert 0.2 < ratio < 0.4
    assert small.predict(np.zeros((1, 64, 64, 3), np.float32), verbose=0).shape == (1, 10)


def test_convert_with_channel_pruning_writes_a_smaller_int8_model_and_reports_it(work, digits_keras, digits_dir,
                                                                                  converted):
    """`--int8 --prune 0.5 --prune-structure channels`: the written file's convs have half the channels, it is
    under 0.4x the dense int8 file, the fine-tuned accuracy is printed and within a point and a half of float,
    and the metadata holds what each layer kept."""
    from edgekit.contracts import validate
    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe, PruningSpec, TrainingSpec
    from edgekit.report import compression_lines

    result = convert(ConvertRecipe(model=digits_keras, mode="int8", output=work / "channels.int8.tflite",
                                   pruning=PruningSpec(0.5, structure="channels"),
                                   training=TrainingSpec(data=digits_dir / "train", val_data=digits_dir / "test")))
    validate(result.metadata, "edgekit.metadata/1")
    c = result.metadata["compression"]
    ch = c["prune"]["channels"]
    assert c["prune"]["structure"] == "channels" and c["prune"]["achieved"] is None
    assert all(after == before // 2 for name, (before, after) in ch["kept"].items() if name in c["prune"]["layers"])
    assert set(ch["left"]) == {name for name in ch["kept"] if name not in c["prune"]["layers"]}
    assert ch["macs"][1] < 0.4 * ch["macs"][0] and ch["parameters"][1] < 0.4 * ch["parameters"][0]
    assert result.path.stat().st_size < 0.4 * converted("int8").stat().st_size
    assert "distill" not in c  # the labels alone unless `training.distill` is set
    # 3 epochs of 45 batches end on an average over 0.15 of them; the digits CNN has no BatchNorm to update
    assert c["weight_average"] == {"decay": pytest.approx(1 - 1 / 20.25, abs=1e-6), "batch_norm_layers": 0,
                                   "batches": 0}
    drop = 100 * (c["accuracy"]["float"] - c["accuracy"]["final"])
    lines = compression_lines(c)
    print("\n".join(lines), f"\ndrop {drop:.2f} points")
    assert lines[0].startswith("channel pruning (0.5") and drop <= 1.5


def test_channel_pruning_refuses_what_it_cannot_narrow_in_one_line(tmp_path, digits_dir):
    import keras
    from keras import layers

    model = keras.Sequential([keras.Input((8, 8, 1)), layers.Flatten(),
                              layers.Dense(10, activation="softmax", name="head")])
    model.save(tmp_path / "flat.keras")
    cli = run_cli("convert", tmp_path / "flat.keras", "--int8", "--prune", "0.5", "--prune-structure", "channels",
                  "--train-data", digits_dir / "train", "-o", tmp_path / "x.tflite")
    assert cli.returncode == ModelFormatError.exit_code, cli.stderr
    assert "channel pruning finds no channel it can remove (head: head's softmax normalises over the channels)" \
        in cli.stderr
    assert "Traceback" not in cli.stderr and not (tmp_path / "x.tflite").exists()



def test_what_a_removed_channel_would_still_change_keeps_its_space_whole():
    """Found by a review: a softmax over the channels (as an activation), a one-channel attention map
    broadcast over sixteen, `keras.ops.reshape`, and a layer shared between a nested model and the outer
    graph: each leaves its space whole, and shrinking still gives a model that runs."""
    import keras
    from keras import layers, ops

    i = keras.Input((8, 8, 3))
    a = layers.Conv2D(16, 3, padding="same", activation="relu", name="features")(i)
    att = layers.Conv2D(1, 1, activation="sigmoid", name="attention")(a)
    b = layers.Conv2D(16, 1, activation="softmax", name="softmaxed")(layers.Multiply(name="gate")([a, att]))
    c = layers.Conv2D(8, 1, name="into_reshape")(b)
    d = ops.reshape(c, (-1, 64, 8))
    shared = layers.Conv2D(8, 1, activation="relu", name="shared")
    inner_in = keras.Input((8, 8, 3))
    inner = keras.Model(inner_in, layers.Conv2D(4, 1, name="inner_b")(shared(inner_in)))
    e = layers.GlobalAveragePooling2D()(inner(i))
    f = layers.GlobalAveragePooling2D()(shared(i))
    model = keras.Model(i, [layers.Flatten()(d), layers.Concatenate()([e, f])])
    plan = channels.plan(model, 0.5)
    assert plan.left["features"] == "joined by gate with a tensor of no pruned layer or of another width"
    assert plan.left["softmaxed"] == "softmaxed's softmax normalises over the channels"
    assert plan.left["into_reshape"].startswith("read by reshape")
    assert plan.left["shared"] == "called more than once"
    small = channels.shrink(model, plan)
    x = np.random.default_rng(4).uniform(0, 1, (2, 8, 8, 3)).astype("float32")
    for want, got in zip(model.predict(x, verbose=0), small.predict(x, verbose=0)):
        assert want.shape == got.shape


# -- Sequential and loaded models (issue 47) ------------------------------------------------------------------
def _small_cnn(structure: str):
    """conv (16) -> conv (16) -> pooled -> Dense (12) -> Dense (5), as a Sequential, as a Functional, or as a
    Sequential nested in a Functional; random weights, with half of each hidden layer's channels carrying
    exact zeros (kernel columns and biases), so removing them must change nothing."""
    import keras
    from keras import layers

    body = [layers.Conv2D(16, 3, padding="same", activation="relu", name="c1"),
            layers.Conv2D(16, 3, padding="same", activation="relu", name="c2")]
    head = [layers.GlobalAveragePooling2D(name="pool"), layers.Dense(12, activation="relu", name="hidden"),
            layers.Dense(5, name="logits")]
    if structure == "sequential":
        model = keras.Sequential([keras.Input((8, 8, 3)), *body, *head], name="small")
    else:
        inp = keras.Input((8, 8, 3))
        h = keras.Sequential([keras.Input((8, 8, 3)), *body], name="inner")(inp) if structure == "nested" else \
            body[1](body[0](inp))
        for layer in head:
            h = layer(h)
        model = keras.Model(inp, h, name="small")
    rng = np.random.default_rng(2)
    for v in model.weights:
        v.assign(rng.normal(0, 0.5, v.shape).astype("float32"))
    for name, dead in {"c1": [0, 3, 4, 7, 9, 10, 13, 14], "c2": [1, 2, 5, 6, 8, 11, 12, 15],
                       "hidden": [0, 2, 4, 6, 8, 10]}.items():
        for v in _find(model, name).weights:
            value = v.numpy()
            value[..., dead] = 0.0
            v.assign(value)
    return model


def _find(model, name: str):
    return next(layer for layer in channels._layers(model) if layer.name == name)


def _saved(model, path):
    """`model` as Keras loads it back from `path` (.keras or .h5): a loaded Sequential's layers carry a node for
    each graph Keras built while adding them (4, 3, 2, 1 ...), and only one call each."""
    import keras

    model.save(path)
    return keras.saving.load_model(path)


@pytest.mark.parametrize("structure, source", [("sequential", None), ("sequential", ".keras"),
                                               ("sequential", ".h5"), ("functional", ".keras"),
                                               ("nested", ".keras")])
def test_sequential_and_loaded_models_lose_the_channels_that_carried_nothing(tmp_path, structure, source):
    model = _small_cnn(structure)
    loaded = model if source is None else _saved(model, tmp_path / f"small{source}")
    if structure == "sequential" and source is not None:
        assert len(loaded.get_layer("c1")._inbound_nodes) > 1  # the case that read as "called more than once"
    plan = channels.plan(loaded, 0.5)
    inner = {"c2": (16, 16)} if structure == "nested" else {"c2": (16, 8), "hidden": (12, 6)}
    assert plan.kept == {"c1": (16, 8), "hidden": (12, 6), "logits": (5, 5), **inner}
    assert plan.left == {"logits": "a model output", **({"c2": "a model output"} if structure == "nested" else {})}
    small = channels.shrink(loaded, plan)
    x = np.random.default_rng(3).uniform(0, 1, (4, 8, 8, 3)).astype("float32")
    want = model.predict(x, verbose=0)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(small.predict(x, verbose=0), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # c1 64 x 27 x 16, c2 64 x 9 x 16 x 16, hidden 16 x 12, logits 12 x 5; halved where plan.kept says so
    before = 64 * 27 * 16 + 64 * 9 * 16 * 16 + 16 * 12 + 12 * 5
    after = 64 * 27 * 8 + 64 * 9 * 8 * 16 + 16 * 6 + 6 * 5 if structure == "nested" else \
        64 * 27 * 8 + 64 * 9 * 8 * 8 + 8 * 6 + 6 * 5
    assert (channels.macs(loaded), channels.macs(small)) == (before, after)


@pytest.mark.parametrize("source", [None, ".keras"])
def test_a_layer_called_twice_in_the_graph_is_left_whole_in_memory_and_loaded(tmp_path, source):
    import keras
    from keras import layers

    inp = keras.Input((8, 8, 3))
    shared = layers.Conv2D(8, 3, padding="same", activation="relu", name="shared")
    h = shared(shared(layers.Conv2D(8, 1, name="stem")(inp)))
    h = layers.Dense(16, activation="relu", name="hidden")(layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, layers.Dense(4, name="logits")(h))
    loaded = model if source is None else _saved(model, tmp_path / f"shared{source}")
    plan = channels.plan(loaded, 0.5)
    assert plan.left == {"shared": "called more than once", "logits": "a model output",
                         "stem": "read by shared, called more than once or with several outputs"}
    assert plan.kept == {"stem": (8, 8), "shared": (8, 8), "hidden": (16, 8), "logits": (4, 4)}


def _sequential_digits_cnn(digits_dir):
    """A Sequential digits CNN trained for 8 epochs (about 3 s; 0.83 on the held-out digits)."""
    import keras
    from keras import layers

    from edgekit.converters.training import dataset, load_image_folder
    from edgekit.runtime.preprocess import PreprocessSpec

    x, y, _ = load_image_folder(digits_dir / "train", PreprocessSpec(height=8, width=8, channels=1))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), layers.Rescaling(1 / 255, name="scale"),
                              layers.Conv2D(16, 3, padding="same", activation="relu", name="c1"),
                              layers.Conv2D(32, 3, padding="same", activation="relu", name="c2"),
                              layers.MaxPooling2D(name="halve"),
                              layers.Conv2D(32, 3, padding="same", activation="relu", name="c3"),
                              layers.GlobalAveragePooling2D(name="pool"),
                              layers.Dense(32, activation="relu", name="hidden"),
                              layers.Dense(10, activation="softmax", name="probs")])
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    model.fit(dataset(x, y, batch_size=32, seed=0), epochs=8, verbose=0, shuffle=False)
    return model


def test_a_sequential_cnn_saved_as_keras_converts_with_channel_pruning(tmp_path, digits_dir):
    """Issue 47's acceptance: a Sequential digits CNN, saved as .keras, through `edgekit convert --int8
    --prune 0.5 --prune-structure channels`: exit 0, every hidden layer at half its channels, about a quarter
    of the multiply-adds (a conv's input and output channels both halve), and the accuracy on the held-out
    digits reported, within three points of the float model's."""
    import json

    _sequential_digits_cnn(digits_dir).save(tmp_path / "seq.keras")
    cli = run_cli("convert", tmp_path / "seq.keras", "--int8", "--prune", "0.5", "--prune-structure", "channels",
                  "--train-data", digits_dir / "train", "--val-data", digits_dir / "test", "--epochs", "3",
                  "-o", tmp_path / "seq.tflite", "--json")
    assert cli.returncode == 0, cli.stderr
    c = json.loads(cli.stdout)["compression"]
    ch = c["prune"]["channels"]
    assert ch["kept"] == {"c1": [16, 8], "c2": [32, 16], "c3": [32, 16], "hidden": [32, 16], "probs": [10, 10]}
    assert ch["left"] == {"probs": "probs's softmax normalises over the channels"}
    print("multiply-adds", ch["macs"], "accuracy", c["accuracy"])
    assert 0.2 < ch["macs"][1] / ch["macs"][0] < 0.3
    assert c["accuracy"]["final"] >= c["accuracy"]["float"] - 0.03 and c["accuracy"]["float"] > 0.6
    assert "Traceback" not in cli.stderr
