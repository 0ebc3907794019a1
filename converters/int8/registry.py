"""The int8 candidates by name, in the order `auto` scores them: a declared table of "module:Class", each
module imported only when its candidate is used (nothing is imported or registered at import time).
Adding a candidate is one module of this folder and one line here; `register` adds one from elsewhere
(a test, a plugin) for the life of the process, `unregister` takes it out."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgekit.converters.int8.base import Candidate

# min/max first: it is the converter's own file, what every other candidate must beat
CANDIDATES: dict[str, str] = {
    "minmax": "edgekit.converters.int8.minmax:MinMax",
    "percentile": "edgekit.converters.int8.percentile:Percentile",
    "mse": "edgekit.converters.int8.mse:Mse",
    "ema": "edgekit.converters.int8.ema:Ema",
    "extremes": "edgekit.converters.int8.extremes:Extremes",
    "bias": "edgekit.converters.int8.bias:BiasCorrection",
    "equalize": "edgekit.converters.int8.equalize:Equalize",
    "aeq": "edgekit.converters.int8.aeq:AiEdgeQuantizer",
    "gptq": "edgekit.converters.int8.gptq:Gptq",
}
_registered: dict[str, Callable[[], Candidate]] = {}


def names() -> tuple[str, ...]:
    """Every candidate's name: the declared ones in their order, then those registered, as registered."""
    return (*CANDIDATES, *_registered)


def load(name: str) -> Candidate:
    """A new instance of the candidate called `name` (its module imported now); KeyError for no such name."""
    if name in _registered:
        candidate = _registered[name]()
    else:
        module, _, cls = CANDIDATES[name].partition(":")
        candidate = getattr(importlib.import_module(module), cls)()
    if candidate.name != name:
        raise ValueError(f"the int8 candidate registered as {name!r} calls itself {candidate.name!r}")
    return candidate


def register(name: str, factory: Callable[[], Candidate]) -> None:
    """One more candidate, scored by `auto` after the declared ones (`factory()` makes it: a Candidate
    subclass will do)."""
    if name in CANDIDATES or name in _registered or name == "auto":
        raise ValueError(f"an int8 candidate called {name!r} exists already")
    _registered[name] = factory


def unregister(name: str) -> None:
    """Takes out a candidate `register` added."""
    del _registered[name]
