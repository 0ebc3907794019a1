"""The standard TFLite Metadata (`TFLITE_METADATA`: the metadata_schema.fbs flatbuffer, identifier M001, schema
1.5.0) that MediaPipe Tasks, Android Studio's ML Model Binding and the TFLite Support library read, and
its associated files (labels ...), which live in an uncompressed zip appended to the model.

No maintained package ships the generated Python module for this schema and installs beside edgekit's
toolchain (tflite-support's last release is from 2023 with no wheels past CPython 3.11; MediaPipe's copy
comes with a package that pins absl-py against tensorflow-model-optimization), so the schema is declared here
as data, table by table, with its fields in their schema order (a field's id is its position, a union
taking two: its type, then its value), and one codec reads and writes any table of it. The declarations
follow metadata_schema.fbs 1.5.0 (google-ai-edge/mediapipe, mediapipe/tasks/metadata); flatbuffer field ids
never change once published. tests/test_tflite_metadata.py decodes what is written here with the schema's
own generated module and runs MediaPipe Tasks on edgekit's files.

A table is a dict by field name; a union is {"$type": member table name, **its fields}; enums are names.
"""

from __future__ import annotations

import io
import logging
import struct
import zipfile
from typing import Any

from edgekit.errors import ModelFormatError

log = logging.getLogger("edgekit.runtime")

METADATA_NAME = "TFLITE_METADATA"
FILE_IDENTIFIER = b"M001"
PARSER_VERSION = "1.5.0"  # the schema version these declarations follow

ENUMS = {
    "AssociatedFileType": ("UNKNOWN", "DESCRIPTIONS", "TENSOR_AXIS_LABELS", "TENSOR_VALUE_LABELS",
                           "TENSOR_AXIS_SCORE_CALIBRATION", "VOCABULARY", "SCANN_INDEX_FILE"),
    "ColorSpaceType": ("UNKNOWN", "RGB", "GRAYSCALE"),
    "BoundingBoxType": ("UNKNOWN", "BOUNDARIES", "UPPER_LEFT", "CENTER"),
    "CoordinateType": ("RATIO", "PIXEL"),
    "ScoreTransformationType": ("IDENTITY", "LOG", "INVERSE_LOGISTIC"),
}
UNIONS = {  # member 0 is NONE
    "ContentProperties": ("NONE", "FeatureProperties", "ImageProperties", "BoundingBoxProperties",
                          "AudioProperties"),
    "ProcessUnitOptions": ("NONE", "NormalizationOptions", "ScoreCalibrationOptions", "ScoreThresholdingOptions",
                           "BertTokenizerOptions", "SentencePieceTokenizerOptions", "RegexTokenizerOptions"),
}
# table -> its fields in schema order: (name, kind). Kinds: string, uint, int, float, an enum name, a table
# name, [kind] for a vector, and a union name (which takes two field ids).
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "AssociatedFile": (("name", "string"), ("description", "string"), ("type", "AssociatedFileType"),
                       ("locale", "string"), ("version", "string")),
    "FeatureProperties": (),
    "ImageSize": (("width", "uint"), ("height", "uint")),
    "ImageProperties": (("color_space", "ColorSpaceType"), ("default_size", "ImageSize")),
    "AudioProperties": (("sample_rate", "uint"), ("channels", "uint")),
    "BoundingBoxProperties": (("index", "[uint]"), ("type", "BoundingBoxType"), ("coordinate_type", "CoordinateType")),
    "ValueRange": (("min", "int"), ("max", "int")),
    "Content": (("content_properties", "ContentProperties"), ("range", "ValueRange")),
    "NormalizationOptions": (("mean", "[float]"), ("std", "[float]")),
    "ScoreCalibrationOptions": (("score_transformation", "ScoreTransformationType"), ("default_score", "float")),
    "ScoreThresholdingOptions": (("global_score_threshold", "float"),),
    "BertTokenizerOptions": (("vocab_file", "[AssociatedFile]"),),
    "SentencePieceTokenizerOptions": (("sentencePiece_model", "[AssociatedFile]"), ("vocab_file", "[AssociatedFile]")),
    "RegexTokenizerOptions": (("delim_regex_pattern", "string"), ("vocab_file", "[AssociatedFile]")),
    "ProcessUnit": (("options", "ProcessUnitOptions"),),
    "Stats": (("max", "[float]"), ("min", "[float]")),
    "TensorGroup": (("name", "string"), ("tensor_names", "[string]")),
    "TensorMetadata": (("name", "string"), ("description", "string"), ("dimension_names", "[string]"),
                       ("content", "Content"), ("process_units", "[ProcessUnit]"), ("stats", "Stats"),
                       ("associated_files", "[AssociatedFile]")),
    "CustomMetadata": (("name", "string"), ("data", "[ubyte]")),
    "SubGraphMetadata": (("name", "string"), ("description", "string"), ("input_tensor_metadata", "[TensorMetadata]"),
                         ("output_tensor_metadata", "[TensorMetadata]"), ("associated_files", "[AssociatedFile]"),
                         ("input_process_units", "[ProcessUnit]"), ("output_process_units", "[ProcessUnit]"),
                         ("input_tensor_groups", "[TensorGroup]"), ("output_tensor_groups", "[TensorGroup]"),
                         ("custom_metadata", "[CustomMetadata]")),
    "ModelMetadata": (("name", "string"), ("description", "string"), ("version", "string"),
                      ("subgraph_metadata", "[SubGraphMetadata]"), ("author", "string"), ("license", "string"),
                      ("associated_files", "[AssociatedFile]"), ("min_parser_version", "string")),
}
_SCALARS = {"uint": ("<I", 4), "int": ("<i", 4), "float": ("<f", 4), "ubyte": ("<B", 1)}
_SLOT_WRITERS = {"uint": "PrependUint32Slot", "int": "PrependInt32Slot", "float": "PrependFloat32Slot",
                 "ubyte": "PrependUint8Slot"}
MAX_DEPTH = 12  # the schema nests 6 deep; more is a hostile file


def _slots(table: str) -> list[tuple[str, str, int]]:
    """(field, kind, field id) of a table; a union's value field takes the id after its type's."""
    out, fid = [], 0
    for name, kind in TABLES[table]:
        if kind in UNIONS:
            fid += 1  # the union's type field
        out.append((name, kind, fid))
        fid += 1
    return out


# -- writing ------------------------------------------------------------------------------------------------
def encode(metadata: dict[str, Any]) -> bytes:
    """A ModelMetadata dict as the M001 flatbuffer."""
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(_table(builder, "ModelMetadata", metadata), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def _table(b, table: str, value: dict[str, Any]) -> int:
    unknown = set(value) - {name for name, _ in TABLES[table]}
    if unknown:
        raise ValueError(f"{table} has no field {', '.join(sorted(unknown))}")
    slots = _slots(table)
    done: dict[str, Any] = {}  # offsets first: a flatbuffer builds children before their parent
    for name, kind, _ in slots:
        v = value.get(name)
        if v is None:
            continue
        if kind == "string":
            done[name] = b.CreateString(str(v))
        elif kind.startswith("["):
            done[name] = _vector(b, kind[1:-1], v)
        elif kind in TABLES:
            done[name] = _table(b, kind, v)
        elif kind in UNIONS:
            member = v["$type"]
            done[name] = (UNIONS[kind].index(member), _table(b, member, {k: x for k, x in v.items() if k != "$type"}))
    b.StartObject(slots[-1][2] + 1 if slots else 0)
    for name, kind, fid in slots:
        v = value.get(name)
        if v is None:
            continue
        if kind in UNIONS:
            b.PrependUint8Slot(fid - 1, done[name][0], 0)
            b.PrependUOffsetTRelativeSlot(fid, done[name][1], 0)
        elif name in done:
            b.PrependUOffsetTRelativeSlot(fid, done[name], 0)
        elif kind in ENUMS:
            b.PrependInt8Slot(fid, ENUMS[kind].index(v), -1)  # never the default: always written
        else:
            getattr(b, _SLOT_WRITERS[kind])(fid, v, None)  # a default of None: always written
    return b.EndObject()


def _vector(b, kind: str, values: list) -> int:
    from flatbuffers import number_types as n

    if kind in _SCALARS:
        size = _SCALARS[kind][1]
        flags = {"uint": n.Uint32Flags, "int": n.Int32Flags, "float": n.Float32Flags, "ubyte": n.Uint8Flags}[kind]
        b.StartVector(size, len(values), size)
        for v in reversed(values):
            b.Prepend(flags, v)
        return b.EndVector()
    offsets = [b.CreateString(str(v)) if kind == "string" else _table(b, kind, v) for v in values]
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def with_metadata(model: bytes, metadata: dict[str, Any], files: dict[str, bytes]) -> bytes:
    """The model with `metadata` as its TFLITE_METADATA entry and `files` (its associated files, by name) in an
    uncompressed zip appended to it, as MediaPipe and the TFLite Support library read them. An earlier
    TFLITE_METADATA entry is replaced; the flatbuffer is packed again, so a zip the model had is dropped."""
    from edgekit.runtime.schema import pack, schema_module, unpack

    flat = model[: flatbuffer_end(model)]
    obj = unpack(flat)
    data = encode(metadata)
    set_metadata_buffer(obj, schema_module(), METADATA_NAME, data)
    packed = pack(obj, len(flat) + len(data))
    out = io.BytesIO()
    out.write(packed)
    with zipfile.ZipFile(out, "a", zipfile.ZIP_STORED) as zf:  # appended after the flatbuffer
        for name, content in files.items():
            zf.writestr(name, content)
    return out.getvalue()


def set_metadata_buffer(obj, schema, name: str, data: bytes) -> None:
    """Set the metadata entry `name` of an unpacked model (`ModelT`) to `data`: the entry's own buffer when it
    has one (a second entry of that name is dropped), else a new buffer and entry."""
    obj.buffers = list(obj.buffers or [])
    entries = [m for m in (obj.metadata or []) if (m.name or b"").decode() == name]
    if entries and 0 < entries[0].buffer < len(obj.buffers):
        obj.buffers[entries[0].buffer].data = list(data)
        obj.metadata = [m for m in obj.metadata if m is entries[0] or (m.name or b"").decode() != name]
        return
    buffer = schema.BufferT()
    buffer.data = list(data)
    obj.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = name, len(obj.buffers) - 1
    obj.metadata = [m for m in (obj.metadata or []) if (m.name or b"").decode() != name] + [entry]


# -- reading ------------------------------------------------------------------------------------------------
MAX_ASSOCIATED_BYTES = 16 * 1024**2
MAX_ASSOCIATED_FILES = 256
MAX_NODES = 1 << 20  # tables, strings and vector items one metadata decode builds
MAX_STRING_BYTES = 16 * 1024**2  # text one metadata decode reads


def decode(data: bytes) -> dict[str, Any]:
    """A TFLITE_METADATA buffer as a ModelMetadata dict; ModelFormatError when it is not one."""
    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise ModelFormatError("TFLite metadata: not an M001 flatbuffer")
    try:
        root = struct.unpack_from("<I", data, 0)[0]
        return _read_table(data, "ModelMetadata", root, 0, _Budget())
    except (struct.error, IndexError, ValueError, UnicodeDecodeError, RecursionError, MemoryError) as exc:
        raise ModelFormatError(f"TFLite metadata: corrupt flatbuffer ({type(exc).__name__})") from None


class _Budget:
    """What one decode may build: tables and vector items shared by offsets could otherwise multiply (a
    vector of a million offsets to one table holding such a vector...)."""

    def __init__(self) -> None:
        self.nodes = MAX_NODES
        self.chars = MAX_STRING_BYTES

    def take(self, nodes: int = 1, chars: int = 0) -> None:
        self.nodes -= nodes
        self.chars -= chars
        if self.nodes < 0 or self.chars < 0:
            raise ValueError("more nodes or text than metadata holds")


def _read_table(data: bytes, table: str, pos: int, depth: int, budget: _Budget) -> dict[str, Any]:
    if depth > MAX_DEPTH or not 0 <= pos <= len(data) - 4:
        raise ValueError("table out of range")
    budget.take()
    vtable = pos - struct.unpack_from("<i", data, pos)[0]
    if not 0 <= vtable <= len(data) - 4:
        raise ValueError("vtable out of range")
    vsize = struct.unpack_from("<H", data, vtable)[0]

    def field(fid: int) -> int | None:
        slot = 4 + 2 * fid
        if slot >= vsize:
            return None
        rel = struct.unpack_from("<H", data, vtable + slot)[0]
        return pos + rel if rel else None

    out: dict[str, Any] = {}
    for name, kind, fid in _slots(table):
        at = field(fid)
        if kind in UNIONS:
            kind_at = field(fid - 1)
            member = data[kind_at] if kind_at is not None else 0
            if at is not None and 0 < member < len(UNIONS[kind]):
                name_of = UNIONS[kind][member]
                out[name] = {"$type": name_of, **_read_table(data, name_of, _deref(data, at), depth + 1, budget)}
            continue
        if at is None:
            continue
        if kind == "string":
            out[name] = _string(data, _deref(data, at), budget)
        elif kind.startswith("["):
            out[name] = _read_vector(data, kind[1:-1], _deref(data, at), depth, budget)
        elif kind in TABLES:
            out[name] = _read_table(data, kind, _deref(data, at), depth + 1, budget)
        elif kind in ENUMS:
            value = struct.unpack_from("<b", data, at)[0]
            out[name] = ENUMS[kind][value] if 0 <= value < len(ENUMS[kind]) else "UNKNOWN"
        else:
            out[name] = struct.unpack_from(_SCALARS[kind][0], data, at)[0]
    return out


def _deref(data: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", data, at)[0]


def _string(data: bytes, pos: int, budget: _Budget) -> str:
    n = struct.unpack_from("<I", data, pos)[0]
    if pos + 4 + n > len(data):
        raise ValueError("string out of range")
    budget.take(chars=n)
    return data[pos + 4: pos + 4 + n].decode("utf-8")


def _read_vector(data: bytes, kind: str, pos: int, depth: int, budget: _Budget) -> list:
    n = struct.unpack_from("<I", data, pos)[0]
    size = _SCALARS[kind][1] if kind in _SCALARS else 4
    if pos + 4 + n * size > len(data):
        raise ValueError("vector out of range")
    budget.take(n)
    start = pos + 4
    if kind in _SCALARS:
        return list(struct.unpack_from(f"<{n}{_SCALARS[kind][0][1]}", data, start))
    items = [start + 4 * i for i in range(n)]
    if kind == "string":
        return [_string(data, _deref(data, at), budget) for at in items]
    return [_read_table(data, kind, _deref(data, at), depth + 1, budget) for at in items]


def _appended_zip(model: bytes) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]] | None:
    """The zip appended to `model` and its first MAX_ASSOCIATED_FILES members, when it is one: at least one
    member, every member's local header inside the file where the directory says. Any file is data: a
    directory that lies (offsets past the end, sizes that overflow) is no zip, not an exception."""
    at = model.rfind(b"PK\x05\x06")  # the zip's end-of-central-directory record
    if at < 0 or len(model) - at < 22:
        return None
    try:
        zf = zipfile.ZipFile(io.BytesIO(model))
        infos = zf.infolist()[:MAX_ASSOCIATED_FILES]
    except Exception:  # noqa: BLE001 - zipfile raises what it meets (BadZipFile, OverflowError, struct.error...)
        return None
    if not infos or any(not 0 <= i.header_offset <= len(model) - 30 or
                        model[i.header_offset:i.header_offset + 4] != b"PK\x03\x04" for i in infos):
        zf.close()
        return None
    return zf, infos


def flatbuffer_end(model: bytes) -> int:
    """Where the flatbuffer ends and an appended zip of associated files begins (len(model) without one)."""
    found = _appended_zip(model)
    if found is None:
        return len(model)
    found[0].close()
    return min(i.header_offset for i in found[1])


def associated_files(model: bytes, names: set[str]) -> dict[str, bytes]:
    """The associated files named `names` from the zip appended to `model`: stored (uncompressed) members
    only, each at most MAX_ASSOCIATED_BYTES, at most MAX_ASSOCIATED_FILES looked at; what is missing or
    refused is left out."""
    out: dict[str, bytes] = {}
    found = _appended_zip(model)
    if found is None:
        return out
    zf, infos = found
    with zf:
        for info in infos:
            if info.filename in names and info.compress_type == zipfile.ZIP_STORED and \
                    info.file_size <= MAX_ASSOCIATED_BYTES:
                try:
                    out[info.filename] = zf.read(info)
                except Exception as exc:  # noqa: BLE001 - a member that does not read is left out
                    log.debug("associated file %r not read: %s", info.filename, exc)
    return out
