"""Add (or replace) the edgekit JSON entry in a .tflite's metadata list.

Uses the flatbuffer object API of the TFLite schema (the generated module ai-edge-litert ships, as the
runtime reads it); the model is otherwise unchanged, so any TFLite runtime loads the result.
"""

from __future__ import annotations

import json
from typing import Any

from edgekit.runtime.flatbuffer import ModelView
from edgekit.runtime.metadata import EDGEKIT_KEY
from edgekit.runtime.schema import pack, schema_module, unpack
from edgekit.runtime.tflite_metadata import set_metadata_buffer


def add_metadata(model: bytes, entry: dict[str, Any], name: str = EDGEKIT_KEY) -> bytes:
    """The model with `entry` as its JSON metadata entry `name` (replacing one it had, in its own buffer)."""
    ModelView(model)  # a TFLite flatbuffer with a sane root, or ModelFormatError
    obj = unpack(model)
    payload = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode("utf-8")
    set_metadata_buffer(obj, schema_module(), name, payload)
    return pack(obj, len(model) + len(payload))
