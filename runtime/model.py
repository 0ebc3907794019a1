"""`Model`: one .tflite, its edgekit metadata, and float-in/float-out inference over LiteRT."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import InputShapeError, InvokeError, ModelFormatError, one_line
from edgekit.runtime.backend import Backend, get_backend
from edgekit.runtime.delegates import DelegateChoice, choose
from edgekit.runtime.flatbuffer import ModelView
from edgekit.runtime.metadata import read_custom_op_names, read_edgekit_metadata
from edgekit.runtime.preflight import validate
from edgekit.runtime.preprocess import PreprocessSpec
from edgekit.runtime.quant import dequantize, quantize

__all__ = ["Model", "TensorInfo", "dequantize", "quantize"]

MAX_MODEL_BYTES = 4 * 1024**3


@dataclass(frozen=True)
class TensorInfo:
    name: str
    index: int
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: float
    zero_point: int
    quantized: bool = False  # an integer tensor with a scale: values are (q - zero_point) * scale
    signature: tuple[int, ...] = ()  # the shape with -1 where a dimension is dynamic

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantized", self.scale != 0.0 and np.issubdtype(self.dtype, np.integer))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": np.dtype(self.dtype).name,
            "scale": self.scale,
            "zero_point": self.zero_point,
        }


def _tensor_info(d: dict[str, Any]) -> TensorInfo:
    scale, zp = d.get("quantization", (0.0, 0))
    shape = tuple(int(s) for s in d["shape"])
    signature = tuple(int(s) for s in d.get("shape_signature", shape))
    return TensorInfo(d["name"], d["index"], shape, np.dtype(d["dtype"]), float(scale), int(zp),
                      signature=signature)


class Model:
    """A loaded .tflite. Thread-safe: calls on one Model are serialised by a lock.

    >>> m = Model("digits.int8.tflite")
    >>> probs = m.predict(batch_of_float_inputs)      # quantizes in, dequantizes out
    """

    def __init__(self, source: str | Path | bytes, *, num_threads: int | None = None,
                 backend: str | None = None, delegate: str | None = None):
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.path: Path | None = None
            content = bytes(source)
            where = "model bytes"
        else:
            self.path = Path(source)
            where = str(self.path)
            content = self._read(self.path)
        self.view = ModelView(content, where)  # parsed once: metadata, custom ops and the preflight read it
        self.content = content
        self.size_bytes = len(content)
        try:
            self.metadata: dict[str, Any] | None = read_edgekit_metadata(self.view)
            self.custom_ops: tuple[str, ...] = read_custom_op_names(self.view)
        except ModelFormatError as exc:
            raise ModelFormatError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
        validate(self.view, where)  # values that crash the native interpreter become errors here
        self.backend: Backend = get_backend(backend)
        self.num_threads = num_threads
        hints = (self.metadata or {}).get("delegates")
        self.delegate: DelegateChoice = choose(hints, delegate, self.backend.load_delegate)
        try:
            self.interpreter = self.backend.interpreter(model_content=content, num_threads=num_threads,
                                                        delegates=self.delegate.delegates)
            self.inputs = tuple(_tensor_info(d) for d in self.interpreter.get_input_details())
            self.outputs = tuple(_tensor_info(d) for d in self.interpreter.get_output_details())
        except (ValueError, RuntimeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise ModelFormatError(f"{where}: the interpreter cannot load it: {one_line(exc)}") from None
        if not self.inputs or not self.outputs:
            raise ModelFormatError(f"{where}: the model has no inputs or no outputs")
        self._lock = threading.Lock()
        self._where = where
        self._input_index = self.inputs[0].index if self.inputs else -1
        self._output_indices = tuple(o.index for o in self.outputs)
        self._batch = self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1
        self._batched: dict[int, Any] = {}  # samples -> interpreter resized to take them at once (or None)

    @staticmethod
    def _read(path: Path) -> bytes:
        if path.is_dir():
            raise ModelFormatError(f"{path}: is a folder, not a .tflite file")
        try:
            size = path.stat().st_size
        except OSError:
            raise ModelFormatError(f"{path}: no such file") from None
        if size > MAX_MODEL_BYTES:
            raise ModelFormatError(f"{path}: {size} bytes is larger than any TFLite flatbuffer can be")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ModelFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None

    # -- description ---------------------------------------------------------------------------
    @property
    def labels(self) -> tuple[str, ...]:
        return tuple((self.metadata or {}).get("labels") or ())

    @property
    def preprocess(self) -> PreprocessSpec:
        """The preprocessing stored at conversion, or raw-pixel defaults for the input's shape."""
        stored = (self.metadata or {}).get("preprocessing")
        if stored:
            return PreprocessSpec.from_dict(stored)
        signature = self.inputs[0].signature or self.inputs[0].shape
        if any(d < 0 for d in signature[1:]):
            raise InputShapeError(f"{self._where}: the input size {list(signature)} is dynamic; images need a "
                                  "model with a fixed input size")
        return PreprocessSpec.for_input_shape(self.inputs[0].shape)

    # -- inference -----------------------------------------------------------------------------
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

    def invoke_one(self, x: np.ndarray, interp=None) -> list[np.ndarray]:
        """`invoke_raw` for single-input models, with the least per-call overhead; `interp` may be one
        from `batch_interpreter`, with `x` holding that many stacked inputs."""
        interp = interp or self.interpreter
        with self._lock:
            try:
                interp.set_tensor(self._input_index, x)
                interp.invoke()
                return [interp.get_tensor(i) for i in self._output_indices]
            except (RuntimeError, ValueError) as exc:
                raise InvokeError(f"{self._where}: inference failed: {one_line(exc)}") from None

    def batch_interpreter(self, samples: int):
        """A second interpreter of this model whose (single) input takes `samples` inputs at once, or None
        when the model cannot run batched: several inputs, a delegate, or shapes fixed inside the graph.
        Built once per size and kept."""
        if samples not in self._batched:
            interp = None
            if len(self.inputs) == 1 and self._batch == 1 and not self.delegate.delegates and samples > 1:
                shape = (samples,) + tuple(self.inputs[0].shape[1:])
                try:
                    interp = self.backend.interpreter(model_content=self.content, num_threads=self.num_threads,
                                                      resize={self._input_index: shape})
                    if any(d["shape"][0] != samples for d in interp.get_output_details()):
                        interp = None  # an op reshapes the batch away: per-sample it stays
                except (ValueError, RuntimeError):
                    interp = None
            self._batched[samples] = interp
        return self._batched[samples]

    def invoke_raw(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Set already-typed inputs, invoke, return copies of the raw outputs (the copies make
        results safe to keep while other threads call the model)."""
        interp = self.interpreter
        with self._lock:
            try:
                for info, x in zip(self.inputs, inputs):
                    interp.set_tensor(info.index, x)
                interp.invoke()
                return [interp.get_tensor(o.index) for o in self.outputs]
            except (RuntimeError, ValueError) as exc:
                raise InvokeError(f"{self._where}: inference failed: {one_line(exc)}") from None

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Float inputs (one batch per input, matching the model's batch size) -> float outputs."""
        if len(inputs) != len(self.inputs):
            raise InputShapeError(f"model takes {len(self.inputs)} inputs, got {len(inputs)}")
        typed = []
        for info, x in zip(self.inputs, inputs):
            x = np.asarray(x)
            if tuple(x.shape) != info.shape:
                raise InputShapeError(f"input {info.name!r} expects shape {info.shape}, got {tuple(x.shape)}")
            typed.append(quantize(x, info))
        raw = self.invoke_raw(typed)
        return [dequantize(r, o) for r, o in zip(raw, self.outputs)]

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """First output for every sample of a float batch of the first input, sample by sample
        when the model's batch size is fixed at 1 (as converters write it)."""
        batch = np.asarray(batch, np.float32)
        expected = self.inputs[0].shape[1:]
        if tuple(batch.shape[1:]) != expected:
            raise InputShapeError(f"model expects samples of shape {expected}, got {tuple(batch.shape[1:])}")
        step = self._batch if self._batch > 0 else 1
        if len(batch) % step:
            raise InputShapeError(f"batch of {len(batch)} is not a multiple of the model's batch {step}")
        outs = [self.run(batch[i : i + step])[0] for i in range(0, len(batch), step)]
        return np.concatenate(outs, axis=0) if outs else np.zeros((0,) + self.outputs[0].shape[1:], np.float32)
