"""Every model shape through `edgekit convert`: several outputs (matched by name, never by shape), several
inputs (calibration per input), non-image inputs, open input sizes, SavedModels with named outputs.
The models are built (and where it matters trained) here; numbers are floors from the issue."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edgekit.cli import main
from edgekit.contracts import validate
from edgekit.runtime import ImageFolder, Model, read_image

MODES = ("float32", "float16", "dynamic", "int8", "int16x8")


def convert(*args):
    result = CliRunner().invoke(main, ["convert", *map(str, args)])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result, lines


def images(folder, n=None):
    found = ImageFolder.scan(folder)
    files = found.files if n is None else found.sample(n, 0).files
    return np.stack([read_image(f) for f in files])[..., None].astype(np.float32), found


def as_dict(out, names):
    return out if isinstance(out, dict) else {names[0]: out}


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    """Two outputs of the same shape (N, 10) whose values differ: a softmax and raw logits of other weights."""
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255.0)(x))
    h = keras.layers.Dense(32, activation="relu")(h)
    probs = keras.layers.Dense(10, activation="softmax", name="probs")(h)
    logits = keras.layers.Dense(10, name="logits")(h)
    path = tmp_path_factory.mktemp("shapes") / "two_heads.keras"
    keras.Model(x, [probs, logits]).save(path)
    return path, keras.saving.load_model(path)


@pytest.mark.parametrize("mode", MODES)
def test_two_outputs_of_one_shape_are_kept_by_name_in_every_mode(two_heads, mode, digits_dir, tmp_path):
    path, keras_model = two_heads
    out = tmp_path / f"two.{mode}.tflite"
    calib = ["--calib", digits_dir / "train"] if mode in ("int8", "int16x8") else []
    result, lines = convert(path, f"--{mode}" if mode != "float32" else "--json", *calib, "-o", out)
    assert result.exit_code == 0, lines
    model = Model(out)
    meta = model.metadata
    assert [o["name"] for o in meta["outputs"]] == ["probs", "logits"]
    x, _ = images(digits_dir / "test", 64)
    expected = dict(zip(["probs", "logits"], keras_model.predict(x, verbose=0)))
    got = as_dict(model.predict(x), ["probs", "logits"])
    assert set(got) == {"probs", "logits"}
    for name, want in expected.items():
        err = np.abs(got[name] - want).max()
        span = float(np.ptp(want))
        limit = 1e-4 if mode == "float32" else 0.08 * span  # quantized modes: a few steps of the range
        assert err <= limit, (mode, name, err, span)
    # by name, not by shape: the softmax head sums to one, the logits head does not
    assert np.allclose(got["probs"].sum(axis=1), 1, atol=0.05) and not np.allclose(got["logits"].sum(axis=1), 1, atol=0.05)
    if mode == "int8":
        v = meta["verification"]
        assert set(v["outputs"]) == {"probs", "logits"}
        assert v["outputs"]["probs"]["role"] == "scores" and v["outputs"]["logits"]["role"] == "values"
        assert v["outputs"]["logits"]["top1_agreement"] is None
        probs, logits = v["outputs"]["probs"], v["outputs"]["logits"]  # each agreement with its interval
        assert probs["top1_agreement_interval"][0] <= probs["top1_agreement"] <= probs["top1_agreement_interval"][1]
        assert logits["top1_agreement_interval"] is None and logits["verdict"] is None


def test_three_heads_in_int8_agree_with_keras_on_held_out_images(face_like, digits_dir, tmp_path):
    path, keras_model = face_like
    out = tmp_path / "face.int8.tflite"
    result, lines = convert(path, "--int8", "--calib", digits_dir / "train", "-o", out)
    assert result.exit_code == 0, lines
    model = Model(out)
    assert [o["name"] for o in model.metadata["outputs"]] == ["box", "landmarks", "score"]
    validate(model.metadata)  # the metadata contract holds for several outputs
    x, _ = images(digits_dir / "test")
    want = dict(zip(["box", "landmarks", "score"], keras_model.predict(x, verbose=0)))
    got = model.predict(x)
    agreement = float(np.mean(got["score"].argmax(1) == want["score"].argmax(1)))
    box_mae = float(np.abs(got["box"] - want["box"]).mean())
    print(f"\nscore agreement {agreement:.4f}, box MAE {box_mae:.4f}")
    assert agreement >= 0.99 and box_mae <= 0.02


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(5)
    img = keras.Input((8, 8, 1), name="image")
    meta = keras.Input((4,), name="meta")
    h = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Rescaling(1 / 255.0)(img)), meta])
    out = keras.layers.Dense(10, activation="softmax", name="probs")(keras.layers.Dense(16, activation="relu")(h))
    folder = tmp_path_factory.mktemp("two_inputs")
    keras.Model([img, meta], out).save(folder / "two_in.keras")
    np.save(folder / "meta.npy", np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32))
    return folder


def test_two_inputs_calibrate_each_by_name(two_inputs, digits_dir):
    folder = two_inputs
    out = folder / "two_in.int8.tflite"
    result, lines = convert(folder / "two_in.keras", "--int8", "--calib", f"image={digits_dir / 'train'}",
                            "--calib", f"meta={folder / 'meta.npy'}", "-o", out, "--force")
    assert result.exit_code == 0, lines
    assert any("--calib: the inputs' samples do not pair up (image has 1437, meta has 300)" in line
               for line in lines), lines
    model = Model(out)
    meta = model.metadata
    assert [(t["name"], t["role"]) for t in meta["inputs"]] == [("image", "image"), ("meta", "tensor")]
    validate(meta)
    assert meta["inputs"][0]["preprocessing"]["channels"] == 1 and meta["inputs"][1]["preprocessing"] is None
    assert meta["calibration"]["samples"] == 200 and meta["verification"]["top1_agreement"] >= 0.9
    x, _ = images(digits_dir / "test", 16)
    v = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    assert model.predict({"image": x, "meta": v}).shape == (16, 10)


def test_image_options_per_input_name(two_inputs, digits_dir):
    folder = two_inputs
    out = folder / "two_in.norm.tflite"
    result, lines = convert(folder / "two_in.keras", "--float16", "--mean", "image=127.5", "--std", "image=127.5",
                            "--resize", "image=letterbox", "-o", out, "--force")
    assert result.exit_code == 0, lines
    pre = Model(out).metadata["inputs"][0]["preprocessing"]
    assert pre["mean"] == [127.5] and pre["std"] == [127.5] and pre["resize"] == "letterbox"
    result, lines = convert(folder / "two_in.keras", "--float16", "--mean", "meta=1", "-o", folder / "no.tflite")
    assert result.exit_code == 2 and "meta is not an image input" in lines[0], lines


@pytest.mark.parametrize("calib, says", [
    (["image={digits}"], "missing meta"),
    (["image={digits}", "meta={meta}", "extra={meta}"], "unknown extra"),
    (["{digits}"], "give a .npz keyed by input names"),
])
def test_bad_calibration_keys_are_exit_4_naming_them(two_inputs, digits_dir, calib, says):
    args = []
    for c in calib:
        args += ["--calib", c.format(digits=digits_dir / "train", meta=two_inputs / "meta.npy")]
    result, lines = convert(two_inputs / "two_in.keras", "--int8", *args, "-o", two_inputs / "never.tflite")
    assert result.exit_code == 4 and len(lines) == 1 and says in lines[0], lines
    assert not (two_inputs / "never.tflite").exists()


def test_an_npz_keyed_by_input_names_calibrates_both(two_inputs, digits_dir):
    x, _ = images(digits_dir / "train", 50)
    np.savez(two_inputs / "both.npz", image=x.astype(np.uint8), meta=np.ones((50, 4), np.float32))
    out = two_inputs / "npz.int8.tflite"
    result, lines = convert(two_inputs / "two_in.keras", "--int8", "--calib", two_inputs / "both.npz", "-o", out)
    assert result.exit_code == 0, lines
    assert Model(out).metadata["calibration"]["samples"] == 50


@pytest.fixture(scope="module")
def open_size(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(6)
    x = keras.Input((None, None, 3), name="frame")
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(keras.layers.Rescaling(1 / 255.0)(x))
    heat = keras.layers.Conv2D(2, 1, activation="sigmoid", name="heatmap")(h)
    pooled = keras.layers.Dense(3, name="summary")(keras.layers.GlobalAveragePooling2D()(h))
    path = tmp_path_factory.mktemp("open") / "fcn.keras"
    keras.Model(x, [heat, pooled]).save(path)
    return path, keras.saving.load_model(path)


def test_open_size_model_keeps_its_open_size_and_runs_at_any_size(open_size, photos_dir, tmp_path):
    path, keras_model = open_size
    out = tmp_path / "fcn.float16.tflite"
    result, lines = convert(path, "--float16", "-o", out)
    assert result.exit_code == 0, lines
    model = Model(out)
    for size in (48, 96):
        import cv2

        frame = cv2.resize(read_image(photos_dir / "astronaut.jpg"), (size, size))[None].astype(np.float32)
        want = dict(zip(["heatmap", "summary"], keras_model.predict(frame, verbose=0)))
        got = model.predict(frame)
        assert got["heatmap"].shape == (1, size, size, 2)
        for name in want:
            assert np.abs(got[name] - want[name]).max() <= 1e-2, (size, name)


@pytest.mark.parametrize("size", [48, 96])
def test_open_size_model_fixed_with_input_shape_matches_keras_at_that_size(open_size, photos_dir, tmp_path, size):
    import cv2

    path, keras_model = open_size
    out = tmp_path / f"fcn{size}.float16.tflite"
    result, lines = convert(path, "--float16", "--input-shape", f"1,{size},{size},3", "-o", out)
    assert result.exit_code == 0, lines
    model = Model(out)
    assert tuple(model.inputs[0].shape) == (1, size, size, 3) and -1 not in model.inputs[0].shape_signature[1:]
    frame = cv2.resize(read_image(photos_dir / "coffee.jpg"), (size, size))[None].astype(np.float32)
    want = dict(zip(["heatmap", "summary"], keras_model.predict(frame, verbose=0)))
    got = model.predict(frame)
    for name in want:
        assert np.abs(got[name] - want[name]).max() <= 1e-2, (size, name)


def test_open_size_int8_needs_input_shape_for_image_calibration(open_size, photos_dir, tmp_path):
    path, keras_model = open_size
    result, lines = convert(path, "--int8", "--calib", photos_dir, "-o", tmp_path / "x.tflite")
    assert result.exit_code == 4 and "--input-shape frame=1,H,W,3" in lines[0], lines
    out = tmp_path / "fcn48.int8.tflite"
    result, lines = convert(path, "--int8", "--calib", photos_dir, "--input-shape", "1,48,48,3", "-o", out)
    assert result.exit_code == 0, lines
    model = Model(out)
    assert tuple(model.inputs[0].shape) == (1, 48, 48, 3)
    assert model.metadata["preprocessing"]["height"] == 48
    result, lines = convert(path, "--float16", "--input-shape", "1,48,48", "-o", tmp_path / "y.tflite")
    assert result.exit_code == 6 and "does not fit" in lines[0], lines


@pytest.fixture(scope="module")
def audio_saved_model(tmp_path_factory):
    """A tf.Module SavedModel: 2 s of 8 kHz audio in, three named outputs."""
    import tensorflow as tf

    class Audio(tf.Module):
        def __init__(self):
            rng = np.random.default_rng(7)
            self.frames = tf.Variable(rng.normal(scale=0.05, size=(400, 16)).astype(np.float32))
            self.cls = tf.Variable(rng.normal(scale=0.3, size=(16, 5)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec((None, 16000), tf.float32, name="waveform")])
        def __call__(self, waveform):
            frames = tf.reshape(waveform, (-1, 40, 400))
            energy = tf.reduce_mean(tf.square(frames), axis=2)
            embedding = tf.reduce_mean(tf.nn.relu(tf.matmul(frames, self.frames)), axis=1)
            return {"embedding": embedding, "energy": energy,
                    "labels": tf.nn.softmax(tf.matmul(embedding, self.cls))}

    module = Audio()
    folder = tmp_path_factory.mktemp("audio")
    tf.saved_model.save(module, str(folder / "audio"), signatures=module.__call__)
    t = np.linspace(0, 2, 16000, dtype=np.float32)
    waves = np.stack([np.sin(2 * np.pi * f * t) * a for f, a in zip(np.linspace(100, 900, 64), np.linspace(0.1, 1, 64))])
    np.save(folder / "waves.npy", waves.astype(np.float32))
    return folder, module, waves.astype(np.float32)


@pytest.mark.parametrize("mode", ["float16", "int8"])
def test_audio_saved_model_keeps_its_signature_names(audio_saved_model, mode):
    folder, module, waves = audio_saved_model
    out = folder / f"audio.{mode}.tflite"
    calib = ["--calib", folder / "waves.npy"] if mode == "int8" else []
    result, lines = convert(folder / "audio", f"--{mode}", *calib, "-o", out, "--force")
    assert result.exit_code == 0, lines
    model = Model(out)
    meta = model.metadata
    assert meta["preprocessing"] is None and meta["inputs"][0]["role"] == "tensor"
    assert {o["name"] for o in meta["outputs"]} == {"embedding", "energy", "labels"}
    got = model.predict(waves[:8])
    want = {k: v.numpy() for k, v in module(waves[:8]).items()}
    for name in want:
        err = float(np.abs(got[name] - want[name]).max())
        assert err <= (0.05 if mode == "float16" else 0.1 * max(float(np.ptp(want[name])), 1e-3)), (name, err)
    if mode == "int8":
        assert set(meta["verification"]["outputs"]) == {"embedding", "energy", "labels"}
    print(json.dumps(meta["verification"], indent=None)[:300])


def test_a_failed_conversion_with_an_open_size_says_which_dimension_and_the_fix():
    from edgekit.converters.loading import TensorSpec
    from edgekit.converters.shapes import open_size_hint

    hint = open_size_hint((TensorSpec("frame", (None, None, None, 3)), TensorSpec("meta", (None, 4))))
    assert hint == ("open input size: frame (None, None, None, 3) (dimensions 1, 2); "
                    "fix it with `input_shape` frame=1,N,N,3")  # the CLI shows --input-shape
    assert open_size_hint((TensorSpec("image", (None, 8, 8, 1)),)) is None  # an open batch is fine


def test_a_size_the_graph_cannot_take_is_a_conversion_error_not_an_internal_one(tmp_path):
    import keras

    x = keras.Input((None, None, 1), name="grid")
    keras.Model(x, keras.layers.Dense(3, name="out")(keras.layers.Reshape((64,))(x))).save(tmp_path / "fixed.keras")
    result, lines = convert(tmp_path / "fixed.keras", "--input-shape", "1,4,4,1", "-o", tmp_path / "x.tflite")
    assert result.exit_code == 5 and len(lines) == 1 and "cannot trace the model" in lines[0], lines
    assert not (tmp_path / "x.tflite").exists()


def test_a_corrupt_npz_is_a_calibration_error(two_inputs, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip archive")
    result, lines = convert(two_inputs / "two_in.keras", "--int8", "--calib", bad, "-o", tmp_path / "x.tflite")
    assert result.exit_code == 4 and len(lines) == 1 and "not a readable numpy file" in lines[0], lines
