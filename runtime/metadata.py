"""Read the metadata entries and custom-op names of a .tflite (no TensorFlow, no generated schema).

A .tflite's root `Model` table holds `metadata`, a list of `(name, buffer index)` pairs. edgekit stores
one JSON entry named `edgekit`; TFLite's own converter stores others (`min_runtime_version`, ...).
Every function takes the file's bytes or an already parsed `runtime.flatbuffer.ModelView`.
"""

from __future__ import annotations

from typing import Any

from edgekit.errors import ModelFormatError
from edgekit.runtime.entry_check import check_entry
from edgekit.runtime.flatbuffer import FILE_IDENTIFIER, ModelView, check_identifier

__all__ = [
    "EDGEKIT_KEY",
    "FILE_IDENTIFIER",
    "check_identifier",
    "read_custom_op_names",
    "read_custom_op_outputs",
    "read_edgekit_entry",
    "read_edgekit_metadata",
    "read_metadata_entries",
]

EDGEKIT_KEY = "edgekit"
_CHANNELS: dict[object, int] = {"GRAYSCALE": 1, "RGB": 3}  # an image's color_space (any JSON value is looked up)


def read_metadata_entries(model: bytes | ModelView) -> dict[str, bytes]:
    """All metadata entries of a .tflite as {name: raw bytes}."""
    return dict(ModelView.of(model).metadata)


def read_edgekit_metadata(model: bytes | ModelView) -> dict[str, Any] | None:
    """The edgekit JSON entry of a .tflite, checked (see `read_edgekit_entry`), or None when it has none."""
    return read_edgekit_entry(model)[0]


def read_edgekit_entry(model: bytes | ModelView) -> tuple[dict[str, Any] | None, list[str]]:
    """(the edgekit entry or None, warnings): checked against its limits and schema (runtime.entry_check),
    invalid records left out with a warning each. ModelFormatError when the entry is unusable (what the
    runtime acts on is invalid, it breaks the limits) or the file has two of them."""
    view = ModelView.of(model)
    if view.metadata_names.count(EDGEKIT_KEY) > 1:
        raise ModelFormatError("the model has two edgekit metadata entries; readers would disagree on which one holds")
    raw = view.metadata.get(EDGEKIT_KEY)
    if raw is None:
        return None, []
    return check_entry(raw)


def read_tflite_metadata(model: bytes | ModelView) -> tuple[dict[str, Any] | None, list[str]]:
    """(the standard TFLite Metadata as a dict (runtime/tflite_metadata.py) or None, warnings): a metadata
    buffer that does not decode is left out with a warning, the model still runs."""
    from edgekit.runtime.tflite_metadata import METADATA_NAME, decode

    raw = ModelView.of(model).metadata.get(METADATA_NAME)
    if raw is None:
        return None, []
    try:
        return decode(raw), []
    except ModelFormatError as exc:
        return None, [f"{exc}; it is ignored"]


def standard_tensors(meta: dict[str, Any] | None, kind: str) -> list[dict[str, Any]]:
    """The first subgraph's `kind` ("input" or "output") tensor metadata, in the subgraph's order."""
    return ((meta or {}).get("subgraph_metadata") or [{}])[0].get(f"{kind}_tensor_metadata") or []


def _at(tensors: list[dict[str, Any]], position: int) -> dict[str, Any]:
    """Entry `position`, or {} for a tensor the metadata does not list (-1: not among the subgraph's)."""
    return tensors[position] if 0 <= position < len(tensors) else {}


def standard_input(meta: dict[str, Any] | None, position: int) -> dict[str, Any]:
    """What the standard metadata says of input `position` (in the subgraph's order): {"mean", "std",
    "channels", "kind"} where it says so."""
    t = _at(standard_tensors(meta, "input"), position)
    out: dict[str, Any] = {}
    props = ((t.get("content") or {}).get("content_properties") or {})
    if props.get("$type") == "ImageProperties":
        out["kind"] = "image"
        out["channels"] = _CHANNELS.get(props.get("color_space"))
    elif props.get("$type") == "AudioProperties":
        out.update(kind="audio", sample_rate=props.get("sample_rate"), channels=props.get("channels"))
    for unit in t.get("process_units") or []:
        options = unit.get("options") or {}
        if options.get("$type") == "NormalizationOptions" and options.get("mean") and options.get("std"):
            out["mean"], out["std"] = tuple(options["mean"]), tuple(options["std"])
    return out


def standard_labels(meta: dict[str, Any] | None, model: bytes, position: int,
                    width: int | None = None) -> tuple[str, ...]:
    """The class names the standard metadata gives output `position`: its TENSOR_AXIS_LABELS (or
    TENSOR_VALUE_LABELS) file from the zip appended to the model (the first one without a locale). Axis
    labels name the values along the last axis: with `width` (that axis' size) a file of another count is
    not this output's (MediaPipe's hand_landmark lists its outputs in another order than its subgraph:
    2 handedness labels fell on a 63-wide landmark output)."""
    from edgekit.runtime.tflite_metadata import associated_files

    files = [f for f in _at(standard_tensors(meta, "output"), position).get("associated_files") or []
             if f.get("type") in ("TENSOR_AXIS_LABELS", "TENSOR_VALUE_LABELS") and f.get("name")]
    files.sort(key=lambda f: bool(f.get("locale")))
    found = associated_files(model, {f["name"] for f in files}) if files else {}  # the zip read once
    for f in files:
        content = found.get(f["name"])
        if content is not None:
            lines = content.decode("utf-8", "replace").splitlines()
            labels = tuple(line.strip() for line in lines[:100_000] if line.strip())
            if width is None or f["type"] != "TENSOR_AXIS_LABELS" or len(labels) == width:
                return labels
    return ()


def read_custom_op_names(model: bytes | ModelView) -> tuple[str, ...]:
    """Names of the custom ops a model uses (e.g. "TFLite_Detection_PostProcess")."""
    return tuple(sorted({n for n in ModelView.of(model).custom_codes if n}))


def read_custom_op_outputs(model: bytes | ModelView, op_name: str) -> list[list[int]]:
    """For each use of custom op `op_name` in the main subgraph, its output tensor indices in the
    op's own order (these are the interpreter's tensor indices)."""
    view = ModelView.of(model)
    if not view.subgraphs:
        return []
    codes = view.custom_codes
    return [list(op.outputs) for op in view.subgraphs[0].operators
            if op.opcode_index < len(codes) and codes[op.opcode_index] == op_name]
