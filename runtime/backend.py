"""Pick a LiteRT interpreter without importing TensorFlow unless nothing else is there.

Order: `ai_edge_litert` -> `tflite_runtime` -> `tensorflow.lite`.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from edgekit.errors import MissingDependencyError

_ORDER = ("ai_edge_litert", "tflite_runtime", "tensorflow")


@dataclass(frozen=True)
class Backend:
    name: str  # "ai_edge_litert", "tflite_runtime" or "tensorflow"
    version: str
    interpreter_class: Any

    load_delegate: Any = None

    def interpreter(self, *, model_content: bytes, num_threads: int | None, delegates: list | None = None,
                    resize: dict[int, tuple[int, ...]] | None = None, strict: bool = False,
                    allocate: bool = True) -> Any:
        """A new interpreter with its tensors allocated (after resizing the inputs in `resize`; not with
        `allocate=False`). LiteRT's native INFO lines reach fd 2 unless the caller silences them (the CLI
        does: edgekit.runtime.quiet)."""
        interpreter = self.interpreter_class(model_content=model_content, num_threads=num_threads,
                                             experimental_delegates=delegates or None)
        for index, shape in (resize or {}).items():
            interpreter.resize_tensor_input(index, list(shape), strict=strict)
        if allocate:
            interpreter.allocate_tensors()
        return interpreter


def _numpy_major() -> int:
    import numpy

    return int(numpy.__version__.split(".")[0])


def _load(name: str) -> Backend:
    if name == "ai_edge_litert":
        mod = importlib.import_module("ai_edge_litert.interpreter")
        version = getattr(importlib.import_module("ai_edge_litert"), "__version__", "unknown")
        return Backend(name, version, mod.Interpreter, mod.load_delegate)
    if name == "tflite_runtime":
        pkg = importlib.import_module("tflite_runtime")
        version = getattr(pkg, "__version__", "unknown")
        if _numpy_major() >= 2 and version.startswith("2.") and int(version.split(".")[1]) <= 14:
            raise ImportError(
                f"tflite_runtime {version} was built against numpy 1 and crashes under numpy 2; "
                "install ai-edge-litert instead (pip install ai-edge-litert)"
            )
        mod = importlib.import_module("tflite_runtime.interpreter")
        return Backend(name, version, mod.Interpreter, mod.load_delegate)
    tf = importlib.import_module("tensorflow")
    return Backend("tensorflow", tf.__version__, tf.lite.Interpreter, tf.lite.experimental.load_delegate)


@functools.cache
def get_backend(preferred: str | None = None) -> Backend:
    """The first interpreter that imports, or `preferred` when named."""
    names = (preferred,) if preferred else _ORDER
    reasons = []
    for name in names:
        try:
            return _load(name)
        except ImportError as exc:
            reasons.append(f"{name}: {exc}")
    raise MissingDependencyError(f"no TFLite interpreter found ({install_advice()}); tried " + "; ".join(reasons))


def install_advice(machine: str | None = None, python: tuple[int, int] | None = None) -> str:
    """What to install for an interpreter on this machine and Python, from the wheels that exist: LiteRT
    (ai-edge-litert) for Linux x86_64/aarch64 (glibc >= 2.27; 1.4.0 for glibc 2.17 up to CPython 3.12),
    macOS arm64 and Windows x64, CPython 3.10-3.14; nothing for 32-bit ARM, where tflite-runtime 2.14
    has armv7l wheels for CPython <= 3.11 (glibc >= 2.34: Raspberry Pi OS bookworm)."""
    import platform
    import sys

    machine = machine or platform.machine()
    python = python or sys.version_info[:2]
    version = f"{python[0]}.{python[1]}"
    if machine in ("armv7l", "armv6l", "armhf"):
        if python <= (3, 11):
            return 'pip install "edgekit[tflite]": tflite-runtime 2.14 with numpy<2, the only wheels for 32-bit ARM'
        return (f"no TFLite wheel exists for Python {version} on 32-bit ARM: use a Python 3.11 venv "
                '(uv venv --python 3.11 && uv pip install "edgekit[tflite]") or a 64-bit OS image')
    if python >= (3, 15):
        return (f"LiteRT has no wheels for Python {version} yet: use a Python 3.12 venv "
                "(uv venv --python 3.12 && uv pip install edgekit)")
    return ("pip install ai-edge-litert; if pip finds no wheel (it needs glibc >= 2.27, or Python <= 3.12 "
            "for the glibc 2.17 build 1.4.0), use a Python 3.12 venv: uv venv --python 3.12 && uv pip install edgekit")
