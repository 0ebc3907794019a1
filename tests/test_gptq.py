"""`--calib-method gptq` (converters/int8/gptq.py, converters/int8/weight_rounding.py): GPTQ-rounded kernels that
TFLite's quantizer keeps exactly, on the digits CNN through the real conversion."""

from __future__ import annotations

import numpy as np
import pytest

import edgekit
from edgekit.contracts import validate
from edgekit.converters.int8 import weight_rounding
from edgekit.runtime import ImageFolder, Model, read_image


def _top1(path, images: np.ndarray) -> np.ndarray:
    return np.asarray(Model(path).predict(images)).argmax(axis=1)


@pytest.fixture(scope="module")
def gptq(digits_keras, digits_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gptq")
    return edgekit.convert(digits_keras, mode="int8", calib=digits_dir / "train", output=out / "gptq.tflite",
                           calibration=edgekit.CalibrationSpec(method="gptq"))


def test_gptq_kernels_are_the_files_and_agree_with_the_float_model_as_min_max_does(gptq, converted, digits_dir):
    """The file holds GPTQ's int8 kernels exactly (the four convolutions and the dense layer), other kernels than
    min/max's nearest rounding; its top-1 agreement with the float model on the 360 test digits is at least
    min/max's less one sample (measured: both 360/360; on a MobileNetV2 0.35 of these digits gptq 360, min/max 357)."""
    meta = gptq.metadata
    validate(meta, "edgekit.metadata/1")
    r = meta["calibration"]["range_setting"]
    assert r["requested"] == r["chosen"] == "gptq"
    ours, plain = (weight_rounding.int8_kernels(p.read_bytes()) for p in (gptq.path, converted("int8")))
    assert set(ours) == set(plain) and len(ours) == 5
    assert r["weight_rounding"] == {"method": "gptq", "on": "minmax", "layers": 5, "differ": []}
    assert any(not np.array_equal(ours[k], plain[k]) for k in ours)  # GPTQ moved some roundings
    for k in ours:  # TFLite's grid: each output channel's largest weight at +-127, scales unchanged
        axis = 3 if ours[k].shape[0] == 1 else 0
        assert (np.abs(np.moveaxis(ours[k].astype(int), axis, 0)).reshape(ours[k].shape[axis], -1).max(1) == 127).all()
    folder = ImageFolder.scan(digits_dir / "test")
    images = np.stack([read_image(f) for f in folder.files])[..., None].astype(np.float32)
    reference = _top1(converted("float32"), images)
    agree = {name: int((_top1(path, images) == reference).sum())
             for name, path in (("gptq", gptq.path), ("minmax", converted("int8")))}
    print(f"agreement with the float model on {len(images)} test digits: {agree}")
    assert len(images) == 360 and agree["gptq"] >= agree["minmax"] - 1


def test_ops_the_budget_autopilot_keeps_in_float_take_their_float_kernels_not_gptqs(digits_keras, digits_dir):
    """A GPTQ basis holds rounded kernels (q * scale in float32); a `--max-drop` mix built on it gives the ops it
    keeps in float their float kernels (`RangeChoice.float_kernels`), and the int8 ops GPTQ's q."""
    import keras
    import tensorflow as tf

    from edgekit.converters.autopilot import _search
    from edgekit.converters.calibration import load_calibration
    from edgekit.converters.int8 import ranges
    from edgekit.converters.quantize import configure
    from edgekit.runtime.preprocess import PreprocessSpec
    from edgekit.runtime.schema import with_tensor_data

    calib = load_calibration(digits_dir / "train", input_shape=(None, 8, 8, 1),
                             spec=PreprocessSpec(height=8, width=8, channels=1), samples=64)
    converter = configure(tf.lite.TFLiteConverter.from_keras_model(keras.saving.load_model(digits_keras)), "int8",
                          "float32", calib.representative_dataset)
    calibrated = ranges.calibrated_model(converter)
    samples = list(calib.representative_dataset())
    rounded, qs = weight_rounding.gptq_weights(calibrated, samples)
    basis = with_tensor_data(calibrated, rounded)
    layers = weight_rounding.layers_of(calibrated)
    floated, kept = layers[1], layers[2]  # the second convolution in float, the third in int8
    search = _search(converter, calib.representative_dataset, lambda _t: (0.0, 1.0), basis, float_kernels=calibrated)
    mix = search.build((floated.out_name,))
    assert weight_rounding.int8_kernels(mix)[kept.out_name].astype(int).tolist() == qs[kept.out_name].tolist()
    assert floated.out_name not in weight_rounding.int8_kernels(mix)  # in float
    float_kernels = {layer.out_name: layer.w for layer in weight_rounding.layers_of(ranges.calibrated_model(converter))}
    in_mix = {layer.out_name: layer.w for layer in weight_rounding.layers_of(mix)}
    assert np.array_equal(in_mix[floated.out_name], float_kernels[floated.out_name])
    assert not np.array_equal(in_mix[floated.out_name], rounded[floated.weight])  # not GPTQ's rounding
    without = _search(converter, calib.representative_dataset, lambda _t: (0.0, 1.0), basis).build((floated.out_name,))
    assert np.array_equal({layer.out_name: layer.w for layer in weight_rounding.layers_of(without)}[floated.out_name],
                          rounded[floated.weight])  # what a mix kept before


def test_gptq_on_a_model_whose_dense_layers_are_its_outputs(face_like, digits_dir, tmp_path):
    """TFLite's quantizer renames a graph output ('...:0' becomes '...:01'): the three-head model's box and
    landmark Dense layers are outputs, and the exactness check still finds GPTQ's kernels in the file (it
    matched by name once, named them as differing, and wrote their names as bytes into the metadata: a
    conversion that crashed); auto escalating to GPTQ on outputs that are not class scores (asked for:
    `effort` thorough; by default their small loss leaves weight rounding nothing to pay for) writes a file
    whose metadata validates."""
    for method in ("gptq", "auto"):
        result = edgekit.convert(face_like[0], mode="int8", calib=digits_dir / "train",
                                 output=tmp_path / f"{method}.tflite",
                                 calibration=edgekit.CalibrationSpec(method=method, effort="thorough"))
        validate(result.metadata, "edgekit.metadata/1")
        r = result.metadata["calibration"]["range_setting"]
        if method == "gptq" or r["chosen"] == "gptq":
            assert r["weight_rounding"]["layers"] == 5 and r["weight_rounding"]["differ"] == []
        if method == "auto":
            assert r["escalation"]["ran"] and r["loss"] == "mse"  # the first output is a box: no class scores
