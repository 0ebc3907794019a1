"""Each convert stage owns its part (converters/stages/): it reads only the recipe fields it declares (READS)
and the records it takes as parameters, returns a frozen record, and writes the metadata keys it declares
(KEYS), which no other stage writes. `convert` runs its preflight once, in a child process too."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import signal
from pathlib import Path

import pytest
from conftest import ROOT

from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.stages import STAGES, UndeclaredRead, reads

FUNCTION = {"budget": "within_budget"}  # a stage's function, where it is not named as its module


def _stage(name: str):
    return importlib.import_module(f"edgekit.converters.stages.{name}")


def _recipe_reads(path: Path) -> set[str]:
    """Every `recipe.X` a module's code reads."""
    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "recipe"}


def test_every_stage_reads_only_the_recipe_fields_it_declares():
    folder = ROOT / "converters" / "stages"
    for name in STAGES:
        stage = _stage(name)
        undeclared = _recipe_reads(folder / f"{name}.py") - stage.READS
        assert not undeclared, f"stage {name} reads recipe.{', recipe.'.join(sorted(undeclared))} undeclared"
        reads(ConvertRecipe(model=Path("m.keras")), stage.READS, name)  # each declared name is the recipe's
    helpers = {p.stem for p in folder.glob("*.py")} - set(STAGES) - {"__init__"}
    for name in sorted(helpers):  # the stages' helpers are handed what they need, never the recipe
        assert not _recipe_reads(folder / f"{name}.py"), name


def test_a_stage_that_reads_past_its_declaration_is_stopped():
    recipe = ConvertRecipe(model=Path("m.keras"), mode="float16", target="gpu")
    view = reads(recipe, frozenset({"mode"}), "verify")
    assert view.mode == "float16"
    with pytest.raises(UndeclaredRead, match="stage verify reads `recipe.target`"):
        view.target  # noqa: B018
    with pytest.raises(UndeclaredRead, match="declares nonsense"):
        reads(recipe, frozenset({"mode", "nonsense"}), "verify")


def test_every_stage_returns_a_frozen_record_whose_metadata_is_its_keys():
    for name in STAGES:
        stage = _stage(name)
        function = getattr(stage, FUNCTION.get(name, name))
        record = getattr(stage, inspect.signature(function).return_annotation)
        assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen, name
        assert hasattr(record, "metadata") == bool(stage.KEYS), name


def test_each_metadata_key_has_one_owner():
    from edgekit.converters.pipeline import OWN_KEYS, merged

    owners = [("pipeline", key) for key in OWN_KEYS] + [(name, key) for name in STAGES for key in _stage(name).KEYS]
    keys = [key for _, key in owners]
    assert len(keys) == len(set(keys)), sorted(owners, key=lambda o: o[1])
    with pytest.raises(RuntimeError, match="'mode' written by two stages"):
        merged({"mode": "int8"}, {"mode": "float32"})
    assert merged({"calibration": {"source": "x"}}, {"calibration.range_setting": {"method": "mse"}}) == {
        "calibration": {"source": "x", "range_setting": {"method": "mse"}}}


def test_a_conversion_writes_only_declared_keys_in_stage_order(converted, digits_keras, digits_dir, tmp_path):
    """int8 (its range setting inside the calibration section) and a float16 conversion for the GPU: every
    key of the metadata is declared by the stage that wrote it, in the order the stages ran."""
    from edgekit.converters.pipeline import OWN_KEYS
    from edgekit.converters.pipeline import convert as run_convert
    from edgekit.runtime.metadata import read_edgekit_metadata

    owned = {key.split(".")[0] for name in STAGES for key in _stage(name).KEYS} | set(OWN_KEYS)
    int8 = read_edgekit_metadata(converted("int8").read_bytes())
    assert set(int8) <= owned and "range_setting" in int8["calibration"]
    result = run_convert(ConvertRecipe(model=digits_keras, target="gpu", calib=digits_dir / "train",
                                       output=tmp_path / "gpu.tflite"))
    assert list(result.metadata) == ["schema", "mode", "io", "preprocessing", "source", "labels", "calibration",
                                     "verification", "inputs", "outputs", "tools", "recipe", "timing", "target",
                                     "delegates", "gpu_compatibility"]
    assert "range_setting" not in result.metadata["calibration"]


def test_a_stage_given_only_its_declared_inputs_runs(converted, digits_keras):
    """The load and target stages, each handed its view of the recipe and nothing else."""
    from edgekit.converters.stages.load import load
    from edgekit.converters.stages.target import target

    recipe = ConvertRecipe(model=digits_keras, mode="int8", calib=Path("unused"), target="gpu")
    loaded = load(reads(recipe, _stage("load").READS, "load"), lambda _msg: None)
    assert loaded.file == "digits.keras" and set(loaded.metadata()) == set(_stage("load").KEYS)
    targeted = target(reads(recipe, _stage("target").READS, "target"), converted("int8").read_bytes())
    assert set(targeted.metadata()) == set(_stage("target").KEYS)
    assert targeted.warnings  # int8 on the GPU delegate: said


def test_an_isolated_conversion_runs_the_preflight_once(digits_keras, tmp_path, monkeypatch):
    """The caller's preflight refuses before the child starts; the child converts without a second one."""
    from edgekit.converters import isolated, pipeline

    calls = []
    real = pipeline.preflight
    monkeypatch.setattr(pipeline, "preflight", lambda recipe: calls.append(recipe) or real(recipe))
    recipe = ConvertRecipe(model=digits_keras, output=tmp_path / "once.tflite")
    sent = []
    jobs = [(recipe, pipeline.preflight(recipe)), None]  # one job, then the word to stop

    class Pipe:
        def recv(self):
            return jobs.pop(0)

        def send(self, message):
            sent.append(message)

        def close(self):
            pass

    handler = signal.getsignal(signal.SIGINT)
    try:
        isolated._child(Pipe(), Pipe())  # as IsolatedConverter starts it
    finally:
        signal.signal(signal.SIGINT, handler)
    assert sent[-1][0] == "result" and (tmp_path / "once.tflite").is_file()
    assert len(calls) == 1  # the caller's; none in the child


def test_one_child_converts_one_recipe_after_another_and_a_crash_costs_one(digits_keras, tmp_path):
    """IsolatedConverter (tune's trials, sweep's variants): TensorFlow imported once in one child for many
    conversions; the child killed with SIGSEGV in the middle of one is that conversion's ConversionError,
    nothing written, and the next conversion runs in a fresh child."""
    import os

    from edgekit.converters.isolated import IsolatedConverter
    from edgekit.errors import ConversionError

    def recipe(mode: str) -> ConvertRecipe:
        return ConvertRecipe(model=digits_keras, output=tmp_path / f"{mode}.tflite", mode=mode)

    with IsolatedConverter() as converter:
        assert converter.convert(recipe("float16")).path.is_file()
        first = converter._child.pid
        assert converter.convert(recipe("dynamic")).path.is_file() and converter._child.pid == first
        with pytest.raises(ConversionError, match=r"TensorFlow crashed \(SIGSEGV\) while"):
            converter.convert(recipe("float32"), progress=lambda _line: os.kill(first, signal.SIGSEGV))
        assert not (tmp_path / "float32.tflite").exists()
        assert converter.convert(recipe("float32")).path.is_file() and converter._child.pid != first
    assert converter._child is None
