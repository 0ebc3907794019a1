"""Cross-layer equalisation of a Keras model's weights, for int8 calibration (an `auto` candidate).

int8 activations share one scale per tensor: a tensor whose channels differ in size by 100x leaves the small
channels a few steps of it. Where a layer's output channel c reaches its consumers only through ops that
commute with a positive scale (ReLU, pooling, dropout), its weights (or its BatchNormalization /
LayerNormalization's gamma and beta) can be divided by s_c and the consumers' input weights of channel c
multiplied by s_c: the float function is the same, the tensor's channels are not. s_c = sqrt(r1_c / r2_c),
r1 the producer's range for channel c (its weights, or gamma and beta), r2 the consumers' input weights,
balances both sides (Nagel et al. 2019, "Data-Free Quantization", for conv -> ReLU -> conv; SmoothQuant's
alpha = 0.5 migration for LayerNorm -> Dense and attention's query / key / value projections).

Only Keras 3 functional graphs (nested ones included) are read; a layer called more than once, a tensor that
is also a model output or reaches anything but a Dense, Conv or MultiHeadAttention, is left alone.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from edgekit.converters.keras_graph import Graph, activation, functional
from edgekit.converters.keras_graph import kind as kind_of

NAME = "equalize"
SWEEPS = 4  # a chain conv0 -> conv1 -> conv2 settles over a few passes (DFQ iterates the same way)
# a candidate only where some channel moves by this factor or more: below it the ranges barely change, and the
# second TF conversion costs about the plain conversion's time (a MobileNetV3Small whose largest move is 4.3x:
# 5.3 s of the plain file's 6.8, scored worse than min/max; the outlier models that need it move 134x and 213x)
WORTH = 8.0
PASS_THROUGH = {"MaxPooling1D", "MaxPooling2D", "AveragePooling1D", "AveragePooling2D", "GlobalAveragePooling1D",
                "GlobalAveragePooling2D", "GlobalMaxPooling1D", "GlobalMaxPooling2D", "Dropout", "ZeroPadding1D",
                "ZeroPadding2D", "SpatialDropout1D", "SpatialDropout2D"}  # channels last in, channels last out
LN_SPAN = 3.0  # a LayerNormalization output channel's range: about |gamma| * 3 + |beta| (normalised input)


@dataclass
class Pair:
    """A producer's output channels and the consumers' matching input weights: (variable, channel axis)."""

    producer: str
    consumers: list[str]
    divide: list[tuple[Any, int]]
    multiply: list[tuple[Any, int]]
    producer_range: Any  # () -> per-channel range of the producer side, from the current weights


@dataclass
class Plan:
    pairs: list[Pair] = field(default_factory=list)
    largest: float = 1.0  # the largest factor any channel moved by (s or 1/s) once applied
    _equalised: dict[int, Any] = field(default_factory=dict, repr=False)  # id(variable) -> its equalised value

    @property
    def worth_it(self) -> bool:
        return bool(self.pairs) and self.largest >= WORTH

    @contextmanager
    def applied(self) -> Iterator["Plan"]:
        """The model's weights equalised inside the block, restored after it."""
        saved = {id(v): (v, np.array(v.numpy())) for p in self.pairs for v, _ in p.divide + p.multiply}
        try:
            if self._equalised:  # computed once (by `plan`), assigned again
                for key, (v, _) in saved.items():
                    v.assign(self._equalised[key])
            else:
                self.largest = _equalise(self.pairs)
                self._equalised = {key: np.array(v.numpy()) for key, (v, _) in saved.items()}
            yield self
        finally:
            for v, value in saved.values():
                v.assign(value)

    def describe(self) -> dict[str, Any]:
        return {"pairs": len(self.pairs), "largest_factor": round(float(self.largest), 3),
                "producers": [p.producer for p in self.pairs]}


def plan(model) -> Plan:
    """The producer -> consumer pairs of a Keras 3 functional model (and the models nested in it), with the
    factors the equalisation would move channels by; an empty plan for any other model."""
    try:
        pairs = _pairs(model)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError):  # not a graph this module reads
        return Plan()
    found = Plan(pairs)
    if pairs:
        with found.applied():  # measure the factors, then restore
            pass
    return found


def _equalise(pairs: list[Pair]) -> float:
    total = {id(p): None for p in pairs}
    for _ in range(SWEEPS):
        for p in pairs:
            r1 = np.asarray(p.producer_range(), np.float64)
            r2 = np.max([_channel_range(v, axis) for v, axis in p.multiply], axis=0)
            s = np.sqrt(np.divide(r1, r2, out=np.ones_like(r1), where=(r1 > 0) & (r2 > 0)))
            s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
            for v, axis in p.divide:
                v.assign(_scaled(v, axis, 1.0 / s))
            for v, axis in p.multiply:
                v.assign(_scaled(v, axis, s))
            total[id(p)] = s if total[id(p)] is None else total[id(p)] * s
    moved = [np.max(np.maximum(s, 1.0 / s)) for s in total.values() if s is not None and s.size]
    return float(max(moved, default=1.0))


def _scaled(v, axis: int, s: np.ndarray) -> np.ndarray:
    value = np.array(v.numpy())
    shape = [1] * value.ndim
    shape[axis] = -1
    return (value * s.reshape(shape)).astype(value.dtype)


def _channel_range(v, axis: int) -> np.ndarray:
    value = np.abs(np.asarray(v.numpy(), np.float64))
    return np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1).max(axis=1)


# -- the graph ------------------------------------------------------------------------------------------------
def _pairs(model, seen: set[int] | None = None) -> list[Pair]:
    graph = Graph.of(model)
    seen = set() if seen is None else seen
    found = []
    for n in graph.nodes:
        op = n.operation
        if functional(op) is not None:  # a model inside the model: its own graph, read once however often called
            if id(op) not in seen:
                seen.add(id(op))
                found += _pairs(op, seen)
            continue
        if graph.calls[id(op)] != 1:
            continue
        pair = _pair_from(n, graph)
        if pair is not None:
            found.append(pair)
    return found


def _producer(node, graph: Graph):
    """(side to divide, range function, name, the tensor the channels leave by) or None."""
    op = node.operation
    if kind_of(op) == "LayerNormalization":
        if not (op.scale and op.center) or getattr(op, "rms_scaling", False) or list(np.atleast_1d(op.axis)) not in \
                ([-1], [len(node.outputs[0].shape) - 1]):
            return None
        return ([(op.gamma, 0), (op.beta, 0)],
                lambda: LN_SPAN * np.abs(op.gamma.numpy()) + np.abs(op.beta.numpy()), op.name, node.outputs[0])
    if kind_of(op) not in ("Conv1D", "Conv2D", "Dense") or activation(op) not in ("linear", "relu") \
            or getattr(op, "data_format", "channels_last") != "channels_last":
        return None
    out = node.outputs[0]
    after = graph.sole_reader(out)
    if after is not None and kind_of(after.operation) == "BatchNormalization":
        bn = after.operation
        if activation(op) != "linear" or not (bn.scale and bn.center) or np.atleast_1d(bn.axis)[0] not in \
                (-1, len(out.shape) - 1):
            return None

        def folded():
            gain = np.abs(bn.gamma.numpy()) / np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
            return _channel_range(op.kernel, -1) * gain

        return [(bn.gamma, 0), (bn.beta, 0)], folded, op.name, after.outputs[0]
    divide = [(op.kernel, -1)] + ([(op.bias, 0)] if op.use_bias else [])
    return divide, lambda: _channel_range(op.kernel, -1), op.name, out


def _positive_homogeneous(op) -> bool:
    kind = kind_of(op)
    if kind in PASS_THROUGH:
        return getattr(op, "data_format", "channels_last") == "channels_last"
    if kind == "ReLU":
        return op.max_value is None and float(op.threshold) == 0.0
    if kind == "LeakyReLU":
        return True
    return kind == "Activation" and activation(op) in ("relu", "linear")


def _pair_from(node, graph: Graph) -> Pair | None:
    made = _producer(node, graph)
    if made is None:
        return None
    divide, producer_range, name, tensor = made
    while True:  # through ops that commute with a positive per-channel scale
        after = graph.sole_reader(tensor)
        if after is None or not _positive_homogeneous(after.operation):
            break
        tensor = after.outputs[0]
    users = graph.readers.get(id(tensor), [])
    if id(tensor) in graph.outputs or not users:
        return None
    multiply = []
    for user in users:
        sides = _consumer_side(user, tensor, graph.calls)
        if sides is None:
            return None
        multiply += sides
    return Pair(name, [u.operation.name for u in users], divide, multiply, producer_range)


def _consumer_side(node, tensor, calls) -> list[tuple[Any, int]] | None:
    op = node.operation
    if calls[id(op)] != 1:
        return None
    kind = kind_of(op)
    if kind == "Dense":
        return [(op.kernel, 0)]
    if kind in ("Conv1D", "Conv2D") and op.groups == 1 and op.data_format == "channels_last":
        return [(op.kernel, -2)]
    if kind == "MultiHeadAttention" and all(t is tensor for t in node.input_tensors):
        return [(op._query_dense.kernel, 0), (op._key_dense.kernel, 0), (op._value_dense.kernel, 0)]  # noqa: SLF001
    return None
