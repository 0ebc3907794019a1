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


def add_metadata(model: bytes, entry: dict[str, Any], name: str = EDGEKIT_KEY) -> bytes:
    ModelView(model)  # a TFLite flatbuffer with a sane root, or ModelFormatError
    schema = schema_module()
    obj = unpack(model)
    payload = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode("utf-8")
    buffer = schema.BufferT()
    buffer.data = list(payload)
    obj.buffers = list(obj.buffers or [])
    obj.metadata = [m for m in (obj.metadata or []) if (m.name or b"").decode() != name] if obj.metadata else []
    obj.buffers.append(buffer)
    meta = schema.MetadataT()
    meta.name = name
    meta.buffer = len(obj.buffers) - 1
    obj.metadata.append(meta)
    return pack(obj, len(model) + len(payload))
