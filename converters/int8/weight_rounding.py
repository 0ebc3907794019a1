"""GPTQ weight rounding for post-training int8 (Frantar et al., "GPTQ", 2022; OBQ's column-by-column error
feedback): each CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED kernel of the converter's calibrated float model
is rounded to int8 so that the layer's output error on the calibration activations is small, not each weight's.

H = sum of x x^T over the layer's input patches (the float model's activations, im2col order (kh, kw, in)),
one Hessian per layer (depthwise: one (kh*kw)^2 per channel). The grid is TFLite's own per-channel one
(symmetric, narrow range, scale = max|w| / 127) and each row's largest weight is pinned at +-127, so TFLite's
quantizer, given the float weights q * scale, recomputes the same scale and keeps q exactly (`mismatched`
checks it on the file). Inputs never fed (a zero Hessian diagonal) are not zeroed: the weight keeps its
nearest rounding, and the scale stays max|w| / 127.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgekit.converters.feeding import debugging_interpreter, feeder

KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
DAMP = 0.01  # of the mean Hessian diagonal, added to it (GPTQ's percdamp)
BLOCK = 128  # columns rounded before their error is pushed to the rest at once (GPTQ's lazy batch)
FLUSH_ROWS = 8192  # input rows gathered before one matmul into H
# kernels whose outputs read more inputs are left to TFLite's nearest rounding: their Hessian (and its float64
# inverse and factor) would take gigabytes (a VGG16's first Dense reads 25,088: 2.5 GB in float32 alone)
MAX_COLUMNS = 8192


@dataclass
class Layer:
    """One kernel to round: its op kind, tensor indices, float weights, conv geometry and its Hessian."""

    kind: str
    inp: int
    weight: int
    out_name: str
    w: np.ndarray
    stride: tuple[int, int] = (1, 1)
    dil: tuple[int, int] = (1, 1)
    same: bool = True
    hessian: np.ndarray | None = None
    pending: list[np.ndarray] = field(default_factory=list)
    rows: int = 0


def layers_of(calibrated: bytes) -> list[Layer]:
    """The layers of the main graph with a float constant kernel, in graph order."""
    from edgekit.runtime.flatbuffer import tensor_values
    from edgekit.runtime.schema import enum_names, schema_module, unpack

    s = schema_module()
    model = unpack(calibrated)
    graph = model.subgraphs[0]
    names = enum_names(s.BuiltinOperator)
    found = []
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        kind = names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "")
        if kind not in KINDS or op.inputs is None or len(op.inputs) < 2:
            continue
        w = tensor_values(model, graph.tensors[int(op.inputs[1])])
        if w is None or w.dtype != np.float32:
            continue
        o = op.builtinOptions
        found.append(Layer(kind, int(op.inputs[0]), int(op.inputs[1]), _name(graph.tensors[int(op.outputs[0])]),
                           w, (getattr(o, "strideH", 1), getattr(o, "strideW", 1)),
                           (getattr(o, "dilationHFactor", 1), getattr(o, "dilationWFactor", 1)),
                           getattr(o, "padding", 0) == s.Padding.SAME))
    return found


def _pads(n: int, k: int, stride: int, dil: int, same: bool) -> tuple[int, int, int]:
    """(pad before, pad after, output size) of one spatial axis, as TFLite pads SAME and VALID."""
    eff = (k - 1) * dil + 1
    if not same:
        return 0, 0, (n - eff) // stride + 1
    out = -(-n // stride)
    total = max((out - 1) * stride + eff - n, 0)
    return total // 2, total - total // 2, out


def patches(x: np.ndarray, layer: Layer, kh: int, kw: int) -> np.ndarray:
    """x [1, H, W, C] -> [P, kh, kw, C]: each output position's input window, in TFLite conv's weight order."""
    _, h, w, c = x.shape
    pt, pb, oh = _pads(h, kh, layer.stride[0], layer.dil[0], layer.same)
    pl, pr, ow = _pads(w, kw, layer.stride[1], layer.dil[1], layer.same)
    xp = np.pad(x[0], ((pt, pb), (pl, pr), (0, 0)))
    eh, ew = (kh - 1) * layer.dil[0] + 1, (kw - 1) * layer.dil[1] + 1
    v = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(0, 1))  # [H', W', C, eh, ew]
    sh, sw = layer.stride
    v = v[: (oh - 1) * sh + 1: sh, : (ow - 1) * sw + 1: sw, :, :: layer.dil[0], :: layer.dil[1]]
    return v.transpose(0, 1, 3, 4, 2).reshape(oh * ow, kh, kw, c)


def input_rows(layer: Layer, x: np.ndarray) -> np.ndarray:
    """The layer's input as the rows its kernel multiplies: [rows, cols] (depthwise: [rows, taps, channels])."""
    x = np.asarray(x, np.float32)
    if layer.kind == "FULLY_CONNECTED":
        return x.reshape(-1, layer.w.shape[1])
    _, kh, kw, cin = layer.w.shape
    if layer.kind == "CONV_2D":
        if kh == kw == 1 and layer.stride == (1, 1):
            return x.reshape(-1, cin)
        return patches(x, layer, kh, kw).reshape(-1, kh * kw * cin)
    return patches(x, layer, kh, kw).reshape(-1, kh * kw, x.shape[-1])


def flush(layer: Layer) -> None:
    """Folds the gathered rows into the layer's Hessian (one matmul; depthwise: one per channel, batched)."""
    if not layer.pending:
        return
    X = np.concatenate(layer.pending)
    layer.pending, layer.rows = [], 0
    if layer.kind == "DEPTHWISE_CONV_2D":
        per_channel = np.ascontiguousarray(X.transpose(2, 0, 1))  # [c, p, taps]
        h = np.matmul(per_channel.transpose(0, 2, 1), per_channel)
    else:
        h = X.T @ X
    layer.hessian = h if layer.hessian is None else layer.hessian + h


def collect_hessians(calibrated: bytes, samples: list, layers: list[Layer]) -> None:
    """Runs the float model (through the runtime's Runner) on `samples` and adds each layer's input to its
    Hessian."""
    runner = debugging_interpreter(calibrated, samples[0])
    feed = feeder(runner)
    for sample in samples:
        feed(sample)
        for layer in layers:
            X = input_rows(layer, runner.get(layer.inp))
            layer.pending.append(X)
            layer.rows += X.shape[0]
            if layer.rows >= FLUSH_ROWS:
                flush(layer)
    for layer in layers:
        flush(layer)


def tflite_scale(w2: np.ndarray) -> np.ndarray:
    """Per-row scale as TFLite's quantizer computes it (symmetric, narrow range: max|w| / 127, in float32)."""
    m = np.abs(w2).max(axis=1).astype(np.float32)
    s = (np.float32(2.0) * m / np.float32(254.0)).astype(np.float32)
    return np.where(s > 0, s, np.float32(1.0))


def _damped(H: np.ndarray) -> np.ndarray:
    """H (float64, [..., k, k]) with never-fed inputs given a unit diagonal and `DAMP` of the mean added."""
    H = H.astype(np.float64).copy()
    k = np.arange(H.shape[-1])
    d = H[..., k, k]
    d[d == 0] = 1.0
    H[..., k, k] = d + DAMP * d.mean(axis=-1, keepdims=True)
    return H


def _upper_inverse_factor(H: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor of H^-1 (GPTQ's), damped ten times more where H is too ill-conditioned."""
    try:
        return np.linalg.cholesky(np.linalg.inv(H)).swapaxes(-1, -2)
    except np.linalg.LinAlgError:
        k = np.arange(H.shape[-1])
        H = H.copy()
        H[..., k, k] += 0.1 * H[..., k, k].mean(axis=-1, keepdims=True)
        return np.linalg.cholesky(np.linalg.inv(H)).swapaxes(-1, -2)


def gptq_rows(W: np.ndarray, H: np.ndarray) -> np.ndarray:
    """GPTQ of W [rows, cols] with one Hessian H [cols, cols]: int8 q [rows, cols] on TFLite's per-row grid,
    each row's largest weight pinned (rounded alone, never moved by the error feedback)."""
    W = W.astype(np.float64).copy()
    s = tflite_scale(W).astype(np.float64)
    U = _upper_inverse_factor(_damped(H))
    rows, cols = W.shape
    pinned = np.abs(W).argmax(axis=1)
    pinval = W[np.arange(rows), pinned].copy()
    Q = np.zeros((rows, cols), np.int32)
    for b0 in range(0, cols, BLOCK):
        b1 = min(b0 + BLOCK, cols)
        Wb, Eb = W[:, b0:b1].copy(), np.zeros((rows, b1 - b0))
        for i in range(b1 - b0):
            j = b0 + i
            w = Wb[:, i]
            w[pinned == j] = pinval[pinned == j]
            Q[:, j] = np.clip(np.round(w / s), -127, 127)
            Eb[:, i] = (w - Q[:, j] * s) / U[j, j]
            Wb[:, i + 1:] -= np.outer(Eb[:, i], U[j, j + 1:b1])
        W[:, b1:] -= Eb @ U[b0:b1, b1:]
    Q[np.arange(rows), pinned] = np.clip(np.round(pinval / s), -127, 127)
    return Q


def gptq_batched(W: np.ndarray, H: np.ndarray) -> np.ndarray:
    """GPTQ with one Hessian per row: W [n, k], H [n, k, k] (depthwise: each output channel reads one input
    channel); the same grid and pinning as `gptq_rows`."""
    W = W.astype(np.float64).copy()
    n, k = W.shape
    s = tflite_scale(W).astype(np.float64)
    U = _upper_inverse_factor(_damped(H))
    pinned = np.abs(W).argmax(axis=1)
    pinval = W[np.arange(n), pinned].copy()
    Q = np.zeros((n, k), np.int32)
    for j in range(k):
        w = W[:, j]
        w[pinned == j] = pinval[pinned == j]
        Q[:, j] = np.clip(np.round(w / s), -127, 127)
        e = (w - Q[:, j] * s) / U[:, j, j]
        W[:, j + 1:] -= e[:, None] * U[:, j, j + 1:]
    return Q


def rounded(layer: Layer) -> tuple[np.ndarray, np.ndarray]:
    """(the layer's float weights on its int8 grid, q * scale in float32; q), in the kernel's own layout."""
    w, hessian = layer.w, layer.hessian
    if hessian is None:
        raise ValueError(f"{layer.out_name}: no Hessian collected")
    q: np.ndarray
    scale: np.ndarray
    if layer.kind == "DEPTHWISE_CONV_2D":
        _, kh, kw, cm = w.shape
        rows = np.moveaxis(w, 3, 0).reshape(cm, -1)  # [output channel, taps]
        mult = cm // hessian.shape[0]
        q2 = gptq_batched(rows, hessian[np.arange(cm) // mult])
        q = np.moveaxis(q2.reshape(cm, kh, kw), 0, 2)[None]
        scale = tflite_scale(rows).reshape(1, 1, 1, -1)
    else:
        W2 = w.reshape(w.shape[0], -1)
        q = gptq_rows(W2, hessian).reshape(w.shape)
        scale = tflite_scale(W2).reshape((-1,) + (1,) * (w.ndim - 1))
    return (q.astype(np.float32) * scale).astype(np.float32), q


def nearest_kernels(calibrated: bytes) -> dict[int, np.ndarray]:
    """Every kernel `gptq_weights` would round, rounded to its nearest step on TFLite's grid instead (q * scale,
    float32): the float model with them measures what rounding the weights costs at most, all that weight
    rounding can win back (`choose._escalate`)."""
    found = {}
    for layer in layers_of(calibrated):
        if _columns(layer) > MAX_COLUMNS:
            continue
        w = layer.w
        scale: np.ndarray
        if layer.kind == "DEPTHWISE_CONV_2D":
            scale = tflite_scale(np.moveaxis(w, 3, 0).reshape(w.shape[3], -1)).reshape(1, 1, 1, -1)
        else:
            scale = tflite_scale(w.reshape(w.shape[0], -1)).reshape((-1,) + (1,) * (w.ndim - 1))
        found[layer.weight] = (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)
    return found


def _columns(layer: Layer) -> int:
    """The size of the layer's Hessian: the inputs one output reads (depthwise: its taps)."""
    w = layer.w
    return int(np.prod(w.shape[1:3])) if layer.kind == "DEPTHWISE_CONV_2D" else int(np.prod(w.shape[1:]))


def gptq_weights(calibrated: bytes, samples: list) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
    """GPTQ-rounded kernels of the calibrated model (those whose Hessian is at most `MAX_COLUMNS` wide):
    (weight tensor index -> float weights q * scale, to write into it; the layer's output name -> q, for
    `mismatched`)."""
    layers = [layer for layer in layers_of(calibrated) if _columns(layer) <= MAX_COLUMNS]
    if layers:
        collect_hessians(calibrated, samples, layers)
    data, qs = {}, {}
    for layer in layers:
        if layer.hessian is not None:
            data[layer.weight], qs[layer.out_name] = rounded(layer)
    return data, qs


def int8_kernels(tflite: bytes) -> dict[str, np.ndarray]:
    """Output name -> int8 kernel of each CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED of an int8 file."""
    from edgekit.runtime.flatbuffer import tensor_values
    from edgekit.runtime.schema import enum_names, schema_module, unpack

    s = schema_module()
    model = unpack(tflite)
    graph = model.subgraphs[0]
    names = enum_names(s.BuiltinOperator)
    found = {}
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "") not in KINDS:
            continue
        values = tensor_values(model, graph.tensors[int(op.inputs[1])])
        if values is not None and values.dtype == np.int8:
            found[_name(graph.tensors[int(op.outputs[0])])] = values
    return found


def _name(tensor) -> str:
    name = tensor.name
    return name.decode() if isinstance(name, bytes) else str(name)


def mismatched(tflite: bytes, qs: dict[str, np.ndarray], calibrated: bytes) -> list[str]:
    """The layers (output names in `calibrated`, the model GPTQ rounded) whose int8 kernel in the file is not
    GPTQ's q: TFLite's quantizer re-rounded them (or the layer is not in the file). The file's kernels are
    matched to the model's in graph order: the quantizer renames a graph output ('...:0' becomes '...:01')."""
    order = [layer.out_name for layer in layers_of(calibrated)]
    got = int8_kernels(tflite)
    if len(order) == len(got):
        got = dict(zip(order, got.values()))
    return [name for name, q in qs.items()
            if name not in got or not np.array_equal(got[name].astype(np.int32), q.astype(np.int32))]
