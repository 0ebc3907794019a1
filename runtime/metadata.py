"""Read the metadata entries of a .tflite flatbuffer with nothing but the standard library.

A .tflite file is a flatbuffer whose root `Model` table holds `buffers` (field 4) and `metadata`
(field 6), a list of `(name, buffer index)` pairs. edgekit stores one JSON entry named
`edgekit`; TFLite's own converter stores others (`min_runtime_version`, ...). Reading them here
keeps the runtime free of TensorFlow, of the generated schema and of the flatbuffers package.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from edgekit.errors import ModelFormatError

EDGEKIT_KEY = "edgekit"
FILE_IDENTIFIER = b"TFL3"

_MODEL_OPERATOR_CODES = 1
_MODEL_SUBGRAPHS = 2
_SUBGRAPH_OPERATORS = 3
_OPERATOR_OPCODE_INDEX = 0
_OPERATOR_OUTPUTS = 2
_MODEL_BUFFERS = 4
_MODEL_METADATA = 6
_METADATA_NAME = 0
_METADATA_BUFFER = 1
_OPCODE_CUSTOM = 1
_BUFFER_DATA = 0
_BUFFER_OFFSET = 1
_BUFFER_SIZE = 2


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)

    def _u32(self, pos: int) -> int:
        return struct.unpack_from("<I", self.buf, pos)[0]

    def _field_pos(self, table: int, field: int) -> int | None:
        vtable = table - struct.unpack_from("<i", self.buf, table)[0]
        vt_size = struct.unpack_from("<H", self.buf, vtable)[0]
        slot = 4 + 2 * field
        if slot + 2 > vt_size:
            return None
        rel = struct.unpack_from("<H", self.buf, vtable + slot)[0]
        return table + rel if rel else None

    def _deref(self, pos: int) -> int:
        return pos + self._u32(pos)

    def vector(self, table: int, field: int) -> tuple[int, int]:
        """(start of elements, length) of a vector field, (0, 0) when absent."""
        pos = self._field_pos(table, field)
        if pos is None:
            return 0, 0
        vec = self._deref(pos)
        return vec + 4, self._u32(vec)

    def tables(self, table: int, field: int) -> list[int]:
        start, n = self.vector(table, field)
        return [self._deref(start + 4 * i) for i in range(n)]

    def ints(self, table: int, field: int) -> list[int]:
        start, n = self.vector(table, field)
        return list(struct.unpack_from(f"<{n}i", self.buf, start)) if n else []

    def string(self, table: int, field: int) -> str:
        start, n = self.vector(table, field)
        return bytes(self.buf[start : start + n]).decode("utf-8", "replace")

    def scalar(self, table: int, field: int, fmt: str) -> int:
        pos = self._field_pos(table, field)
        return struct.unpack_from(fmt, self.buf, pos)[0] if pos is not None else 0


def check_identifier(buf: bytes, where: str = "model") -> None:
    """Cheap preflight: a .tflite is at least a header long and says TFL3 at bytes 4..8."""
    if len(buf) < 16 or bytes(buf[4:8]) != FILE_IDENTIFIER:
        raise ModelFormatError(f"{where} is not a TFLite flatbuffer (no 'TFL3' identifier)")


def read_metadata_entries(buf: bytes) -> dict[str, bytes]:
    """All metadata entries of a .tflite as {name: raw bytes}."""
    check_identifier(buf)
    try:
        r = _Reader(buf)
        root = r._deref(0)
        buffers = r.tables(root, _MODEL_BUFFERS)
        out: dict[str, bytes] = {}
        for entry in r.tables(root, _MODEL_METADATA):
            name = r.string(entry, _METADATA_NAME)
            index = r.scalar(entry, _METADATA_BUFFER, "<I")
            if index >= len(buffers):
                continue
            b = buffers[index]
            start, n = r.vector(b, _BUFFER_DATA)
            if n:
                out[name] = bytes(r.buf[start : start + n])
                continue
            offset = r.scalar(b, _BUFFER_OFFSET, "<Q")
            size = r.scalar(b, _BUFFER_SIZE, "<Q")
            out[name] = bytes(r.buf[offset : offset + size]) if offset > 1 else b""
        return out
    except (struct.error, IndexError) as exc:
        raise ModelFormatError(f"model flatbuffer is truncated or corrupt ({exc})") from None


def read_edgekit_metadata(buf: bytes) -> dict[str, Any] | None:
    """The edgekit JSON entry of a .tflite, or None when the file has none."""
    raw = read_metadata_entries(buf).get(EDGEKIT_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"edgekit metadata is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ModelFormatError("edgekit metadata is not a JSON object")
    return value


def read_custom_op_names(buf: bytes) -> tuple[str, ...]:
    """Names of the custom ops a model uses (e.g. "TFLite_Detection_PostProcess")."""
    check_identifier(buf)
    try:
        r = _Reader(buf)
        root = r._deref(0)
        names = [r.string(code, _OPCODE_CUSTOM) for code in r.tables(root, _MODEL_OPERATOR_CODES)]
    except (struct.error, IndexError) as exc:
        raise ModelFormatError(f"model flatbuffer is truncated or corrupt ({exc})") from None
    return tuple(sorted({n for n in names if n}))


def read_custom_op_outputs(buf: bytes, op_name: str) -> list[list[int]]:
    """For each use of custom op `op_name` in the main subgraph, its output tensor indices in the
    op's own order (these are the interpreter's tensor indices)."""
    check_identifier(buf)
    try:
        r = _Reader(buf)
        root = r._deref(0)
        codes = [r.string(code, _OPCODE_CUSTOM) for code in r.tables(root, _MODEL_OPERATOR_CODES)]
        subgraphs = r.tables(root, _MODEL_SUBGRAPHS)
        if not subgraphs:
            return []
        found = []
        for op in r.tables(subgraphs[0], _SUBGRAPH_OPERATORS):
            code = r.scalar(op, _OPERATOR_OPCODE_INDEX, "<I")
            if code < len(codes) and codes[code] == op_name:
                found.append(r.ints(op, _OPERATOR_OUTPUTS))
        return found
    except (struct.error, IndexError) as exc:
        raise ModelFormatError(f"model flatbuffer is truncated or corrupt ({exc})") from None
