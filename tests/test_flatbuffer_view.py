"""edgekit.runtime.flatbuffer.ModelView: one parse of a .tflite, shared by every reader of the runtime."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import ModelFormatError
from edgekit.runtime import flatbuffer
from edgekit.runtime.flatbuffer import ModelView


def _model(*, large: bool = False) -> bytes:
    """A one-op FULLY_CONNECTED model with a [2, 4] float32 kernel, half of it zeros, and an `edgekit`
    metadata entry. large=True stores the kernel the way models over 2 GB do: the buffer holds an
    offset/size pair into bytes appended after the flatbuffer."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    kernel = np.array([[0, 1, 0, 2], [3, 0, 4, 0]], np.float32)
    m = schema.ModelT()
    m.version = 3
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 1
    m.operatorCodes = [code]
    weights, meta_buffer = schema.BufferT(), schema.BufferT()
    meta_buffer.data = list(b'{"schema": "edgekit.metadata/1"}')
    if large:
        weights.offset, weights.size = 1, kernel.nbytes  # patched below, once the flatbuffer's size is known
    else:
        weights.data = list(kernel.tobytes())
    m.buffers = [schema.BufferT(), weights, meta_buffer]
    tensors = []
    for name, shape, buffer in (("x", [1, 4], 0), ("kernel", [2, 4], 1), ("y", [1, 2], 0)):
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, shape, schema.TensorType.FLOAT32, buffer
        tensors.append(t)
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1, -1], [2]
    op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = schema.FullyConnectedOptionsT()
    sub = schema.SubGraphT()
    sub.tensors, sub.operators, sub.inputs, sub.outputs = tensors, [op], [0], [2]
    m.subgraphs = [sub]
    meta = schema.MetadataT()
    meta.name, meta.buffer = "edgekit", 2
    m.metadata = [meta]
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    data = bytes(builder.Output())
    if not large:
        return data
    padded = data + bytes(-len(data) % 16)
    weights.offset = len(padded)
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    assert len(bytes(builder.Output())) == len(data)  # the offset's value does not change the layout
    return bytes(builder.Output()) + bytes(-len(data) % 16) + kernel.tobytes()


def test_the_view_reads_op_codes_tensors_operators_and_metadata():
    view = ModelView(_model())
    assert [(c.name, c.display, c.version, c.is_custom) for c in view.op_codes] == [
        ("FULLY_CONNECTED", "FULLY_CONNECTED", 1, False)]
    sub = view.first_subgraph()
    assert [(t.name, t.type_name, t.shape, t.buffer) for t in sub.tensors] == [
        ("x", "FLOAT32", (1, 4), 0), ("kernel", "FLOAT32", (2, 4), 1), ("y", "FLOAT32", (1, 2), 0)]
    (op,) = sub.operators
    assert (op.inputs, op.outputs, op.options_type_name) == ((0, 1, -1), (2,), "FullyConnectedOptions")
    assert op.options().KeepNumDims() is False
    assert view.metadata == {"edgekit": b'{"schema": "edgekit.metadata/1"}'}
    assert view.buffer_bytes(0) is None and view.buffer_bytes(99) is None


@pytest.mark.parametrize("large", [False, True], ids=["in-file data", "offset/size form"])
def test_buffer_bytes_are_the_same_in_both_storage_forms(large):
    view = ModelView(_model(large=large))
    assert len(view.buffer(1).data) == (0 if large else 32)
    kernel = np.frombuffer(view.buffer_bytes(1), np.float32).reshape(2, 4)
    np.testing.assert_array_equal(kernel, [[0, 1, 0, 2], [3, 0, 4, 0]])


@pytest.mark.parametrize("large", [False, True], ids=["in-file data", "offset/size form"])
def test_a_constant_reads_as_its_type_and_shape_the_same_from_the_view_and_the_schema(large):
    """The one reader of constants the converters share (`ModelView.constant`, `flatbuffer.tensor_values`): the
    array in the tensor's shape, writable; None where there are no bytes or they do not fill the shape."""
    from edgekit.runtime.flatbuffer import tensor_values
    from edgekit.runtime.schema import unpack

    data = _model(large=large)
    view = ModelView(data)
    x, kernel, _ = view.first_subgraph().tensors
    values = view.constant(kernel)
    np.testing.assert_array_equal(values, [[0, 1, 0, 2], [3, 0, 4, 0]])
    assert values.dtype == np.float32 and values.flags.writeable and view.constant(x) is None
    assert flatbuffer.constant_array(view.buffer_bytes(1), "FLOAT32", (3, 4)) is None  # 8 values, not 12
    assert flatbuffer.constant_array(view.buffer_bytes(1), "STRING", (2, 4)) is None
    model = unpack(data)
    found = tensor_values(model, model.subgraphs[0].tensors[1])
    if large:  # the schema's objects hold no bytes for the offset/size form: only the view reads them
        assert found is None
    else:
        np.testing.assert_array_equal(found, values)


def test_a_buffer_offset_past_the_end_is_a_model_format_error():
    data = _model(large=True)
    view = ModelView(data[:-8])  # the appended kernel bytes cut short
    with pytest.raises(ModelFormatError, match="buffer 1 points past the end"):
        view.buffer_bytes(1)


@pytest.mark.parametrize("blob", [b"", b"short", b"\x00" * 4 + b"XXXX" + bytes(16)])
def test_bad_identifier_is_a_model_format_error(blob):
    with pytest.raises(ModelFormatError, match="no 'TFL3' identifier"):
        ModelView(blob)


def test_root_offset_past_the_end_is_a_model_format_error():
    with pytest.raises(ModelFormatError, match="root table offset"):
        ModelView(b"\xff\xff\xff\x7fTFL3" + bytes(64), "m.tflite")


def test_a_vector_longer_than_the_file_is_refused_before_it_is_read():
    data = bytearray(_model())
    view = ModelView(bytes(data))
    start, _ = view._r.vector(view.root, 2, 4)  # the subgraphs vector: its length sits just before it
    data[start - 4 : start] = (2**31).to_bytes(4, "little")
    with pytest.raises(ModelFormatError, match="flatbuffer is corrupt"):
        ModelView(bytes(data)).subgraphs


def test_every_reader_accepts_a_view_and_inspect_parses_the_file_once(monkeypatch):
    from edgekit.runtime import gpu_compat, metadata, preflight, sparsity
    from edgekit.runtime.inspect import analyze, operators

    data = _model()
    view = ModelView(data)
    assert metadata.read_edgekit_metadata(view) == {"schema": "edgekit.metadata/1"}
    assert metadata.read_custom_op_names(view) == ()
    preflight.validate(view)
    assert [k["sparsity"] for k in sparsity.kernel_sparsity(view)] == [0.5]
    assert [r["op"] for r in gpu_compat.check_model(view)] == ["FULLY_CONNECTED"]
    assert [name for _, name, _ in operators(view)[2]] == ["FULLY_CONNECTED"]

    parses = []
    real_init = flatbuffer.ModelView.__init__
    monkeypatch.setattr(flatbuffer.ModelView, "__init__",
                        lambda self, *a, **kw: (parses.append(1), real_init(self, *a, **kw))[1])
    report = analyze(data, gpu=True)
    assert len(parses) == 1
    assert report["metadata"]["edgekit"] == {"schema": "edgekit.metadata/1"} and report["gpu"]["checked"]
    assert report == analyze(view, gpu=True) and len(parses) == 1  # a view passed in is not parsed again


def test_the_view_needs_no_tensorflow():
    import subprocess
    import sys

    code = ("import sys\nfrom edgekit.runtime import flatbuffer, gpu_compat, inspect, metadata, preflight, sparsity\n"
            "print(','.join(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
