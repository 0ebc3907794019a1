"""Cross-layer equalisation of a calibrated TFLite model's weights, for int8 calibration (an `auto` candidate).

int8 activations share one scale per tensor: a tensor whose channels differ in size by 100x leaves the small
channels a few steps of it. Where a layer's output channel c reaches its consumers only through ops that
commute with a positive scale (a fused or separate ReLU, pooling), its weights and bias (or a LayerNorm's
gamma and beta) can be divided by s_c and the consumers' input weights of channel c multiplied by s_c: the
float function is the same, the tensor's channels are not. s_c = sqrt(r1_c / r2_c), r1 the producer's range
for channel c (its weights, or gamma and beta), r2 the consumers' input weights, balances both sides (Nagel et
al. 2019, "Data-Free Quantization", for conv -> ReLU -> conv; SmoothQuant's alpha = 0.5 migration for
LayerNorm -> Dense and attention's query / key / value projections).

It works on the converter's calibrated model itself (TFLite's graph: BatchNorm already folded into its
convolution, the model's nesting flattened), so the variant costs no second TF conversion (the outlier CNN:
0.6 s, as long as its plain conversion; a ViT: 3.8 s): the scaled weights are written where they sit in the
flatbuffer and the moved tensors' ranges measured again as the converter measures them, min and max over the
calibration samples, on the equalised float model. Producers: CONV_2D and FULLY_CONNECTED with no fused
activation or ReLU, and the LayerNormalization TFLite's converter writes out as x * (rsqrt(var + eps) * gamma)
+ (beta - mean * rsqrt(var + eps) * gamma); consumers: CONV_2D (not grouped) and FULLY_CONNECTED reading the
tensor as their input. A weight used by more than one op, a tensor that is a graph output or reaches anything
else is left alone, and the equalised float model must give the float model's outputs on a sample (else
ConversionError: auto skips the candidate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.errors import ConversionError

NAME = "equalize"
SWEEPS = 4  # a chain conv0 -> conv1 -> conv2 settles over a few passes (DFQ iterates the same way)
# a candidate only where some channel moves by this factor or more: below it the ranges barely change (a
# MobileNetV3Small whose largest move was 4.3x scored worse than min/max; the outlier models that need it move
# 134x and 213x)
WORTH = 8.0
PASS_THROUGH = {"MAX_POOL_2D", "AVERAGE_POOL_2D", "RELU", "LEAKY_RELU"}  # channels last in, channels last out
HOMOGENEOUS = (0, 1)  # ActivationFunctionType NONE, RELU: the fused activations a positive scale commutes with
LN_SPAN = 3.0  # a LayerNormalization output channel's range: about |gamma| * 3 + |beta| (normalised input)
TOLERANCE = 1e-3  # the equalised float model's outputs against the float model's: largest error / largest value


@dataclass
class Pair:
    """A producer's output channels and its consumers' input weights: (tensor index, channel axis) each."""

    producer: str
    divide: list[tuple[int, int]]
    multiply: list[tuple[int, int]]
    layer_norm: bool = False  # divide = [gamma, beta]: the range is |gamma| * LN_SPAN + |beta|
    starts: list[int] = field(default_factory=list)  # the ops that read `divide`: the moved tensors start there
    consumers: list[int] = field(default_factory=list)  # op indices: the moved tensors stop there
    consumer_names: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """The pairs found, the weights equalised (tensor index -> values) and the largest ratio between the factors
    two channels of a layer moved by."""

    pairs: list[Pair] = field(default_factory=list)
    weights: dict[int, np.ndarray] = field(default_factory=dict)
    largest: float = 1.0
    moved: list[int] = field(default_factory=list)  # the tensors with a recorded range the weights change

    @property
    def worth_it(self) -> bool:
        return bool(self.pairs) and self.largest >= WORTH

    def describe(self) -> dict[str, Any]:
        return {"pairs": len(self.pairs), "largest_factor": round(float(self.largest), 3),
                "producers": [p.producer.split(";")[0] for p in self.pairs]}


class _Graph:
    """The main graph of a .tflite, read once through the runtime's flatbuffer view (`runtime.inspect.operators`,
    the walk the autopilot and the sparsity report share): op kinds, readers and writers, constants."""

    def __init__(self, tflite: bytes):
        from edgekit.runtime.inspect import operators
        from edgekit.runtime.schema import schema_module

        self.s = schema_module()
        self.view, sub, walked = operators(tflite)
        self.tensors = sub.tensors
        self.ops = [op for _, _, op in walked]
        self.kinds = [kind for _, kind, _ in walked]
        self.writer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in op.outputs:
                self.writer[t] = i
            for t in op.inputs:
                if t >= 0:
                    self.readers.setdefault(t, []).append(i)
        self.outputs = set(sub.outputs)
        users: dict[int, int] = {}
        for tensor in self.tensors:
            users[tensor.buffer] = users.get(tensor.buffer, 0) + 1
        self.buffer_users = users

    def inputs(self, op: int) -> list[int]:
        return list(self.ops[op].inputs)

    def output(self, op: int) -> int:
        return self.ops[op].outputs[0]

    def data(self, t: int, dtype) -> np.ndarray | None:
        """A constant's values, or None where the tensor has none in the file."""
        values = self.view.constant(self.tensors[t])
        return None if values is None or values.dtype != dtype else values

    def constant(self, t: int) -> np.ndarray | None:
        """A float32 constant read by one op only (its buffer its own), else None."""
        if t < 0 or self.tensors[t].type != self.s.TensorType.FLOAT32 or \
                self.buffer_users[self.tensors[t].buffer] != 1 or len(self.readers.get(t, [])) != 1:
            return None
        return self.data(t, np.float32)

    def weight(self, t: int) -> np.ndarray:
        """A constant already found to be one (`constant` gave its values): a weight of a pair."""
        value = self.constant(t)
        assert value is not None  # only constants are paired (for the type checker)
        return value

    def fused(self, op: int) -> int | None:
        options = self.ops[op].options()
        if options is None or not hasattr(options, "FusedActivationFunction"):
            return None
        return options.FusedActivationFunction()

    def channels(self, t: int) -> int:
        shape = self.tensors[t].shape
        return int(shape[-1]) if len(shape) else 0


def plan(calibrated: bytes) -> Plan:
    """The producer -> consumer pairs of a calibrated (float) TFLite model and its equalised weights."""
    try:
        g = _Graph(calibrated)
        pairs = [p for op in range(len(g.ops)) if (p := _pair(g, op)) is not None]
    except (AttributeError, TypeError, ValueError, KeyError, IndexError):  # a graph it does not read: no pairs
        return Plan()
    claimed: set[tuple[int, int]] = set()
    found = []
    for p in pairs:  # a weight is scaled along one axis by one pair only (a layer may be consumer and producer)
        keys = {(t, axis) for t, axis in p.divide + p.multiply}
        if not keys & claimed:
            found.append(p)
            claimed |= keys
    weights = {t: g.weight(t).astype(np.float64) for p in found for t, _ in p.divide + p.multiply}
    largest = _equalise(found, weights)
    return Plan(found, {t: v.astype(np.float32) for t, v in weights.items()}, largest, _moved(g, found, calibrated))


def _pair(g: _Graph, op: int) -> Pair | None:
    made = _producer(g, op)
    if made is None:
        return None
    divide, starts, layer_norm = made
    tensor = g.output(op)
    channels = g.channels(tensor)
    while True:  # through ops that commute with a positive per-channel scale
        readers = _value_readers(g, tensor)
        if len(readers) != 1 or tensor in g.outputs or not _passes(g, readers[0]):
            break
        tensor = g.output(readers[0])
    readers = _value_readers(g, tensor)
    if tensor in g.outputs or not readers:
        return None
    multiply = []
    for user in readers:
        side = _consumer(g, user, tensor, channels)
        if side is None:
            return None
        multiply.append(side)
    return Pair(_name(g, op), divide, multiply, layer_norm, starts, list(readers), [_name(g, r) for r in readers])


def _name(g: _Graph, op: int) -> str:
    """An op's name: its output tensor's (TFLite joins the names of the ops it fused with ';')."""
    return g.tensors[g.output(op)].name


def _value_readers(g: _Graph, tensor: int) -> list[int]:
    """The ops reading a tensor's values (a SHAPE reads only its shape: Keras' Dense on a sequence computes
    its reshape's size from one)."""
    return [op for op in g.readers.get(tensor, []) if g.kinds[op] != "SHAPE"]


def _passes(g: _Graph, op: int) -> bool:
    """Does channel c of the op's input stay channel c of its output, scaled alike? Pooling and ReLU; a
    RESHAPE, EXPAND_DIMS or SQUEEZE that keeps the last axis's size; a RESHAPE read by a FULLY_CONNECTED
    only (which reads its input as rows of its input size: a reshape moves no value, so channel c stays
    its column c; Keras' Dense on a sequence flattens it so)."""
    if g.kinds[op] in PASS_THROUGH:
        return True
    if g.kinds[op] == "MEAN":  # global average pooling: over axes other than the last
        return _keeps_last_axis(g, op)
    if g.kinds[op] not in ("RESHAPE", "EXPAND_DIMS", "SQUEEZE"):
        return False
    if _last_dim(g, g.inputs(op)[0]) == _last_dim(g, g.output(op)) > 0:  # Conv1D's expand and squeeze: channel
        return True  # c of every position stays c when the last axis keeps its size (a reshape moves no value)
    if g.kinds[op] != "RESHAPE":
        return False
    readers = _value_readers(g, g.output(op))
    return len(readers) == 1 and g.kinds[readers[0]] == "FULLY_CONNECTED"


def _producer(g: _Graph, op: int) -> tuple[list[tuple[int, int]], list[int], bool] | None:
    """(constants to divide with their channel axis, the ops reading them, LayerNorm?) of a producer op."""
    kind, ins = g.kinds[op], g.inputs(op)
    if kind in ("CONV_2D", "FULLY_CONNECTED"):
        if g.fused(op) not in HOMOGENEOUS or len(ins) < 2 or g.constant(ins[1]) is None:
            return None
        divide = [(ins[1], 0)]  # [out, h, w, in] / [out, in]
        if len(ins) > 2 and ins[2] >= 0:
            if g.constant(ins[2]) is None:
                return None
            divide.append((ins[2], 0))
        return divide, [op], False
    if kind == "ADD" and g.fused(op) == 0:
        return _layer_norm(g, op)
    return None


def _layer_norm(g: _Graph, op: int) -> tuple[list[tuple[int, int]], list[int], bool] | None:
    """TFLite's LayerNormalization ends in ADD(MUL(x, m), ADD(MUL(-mean, m), beta)), m = MUL(rsqrt, gamma):
    scaling gamma and beta scales its output's channels (the last axis)."""
    ins = g.inputs(op)
    if len(ins) != 2:
        return None
    for a, b in (ins, ins[::-1]):
        scaled, shifted = g.writer.get(a), g.writer.get(b)
        if scaled is None or shifted is None or g.kinds[scaled] != "MUL" or g.kinds[shifted] != "ADD":
            continue
        beta = [t for t in g.inputs(shifted) if g.constant(t) is not None]
        centred = [g.writer.get(t) for t in g.inputs(shifted) if g.constant(t) is None]
        if len(beta) != 1 or len(centred) != 1 or centred[0] is None or g.kinds[centred[0]] != "MUL":
            continue
        shared = set(g.inputs(scaled)) & set(g.inputs(centred[0]))
        for m in shared:
            writer = g.writer.get(m)
            if writer is None or g.kinds[writer] != "MUL" or sorted(g.readers.get(m, [])) != sorted((scaled, centred[0])):
                continue
            gamma = [t for t in g.inputs(writer) if g.constant(t) is not None]
            channels = g.channels(g.output(op))
            if len(gamma) == 1 and all(g.weight(t).size == channels and g.weight(t).shape[-1] == channels
                                       for t in (gamma[0], beta[0])):
                return [(gamma[0], -1), (beta[0], -1)], [writer, shifted], True
    return None


def _last_dim(g: _Graph, t: int) -> int:
    """A tensor's last dimension where it is known (not open in its signature), else 0."""
    tensor = g.tensors[t]
    signature = tensor.shape_signature or tensor.shape
    return int(signature[-1]) if len(signature) and int(signature[-1]) > 0 else 0


def _keeps_last_axis(g: _Graph, op: int) -> bool:
    ins = g.inputs(op)
    if len(ins) != 2 or ins[1] < 0 or g.tensors[ins[1]].type != g.s.TensorType.INT32:
        return False
    axes, rank = g.data(ins[1], np.int32), len(g.tensors[ins[0]].shape)
    if axes is None or not axes.size or not rank:
        return False
    return rank - 1 not in axes.reshape(-1) % rank


def _consumer(g: _Graph, op: int, tensor: int, channels: int) -> tuple[int, int] | None:
    """(input weights, their channel axis) of a CONV_2D (not grouped) or FULLY_CONNECTED reading `tensor`, of
    `channels` channels, as its input; else None."""
    ins = g.inputs(op)
    if g.kinds[op] not in ("CONV_2D", "FULLY_CONNECTED") or len(ins) < 2 or ins[0] != tensor or tensor in ins[1:]:
        return None
    weight = g.constant(ins[1])
    if weight is None or weight.ndim != (4 if g.kinds[op] == "CONV_2D" else 2) or weight.shape[-1] != channels:
        return None  # [out, h, w, in] / [out, in]
    return ins[1], -1


def _equalise(pairs: list[Pair], weights: dict[int, np.ndarray]) -> float:
    """Scales `weights` in place, pair by pair, `SWEEPS` times; the largest ratio of two channels' factors in
    one layer."""
    total: dict[int, np.ndarray] = {}
    for _ in range(SWEEPS):
        for k, p in enumerate(pairs):
            if p.layer_norm:
                (gamma, _), (beta, _) = p.divide
                r1 = LN_SPAN * np.abs(weights[gamma]).reshape(-1) + np.abs(weights[beta]).reshape(-1)
            else:
                r1 = _channel_range(weights[p.divide[0][0]], p.divide[0][1])
            r2 = np.max([_channel_range(weights[t], axis) for t, axis in p.multiply], axis=0)
            s = np.sqrt(np.divide(r1, r2, out=np.ones_like(r1), where=(r1 > 0) & (r2 > 0)))
            s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
            for t, axis in p.divide:
                weights[t] = _scaled(weights[t], axis, 1.0 / s)
            for t, axis in p.multiply:
                weights[t] = _scaled(weights[t], axis, s)
            total[k] = s if k not in total else total[k] * s
    # how far a layer's channels move apart: a factor shared by all of them changes no int8 range's use (the
    # digits CNN's first convolution, its Rescaling(1/255) folded in, moves all its channels by about 90x)
    moved = [np.max(s) / np.min(s) for s in total.values() if s.size]
    return float(max(moved, default=1.0))


def _scaled(value: np.ndarray, axis: int, s: np.ndarray) -> np.ndarray:
    shape = [1] * value.ndim
    shape[axis] = -1
    return value * s.reshape(shape)


def _channel_range(value: np.ndarray, axis: int) -> np.ndarray:
    value = np.abs(value)
    return np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1).max(axis=1)


def equalised(calibrated: bytes, found: Plan, samples: list) -> bytes:
    """The calibrated model with `found`'s weights written in and the ranges of the tensors they move measured
    again on `samples` (representative-dataset entries: min and max over all, as the converter records them)."""
    from edgekit.converters.feeding import debugging_interpreter, feeder
    from edgekit.runtime.schema import patched, with_tensor_data

    model = with_tensor_data(calibrated, found.weights)
    moved = found.moved
    interp = debugging_interpreter(model, samples[0])
    feed = feeder(interp)
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    for sample in samples:
        feed(sample)
        for t in moved:
            v = interp.get(t)
            if v.size:
                lo[t], hi[t] = min(lo.get(t, np.inf), float(v.min())), max(hi.get(t, -np.inf), float(v.max()))
    _same_function(calibrated, model, samples[0])
    made = patched(model, ranges={t: (lo[t], hi[t]) for t in lo})
    if made is None:
        raise ConversionError("equalisation could not write the moved tensors' ranges into this model")
    return made


def _moved(g: _Graph, pairs: list[Pair], calibrated: bytes) -> list[int]:
    """The tensors with a recorded range whose values the scaled weights change: from the ops reading the
    divided weights forward, up to (not past) the consumers."""
    from edgekit.converters.int8.ranges import ranged_tensors

    stop = {op for p in pairs for op in p.consumers}
    todo = [op for p in pairs for op in p.starts]
    seen_ops: set[int] = set()
    moved: set[int] = set()
    starts = set(todo)
    while todo:  # a consumer's output moves only where it is a producer too
        op = todo.pop()
        if op in seen_ops or (op in stop and op not in starts):
            continue
        seen_ops.add(op)
        for t in g.ops[op].outputs:
            moved.add(t)
            todo += _value_readers(g, t)
    ranged = ranged_tensors(calibrated)
    return sorted(t for t in moved if t in ranged)


def _same_function(calibrated: bytes, model: bytes, sample) -> None:
    """The equalised float model's outputs must be the float model's on `sample`: a pattern read wrongly would
    change what the model computes (a ConversionError: auto skips the candidate)."""
    from edgekit.converters.feeding import debugging_interpreter, feeder

    outputs = []
    for tflite in (calibrated, model):
        interp = debugging_interpreter(tflite, sample)
        feeder(interp)(sample)
        outputs.append([interp.get(d["index"]).astype(np.float64) for d in interp.output_details()])
    for a, b in zip(*outputs):
        if a.shape != b.shape or np.max(np.abs(a - b), initial=0.0) > TOLERANCE * max(np.max(np.abs(a), initial=0.0), 1e-6):
            raise ConversionError("cross-layer equalisation changed this model's outputs (a pattern it misread); "
                                  "not used")
