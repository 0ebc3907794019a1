"""Read the metadata entries and custom-op names of a .tflite (no TensorFlow, no generated schema).

A .tflite's root `Model` table holds `metadata`, a list of `(name, buffer index)` pairs. edgekit stores
one JSON entry named `edgekit`; TFLite's own converter stores others (`min_runtime_version`, ...).
Every function takes the file's bytes or an already parsed `runtime.flatbuffer.ModelView`.
"""

from __future__ import annotations

import json
from typing import Any

from edgekit.errors import ModelFormatError
from edgekit.runtime.flatbuffer import FILE_IDENTIFIER, ModelView, check_identifier

__all__ = ["EDGEKIT_KEY", "FILE_IDENTIFIER", "check_identifier", "read_metadata_entries", "read_edgekit_metadata",
           "read_custom_op_names", "read_custom_op_outputs"]

EDGEKIT_KEY = "edgekit"


def read_metadata_entries(model: bytes | ModelView) -> dict[str, bytes]:
    """All metadata entries of a .tflite as {name: raw bytes}."""
    return dict(ModelView.of(model).metadata)


def read_edgekit_metadata(model: bytes | ModelView) -> dict[str, Any] | None:
    """The edgekit JSON entry of a .tflite, or None when the file has none."""
    raw = ModelView.of(model).metadata.get(EDGEKIT_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"edgekit metadata is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ModelFormatError("edgekit metadata is not a JSON object")
    return value


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
