"""float16 storage of float constants: for the weights of ops an int8 model keeps in float (the autopilot's
mixes), and what float16 cannot hold kept float32 in TFLite's own float16 files.

TFLite's int8 quantizer leaves a denylisted op with float32 weights: each kept op costs four bytes per
weight. TFLite's own float16 mode stores a float weight as FLOAT16 behind a DEQUANTIZE op that widens it to
float32, so the op still computes in float32 while the file carries two bytes per weight. This applies that
layout to the float32 constants left in a quantized model.

TFLite's float16 mode stores every float constant so, the ones float16 cannot hold too: the 1e-10 of a
log-spectrogram's `log(x + 1e-10)` becomes 0, and the file outputs NaN on silence. `keep_float32_constants`
stores those as float32 again (`float16_loses` says which), and `float16_weights` leaves them float32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgekit.runtime.flatbuffer import tensor_values

MIN_ELEMENTS = 16  # smaller constants (a scalar, a shape-like vector) are not worth an op
DEQUANTIZE_FLOAT16_VERSION = 3  # TFLite's op version of DEQUANTIZE from float16
FLOAT16_NORMAL = 2.0 ** -14  # float16's smallest normal number: below it, bits of precision go
FLOAT16_PRECISION = 2.0 ** -10  # float16 rounds a normal number within 2**-11 of it: losing more is not holding it


def float16_weights(tflite: bytes) -> tuple[bytes, int]:
    """(the model with every float32 constant of at least MIN_ELEMENTS values stored as float16 behind a
    DEQUANTIZE, how many constants were stored so). Unchanged, with 0, when there is none."""
    from edgekit.runtime.schema import pack, schema_module, unpack

    s = schema_module()
    model = unpack(tflite)
    graph = model.subgraphs[0]
    targets = [i for i, t in enumerate(graph.tensors) if _float32_constant(model, t, s)]
    if not targets:
        return tflite, 0
    opcode = _dequantize_opcode(model, s)
    widen, replaced = [], []
    for index in targets:
        tensor = graph.tensors[index]
        values = tensor_values(model, tensor)
        assert values is not None  # `_float32_constant` read it
        half = s.BufferT()
        half.data = np.frombuffer(values.astype(np.float16).tobytes(), np.uint8)
        model.buffers.append(half)
        stored = s.TensorT()
        stored.name, stored.shape, stored.type = tensor.name + b"_fp16", tensor.shape, s.TensorType.FLOAT16
        stored.buffer = len(model.buffers) - 1
        graph.tensors.append(stored)
        replaced.append(tensor.buffer)
        tensor.buffer = 0  # the float32 tensor is now the DEQUANTIZE's output
        op = s.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = opcode, [len(graph.tensors) - 1], [index]
        widen.append(op)
    graph.operators = widen + list(graph.operators)  # constants first: every op after them may read them
    still_read = {t.buffer for g in model.subgraphs for t in g.tensors}
    for buffer in {old for old in replaced if old not in still_read}:
        model.buffers[buffer].data = None  # the float32 copy goes (unless another tensor shares its buffer)
    return pack(model, len(tflite)), len(targets)


def _float32_constant(model, tensor, s) -> bool:
    values = tensor_values(model, tensor) if tensor.type == s.TensorType.FLOAT32 else None
    if values is None or values.size < MIN_ELEMENTS or float16_loses(values):
        return False
    return tensor.quantization is None or not tensor.quantization.scale


def float16_loses(values: np.ndarray) -> bool:
    """Whether float16 cannot hold these float32 values: a finite one overflows past 65504, or they round by
    more than float16's own precision relative to the largest of them (values that all sit below float16's
    normal range, such as the 1e-10 of `log(x + 1e-10)`, which becomes 0). Infinities and NaN stay as they are."""
    v = np.asarray(values, np.float64).ravel()
    v = v[np.isfinite(v)]
    with np.errstate(over="ignore"):
        half = v.astype(np.float16).astype(np.float64)
    if np.any(np.isinf(half)):
        return True
    scale = float(np.abs(v).max(initial=0.0))
    return scale > 0 and float(np.abs(half - v).max()) > FLOAT16_PRECISION * scale


def keep_float32_constants(tflite: bytes, float32: Callable[[], bytes]) -> tuple[bytes, list[str]]:
    """TFLite's float16 file with each constant float16 cannot hold (`float16_loses`) stored as float32 again, its
    DEQUANTIZE gone; and `name = value` of each. The float32 values come from `float32()`, the same model
    converted without float16, called only where a float16 constant may have lost its values (an infinity, or
    every value below float16's normal range: an all-zero bias is one too)."""
    from edgekit.errors import EdgekitError
    from edgekit.runtime.flatbuffer import ModelView

    view = ModelView(tflite, "the float16 model")
    suspects = _suspects(view)
    if not suspects:
        return tflite, []
    try:
        reference = ModelView(float32(), "the float32 model")
    except EdgekitError:  # the float16 file stands as TFLite wrote it; verification judges it
        return tflite, []
    originals = {at: v for at, v in _originals(view, reference, suspects).items() if float16_loses(v)}
    if not originals:
        return tflite, []
    return _widened(tflite, originals), [_describe(view, at, v) for at, v in originals.items()]


def _dequantizes(view) -> dict[tuple[int, int], tuple[int, int]]:
    """{(subgraph, op index): (float16 tensor, float32 tensor)} of every DEQUANTIZE from a float16 tensor."""
    found = {}
    for g in view.subgraphs:
        tensors = g.tensors
        for op in g.operators:
            if view.op_name(op) == "DEQUANTIZE" and op.inputs and tensors[op.inputs[0]].type_name == "FLOAT16" \
                    and op.outputs[0] not in g.outputs:
                found[(g.index, op.index)] = (op.inputs[0], op.outputs[0])
    return found


def _suspects(view) -> dict[tuple[int, int], np.ndarray]:
    """{(subgraph, DEQUANTIZE op index): values} of the float16 constants that may have lost their float32 values:
    an infinity, or every value below float16's normal range (zeros too: a true zero looks the same)."""
    found = {}
    for (g, i), (half, _) in _dequantizes(view).items():
        stored = view.constant(view.subgraphs[g].tensors[half])
        if stored is None or stored.dtype != np.float16:
            continue
        values = stored.astype(np.float32).ravel()
        if np.any(np.isinf(values)) or float(np.abs(values[np.isfinite(values)]).max(initial=0.0)) < FLOAT16_NORMAL:
            found[(g, i)] = values
    return found


def _originals(view, reference, suspects: dict) -> dict[tuple[int, int], np.ndarray]:
    """The float32 values of each suspect, read where the float32 file has the same op at the same place (the
    float16 file is the float32 one with DEQUANTIZE ops added) and checked: they round to the float16 values."""
    widening = _dequantizes(view)
    found = {}
    for g16, g32 in zip(view.subgraphs, reference.subgraphs):
        ops16 = [op for op in g16.operators if (g16.index, op.index) not in widening]
        ops32 = list(g32.operators)
        if [view.op_name(o) for o in ops16] != [reference.op_name(o) for o in ops32]:
            continue  # not the same graph: nothing is matched by guess
        for (g, i), values in suspects.items():
            if g == g16.index:
                found.update(_matched(reference, g32, ops16, ops32, widening[(g, i)][1], values, (g, i)))
    return found


def _matched(reference, g32, ops16, ops32, tensor: int, values: np.ndarray, at) -> dict:
    """{at: the float32 constant every reader of `tensor` reads at the same place in the float32 file}, or {}."""
    seen = set()
    for op16, op32 in zip(ops16, ops32):
        for slot, t in enumerate(op16.inputs):
            if t == tensor and slot < len(op32.inputs):
                seen.add(op32.inputs[slot])
    if len(seen) != 1:
        return {}
    t32 = g32.tensors[seen.pop()]
    original = reference.constant(t32)
    if original is None or original.dtype != np.float32 or original.size != values.size:
        return {}
    original = original.ravel()
    with np.errstate(over="ignore"):
        same = np.array_equal(original.astype(np.float16).astype(np.float32), values, equal_nan=True)
    return {at: original} if same else {}


def _widened(tflite: bytes, originals: dict) -> bytes:
    """The file with each DEQUANTIZE at `originals` removed and its output the float32 constant it holds; a
    float16 copy nothing else reads goes."""
    from edgekit.runtime.schema import pack, schema_module, unpack

    s = schema_module()
    model = unpack(tflite)
    halves = set()
    for g, graph in enumerate(model.subgraphs):
        gone = {i for sg, i in originals if sg == g}
        for i in gone:
            op = graph.operators[i]
            data = s.BufferT()
            data.data = np.frombuffer(originals[(g, i)].tobytes(), np.uint8)
            model.buffers.append(data)
            graph.tensors[op.outputs[0]].buffer = len(model.buffers) - 1
            halves.add((g, int(op.inputs[0])))
        graph.operators = [op for i, op in enumerate(graph.operators or []) if i not in gone]
    read = {(g, int(t)) for g, graph in enumerate(model.subgraphs) for op in graph.operators
            for t in (op.inputs if op.inputs is not None else [])}
    for g, t in halves - read:
        tensor = model.subgraphs[g].tensors[t]
        buffer, tensor.buffer = tensor.buffer, 0
        if buffer not in {x.buffer for graph in model.subgraphs for x in graph.tensors}:
            model.buffers[buffer].data = None
    return pack(model, len(tflite))


def _describe(view, at, values: np.ndarray) -> str:
    g, i = at
    graph = view.subgraphs[g]
    name = graph.tensors[graph.operators[i].inputs[0]].name
    if values.size == 1:
        return f"{name} = {float(values[0]):.3g}"
    return f"{name} ({values.size} values, largest |value| {float(np.abs(values).max()):.3g})"


def _dequantize_opcode(model, s) -> int:
    """The index of a DEQUANTIZE operator code of the float16 version, added when the model has none."""
    for i, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == s.BuiltinOperator.DEQUANTIZE \
                and code.version == DEQUANTIZE_FLOAT16_VERSION:
            return i
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.DEQUANTIZE
    code.version = DEQUANTIZE_FLOAT16_VERSION
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1
