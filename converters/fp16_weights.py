"""float16 storage for the weights of ops an int8 model keeps in float (the autopilot's mixes).

TFLite's int8 quantizer leaves a denylisted op with float32 weights: each kept op costs four bytes per
weight. TFLite's own float16 mode stores a float weight as FLOAT16 behind a DEQUANTIZE op that widens it to
float32, so the op still computes in float32 while the file carries two bytes per weight. This applies that
layout to the float32 constants left in a quantized model.
"""

from __future__ import annotations

import numpy as np

MIN_ELEMENTS = 16  # smaller constants (a scalar, a shape-like vector) are not worth an op
DEQUANTIZE_FLOAT16_VERSION = 3  # TFLite's op version of DEQUANTIZE from float16


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
        values = np.frombuffer(bytes(bytearray(model.buffers[tensor.buffer].data)), np.float32)
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
    data = model.buffers[tensor.buffer].data if tensor.buffer else None
    if tensor.type != s.TensorType.FLOAT32 or data is None or len(data) < 4 * MIN_ELEMENTS:
        return False
    return tensor.quantization is None or not tensor.quantization.scale


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
