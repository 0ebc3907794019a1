"""A model is what its bytes say, not its name (RULINGS 47, runtime/model_kind.py): bytes that are no model are
refused before TensorFlow loads, in one line with exit 3 and in edgekit's words; a real model with an unusual
extension converts as what it is."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from edgekit.errors import ModelFormatError
from edgekit.runtime.model_kind import model_kind
from helpers import run_cli


def _png() -> bytes:
    import cv2

    return cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1].tobytes()


NOT_MODELS = {  # file name -> (its bytes, what the refusal says they are)
    "model.keras": (b"just some notes\n", "it holds text"),
    "model.h5": (_png(), "it holds a PNG image"),
    "weights.hdf5": (b"", "the file is empty"),
    "model.model": (b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'", "it holds a numpy .npy array"),
}


@pytest.mark.parametrize("name", sorted(NOT_MODELS))
def test_bytes_that_are_no_model_are_refused_before_tensorflow_loads(tmp_path, name):
    data, said = NOT_MODELS[name]
    (tmp_path / name).write_bytes(data)
    result = run_cli("convert", str(tmp_path / name), "--output", str(tmp_path / "out.tflite"))
    assert result.returncode == 3, result.stderr
    assert result.error_lines == [f"edgekit: error: {tmp_path / name}: not a Keras model (.keras, .h5) or a "
                                  f"SavedModel folder ({said})"]
    assert result.finished and not [m for m in result.modules if m.split(".")[0] in ("tensorflow", "keras")]
    assert not (tmp_path / "out.tflite").exists()


def test_sweep_refuses_bytes_that_are_no_model_once(tmp_path, digits_dir):
    """Not once per variant ("no variant could be built: ...; ...; ..."): one line, before any variant."""
    (tmp_path / "model.h5").write_bytes(_png())
    result = run_cli("sweep", str(tmp_path / "model.h5"), "--calib", str(digits_dir / "train"),
                     "--eval-data", str(digits_dir / "test"))
    assert result.returncode == 3
    assert [line for line in result.error_lines if line.startswith("edgekit: error:")] == [
        f"edgekit: error: {tmp_path / 'model.h5'}: not a Keras model (.keras, .h5) or a SavedModel folder (it holds "
        "a PNG image)"]
    assert not [m for m in result.modules if m.split(".")[0] in ("tensorflow", "keras")]


def test_the_api_refuses_before_importing_tensorflow(tmp_path):
    """The API path, in a fresh interpreter: the refusal comes from the sniff, TensorFlow never imported."""
    import subprocess
    import sys

    (tmp_path / "model.h5").write_bytes(_png())
    code = ("import sys, edgekit\n"
            "try:\n    edgekit.convert(sys.argv[1], output=sys.argv[2])\n"
            "except edgekit.ModelFormatError as e:\n    print(e.exit_code, 'tensorflow' in sys.modules, e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model.h5"), str(tmp_path / "o.tflite")],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("3 False "), done.stdout + done.stderr
    assert "(it holds a PNG image)" in done.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A two-layer Keras model saved as .keras and as .h5, and its output on one input."""
    import keras

    folder = tmp_path_factory.mktemp("kinds")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    model.save(folder / "tiny.keras")
    model.save(folder / "tiny.h5")
    x = np.linspace(-1, 1, 8, dtype=np.float32)[None]
    return folder, x, np.asarray(model(x))


@pytest.mark.parametrize("saved, renamed", [
    ("tiny.keras", "tiny.model"), ("tiny.keras", "tiny.zip"), ("tiny.h5", "tiny.hdf5"),
    ("tiny.keras", "swapped.h5"), ("tiny.h5", "swapped.keras"),  # each named as the other kind
    ("tiny.keras", "TINY.KERAS"),  # Keras compares extensions case and all
])
def test_a_real_model_with_an_unusual_extension_converts(tiny, tmp_path, saved, renamed):
    import edgekit
    from edgekit.runtime import Model

    folder, x, expected = tiny
    shutil.copyfile(folder / saved, tmp_path / renamed)
    result = edgekit.convert(tmp_path / renamed, output=tmp_path / "out.tflite")
    assert model_kind(tmp_path / renamed) == ("keras" if saved.endswith(".keras") else "h5")
    assert result.metadata["source"]["file"] == renamed
    np.testing.assert_allclose(Model(result.path, probe=False).predict(x), expected, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([renamed, "out.tflite"])  # nothing left beside


def test_a_tflite_given_to_convert_is_named_as_one(tiny, tmp_path):
    import edgekit

    model = tmp_path / "model.keras"
    edgekit.convert(tiny[0] / "tiny.keras", output=model)  # a .tflite under a Keras name
    result = run_cli("convert", str(model), "--output", str(tmp_path / "out.tflite"))
    assert result.returncode == 3
    assert result.error_lines == [f"edgekit: error: {model}: already a TFLite model; convert takes a Keras model "
                                  "(.keras, .h5) or a SavedModel folder, and bench, inspect and run take this file as it is"]
    assert not [m for m in result.modules if m.split(".")[0] in ("tensorflow", "keras")]


def test_a_keras_error_names_the_users_file_not_the_link(tmp_path):
    """A damaged archive under an unusual name: Keras reads it through a link named `.keras`, and the message
    names the file the user gave."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "broken.model", "w") as z:
        z.writestr("config.json", '{"class_name": "Sequential", "config": {"layers": 7}}')
    with pytest.raises(ModelFormatError) as caught:
        import edgekit

        edgekit.convert(tmp_path / "broken.model", output=tmp_path / "o.tflite")
    assert str(tmp_path / "broken.model") in str(caught.value)
    assert "edgekit-model-" not in str(caught.value)
