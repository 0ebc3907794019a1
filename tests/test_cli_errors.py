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
    assert not out.exists()


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
    assert_one_line_error(result, lines, 4, "do not fit the model input")


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
    assert_one_line_error(result, lines, 2, "--reference needs --data")


def test_real_process_prints_one_line_and_no_traceback(tmp_path):
    bad = tmp_path / "x.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)  # an HDF5 signature, nothing inside
    result = run_cli("convert", bad)
    assert result.returncode == 3
    assert len(result.error_lines) == 1 and "Traceback" not in result.stderr, result.stderr
