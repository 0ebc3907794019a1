"""Int8 output scales an ADD/SUB kernel cannot take, raised to the least it can.

LiteRT's int8 ADD and SUB rescale both inputs to twice the larger input scale with 20 bits of headroom,
then to the output scale, and abort the process when that last multiplier is not below 1
(`runtime/preflight.rescale_gap`). Post-training calibration never gets there; quantization-aware
training can: on an untrained MobileNetV3Small a residual ADD learned an output range 1.7e-6 wide beside an
input whose range had seen only zeros and was widened to 1.0 (scales 6.5e-9 and 0.0039, 1.14x past the
limit). The output is then stored at the least scale the kernel takes: its clamp range widens by that
factor and nothing else changes. Ops that pass int8 values through unscaled (reshape, pooling by max, pad,
...) carry the same scale on their output, so theirs follows."""

from __future__ import annotations

import numpy as np

from edgekit.errors import ConversionError
from edgekit.runtime.flatbuffer import ModelView
from edgekit.runtime.preflight import RESCALED, least_output_scale, rescale_gap
from edgekit.runtime.schema import enum_names, pack, schema_module, unpack

# ops whose int8 output must keep their first input's scale (the kernels copy or compare the values)
PASS_THROUGH = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "MAX_POOL_2D", "PAD", "PADV2", "TRANSPOSE",
                          "SLICE", "STRIDED_SLICE", "GATHER", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "SPLIT",
                          "SPLIT_V", "UNPACK", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND", "TILE", "BROADCAST_TO",
                          "REDUCE_MAX", "REDUCE_MIN"})


def widen_collapsed_outputs(tflite: bytes) -> tuple[bytes, list[dict]]:
    """(the model with every int8 ADD/SUB output scale its kernel aborts on raised to the least it takes,
    one {"op", "tensor", "scale", "to"} per raised output); the bytes unchanged when there is none."""
    view = ModelView(tflite, "the converted model")
    sub = view.first_subgraph()
    if not any(rescale_gap(view, op, sub.tensors) for op in sub.operators):
        return tflite, []
    names = [view.op_name(op) for op in sub.operators]
    model = unpack(tflite)
    graph = model.subgraphs[0]
    tensors = graph.tensors
    type_names = enum_names(schema_module().TensorType)
    moved: dict[int, tuple[float, float]] = {}  # tensor -> (old scale, new scale)
    raised = []
    for name, op in zip(names, graph.operators):  # TFLite stores the ops in the order they run
        outputs = [int(t) for t in op.outputs if t >= 0 and _scale(tensors[t]) is not None]
        if name in RESCALED and len(op.inputs) == 2 and len(outputs) == 1:
            scales = [_scale(tensors[t]) if t >= 0 else None for t in op.inputs]
            known = [s for s in scales if s is not None]
            out = tensors[outputs[0]]
            scale = _scale(out)  # not None: `outputs` has only tensors with a scale
            least = least_output_scale(max(known), type_names.get(out.type, "")) if len(known) == len(scales) else None
            if least is not None and scale is not None and scale < least:
                moved[outputs[0]] = (scale, least)
                raised.append({"op": name, "tensor": _name(out), "scale": scale, "to": least})
                out.quantization.scale = [least]
        elif name in PASS_THROUGH and len(op.inputs) and int(op.inputs[0]) in moved:
            old, new = moved[int(op.inputs[0])]
            for t in outputs:
                if np.float32(_scale(tensors[t])) == np.float32(old):
                    moved[t] = (old, new)
                    tensors[t].quantization.scale = [new]
    out = pack(model, len(tflite))
    check = ModelView(out, "the converted model")
    left = [op for op in check.first_subgraph().operators if rescale_gap(check, op, check.first_subgraph().tensors)]
    if left:
        raise ConversionError(f"{len(left)} int8 ADD/SUB output scale(s) stay out of LiteRT's reach after widening")
    return out, raised


def _scale(tensor) -> float | None:
    q = tensor.quantization
    if q is None or q.scale is None or len(q.scale) != 1:
        return None
    return float(q.scale[0])


def _name(tensor) -> str:
    name = tensor.name
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)

