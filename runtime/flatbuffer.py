"""One read-only view of a .tflite flatbuffer, parsed once and shared by every reader in the runtime.

The structure (op codes, subgraphs, tensors, operators, buffers, metadata) is read with `struct` and
numpy at the schema's fixed field ids, so metadata and custom-op names need nothing else; names of
enums (ops, tensor types, options) and the builtin options tables come from the generated schema
module (`runtime.schema`) when first asked for. Each part is parsed on first use and kept: preflight,
metadata, inspect, the GPU rules and sparsity can all be handed the same `ModelView`.

Corrupt input raises ModelFormatError ("<where>: flatbuffer is corrupt (...)"); a vector longer than
the file is refused before it is read, so a flipped length byte cannot make a reader loop for ever.
"""

from __future__ import annotations

import contextlib
import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError, ModelFormatError, one_line

FILE_IDENTIFIER = b"TFL3"
MAX_MODEL_BYTES = 4 * 1024**3


@contextlib.contextmanager
def corrupt_as_format_error(where: str = "model") -> Iterator[None]:
    """For a reader of a whole model (inspect, preflight, the GPU rules, sparsity): anything its reads raise
    on a corrupt index (the generated accessors raise anything) becomes one ModelFormatError line; edgekit's
    own errors (a missing schema module: MissingDependencyError) pass through as they are."""
    try:
        yield
    except EdgekitError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelFormatError(f"{where}: flatbuffer is corrupt ({type(exc).__name__}: {one_line(exc)})") from None


def read_model_file(path) -> bytes:
    """A .tflite's bytes: a regular file within MAX_MODEL_BYTES (no FIFO, device or symlink loop: see
    edgekit.files)."""
    from edgekit.files import read_regular

    return read_regular(path, limit=MAX_MODEL_BYTES, error=ModelFormatError)

# numpy dtype of a TensorType name (types numpy has no dtype for are absent)
NUMPY_TYPES: dict[str, type[np.generic]] = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64, "INT8": np.int8, "UINT8": np.uint8,
    "INT16": np.int16, "UINT16": np.uint16, "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64,
    "UINT64": np.uint64, "BOOL": np.bool_,
}


def constant_array(raw: bytes | memoryview | None, type_name: str | None, shape) -> np.ndarray | None:
    """A constant tensor's bytes as an array of its TensorType `type_name` in its `shape` (a copy); None
    where there are no bytes, the type has no numpy kind, or the bytes do not fill the shape."""
    kind = NUMPY_TYPES.get(type_name or "")
    dims = [int(d) for d in (shape if shape is not None else ())]
    if not raw or kind is None or len(raw) != int(np.prod(dims, dtype=np.int64)) * np.dtype(kind).itemsize:
        return None
    return np.frombuffer(raw, kind).reshape(dims).copy()


def tensor_values(model, tensor) -> np.ndarray | None:
    """A constant tensor's values in a model unpacked by `schema.unpack` (`ModelT`; `tensor` one of its
    `TensorT`s): `constant_array` of its buffer's bytes, or None (also for the offset/size form of files over
    2 GB, whose bytes `ModelT` does not hold: `ModelView.constant` reads those)."""
    data = model.buffers[tensor.buffer].data if 0 < tensor.buffer < len(model.buffers) else None
    raw = None if data is None else np.asarray(data, np.uint8).tobytes()
    return constant_array(raw, _enum("TensorType").get(tensor.type), tensor.shape)


# field ids of the TFLite schema (tflite/schema/schema.fbs); they never change once published
_MODEL = {"version": 0, "operator_codes": 1, "subgraphs": 2, "buffers": 4, "metadata": 6, "signature_defs": 7}
_OPCODE = {"deprecated_builtin_code": 0, "custom_code": 1, "version": 2, "builtin_code": 3}
_SUBGRAPH = {"tensors": 0, "inputs": 1, "outputs": 2, "operators": 3}
_TENSOR = {"shape": 0, "type": 1, "buffer": 2, "name": 3, "quantization": 4, "is_variable": 5, "sparsity": 6,
           "shape_signature": 7, "external_buffer": 10}
_QUANT = {"scale": 2, "zero_point": 3, "quantized_dimension": 6}
_OPERATOR = {"opcode_index": 0, "inputs": 1, "outputs": 2, "builtin_options_type": 3, "builtin_options": 4,
             "custom_options": 5, "builtin_options_2_type": 11, "builtin_options_2": 12}
_BUFFER = {"data": 0, "offset": 1, "size": 2}
_METADATA = {"name": 0, "buffer": 1}
_SIGNATURE = {"inputs": 0, "outputs": 1, "signature_key": 2, "subgraph_index": 4}
_TENSOR_MAP = {"name": 0, "tensor_index": 1}

_I8, _U8, _I32, _U32, _U64 = (struct.Struct(f) for f in ("<b", "<B", "<i", "<I", "<Q"))
_U16 = struct.Struct("<H")
_LOW_LEVEL = (struct.error, ValueError, IndexError, OverflowError)


def check_identifier(buf: bytes, where: str = "model") -> None:
    """Cheap preflight: a .tflite is at least a header long and says TFL3 at bytes 4..8."""
    if len(buf) < 16 or bytes(buf[4:8]) != FILE_IDENTIFIER:
        raise ModelFormatError(f"{where} is not a TFLite flatbuffer (no 'TFL3' identifier)")


@functools.cache
def _enum(name: str) -> dict[int, str]:
    from edgekit.runtime.schema import enum_names, schema_module

    return enum_names(getattr(schema_module(), name))


class _Reader:
    """Flatbuffer tables over a bytes object: vtables, scalars, vectors, strings, sub-tables."""

    def __init__(self, data: bytes):
        self.data = data
        # what reads may build (items and copied bytes): a file's vectors may share one table or string,
        # so a small file could otherwise declare a quadratic graph (a million operators, each with the same
        # million inputs); a well-formed file reads each part once
        self.budget = 2 * len(data) + (64 << 20)

    def spend(self, units: int) -> None:
        self.budget -= units
        if self.budget < 0:
            raise ValueError("it declares far more than its bytes hold (vectors sharing their parts)")

    def _slot(self, table: int, field_id: int) -> int | None:
        vtable = table - _I32.unpack_from(self.data, table)[0]
        if vtable < 0:
            raise ValueError(f"vtable offset {vtable} is before the start of the file")
        slot = 4 + 2 * field_id
        if slot >= _U16.unpack_from(self.data, vtable)[0]:
            return None
        rel = _U16.unpack_from(self.data, vtable + slot)[0]
        return table + rel if rel else None

    def scalar(self, table: int, field_id: int, kind: struct.Struct, default: int = 0) -> int:
        pos = self._slot(table, field_id)
        return kind.unpack_from(self.data, pos)[0] if pos is not None else default

    def table(self, table: int, field_id: int) -> int | None:
        pos = self._slot(table, field_id)
        return None if pos is None else pos + _U32.unpack_from(self.data, pos)[0]

    def vector(self, table: int, field_id: int, itemsize: int) -> tuple[int, int]:
        """(start of the elements, count) of a vector field; (0, 0) when absent."""
        pos = self._slot(table, field_id)
        if pos is None:
            return 0, 0
        vec = pos + _U32.unpack_from(self.data, pos)[0]
        count = _U32.unpack_from(self.data, vec)[0]
        if vec + 4 + count * itemsize > len(self.data):
            raise ValueError(f"a vector of {count} entries runs past the end of the file")
        return vec + 4, count

    def numbers(self, table: int, field_id: int, dtype: str) -> np.ndarray:
        size = np.dtype(dtype).itemsize
        start, count = self.vector(table, field_id, size)
        self.spend(size * count)  # a view, but what reads it works through every item
        return np.frombuffer(self.data, dtype, count, start) if count else np.zeros(0, dtype)

    def ints(self, table: int, field_id: int) -> tuple[int, ...]:
        return tuple(self.numbers(table, field_id, "<i4").tolist())

    def tables(self, table: int, field_id: int) -> list[int]:
        start, count = self.vector(table, field_id, 4)
        if not count:
            return []
        self.spend(4 * count)
        rel = np.frombuffer(self.data, "<u4", count, start).astype(np.int64)
        return (start + 4 * np.arange(count, dtype=np.int64) + rel).tolist()

    def raw(self, table: int, field_id: int) -> bytes | None:
        """A string or a byte vector; None when absent."""
        if self._slot(table, field_id) is None:
            return None
        start, count = self.vector(table, field_id, 1)
        self.spend(count)
        return self.data[start : start + count]


@dataclass(frozen=True)
class OpCode:
    """One entry of the model's operator_codes, resolved: `name` is the BuiltinOperator name (the larger
    of builtin_code and deprecated_builtin_code, as GetBuiltinCode does; "BUILTIN_<n>" when unknown)."""

    builtin: int
    name: str
    custom_code: str  # "" when none
    version: int

    @property
    def is_custom(self) -> bool:
        return self.name == "CUSTOM"

    @property
    def display(self) -> str:
        """What a person calls the op: the custom code of a custom op, else the builtin name."""
        return (self.custom_code or "CUSTOM") if self.is_custom else self.name


@dataclass(frozen=True, eq=False)
class Quantization:
    scales: np.ndarray  # float32, empty when the tensor has no scale
    zero_points: np.ndarray  # int64, empty when absent
    axis: int  # quantized_dimension


@dataclass(frozen=True, eq=False)
class TensorView:
    index: int
    name: str
    type: int  # TensorType value
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    buffer: int
    quantization: Quantization | None
    is_variable: bool
    sparse: bool  # has a sparsity table
    external_buffer: int

    @property
    def type_name(self) -> str | None:
        """TensorType name ("FLOAT32", ...), None for a value the schema does not know."""
        return _enum("TensorType").get(self.type)


@dataclass(frozen=True, eq=False)
class OperatorView:
    index: int
    opcode_index: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options_type: int  # BuiltinOptions value
    custom_options: bytes  # the in-file custom_options vector (b"" when absent)
    _options_table: int | None = field(repr=False)
    _data: bytes = field(repr=False)
    options_2_type: int = 0  # BuiltinOptions2 value (the StableHLO ops' options)
    _options_2_table: int | None = field(default=None, repr=False)

    @property
    def options_type_name(self) -> str | None:
        """BuiltinOptions name ("Conv2DOptions", ...), None for a value the schema does not know."""
        return _enum("BuiltinOptions").get(self.options_type)

    def options(self, type_name: str | None = None) -> Any | None:
        """The builtin options table as the generated class `type_name` (default: the one the op names),
        or None when the op has no options table."""
        from edgekit.runtime.schema import schema_module

        type_name = type_name or self.options_type_name
        if self._options_table is None or not type_name or type_name == "NONE":
            return None
        options = getattr(schema_module(), type_name)()
        options.Init(self._data, self._options_table)
        return options

    @property
    def options_2_type_name(self) -> str | None:
        """BuiltinOptions2 name (the StableHLO ops' options), None for a value the schema does not know."""
        return _enum("BuiltinOptions2").get(self.options_2_type)

    def options_2(self) -> Any | None:
        """The second builtin options table (BuiltinOptions2: the StableHLO ops') as its generated class, or None."""
        from edgekit.runtime.schema import schema_module

        type_name = self.options_2_type_name
        if self._options_2_table is None or not type_name or type_name == "NONE":
            return None
        options = getattr(schema_module(), type_name)()
        options.Init(self._data, self._options_2_table)
        return options


@dataclass(frozen=True)
class SignatureView:
    """One signature: its key, the subgraph it runs, and {name: tensor index} of its inputs and outputs."""

    key: str
    subgraph: int
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class BufferRef:
    """One entry of the model's buffers: in-file `data`, or the `offset`/`size` form of models over 2 GB."""

    data: memoryview
    offset: int
    size: int


class SubgraphView:
    """Tensors, operators and I/O of one subgraph, each parsed on first use."""

    def __init__(self, view: ModelView, index: int, table: int):
        self._view, self.index, self._table = view, index, table

    @functools.cached_property
    def tensors(self) -> tuple[TensorView, ...]:
        with self._view.reading():
            r = self._view._r
            return tuple(_tensor(r, i, t) for i, t in enumerate(r.tables(self._table, _SUBGRAPH["tensors"])))

    @functools.cached_property
    def inputs(self) -> tuple[int, ...]:
        with self._view.reading():
            return self._view._r.ints(self._table, _SUBGRAPH["inputs"])

    @functools.cached_property
    def outputs(self) -> tuple[int, ...]:
        with self._view.reading():
            return self._view._r.ints(self._table, _SUBGRAPH["outputs"])

    @functools.cached_property
    def operators(self) -> tuple[OperatorView, ...]:
        with self._view.reading():
            r = self._view._r
            return tuple(_operator(r, i, o) for i, o in enumerate(r.tables(self._table, _SUBGRAPH["operators"])))


def _tensor(r: _Reader, index: int, t: int) -> TensorView:
    q = r.table(t, _TENSOR["quantization"])
    quant = None if q is None else Quantization(
        r.numbers(q, _QUANT["scale"], "<f4"), r.numbers(q, _QUANT["zero_point"], "<i8"),
        r.scalar(q, _QUANT["quantized_dimension"], _I32))
    return TensorView(
        index=index, name=(r.raw(t, _TENSOR["name"]) or b"").decode("utf-8", "replace"),
        type=r.scalar(t, _TENSOR["type"], _I8), shape=r.ints(t, _TENSOR["shape"]),
        shape_signature=r.ints(t, _TENSOR["shape_signature"]), buffer=r.scalar(t, _TENSOR["buffer"], _U32),
        quantization=quant, is_variable=bool(r.scalar(t, _TENSOR["is_variable"], _U8)),
        sparse=r.table(t, _TENSOR["sparsity"]) is not None,
        external_buffer=r.scalar(t, _TENSOR["external_buffer"], _U32))


def _operator(r: _Reader, index: int, o: int) -> OperatorView:
    return OperatorView(
        index=index, opcode_index=r.scalar(o, _OPERATOR["opcode_index"], _U32),
        inputs=r.ints(o, _OPERATOR["inputs"]), outputs=r.ints(o, _OPERATOR["outputs"]),
        options_type=r.scalar(o, _OPERATOR["builtin_options_type"], _U8),
        custom_options=r.raw(o, _OPERATOR["custom_options"]) or b"",
        _options_table=r.table(o, _OPERATOR["builtin_options"]), _data=r.data,
        options_2_type=r.scalar(o, _OPERATOR["builtin_options_2_type"], _U8),
        _options_2_table=r.table(o, _OPERATOR["builtin_options_2"]))


class ModelView:
    """A .tflite parsed once: checked on construction (identifier, root offset), the rest on first use.

    `ModelView.of(model)` accepts bytes or an existing view, so every reader can take either."""

    def __init__(self, buf: bytes, where: str = "model"):
        check_identifier(buf, where)
        self.data = buf if isinstance(buf, bytes) else bytes(buf)
        self.where = where
        self._r = _Reader(self.data)
        self._buffers: dict[int, BufferRef] = {}
        self.root = _U32.unpack_from(self.data, 0)[0]
        if self.root + 4 > len(self.data):
            raise ModelFormatError(f"{where}: root table offset {self.root} is past the end of the file")

    @classmethod
    def of(cls, model: bytes | ModelView, where: str = "model") -> ModelView:
        return model if isinstance(model, ModelView) else cls(model, where)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Low-level failures of the flatbuffer reads inside become one-line ModelFormatErrors."""
        try:
            yield
        except _LOW_LEVEL as exc:
            raise ModelFormatError(f"{self.where}: flatbuffer is corrupt ({type(exc).__name__}: "
                                   f"{one_line(exc)})") from None

    @functools.cached_property
    def version(self) -> int:
        with self.reading():
            return self._r.scalar(self.root, _MODEL["version"], _U32)

    @functools.cached_property
    def _code_tables(self) -> list[int]:
        with self.reading():
            return self._r.tables(self.root, _MODEL["operator_codes"])

    @functools.cached_property
    def custom_codes(self) -> tuple[str, ...]:
        """The custom_code of each operator code ("" when none); needs no schema module."""
        with self.reading():
            return tuple((self._r.raw(c, _OPCODE["custom_code"]) or b"").decode("utf-8", "replace")
                         for c in self._code_tables)

    @functools.cached_property
    def op_codes(self) -> tuple[OpCode, ...]:
        names = _enum("BuiltinOperator")
        codes = []
        with self.reading():
            for c, custom in zip(self._code_tables, self.custom_codes):
                builtin = max(self._r.scalar(c, _OPCODE["builtin_code"], _I32),
                              self._r.scalar(c, _OPCODE["deprecated_builtin_code"], _I8))
                codes.append(OpCode(builtin, names.get(builtin, f"BUILTIN_{builtin}"), custom,
                                    self._r.scalar(c, _OPCODE["version"], _I32, default=1)))
        return tuple(codes)

    @functools.cached_property
    def subgraphs(self) -> tuple[SubgraphView, ...]:
        with self.reading():
            return tuple(SubgraphView(self, i, t)
                         for i, t in enumerate(self._r.tables(self.root, _MODEL["subgraphs"])))

    def first_subgraph(self) -> SubgraphView:
        if not self.subgraphs:
            raise ModelFormatError(f"{self.where}: has no subgraph")
        return self.subgraphs[0]

    def op_name(self, op: OperatorView) -> str:
        """The display name of an operator's code (IndexError for an op code past the list)."""
        return self.op_codes[op.opcode_index].display

    @functools.cached_property
    def _buffer_tables(self) -> list[int]:
        with self.reading():
            return self._r.tables(self.root, _MODEL["buffers"])

    @property
    def buffer_count(self) -> int:
        return len(self._buffer_tables)

    def buffer(self, index: int) -> BufferRef:
        """Entry `index` of the buffers list (IndexError past its end)."""
        if index not in self._buffers:
            b = self._buffer_tables[index]
            with self.reading():
                start, count = self._r.vector(b, _BUFFER["data"], 1)
                self._buffers[index] = BufferRef(memoryview(self.data)[start : start + count],
                                                 self._r.scalar(b, _BUFFER["offset"], _U64),
                                                 self._r.scalar(b, _BUFFER["size"], _U64))
        return self._buffers[index]

    def buffer_bytes(self, index: int) -> memoryview | None:
        """The bytes of buffer `index`, from the file or from its offset/size form; None for buffer 0 (the
        empty sentinel), an index past the list, or a buffer with no bytes."""
        if index <= 0 or index >= self.buffer_count:
            return None
        b = self.buffer(index)
        if len(b.data):
            return b.data
        if b.offset > 1 and b.size:
            if b.offset + b.size > len(self.data):
                raise ModelFormatError(f"{self.where}: buffer {index} points past the end of the file")
            return memoryview(self.data)[b.offset : b.offset + b.size]
        return None

    def constant(self, tensor: TensorView) -> np.ndarray | None:
        """A constant tensor's values (`constant_array` of its buffer's bytes), or None."""
        return constant_array(self.buffer_bytes(tensor.buffer), tensor.type_name, tensor.shape)

    @functools.cached_property
    def signatures(self) -> tuple[SignatureView, ...]:
        """The model's signature defs, as written (indices unchecked: preflight checks them)."""
        r = self._r

        def names(table: int, field_id: int) -> tuple[tuple[str, int], ...]:
            return tuple(((r.raw(t, _TENSOR_MAP["name"]) or b"").decode("utf-8", "replace"),
                          r.scalar(t, _TENSOR_MAP["tensor_index"], _U32)) for t in r.tables(table, field_id))

        with self.reading():
            return tuple(SignatureView((r.raw(d, _SIGNATURE["signature_key"]) or b"").decode("utf-8", "replace"),
                                       r.scalar(d, _SIGNATURE["subgraph_index"], _U32),
                                       names(d, _SIGNATURE["inputs"]), names(d, _SIGNATURE["outputs"]))
                         for d in r.tables(self.root, _MODEL["signature_defs"]))

    @functools.cached_property
    def metadata_names(self) -> tuple[str, ...]:
        """The names of the metadata entries, in file order, repeats included."""
        with self.reading():
            return tuple((self._r.raw(e, _METADATA["name"]) or b"").decode("utf-8", "replace")
                         for e in self._r.tables(self.root, _MODEL["metadata"]))

    @functools.cached_property
    def metadata(self) -> dict[str, bytes]:
        """The metadata entries as {name: bytes}; an entry naming a buffer past the list is left out."""
        out: dict[str, bytes] = {}
        with self.reading():
            for entry in self._r.tables(self.root, _MODEL["metadata"]):
                name = (self._r.raw(entry, _METADATA["name"]) or b"").decode("utf-8", "replace")
                index = self._r.scalar(entry, _METADATA["buffer"], _U32)
                if index < self.buffer_count:
                    data = self.buffer_bytes(index)
                    self._r.spend(0 if data is None else len(data))
                    out[name] = bytes(data) if data is not None else b""
        return out
