"""Ops an int8 file keeps in float: their float constants, and the float head.

The float head: the op that writes a classifier's logits and the SOFTMAX after it stay float in the int8
file (`FloatHead`). int8 gives the logits one scale for every class and sample, set by the widest logit
calibration saw; an overconfident model's logits span hundreds, and the step then ties the top classes.
The issue's EfficientNetB0 (64x64, 81.94 % float top-1 on the digits test images) had logits in
[-330, 210], a step of 2.11, and probabilities such as 0.904 / 0.066 / 0.030 came out as 0.332 three
times: the top-1 went to the first of the tied classes. With every op but the SOFTMAX in float that file
still lost 2.78 points, as much as the whole int8 file of the same ranges; with the head float, GPTQ's
file went from +4.72 to +0.83 points at 1.008x the size and the same p50 (10 classes: the head is 0.3 % of
the weights). `auto` scores it after weight rounding, on the winner's basis, and keeps it where it measures
better than the winner (`choose._float_head`); a head over `HEAD_SHARE` of the model's weights (a 1000-class
Dense is a third of a MobileNetV2) stays int8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.ranges import logits_view, quantize

if TYPE_CHECKING:
    from edgekit.converters.int8.context import Context

HEAD_SHARE = 0.01  # the most of the model's constant weights the float head may hold (float32: 4x their int8 bytes)
# ops between the logits' op and the SOFTMAX that only move values (keras.applications' MobileNetV3: a 1x1
# Conv2D writes the logits, a Flatten reshapes them)
_SHAPE_OPS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})
_LOGIT_OPS = frozenset({"FULLY_CONNECTED", "CONV_2D", "BATCH_MATMUL"})


def float_constants(model: bytes) -> dict[str, dict[int, np.ndarray]]:
    """Op output name -> its float32 constant inputs (tensor index -> values: kernel, bias) in `model`."""
    from edgekit.runtime.inspect import operators

    view, sub, walked = operators(model)
    found_all: dict[str, dict[int, np.ndarray]] = {}
    for _, _kind, op in walked:
        found = {}
        for i in op.inputs[1:]:
            values = view.constant(sub.tensors[i]) if i >= 0 else None
            if values is not None and values.dtype == np.float32:
                found[i] = values
        if found and op.outputs:
            found_all[sub.tensors[op.outputs[0]].name] = found
    return found_all


def with_float_constants(calibrated: bytes, constants: dict[str, dict[int, np.ndarray]], ops) -> bytes:
    """`calibrated` with the ops writing `ops` given their constants from `constants` (`float_constants` of
    the model whose constants are the float model's: an op kept in float must not keep a GPTQ-rounded kernel or
    a corrected bias)."""
    from edgekit.runtime.schema import with_tensor_data

    data = {i: v for op in ops for i, v in constants.get(op, {}).items()}
    return with_tensor_data(calibrated, data) if data else calibrated


def head_ops(calibrated: bytes, output: str | None = None) -> tuple[tuple[str, ...], float]:
    """The output names of the ops from the one writing the logits to the SOFTMAX that makes the first output
    (`ranges.scored_tensor`: the one the signature names `output`), a Dense, or a 1x1 Conv2D and the reshapes
    after it, and the share of the model's constant weights that op holds; ((), 0.0) where no SOFTMAX of a
    weighted op's output makes it."""
    from edgekit.converters.int8.ranges import scored_tensor
    from edgekit.runtime.inspect import operators

    view, sub, walked = operators(calibrated)
    if not sub.outputs:
        return (), 0.0
    producer = {int(t): (kind, op) for _, kind, op in walked for t in op.outputs}
    kind, op = producer.get(scored_tensor(calibrated, output), ("", None))
    if op is None or kind != "SOFTMAX":
        return (), 0.0
    names = [sub.tensors[op.outputs[0]].name]
    kind, op = producer.get(int(op.inputs[0]), ("", None))
    while op is not None and kind in _SHAPE_OPS:
        names.append(sub.tensors[op.outputs[0]].name)
        kind, op = producer.get(int(op.inputs[0]), ("", None))
    if op is None or kind not in _LOGIT_OPS:
        return (), 0.0
    names.append(sub.tensors[op.outputs[0]].name)
    head = sum(_size(view, sub, i) for i in op.inputs[1:])
    total = sum(_size(view, sub, i) for _, _, o in walked for i in o.inputs[1:])
    return tuple(reversed(names)), head / max(total, 1)


def _size(view, sub, index: int) -> int:
    values = view.constant(sub.tensors[index]) if index >= 0 else None
    return 0 if values is None or values.dtype != np.float32 else int(values.size)


class FloatHead(Candidate):
    """Another candidate's file (`on`, its basis: ranges, rounded kernels, corrected biases) with the float
    head: `ops` kept in float with the float model's constants."""

    name = "float head"

    def __init__(self, on: Candidate, ops: tuple[str, ...]) -> None:
        self.on, self.ops = on, ops

    def offered(self, ctx: Context) -> bool:
        return False  # not a candidate of its own: `choose._float_head` scores it on the winner

    def unusable(self, io: str) -> str | None:
        return None if io == "float32" else "--io is not float32: the output is quantized again"

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        if final and type(self.on).findings is not Candidate.findings:  # the winner's own checks (gptq: its
            self.on.make(ctx, fit, view=False, final=True)  # kernels in the file), on the file it would write
        model = self.basis(ctx, fit)
        kernels = self.on.float_kernels(ctx, fit)
        if kernels is not None:
            made = ctx.once(("float constants", self.on.name, fit.groups), lambda: float_constants(kernels))
            model = with_float_constants(model, made, self.ops)
        if view:
            model = logits_view(model, ctx.output) or model
        return quantize(model, ctx.io, None, denylisted_nodes=self.ops)

    def basis(self, ctx: Context, fit: Fit) -> bytes:
        made = self.on.basis(ctx, fit)
        return ctx.calibrated if made is None else made

    def float_kernels(self, ctx: Context, fit: Fit) -> bytes | None:
        return self.on.float_kernels(ctx, fit)

    def findings(self) -> dict[str, Any]:
        return self.on.findings()
