"""Structured channel pruning of Keras 3 models: whole output channels of Conv and Dense layers removed, with
the weights that read them, so the model is physically smaller.

Channels live in *spaces*. A Conv1D / Conv2D / Dense output opens one; an op that keeps channel c at channel c
(BatchNormalization, an activation, pooling, padding, dropout, a DepthwiseConv2D of multiplier 1, a scalar
product) carries it on; an Add / Subtract / Multiply / Maximum / Minimum / Average of several tensors joins their
spaces (a residual block's convs, a squeeze-excite gate and the features it scales), so the same channels go
from all of them. Conv and Dense layers that read a space lose their input weights of the removed channels.
Anything else that reads a space (Flatten, Reshape, Concatenate, LayerNormalization, attention, a model
output, a layer called twice, a nested model's boundary) keeps all of its channels. Each prunable space keeps
the channels of most importance: each producer's L1 norm of the channel's weights over the producer's mean,
summed over producers, times the gain of the BatchNormalizations in the space (network slimming's |gamma|).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgekit.converters.keras_graph import Graph, activation, functional, kind
from edgekit.errors import ModelFormatError, one_line

PRODUCERS = ("Conv1D", "Conv2D", "Dense", "SeparableConv1D", "SeparableConv2D")
CARRIERS = {"BatchNormalization", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "Dropout", "SpatialDropout1D",
            "SpatialDropout2D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "MaxPooling1D", "MaxPooling2D",
            "AveragePooling1D", "AveragePooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
            "GlobalMaxPooling1D", "GlobalMaxPooling2D", "ZeroPadding1D", "ZeroPadding2D", "Cropping1D",
            "Cropping2D", "UpSampling1D", "UpSampling2D", "Identity", "DepthwiseConv2D", "Reshape",
            # Keras ops on one tensor (keras.ops.*) that keep channels
            "Relu", "Relu6", "Sigmoid", "HardSigmoid", "Silu", "HardSilu", "Swish", "HardSwish", "Gelu", "Tanh",
            "Elu", "Selu", "LeakyRelu", "Softplus", "Abs", "Negative"}
JOINS = {"Add", "Subtract", "Multiply", "Maximum", "Minimum", "Average"}
NORMALISING = {"softmax", "log_softmax"}  # activations over the channels: a removed channel changes the others
ROUND_TO = 8  # channel counts kept at multiples of 8 where a layer has 16 or more (SIMD kernels' widths)


@dataclass
class Plan:
    """What shrinking would do: per producer layer, channels before and kept, and the reasons spaces were left."""

    ratio: float
    skip: frozenset[str] = frozenset()
    kept: dict[str, tuple[int, int]] = field(default_factory=dict)  # producer name -> (channels, kept)
    left: dict[str, str] = field(default_factory=dict)  # producer name -> why its channels all stay
    _keep: dict[int, np.ndarray] = field(default_factory=dict, repr=False)  # space root -> kept indices
    _roles: dict[int, dict[str, int | None]] = field(default_factory=dict, repr=False)  # id(layer) -> in/out root
    _widths: dict[int, int] = field(default_factory=dict, repr=False)  # id(producer layer) -> new width

    @property
    def removes_anything(self) -> bool:
        return any(after < before for before, after in self.kept.values())


class _Spaces:
    """Union-find over channel spaces, with why a space may not lose channels."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.blocked: dict[int, str] = {}
        self.width: list[int] = []

    def new(self, width: int) -> int:
        self.parent.append(len(self.parent))
        self.width.append(width)
        return len(self.parent) - 1

    def find(self, s: int) -> int:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def join(self, spaces: list[int]) -> int:
        roots = {self.find(s) for s in spaces}
        root = min(roots)
        for r in roots:
            self.parent[r] = root
        return root

    def block(self, s: int | None, why: str) -> None:
        if s is not None:
            self.blocked.setdefault(self.find(s), why)

    def why_blocked(self, s: int) -> str | None:
        root = self.find(s)
        return next((why for b, why in self.blocked.items() if self.find(b) == root), None)


def plan(model, ratio: float, skip: frozenset[str] = frozenset()) -> Plan:
    """Which channels of `model` (Keras 3 functional or Sequential, nested models included) go to remove about
    `ratio` of each prunable space's channels; the spaces of the layers named in `skip` stay whole."""
    found, spaces = Plan(ratio, skip=frozenset(skip)), _Spaces()  # one set of spaces over nested graphs
    try:
        _plan_graph(model, ratio, found, spaces)
    except (AttributeError, TypeError) as exc:  # a tf_keras (Keras 2) or subclassed model: no graph to read
        raise ModelFormatError(f"channel pruning reads Keras 3 functional and Sequential models; this "
                               f"{type(model).__module__.split('.')[0]} {type(model).__name__} has no graph it can "
                               f"read ({one_line(exc)[:120]})") from None
    for roles in found._roles.values():
        for side, s in roles.items():
            roles[side] = None if s is None or spaces.find(s) not in found._keep else spaces.find(s)
    return found


def _plan_graph(model, ratio: float, found: Plan, spaces: _Spaces, seen: set[int] | None = None,
                calls: dict[int, int] | None = None) -> None:
    graph = Graph.of(model, calls)  # a nested graph takes the outermost model's call counts
    space_of: dict[int, int | None] = {}
    producers: dict[int, list] = {}  # space -> producer layers
    gains: dict[int, list] = {}  # space -> BatchNormalization layers in it
    seen = set() if seen is None else seen
    for node in graph.nodes:
        _visit(node, graph, spaces, space_of, producers, gains, found, ratio, seen)
    for t in graph.model.outputs:
        spaces.block(space_of.get(id(t)), "a model output")
    by_root: dict[int, list] = {}
    for s, layers in producers.items():
        by_root.setdefault(spaces.find(s), []).extend(layers)
    for root, layers in by_root.items():
        why = spaces.why_blocked(root)
        width = spaces.width[root]
        if why is not None:
            for layer in layers:
                found.left[layer.name] = why
                found.kept[layer.name] = (width, width)
            continue
        bns = [b for s, bs in gains.items() if spaces.find(s) == root for b in bs]
        keep = np.sort(np.argsort(-_importance(layers, bns), kind="stable")[:_kept(width, ratio)])
        found._keep[root] = keep
        for layer in layers:
            found.kept[layer.name] = (width, len(keep))
            found._widths[id(layer)] = len(keep)


def _visit(node, graph: Graph, spaces: _Spaces, space_of, producers, gains, found: Plan, ratio: float,
           seen: set[int]) -> None:
    op = node.operation
    ins = [space_of.get(id(t)) for t in node.input_tensors]
    k = kind(op)
    if functional(op) is not None:  # a nested model: its own graph (once however often called); its boundary
        if id(op) not in seen:  # keeps channels
            seen.add(id(op))
            _plan_graph(op, ratio, found, spaces, seen, graph.calls)
        for s in ins:
            spaces.block(s, f"read by the nested model {op.name}")
        return
    if graph.calls[id(op)] != 1 or len(node.outputs) != 1:
        for s in ins:
            spaces.block(s, f"read by {op.name}, called more than once or with several outputs")
        if k in PRODUCERS and node.outputs:
            width = int(node.outputs[0].shape[-1])
            found.kept[op.name], found.left[op.name] = (width, width), "called more than once"
        return
    out = node.outputs[0]  # the only one, from here on
    if k in PRODUCERS and getattr(op, "groups", 1) == 1 and getattr(op, "depth_multiplier", 1) == 1 \
            and getattr(op, "data_format", "channels_last") == "channels_last":
        s = spaces.new(int(out.shape[-1]))
        producers[s] = [op]
        if op.name in found.skip:
            spaces.block(s, "a skipped layer (training.skip_layers)")
        if activation(op) in NORMALISING:
            spaces.block(s, f"{op.name}'s {activation(op)} normalises over the channels")
        space_of[id(out)] = s
        found._roles[id(op)] = {"in": ins[0] if ins else None, "out": s}
        return
    constants = [a for a in _arguments(node) if not _is_tensor(a)]
    if (k in CARRIERS or (k in JOINS and all(np.ndim(c) == 0 for c in constants))) and len(ins) == 1 \
            and _keeps_channels(op, node):  # (a join with a scalar: x * 0.5)
        space_of[id(out)] = ins[0]
        if k in ("BatchNormalization", "DepthwiseConv2D", "Reshape"):  # weights, or a shape, by channel
            found._roles[id(op)] = {"in": ins[0], "out": None}
            if k == "BatchNormalization" and ins[0] is not None:
                gains.setdefault(ins[0], []).append(op)
        return
    if k in JOINS and len(ins) >= 2 and not constants:
        if any(s is None for s in ins) or len({spaces.width[spaces.find(s)] for s in ins}) != 1:
            for s in ins:
                spaces.block(s, f"joined by {op.name} with a tensor of no pruned layer or of another width")
            return
        space_of[id(out)] = spaces.join(ins)
        return
    for s in ins:
        spaces.block(s, f"read by {op.name} ({k})")


def _arguments(node) -> list:
    from keras import tree

    return tree.flatten((node.arguments.args, node.arguments.kwargs))


def _is_tensor(x) -> bool:
    from keras.src.backend import is_keras_tensor

    return is_keras_tensor(x)


def _keeps_channels(op, node) -> bool:
    k = kind(op)
    if getattr(op, "data_format", "channels_last") != "channels_last":
        return False
    if k == "Reshape":  # (C,) -> (1, 1, C), (H, W, C) -> (H * W, C): channel c stays at c
        return hasattr(op, "target_shape") and node.input_tensors[0].shape[-1] is not None and \
            node.input_tensors[0].shape[-1] == node.outputs[0].shape[-1]
    if k == "BatchNormalization":
        return np.atleast_1d(op.axis)[0] in (-1, len(node.outputs[0].shape) - 1)
    if k == "DepthwiseConv2D":
        return op.depth_multiplier == 1
    return not (k == "Softmax" or activation(op) in NORMALISING)  # those normalise over the channels


def _kept(width: int, ratio: float) -> int:
    keep = width * (1.0 - ratio)
    if width >= 2 * ROUND_TO:
        return int(min(width, max(ROUND_TO, ROUND_TO * round(keep / ROUND_TO))))
    return int(min(width, max(1, round(keep))))


def _kernel(layer):
    return layer.pointwise_kernel if hasattr(layer, "pointwise_kernel") else layer.kernel


def _importance(producers: list, bns: list) -> np.ndarray:
    score = 0.0
    for layer in producers:
        w = np.abs(np.asarray(_kernel(layer).numpy(), np.float64))
        norms = w.reshape(-1, w.shape[-1]).sum(axis=0)
        score = score + norms / max(float(norms.mean()), 1e-12)
    for bn in bns:
        gain = np.abs(bn.gamma.numpy()) / np.sqrt(bn.moving_variance.numpy() + bn.epsilon) if bn.scale else \
            1.0 / np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
        score = score * gain / max(float(np.mean(gain)), 1e-12)
    return np.asarray(score, np.float64)


# -- the smaller model ----------------------------------------------------------------------------------------
def shrink(model, found: Plan):
    """A new Keras model with `found`'s channels removed (the original is left as it is), and its weights
    taken from `model`'s."""
    import keras

    def clone(layer):
        config = layer.get_config()
        width = found._widths.get(id(layer))
        if width is not None:
            config["filters" if "filters" in config else "units"] = width
        root = found._roles.get(id(layer), {}).get("in")
        if kind(layer) == "Reshape" and root is not None:  # (1, 1, C) of a squeeze-excite: its C is fewer now
            config["target_shape"] = (*tuple(config["target_shape"])[:-1], len(found._keep[root]))
        return layer.__class__.from_config(config)

    small = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for old, new in zip(_layers(model), _layers(small)):
        roles = found._roles.get(id(old), {})
        weights = [_sliced(old, w, roles, found._keep) for w in old.weights]
        for target, value in zip(new.weights, weights):
            if tuple(target.shape) != value.shape:
                raise ValueError(f"{old.name}: {target.path} is {tuple(target.shape)}, the slice {value.shape}")
            target.assign(value)
    return small


def _layers(model) -> list:
    """Every layer with weights of its own, nested models walked in order."""
    found = []
    for layer in model.layers:
        if functional(layer) is not None:
            found += _layers(layer)
        elif layer.weights:
            found.append(layer)
    return found


def _sliced(layer, variable, roles: dict[str, int | None], keep: dict[int, np.ndarray]) -> np.ndarray:
    value = np.asarray(variable.numpy())
    k, name = kind(layer), variable.path.rsplit("/", 1)[-1]
    axes: dict[int, int | None] = {}
    if k in PRODUCERS:  # a separable conv's depthwise kernel: (h, w, in, 1); every kernel: (..., in, out)
        axes = {0: roles.get("out")} if "kernel" not in name else {value.ndim - 2: roles.get("in")} \
            if name.startswith("depthwise") else {value.ndim - 2: roles.get("in"), value.ndim - 1: roles.get("out")}
    elif k == "DepthwiseConv2D":
        axes = {2: roles.get("in")} if "kernel" in name else {0: roles.get("in")}
    elif k == "BatchNormalization":
        axes = {0: roles.get("in")}
    for axis, root in axes.items():
        if root is not None:
            value = np.take(value, keep[root], axis=axis)
    return value


def macs(model) -> int:
    """Multiply-accumulates of the model's Conv, DepthwiseConv and Dense layers for one sample."""
    total = 0
    for layer in _layers(model):
        k = kind(layer)
        out = getattr(layer, "output", None)
        if out is None or k not in (*PRODUCERS, "DepthwiseConv2D"):
            continue
        positions = int(np.prod([d or 1 for d in out.shape[1:-1]]))  # one MAC per kernel weight per position
        total += positions * sum(int(np.prod(v.shape)) for v in layer.weights if "kernel" in v.path.rsplit("/", 1)[-1])
    return total
