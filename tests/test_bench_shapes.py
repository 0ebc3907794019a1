"""`edgekit bench` on every model shape: samples from a .npz (keys: input names), per-output error and SNR
against the float model for each output matched by name, `--output` picking the scored head. The models
are built (and trained where it matters) here; tolerances are those of tests/test_shapes.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import edgekit
from edgekit.contracts import validate
from edgekit.runtime import ImageFolder, read_image
from helpers import run_cli

HEADS = ["box", "landmarks", "score"]


def images(folder):
    found = ImageFolder.scan(folder)
    return np.stack([read_image(f) for f in found.files])[..., None], found


@pytest.fixture(scope="module")
def face(tmp_path_factory, digits_dir, face_like):
    """The three-head model of conftest's `face_like`, converted to int8 with the Python API. Returns the
    folder with face.keras, face.int8.tflite and faces.npz (uint8 held-out images `face`, labels `y`)."""
    import shutil

    out = tmp_path_factory.mktemp("bench_face")
    shutil.copy(face_like[0], out / "face.keras")
    edgekit.convert(out / "face.keras", mode="int8", calib=digits_dir / "train", output=out / "face.int8.tflite")
    test, found = images(digits_dir / "test")
    labels = np.asarray([int(found.classes[i]) % 2 for i in found.labels])
    np.savez(out / "faces.npz", face=test, y=labels)  # uint8: through the stored preprocessing
    return out


def bench_json(*args, block_tf=False):
    r = run_cli("bench", *args, "--runs", "5", "--warmup", "1", "--json", "-", block_tf=block_tf)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def face_report(face):
    return bench_json(face / "face.int8.tflite", "--reference", face / "face.keras", "--data", face / "faces.npz")


def test_every_output_gets_its_error_and_snr_against_the_float_model(face_report):
    acc = face_report["models"][0]["accuracy"]
    outputs = acc["outputs"]
    assert list(outputs) == HEADS  # by name, in the source model's order
    for name, o in outputs.items():
        assert 0 <= o["mean_abs_error"] <= o["max_abs_error"] and o["snr_db"] > 10, (name, o)
    print("\n" + json.dumps(outputs, indent=None))
    assert outputs["score"]["role"] == "scores" and outputs["score"]["agreement"] >= 0.99
    assert outputs["box"]["role"] == "values" and outputs["box"]["agreement"] is None
    assert outputs["box"]["mean_abs_error"] <= 0.02
    assert outputs["landmarks"]["agreement"] is None


def test_the_first_class_score_output_is_scored_by_default_with_labels_from_y(face_report):
    acc = face_report["models"][0]["accuracy"]
    assert acc["output"] == "score" and acc["samples"] == 360
    assert acc["agreement"] == acc["outputs"]["score"]["agreement"]
    assert acc["snr_db"] == acc["outputs"]["score"]["snr_db"]
    assert acc["top1"] >= 0.9 and face_report["reference"]["top1"] >= 0.9
    assert acc["top1_delta_points"] == pytest.approx(100 * (acc["top1"] - acc["reference_top1"]))
    assert set(acc["per_class_top1"]) == {"0", "1"}
    assert face_report["data"]["format"] == "npz" and face_report["data"]["labelled"] is True
    assert face_report["data"]["classes"] == 2 and face_report["models"][0]["preprocessing"] == "metadata"


def test_the_report_follows_the_bench_contract(face_report):
    validate(face_report)


def test_output_picks_the_head_shown_in_the_main_columns(face):
    report = bench_json(face / "face.int8.tflite", "--reference", face / "face.keras", "--data",
                        face / "faces.npz", "--output", "score")
    acc = report["models"][0]["accuracy"]
    assert acc["output"] == "score" and acc["agreement"] == acc["outputs"]["score"]["agreement"] >= 0.99
    assert acc["max_abs_error"] == acc["outputs"]["score"]["max_abs_error"]
    validate(report)


def test_the_table_has_a_line_per_output(face):
    r = run_cli("bench", face / "face.int8.tflite", "--reference", face / "face.keras", "--data",
                face / "faces.npz", "--runs", "5")
    assert r.returncode == 0, r.stderr
    assert "(360 samples, 2 classes)" in r.stdout
    lines = r.stdout.splitlines()
    per = [line for line in lines if line.lstrip(" *").split(" ")[0] in HEADS]
    assert len(per) == 3 and "* score" in per[2] and "SNR" in per[0], r.stdout


def test_an_unknown_output_is_exit_2_naming_the_outputs(face):
    r = run_cli("bench", face / "face.int8.tflite", "--data", face / "faces.npz", "--output", "nope",
                "--runs", "5", block_tf=True)
    assert r.returncode == 2 and len(r.error_lines) == 1, r.stderr
    assert "nope" in r.stderr and "box, landmarks, score" in r.stderr


def test_npz_data_needs_no_tensorflow_and_top1_needs_labels(face, tmp_path):
    with np.load(face / "faces.npz") as z:
        np.savez(tmp_path / "x_only.npz", x=z["face"])
    report = bench_json(face / "face.int8.tflite", "--data", tmp_path / "x_only.npz", block_tf=True)
    acc = report["models"][0]["accuracy"]
    assert acc["top1"] is None and acc["per_class_top1"] == {} and acc["output"] == "score"
    assert report["data"]["labelled"] is False and "outputs" not in acc
    validate(report)


@pytest.fixture(scope="module")
def two_in(tmp_path_factory, digits_dir):
    """An image and a 4-vector in, 10 class scores out (test_shapes.py's `two_inputs`), int8, and a .npz
    keyed by the input names: uint8 images and float vectors."""
    import keras

    keras.utils.set_random_seed(5)
    img = keras.Input((8, 8, 1), name="image")
    meta = keras.Input((4,), name="meta")
    h = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Rescaling(1 / 255.0)(img)), meta])
    out = keras.layers.Dense(10, activation="softmax", name="probs")(keras.layers.Dense(16, activation="relu")(h))
    folder = tmp_path_factory.mktemp("bench_two_in")
    keras.Model([img, meta], out).save(folder / "two_in.keras")
    x, found = images(digits_dir / "train")
    rng = np.random.default_rng(0)
    edgekit.convert(folder / "two_in.keras", mode="int8", output=folder / "two_in.int8.tflite",
                    calib={"image": x[:200], "meta": rng.normal(size=(200, 4)).astype(np.float32)})
    test, _ = images(digits_dir / "test")
    np.savez(folder / "both.npz", image=test[:64], meta=rng.normal(size=(64, 4)).astype(np.float32))
    return folder


def test_two_inputs_are_fed_from_an_npz_keyed_by_input_names(two_in):
    report = bench_json(two_in / "two_in.int8.tflite", "--reference", two_in / "two_in.keras",
                        "--data", two_in / "both.npz")
    validate(report)
    acc = report["models"][0]["accuracy"]
    assert acc["samples"] == 64 and acc["top1"] is None and report["reference"]["top1"] is None
    assert list(acc["outputs"]) == ["probs"] and acc["output"] == "probs"
    assert acc["outputs"]["probs"]["agreement"] >= 0.9 and acc["agreement"] == acc["outputs"]["probs"]["agreement"]
    assert acc["snr_db"] > 15


def test_a_missing_input_in_the_npz_is_exit_6_naming_it(two_in, tmp_path):
    with np.load(two_in / "both.npz") as z:
        np.savez(tmp_path / "image_only.npz", image=z["image"])
    r = run_cli("bench", two_in / "two_in.int8.tflite", "--data", tmp_path / "image_only.npz", "--runs", "5",
                block_tf=True)
    assert r.returncode == 6 and "--data: " in r.stderr and "missing meta" in r.stderr and len(r.error_lines) == 1, \
        r.stderr
