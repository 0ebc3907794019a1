"""`edgekit inspect` on float32, float16, dynamic, int8 and sparse models, edgekit's and others'."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edgekit.cli import main
from edgekit.errors import ModelFormatError
from edgekit.runtime.inspect import inspect_file
from helpers import run_cli


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """Models written by a plain TFLiteConverter (no edgekit metadata): float32, int8 and sparse."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    d = tmp_path_factory.mktemp("foreign")
    inputs = keras.Input((16,))
    dense = keras.layers.Dense(256, activation="relu")
    outputs = keras.layers.Dense(10)(dense(inputs))
    model = keras.Model(inputs, outputs)
    kernel, bias = dense.get_weights()
    mask = np.random.default_rng(0).random(kernel.shape) < 0.8
    dense.set_weights([np.where(mask, 0.0, kernel).astype(np.float32), bias])
    paths = {}
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    paths["float32"] = d / "plain.tflite"
    paths["float32"].write_bytes(conv.convert())
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    paths["sparse"] = d / "sparse.tflite"
    paths["sparse"].write_bytes(conv.convert())
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([np.random.default_rng(i).normal(size=(1, 16)).astype(np.float32)]
                                           for i in range(20))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    paths["int8"] = d / "int8.tflite"
    paths["int8"].write_bytes(conv.convert())
    return paths


def test_int8_model_is_int8_per_channel_with_quantize_at_the_edges(converted):
    r = inspect_file(converted("int8"))
    assert r["quantization"]["quantized"] and r["quantization"]["per_channel"] >= 3
    assert r["op_dtype_share"]["int8"] >= 0.8
    assert r["weight_share"]["int8"] > 0.95
    assert {o["op"] for o in r["float_ops"]} <= {"SOFTMAX"} or all(o["op"] != "CONV_2D" for o in r["float_ops"])
    assert r["ops"]["histogram"]["CONV_2D"] == 3 and r["op_versions"]["CONV_2D"] == [3]
    assert r["inputs"][0]["dtype"] == "float32" and r["metadata"]["edgekit"]["mode"] == "int8"


def test_float16_model_keeps_float16_weights_and_float32_compute(converted):
    r = inspect_file(converted("float16"))
    assert r["weight_share"]["float16"] > 0.99
    assert r["op_dtype_share"] == {"float32": 1.0}
    assert r["ops"]["histogram"]["DEQUANTIZE"] >= 5
    assert not r["quantization"]["quantized"]


def test_dynamic_range_model_has_int8_weights_and_float_ops(converted):
    r = inspect_file(converted("dynamic"))
    assert r["weight_share"]["int8"] > 0.9 and r["op_dtype_share"] == {"float32": 1.0}
    assert len(r["float_ops"]) == r["ops"]["count"]  # hybrid: every op computes in float


def test_models_edgekit_did_not_write_are_inspected_too(foreign):
    r = inspect_file(foreign["float32"])
    assert r["metadata"]["edgekit"] is None and r["metadata"]["min_runtime_version"]
    assert r["ops"]["histogram"]["FULLY_CONNECTED"] == 2
    assert r["sparsity"]["zero_fraction"] == pytest.approx(0.8 * 4096 / (4096 + 2560), abs=0.02)
    q = inspect_file(foreign["int8"])
    assert q["quantization"]["quantized"] and q["weight_share"]["int8"] > 0.9


def test_sparse_format_tensors_and_densify_are_reported(foreign):
    r = inspect_file(foreign["sparse"])
    assert r["sparsity"]["sparse_format_tensors"] >= 1
    assert "DENSIFY" in r["ops"]["histogram"]


def test_inspect_cli_json_without_tensorflow(converted, foreign):
    paths = (converted("int8"), converted("float16"), converted("float32"), foreign["sparse"], foreign["int8"],
             foreign["float32"])
    for path in paths:
        result = run_cli("inspect", path, "--json", "--runtime", "ai-edge-litert==2.3", block_tf=True)
        assert result.returncode == 0, result.stderr
        assert result.imports == [] and result.modules == [], result.import_sites  # not even tried
        report = json.loads(result.stdout)
        assert report["schema"] == "edgekit.inspect/1"
        assert {"inputs", "outputs", "ops", "op_versions", "op_dtype_share", "weight_share", "quantization",
                "sparsity", "custom_ops", "flex_ops", "metadata", "gpu", "runtime_requirements"} <= set(report)
        assert report["runtime_checks"][0]["ok"] and report["gpu"]["checked"]


def test_inspect_text_names_the_essentials(converted):
    result = CliRunner().invoke(main, ["inspect", str(converted("int8", "int8"))])
    assert result.exit_code == 0, result.output
    for text in ("CONV_2D x3", "int8", "per-channel", "scale", "edgekit: mode int8"):
        assert text in result.output


@pytest.mark.parametrize("mutate", [
    lambda b: b[:40], lambda b: b[:4] + b"XXXX" + b[8:], lambda b: b"\xff\xff\xff\x7f" + b[4:],
])
def test_corrupt_models_are_one_line_model_format_errors(tmp_path, converted, mutate):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(mutate(converted("float32").read_bytes()))
    with pytest.raises(ModelFormatError):
        inspect_file(bad)
    result = CliRunner().invoke(main, ["inspect", str(bad)])
    assert result.exit_code == 3 and len(result.stderr.strip().splitlines()) == 1


def test_runtime_gate_flags_an_op_version_newer_than_the_runtime(converted):
    """Dynamic-range FULLY_CONNECTED is version 12 (TFLite 2.17): the classic Raspberry Pi error
    "Didn't find op for builtin opcode 'FULLY_CONNECTED' version '12'" on tflite-runtime 2.14."""
    result = run_cli("inspect", converted("dynamic"), "--no-gpu", "--runtime", "tflite-runtime==2.14", block_tf=True)
    assert result.returncode == 5
    assert "FULLY_CONNECTED v12" in result.error_lines[-1] and "tflite-runtime==2.14" in result.error_lines[-1]
    assert "FAILS to load" in result.stdout


def test_runtime_gate_passes_a_model_that_fits(converted):
    for spec in ("tflite-runtime==2.14", "ai-edge-litert==2.3", "tensorflow==2.21"):
        result = CliRunner().invoke(main, ["inspect", str(converted("float32")), "--no-gpu", "--runtime", spec])
        assert result.exit_code == 0, (spec, result.output)
        assert f"runtime {spec}" in result.output and "loads" in result.output


def test_runtime_requirements_agree_with_the_converters_own_record(converted):
    from edgekit.runtime.compat import parse_version, runtime_requirements

    for mode in ("float32", "float16", "dynamic", "int8"):
        r = inspect_file(converted(mode), gpu=False)
        ours = runtime_requirements(r)["min_version"]
        assert parse_version(ours) == parse_version(r["metadata"]["min_runtime_version"]), mode


def test_probed_exceptions_in_the_table_are_honoured():
    from edgekit.runtime.compat import check_runtime

    report = {"op_versions": {"QUANTIZE": [5]}}
    assert not check_runtime(report, "tensorflow==2.21")["ok"]  # labelled 2.21.0, but 2.21.0 cannot load it
    assert check_runtime(report, "ai-edge-litert==2.3")["ok"]
    with pytest.raises(Exception, match="unknown runtime package"):
        check_runtime(report, "onnxruntime==1.0")


def test_the_gate_never_says_yes_for_an_op_version_it_does_not_know(converted, tmp_path):
    """CONV_2D v99 is in no record: every --runtime check fails (exit 5) naming it, --json lists it as
    unknown, and the "needs a TFLite runtime" line does not silently leave it out."""
    from test_exit_codes import _with_op_version

    v99 = _with_op_version(converted("int8"), tmp_path / "conv99.tflite", "CONV_2D", 99)
    result = run_cli("inspect", v99, "--no-gpu", "--runtime", "tflite-runtime==2.14", block_tf=True)
    assert result.returncode == 5
    assert "CONV_2D v99: newer than any runtime edgekit knows" in result.error_lines[-1]
    assert "  CONV_2D v99: newer than any runtime edgekit knows" in result.stdout
    assert "FAILS to load" in result.stdout
    for spec in ("ai-edge-litert==2.3", "tensorflow==2.21"):  # the newest runtimes too: no guessing
        assert run_cli("inspect", v99, "--no-gpu", "--runtime", spec, block_tf=True).returncode == 5
    report = json.loads(run_cli("inspect", v99, "--no-gpu", "--json", "--runtime", "tflite-runtime==2.14").stdout)
    assert report["runtime_requirements"]["unknown_ops"] == ["CONV_2D v99"]
    check = report["runtime_checks"][0]
    assert check["ok"] is False and check["unknown_ops"] == ["CONV_2D v99"] and check["unsupported"] == []


def test_registered_custom_ops_pass_and_others_do_not(converted, detector_tflite):
    from edgekit.runtime.compat import check_runtime

    detector = inspect_file(detector_tflite, gpu=False)
    assert "TFLite_Detection_PostProcess" in detector["custom_ops"]
    assert check_runtime(detector, "tflite-runtime==2.14")["ok"]
    report = {"op_versions": {"MyOp": [1], "CONV_2D": [1]}, "custom_ops": ["MyOp"], "flex_ops": []}
    check = check_runtime(report, "ai-edge-litert==2.3")
    assert not check["ok"] and check["unknown_reasons"] == ["MyOp: a custom op, loads only where its kernel is registered"]
