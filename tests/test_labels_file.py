"""`--labels FILE` (`info.labels`): class names for calibration data without class folders reach edgekit's
metadata and the standard TFLite Metadata's labels file exactly as class folders' names do; a file that does
not fit the model, or class folders that name a class otherwise, are one-line errors with typed exit codes,
and nothing is written."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import edgekit
from edgekit.cli import main
from edgekit.converters.recipe import ConvertRecipe, ModelInfo
from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime import ImageFolder, Model, read_image
from edgekit.runtime.inspect import inspect_file
from edgekit.runtime.tflite_metadata import associated_files
from tests.helpers import run_cli

NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def convert(*args):
    result = CliRunner().invoke(main, ["convert", *map(str, args)])
    return result, [line for line in result.stderr.splitlines() if line.strip()]


def _classifier(path, classes: int):
    """A small image classifier (8x8 grayscale, raw pixels in), pooled: its batch stays open."""
    import keras

    keras.utils.set_random_seed(7)
    x = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Rescaling(1 / 255.0)(x)
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    keras.Model(x, keras.layers.Dense(classes, activation="softmax", name="probs")(h)).save(path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory, digits_dir):
    """(folder, a 10-class model, a .npy of real digit images with no class names, a labels file)."""
    folder = tmp_path_factory.mktemp("labels")
    found = ImageFolder.scan(digits_dir / "train").sample(60, 0)
    np.save(folder / "digits.npy", np.stack([read_image(f) for f in found.files])[..., None])
    (folder / "labels.txt").write_text("\n".join(NAMES) + "\n")
    return folder, _classifier(folder / "ten.keras", 10), folder / "digits.npy", folder / "labels.txt"


def test_a_labels_file_names_the_classes_of_npy_calibration_in_both_metadata(setup, tmp_path):
    folder, model, calib, labels = setup
    out = tmp_path / "ten.tflite"
    result, lines = convert(model, "--int8", "--calib", calib, "--labels", labels, "-o", out)
    assert result.exit_code == 0, lines
    converted = Model(out)
    assert converted.metadata["labels"] == list(NAMES) and converted.labels == NAMES
    files = associated_files(out.read_bytes(), {"labels.txt"})
    assert files["labels.txt"].decode().splitlines() == list(NAMES)
    standard = inspect_file(out)["metadata"]["tflite"]["outputs"][0]
    assert standard["files"] == [{"name": "labels.txt", "type": "TENSOR_AXIS_LABELS", "lines": 10}]
    assert converted.metadata["recipe"]["info"]["labels"] == str(labels)


def test_without_a_labels_file_npy_calibration_stores_no_class_names(setup, tmp_path):
    _, model, calib, _ = setup
    result, lines = convert(model, "--calib", calib, "-o", tmp_path / "plain.tflite")
    assert result.exit_code == 0, lines
    assert Model(tmp_path / "plain.tflite").metadata["labels"] == []


def test_names_from_python_are_stored_as_a_file_is(setup, tmp_path):
    _, model, _, _ = setup
    out = tmp_path / "api.tflite"
    result = edgekit.convert(model, output=out, info=ModelInfo(labels=list(NAMES)))
    assert result.metadata["labels"] == list(NAMES) and Model(out).labels == NAMES
    recipe = ConvertRecipe.from_dict({**result.metadata["recipe"], "model": str(model)})
    assert recipe.info.labels == NAMES  # the stored recipe rebuilds with its names


def test_a_labels_file_of_another_count_is_exit_6_and_writes_nothing(setup, tmp_path):
    _, model, calib, _ = setup
    nine = tmp_path / "nine.txt"
    nine.write_text("\n".join(NAMES[:9]))
    result, lines = convert(model, "--calib", calib, "--labels", nine, "-o", tmp_path / "x.tflite")
    assert result.exit_code == 6 and len(lines) == 1, lines
    assert lines[0] == (f"edgekit: error: --labels: {nine}: 9 class names, but the model gives 10 (probs) scores "
                        "per sample: one name per class, one per line")
    assert not (tmp_path / "x.tflite").exists()


@pytest.mark.parametrize("content, says", [
    (b"cat\n\ndog\n", "line 2 is blank"),
    (b"", "is empty"),
    (b"\xff\xfe c\x00a\x00t\x00", "not UTF-8 text"),
    (b"cat\x00\ndog\n", "binary data"),
    (b"cat\n" + b"x" * 1025 + b"\n", "class name 2 longer than 1024 characters"),
    (b"c\ta t\n", "class name 1 holds a control character"),
], ids=["blank line", "empty", "utf-16", "nul", "long name", "tab"])
def test_a_labels_file_that_is_not_one_name_per_line_is_refused_before_tensorflow(setup, tmp_path, content, says):
    _, model, _, _ = setup
    bad = tmp_path / "labels.txt"
    bad.write_bytes(content)
    result = run_cli("convert", model, "--labels", bad, "-o", tmp_path / "x.tflite")
    assert result.returncode == 6 and result.error_lines == [f"edgekit: error: --labels: {bad}: {says}"
                                                             + ("; a labels file has one class name per line"
                                                                if "class name " not in says else "")], result.stderr
    assert result.imports == [] and result.modules == [], result.import_sites  # not even tried
    assert not (tmp_path / "x.tflite").exists()


def test_a_labels_path_that_is_no_file_is_exit_6(setup, tmp_path):
    _, model, _, _ = setup
    for path, says in ((tmp_path, "is a folder, not a regular file"), (tmp_path / "missing.txt", "no such file")):
        result, lines = convert(model, "--labels", path, "-o", tmp_path / "x.tflite")
        assert result.exit_code == 6 and lines == [f"edgekit: error: --labels: {path}: {says}; a labels file has "
                                                   "one class name per line"], lines


def test_names_from_python_are_checked_on_construction():
    with pytest.raises(UsageError, match=r"info.labels: class names are non-empty one-line strings, got 'a\\nb'"):
        ModelInfo(labels=["cat", "a\nb"])
    with pytest.raises(UsageError, match="info.labels: is a labels file or a list of class names"):
        ModelInfo(labels=[])
    assert ModelInfo(labels=(" cat ", "dog")).labels == ("cat", "dog")
    with pytest.raises(InputShapeError, match="class name 1 holds a control character"):
        from edgekit.converters.labels import class_names

        class_names(("a\tb",))


@pytest.fixture(scope="module")
def pets(tmp_path_factory, digits_dir):
    """Class folders with names (cat, dog: real digit images of 0 and 1) and a two-class model."""
    root = tmp_path_factory.mktemp("pets")
    for name, digit in (("cat", "0"), ("dog", "1")):
        (root / "data" / name).mkdir(parents=True)
        for f in sorted((digits_dir / "train" / digit).iterdir())[:15]:
            shutil.copy(f, root / "data" / name / f.name)
    return root / "data", _classifier(root / "two.keras", 2)


def test_class_folders_that_name_a_class_otherwise_are_exit_2(pets, tmp_path):
    data, model = pets
    swapped = tmp_path / "labels.txt"
    swapped.write_text("dog\ncat\n")
    result, lines = convert(model, "--int8", "--calib", data, "--labels", swapped, "-o", tmp_path / "x.tflite")
    assert result.exit_code == 2 and lines == [
        f"edgekit: error: --calib: the class folders of {data} (2) and --labels (2 names) disagree at class 0: folder "
        "'cat', label 'dog'; give the names in the folders' sorted order, or leave --labels out to use the folder "
        "names"], lines
    assert not (tmp_path / "x.tflite").exists()


def test_class_folders_that_agree_with_the_labels_file_convert(pets, tmp_path):
    data, model = pets
    same = tmp_path / "labels.txt"
    same.write_text("cat\ndog\n")
    result, lines = convert(model, "--calib", data, "--labels", same, "-o", tmp_path / "x.tflite")
    assert result.exit_code == 0, lines
    assert Model(tmp_path / "x.tflite").labels == ("cat", "dog")


def test_numbered_class_folders_are_named_by_the_labels_file(setup, digits_dir, tmp_path):
    _, model, _, labels = setup
    result, lines = convert(model, "--calib", digits_dir / "train", "--calib-samples", "40", "--labels", labels,
                            "-o", tmp_path / "x.tflite")
    assert result.exit_code == 0, lines
    assert Model(tmp_path / "x.tflite").labels == NAMES  # folders 0..9 are the indices the names name
