"""Options declared once: a dataclass field carries its default and a declaration (help, flag, choices, how
a string parses, a check); the library validates with it and the CLI renders it as a flag
(edgekit/cli_options.py). Imports nothing of edgekit, so every layer may declare its parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """What an API field and its CLI flag share: help, flag, choices, how a string parses, and a check
    (value -> why it is wrong, or None)."""

    help: str
    flag: str | None = None  # None: "--" + the field name with dashes; "" for no flag
    choices: tuple[str, ...] | None = None
    metavar: str | None = None  # how the CLI's help names the value (NAME, PATH)
    per_input: bool = False  # the CLI takes NAME=VALUE once per model input, or one value for all
    repeat: bool = False  # the CLI flag may be given many times: a tuple of its values
    aliases: tuple[str, ...] = ()  # other CLI spellings ("-o")
    negated: bool = False  # the flag turns the (True by default) field off: `--no-gpu` gives gpu=False
    parse: Callable[[str], Any] | None = None  # a CLI string to the field's value (None: click's type)
    check: Callable[[Any], str | None] | None = None
    kind: type | None = None  # the CLI's type when parse is None (str, int, float, Path; bool: a flag,
    # or with a default of None an on/off switch that may be left unset)


def option(default: Any, help: str, **declared: Any) -> Any:
    """A dataclass field with its declaration."""
    return field(default=default, metadata={"option": Option(help, **declared)})


def required(help: str, **declared: Any) -> Any:
    """A declared dataclass field without a default: the CLI requires its flag."""
    return field(metadata={"option": Option(help, **declared)})


def declared(spec: Any) -> Iterator[tuple[dataclasses.Field, Option]]:
    """The declared fields of a spec class or instance, in order."""
    for f in dataclasses.fields(spec):
        opt = f.metadata.get("option")
        if opt is not None:
            yield f, opt


def flag_of(f: dataclasses.Field, opt: Option) -> str:
    """The CLI flag of a declared field: its own, or "--" + the field name with dashes ("--no-" + it for a
    negated field)."""
    if opt.flag is not None:
        return opt.flag
    return ("--no-" if opt.negated else "--") + f.name.replace("_", "-")


def is_required(f: dataclasses.Field) -> bool:
    """A field without a default (`required`)."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
