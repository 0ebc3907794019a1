"""An open batch (Keras's None) is closed to 1 only where an op needs a static shape (a Flatten's or a
Reshape's shape computed at run time, which the GPU delegate leaves on the CPU) or the target asks for it,
and it is said; `input_shape` keeps a batch the user wants. `inspect --target gpu` names the open batch as the
cause of such a fallback. The ops left on the CPU are counted by the project's own GPU rules
(runtime/gpu_compat) before and after."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import edgekit
from edgekit.cli import main
from edgekit.converters.recipe import ConvertRecipe
from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime import ImageFolder, Model, read_image
from edgekit.runtime.gpu_compat import check_model
from edgekit.runtime.inspect import inspect_file

FLATTEN_OPS = ["SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE"]  # what a Flatten at an open batch becomes


def on_cpu(path) -> list[str]:
    """The ops the GPU delegate would leave on the CPU, by the project's rules."""
    return [r["op"] for r in check_model(path.read_bytes()) if not r["compatible"]]


def inspect_cli(path, *args):
    result = CliRunner().invoke(main, ["inspect", str(path), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Keras models with an open batch: a Flatten CNN, a pooled CNN, a 1-D conv net, a two-input net."""
    import keras
    from keras import layers

    folder = tmp_path_factory.mktemp("open_batch")
    keras.utils.set_random_seed(5)
    image = keras.Input((8, 8, 1), name="image")
    h = layers.Conv2D(8, 3, padding="same", activation="relu")(layers.Rescaling(1 / 255.0)(image))
    keras.Model(image, layers.Dense(10, activation="softmax", name="probs")(layers.Flatten()(h))).save(
        folder / "flat.keras")
    keras.Model(image, layers.Dense(10, activation="softmax")(layers.GlobalAveragePooling2D()(h))).save(
        folder / "pooled.keras")
    wave = keras.Input((16, 3), name="wave")
    h = layers.Conv1D(4, 3, activation="relu")(wave)
    keras.Model(wave, layers.Dense(2, name="score")(layers.Flatten()(h))).save(folder / "conv1d.keras")
    meta = keras.Input((4,), name="meta")
    h = layers.Concatenate()([layers.Flatten()(layers.Rescaling(1 / 255.0)(image)), meta])
    keras.Model([image, meta], layers.Dense(3, name="out")(h)).save(folder / "two_in.keras")
    return folder


@pytest.fixture(scope="module")
def digits(digits_dir, models):
    """40 real digit images (uint8, N x 8 x 8 x 1) as a .npy."""
    files = ImageFolder.scan(digits_dir / "test").sample(40, 0).files
    path = models / "digits.npy"
    np.save(path, np.stack([read_image(f) for f in files])[..., None])
    return path


def _keras(path, x):
    import keras

    return np.asarray(keras.saving.load_model(path)(x))


def test_a_flatten_at_an_open_batch_is_converted_at_batch_1_and_said(models, digits, tmp_path):
    out = tmp_path / "flat.tflite"
    result = edgekit.convert(models / "flat.keras", calib=digits, output=out)
    said = [w for w in result.changes if "batch 1" in w]
    assert said == ["converted at batch 1: with the batch open, 4 op(s) (SHAPE, STRIDED_SLICE, PACK, RESHAPE) "
                    "compute a shape at run time and the GPU delegate leaves them on the CPU (4 op(s) on the CPU -> "
                    "0); `input_shape=-1,8,8,1` keeps it open"]
    model = Model(out)
    assert model.inputs[0].shape_signature == (1, 8, 8, 1) and on_cpu(out) == []
    assert result.verification["top1_agreement"] == 1.0 and result.verification["samples"] == 40
    x = np.load(digits)[:5].astype(np.float32)
    np.testing.assert_allclose(model.predict(x), _keras(models / "flat.keras", x), atol=1e-5, rtol=0)


def test_int8_closes_the_batch_before_its_ranges_are_scored_not_after(models, digits, tmp_path):
    """The calibrated model shows the Flatten's run-time shape: int8 starts again at batch 1 there, so its
    calibration methods are scored once, at the batch the file keeps."""
    said: list[str] = []
    out = tmp_path / "flat.int8.tflite"
    result = edgekit.convert(models / "flat.keras", mode="int8", calib=digits, output=out, progress=said.append)
    assert any(c.startswith("converted at batch 1: with the batch open, 4 op(s) (SHAPE, STRIDED_SLICE, PACK, "
                            "RESHAPE)") for c in result.changes), result.changes
    assert [s for s in said if "at batch 1" in s] == ["converting at batch 1: 4 op(s) compute a shape at run time "
                                                     "from the open batch"]
    scored = [s for s in said if s.startswith("calibration method")]
    assert scored and len(scored) == len(set(scored)), said  # each method scored once
    assert Model(out).inputs[0].shape_signature == (1, 8, 8, 1) and on_cpu(out) == []
    assert result.verification["top1_agreement"] >= 0.9


def test_an_open_batch_asked_for_is_kept_and_inspect_names_it_as_the_cause(models, digits, tmp_path):
    out = tmp_path / "open.tflite"
    result = edgekit.convert(models / "flat.keras", calib=digits, output=out, input_shape=(-1, 8, 8, 1))
    assert not [w for w in result.changes if "batch 1" in w]
    model = Model(out)
    assert model.inputs[0].shape_signature == (-1, 8, 8, 1) and on_cpu(out) == FLATTEN_OPS
    x = np.load(digits)[:3].astype(np.float32)
    np.testing.assert_allclose(model.predict(x), _keras(models / "flat.keras", x), atol=1e-5, rtol=0)
    text = inspect_cli(out, "--target", "gpu")
    assert ("target gpu: 4 of 7 op(s) fall back to the CPU: SHAPE, STRIDED_SLICE, PACK, RESHAPE compute a shape "
            "at run time because the batch is open; convert with --input-shape 1,8,8,1") in text.splitlines()
    assert "  why: SHAPE, STRIDED_SLICE, PACK, RESHAPE compute a shape at run time because the batch is open; " \
           "convert with --input-shape 1,8,8,1" in inspect_cli(out).splitlines()  # without --target, under GPU
    report = json.loads(inspect_cli(out, "--target", "gpu", "--json"))
    cause = report["gpu"]["open_dimension"]
    assert cause["input_shape"] == {"image": [1, 8, 8, 1]} and cause["batch_only"] and cause["all"]
    assert [o["op"] for o in report["gpu"]["fallback_ops"] if o["index"] in cause["ops"]] == FLATTEN_OPS
    assert report["target"]["name"] == "gpu"


def test_the_shape_inspect_names_removes_the_fallback(models, tmp_path):
    out = tmp_path / "fixed.tflite"
    edgekit.convert(models / "flat.keras", output=out, input_shape=(1, 8, 8, 1))
    assert on_cpu(out) == []
    assert "target gpu: the GPU delegate takes all 4 op(s)" in inspect_cli(out, "--target", "gpu").splitlines()


def test_a_batch_of_4_asked_for_is_kept(models, digits, tmp_path):
    out = tmp_path / "four.tflite"
    result = edgekit.convert(models / "flat.keras", mode="float16", calib=digits, output=out, input_shape=(4, 8, 8, 1))
    model = Model(out)
    assert model.inputs[0].shape == (4, 8, 8, 1) and model.inputs[0].shape_signature == (4, 8, 8, 1)
    assert result.verification["samples"] == 40 and result.verification["top1_agreement"] == 1.0
    x = np.load(digits)[:8].astype(np.float32)
    np.testing.assert_allclose(model.predict(x), _keras(models / "flat.keras", x), atol=1e-3, rtol=0)


def test_int8_at_a_fixed_batch_over_1_is_a_usage_error_before_anything_loads(models, digits):
    with pytest.raises(UsageError, match=r"input_shape: fixes a batch of 4, but mode='int8' calibrates one sample"):
        ConvertRecipe(model=models / "flat.keras", mode="int8", calib=digits, input_shape=(4, 8, 8, 1))
    assert ConvertRecipe(model="m.keras", input_shape=(None, 8, 8, 1)).input_shape == {None: (None, 8, 8, 1)}


def test_an_open_batch_the_model_fixes_is_exit_6(tmp_path):
    import keras

    x = keras.Input((4,), batch_size=1, name="x")
    keras.Model(x, keras.layers.Dense(2)(x)).save(tmp_path / "fixed.keras")
    with pytest.raises(InputShapeError, match=r"input_shape: x=-1,4 does not fit the model's input \(1, 4\)"):
        edgekit.convert(tmp_path / "fixed.keras", output=tmp_path / "x.tflite", input_shape=(-1, 4))


def test_a_model_whose_ops_take_any_batch_keeps_it_open(models, tmp_path):
    out = tmp_path / "pooled.tflite"
    result = edgekit.convert(models / "pooled.keras", output=out)
    assert not [w for w in result.changes if "batch" in w]
    assert Model(out).inputs[0].shape_signature == (-1, 8, 8, 1) and on_cpu(out) == []


def test_target_gpu_closes_the_batch_and_says_so(models, tmp_path):
    out = tmp_path / "gpu.tflite"
    result = edgekit.convert(models / "pooled.keras", output=out, target="gpu")
    assert ("converting at batch 1 for `target=gpu`, whose delegate plans for one input shape; "
            "`input_shape=-1,8,8,1` keeps it open") in result.changes
    assert Model(out).inputs[0].shape_signature == (1, 8, 8, 1)
    assert result.metadata["gpu_compatibility"]["compatible"]


def test_a_one_dimensional_conv_net_is_closed_too(models, tmp_path):
    out = tmp_path / "conv1d.tflite"
    result = edgekit.convert(models / "conv1d.keras", output=out)
    assert any(w.startswith("converted at batch 1") and "`input_shape=-1,16,3` keeps it open" in w
               for w in result.changes), result.changes
    assert Model(out).inputs[0].shape_signature == (1, 16, 3) and on_cpu(out) == []
    x = np.random.default_rng(0).standard_normal((3, 16, 3)).astype(np.float32)
    np.testing.assert_allclose(Model(out).predict(x), _keras(models / "conv1d.keras", x), atol=1e-5, rtol=0)


def test_two_inputs_are_closed_together_and_named_in_the_fix(models, tmp_path):
    path = models / "two_in.keras"
    closed, kept = tmp_path / "closed.tflite", tmp_path / "open.tflite"
    result = edgekit.convert(path, output=closed)
    assert any("`input_shape=image=-1,8,8,1` `input_shape=meta=-1,4` keeps it open" in w for w in result.changes)
    assert {i.name: i.shape_signature for i in Model(closed).inputs} == {"image": (1, 8, 8, 1), "meta": (1, 4)}
    assert on_cpu(closed) == []
    edgekit.convert(path, output=kept, input_shape={"image": (-1, 8, 8, 1), "meta": (-1, 4)})
    before = on_cpu(kept)
    assert "RESHAPE" in before and "SHAPE" in before, before
    cause = inspect_file(kept)["gpu"]["open_dimension"]
    assert cause["input_shape"] == {"image": [1, 8, 8, 1], "meta": [1, 4]}
    fix = cause["cause"].split("; convert with ")[1].split(" ")  # in the file's input order
    assert sorted(fix) == ["`input_shape=image=1,8,8,1`", "`input_shape=meta=1,4`"], cause["cause"]


def test_an_open_batch_asked_of_a_recurrent_model_is_refused_not_closed(tmp_path):
    """Recurrent layers convert at a fixed batch only: edgekit closes an open batch it was left, but a -1 the
    user gave is refused in one line, never silently set to 1."""
    import keras

    x = keras.Input((5, 3), name="seq")
    keras.Model(x, keras.layers.Dense(2)(keras.layers.LSTM(4)(x))).save(tmp_path / "lstm.keras")
    with pytest.raises(UsageError, match=r"input_shape: the recurrent layer\(s\) lstm \(LSTM\) convert to TFLite's "
                                         r"sequence ops at a fixed batch only: give seq a batch \(1\) instead of -1"):
        edgekit.convert(tmp_path / "lstm.keras", output=tmp_path / "x.tflite", input_shape=(-1, 5, 3))
    assert not (tmp_path / "x.tflite").exists()


def test_a_float_model_stopped_before_calibration_draws_no_calibration_sample(models):
    """What closes the batch sees the float model before it is calibrated: stopped there, not one
    calibration sample is drawn (the calibration is as long as the whole conversion on a large model), the
    exception comes out as raised, and the converter calibrates as before afterwards."""
    import keras
    import tensorflow as tf

    from edgekit.converters.int8 import ranges
    from edgekit.converters.quantize import configure

    drawn: list[int] = []

    def representative():
        for s in np.random.default_rng(0).uniform(0, 255, (20, 1, 8, 8, 1)).astype(np.float32):
            drawn.append(1)
            yield [s]

    class Stop(Exception):
        pass

    seen: list[bytes] = []

    def before(model: bytes) -> None:
        seen.append(model)
        raise Stop

    converter = configure(tf.lite.TFLiteConverter.from_keras_model(keras.saving.load_model(models / "flat.keras")),
                          "int8", "float32", representative)
    with pytest.raises(Stop):
        ranges.calibrated_model(converter, before=before)
    assert not drawn and len(seen) == 1 and seen[0][4:8] == b"TFL3"
    assert [r["op"] for r in check_model(seen[0]) if not r["compatible"]] == FLATTEN_OPS
    assert ranges.calibrated_model(converter) and len(drawn) == 20
