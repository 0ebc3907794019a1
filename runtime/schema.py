"""The TFLite flatbuffer schema (the generated module ai-edge-litert ships) and its enum names."""

from __future__ import annotations

import functools

from edgekit.errors import MissingDependencyError


def schema_module():
    """`schema_py_generated` from ai-edge-litert; the runtime never falls back to TensorFlow's copy."""
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        raise MissingDependencyError("reading the model's full structure needs ai-edge-litert "
                                     "(pip install ai-edge-litert)") from None
    return schema


def unpack(tflite: bytes):
    """The model as the schema's mutable object tree (`ModelT`), to edit and `pack` again."""
    s = schema_module()
    return s.ModelT.InitFromObj(s.Model.GetRootAs(tflite, 0))


def pack(model, size_hint: int = 0) -> bytes:
    """A `ModelT` back to .tflite bytes (`size_hint`: about the size it will have)."""
    import flatbuffers

    builder = flatbuffers.Builder(size_hint + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@functools.lru_cache(maxsize=None)
def enum_names(enum_class) -> dict[int, str]:
    """{value: name} of a generated enum class (BuiltinOperator, TensorType, BuiltinOptions, ...)."""
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}
