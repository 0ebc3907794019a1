"""Every command's options, made from declarations (edgekit/declare.py): `convert`'s from the recipe
(converters/recipe.py), `bench`'s, `run`'s, `inspect`'s, `doctor`'s and `demo`'s from edgekit/params.py,
`sweep`'s from SweepSettings, and what only the CLI does with a result (--json, --quiet, --verbose) from
the declarations below. Errors are shown with
flags: the library names `calibration.samples`, the CLI says `--calib-samples`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from edgekit.cli_progress import QUIET_HELP, VERBOSE_HELP
from edgekit.converters.recipe import MODES, SPECS, ConvertRecipe
from edgekit.declare import Option, declared, flag_of, is_required, option
from edgekit.errors import UsageError
from edgekit.params import BenchParams, DemoParams, DoctorParams, InspectParams, RemoteParams, RunParams
from edgekit.sweeper import SweepSettings
from edgekit.tuner import TuneSettings

CLI_ONLY = ("modes", "as_json", "quiet", "verbose")  # the mode flags (--int8 ...), --json, -q, -v: rendering,
# not recipe fields
_PREFIX = "spec__"


def _quiet() -> Any:
    return option(False, QUIET_HELP, aliases=("-q",), kind=bool)


def _report_json(schema: str) -> Any:
    return option(False, f"The report as JSON (schema {schema}).", flag="--json", kind=bool)


@dataclass(frozen=True)
class ConvertOutput:
    """How `edgekit convert` prints its result (after the recipe's options and the mode flags)."""

    as_json: bool = option(False, "Print the written metadata as JSON.", flag="--json", kind=bool)
    quiet: bool = _quiet()
    verbose: bool = option(False, VERBOSE_HELP, aliases=("-v",), kind=bool)


@dataclass(frozen=True)
class BenchOutput:
    """What `edgekit bench` does with its report (the CLI's part, not the library's)."""

    json_path: Path | None = option(None, "Write the report as JSON ('-' = stdout).", flag="--json", kind=Path)
    force: bool = option(False, "Replace an existing --json file.", kind=bool)
    quiet: bool = _quiet()


@dataclass(frozen=True)
class RunOutput:
    """How `edgekit run` prints its results."""

    as_json: bool = option(False, "One JSON object per frame, then a summary object.", flag="--json", kind=bool)


@dataclass(frozen=True)
class SweepOutput:
    """How `edgekit sweep` prints its report."""

    as_json: bool = option(False, "Print the sweep report as JSON.", flag="--json", kind=bool)
    quiet: bool = _quiet()


@dataclass(frozen=True)
class TuneOutput:
    """How `edgekit tune` prints its result."""

    as_json: bool = option(False, "Print pareto.json (schema edgekit.tune/1).", flag="--json", kind=bool)
    quiet: bool = _quiet()


@dataclass(frozen=True)
class InspectOutput:
    """How `edgekit inspect` prints its report."""

    as_json: bool = _report_json("edgekit.inspect/1")


@dataclass(frozen=True)
class DoctorOutput:
    """How `edgekit doctor` prints its report."""

    as_json: bool = _report_json("edgekit.doctor/1")


@dataclass(frozen=True)
class DemoOutput:
    """How much `edgekit demo` says while it works."""

    quiet: bool = _quiet()


# each command's declarations, in the order its options are listed: the library's first, then the CLI's
# (convert's library options are the recipe's: convert_options renders them, before these)
COMMANDS: dict[str, tuple[type, ...]] = {
    "convert": (ConvertOutput,),
    "sweep": (SweepSettings, SweepOutput),
    "tune": (TuneSettings, TuneOutput),
    "bench": (BenchParams, RemoteParams, BenchOutput),
    "run": (RunParams, RunOutput),
    "inspect": (InspectParams, InspectOutput),
    "doctor": (DoctorParams, DoctorOutput),
    "demo": (DemoParams, DemoOutput),
}


def command_fields(command: str) -> Iterator[tuple[dataclasses.Field, Option]]:
    """(field, declaration) of every option `command` takes, in order (none for a command not in COMMANDS)."""
    for kind in COMMANDS.get(command, ()):
        yield from declared(kind)


def command_options(command: str) -> Callable[[Callable], Callable]:
    """click options for every field `command` declares (COMMANDS)."""

    def decorate(fn: Callable) -> Callable:
        for f, opt in reversed(list(command_fields(command))):
            fn = _option(None, f, opt)(fn)
        return fn

    return decorate


def values_of(kind: type, values: dict[str, Any]) -> dict[str, Any]:
    """The command line's values of the fields `kind` declares, by the library's names."""
    return {f.name: values[f.name] for f, _ in declared(kind)}


def recipe_fields() -> list[tuple[str | None, dataclasses.Field, Option]]:
    """(spec name or None for the recipe itself, field, declaration) of every option `convert` takes."""
    found: list[tuple[str | None, dataclasses.Field, Option]] = [
        (None, f, opt) for f, opt in declared(ConvertRecipe) if f.name != "mode"]
    for name, kind in SPECS.items():
        found += [(name, f, opt) for f, opt in declared(kind)]
    return found


def dest(spec: str | None, f: dataclasses.Field) -> str:
    """The click parameter name of a field: its own name, or spec__SPEC__FIELD."""
    return f.name if spec is None else f"{_PREFIX}{spec}__{f.name}"


@functools.lru_cache(maxsize=1)
def param_flags() -> dict[str, str]:
    """{convert's API parameter ("calibration.samples", "io"): its CLI flag}."""
    return {(f.name if spec is None else f"{spec}.{f.name}"): flag_of(f, opt) for spec, f, opt in recipe_fields()}


@functools.lru_cache(maxsize=1)
def every_flag() -> dict[str, str]:
    """{API parameter of any declared command ("calibration.samples", "hosts"): its CLI flag}."""
    flags = dict(param_flags())
    for command in COMMANDS:
        for f, opt in command_fields(command):
            flags.setdefault(f.name, flag_of(f, opt))
    return flags


@functools.lru_cache(maxsize=1)
def negated() -> frozenset[str]:
    """The parameters whose flag turns them off (`gpu`: --no-gpu)."""
    return frozenset(f.name for command in COMMANDS for f, opt in command_fields(command) if opt.negated)


def convert_options(fn: Callable) -> Callable:
    """click options for every declared field of the recipe and its specs, and the mode flags."""
    for spec, f, opt in reversed(recipe_fields()):
        fn = _option(spec, f, opt)(fn)
    for mode in reversed(MODES[1:]):
        fn = click.option(f"--{mode}", "modes", flag_value=mode, multiple=True, help=_MODE_HELP[mode])(fn)
    return fn


_MODE_HELP = {"int8": "Full-integer int8 (needs --calib, --train-data or --qat).", "float16": "float16 weights.",
              "dynamic": "Dynamic-range int8 weights.", "int16x8": "int16 activations, int8 weights (needs --calib)."}


class _Parsed(click.ParamType):
    """A declaration's `parse` as click's type: what it refuses is a usage error on that flag."""

    name = "text"

    def __init__(self, parse: Callable[[str], Any]) -> None:
        self.parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


def _option(spec: str | None, f: dataclasses.Field, opt: Option):
    """The click option of one declared field."""
    flag = flag_of(f, opt)
    names = [*opt.aliases, flag, dest(spec, f)]
    kw: dict[str, Any] = {"help": opt.help}
    if opt.metavar is not None:
        kw["metavar"] = opt.metavar
    if opt.kind is bool and f.default is None:  # on, off, or unset (the library decides)
        return click.option(f"{flag}/--no-{flag[2:]}", dest(spec, f), default=None, **kw)
    if opt.negated:  # given: the field is False
        return click.option(*names, is_flag=True, flag_value=False, default=True, **kw)
    if opt.kind is bool:
        return click.option(*names, is_flag=True, **kw)
    if opt.per_input or opt.repeat:
        return click.option(*names, multiple=True, **kw)
    if is_required(f):
        kw["required"] = True
    if opt.choices is not None:
        kw["type"] = click.Choice([str(c) for c in opt.choices])
    elif opt.parse is not None:
        kw["type"] = _Parsed(opt.parse)
    elif opt.kind is Path:
        kw["type"] = click.Path(path_type=Path)
    elif opt.kind is not None:
        kw["type"] = opt.kind
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is not None and opt.parse is None:
        kw.update(default=default, show_default=True)
    return click.option(*names, **kw)


def recipe_arguments(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `edgekit.convert` for what was given on the command line: top-level fields
    and, for each spec any of whose options was given, that spec built from them."""
    args: dict[str, Any] = {}
    given_specs: dict[str, dict[str, Any]] = {}
    for spec, f, opt in recipe_fields():
        name = dest(spec, f)
        value = values[name]
        flag = flag_of(f, opt)
        from_cli = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        if opt.per_input:
            value = _named(value, flag, opt.parse or str)
            from_cli = value is not None
        if spec is None:
            if from_cli or value is not None:
                args[f.name] = value
        elif from_cli:
            given_specs.setdefault(spec, {})[f.name] = value
    for spec, fields in given_specs.items():
        args[spec] = SPECS[spec](**fields)
    modes = values["modes"]
    if len(modes) > 1:
        raise UsageError(f"choose one mode, got {', '.join('--' + m for m in modes)}")
    args["mode"] = modes[0] if modes else None
    return args


def _parsed(parse: Callable[[str], Any], text: str, flag: str) -> Any:
    try:
        return parse(text)
    except UsageError as exc:
        raise UsageError(str(exc), param=flag) from None


def _named(values: tuple[str, ...], flag: str, parse: Callable[[str], Any]):
    """One unnamed value, or NAME=VALUE per model input (a dict): the syntax of --calib, --input-shape,
    --resize, --mean and --std."""
    if not values:
        return None
    if len(values) == 1 and ("=" not in values[0] or Path(values[0]).exists()):
        return _parsed(parse, values[0], flag)
    named = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or name in named:
            raise UsageError(f"{flag}: give one value, or NAME=VALUE once per input; got {', '.join(values)}")
        named[name] = _parsed(parse, rest, flag)
    return named


def cli_name(param: str, value: str | None = None) -> str:
    """How the CLI names a parameter the library named: its flag (`mode=int8` is --int8, `io=int8` is
    `--io int8`); parameters of other commands by their own flag (`data` is --data)."""
    if param.startswith("--"):
        return param if value is None else f"{param} {value}"
    if param == "mode":
        return f"--{value}" if value else "the mode (--int8, --float16, --dynamic, --int16x8)"
    flag = every_flag().get(param) or "--" + param.rsplit(".", 1)[-1].replace("_", "-")
    if value is None:
        return flag
    if param in negated():  # `gpu=False` is --no-gpu; `gpu=True` is leaving it out
        return flag if value in ("False", "false") else f"without {flag}"
    if value in ("True", "true"):
        return flag
    if value in ("False", "false"):  # a switch's off side (--probe/--no-probe)
        return "--no-" + flag[2:]
    return f"{flag} {value}"
