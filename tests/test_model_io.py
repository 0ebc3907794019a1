"""Model on every model shape: named inputs and outputs, several of each, open input sizes, int8 heads.

The .tflite files are converted here straight from small Keras 3 models with tf.lite.TFLiteConverter, so
these tests pin the runtime alone. What TFLite's "serving_default" signature keeps of a Keras model:
dict outputs keep their keys (sorted by name, as Keras 3 orders them); list outputs become output_0,
output_1, ... in the model's order; inputs keep the names of their keras.Input.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgekit.errors import InputShapeError
from edgekit.runtime import Model
from edgekit.runtime.quant import quantize


def _init(seed: int):
    import keras

    return keras.initializers.GlorotUniform(seed=seed)


def _convert(model, int8_data: np.ndarray | None = None) -> bytes:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8_data is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([x[None]] for x in int8_data)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return converter.convert()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (keras model, .tflite path), built once for the module."""
    import keras
    from keras import layers

    built = {}

    feat = keras.Input((6,), name="feat")
    probs = layers.Softmax(name="probs")(layers.Dense(10, kernel_initializer=_init(1))(feat))
    logits = layers.Dense(10, kernel_initializer=_init(2), bias_initializer="ones", name="logits")(feat)
    built["heads"] = keras.Model(feat, {"probs": probs, "logits": logits})

    built["listed"] = keras.Model(feat, [layers.Dense(k + 1, kernel_initializer=_init(k))(feat) for k in range(12)])

    image, vector = keras.Input((8, 8, 1), name="image"), keras.Input((4,), name="vector")
    joined = layers.Concatenate()([layers.Flatten()(layers.Conv2D(2, 3, kernel_initializer=_init(3))(image)), vector])
    built["two_inputs"] = keras.Model([image, vector], layers.Dense(3, kernel_initializer=_init(4))(joined))

    pixels = keras.Input((None, None, 3), name="pixels")
    h = layers.Conv2D(4, 3, padding="same", activation="relu", kernel_initializer=_init(5))(pixels)
    built["fcn"] = keras.Model(pixels, layers.Conv2D(2, 1, kernel_initializer=_init(6))(h))

    wave = keras.Input((1600,), name="wave")
    h = layers.Conv1D(4, 9, strides=4, activation="relu", kernel_initializer=_init(7))(layers.Reshape((1600, 1))(wave))
    built["wave"] = keras.Model(wave, layers.Dense(5, kernel_initializer=_init(8))(layers.GlobalAveragePooling1D()(h)))

    x = keras.Input((6,), name="feat")
    small = layers.Rescaling(0.01, name="small")(layers.Dense(4, kernel_initializer=_init(9))(x))
    large = layers.Rescaling(50.0, name="large")(layers.Dense(4, kernel_initializer=_init(10))(x))
    built["int8_heads"] = keras.Model(x, {"small": small, "large": large})

    folder = tmp_path_factory.mktemp("model_io")
    out = {}
    for name, model in built.items():
        data = np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32) if name == "int8_heads" else None
        path = folder / f"{name}.tflite"
        path.write_bytes(_convert(model, data))
        out[name] = (model, path)
    return out


def _keras(model, x):
    """The Keras model's float answer (called directly: predict() retraces for every new shape)."""
    out = model(x, training=False)
    if isinstance(out, dict):
        return {k: np.asarray(v) for k, v in out.items()}
    return [np.asarray(v) for v in out] if isinstance(out, (list, tuple)) else np.asarray(out)


def test_two_outputs_of_one_shape_come_back_by_their_keras_names(models):
    keras_model, path = models["heads"]
    model = Model(path)
    assert model.output_names == ("logits", "probs") == tuple(keras_model.output_names)
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    got, want = model.predict(x), _keras(keras_model, x)
    assert list(got) == ["logits", "probs"] and got["probs"].shape == got["logits"].shape == (5, 10)
    assert not np.allclose(got["probs"], got["logits"])
    for name in ("probs", "logits"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0)


def test_list_outputs_are_output_n_in_keras_order_past_ten(models):
    keras_model, path = models["listed"]
    model = Model(path)
    assert model.output_names == tuple(f"output_{k}" for k in range(12))  # TFLite sorts them as strings
    assert [o.shape[1] for o in model.outputs] == list(range(1, 13))
    x = np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32)
    got, want = model.predict(x), _keras(keras_model, x)
    for k in range(12):
        np.testing.assert_allclose(got[f"output_{k}"], want[k], atol=1e-5, rtol=0)


def test_two_inputs_are_passed_by_name_and_a_wrong_name_is_an_input_shape_error(models):
    keras_model, path = models["two_inputs"]
    model = Model(path)
    assert model.input_names == ("image", "vector")
    rng = np.random.default_rng(3)
    image, vector = rng.standard_normal((4, 8, 8, 1)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    want = _keras(keras_model, [image, vector])
    np.testing.assert_allclose(model.predict({"vector": vector, "image": image}), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.predict([image, vector]), want, atol=1e-5, rtol=0)
    with pytest.raises(InputShapeError, match="unknown input 'vec'.*missing input 'vector'"):
        model.predict({"image": image, "vec": vector})
    with pytest.raises(InputShapeError, match="missing input 'image'"):
        model.predict({"vector": vector})
    with pytest.raises(InputShapeError, match="takes 2 inputs"):
        model.predict(image)
    with pytest.raises(InputShapeError, match="'vector' has 3 samples"):
        model.predict({"image": image, "vector": vector[:3]})
    with pytest.raises(InputShapeError, match="'image' expects shape"):
        model.predict({"image": image[:, :7], "vector": vector})


def test_an_open_size_model_runs_at_each_size_it_is_given(models):
    keras_model, path = models["fcn"]
    model = Model(path)
    assert model.inputs[0].shape_signature == (-1, -1, -1, 3) and model.inputs[0].open_dims == (0, 1, 2)
    assert model.describe()["inputs"][0]["shape_signature"] == [-1, -1, -1, 3]
    rng = np.random.default_rng(4)
    first = None
    for size in (48, 96, 48):
        x = rng.uniform(0, 1, (2, size, size, 3)).astype(np.float32)
        got = model.predict(x)
        assert got.shape == (2, size, size, 2)
        np.testing.assert_allclose(got, _keras(keras_model, x), atol=1e-4, rtol=0)
        if size == 48 and first is None:
            first = (x, got)
    np.testing.assert_array_equal(model.predict(first[0]), first[1])  # the kept 48x48 interpreter, unchanged
    with pytest.raises(InputShapeError, match=r"expects shape \(\?, \?, \?, 3\)"):
        model.predict(np.zeros((1, 48, 48, 4), np.float32))


def test_open_sizes_from_eight_threads_match_one_thread(models):
    model = Model(models["fcn"][1], num_threads=1)
    rng = np.random.default_rng(5)
    inputs = [rng.uniform(0, 1, (1, s, s + 8, 3)).astype(np.float32) for s in (16, 24, 32, 16)]
    expected = [model.predict(x) for x in inputs]
    failures = []

    def worker(offset: int) -> None:
        for k in range(20):
            i = (k + offset) % len(inputs)
            if not np.array_equal(model.predict(inputs[i]), expected[i]):
                failures.append((offset, k))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_one_dimensional_input_runs_and_keeps_its_length_fixed(models):
    keras_model, path = models["wave"]
    model = Model(path)
    assert model.inputs[0].shape_signature == (-1, 1600) and model.inputs[0].name == "wave"
    x = np.random.default_rng(6).standard_normal((3, 1600)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x), _keras(keras_model, x), atol=1e-5, rtol=0)
    with pytest.raises(InputShapeError, match=r"'wave' expects shape \(\?, 1600\)"):
        model.predict(np.zeros((1, 1200), np.float32))


def test_int8_outputs_are_dequantized_each_with_its_own_scale(models):
    keras_model, path = models["int8_heads"]
    model = Model(path)
    small, large = (next(o for o in model.outputs if o.name == n) for n in ("small", "large"))
    assert small.quantized and large.quantized and small.dtype == np.int8
    assert large.scale > 100 * small.scale
    x = np.random.default_rng(7).standard_normal((6, 6)).astype(np.float32)
    got = model.predict(x)
    raw = [model.invoke_raw({"feat": quantize(x[i : i + 1], model.inputs[0])}) for i in range(6)]
    for k, info in enumerate(model.outputs):
        manual = np.concatenate([(r[k].astype(np.float32) - info.zero_point) * info.scale for r in raw])
        np.testing.assert_array_equal(got[info.name], manual)
    want = _keras(keras_model, x)
    for info in (small, large):  # int8 error: a few steps of each output's own scale
        assert np.max(np.abs(got[info.name] - want[info.name])) <= 3 * info.scale

