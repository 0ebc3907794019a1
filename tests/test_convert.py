"""`convert` on real models: fidelity per mode, sizes, input formats, and broken conversions."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.converters.calibration import load_calibration
from edgekit.converters.loading import load_model
from edgekit.converters.pipeline import convert
from edgekit.errors import ConversionError, ModelFormatError, UnsafeModelError
from edgekit.converters.recipe import CalibrationSpec, ConvertRecipe
from edgekit.runtime import ImageFolder, Model, PreprocessSpec, load_and_prepare

SPEC = PreprocessSpec(8, 8, 1)


def _calibration_x(digits_dir):
    return load_calibration(digits_dir / "train", input_shape=(None, 8, 8, 1), spec=SPEC).x


def _held_out(digits_dir):
    folder = ImageFolder.scan(digits_dir / "test")
    x = np.stack([load_and_prepare(f, SPEC) for f in folder.files])
    return x, np.asarray(folder.labels)


def test_float32_tflite_matches_keras_within_1e_4(converted, digits_keras, digits_dir):
    x = _calibration_x(digits_dir)
    keras_out = load_model(digits_keras).predict(x)
    tflite_out = Model(converted("float32")).predict(x)
    assert np.max(np.abs(keras_out - tflite_out)) <= 1e-4


def test_int8_drops_at_most_one_point_on_held_out_digits(converted, digits_keras, digits_dir):
    x, y = _held_out(digits_dir)
    float_top1 = np.mean(load_model(digits_keras).predict(x).argmax(1) == y)
    int8_top1 = np.mean(Model(converted("int8")).predict(x).argmax(1) == y)
    assert float_top1 >= 0.95
    assert 100 * (float_top1 - int8_top1) <= 1.0


@pytest.mark.parametrize("io, dtype", [("int8", np.int8), ("uint8", np.uint8)])
def test_integer_io_models_take_integer_tensors_and_still_agree(converted, digits_dir, io, dtype):
    model = Model(converted("int8", io))
    assert model.inputs[0].dtype == dtype and model.outputs[0].dtype == dtype
    x, _ = _held_out(digits_dir)
    reference = Model(converted("int8")).predict(x)
    assert np.mean(model.predict(x).argmax(1) == reference.argmax(1)) >= 0.99


def test_int16x8_keeps_int16_activations_and_agrees_with_float(converted, digits_keras, digits_dir):
    model = Model(converted("int16x8"))
    dtypes = {d["dtype"].__name__ for d in model.runner.tensor_details()}
    assert "int16" in dtypes
    x, _ = _held_out(digits_dir)
    ref = load_model(digits_keras).predict(x)
    assert np.mean(model.predict(x).argmax(1) == ref.argmax(1)) >= 0.99


@pytest.mark.parametrize("mode", ["float32", "float16", "dynamic", "int8"])
def test_file_is_no_larger_than_a_plain_converter_call_plus_2_percent_and_the_standard_metadata(converted, digits_keras, digits_dir, mode):
    import tensorflow as tf

    from edgekit.converters.quantize import configure, run_converter

    source = load_model(digits_keras)
    calib = load_calibration(digits_dir / "train", input_shape=(None, 8, 8, 1), spec=SPEC)
    plain = run_converter(configure(tf.lite.TFLiteConverter.from_keras_model(source.keras_model), mode,
                                    "float32", calib.representative_dataset))
    ours = converted(mode).stat().st_size
    # edgekit's entry within 2 %; the standard TFLite Metadata, its labels file and their zip add 626 bytes here,
    # and int8's range setting names each of auto's candidates with why it was not scored (eight since ema,
    # extremes and weight rounding: 3,522 bytes over the plain file in all, 1,228 of them past 2 %)
    assert ours <= len(plain) * 1.02 + 1536, (ours, len(plain))


def _big_model(path):
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(1024, activation="relu")(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    assert model.count_params() >= 1_000_000
    model.save(path)
    return path


def test_large_model_int8_and_float16_shrink_the_float32_file(tmp_path, photos_dir):
    src = _big_model(tmp_path / "big.keras")
    sizes = {}
    for mode in ("float32", "float16", "int8"):
        result = convert(ConvertRecipe(model=src, mode=mode, calib=photos_dir, output=tmp_path / f"big.{mode}.tflite"))
        sizes[mode] = result.size_bytes
    assert sizes["int8"] <= 0.30 * sizes["float32"]
    assert sizes["float16"] <= 0.55 * sizes["float32"]


def test_h5_and_saved_model_convert_like_the_keras_file(tmp_path, digits_keras, digits_dir):
    import keras

    model = keras.saving.load_model(digits_keras)
    model.save(tmp_path / "digits.h5")
    model.export(tmp_path / "saved", verbose=False)
    x = _calibration_x(digits_dir)[:50]
    expected = load_model(digits_keras).predict(x)
    for src, fmt in ((tmp_path / "digits.h5", "h5"), (tmp_path / "saved", "saved_model")):
        result = convert(ConvertRecipe(model=src, mode="float32", calib=digits_dir / "train",
                                       calibration=CalibrationSpec(samples=50)))
        assert result.path == src.parent / f"{src.name.split('.')[0]}.float32.tflite"
        assert result.metadata["source"]["format"] == fmt
        assert np.max(np.abs(Model(result.path).predict(x) - expected)) <= 1e-4


def test_keras2_h5_written_by_tf_keras_loads_through_the_fallback(tmp_path, digits_dir):
    import tf_keras

    inputs = tf_keras.Input((8, 8, 1))
    x = tf_keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    outputs = tf_keras.layers.Dense(10, activation="softmax")(tf_keras.layers.Flatten()(x))
    tf_keras.Model(inputs, outputs).save(tmp_path / "k2.h5")
    result = convert(ConvertRecipe(model=tmp_path / "k2.h5", mode="dynamic", calib=digits_dir / "train",
                                   calibration=CalibrationSpec(samples=20)))
    assert result.metadata["verification"]["top1_agreement"] >= 0.9


def test_lambda_layers_are_refused_not_executed(tmp_path):
    import keras

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2)(inputs))
    model.save(tmp_path / "lambda.keras")
    with pytest.raises(UnsafeModelError, match="Lambda"):
        load_model(tmp_path / "lambda.keras")


def test_model_with_nan_weights_is_an_error_not_a_file(tmp_path, digits_keras, digits_dir):
    import keras

    model = keras.saving.load_model(digits_keras)
    kernel = model.get_layer("probs")
    kernel.set_weights([np.full_like(w, np.nan) for w in kernel.get_weights()])
    model.save(tmp_path / "nan.keras")
    out = tmp_path / "nan.float32.tflite"
    with pytest.raises(ConversionError, match="NaN"):
        convert(ConvertRecipe(model=tmp_path / "nan.keras", calib=digits_dir / "train",
                              calibration=CalibrationSpec(samples=20)))
    assert not out.exists()


def test_collapse_check_flags_constant_outputs():
    from edgekit.converters.verify import check_not_collapsed

    ref = np.random.default_rng(0).random((10, 4))
    assert check_not_collapsed(ref, ref + 0.01, "ok") is None
    with pytest.raises(ConversionError, match="collapsed"):
        check_not_collapsed(ref, np.tile(ref[:1], (10, 1)), "m")
    # an untrained net: float scores move by 0.001, int8 softmax steps are 1/256 apart -> a note, not an error
    flat = 0.1 + 0.001 * np.random.default_rng(1).random((10, 10))
    flat /= flat.sum(axis=1, keepdims=True)  # softmax-like probabilities
    quantized = np.tile(np.round(flat[:1] * 256) / 256, (10, 1))
    note = check_not_collapsed(flat, quantized, "m", int8=True)
    assert note is not None and "less than one step of the converted output (0.0039)" in note
    with pytest.raises(ConversionError, match="collapsed"):  # a float32 file has no such excuse
        check_not_collapsed(flat, quantized, "m")
    with pytest.raises(ConversionError, match="collapsed"):  # float moving by 0.5: a real collapse
        check_not_collapsed(flat + np.linspace(0, 0.5, 10)[:, None], quantized, "m", int8=True)


def test_not_a_model_is_a_model_format_error(tmp_path):
    bad = tmp_path / "notes.keras"
    bad.write_text("just text")
    with pytest.raises(ModelFormatError, match="not a Keras model"):
        load_model(bad)
