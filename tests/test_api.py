"""The Python API (`import edgekit`): the README's example runs as written; in-memory models and
calibration data; typed results whose `.to_dict()` is the CLI's JSON; the same rules as the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import edgekit
from conftest import ROOT
from edgekit.contracts import validate
from helpers import run_cli


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- python-api -->\s*```python\n(.*?)```\s*<!-- /python-api -->", text, re.S)
    assert block, "README lost its Python API block"
    return block.group(1)


def test_import_edgekit_loads_neither_tensorflow_nor_litert():
    code = ("import sys, edgekit\n"
            "edgekit.convert, edgekit.bench, edgekit.inspect, edgekit.sweep, edgekit.EdgekitError\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'tf_keras', 'ai_edge_litert', 'cv2')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_readme_example_runs_as_written(tmp_path):
    """In-memory Keras model + numpy calibration -> int8 file -> bench on a folder -> inspect."""
    (tmp_path / "calibration_data").symlink_to(ROOT / "calibration_data")
    (tmp_path / "example.py").write_text(_readme_example())
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("digits.int8.tflite ") and "agreement" in lines[0]
    agreement = float(lines[0].rsplit(" ", 1)[1])
    top1 = float(lines[1].split()[1])
    assert agreement >= 0.97 and top1 >= 0.9, lines
    assert "CONV_2D" in lines[2]
    meta = edgekit.inspect(tmp_path / "digits.int8.tflite").to_dict()["metadata"]["edgekit"]
    assert meta["source"]["file"].endswith(".keras") and meta["calibration"]["source"].startswith("numpy array")


@pytest.fixture(scope="module")
def small_model():
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255.0),
                              keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")], name="tiny")
    return model


def _digits(digits_dir, n=64):
    from edgekit.runtime import ImageFolder, read_image

    folder = ImageFolder.scan(digits_dir / "train").sample(n, 0)
    return np.stack([read_image(f) for f in folder.files])[..., None]


def test_in_memory_model_needs_an_output(small_model, digits_dir):
    with pytest.raises(edgekit.UsageError, match="an in-memory Keras model needs output "):
        edgekit.convert(small_model, mode="int8", calib=_digits(digits_dir))


@pytest.mark.parametrize("kind", ["array", "list", "dataset"])
def test_calibration_from_memory_gives_the_same_file_as_from_an_npy(small_model, digits_dir, tmp_path, kind):
    """An array, a list of single samples and a batched tf.data.Dataset of the same images calibrate
    exactly like the .npy file holding them."""
    import tensorflow as tf

    x = _digits(digits_dir)
    np.save(tmp_path / "calib.npy", x)
    model_path = tmp_path / "tiny.keras"
    small_model.save(model_path)
    reference = edgekit.convert(model_path, mode="int8", calib=tmp_path / "calib.npy", calibration=edgekit.CalibrationSpec(samples=64),
                                output=tmp_path / "from_npy.tflite")
    data = {"array": x, "list": list(x), "dataset": tf.data.Dataset.from_tensor_slices(x).batch(16)}[kind]
    result = edgekit.convert(small_model, mode="int8", calib=data, calibration=edgekit.CalibrationSpec(samples=64), output=tmp_path / f"{kind}.tflite")
    assert result.metadata["calibration"]["samples"] == 64
    assert result.verification["top1_agreement"] == reference.verification["top1_agreement"]
    ops_a = edgekit.inspect(result.path).to_dict()
    ops_b = edgekit.inspect(reference.path).to_dict()
    assert ops_a["ops"] == ops_b["ops"] and ops_a["weight_bytes"] == ops_b["weight_bytes"]
    from edgekit.runtime import Model

    a, b = Model(result.path), Model(reference.path)
    assert [(t.scale, t.zero_point) for t in a.inputs] == [(t.scale, t.zero_point) for t in b.inputs]
    np.testing.assert_array_equal(a.predict(x[:8].astype(np.float32)), b.predict(x[:8].astype(np.float32)))


def test_an_in_memory_tf_keras_model_converts_too(digits_dir, tmp_path):
    import tf_keras

    tf_keras.utils.set_random_seed(2)
    model = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Rescaling(1 / 255.0),
                                 tf_keras.layers.Conv2D(4, 3, activation="relu"), tf_keras.layers.Flatten(),
                                 tf_keras.layers.Dense(10, activation="softmax")], name="legacy")
    x = _digits(digits_dir, 32)
    result = edgekit.convert(model, mode="int8", calib=x, output=tmp_path / "legacy.tflite")
    assert result.metadata["source"]["file"] == "legacy.h5"
    assert result.verification["samples"] == 32 and result.verification["max_abs_error"] < 0.05
    expected = model.predict(x.astype(np.float32), verbose=0)
    from edgekit.runtime import Model

    got = Model(result.path).predict(x.astype(np.float32))
    assert np.abs(got - expected).max() < 0.05


def test_calibration_of_the_wrong_kind_is_a_calibration_error(small_model, tmp_path):
    with pytest.raises(edgekit.CalibrationError, match="pass a path, a numpy array"):
        edgekit.convert(small_model, mode="int8", calib=42, output=tmp_path / "x.tflite")
    with pytest.raises(edgekit.CalibrationError, match="do not fit the input"):
        edgekit.convert(small_model, mode="int8", calib=np.zeros((4, 5, 5, 1), np.float32), output=tmp_path / "y.tflite")
    assert not (tmp_path / "y.tflite").exists()


def test_gpu_target_without_a_mode_is_float16_and_says_so(small_model, tmp_path):
    result = edgekit.convert(small_model, target="gpu", output=tmp_path / "gpu.tflite")
    assert result.metadata["mode"] == "float16"
    assert any("float16" in w and "target gpu" in w for w in result.changes)


def test_bench_report_is_the_cli_json(converted, digits_dir):
    path = converted("int8")
    report = edgekit.bench(path, data=digits_dir / "test", threads=1, runs=20)
    validate(report.to_dict())
    cli = run_cli("bench", path, "--data", digits_dir / "test", "--threads", "1", "--runs", "20", "--json", "-")
    assert cli.returncode == 0, cli.stderr
    from_cli = json.loads(cli.stdout)
    ours = report.to_dict()
    for doc in (ours, from_cli):  # timings and memory differ run to run; the rest must not
        for m in doc["models"]:
            m.pop("latency_ms"), m.pop("throughput_per_s"), m.pop("memory")
    assert ours == from_cli
    assert report.models[0]["accuracy"]["top1"] > 0.9


def test_bench_reference_without_data_is_a_usage_error_in_the_library(converted, digits_keras):
    with pytest.raises(edgekit.UsageError, match="reference: needs data"):
        edgekit.bench([converted("int8")], reference=digits_keras)
    with pytest.raises(edgekit.UsageError, match="threads: must be at least 1"):
        edgekit.bench([converted("int8")], threads=0)


def test_inspect_report_is_the_cli_json_and_checks_runtimes(converted, tmp_path):
    path = converted("int8")
    report = edgekit.inspect(path, runtimes=["ai-edge-litert==2.3"])
    cli = run_cli("inspect", path, "--runtime", "ai-edge-litert==2.3", "--json")
    assert cli.returncode == 0 and json.loads(cli.stdout) == report.to_dict()
    validate(report.to_dict())
    report.check_runtimes()  # loads: no error
    from test_exit_codes import _with_op_version

    newer = _with_op_version(path, tmp_path / "fc12.tflite", "FULLY_CONNECTED", 12)
    old = edgekit.inspect(newer, runtimes=["tflite-runtime==2.14"])
    assert [c["runtime"] for c in old.failing_runtimes] == ["tflite-runtime==2.14"]
    with pytest.raises(edgekit.UnsupportedOpsError, match="tflite-runtime==2.14 cannot load .*FULLY_CONNECTED v12"):
        old.check_runtimes()
