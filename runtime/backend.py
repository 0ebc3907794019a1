"""The backend seam: pick a LiteRT interpreter (without importing TensorFlow unless nothing else is there)
and run models through `Runner`, the one interface the rest of edgekit calls.

Order: `ai_edge_litert` -> `tflite_runtime` -> `tensorflow.lite`.

`Runner` is one model loaded on one backend; `InterpreterRunner` is today's implementation, over the
Interpreter of whichever package imported, and the only code in edgekit that calls an interpreter's methods.
A LiteRT `CompiledModel` runner (an accelerator through LiteRT's newer API) goes here beside it, as another
`Runner` subclass that `Backend.runner` returns when asked for it.
"""

from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import MissingDependencyError

_ORDER = ("ai_edge_litert", "tflite_runtime", "tensorflow")

Details = dict[str, Any]  # a tensor's details as the interpreter gives them: name, index, shape, dtype, ...


class Runner(ABC):
    """One model loaded on one backend: tensors by index, set -> invoke -> get. Not thread-safe (a Model
    serialises its calls with its lock). Errors are the backend's own (RuntimeError, ValueError): callers
    turn them into edgekit's.

    `set`, `invoke` and `get` are attributes, not methods, so that an implementation can bind its backend's
    own callables there and a hot loop pays no extra call: `set(index, array)` writes an input (of the
    tensor's dtype), `invoke()` runs the model once, `get(index)` is a copy of a tensor."""

    set: Callable[[int, np.ndarray], None]
    invoke: Callable[[], None]
    get: Callable[[int], np.ndarray]

    @abstractmethod
    def input_details(self) -> list[Details]:
        """The inputs' details in the model's input order."""

    @abstractmethod
    def output_details(self) -> list[Details]:
        """The outputs' details in the model's output order."""

    @abstractmethod
    def tensor_details(self) -> list[Details]:
        """Every tensor's details (the primary subgraph)."""

    @abstractmethod
    def signatures(self) -> list[str]:
        """The model's signature keys; empty when it has none."""

    @abstractmethod
    def signature_details(self, key: str | None = None) -> tuple[dict[str, Details], dict[str, Details]]:
        """(inputs, outputs) of signature `key` (None: the only one), each a dict signature name -> details."""

    @abstractmethod
    def run_signature(self, key: str | None = None, /, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        """Runs signature `key` (None: the only one) on inputs by signature name, sizing the inputs to them;
        the outputs by signature name."""

    @abstractmethod
    def resize(self, index: int, shape: tuple[int, ...] | list[int], strict: bool = False) -> None:
        """Gives input `index` the shape `shape` (open axes only when `strict`); `allocate` next."""

    @abstractmethod
    def allocate(self) -> None:
        """Allocates the tensors (after loading, or after `resize`)."""

    @abstractmethod
    def view(self, index: int) -> np.ndarray:
        """Tensor `index` without a copy, writable: let it go before the next `invoke` or `allocate`."""


class InterpreterRunner(Runner):
    """A `Runner` over a LiteRT / TFLite `Interpreter` (ai_edge_litert, tflite_runtime or tf.lite)."""

    def __init__(self, interpreter: Any):
        self._interpreter = interpreter
        self.set = interpreter.set_tensor  # the interpreter's own callables: no extra call in hot loops
        self.invoke = interpreter.invoke
        self.get = interpreter.get_tensor
        self._tensor = interpreter.tensor

    def input_details(self) -> list[Details]:
        return self._interpreter.get_input_details()

    def output_details(self) -> list[Details]:
        return self._interpreter.get_output_details()

    def tensor_details(self) -> list[Details]:
        return self._interpreter.get_tensor_details()

    def signatures(self) -> list[str]:
        return list(self._interpreter.get_signature_list() or {})

    def signature_details(self, key: str | None = None) -> tuple[dict[str, Details], dict[str, Details]]:
        runner = self._interpreter.get_signature_runner(key)
        return runner.get_input_details(), runner.get_output_details()

    def run_signature(self, key: str | None = None, /, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        # a new SignatureRunner each call: one kept alive holds the interpreter's internals, and LiteRT then
        # refuses `invoke` ("references to internal data")
        return self._interpreter.get_signature_runner(key)(**inputs)

    def resize(self, index: int, shape: tuple[int, ...] | list[int], strict: bool = False) -> None:
        self._interpreter.resize_tensor_input(index, list(shape), strict=strict)

    def allocate(self) -> None:
        self._interpreter.allocate_tensors()

    def view(self, index: int) -> np.ndarray:
        return self._tensor(index)()


@dataclass(frozen=True)
class Backend:
    name: str  # "ai_edge_litert", "tflite_runtime" or "tensorflow"
    version: str
    interpreter_class: Any

    load_delegate: Any = None
    op_resolver_type: Any = None  # the package's OpResolverType enum, for `preserve_all_tensors`

    def runner(self, *, model_content: bytes, num_threads: int | None = None, delegates: list | None = None,
               preserve_all_tensors: bool = False, resize: dict[int, tuple[int, ...]] | None = None,
               strict: bool = False, allocate: bool = True) -> Runner:
        """The model `model_content` loaded on this backend, its tensors allocated (after resizing the inputs
        in `resize`; not with `allocate=False`). `preserve_all_tensors`: every intermediate tensor stays
        readable with `get`, on the builtin kernels without the XNNPACK delegate (for calibration)."""
        return InterpreterRunner(self.interpreter(model_content=model_content, num_threads=num_threads,
                                                  delegates=delegates, resize=resize, strict=strict,
                                                  allocate=allocate, preserve_all_tensors=preserve_all_tensors))

    def interpreter(self, *, model_content: bytes, num_threads: int | None, delegates: list | None = None,
                    resize: dict[int, tuple[int, ...]] | None = None, strict: bool = False,
                    allocate: bool = True, preserve_all_tensors: bool = False) -> Any:
        """A new bare interpreter, as `runner` sets it up (tests compare a Runner against it; everything else
        uses `runner`). LiteRT's native INFO lines reach fd 2 unless the caller silences them (the CLI does:
        edgekit.runtime.quiet)."""
        debugging: dict[str, Any] = {}
        if preserve_all_tensors:  # LiteRT does not warn that this is for debugging, as the default resolver does
            debugging["experimental_preserve_all_tensors"] = True
            if self.op_resolver_type is not None:
                debugging["experimental_op_resolver_type"] = self.op_resolver_type.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        interpreter = self.interpreter_class(model_content=model_content, num_threads=num_threads,
                                             experimental_delegates=delegates or None, **debugging)
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
        return Backend(name, version, mod.Interpreter, mod.load_delegate, getattr(mod, "OpResolverType", None))
    if name == "tflite_runtime":
        pkg = importlib.import_module("tflite_runtime")
        version = getattr(pkg, "__version__", "unknown")
        if _numpy_major() >= 2 and version.startswith("2.") and int(version.split(".")[1]) <= 14:
            raise ImportError(
                f"tflite_runtime {version} was built against numpy 1 and crashes under numpy 2; "
                "install ai-edge-litert instead (pip install ai-edge-litert)"
            )
        mod = importlib.import_module("tflite_runtime.interpreter")
        return Backend(name, version, mod.Interpreter, mod.load_delegate, getattr(mod, "OpResolverType", None))
    tf = importlib.import_module("tensorflow")
    return Backend("tensorflow", tf.__version__, tf.lite.Interpreter, tf.lite.experimental.load_delegate,
                   getattr(tf.lite.experimental, "OpResolverType", None))


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
