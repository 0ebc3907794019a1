"""Every option of every command is made from a declaration (the recipe, edgekit/params.py, SweepSettings, the
CLI's own in edgekit/cli_options.py): none is written by hand, each declaration is a parameter the library
function takes, with its default, `inspect --no-gpu` is `gpu=False`, and `sweep --calib` reads what `convert
--calib` reads."""

from __future__ import annotations

import dataclasses
import inspect

import click
import numpy as np
import pytest
from helpers import run_cli

import edgekit
from edgekit.api import bench_on
from edgekit.cli import main as cli
from edgekit.cli_options import COMMANDS, cli_name, command_fields, dest, every_flag, param_flags, recipe_fields
from edgekit.converters.recipe import MODES
from edgekit.declare import declared, flag_of
from edgekit.errors import UsageError
from edgekit.params import (
    OPEN_MODEL,
    BenchParams,
    DemoParams,
    DoctorParams,
    InspectParams,
    RemoteParams,
    RunParams,
)
from edgekit.runtime.delegates import TARGETS
from edgekit.sweeper import SweepSettings


def _opts(p: click.Option) -> list[str]:
    return [*p.opts, *p.secondary_opts]


def _options(command: str) -> list[click.Option]:
    return [p for p in cli.commands[command].params if isinstance(p, click.Option) and p.name != "help"]


def _flags(f, opt) -> list[str]:
    flag = flag_of(f, opt)
    switch = opt.kind is bool and f.default is None  # --probe/--no-probe
    return [*opt.aliases, flag, *(["--no-" + flag[2:]] if switch else [])]


def test_every_declared_command_is_a_command():
    assert set(COMMANDS) <= set(cli.commands)  # a command without options needs no entry


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_option_of_the_command_is_one_of_its_declarations_in_order(command):
    wanted = []
    if command == "convert":  # the modes, the recipe's (tests/test_recipe.py maps each to its field), the CLI's
        wanted += [("modes", [f"--{mode}"]) for mode in MODES[1:]]
        wanted += [(dest(spec, f), _flags(f, opt)) for spec, f, opt in recipe_fields()]
    wanted += [(f.name, _flags(f, opt)) for f, opt in command_fields(command)]
    assert [(p.name, _opts(p)) for p in _options(command)] == wanted


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_no_flag_serves_two_parameters_of_a_command(command):
    flags = [o for p in _options(command) for o in _opts(p)]
    assert len(flags) == len(set(flags))


def test_a_parameter_has_one_flag_across_the_commands():
    seen = dict(param_flags())
    for command in COMMANDS:
        for f, opt in command_fields(command):
            assert seen.setdefault(f.name, flag_of(f, opt)) == flag_of(f, opt), (command, f.name)
    assert every_flag()["hosts"] == "--on" and every_flag()["json_path"] == "--json"


def _library(fn, skip=()) -> dict[str, object]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if n not in skip}


def _declared(*kinds, skip=()) -> dict[str, object]:
    return {f.name: f.default for kind in kinds for f, _ in declared(kind) if f.name not in skip}


def test_bench_declarations_are_the_parameters_of_bench_and_bench_on_with_their_defaults():
    bench = _library(edgekit.bench)
    assert _declared(BenchParams).items() <= bench.items()
    on = _library(bench_on)
    on["hosts"] = ()  # positional there; the CLI's repeated --on starts empty
    assert _declared(BenchParams, RemoteParams, skip=("baseline",)).items() <= on.items()


def test_run_declarations_are_the_parameters_of_open_model_and_run_stream_with_their_defaults():
    from edgekit.run import open_model, run_stream

    given = _declared(RunParams, skip=("source",))  # `source` is open_source's first argument
    model = {k: given.pop(k) for k in OPEN_MODEL}
    assert model.items() <= _library(open_model).items()
    stream = _library(run_stream)
    assert given.pop("full_frames") is False and stream.pop("full_frames") is None  # the same to run_stream
    assert given.items() <= stream.items()


def test_sweep_declarations_are_the_parameters_of_sweep_with_their_defaults():
    given = _declared(SweepSettings)
    library = _library(edgekit.sweep)
    assert given.pop("calib") is given.pop("eval_data")  # both required: no default
    assert library.pop("calib") is library.pop("eval_data") is inspect.Parameter.empty
    assert given.items() <= library.items()


def test_inspect_declarations_are_the_parameters_of_inspect_with_their_defaults():
    assert _declared(InspectParams) == _library(edgekit.inspect, skip=("path",))


def test_doctor_declarations_are_doctor_on_hosts_and_its_session_with_their_defaults():
    from edgekit.remote import Session, doctor_on

    session = {f.name: f.default for f in dataclasses.fields(Session)}
    given = _declared(DoctorParams)
    assert given.pop("hosts") == () and "hosts" in inspect.signature(doctor_on).parameters
    assert given.items() <= session.items()


def test_demo_declarations_are_the_parameters_of_run_demo_with_their_defaults():
    from edgekit.demo import run_demo

    assert _declared(DemoParams) == _library(run_demo, skip=("say", "show"))


def test_no_gpu_turns_the_inspect_gpu_parameter_off_and_names_it_in_errors(tmp_path):
    command = cli.commands["inspect"]
    assert command.make_context("inspect", ["m.tflite"]).params["gpu"] is True
    assert command.make_context("inspect", ["m.tflite", "--no-gpu"]).params["gpu"] is False
    assert [_opts(p) for p in _options("inspect") if p.name == "gpu"] == [["--no-gpu"]]  # no --gpu
    assert cli_name("gpu") == cli_name("gpu", "False") == "--no-gpu"
    r = run_cli("inspect", tmp_path / "m.tflite", "--no-gpu", "--target", "gpu")
    assert r.returncode == 2
    assert "edgekit: error: --no-gpu skips the GPU analysis that --target gpu asks for" in r.stderr


def test_sweep_targets_are_named_once_among_the_delegate_targets():
    target = next(opt for f, opt in declared(SweepSettings) if f.name == "target")
    assert target.choices == ("cpu", "gpu", "npu") and set(target.choices) <= set(TARGETS)


def test_run_threads_take_a_number_or_auto_and_say_so_otherwise(tmp_path):
    r = run_cli("run", tmp_path / "m.tflite", "--source", tmp_path, "--threads", "many")
    assert r.returncode == 2
    assert "Invalid value for '--threads': 'many' is neither a number nor auto" in r.stderr


# -- sweep --calib and --eval-data: what convert reads ------------------------------------------------------
@pytest.fixture
def arrays(tmp_path, digits_dir):
    from edgekit.runtime import read_image

    files = sorted((digits_dir / "train").rglob("*.png"))[:40]
    images = np.stack([read_image(p) for p in files])
    labels = np.asarray([int(p.parent.name) for p in files])
    np.save(tmp_path / "calib.npy", images)
    np.savez(tmp_path / "calib.npz", x=images)
    np.savez(tmp_path / "eval.npz", x=images, y=labels)
    return tmp_path


@pytest.mark.parametrize("calib", ["calib.npy", "calib.npz"])
def test_sweep_settings_take_calibration_and_evaluation_files(arrays, calib):
    s = SweepSettings(model=arrays / "m.keras", calib=arrays / calib, eval_data=arrays / "eval.npz")
    assert s.calib.name == calib


def test_sweep_refuses_calibration_data_as_convert_does_with_its_flag(arrays):
    (arrays / "calib.txt").write_text("1, 2, 3")
    with pytest.raises(UsageError, match=r"an image folder .* or a \.npy/\.npz file") as refused:
        SweepSettings(model=arrays / "m.keras", calib=arrays / "calib.txt", eval_data=arrays / "eval.npz")
    assert refused.value.param == "calib"


def test_the_sweep_command_takes_a_npy_calibration_file(arrays):
    """Past the data checks (`--calib calib.npy` was "not a folder"): the next refusal is the model's."""
    (arrays / "model.h5").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    r = run_cli("sweep", arrays / "model.h5", "--calib", arrays / "calib.npy", "--eval-data", arrays / "eval.npz")
    assert r.returncode == 3 and "not a Keras model" in r.stderr, r.stderr


def test_the_sweep_builds_its_int8_variant_from_a_npy_calibration_file(arrays, digits_keras, digits_dir):
    from edgekit.runtime.metadata import read_edgekit_metadata
    from edgekit.sweeper import _build, variants

    s = SweepSettings(model=digits_keras, calib=arrays / "calib.npy", eval_data=digits_dir / "test")
    built, failed, _ = _build(s, [v for v in variants(s) if v[0] == "int8"], arrays, None)
    assert not failed and [name for name, _ in built] == ["int8"]
    meta = read_edgekit_metadata(built[0][1].read_bytes())
    assert meta["mode"] == "int8" and meta["calibration"]["source"] == str(arrays / "calib.npy")
