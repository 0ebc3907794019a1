"""`Model`: one .tflite, its edgekit metadata, and float-in/float-out inference over LiteRT.

Inputs and outputs are named tensors: the names of the model's signature (Keras output names, SavedModel
signature keys) when it has one, else the tensor names. Open dimensions (-1 in a tensor's shape signature)
take whatever size the samples have: the interpreter is resized once per set of input shapes and kept.
A Model runs through `Runner`s (runtime/backend.py), never an interpreter's own methods.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import InputShapeError, InvokeError, ModelFormatError, UsageError, one_line
from edgekit.runtime.backend import Backend, Runner, get_backend
from edgekit.runtime.delegates import DelegateChoice, choose
from edgekit.runtime.flatbuffer import ModelView, read_model_file
from edgekit.runtime.metadata import (
    read_custom_op_names,
    read_edgekit_entry,
    read_tflite_metadata,
    standard_input,
    standard_labels,
)
from edgekit.runtime.preflight import check_io_types, validate
from edgekit.runtime.preprocess import PreprocessSpec
from edgekit.runtime.probe import checked, known_good
from edgekit.runtime.quant import dequantize, quantize
from edgekit.runtime.verdicts import digest

__all__ = ["Model", "TensorInfo", "dequantize", "quantize"]

log = logging.getLogger("edgekit.runtime")

MAX_RESIZED = 8  # interpreters kept for other input shapes; the oldest goes first
SIGNATURE_KEY = "serving_default"

Inputs = np.ndarray | Mapping[str, Any] | Sequence[Any]
Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TensorInfo:
    name: str  # the signature name when the model has a signature, else the tensor name
    index: int
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: float
    zero_point: int
    quantized: bool = False  # an integer tensor with a scale: values are (q - zero_point) * scale
    shape_signature: tuple[int, ...] = ()  # the shape with -1 where a dimension is open (dynamic)
    tensor_name: str = ""  # the tensor's own name in the graph (equal to `name` without a signature)

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantized", self.scale != 0.0 and np.issubdtype(self.dtype, np.integer))
        object.__setattr__(self, "shape_signature", tuple(self.shape_signature) or tuple(self.shape))
        object.__setattr__(self, "tensor_name", self.tensor_name or self.name)

    @property
    def signature(self) -> tuple[int, ...]:
        """Former name of `shape_signature`."""
        return self.shape_signature

    @property
    def open_dims(self) -> tuple[int, ...]:
        """Axes whose size the caller chooses (-1 in the shape signature)."""
        return tuple(i for i, d in enumerate(self.shape_signature) if d < 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": np.dtype(self.dtype).name,
            "scale": self.scale,
            "zero_point": self.zero_point,
            "shape_signature": list(self.shape_signature),
            "tensor_name": self.tensor_name,
        }


def _tensor_info(d: dict[str, Any], name: str | None = None) -> TensorInfo:
    scale, zp = d.get("quantization", (0.0, 0))
    shape = tuple(int(s) for s in d["shape"])
    signature = tuple(int(s) for s in d.get("shape_signature", shape))
    return TensorInfo(name or d["name"], d["index"], shape, np.dtype(d["dtype"]), float(scale), int(zp),
                      shape_signature=signature, tensor_name=d["name"])


def _unsized(detail: dict[str, Any]) -> bool:
    """An input open beyond the batch (-1 in its signature) whose written size there is at most 1."""
    signature = detail.get("shape_signature", detail["shape"])
    return any(s < 0 and d <= 1 for s, d in zip(list(signature)[1:], list(detail["shape"])[1:]))


def _signature_order(names: list[str]) -> list[str]:
    """TFLite lists signature names sorted as strings; generated ones (output_0 ... output_10, the names
    of a Keras model's list outputs) go back to their numeric order, which is the model's."""
    parts = [p for p in (re.fullmatch(r"(.*_)(\d+)", n) for n in names) if p is not None]
    if names and len(parts) == len(names) and len({p.group(1) for p in parts}) == 1:
        return [n for _, n in sorted((int(p.group(2)), n) for p, n in zip(parts, names))]
    return list(names)


def _named_tensors(runner: Runner) -> tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """Inputs and outputs named and ordered by the model's signature ("serving_default", or its only one)
    when that signature covers exactly the interpreter's inputs and outputs; else by tensor name, in the
    interpreter's order."""
    ins, outs = runner.input_details(), runner.output_details()
    plain = tuple(_tensor_info(d) for d in ins), tuple(_tensor_info(d) for d in outs)
    try:
        keys = runner.signatures()
        key = SIGNATURE_KEY if SIGNATURE_KEY in keys else keys[0] if len(keys) == 1 else None
        if key is None:
            return plain
        by_name = runner.signature_details(key)
    except (AttributeError, ValueError, RuntimeError, KeyError, TypeError):  # a backend without signatures
        return plain
    named = []
    for details, sig in zip((ins, outs), by_name):
        by_index = {int(d["index"]): d for d in details}
        if sorted(int(d["index"]) for d in sig.values()) != sorted(by_index):
            return plain  # the signature runs another subgraph: its indices are not the interpreter's
        named.append(tuple(_tensor_info(by_index[int(sig[n]["index"])], n) for n in _signature_order(list(sig))))
    return named[0], named[1]


def _in_model_order(infos: tuple[TensorInfo, ...], listed) -> tuple[TensorInfo, ...]:
    """The order the source model had (edgekit's metadata lists it; TFLite sorts signature names), when
    the metadata names exactly these tensors; else unchanged."""
    names = [t.get("name") for t in listed or () if isinstance(t, dict)]
    by_name = {t.name: t for t in infos}
    if sorted(names, key=str) != sorted(by_name):
        return infos
    return tuple(by_name[n] for n in names if isinstance(n, str))  # all are, by the check above


class Model:
    """A loaded .tflite. Thread-safe: calls on one Model are serialised by a lock.

    >>> m = Model("digits.int8.tflite")
    >>> probs = m.predict(batch_of_float_inputs)      # quantizes in, dequantizes out
    >>> m.predict({"image": images, "vector": vectors})  # several inputs: by name
    {'logits': array(...), 'probs': array(...)}        # several outputs: a dict by name
    """

    def __init__(self, source: str | Path | bytes, *, num_threads: int | None = None,
                 backend: str | None = None, delegate: str | None = None, probe: bool | None = None,
                 where: str | None = None):
        """`probe`: load and run the model once in a child process first (runtime/probe.py), so that a file
        that crashes the native interpreter, or wants unbounded memory or time, is an error here instead.
        None (the default) probes bytes this runtime has no verdict for yet (a verdict is kept by sha256),
        True probes always, False never (bytes you made yourself). `where` names the model in messages."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.path: Path | None = None
            content = bytes(source)
            where = where or "model bytes"
        else:
            self.path = Path(source)
            where = where or str(self.path)
            content = read_model_file(self.path)
        self.view = ModelView(content, where)  # parsed once: metadata, custom ops and the preflight read it
        self.content = content
        self.size_bytes = len(content)
        try:
            self.metadata: dict[str, Any] | None
            self.metadata, self.metadata_warnings = read_edgekit_entry(self.view)  # invalid records left out
            self.custom_ops: tuple[str, ...] = read_custom_op_names(self.view)
        except ModelFormatError as exc:
            raise ModelFormatError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
        self.tflite_metadata, standard_warnings = read_tflite_metadata(self.view)  # MediaPipe's, TF Support's
        self.metadata_warnings = [*self.metadata_warnings, *standard_warnings]
        for warning in self.metadata_warnings:
            log.warning("%s: %s", where, warning)
        self.backend: Backend = get_backend(backend)
        self.num_threads = num_threads
        self.delegate: DelegateChoice = self._checked_then_delegated(content, where, probe, delegate)
        try:
            self.runner: Runner = self._first_runner(content, num_threads)
            self.inputs, self.outputs = _named_tensors(self.runner)
            self.inputs = _in_model_order(self.inputs, (self.metadata or {}).get("inputs"))
            self.outputs = _in_model_order(self.outputs, (self.metadata or {}).get("outputs"))
        except (ValueError, RuntimeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise ModelFormatError(f"{where}: the interpreter cannot load it: {one_line(exc)}") from None
        if not self.inputs or not self.outputs:
            raise ModelFormatError(f"{where}: the model has no inputs or no outputs")
        self._lock = threading.Lock()
        self._where = where
        self._said_raw = False
        self._said_bad_standard = False
        self._input_shape = self.inputs[0].shape
        self._shapes: Shapes = tuple(i.shape for i in self.inputs)
        self._output_indices = tuple(o.index for o in self.outputs)
        self._batch = self.inputs[0].shape[0] if self.inputs[0].shape else 1
        self._input_indices = tuple(i.index for i in self.inputs)
        self._batched: dict[Any, Runner | None] = {}  # samples (or (samples, sample shape)) -> runner for them
        self._resized: dict[Shapes, Runner] = {}  # input shapes -> runner resized to them (open sizes)

    def _first_runner(self, content: bytes, num_threads: int | None) -> Runner:
        """The model at the written input shapes. An input of open size written unsized (a U-Net's or a
        proposal net's 1x1) may not prepare there ("XNNPack delegate failed to reshape"): that model is
        kept unallocated, and runs at the sizes its inputs bring (`_interpreter_for`)."""
        self._unsized = False
        try:
            return self.backend.runner(model_content=content, num_threads=num_threads,
                                       delegates=self.delegate.delegates)
        except (ValueError, RuntimeError):
            bare = self.backend.runner(model_content=content, num_threads=num_threads,
                                       delegates=self.delegate.delegates, allocate=False)
            if not any(_unsized(d) for d in bare.input_details()):
                raise
            self._unsized = True
            return bare

    @property
    def interpreter(self) -> Runner:
        """Former name of `runner`: the model at its written input shapes (a Runner, no longer the bare
        interpreter)."""
        return self.runner

    @property
    def runtime(self) -> str:
        """The interpreter this model runs on, as verdicts are kept for it: "ai_edge_litert 2.3.0"."""
        return f"{self.backend.name} {self.backend.version}"

    def _checked_then_delegated(self, content: bytes, where: str, probe: bool | None,
                                delegate: str | None) -> DelegateChoice:
        """The preflight and the CPU probe (unless these bytes are known good), then the delegate: its library
        is loaded only once the file passed, and the file is probed again with that very library."""
        sha256 = digest(content) if probe is not False else None  # hashed once for every verdict below
        checking = probe is not None or not known_good(content, self.runtime, sha256=sha256)  # else: checked before
        if checking:
            validate(self.view, where)  # values that crash the native interpreter become errors here
        check_io_types(self.view, where)  # a STRING input or output: no danger, but nothing to feed or read
        if checking and probe is not False:  # what the preflight cannot know, a child process finds out
            checked(content, where, backend=self.backend.name, runtime=self.runtime, always=bool(probe),
                    sha256=sha256)
        hints = (self.metadata or {}).get("delegates")  # names from edgekit's table, never a library
        self.delegate = choose(hints, delegate, self.backend.load_delegate)
        if self.delegate.library and probe is not False and \
                (probe or not known_good(content, self.checked_on, sha256=sha256)):  # a delegate's own kernels
            checked(content, where, backend=self.backend.name, runtime=self.checked_on, always=bool(probe),
                    delegate=self.delegate.library, sha256=sha256)
        return self.delegate

    @property
    def checked_on(self) -> str:
        """What a probe verdict about this model holds for: the runtime, and the delegate library when one is
        loaded (a delegate runs kernels of its own)."""
        library = self.delegate.library
        return self.runtime if library is None else f"{self.runtime} with {library}"

    read = staticmethod(read_model_file)

    # -- description ---------------------------------------------------------------------------
    @functools.cached_property
    def labels(self) -> tuple[str, ...]:
        """Class names: edgekit's stored labels, else the standard metadata's labels file of the first output
        that has one fitting it (a detector's may be on its scores); read once, not per frame."""
        stored = tuple((self.metadata or {}).get("labels") or ())
        if stored or self.tflite_metadata is None:
            return stored
        for info in self.outputs:
            width = int(info.shape[-1]) if len(info.shape) else None
            found = standard_labels(self.tflite_metadata, self.content, self._position(info, "outputs"), width)
            if found:
                return found
        return ()

    def _position(self, info: TensorInfo, kind: str) -> int:
        """Where a tensor sits among the subgraph's inputs or outputs (the order the standard metadata keeps)."""
        order = getattr(self.view.first_subgraph(), kind)
        return order.index(info.index) if info.index in order else -1

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The keys of `predict`'s dict, in order; also the order of `invoke_raw`'s list."""
        return tuple(t.name for t in self.outputs)

    @property
    def preprocess(self) -> PreprocessSpec:
        """How images become the first input: the preprocessing stored at conversion, else the standard TFLite
        Metadata's normalisation, else raw-pixel defaults for the input's shape (`preprocess_source` says
        which, and a float input fed raw pixels is warned about once)."""
        spec = self.preprocessing_of(self.inputs[0])[0]
        self.say_preprocessing(self.inputs[0])
        return spec

    @property
    def preprocess_source(self) -> str:
        """Where `preprocess` comes from: "metadata" (edgekit's), "TFLite metadata" or "input-shape defaults"."""
        return self.preprocessing_of(self.inputs[0])[1]

    def preprocessing_of(self, info: TensorInfo) -> tuple[PreprocessSpec, str]:
        """(how images become input `info`, where that comes from); InputShapeError for an open size."""
        listed = {t.get("name"): t for t in (self.metadata or {}).get("inputs") or () if isinstance(t, dict)}
        stored = (listed.get(info.name) or {}).get("preprocessing") or \
            ((self.metadata or {}).get("preprocessing") if info is self.inputs[0] else None)
        if stored:
            return PreprocessSpec.from_dict(stored), "metadata"
        signature = info.shape_signature
        if any(d < 0 for d in signature[1:]):
            raise InputShapeError(f"{self._where}: the input size {list(signature)} is dynamic; images need a "
                                  "model with a fixed input size")
        standard = self._standard_spec(info)
        if standard is not None:
            return standard, "TFLite metadata"
        if info.quantized and np.isfinite(np.float32(1.0) / np.float32(info.scale)):
            # raw pixels are the values (uint8), or pixel - 128 (int8), as MediaPipe feeds them
            offset = 128 if info.dtype == np.int8 else 0
            return PreprocessSpec.for_input_shape(info.shape, mean=(float(info.zero_point + offset),),
                                                  std=(1.0 / info.scale,)), "input-shape defaults"
        return PreprocessSpec.for_input_shape(info.shape), "input-shape defaults"

    def _standard_spec(self, info: TensorInfo) -> PreprocessSpec | None:
        """The normalisation the standard TFLite Metadata gives input `info`; None where it gives none, or
        one that cannot be used (std 0, NaN, a count that fits no channel): the file's numbers, not the
        caller's, so a warning and the defaults rather than a usage error naming a parameter nobody passed."""
        standard = standard_input(self.tflite_metadata, self._position(info, "inputs"))
        if "mean" not in standard:
            return None
        try:
            if not np.all(np.isfinite([*standard["mean"], *standard["std"]])):
                raise UsageError("not finite numbers", param="std")
            return PreprocessSpec.for_input_shape(info.shape, mean=standard["mean"], std=standard["std"])
        except UsageError as exc:
            if not self._said_bad_standard:
                self._said_bad_standard = True
                log.warning("%s: the TFLite metadata's normalisation of input %r is unusable (mean %s, std %s: "
                            "%s); it is ignored", self._where, info.name, list(standard["mean"])[:4],
                            list(standard["std"])[:4], exc)
            return None

    def say_preprocessing(self, info: TensorInfo) -> None:
        """Warn, once per model, when images go into float input `info` as raw 0..255 pixels because nothing
        describes its normalisation. Called by what feeds images, after its own checks: a usage error stays
        the only line a command prints."""
        if self._said_raw or not np.issubdtype(info.dtype, np.floating):
            return
        try:
            if self.preprocessing_of(info)[1] != "input-shape defaults":
                return
        except InputShapeError:
            return
        self._said_raw = True
        log.warning("%s: no preprocessing stored (neither edgekit's metadata nor TFLite Metadata): images go in "
                    "as raw 0..255 pixels", self._where)

    def describe(self) -> dict[str, Any]:
        """What a log line or report needs to know about this model and where it runs."""
        return {
            "path": None if self.path is None else str(self.path),
            "size_bytes": self.size_bytes,
            "backend": self.backend.name,
            "backend_version": self.backend.version,
            "num_threads": self.num_threads,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "custom_ops": list(self.custom_ops),
            "accelerator": self.delegate.accelerator,
            "fallbacks": self.delegate.fallbacks,
            "mode": (self.metadata or {}).get("mode"),
        }

    # -- shapes --------------------------------------------------------------------------------
    def _check_shape(self, info: TensorInfo, shape: tuple[int, ...], *, batch: bool = True) -> None:
        """`shape` fits `info`: same rank, the written size on every fixed axis, >= 1 on open ones; the
        batch axis (the first) is left to the caller when `batch` is False."""
        want = tuple(None if s < 0 else d for d, s in zip(info.shape, info.shape_signature))
        ok = len(shape) == len(want) and all(
            (w is None and g >= 1) or g == w or (i == 0 and not batch) for i, (g, w) in enumerate(zip(shape, want)))
        if not ok:
            shown = "(" + ", ".join("?" if w is None else str(w) for w in want) + ")"
            raise InputShapeError(f"{self._where}: input {info.name!r} expects shape {shown}"
                                  f"{' (? = any size)' if None in want else ''}, got {tuple(shape)}")

    def _interpreter_for(self, shapes: Shapes) -> Runner:
        """The runner that takes inputs of `shapes` (call with the lock held): the model's own, or one
        resized to them, built on first use and kept (at most MAX_RESIZED)."""
        if shapes == self._shapes:
            if self._unsized:
                said = ", ".join(f"{i.name} {list(i.shape_signature)}" for i in self.inputs if i.open_dims)
                raise InputShapeError(f"{self._where}: the model takes inputs of open size ({said}) and does not "
                                      f"run at its written size {[list(s) for s in shapes]}: give inputs of a "
                                      "concrete size")
            return self.runner
        interp = self._resized.get(shapes)
        if interp is None:
            for info, shape in zip(self.inputs, shapes):
                self._check_shape(info, shape)
            if self.delegate.delegates:
                raise InputShapeError(f"{self._where}: with the {self.delegate.accelerator} delegate the model runs "
                                      f"at its written input shapes {list(self._shapes)} only, got {list(shapes)}; "
                                      "load it with delegate='cpu' to run other sizes")
            interp = self._resize({i.index: s for i, s in zip(self.inputs, shapes) if s != i.shape}, strict=True)
            if len(self._resized) >= MAX_RESIZED:
                self._resized.pop(next(iter(self._resized)))
            self._resized[shapes] = interp
        return interp

    def _resize(self, shapes: dict[int, tuple[int, ...]], *, strict: bool) -> Runner:
        """A new runner of this model (no delegate) with inputs resized to `shapes` (index -> shape)."""
        try:
            interp = self.backend.runner(model_content=self.content, num_threads=self.num_threads,
                                         resize=shapes, strict=strict)  # allocated once, resized
        except (ValueError, RuntimeError) as exc:
            raise InputShapeError(f"{self._where}: the model cannot run inputs of shape "
                                  f"{[list(s) for s in shapes.values()]}: {one_line(exc)}") from None
        return interp

    def batch_interpreter(self, samples: int, sample_shape: tuple[int, ...] | None = None) -> Runner | None:
        """A second runner of this model whose (single) input takes `samples` inputs at once, each of
        `sample_shape` (default: the written one; open axes may take other sizes), or None when the model
        cannot run batched: several inputs, a delegate, or shapes fixed inside the graph. Built once per
        size and kept."""
        key: Any = samples if sample_shape is None else (samples, tuple(int(d) for d in sample_shape))
        with self._lock:
            if key in self._batched:
                return self._batched[key]
        info = self.inputs[0]
        shape = (samples,) + (tuple(info.shape[1:]) if sample_shape is None else key[1])
        if sample_shape is not None:
            self._check_shape(info, (info.shape[0],) + key[1])
        interp: Runner | None = None
        if len(self.inputs) == 1 and self._batch == 1 and not self.delegate.delegates and samples > 1:
            try:  # strict=False: converters often write the batch axis as a fixed 1
                interp = self._resize({info.index: shape}, strict=False)
                if any(d["shape"][0] != samples for d in interp.output_details()):
                    interp = None  # an op reshapes the batch away: per-sample it stays
            except InputShapeError:
                interp = None
        with self._lock:
            return self._batched.setdefault(key, interp)

    # -- inference -----------------------------------------------------------------------------
    @property
    def lock(self) -> threading.Lock:
        """Held for every call into the model; hold it to use `runner` or `interpreter_for` directly."""
        return self._lock

    @property
    def unsized(self) -> bool:
        """The model has inputs of open size that do not run at their written size (1): give real sizes."""
        return self._unsized

    @property
    def where(self) -> str:
        """The file (or "model bytes") for messages."""
        return self._where

    def interpreter_for(self, shape: tuple[int, ...]) -> Runner:
        """The runner that takes a single input of `shape` (call with `lock` held)."""
        if shape == self._input_shape and not self._unsized:
            return self.runner
        return self._interpreter_for((shape,))

    def _invoke(self, runner: Runner, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The one path into the backend (call with the lock held): typed inputs in `inputs` order -> copies
        of the raw outputs in `outputs` order."""
        try:
            for index, x in zip(self._input_indices, arrays):
                runner.set(index, x)
            runner.invoke()
            return [runner.get(i) for i in self._output_indices]
        except (RuntimeError, ValueError) as exc:
            raise InvokeError(f"{self._where}: inference failed: {one_line(exc)}") from None

    def invoke_one(self, x: np.ndarray, interp: Runner | None = None) -> list[np.ndarray]:
        """`invoke_raw` for single-input models, with the least per-call overhead; `interp` may be a runner
        from `batch_interpreter`, with `x` holding that many stacked inputs. Raw outputs in `outputs` order."""
        with self._lock:
            return self._invoke(self.interpreter_for(x.shape) if interp is None else interp, (x,))

    def invoke_raw(self, inputs: Inputs) -> list[np.ndarray]:
        """Set already-typed inputs (a list in `inputs` order, or a dict by name), invoke, return copies of
        the raw outputs in `outputs` order (the copies make results safe to keep while other threads call
        the model). Inputs of other sizes on open axes resize the interpreter."""
        arrays = [np.asarray(x) for x in self._ordered(inputs, samples=False)]
        shapes = tuple(tuple(int(d) for d in x.shape) for x in arrays)
        with self._lock:
            return self._invoke(self._interpreter_for(shapes), arrays)

    def _ordered(self, x: Inputs, *, samples: bool = True) -> list[Any]:
        """The caller's inputs in `inputs` order: a dict by name (every name, no other), a list or tuple
        in order, or (`samples`) one array of samples when the model has one input."""
        names = self.input_names
        if isinstance(x, Mapping):
            missing = [n for n in names if n not in x]
            unknown = [k for k in x if k not in names]
            if missing or unknown:
                what = "; ".join(part for part in (
                    f"unknown input{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}" if unknown else "",
                    f"missing input{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}" if missing else "",
                ) if part)
                raise InputShapeError(f"{self._where}: {what}; the model takes {', '.join(map(repr, names))}")
            return [x[n] for n in names]
        if samples and len(names) == 1:
            return [x]
        if not samples and len(names) == 1 and isinstance(x, np.ndarray):
            return [x]
        if isinstance(x, (list, tuple)) and len(x) == len(names):
            return list(x)
        got = f"{len(x)} arrays" if isinstance(x, (list, tuple)) else f"one {type(x).__name__}"
        raise InputShapeError(f"{self._where}: the model takes {len(names)} inputs ({', '.join(map(repr, names))}): "
                              f"pass a dict name -> array, or a list in that order; got {got}")

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Float inputs (one batch per input, in `inputs` order, matching the model's batch size) -> float
        outputs in `outputs` order."""
        if len(inputs) != len(self.inputs):
            raise InputShapeError(f"model takes {len(self.inputs)} inputs, got {len(inputs)}")
        typed = []
        for info, x in zip(self.inputs, inputs):
            x = np.asarray(x)
            self._check_shape(info, tuple(x.shape))
            typed.append(quantize(x, info))
        raw = self.invoke_raw(typed)
        return [dequantize(r, o) for r, o in zip(raw, self.outputs)]

    def predict(self, x: Inputs) -> np.ndarray | dict[str, np.ndarray]:
        """Float outputs for every sample of float inputs, run sample by sample when the model's batch size
        is fixed at 1 (as converters write it), `batch` samples at a time when it is fixed at `batch`.

        One input: an array of samples; several: a dict name -> array (or a list in `inputs` order), every
        array with the same number of samples. Open axes take the samples' size. One output: an array;
        several: a dict name -> array in `outputs` order. Quantized tensors are (de)quantized here."""
        arrays = [np.asarray(a) for a in self._ordered(x)]
        if any(a.ndim == 0 for a in arrays):
            raise InputShapeError(f"{self._where}: inputs are arrays of samples; got a scalar")
        count = len(arrays[0])
        for info, a in zip(self.inputs, arrays):
            if len(a) != count:
                raise InputShapeError(f"{self._where}: input {info.name!r} has {len(a)} samples, "
                                      f"{self.inputs[0].name!r} has {count}")
            if tuple(a.shape[1:]) != tuple(info.shape[1:]) or info.open_dims:
                self._check_shape(info, tuple(a.shape), batch=False)
        step = self._batch if self._batch > 0 else 1
        if count % step:
            raise InputShapeError(f"batch of {count} is not a multiple of the model's batch {step}")
        typed = [quantize(a, info) for info, a in zip(self.inputs, arrays)]
        chunks = [self.invoke_raw([t[i : i + step] for t in typed]) for i in range(0, count, step)]
        outs = []
        for k, info in enumerate(self.outputs):
            if chunks:
                outs.append(dequantize(np.concatenate([c[k] for c in chunks], axis=0), info))
            else:
                outs.append(np.zeros((0,) + tuple(info.shape[1:]), np.float32))
        return outs[0] if len(outs) == 1 else dict(zip(self.output_names, outs))
