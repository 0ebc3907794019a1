"""`edgekit doctor` and delegate hints: what runs here, and a CPU fallback that says why."""

from __future__ import annotations

import json

import pytest

from edgekit.errors import UsageError
from edgekit.runtime import Model
from edgekit.runtime.delegates import hints_for
from edgekit.runtime.doctor import problems
from helpers import run_cli


def test_doctor_json_reports_versions_backend_and_no_problems_here():
    result = run_cli("doctor", "--json")
    assert result.returncode == 0, result.stderr
    # versions come from package metadata and importability from find_spec: TensorFlow is looked up, never imported
    assert result.imports == [] and result.modules == [], result.import_sites
    assert "tensorflow" in result.probes  # the watch saw the lookup, so it would have seen an import
    d = json.loads(result.stdout)
    assert d["schema"] == "edgekit.doctor/1"
    assert d["packages"]["ai-edge-litert"] and d["packages"]["tensorflow"]
    assert d["active_backend"]["name"] == "ai_edge_litert"
    assert d["problems"] == [] and d["ok"] is True
    assert all(not x["loadable"] for x in d["delegates"])  # no GPU delegate library on this machine


@pytest.mark.parametrize("versions, machine, text", [
    ({"numpy": "2.1.0", "tflite-runtime": "2.14.0", "ai-edge-litert": None}, "aarch64", "numpy 1"),
    ({"numpy": "2.1.0", "keras": "3.6.0", "tensorflow-model-optimization": "0.8.0", "tf-keras": None,
      "ai-edge-litert": "1.2.0"}, "x86_64", "tf_keras"),
    ({"numpy": "1.26.4", "ai-edge-litert": None, "tflite-runtime": None}, "armv7l", "32-bit ARM"),
])
def test_known_bad_combinations_are_named_with_a_fix(versions, machine, text):
    found = problems(versions, machine)
    assert found and any(text in p["problem"] for p in found) and all(p["fix"] for p in found)


def test_a_32bit_pi_with_tflite_runtime_on_numpy_1_is_fine():
    assert problems({"numpy": "1.26.4", "ai-edge-litert": None, "tflite-runtime": "2.14.0"}, "armv7l") == []


@pytest.mark.parametrize("machine, python, words", [
    ("armv7l", (3, 11), 'pip install "edgekit[tflite]"'),
    ("armv7l", (3, 13), "no TFLite wheel exists for Python 3.13 on 32-bit ARM"),
    ("aarch64", (3, 13), "pip install ai-edge-litert"),
    ("aarch64", (3, 15), "no wheels for Python 3.15 yet"),
])
def test_install_advice_follows_the_wheels_that_exist(machine, python, words):
    from edgekit.runtime.backend import install_advice

    assert words in install_advice(machine, python)


def test_target_hints_end_with_the_cpu_and_explain_themselves():
    for target in ("cpu", "gpu", "nnapi", "npu"):
        hints = hints_for(target, "int8")
        assert hints[-1]["accelerator"] == "cpu" and all(h["reason"] for h in hints)
    assert hints_for("gpu", "float16")[0]["accelerator"] == "gpu"
    assert "deprecated" in hints_for("nnapi", "int8")[0]["reason"]
    with pytest.raises(UsageError):
        hints_for("tpu", "int8")


def test_gpu_target_stores_hints_and_the_runtime_falls_back_with_a_reason(tmp_path, digits_keras, digits_dir):
    out = tmp_path / "gpu.tflite"
    result = run_cli("convert", digits_keras, "--target", "gpu", "--calib", digits_dir / "train",
                     "--calib-samples", "50", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "float16" in result.stdout  # the mode the GPU target chose: a line of the result
    model = Model(out)
    meta = model.metadata
    assert meta["mode"] == "float16" and [h["accelerator"] for h in meta["delegates"]] == ["gpu", "cpu"]
    assert model.delegate.accelerator == "cpu"
    assert model.delegate.fallbacks[0]["accelerator"] == "gpu"
    assert "no gpu delegate library found" in model.delegate.fallbacks[0]["reason"]
    assert Model(out, delegate="cpu").delegate.fallbacks == []


def test_nnapi_target_warns_that_nnapi_is_deprecated(tmp_path, digits_keras, digits_dir):
    result = run_cli("convert", digits_keras, "--int8", "--target", "nnapi", "--calib", digits_dir / "train",
                     "--calib-samples", "50", "-o", tmp_path / "n.tflite")
    assert result.returncode == 0, result.stderr
    assert "deprecated since Android 15" in result.stderr


def test_a_delegate_library_that_does_not_load_falls_back_to_cpu(tmp_path, converted):
    fake = tmp_path / "libfake_delegate.so"
    fake.write_bytes(b"not an ELF file")
    model = Model(converted("float32"), delegate=str(fake))
    assert model.delegate.accelerator == "cpu"
    assert "did not load" in model.delegate.fallbacks[0]["reason"]
