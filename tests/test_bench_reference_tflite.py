"""`bench --reference` with a float .tflite (the int8 file's float twin): run by edgekit.runtime without
TensorFlow, compared as a Keras reference is, with the paired 95 % interval, its verdict and a collapse check.
The collapsed files are the digits int8 file with its last layer rewritten (flatbuffer object API)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_cli

from edgekit.contracts import validate
from edgekit.harness import bench
from edgekit.runtime.schema import pack, schema_module, unpack
from edgekit.runtime.timing import BenchSettings

SETTINGS = BenchSettings(threads=1, runs=3, warmup=1)


def last_layer_rewritten(tflite: bytes, how: str) -> bytes:
    """The int8 file with its last FULLY_CONNECTED (the class logits) changed: "zeroed" weights and bias (every
    sample gets the same logits: constant outputs), or "rolled" classes (its rows shifted by one: outputs
    that no longer follow the float model's)."""
    s = schema_module()
    model = unpack(tflite)
    graph = model.subgraphs[0]
    fc = [op for op in graph.operators
          if model.operatorCodes[op.opcodeIndex].builtinCode == s.BuiltinOperator.FULLY_CONNECTED][-1]
    weights, bias = (graph.tensors[i] for i in fc.inputs[1:3])
    for tensor, dtype in ((weights, np.int8), (bias, np.int32)):
        buffer = model.buffers[tensor.buffer]
        values = np.frombuffer(np.asarray(buffer.data, np.uint8).tobytes(), dtype).reshape(tuple(tensor.shape))
        values = np.zeros_like(values) if how == "zeroed" else np.roll(values, 1, axis=0)
        buffer.data = np.frombuffer(values.tobytes(), np.uint8)
        q = tensor.quantization
        if how == "rolled" and q is not None and q.scale is not None and len(q.scale) > 1:
            q.scale = list(np.roll(np.asarray(q.scale), 1))
    return pack(model)


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory, converted):
    folder = tmp_path_factory.mktemp("collapsed")
    files = {}
    for how in ("zeroed", "rolled"):
        files[how] = folder / f"digits.int8.{how}.tflite"
        files[how].write_bytes(last_layer_rewritten(converted("int8").read_bytes(), how))
    return files


def test_float_tflite_reference_gives_the_keras_reference_keys_with_interval_and_no_collapse(converted, digits_dir):
    report = bench([converted("int8")], SETTINGS, data=digits_dir / "test", reference=converted("float32"))
    validate(report, "edgekit.bench/1")
    ref, acc = report["reference"], report["models"][0]["accuracy"]
    assert ref["format"] == "tflite" and ref["top1"] >= 0.95 and ref["device"].split()[0] == "ai_edge_litert"
    assert acc["top1_delta_points"] == pytest.approx(100 * (acc["top1"] - ref["top1"]))
    assert {"reference_top1", "reference_per_class_top1", "agreement", "snr_db", "outputs"} <= set(acc)
    cmp = acc["comparison"]
    assert cmp["n"] == 360 and cmp["change_points"] == pytest.approx(acc["top1_delta_points"], abs=1e-4)
    low, high = cmp["change_interval"]
    assert low <= cmp["change_points"] <= high and cmp["verdict"].endswith("at n=360")
    assert cmp["agreement"] == pytest.approx(acc["agreement"], abs=1e-6) and cmp["agreement_interval"][1] <= 1
    assert acc["collapse"]["collapsed"] is False and acc["collapse"]["correlation"] > 0.99


@pytest.mark.parametrize("how, constant", [("zeroed", True), ("rolled", False)])
def test_a_collapsed_int8_file_is_flagged(collapsed, converted, digits_dir, how, constant):
    report = bench([collapsed[how]], SETTINGS, data=digits_dir / "test", reference=converted("float32"))
    validate(report, "edgekit.bench/1")
    acc = report["models"][0]["accuracy"]
    verdict = acc["collapse"]
    assert verdict["collapsed"] is True and verdict["constant"] is constant
    assert verdict["verdict"].startswith("collapsed:")
    assert (verdict["correlation"] is None) if constant else verdict["correlation"] < 0.9
    assert acc["comparison"]["verdict"].startswith("loses") and acc["comparison"]["change_interval"][1] < 0


def test_audit_of_an_int8_file_against_its_float_twin_needs_no_tensorflow(tmp_path, collapsed, converted,
                                                                           digits_dir):
    out = tmp_path / "b.json"
    result = run_cli("bench", converted("int8"), collapsed["zeroed"], "--runs", "3", "--warmup", "1",
                     "--data", digits_dir / "test", "--reference", converted("float32"), "--json", out,
                     block_tf=True)
    assert result.returncode == 0, result.stderr
    assert result.imports == [] and result.modules == [], result.import_sites
    good, bad = json.loads(out.read_text())["models"]
    assert good["accuracy"]["collapse"]["collapsed"] is False and bad["accuracy"]["collapse"]["collapsed"] is True
    text = result.stdout
    assert "(tflite, ai_edge_litert" in text
    verdict = good["accuracy"]["comparison"]["verdict"]
    assert "digits.int8.float32.tflite: against the reference, top-1 " in text and f"): {verdict}" in text
    assert "digits.int8.zeroed.tflite: collapsed: the same outputs for all 360 samples" in text
    assert "digits.int8.float32.tflite: collapsed" not in text
