"""The edgekit metadata entry: written by the converter, read by the runtime without TensorFlow."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from edgekit.errors import ModelFormatError
from edgekit.runtime import Model, read_edgekit_metadata, read_metadata_entries


def test_converted_model_carries_preprocessing_labels_mode_and_source_hash(converted, digits_keras):
    meta = Model(converted("int8")).metadata
    assert meta["schema"] == "edgekit.metadata/1"
    assert meta["mode"] == "int8" and meta["io"] == "float32"
    assert meta["preprocessing"] == {"height": 8, "width": 8, "channels": 1, "resize": "stretch",
                                     "mean": [0.0], "std": [1.0], "color": "GRAY", "layout": "NHWC"}
    assert meta["labels"] == [str(d) for d in range(10)]
    assert meta["source"]["sha256"] == hashlib.sha256(digits_keras.read_bytes()).hexdigest()
    assert meta["source"]["format"] == "keras"
    assert {"edgekit", "tensorflow", "keras", "ai_edge_litert"} <= set(meta["tools"])
    assert meta["calibration"]["samples"] == 200
    v = meta["verification"]
    assert v["samples"] == 200 and v["top1_agreement"] >= 0.97 and v["snr_db"] > 15
    low, high = v["top1_agreement_interval"]  # Clopper-Pearson over the same 200 samples (issue 49)
    assert low <= v["top1_agreement"] <= high and high - low < 0.1
    assert v["verdict"].endswith(" at n=200") and f"{100 * v['top1_agreement']:.1f} %" in v["verdict"]
    from edgekit.report import verified_line

    agree, span = f"top-1 agreement {100 * v['top1_agreement']:.1f} %", f"{100 * low:.1f}-{100 * high:.1f} %"
    assert f"200 held-out samples: {agree} ({span} at 95 %)" in verified_line(v, False)  # `edgekit convert`
    assert f"{agree} (95 % interval {span}, n=200)" in verified_line(v, True)  # with -v


def test_int8_io_records_the_real_scales_and_zero_points(converted):
    model = Model(converted("int8", "int8"))
    meta = model.metadata
    assert meta["inputs"][0]["dtype"] == "int8"
    assert meta["inputs"][0]["scale"] == pytest.approx(model.inputs[0].scale)
    assert meta["inputs"][0]["zero_point"] == model.inputs[0].zero_point
    assert meta["outputs"][0]["dtype"] == "int8" and meta["outputs"][0]["scale"] > 0


def test_the_converters_own_metadata_entries_survive(converted):
    entries = read_metadata_entries(converted("float16").read_bytes())
    assert "min_runtime_version" in entries and "edgekit" in entries
    json.loads(entries["edgekit"])


def test_model_without_edgekit_entry_reads_as_none(converted):
    from edgekit.converters.metadata_writer import add_metadata

    data = converted("float32").read_bytes()
    assert read_edgekit_metadata(data) is not None
    replaced = add_metadata(data, {"labels": ["other"]})
    assert read_edgekit_metadata(replaced) == {"labels": ["other"]}
    assert list(read_metadata_entries(replaced)).count("edgekit") == 1


def test_metadata_does_not_change_what_the_model_computes(converted):
    from edgekit.converters.metadata_writer import add_metadata

    data = converted("int8").read_bytes()
    other = add_metadata(data, {"padding": "x" * 10_000})
    x = np.random.default_rng(0).uniform(0, 255, (5, 8, 8, 1)).astype(np.float32)
    np.testing.assert_array_equal(Model(data).predict(x), Model(other).predict(x))


@pytest.mark.parametrize("blob", [b"", b"hello world, not a model at all", b"\x00" * 4 + b"TFL3" + b"\xff" * 8])
def test_non_model_bytes_are_a_model_format_error(blob):
    with pytest.raises(ModelFormatError):
        Model(blob)


def test_truncated_model_is_a_model_format_error(converted):
    data = converted("float32").read_bytes()
    with pytest.raises(ModelFormatError):
        Model(data[: len(data) // 3])
