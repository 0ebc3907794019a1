"""`edgekit convert`'s options, made from the recipe's declarations (converters/recipe.py), and errors
shown with flags: the library names `calibration.samples`, the CLI says `--calib-samples`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgekit.converters.recipe import MODES, SPECS, ConvertRecipe, Option, declared, flag_of
from edgekit.errors import UsageError

CLI_ONLY = ("modes", "as_json", "quiet", "verbose")  # the mode flags (--int8 ...), --json, -q, -v: rendering,
# not recipe fields
OTHER_FLAGS = {"runtimes": "--runtime", "hosts": "--on"}  # parameters of other commands whose flag is not --NAME
_PREFIX = "spec__"


def _fields() -> list[tuple[str | None, dataclasses.Field, Option]]:
    """(spec name or None for the recipe itself, field, declaration) of every option `convert` takes."""
    found = [(None, f, opt) for f, opt in declared(ConvertRecipe) if f.name != "mode"]
    for name, kind in SPECS.items():
        found += [(name, f, opt) for f, opt in declared(kind)]
    return found


def dest(spec: str | None, f: dataclasses.Field) -> str:
    """The click parameter name of a field: its own name, or spec__SPEC__FIELD."""
    return f.name if spec is None else f"{_PREFIX}{spec}__{f.name}"


@functools.lru_cache(maxsize=1)
def param_flags() -> dict[str, str]:
    """{API parameter ("calibration.samples", "io"): its CLI flag}."""
    return {(f.name if spec is None else f"{spec}.{f.name}"): flag_of(f, opt) for spec, f, opt in _fields()}


def convert_options(fn: Callable) -> Callable:
    """click options for every declared field of the recipe and its specs, and the mode flags."""
    for spec, f, opt in reversed(_fields()):
        fn = _option(spec, f, opt)(fn)
    for mode in reversed(MODES[1:]):
        fn = click.option(f"--{mode}", "modes", flag_value=mode, multiple=True, help=_MODE_HELP[mode])(fn)
    return fn


_MODE_HELP = {"int8": "Full-integer int8 (needs --calib, --train-data or --qat).", "float16": "float16 weights.",
              "dynamic": "Dynamic-range int8 weights.", "int16x8": "int16 activations, int8 weights (needs --calib)."}


def _option(spec: str | None, f: dataclasses.Field, opt: Option):
    names = [*opt.aliases, flag_of(f, opt), dest(spec, f)]
    kw: dict[str, Any] = {"help": opt.help}
    if opt.kind is bool:
        return click.option(*names, is_flag=True, **kw)
    if opt.per_input:
        return click.option(*names, multiple=True, **kw)
    if opt.choices is not None:
        kw["type"] = click.Choice([str(c) for c in opt.choices])
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
    for spec, f, opt in _fields():
        name = dest(spec, f)
        value = values[name]
        flag = flag_of(f, opt)
        from_cli = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        if opt.per_input:
            value = _named(value, flag, opt.parse or str)
            from_cli = value is not None
        elif opt.parse is not None and isinstance(value, str):
            value = _parsed(opt.parse, value, flag)
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
    flag = param_flags().get(param) or OTHER_FLAGS.get(param) or "--" + param.rsplit(".", 1)[-1].replace("_", "-")
    if value is None:
        return flag
    if value in ("True", "true"):
        return flag
    if value in ("False", "false"):  # a switch's off side (--probe/--no-probe)
        return "--no-" + flag[2:]
    return f"{flag} {value}"
