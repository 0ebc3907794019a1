"""Target: delegate hints and GPU compatibility for `target`, with the warnings they call for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.converters.recipe import ConvertRecipe
from edgekit.runtime.delegates import NNAPI_DEPRECATED, hints_for

READS = frozenset({"target", "mode"})
KEYS = ("target", "delegates", "gpu_compatibility")


@dataclass(frozen=True)
class Targeted:
    """Delegate hints and GPU compatibility for `target`, with the warnings they call for."""

    entries: dict[str, Any]
    warnings: list[str]

    def metadata(self) -> dict[str, Any]:
        return dict(self.entries)


def target(recipe: ConvertRecipe, tflite: bytes, mode: str | None = None) -> Targeted:
    """`mode`: the file's, where it is not the recipe's (the budget handed back float16 or dynamic)."""
    from edgekit.runtime.inspect import fallback_line

    assert recipe.target is not None  # the pipeline runs this stage for a target only
    mode = mode or recipe.mode
    entries: dict[str, Any] = {"target": recipe.target, "delegates": hints_for(recipe.target, mode)}
    warnings: list[str] = []
    if recipe.target in ("gpu", "nnapi"):
        entries["gpu_compatibility"] = _gpu_check(tflite)
        fallback = entries["gpu_compatibility"].get("fallback_ops") or []
        if fallback:
            warnings.append(fallback_line(f"the GPU delegate would leave {len(fallback)} op(s) on the CPU",
                                          entries["gpu_compatibility"]))
    if recipe.target == "nnapi":
        warnings.append(NNAPI_DEPRECATED)
    if recipe.target == "gpu" and mode not in ("float16", "float32"):
        warnings.append(entries["delegates"][0]["reason"])
    return Targeted(entries, warnings)


def _gpu_check(tflite: bytes) -> dict[str, Any]:
    """TFLite's analyzer on the converted model: what the GPU delegate would leave on the CPU."""
    from edgekit.runtime.inspect import analyze

    gpu = analyze(tflite, gpu=True)["gpu"]
    return {k: gpu[k] for k in ("checked", "compatible", "fallback_ops", "op_share", "weight_share", "open_dimension")
            if k in gpu}
