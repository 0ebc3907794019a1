"""Small .tflite files written with the schema's object API (no TensorFlow): one operator, or a few
subgraphs, with exactly the operands, types, quantization and options a test wants, hostile ones included.

    T = Tensor
    one_op("ADD", [T((1, 4)), -1], [T((1, 4))], "AddOptions")   # an ADD whose second operand is missing
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

_NP_TYPES = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "INT64": np.int64,
             "INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "BOOL": np.bool_}


@dataclass
class Tensor:
    shape: Sequence[int]
    type: str = "FLOAT32"
    data: Any = None  # a constant: an array (cast to `type`) or raw bytes
    scales: Sequence[float] | None = None  # quantization
    zero_points: Sequence[int] | None = None
    axis: int = 0
    name: str = ""
    signature: Sequence[int] | None = None  # shape_signature (-1 for an open dimension)


@dataclass
class Op:
    name: str  # BuiltinOperator name, or "CUSTOM:<code>"
    inputs: Sequence[Any]  # Tensor, an index into the subgraph's tensors, or -1
    outputs: Sequence[Any]
    options: str | None = None  # BuiltinOptions name
    set_options: dict = field(default_factory=dict)  # camelCase field -> value
    version: int = 1
    custom_options: bytes | None = None


def _schema():
    from ai_edge_litert import schema_py_generated as s

    return s


def _tensor_t(s, t: Tensor, buffer: int, index: int):
    out = s.TensorT()
    out.name = t.name or f"t{index}"
    out.shape = list(t.shape)
    if t.signature is not None:
        out.shapeSignature = list(t.signature)
    out.type = getattr(s.TensorType, t.type)
    out.buffer = buffer
    if t.scales is not None:
        out.quantization = s.QuantizationParametersT()
        out.quantization.scale = list(t.scales)
        out.quantization.zeroPoint = list(t.zero_points if t.zero_points is not None else [0] * len(t.scales))
        out.quantization.quantizedDimension = t.axis
    return out


def _buffer(s, t: Tensor | None):
    b = s.BufferT()
    if t is not None and t.data is not None:
        raw = t.data if isinstance(t.data, (bytes, bytearray)) else \
            np.ascontiguousarray(np.asarray(t.data, _NP_TYPES.get(t.type, np.float32))).tobytes()
        b.data = np.frombuffer(bytes(raw), np.uint8)
    return b


class _Graph:
    """Collects a subgraph's tensors (and the model's buffers) as operators name them."""

    def __init__(self, s, buffers: list):
        self.s, self.buffers, self.tensors = s, buffers, []

    def add(self, t: Any) -> int:
        if isinstance(t, int):
            return t
        self.buffers.append(_buffer(self.s, t))
        self.tensors.append(_tensor_t(self.s, t, len(self.buffers) - 1, len(self.tensors)))
        return len(self.tensors) - 1


def model(subgraphs: Sequence[Sequence[Op]], *, graph_inputs: Sequence[Sequence[int]] | None = None,
          graph_outputs: Sequence[Sequence[int]] | None = None, signatures: Sequence[dict] = (),
          metadata: dict[str, bytes] | None = None) -> bytes:
    """A model of several subgraphs. Unless given, a subgraph's inputs are its non-constant tensors that
    no operator writes, its outputs the tensors no operator reads. A signature is
    {"key": str, "subgraph": int, "inputs": {name: tensor}, "outputs": {name: tensor}}."""
    import flatbuffers

    s = _schema()
    buffers = [s.BufferT()]
    codes: list = []
    m = s.ModelT()
    m.version, m.description, m.subgraphs = 3, "edgekit test model", []
    for g_index, ops in enumerate(subgraphs):
        g = _Graph(s, buffers)
        sub = s.SubGraphT()
        sub.name, sub.operators = f"subgraph{g_index}", []
        written, read = set(), set()
        for op in ops:
            o = s.OperatorT()
            o.opcodeIndex = _code(s, codes, op)
            o.inputs = [g.add(t) for t in op.inputs]
            o.outputs = [g.add(t) for t in op.outputs]
            read.update(i for i in o.inputs if i >= 0)
            written.update(i for i in o.outputs if i >= 0)
            if op.options:
                o.builtinOptionsType = getattr(s.BuiltinOptions, op.options)
                o.builtinOptions = getattr(s, op.options + "T")()
                for key, value in op.set_options.items():
                    setattr(o.builtinOptions, key, value)
            if op.custom_options is not None:
                o.customOptions = list(op.custom_options)
            sub.operators.append(o)
        sub.tensors = g.tensors
        const = {i for i, t in enumerate(g.tensors) if getattr(buffers[t.buffer], "data", None) is not None}
        sub.inputs = list(graph_inputs[g_index]) if graph_inputs else \
            [i for i in range(len(g.tensors)) if i not in written and i not in const]
        sub.outputs = list(graph_outputs[g_index]) if graph_outputs else \
            [i for i in range(len(g.tensors)) if i in written and i not in read]
        m.subgraphs.append(sub)
    m.operatorCodes, m.buffers = codes, buffers
    m.signatureDefs = [_signature(s, sig) for sig in signatures]
    if metadata:
        m.metadata = []
        for name, data in metadata.items():
            b = s.BufferT()
            b.data = np.frombuffer(data, np.uint8)
            m.buffers.append(b)
            entry = s.MetadataT()
            entry.name, entry.buffer = name, len(m.buffers) - 1
            m.metadata.append(entry)
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _code(s, codes: list, op: Op) -> int:
    c = s.OperatorCodeT()
    if op.name.startswith("CUSTOM:"):
        c.builtinCode = c.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
        c.customCode = op.name.split(":", 1)[1]
    else:
        code = getattr(s.BuiltinOperator, op.name)
        c.builtinCode, c.deprecatedBuiltinCode = code, min(code, 127)
    c.version = op.version
    codes.append(c)
    return len(codes) - 1


def _signature(s, sig: dict):
    d = s.SignatureDefT()
    d.signatureKey, d.subgraphIndex = sig.get("key", "serving_default"), sig.get("subgraph", 0)
    d.inputs, d.outputs = [], []
    for kind in ("inputs", "outputs"):
        for name, index in sig.get(kind, {}).items():
            t = s.TensorMapT()
            t.name, t.tensorIndex = name, index
            getattr(d, kind).append(t)
    return d


def one_op(name: str, inputs: Sequence[Any], outputs: Sequence[Any], options: str | None = None, *,
           version: int = 1, **set_options) -> bytes:
    """A model of one operator; inputs and outputs are Tensors or -1."""
    return model([[Op(name, inputs, outputs, options, set_options, version)]])
