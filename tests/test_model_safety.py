"""Keras model files are read as data first: code-bearing configs are refused before Keras loads them."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from edgekit.converters.model_safety import check_config, read_archive_config
from edgekit.errors import ModelFormatError, UnsafeModelError

PROBE = """
import sys
from edgekit.converters.loading import load_model
from edgekit.errors import EdgekitError
try:
    load_model(sys.argv[1], trust=len(sys.argv) > 2)
    print("LOADED")
except EdgekitError as e:
    print(type(e).__name__, e)
print("keras imported:", "keras" in sys.modules)
"""


def _edited(src, dst, edit):
    """Copy a .keras archive with its config.json changed by `edit`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config).encode()
            zout.writestr(item.filename, data)
    return dst


def _probe(path, *extra):
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), *extra], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _first_conv(config):
    return next(layer for layer in config["config"]["layers"] if layer["class_name"] == "Conv2D")


def test_a_config_naming_the_os_module_is_refused_before_keras_loads(tmp_path, digits_keras):
    canary = tmp_path / "canary"

    def edit(config):
        _first_conv(config)["config"]["activation"] = {
            "module": "os", "class_name": "function", "config": "system", "registered_name": "function",
            "args": [f"touch {canary}"]}

    evil = _edited(digits_keras, tmp_path / "evil.keras", edit)
    out = _probe(evil, "--trust")  # even a trusted model may not name os
    assert "UnsafeModelError" in out and "os.function" in out
    assert "keras imported: False" in out
    assert not canary.exists()


def test_a_config_declaring_far_more_weights_than_the_archive_holds_is_refused_before_keras(tmp_path,
                                                                                           digits_keras):
    """A Dense of 2e9 units would make Keras allocate ~1 TB before reading a single weight."""
    def edit(config):
        next(layer for layer in config["config"]["layers"] if layer["class_name"] == "Dense")["config"]["units"] = \
            2_000_000_000

    out = _probe(_edited(digits_keras, tmp_path / "huge.keras", edit))
    assert "ModelFormatError" in out and "declares about" in out and "damaged or crafted" in out
    assert "keras imported: False" in out


def test_builtins_exec_is_refused(tmp_path, digits_keras):
    def edit(config):
        _first_conv(config)["config"]["kernel_initializer"] = {
            "module": "builtins", "class_name": "function", "config": "exec", "registered_name": "function"}

    out = _probe(_edited(digits_keras, tmp_path / "exec.keras", edit))
    assert "UnsafeModelError" in out and "keras imported: False" in out


def test_a_lambda_in_a_keras_archive_is_refused_before_keras_loads(tmp_path, digits_keras):
    def edit(config):
        conv = _first_conv(config)
        conv["class_name"], conv["module"] = "Lambda", "keras.layers"
        conv["config"] = {"name": "sneaky", "function": {"class_name": "__lambda__", "config": {"code": "abc"}}}

    out = _probe(_edited(digits_keras, tmp_path / "lambda.keras", edit))
    assert "UnsafeModelError" in out and "sneaky" in out and "keras imported: False" in out


def test_foreign_modules_need_trust_model(tmp_path, digits_keras):
    def edit(config):
        _first_conv(config)["module"] = "my_company.layers"

    custom = _edited(digits_keras, tmp_path / "custom.keras", edit)
    out = _probe(custom)
    assert "UnsafeModelError" in out and "set trust_model if you wrote it" in out
    trusted = _probe(custom, "--trust")
    assert "UnsafeModelError" not in trusted  # past our check; Keras itself decides (and cannot find it)


def test_zip_bombs_are_refused_without_unpacking(tmp_path):
    bomb = tmp_path / "bomb.keras"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("model.weights.h5", b"\0" * (64 * 1024**2))
    with pytest.raises(UnsafeModelError, match="zip bomb"):
        read_archive_config(bomb)


def test_archives_without_a_config_are_not_keras_models(tmp_path):
    other = tmp_path / "photos.keras"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("a.txt", "hello")
    with pytest.raises(ModelFormatError, match="no config.json"):
        read_archive_config(other)


def test_keras_own_objects_pass():
    check_config({"module": "keras.layers", "class_name": "Dense",
                  "config": {"activation": {"module": "keras.activations", "class_name": "function",
                                            "config": "relu", "registered_name": "function"}}}, "m")


def test_keras_resolves_a_dotted_class_name_under_module_keras_to_lambda():
    """The premise of the next test: Keras looks up module + "." + class_name in its API."""
    from keras.src.saving import serialization_lib

    found = serialization_lib._retrieve_class_or_fn("layers.Lambda", None, "keras", "class", full_config={})
    assert found.__name__ == "Lambda"


@pytest.mark.parametrize("class_name, module, registered", [("layers.Lambda", "keras", None),
                                                            ("Lambda", "keras.src.layers", None),
                                                            ("Dense", "keras.layers", "keras>Lambda"),
                                                            ("core.lambda_layer.Lambda", "keras.src.layers", None)])
def test_a_lambda_under_any_name_keras_resolves_is_refused(tmp_path, digits_keras, class_name, module, registered):
    def edit(config):
        conv = _first_conv(config)
        conv["class_name"], conv["module"] = class_name, module
        if registered:
            conv["registered_name"] = registered
        conv["config"] = {"name": "sneaky", "function": {"class_name": "__lambda__", "config": {"code": "abc"}}}

    out = _probe(_edited(digits_keras, tmp_path / "lambda.keras", edit))
    assert "UnsafeModelError" in out and "Lambda layer" in out and "keras imported: False" in out


def test_an_archive_with_two_config_members_is_refused(tmp_path, digits_keras):
    """Keras reads the last config.json of the zip's directory, a naive check the first: a clean first one
    must not vouch for a Lambda in the second."""
    evil = _edited(digits_keras, tmp_path / "evil.keras",
                   lambda c: _first_conv(c).update(class_name="Lambda", module="keras.layers"))
    two = tmp_path / "two.keras"
    with zipfile.ZipFile(digits_keras) as clean, zipfile.ZipFile(evil) as bad, zipfile.ZipFile(two, "w") as out:
        for item in clean.infolist():
            out.writestr(item.filename, clean.read(item))
        with pytest.warns(UserWarning, match="Duplicate name"):
            out.writestr("config.json", bad.read("config.json"))
    with pytest.raises(UnsafeModelError, match="config.json more than once"):
        read_archive_config(two)
    out = _probe(two)
    assert "UnsafeModelError" in out and "keras imported: False" in out


@pytest.mark.parametrize("depth", [300, 100_000])
def test_a_config_nested_past_the_limit_is_one_line(tmp_path, digits_keras, depth):
    deep = tmp_path / "deep.keras"
    with zipfile.ZipFile(digits_keras) as clean, zipfile.ZipFile(deep, "w") as out:
        for item in clean.infolist():
            data = clean.read(item)
            if item.filename == "config.json":
                data = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
            out.writestr(item.filename, data)
    with pytest.raises(ModelFormatError, match="nested deeper than 256"):
        read_archive_config(deep)
