"""The edgekit metadata entry is checked on read (runtime/entry_check.py): its limits, its schema, and
what happens to a model whose entry is bad. `jsonschema` (the real validator) is the oracle for the
runtime's own small one; a generator per class of bad entry feeds both."""

from __future__ import annotations

import copy
import json
import math

import jsonschema
import numpy as np
import pytest

from conftest import ROOT
from edgekit.converters.metadata_writer import add_metadata
from edgekit.errors import ModelFormatError
from edgekit.runtime import Model, read_edgekit_metadata
from edgekit.runtime import entry_check
from edgekit.runtime.entry_check import KEYWORDS, _resolved, check_entry, problems, schema


def _keywords(node, found):
    """Every keyword of the schema, the nodes its `$ref`s point at (in edgekit's other schemas) included."""
    if isinstance(node, dict):
        if "$ref" in node:
            found.add("$ref")
            node = _resolved(node)
        for key, value in node.items():
            found.add(key)
            if key == "properties":
                for sub in value.values():
                    _keywords(sub, found)
            elif key not in ("enum", "const", "required", "description", "title"):
                _keywords(value, found)
    elif isinstance(node, list):
        for item in node:
            _keywords(item, found)
    return found


def test_the_schema_uses_only_the_keywords_the_runtime_checks():
    assert _keywords(schema(), set()) - KEYWORDS == set()


@pytest.fixture(scope="module")
def good_entry(converted):
    return read_edgekit_metadata(converted("int8").read_bytes())


def _bad_entries(good):
    """(name, entry): each breaks the schema in one place, one generator per class of defect."""
    def edit(path, value):
        entry = copy.deepcopy(good)
        node = entry
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return entry

    for key in ("mode", "io", "labels", "delegates", "source", "preprocessing", "inputs", "outputs", "verification"):
        for value in ("a string", 5, 2.5, True, None, [1, 2], {"x": 1}):
            yield f"{key}={value!r}", edit([key], value)
    for key in ("height", "width"):
        for value in (0, -3, 16385, 2.5, "64", True, None, [8]):
            yield f"preprocessing.{key}={value!r}", edit(["preprocessing", key], value)
    for value in ([], [1, 2, 3, 4, 5], ["x"], [None]):
        yield f"preprocessing.std={value!r}", edit(["preprocessing", "std"], value)
    yield "labels: 100001", edit(["labels"], ["x"] * 100_001)
    yield "labels: a 2 KB name", edit(["labels"], ["x" * 2048])
    yield "labels: numbers", edit(["labels"], [1, 2])
    yield "delegates: 17 hints", edit(["delegates"], [{"accelerator": "cpu", "reason": "x"}] * 17)
    yield "delegates[0].accelerator=a path", edit(["delegates"], [{"accelerator": "/tmp/libx.so", "reason": "x"}])
    yield "source.sha256=short", edit(["source", "sha256"], "abc")
    yield "schema=2", edit(["schema"], "edgekit.metadata/2")
    yield "inputs[0].shape=[a]", edit(["inputs"], [{**good["inputs"][0], "shape": ["a"]}])


def test_the_runtimes_validator_agrees_with_jsonschema_on_every_case(good_entry):
    validator = jsonschema.Draft202012Validator(schema())
    assert not list(problems(good_entry, schema())) and validator.is_valid(good_entry)
    cases = list(_bad_entries(good_entry))
    for name, entry in cases:
        ours = list(problems(entry, schema()))
        assert bool(ours) == (not validator.is_valid(entry)), (name, ours, [e.message for e in validator.iter_errors(entry)][:2])
    assert len(cases) > 80


def _with_entry(model_path, tmp_path, raw: bytes, name="m.tflite"):
    """A copy of the model whose edgekit entry is exactly `raw` (bytes written by hand, not by json.dumps)."""
    from edgekit.runtime.schema import pack, schema_module, unpack

    schema_py = schema_module()
    obj = unpack(model_path.read_bytes())
    buffer = schema_py.BufferT()
    buffer.data = list(raw)
    obj.buffers.append(buffer)
    meta = schema_py.MetadataT()
    meta.name = "edgekit"
    meta.buffer = len(obj.buffers) - 1
    obj.metadata = [m for m in obj.metadata if m.name != b"edgekit"] + [meta]
    out = tmp_path / name
    out.write_bytes(pack(obj))
    return out


@pytest.mark.parametrize("key", ["mode", "io", "preprocessing", "inputs", "outputs"])
def test_a_bad_value_the_runtime_acts_on_is_one_line_exit_3(converted, good_entry, tmp_path, key):
    for name, entry in _bad_entries(good_entry):
        if not name.startswith(key) or not list(problems(entry, schema())):
            continue
        path = tmp_path / "bad.tflite"
        path.write_bytes(add_metadata(converted("int8").read_bytes(), entry))
        with pytest.raises(ModelFormatError, match="edgekit metadata is invalid"):
            Model(path)


@pytest.mark.parametrize("key", ["labels", "delegates", "source", "verification", "schema"])
def test_a_bad_record_is_ignored_with_a_warning_and_the_model_runs(converted, good_entry, tmp_path, key):
    x = np.zeros((1, 8, 8, 1), np.float32)
    expected = Model(converted("int8")).predict(x)
    tried = 0
    for name, entry in _bad_entries(good_entry):
        if not name.startswith(key) or not list(problems(entry, schema())):
            continue
        path = tmp_path / "bad.tflite"
        path.write_bytes(add_metadata(converted("int8").read_bytes(), entry))
        model = Model(path)
        assert key.split(".")[0] not in (model.metadata or {}), name
        assert any(key in w and "ignored" in w for w in model.metadata_warnings), (name, model.metadata_warnings)
        np.testing.assert_array_equal(model.predict(x), expected)
        tried += 1
    assert tried >= (1 if key == "schema" else 3)


@pytest.mark.parametrize("raw, message", [
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 32"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper than 32"),
    (b'{"mode": "int8", "preprocessing": {"height": Infinity, "width": 8, "channels": 1, "resize": "stretch",'
     b' "mean": [0], "std": [1], "color": "GRAY", "layout": "NHWC"}}', "Infinity is not a number JSON allows"),
    (b'{"mode": NaN}', "not a number JSON allows"),
    (b'"just a string"', "not a JSON object"),
    (b"\xff\xfe", "not valid JSON"),
    (b'{"preprocessing": {"height": 16384, "width": 16384, "channels": 3, "resize": "stretch", "mean": [0],'
     b' "std": [1], "color": "RGB", "layout": "NHWC"}}', "more than 33554432 pixels"),
])
def test_entries_past_the_limits_are_refused(raw, message):
    with pytest.raises(ModelFormatError, match=message):
        check_entry(raw)


def test_an_entry_larger_than_the_limit_is_refused_before_it_is_parsed(monkeypatch):
    monkeypatch.setattr(entry_check, "MAX_ENTRY_BYTES", 1000)
    with pytest.raises(ModelFormatError, match="more than the 1000"):
        check_entry(b'{"labels": [' + b'"x",' * 400 + b'"x"]}')


def test_two_edgekit_entries_are_refused(converted, tmp_path):
    """edgekit would read one and another reader the other: a file that says two things is not loaded."""
    from edgekit.runtime.schema import pack, schema_module, unpack

    s = schema_module()
    obj = unpack(converted("int8").read_bytes())
    first = next(m for m in obj.metadata if m.name == b"edgekit")
    second = s.MetadataT()
    second.name, second.buffer = "edgekit", first.buffer
    obj.metadata.append(second)
    path = tmp_path / "two.tflite"
    path.write_bytes(pack(obj))
    with pytest.raises(ModelFormatError, match="two edgekit metadata entries"):
        Model(path)


@pytest.mark.parametrize("command", ["bench", "run", "inspect"])
def test_bad_entries_through_the_cli_are_one_line_never_exit_70(converted, good_entry, tmp_path, digits_dir, command):
    """Every hostile entry class through the commands: exit 0 (with a warning) or exit 3, one line each."""
    entries = {
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "height Infinity": json.dumps({**good_entry, "preprocessing": {**good_entry["preprocessing"],
                                                                       "height": math.inf}}).encode(),
        "delegates a string": json.dumps({**good_entry, "delegates": "gpu"}).encode(),
        "labels = 5": json.dumps({**good_entry, "labels": 5}).encode(),
        "source a string": json.dumps({**good_entry, "source": "x"}).encode(),
        "100000x100000 resize": json.dumps({**good_entry, "preprocessing": {**good_entry["preprocessing"],
                                                                            "height": 100_000, "width": 100_000}}).encode(),
    }
    args = {"bench": ["--runs", "2", "--data", str(digits_dir / "test")],
            "run": ["--source", str(digits_dir / "test" / "4"), "--max-frames", "2"], "inspect": []}[command]
    from helpers import run_cli_many

    paths = [_with_entry(converted("int8"), tmp_path, raw, f"{i}.tflite") for i, raw in enumerate(entries.values())]
    many = run_cli_many([[command, path, *args] for path in paths], cwd=ROOT)
    for name, done in zip(entries, many.runs):
        errors = [ln for ln in done.stderr.splitlines() if "error" in ln]
        assert done.returncode in (0, 3), (name, done.returncode, done.stderr[-500:])
        assert "Traceback" not in done.stderr, (name, done.stderr[-800:])
        assert done.returncode == 0 or len(errors) == 1, (name, done.stderr)


@pytest.mark.parametrize("labels", [["\ud800cat", "dog"], ["a\x1b[31mred", "b"], ["tab\there", "x"]])
def test_labels_that_cannot_be_printed_or_drawn_are_ignored(converted, good_entry, tmp_path, labels):
    """A lone surrogate made `run` exit 70 (printing) or segfault (cv2.putText); escape codes reached the
    terminal. Such labels are left out with a warning."""
    path = tmp_path / "m.tflite"
    path.write_bytes(add_metadata(converted("int8").read_bytes(), {**good_entry, "labels": labels}))
    model = Model(path)
    assert "labels" not in model.metadata and any("labels ignored" in w for w in model.metadata_warnings)


@pytest.mark.parametrize("edit, message", [
    ({"mean": [1, 2]}, "mean: needs 1 value"), ({"std": [0]}, "std: must not be 0"),
    ({"mean": [int("9" * 400)]}, "preprocessing")])
def test_stored_preprocessing_the_runtime_cannot_build_is_one_line_naming_the_field(converted, good_entry, tmp_path,
                                                                                     edit, message):
    path = tmp_path / "m.tflite"
    entry = {**good_entry, "preprocessing": {**good_entry["preprocessing"], **edit}}
    path.write_bytes(add_metadata(converted("int8").read_bytes(), entry))
    with pytest.raises(ModelFormatError, match=message) as err:
        Model(path)
    assert "--" not in str(err.value)


def test_an_integer_of_5000_digits_is_one_line():
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        check_entry(b'{"labels": [' + b"1" * 5000 + b"]}")


def test_a_pattern_ending_in_dollar_does_not_accept_a_trailing_newline(good_entry):
    entry = {**good_entry, "source": {**good_entry["source"], "sha256": "a" * 64 + "\n"}}
    assert any("sha256" in p for p in problems(entry, schema()))
