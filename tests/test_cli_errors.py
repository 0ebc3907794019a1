"""Bad input: one line on stderr, a documented non-zero exit code, and no output file."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from edgekit.cli import main
from helpers import run_cli


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result, lines


def assert_one_line_error(result, lines, code, text):
    assert result.exit_code == code, (result.exit_code, result.stderr, result.exception)
    assert len(lines) == 1, lines
    assert lines[0].startswith("edgekit: error: ") and text in lines[0], lines[0]
    assert "Traceback" not in result.output


def test_missing_model_file(tmp_path):
    result, lines = invoke("convert", tmp_path / "nope.keras")
    assert_one_line_error(result, lines, 3, "no such file")
    assert list(tmp_path.iterdir()) == []


def test_every_input_is_checked_before_the_output(digits_keras, tmp_path):
    """A missing --calib is said first, not after an output that exists (which would cost the user a
    second try): inputs are validated before any output is looked at."""
    out = tmp_path / "out.tflite"
    out.write_bytes(b"already here")
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "nowhere", "-o", out)
    assert_one_line_error(result, lines, 4, f"--calib: {tmp_path / 'nowhere'}: no such file or folder")
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path, "--max-drop", "1",
                           "--eval-data", tmp_path / "gone", "-o", out)
    assert_one_line_error(result, lines, 4, "--eval-data: ")
    assert out.read_bytes() == b"already here"


def test_file_that_is_not_a_model(tmp_path):
    bad = tmp_path / "photo.keras"
    bad.write_bytes(b"\xff\xd8\xff\xe0 definitely a jpeg")
    result, lines = invoke("convert", bad, "--float16")
    assert_one_line_error(result, lines, 3, "not a Keras model")
    assert not (tmp_path / "photo.float16.tflite").exists()


def test_int8_without_calibration_is_refused_before_any_work(tmp_path, digits_keras):
    out = tmp_path / "m.tflite"
    result, lines = invoke("convert", digits_keras, "--int8", "-o", out)
    assert_one_line_error(result, lines, 2, "needs calibration data")
    assert not out.exists()


def test_two_modes_at_once_is_a_usage_error(tmp_path, digits_keras):
    result, lines = invoke("convert", digits_keras, "--int8", "--float16", "-o", tmp_path / "m.tflite")
    assert_one_line_error(result, lines, 2, "choose one mode")


def test_empty_calibration_folder(tmp_path, digits_keras):
    (tmp_path / "calib").mkdir()
    out = tmp_path / "m.tflite"
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib", "-o", out)
    assert_one_line_error(result, lines, 4, "no images found")
    assert not out.exists()


def test_calibration_folder_without_images(tmp_path, digits_keras):
    calib = tmp_path / "calib" / "cats"
    calib.mkdir(parents=True)
    (calib / "readme.txt").write_text("no images here")
    out = tmp_path / "m.tflite"
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib", "-o", out)
    assert_one_line_error(result, lines, 4, "no images found")
    assert not out.exists()


def test_corrupt_calibration_image_is_named(tmp_path, digits_keras):
    calib = tmp_path / "calib" / "3"
    calib.mkdir(parents=True)
    (calib / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    out = tmp_path / "m.tflite"
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib", "-o", out)
    assert_one_line_error(result, lines, 4, "broken.png")
    assert "no readable images" in lines[0]
    assert not out.exists()


def test_unreadable_calibration_images_are_skipped_and_reported_or_fatal_with_strict(tmp_path, digits_keras,
                                                                                    digits_dir):
    from edgekit.runtime import Model

    calib = tmp_path / "calib" / "3"
    calib.mkdir(parents=True)
    for p in sorted((digits_dir / "train" / "3").glob("*.png"))[:20]:
        (calib / p.name).write_bytes(p.read_bytes())
    (calib / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    out = tmp_path / "m.tflite"
    result = CliRunner().invoke(main, ["convert", str(digits_keras), "--int8", "--calib", str(tmp_path / "calib"),
                                       "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "skipped 1 unreadable calibration image" in result.stderr and "broken.png" in result.stderr
    meta = Model(out).metadata["calibration"]
    assert meta["samples"] == 20 and meta["skipped"] == 1 and meta["skipped_files"][0]["file"].endswith("broken.png")
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib", "-o",
                           tmp_path / "s.tflite", "--strict")
    assert_one_line_error(result, lines, 4, "broken.png")


def test_nan_in_calibration_array(tmp_path, digits_keras):
    x = np.random.default_rng(0).uniform(0, 255, (20, 8, 8, 1)).astype(np.float32)
    x[7, 3, 3, 0] = np.nan
    np.save(tmp_path / "calib.npy", x)
    out = tmp_path / "m.tflite"
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib.npy", "-o", out)
    assert_one_line_error(result, lines, 4, "NaN")
    assert not out.exists()


def test_calibration_array_of_the_wrong_shape(tmp_path, digits_keras):
    np.save(tmp_path / "calib.npy", np.zeros((5, 28, 28, 1), np.float32))
    result, lines = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib.npy",
                           "-o", tmp_path / "m.tflite")
    assert_one_line_error(result, lines, 4, "do not fit the input")


def test_npz_calibration_array_is_used(tmp_path, digits_keras, digits_dir):
    from edgekit.runtime import Model

    x = np.random.default_rng(0).uniform(0, 255, (30, 8, 8)).astype(np.uint8)
    np.savez(tmp_path / "calib.npz", x=x)
    out = tmp_path / "m.tflite"
    result, _ = invoke("convert", digits_keras, "--int8", "--calib", tmp_path / "calib.npz", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert Model(out).metadata["calibration"]["samples"] == 30


def test_existing_output_is_kept_without_force(tmp_path, digits_keras):
    out = tmp_path / "m.tflite"
    out.write_bytes(b"precious")
    result, lines = invoke("convert", digits_keras, "-o", out)
    assert_one_line_error(result, lines, 7, "--force")
    assert out.read_bytes() == b"precious"
    result, _ = invoke("convert", digits_keras, "-o", out, "--force")
    assert result.exit_code == 0 and out.read_bytes()[4:8] == b"TFL3"
    assert [p.name for p in tmp_path.iterdir()] == ["m.tflite"]  # no temporary files left behind


@pytest.mark.parametrize("content", [None, b"not a model", b""])
def test_bench_on_a_missing_or_non_model_file(tmp_path, content):
    path = tmp_path / "m.tflite"
    if content is not None:
        path.write_bytes(content)
    result, lines = invoke("bench", path)
    assert_one_line_error(result, lines, 3, "m.tflite")


def test_bench_reference_needs_data(converted, digits_keras):
    result, lines = invoke("bench", converted("int8"), "--reference", digits_keras)
    assert_one_line_error(result, lines, 2, "--reference: needs --data")


def test_real_process_prints_one_line_and_no_traceback(tmp_path):
    bad = tmp_path / "x.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)  # an HDF5 signature, nothing inside
    result = run_cli("convert", bad)
    assert result.returncode == 3
    assert len(result.error_lines) == 1 and "Traceback" not in result.stderr, result.stderr


def test_lambda_in_a_keras2_h5_is_refused_before_any_code_runs(tmp_path):
    import tf_keras

    marker = tmp_path / "PWNED"
    target = str(marker)
    inputs = tf_keras.Input((5, 4))
    x = tf_keras.layers.LSTM(3)(inputs)  # Keras 3 cannot load this file, so tf_keras would be tried
    x = tf_keras.layers.Lambda(lambda t: (open(target, "w").close(), t)[1])(x)
    tf_keras.Model(inputs, x).save(tmp_path / "evil.h5")
    marker.unlink(missing_ok=True)  # saving traced the lambda once
    result, lines = invoke("convert", tmp_path / "evil.h5")
    assert_one_line_error(result, lines, 3, "Lambda")
    assert not marker.exists()


def test_tf_saved_model_save_of_a_keras_model_converts_correctly(tmp_path, digits_keras, digits_dir):
    import keras
    import tensorflow as tf

    from edgekit.converters.loading import load_model
    from edgekit.runtime import Model

    model = keras.saving.load_model(digits_keras)
    tf.saved_model.save(model, str(tmp_path / "sm"))
    out = tmp_path / "sm.tflite"
    result, _ = invoke("convert", tmp_path / "sm", "-o", out)
    assert result.exit_code == 0, result.stderr
    x = np.random.default_rng(0).uniform(0, 255, (8, 8, 8, 1)).astype(np.float32)
    assert np.max(np.abs(Model(out).predict(x) - load_model(digits_keras).predict(x))) <= 1e-4


def test_image_options_on_a_non_image_model_are_refused(tmp_path):
    import keras

    inputs = keras.Input((20,))
    keras.Model(inputs, keras.layers.Dense(3)(inputs)).save(tmp_path / "tab.keras")
    np.save(tmp_path / "tab.npy", np.random.default_rng(0).normal(size=(30, 20)).astype(np.float32))
    result, lines = invoke("convert", tmp_path / "tab.keras", "--int8", "--calib", tmp_path / "tab.npy",
                           "--mean", "5")
    assert_one_line_error(result, lines, 2, "apply to image inputs")
    result, _ = invoke("convert", tmp_path / "tab.keras", "--int8", "--calib", tmp_path / "tab.npy")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("args, code, text", [
    (["-o", "{tmp}"], 2, "is a folder"),
    (["-o", "{model}", "--force"], 2, "would replace an input"),
    (["-o", "/proc/edgekit-test.tflite"], 2, "cannot write there"),
    (["--float16", "--mean", "1,2,3", "-o", "{tmp}/m.tflite"], 2, "needs 1 value"),
])
def test_bad_outputs_and_options_fail_before_the_work(tmp_path, digits_keras, args, code, text):
    args = [a.format(tmp=tmp_path, model=digits_keras) for a in args]
    before = digits_keras.read_bytes()
    result, lines = invoke("convert", digits_keras, *args)
    assert_one_line_error(result, lines, code, text)
    assert digits_keras.read_bytes() == before


def test_bench_threads_zero_is_an_error_not_all_cores(converted):
    result, lines = invoke("bench", converted("int8"), "--threads", "0")
    assert_one_line_error(result, lines, 2, "--threads: must be at least 1")


def test_bench_reference_of_another_model_is_an_input_shape_error(tmp_path, converted, digits_dir):
    import keras

    inputs = keras.Input((16, 16, 3))
    keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs))).save(tmp_path / "rgb.keras")
    result, lines = invoke("bench", converted("int8"), "--data", digits_dir / "test", "--reference",
                           tmp_path / "rgb.keras", "--runs", "2")
    assert_one_line_error(result, lines, 6, "not the same model")


def test_bench_data_whose_folders_do_not_match_the_outputs_is_refused(tmp_path, digits_dir):
    from edgekit.runtime import Model

    import tensorflow as tf
    import keras

    inputs = keras.Input((8, 8, 1))
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(inputs)))
    (tmp_path / "plain.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    assert Model(tmp_path / "plain.tflite").metadata is None
    result, lines = invoke("bench", tmp_path / "plain.tflite", "--data", digits_dir, "--runs", "2")
    assert_one_line_error(result, lines, 2, "class folders")
    result, _ = invoke("bench", tmp_path / "plain.tflite", "--data", digits_dir / "test", "--runs", "2")
    assert result.exit_code == 0  # folders named 0..9 are the output indices


def test_demo_validates_everything_before_training(tmp_path):
    out = tmp_path / "demo"
    result, lines = invoke("demo", "--out", out, "--runs", "0")
    assert_one_line_error(result, lines, 2, "--runs: must be at least 1")
    assert not out.exists() or list(out.iterdir()) == []
    (tmp_path / "file").write_text("x")
    result, lines = invoke("demo", "--out", tmp_path / "file")
    assert_one_line_error(result, lines, 2, "is a file")
    result, lines = invoke("demo", "--out", out, "--epochs", "0")
    assert_one_line_error(result, lines, 2, "--epochs: must be at least 1")
