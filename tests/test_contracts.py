"""The JSON contracts in edgekit/schemas/ hold for what edgekit really emits (bench, inspect, doctor, sweep and
the .tflite metadata entry), they fail on a dropped key or a wrong type, and README.md shows them as they are."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from edgekit.contracts import SCHEMAS, load_schema, validate
from edgekit.runtime import read_edgekit_metadata
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "scripts" / "render_contracts.py"


def _cli_json(*args) -> dict:
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def bench_with_reference(converted, digits_keras, digits_dir) -> dict:
    return _cli_json("bench", converted("int8"), converted("float32"), "--data", digits_dir / "test",
                     "--reference", digits_keras, "--runs", "20", "--json", "-")


@pytest.fixture(scope="module")
def bench_without_data(converted) -> dict:
    return _cli_json("bench", converted("int8"), "--runs", "20", "--json", "-")


@pytest.fixture(scope="module")
def inspected(converted) -> dict:
    return _cli_json("inspect", converted("int8"), "--runtime", "ai-edge-litert==2.3", "--json")


@pytest.fixture(scope="module")
def doctor() -> dict:
    return _cli_json("doctor", "--json")


@pytest.fixture(scope="module")
def int8_metadata(converted) -> dict:
    return read_edgekit_metadata(converted("int8").read_bytes())


@pytest.fixture(scope="module")
def sweep_json(swept) -> dict:
    out, _ = swept
    return json.loads((out / "sweep.json").read_text())


def test_every_schema_is_a_valid_draft_2020_12_schema_named_by_its_schema_string():
    for name in SCHEMAS:
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["title"] == name and schema["properties"]["schema"]["const"] == name
        assert schema["additionalProperties"] is True  # keys are only ever added within a schema version


def test_every_key_in_every_schema_has_a_description():
    def undocumented(schema, path):
        for key, sub in schema.get("properties", {}).items():
            if not sub.get("description"):
                yield f"{path}{key}"
            for child in (sub, sub.get("items"), sub.get("additionalProperties")):
                if isinstance(child, dict):
                    yield from undocumented(child, f"{path}{key}.")

    assert [p for name in SCHEMAS for p in undocumented(load_schema(name), f"{name}: ")] == []


def test_bench_json_with_data_and_reference_follows_its_contract(bench_with_reference):
    validate(bench_with_reference)
    assert bench_with_reference["reference"] is not None
    assert all(m["accuracy"]["reference_top1"] is not None for m in bench_with_reference["models"])


def test_bench_json_without_data_follows_its_contract_with_nulls(bench_without_data):
    validate(bench_without_data)
    model = bench_without_data["models"][0]
    assert bench_without_data["data"] is None and bench_without_data["reference"] is None
    assert model["accuracy"] is None and model["preprocessing"] is None


def test_inspect_json_follows_its_contract_and_embeds_a_valid_metadata_entry(inspected):
    validate(inspected)
    assert inspected["gpu"]["checked"] and len(inspected["runtime_checks"]) == 1
    validate(inspected["metadata"]["edgekit"], "edgekit.metadata/1")


def test_inspect_json_without_gpu_follows_its_contract(converted):
    report = _cli_json("inspect", converted("float32"), "--no-gpu", "--json")
    validate(report)
    assert "gpu" not in report


def test_doctor_json_follows_its_contract(doctor):
    validate(doctor)


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_metadata_entry_of_a_converted_model_follows_its_contract(converted, mode):
    entry = read_edgekit_metadata(converted(mode).read_bytes())
    validate(entry)
    assert entry["mode"] == mode


def test_sweep_json_follows_its_contract_with_the_full_bench_report(sweep_json):
    validate(sweep_json)  # `bench` is checked against edgekit.bench/1 through its $ref
    assert sweep_json["bench"]["schema"] == "edgekit.bench/1"


def test_the_autopilot_models_metadata_entry_follows_its_contract(sweep_json):
    auto = next(r for r in sweep_json["rows"] if r["variant"] == "int8-auto")
    entry = read_edgekit_metadata(Path(auto["file"]).read_bytes())
    validate(entry)
    assert entry["autopilot"] == sweep_json["variants"]["int8-auto"]["autopilot"]


def _drop(doc, path):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    del doc[last]


def _set(value):
    def apply(doc, path):
        *parents, last = path
        for key in parents:
            doc = doc[key]
        doc[last] = value
    return apply


@pytest.mark.parametrize("document, path, change", [
    ("bench_with_reference", ("models", 0, "latency_ms", "p50"), _set("0.1")),
    ("bench_with_reference", ("models", 0, "accelerator"), _drop),
    ("bench_with_reference", ("models", 1, "accuracy", "snr_db"), _drop),
    ("bench_with_reference", ("data", "skipped_count"), _drop),
    ("bench_without_data", ("models", 0, "fallbacks"), _set(None)),
    ("bench_without_data", ("settings",), _drop),
    ("inspected", ("runtime_requirements",), _drop),
    ("inspected", ("ops", "count"), _set(10.5)),
    ("doctor", ("ok",), _set("true")),
    ("doctor", ("active_backend", "version"), _drop),
    ("int8_metadata", ("preprocessing",), _drop),
    ("int8_metadata", ("mode",), _set("int4")),
    ("sweep_json", ("rows", 0, "pareto"), _drop),
    ("sweep_json", ("bench", "models", 0, "size_bytes"), _set(None)),
])
def test_a_dropped_key_or_a_wrong_type_breaks_the_contract(request, document, path, change):
    doc = copy.deepcopy(request.getfixturevalue(document))
    validate(doc)
    change(doc, list(path))
    with pytest.raises(jsonschema.ValidationError) as caught:
        validate(doc)
    assert list(caught.value.absolute_path) in (list(path), list(path[:-1]))  # the error points at the change


def test_a_document_checked_against_another_contract_fails(bench_without_data):
    with pytest.raises(jsonschema.ValidationError):
        validate(bench_without_data, "edgekit.inspect/1")


def test_an_unknown_contract_name_is_a_one_line_value_error():
    with pytest.raises(ValueError, match="unknown contract 'edgekit.bench/9'; known: edgekit.bench/1"):
        load_schema("edgekit.bench/9")


def test_the_contracts_module_does_not_import_tensorflow():
    code = "import sys, edgekit.contracts; sys.exit('tensorflow' in sys.modules or 'keras' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_validating_without_jsonschema_installed_is_a_one_line_missing_dependency_error():
    code = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jsonschema', 'referencing'):
            raise ImportError(f'No module named {name!r} (blocked by the test)')
sys.meta_path.insert(0, Block())
from edgekit.contracts import validate
from edgekit.errors import MissingDependencyError
try:
    validate({'schema': 'edgekit.doctor/1'})
except MissingDependencyError as exc:
    print(exc)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "validating edgekit JSON contracts needs jsonschema>=4.18: pip install 'jsonschema>=4.18'\n"


def test_the_docs_contract_and_exit_code_blocks_are_rendered_from_their_sources():
    r = subprocess.run([sys.executable, str(RENDER), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_check_names_the_stale_block_and_exits_1(tmp_path):
    import shutil

    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "bench.md"
    text = page.read_text()
    row = "| `models[].latency_ms.p50` | number |"
    assert text.count(row) == 1
    page.write_text(text.replace(row, "| `models[].latency_ms.p50` | string |"))
    r = subprocess.run([sys.executable, str(RENDER), "--check", "--root", str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 1
    assert "edgekit.bench/1 in docs/bench.md block is stale" in r.stderr and "inspect" not in r.stderr
    assert r.stdout == "" and "string |" in page.read_text()  # --check writes nothing
