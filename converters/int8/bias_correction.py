"""Bias correction for post-training int8: each layer's bias moved by the mean error its int8 kernel makes
on the int8 model's own input (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", 2019, in its empirical form, measured against the quantized upstream).

Rounding a kernel to int8 shifts the mean of every output channel by `sum(kernel error * E[input])`: small
against the output's magnitude, but not against its spread where the input is mostly one value and a
BatchNorm folded into the kernel divided by a small deviation. A MobileNetV3Small built with its own
`include_preprocessing` after a Rescaling of the user's sees its pixels in [-1.008, -0.992]: trained on the
digits at 96x96 (98.33 %), its stem convolution's int8 kernel alone moved 3.3 % of the test images to another
class, every other kernel of the network together none; the converter's int8 file lost 3.61 points.

For each CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED of the calibrated float model with a bias of its own,
its twin in the int8 model (TFLite's quantizer on the same calibrated model) is found by its output tensor's
name, and the bias takes minus

    (W_int8 - W) . E[input of the int8 layer]   (per output channel; channel means over samples and positions)

(a fused activation does not hide it: the pre-activation is linear in the input). The means are measured on
the int8 model, so each layer is corrected for the input it will see; a second pass (`PASSES`) measures them
again after the layers upstream were corrected. Taking the upstream's mean error too (`W_int8 . E[int8 input]
- W . E[float input]`) corrects every layer for errors the layers before it were corrected for at the same
time: the MobileNetV3Small then agreed with the float model on 10 % of the test images. Means over the
padding at a kernel's border are taken as the interior's. Weights, ranges and ops stay: the file is the
converter's int8 file with other int32 biases. While measuring (the second pass, and the candidate `auto`
scores) they are written into the int8 file (`round(bias / scale)`, the scale the file gives each int32
bias) rather than quantized again: TFLite's quantizer took 0.6 s a call on an EfficientNetB0, holding
Python's lock, twice a correction. The file written is TFLite's quantizer on the corrected float model (the
budget autopilot quantizes its mixes from that model); its rounding, from scales it holds in double
precision, put 13 of a MobileNetV3Small's 8162 int32 biases one step away from the measured file's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.converters.feeding import debugging_interpreter, feeder

NAME = "bias"
PASSES = 2
MAX_SAMPLES = 64  # channel means settle long before; each sample runs the int8 model with every tensor kept


@dataclass
class _Layer:
    """One layer with a bias: its op kind, the float (calibrated) model's weight and bias tensors and the
    int8 model's weight and input tensors."""

    kind: str
    weight: int
    bias: int
    q_weight: int
    q_input: int
    q_bias: int  # the int8 twin's int32 bias
    channels: int  # of the input, its last axis (a FULLY_CONNECTED's: the kernel's input size)


@dataclass
class Correction:
    """The corrected biases of the float (calibrated) model's tensors (`with_biases` writes them in) and the
    int8 file they were measured on with them as its int32 biases."""

    biases: dict[int, np.ndarray]
    tflite: bytes


def corrected(calibrated: bytes, samples: list, quantize: Callable[[bytes], bytes],
              first: bytes | None = None) -> Correction | None:
    """Each corrected bias of the calibrated model, measured on `quantize(calibrated)` (its int8 file, float
    inputs; `first`: that file where it was made already, the min/max file) on `samples`, and that file with
    them as its int32 biases; None where no layer has a bias to correct."""
    from edgekit.runtime.schema import unpack

    samples = samples[:: max(1, len(samples) // MAX_SAMPLES)][:MAX_SAMPLES]
    int8 = first if first is not None else quantize(calibrated)
    model, q = unpack(calibrated), unpack(int8)  # as given: only the biases change, pass by pass
    layers = _layers(model, q)
    if not layers:
        return None
    biases: dict[int, np.ndarray] = {}
    for _ in range(PASSES):
        means = _channel_means(_written(int8, q, layers, biases), q, samples,
                               {layer.q_input: layer.channels for layer in layers})
        for layer in layers:
            shift = _shift(layer, model, q, means.get(layer.q_input))
            if shift is not None:
                biases[layer.bias] = (_array(model, layer.bias) - shift).astype(np.float32)
    return Correction(biases, _written(int8, q, layers, biases))


def _written(int8: bytes, q, layers: list[_Layer], biases: dict[int, np.ndarray]) -> bytes:
    """`int8` (`q` unpacked) with the `biases` of `layers` as their twins' int32 biases, by the scale the file
    gives each (per channel or one), in place."""
    from edgekit.runtime.schema import with_tensor_data

    data = {}
    for layer in layers:
        if layer.bias in biases:
            scale = np.asarray(q.subgraphs[0].tensors[layer.q_bias].quantization.scale, np.float64)
            values = np.round(biases[layer.bias].astype(np.float64) / scale)
            data[layer.q_bias] = np.clip(values, -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
    return with_tensor_data(int8, data) if data else int8


def with_biases(calibrated: bytes, biases: dict[int, np.ndarray]) -> bytes:
    """The calibrated model (or one with the same tensors: its logits view) with `biases` written in."""
    from edgekit.runtime.schema import with_tensor_data

    return with_tensor_data(calibrated, biases)


KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def _code_names(model) -> list[str]:
    from edgekit.runtime.schema import enum_names, schema_module

    names = enum_names(schema_module().BuiltinOperator)
    return [names.get(max(c.builtinCode, c.deprecatedBuiltinCode), "") for c in model.operatorCodes]


def _layers(model, q) -> list[_Layer]:
    """The layers of `model` (float) with a float bias of their own, each with its int8 twin in `q` found by
    its output tensor's name (the same op kind, an int8 kernel with per-channel or per-tensor scales)."""
    from edgekit.runtime.schema import schema_module

    s = schema_module()
    graph, q_graph = model.subgraphs[0], q.subgraphs[0]
    kinds, q_kinds = _code_names(model), _code_names(q)
    # an op writing a float graph output writes int8 under another name ("...1") into a DEQUANTIZE that keeps
    # the output's (a logits view's logits layer, `ranges.logits_view`): it answers to that name too
    dequantized = {int(op.inputs[0]): q_graph.tensors[op.outputs[0]].name for op in q_graph.operators
                   if q_kinds[op.opcodeIndex] == "DEQUANTIZE" and op.inputs is not None and op.outputs is not None}
    twins: dict[tuple[str, bytes | None], Any] = {}  # (op kind, output name) -> the int8 op (an OperatorT)
    for op in q_graph.operators:
        if op.outputs is not None and len(op.outputs):
            out = int(op.outputs[0])
            for name in (q_graph.tensors[out].name, dequantized.get(out)):
                twins.setdefault((q_kinds[op.opcodeIndex], name), op)
    buffer_users: dict[int, int] = {}
    for t in graph.tensors:
        buffer_users[t.buffer] = buffer_users.get(t.buffer, 0) + 1
    found = []
    for op in graph.operators:
        kind = kinds[op.opcodeIndex]
        ins = [] if op.inputs is None else [int(i) for i in op.inputs]
        if kind not in KINDS or len(ins) < 3 or min(ins[:3]) < 0 or not len(op.outputs):
            continue
        twin = twins.get((kind, graph.tensors[op.outputs[0]].name))
        if twin is None or len(twin.inputs) < 3 or int(twin.inputs[2]) < 0:
            continue
        weight, bias = graph.tensors[ins[1]], graph.tensors[ins[2]]
        q_weight, q_bias = q_graph.tensors[int(twin.inputs[1])], q_graph.tensors[int(twin.inputs[2])]
        if weight.type != s.TensorType.FLOAT32 or bias.type != s.TensorType.FLOAT32 or buffer_users[bias.buffer] != 1 \
                or q_weight.type != s.TensorType.INT8 or not _scaled(q_weight) or not _has_data(model, ins[1]) \
                or not _has_data(model, ins[2]) or not _has_data(q, int(twin.inputs[1])) \
                or q_bias.type != s.TensorType.INT32 or not _scaled(q_bias) \
                or len(q_bias.quantization.scale) not in (1, int(np.prod(bias.shape))):
            continue
        if kind == "DEPTHWISE_CONV_2D":  # [1, h, w, in * multiplier]: the input's channels from its tensor
            in_shape = graph.tensors[ins[0]].shape
            channels = int(in_shape[-1]) if in_shape is not None and len(in_shape) else 0
        else:  # [out, h, w, in], [out, in]
            channels = int(weight.shape[-1])
        if channels:
            found.append(_Layer(kind, ins[1], ins[2], int(twin.inputs[1]), int(twin.inputs[0]), int(twin.inputs[2]),
                                channels))
    return found


def _scaled(tensor) -> bool:
    quant = tensor.quantization
    return quant is not None and quant.scale is not None and len(quant.scale) > 0


def _has_data(model, index: int) -> bool:
    from edgekit.runtime.flatbuffer import tensor_values

    return tensor_values(model, model.subgraphs[0].tensors[index]) is not None


def _array(model, index: int) -> np.ndarray:
    from edgekit.runtime.flatbuffer import tensor_values

    values = tensor_values(model, model.subgraphs[0].tensors[index])
    assert values is not None  # `_layers` checked it with `_has_data`
    return values


def _dequantized_weight(q, index: int) -> np.ndarray:
    tensor = q.subgraphs[0].tensors[index]
    values = _array(q, index).astype(np.float64)
    quant = tensor.quantization
    scale = np.asarray(quant.scale, np.float64)
    zero = np.asarray(quant.zeroPoint if quant.zeroPoint is not None else [0], np.float64)
    if scale.size == 1:
        return (values - zero[0]) * scale[0]
    shape = [1] * values.ndim
    shape[int(quant.quantizedDimension)] = scale.size
    return (values - zero.reshape(shape)) * scale.reshape(shape)


def _channel_means(tflite: bytes, model, samples: list, channels: dict[int, int]) -> dict[int, np.ndarray]:
    """Mean over `samples` (and every position) of each tensor's channels (its values reshaped to
    (-1, channels[index])), dequantized where the tensor is int8; a tensor whose size does not divide is
    left out."""
    interp = debugging_interpreter(tflite, samples[0])
    feed = feeder(interp)
    sums: dict[int, np.ndarray] = {}
    for sample in samples:
        feed(sample)
        for index, c in channels.items():
            v = interp.get(index)
            if v.size % c == 0 and v.size:
                sums[index] = sums.get(index, 0.0) + v.reshape(-1, c).astype(np.float64).mean(axis=0)
    means = {}
    for index, total in sums.items():
        mean = total / len(samples)
        quant = model.subgraphs[0].tensors[index].quantization
        if quant is not None and quant.scale is not None and len(quant.scale):
            zero = quant.zeroPoint[0] if quant.zeroPoint is not None and len(quant.zeroPoint) else 0
            mean = (mean - float(zero)) * float(quant.scale[0])
        means[index] = mean
    return means


def _shift(layer: _Layer, model, q, mean: np.ndarray | None) -> np.ndarray | None:
    """The mean error of the int8 layer's pre-activation from its kernel's rounding, per output channel, on
    inputs of channel means `mean`."""
    if mean is None:
        return None
    error = _dequantized_weight(q, layer.q_weight) - _array(model, layer.weight).astype(np.float64)
    if layer.kind == "FULLY_CONNECTED":  # [out, in]
        shift = error @ mean if error.ndim == 2 and error.shape[1] == layer.channels else None
    elif layer.kind == "CONV_2D":  # [out, h, w, in]; a grouped convolution's kernel has fewer inputs
        shift = np.einsum("ohwi,i->o", error, mean) if error.ndim == 4 and error.shape[3] == layer.channels else None
    elif error.ndim == 4 and error.shape[3] % layer.channels == 0:  # DEPTHWISE_CONV_2D: [1, h, w, in * multiplier]
        source = np.arange(error.shape[3]) // (error.shape[3] // layer.channels)
        shift = error.sum(axis=(0, 1, 2)) * mean[source]
    else:
        shift = None
    bias = _array(model, layer.bias)
    return shift if shift is not None and shift.shape == bias.shape and np.all(np.isfinite(shift)) else None
