"""The stages of a conversion, one module each; converters/pipeline.py composes them:

    load -> [train] -> calibrate -> quantize -> [budget] -> verify -> [target] -> [measure] -> write

A stage declares what it reads: `READS`, the recipe fields and properties it uses (the pipeline hands it
`reads(recipe, READS)`, a view of the recipe that has those and nothing else), and the records of earlier
stages it needs, as its parameters. It returns its typed record (a frozen dataclass): `metadata()` is its
section of the file's `edgekit.metadata/1` entry (the keys in its `KEYS`, which no other stage writes; a key
`a.b` goes inside section `a`), `warnings` what the user must act on, `notes` what edgekit chose. A new stage
is a module here beside the others, a name in STAGES and a line in `pipeline._stages`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from edgekit.converters.recipe import ConvertRecipe

Say = Callable[[Any], Any]  # a progress line (a str, or a counted edgekit.progress.Step)

# the stage modules, in the order the pipeline runs them (each declares READS and KEYS; imported when used)
STAGES = ("load", "train", "calibrate", "quantize", "budget", "verify", "target", "measure")


class UndeclaredRead(AttributeError):
    """A stage read a part of the recipe its `READS` does not name: a bug in edgekit, not in the recipe."""


class _Reads:
    """The recipe as one stage sees it: the attributes it declared, read through; any other one refused."""

    def __init__(self, recipe: ConvertRecipe, names: frozenset[str], stage: str):
        self._recipe, self._names, self._stage = recipe, names, stage

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # the view's own attributes (before __init__ has set them: copy, pickle)
            raise AttributeError(name)
        if name not in self._names:
            raise UndeclaredRead(f"stage {self._stage} reads `recipe.{name}`, which its READS does not declare")
        return getattr(self._recipe, name)


def reads(recipe: ConvertRecipe, names: frozenset[str], stage: str = "?") -> ConvertRecipe:
    """What a stage may read of `recipe`: only `names` (its READS). Typed as the recipe, which it reads
    through; reading anything else raises UndeclaredRead."""
    unknown = sorted(n for n in names if not hasattr(type(recipe), n) and n not in recipe.__dataclass_fields__)
    if unknown:
        raise UndeclaredRead(f"stage {stage} declares {', '.join(unknown)}, which the recipe does not have")
    return cast(ConvertRecipe, _Reads(recipe, names, stage))
