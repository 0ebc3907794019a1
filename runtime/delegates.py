"""Delegate hints: which accelerators a model prefers, and loading them with a CPU fallback.

A hint list is stored in the model's edgekit metadata by `convert --target`; the runtime tries each
accelerator in order, falls back with a logged reason, and `delegate=` overrides the hints.

A model file is data: its hints are accelerator names from `HINT_NAMES`, never a library or a path. The
library for a name comes from the user (`delegate=PATH`, `EDGEKIT_*_DELEGATE`) or from the system's
loader path (`DELEGATE_LIBRARIES`, bare file names only); a hint that is anything else is dropped with a
reason and never reaches the dynamic loader.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import UsageError

log = logging.getLogger("edgekit.runtime")

TARGETS = ("cpu", "gpu", "nnapi", "npu")
ENV_LIBRARY = {"gpu": "EDGEKIT_GPU_DELEGATE", "nnapi": "EDGEKIT_NNAPI_DELEGATE", "npu": "EDGEKIT_NPU_DELEGATE"}
# Delegate libraries edgekit knows how to name; EDGEKIT_DELEGATES adds more (os.pathsep-separated)
DELEGATE_LIBRARIES = {
    "gpu": ("libtensorflowlite_gpu_delegate.so",),
    "edgetpu": ("libedgetpu.so.1",),
    "npu": ("libvx_delegate.so", "libQnnTFLiteDelegate.so", "libneuron_adapter.so"),
}
# the names a model's hints may carry; "xnnpack" is LiteRT's CPU path, which needs no library
HINT_NAMES = ("cpu", "xnnpack", "gpu", "nnapi", "npu", "edgetpu")
NNAPI_DEPRECATED = ("NNAPI is deprecated since Android 15 (API 35) and no longer maintained; prefer `target=gpu` "
                    "(LiteRT GPU delegate) or `target=npu` (vendor delegate)")


def find_library(lib: str) -> str | None:
    """Where the dynamic loader would find `lib`: a path, LD_LIBRARY_PATH, or the ldconfig cache."""
    if os.sep in lib:
        return lib if os.path.isfile(lib) else None
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if folder and os.path.isfile(os.path.join(folder, lib)):
            return os.path.join(folder, lib)
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.split(" ")[0] == lib:
            return target.strip()
    return None


def hints_for(target: str, mode: str) -> list[dict[str, str]]:
    """The ordered accelerator list for `convert --target`, each with the reason it is there."""
    if target not in TARGETS:
        raise UsageError(f"must be one of {', '.join(TARGETS)}, got {target!r}", param="target")
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
    library: str | None = None  # the library the delegate was loaded from (None on the CPU)


def _is_library(value: str) -> bool:
    return os.sep in value or value.endswith((".so", ".dylib", ".dll")) or ".so." in value


def check_override(value: object) -> str | None:
    """--delegate: cpu, gpu, nnapi, npu or a library path; anything else is a usage error."""
    if value is None:
        return None
    if not isinstance(value, str) or not (value in TARGETS or _is_library(value)):
        raise UsageError(f"must be one of {', '.join(TARGETS)} or a delegate library path, got {value!r}",
                         param="delegate")
    return value


def _plugin_problem(library: str) -> str | None:
    """Why `library` cannot be an external delegate, found before LiteRT's `Delegate` is built: a
    `Delegate` whose constructor fails this way raises again in its `__del__` (an "Exception ignored"
    message on stderr), so such libraries are never handed to `load_delegate`."""
    import ctypes

    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        return str(exc) or type(exc).__name__
    for symbol in ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"):
        try:
            getattr(lib, symbol)
        except AttributeError as exc:  # "...: undefined symbol: tflite_plugin_create_delegate"
            return str(exc) or f"no {symbol}"
    return None


def try_load(load_delegate, library: str):
    """(delegate, None) or (None, reason): any failure of a foreign library is a reason, not a crash.
    Touches no process-wide state (no hooks, no forced garbage collection): safe from any thread."""
    problem = _plugin_problem(library)
    if problem is None:
        try:
            return load_delegate(library), None
        except Exception as exc:  # ValueError (the plugin refused), OSError, RuntimeError ...  # noqa: BLE001
            problem = str(exc) or type(exc).__name__
    first = next((line for line in problem.splitlines() if line.strip()), problem)
    return None, f"{library} did not load: {first[:200]}"


def hint_order(hints: object) -> tuple[list[str], list[dict[str, str]]]:
    """The accelerator names of a model's stored hints, in order, and a fallback entry for each hint that
    is not one of `HINT_NAMES` (a path, a library, another type): those are dropped, never loaded."""
    if hints is None:
        return [], []
    names: list[str] = []
    dropped: list[dict[str, str]] = []
    for hint in hints if isinstance(hints, list) else [hints]:
        name = hint.get("accelerator") if isinstance(hint, dict) else hint
        if isinstance(name, str) and name in HINT_NAMES:
            names.append("cpu" if name == "xnnpack" else name)
            continue
        shown = repr(name)[:80]
        dropped.append({"accelerator": shown, "reason": f"the model's delegate hint {shown} is not one of "
                        f"{', '.join(HINT_NAMES)}; a model file cannot name a library, so it is ignored"})
        log.warning("ignored delegate hint: %s", dropped[-1]["reason"])
    return names, dropped


def choose(hints: object, override: str | None, load_delegate) -> DelegateChoice:
    """Try the accelerators in order and return the first that loads; the CPU needs no delegate.
    `override` (the caller's: "cpu", an accelerator name or a library path) comes first and replaces the
    hints; `hints` (the model file's) are names only, see `hint_order`."""
    override = check_override(override)
    fallbacks: list[dict[str, str]] = []
    if override:
        order = [override]
        if override != "cpu":
            order.append("cpu")
    else:
        order, fallbacks = hint_order(hints)
        order = order or ["cpu"]
    for acc in order:
        if acc == "cpu":
            return DelegateChoice("cpu", [], fallbacks)
        library = acc if acc == override and _is_library(acc) else _library_for(acc)
        if library is None:
            hint = f"set {ENV_LIBRARY[acc]} or " if acc in ENV_LIBRARY else ""
            reason = f"no {acc} delegate library found ({hint}name it with `delegate`: /path/to/lib.so)"
        elif load_delegate is None:
            reason = "this interpreter backend cannot load delegates"
        else:
            delegate, reason = try_load(load_delegate, library)
            if delegate is not None:
                return DelegateChoice(acc, [delegate], fallbacks, library)
        fallbacks.append({"accelerator": acc, "reason": reason})
        log.warning("%s unavailable, using the next choice: %s", acc, reason)
    return DelegateChoice("cpu", [], fallbacks)
