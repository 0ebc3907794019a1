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


@functools.cache
def enum_names(enum_class) -> dict[int, str]:
    """{value: name} of a generated enum class (BuiltinOperator, TensorType, BuiltinOptions, ...)."""
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


def patched(tflite: bytes, *, ranges: dict | None = None, data: dict | None = None) -> bytes | None:
    """A copy of `tflite` (main graph) with tensors' recorded ranges (index -> (min, max)) and constant data
    (index -> array) overwritten where they sit in the flatbuffer: nothing moves, so nothing is packed again
    (`unpack` and `pack` of a 250 KB ViT cost 0.15 s, and every candidate of `--calib-method auto` paid it).
    None where a value has no room of its size there (a range not of one value, data of another length or
    stored past the flatbuffer): the caller unpacks and packs instead."""
    import numpy as np

    buffer = bytearray(tflite)
    model = schema_module().Model.GetRootAs(buffer, 0)
    graph = model.Subgraphs(0)
    for index, (lo, hi) in (ranges or {}).items():
        q = graph.Tensors(index).Quantization()
        if q is None or q.MinLength() != 1 or q.MaxLength() != 1:
            return None
        q.MinAsNumpy()[0], q.MaxAsNumpy()[0] = lo, hi  # views into `buffer`
    for index, values in (data or {}).items():
        view = model.Buffers(graph.Tensors(index).Buffer()).DataAsNumpy()
        raw = np.frombuffer(np.ascontiguousarray(values).tobytes(), np.uint8)
        if isinstance(view, int) or view.size != raw.size:  # 0: no data in the flatbuffer
            return None
        view[:] = raw
    return bytes(buffer)


def with_tensor_data(tflite: bytes, data: dict) -> bytes:
    """`tflite` with constant tensors' data (index -> array of the tensor's type and size) replaced: in place
    (`patched`) where it fits, else unpacked and packed."""
    import numpy as np

    made = patched(tflite, data=data)
    if made is not None:
        return made
    model = unpack(tflite)
    for index, values in data.items():
        tensor = model.subgraphs[0].tensors[index]
        model.buffers[tensor.buffer].data = np.frombuffer(np.ascontiguousarray(values).tobytes(), np.uint8)
    return pack(model, len(tflite))
