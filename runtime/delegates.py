"""Delegate hints: which accelerators a model prefers, and loading them with a CPU fallback.

A hint list is stored in the model's edgekit metadata by `convert --target`; the runtime tries each
accelerator in order, falls back with a logged reason, and `delegate=` overrides the hints.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import UsageError

log = logging.getLogger("edgekit.runtime")

TARGETS = ("cpu", "gpu", "nnapi", "npu")
ENV_LIBRARY = {"gpu": "EDGEKIT_GPU_DELEGATE", "nnapi": "EDGEKIT_NNAPI_DELEGATE", "npu": "EDGEKIT_NPU_DELEGATE"}
NNAPI_DEPRECATED = ("NNAPI is deprecated since Android 15 (API 35) and no longer maintained; prefer --target gpu "
                    "(LiteRT GPU delegate) or --target npu (vendor delegate)")


def hints_for(target: str, mode: str) -> list[dict[str, str]]:
    """The ordered accelerator list for `convert --target`, each with the reason it is there."""
    if target not in TARGETS:
        raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}")
    cpu = {"accelerator": "cpu", "reason": "always available: XNNPACK kernels; the fallback for every target"}
    if target == "cpu":
        return [cpu]
    if target == "gpu":
        why = ("float16 weights run natively on mobile GPUs" if mode in ("float16", "float32") else
               f"the GPU delegate runs {mode} models by dequantizing to float; float16 is its native precision")
        return [{"accelerator": "gpu", "reason": why}, cpu]
    if target == "nnapi":
        return [{"accelerator": "nnapi", "reason": NNAPI_DEPRECATED},
                {"accelerator": "gpu", "reason": "the maintained Android accelerator path"}, cpu]
    why = ("NPUs run full-integer models" if mode == "int8" else
           f"most NPUs need full-integer int8 models; this one is {mode} and will likely run on the CPU")
    return [{"accelerator": "npu", "reason": why}, {"accelerator": "gpu", "reason": "second choice"}, cpu]


def _library_for(accelerator: str) -> str | None:
    from edgekit.runtime.doctor import DELEGATE_LIBRARIES, find_library

    env = os.environ.get(ENV_LIBRARY.get(accelerator, ""), "")
    if env:
        return env
    for lib in DELEGATE_LIBRARIES.get(accelerator, ()):
        found = find_library(lib)
        if found:
            return found
    return None


@dataclass
class DelegateChoice:
    accelerator: str  # what the interpreter runs on
    delegates: list[Any] = field(default_factory=list)  # loaded TfLiteDelegate objects
    fallbacks: list[dict[str, str]] = field(default_factory=list)  # what was tried first, and why it failed


def choose(hints: list[dict[str, str]] | None, override: str | None, load_delegate) -> DelegateChoice:
    """Try the accelerators in order (override first: "cpu", an accelerator name or a library
    path) and return the first that loads; the CPU needs no delegate."""
    if override:
        order = [override]
        if override != "cpu":
            order.append("cpu")
    else:
        order = [h["accelerator"] for h in (hints or [])] or ["cpu"]
    fallbacks: list[dict[str, str]] = []
    for acc in order:
        if acc == "cpu":
            return DelegateChoice("cpu", [], fallbacks)
        library = acc if (os.sep in acc or acc.endswith(".so") or ".so." in acc) else _library_for(acc)
        if library is None:
            reason = (f"no {acc} delegate library found (set {ENV_LIBRARY.get(acc, 'EDGEKIT_DELEGATES')} "
                      "or pass --delegate /path/to/lib.so)")
        else:
            try:
                return DelegateChoice(acc, [load_delegate(library)], fallbacks)
            except (ValueError, OSError, RuntimeError) as exc:
                reason = f"{library} did not load: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        fallbacks.append({"accelerator": acc, "reason": reason})
        log.warning("%s unavailable, falling back: %s", acc, reason)
    return DelegateChoice("cpu", [], fallbacks)
