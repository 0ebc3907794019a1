"""`aeq`: ai-edge-quantizer's own file (converters/int8/aeq_quantizer.py), from the calibrated model's graph (its recorded
ranges dropped); float32 inputs and outputs only, and only where the package is installed."""

from __future__ import annotations

from edgekit.converters.int8 import aeq_quantizer as aeq
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.ranges import logits_view
from edgekit.converters.recipe import aeq_unusable
from edgekit.errors import ConversionError

AEQ_SAMPLES = 32  # ai-edge-quantizer calibrates on at most this many (a moving average: the last weigh most)


class AiEdgeQuantizer(Candidate):
    name = aeq.NAME
    start_order = 5

    def unusable(self, io: str) -> str | None:
        return aeq_unusable(io)

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        samples = fit.samples
        made = ctx.once(("aeq", fit.groups), lambda: aeq.quantize(
            ctx.calibrated, samples[:: max(1, len(samples) // AEQ_SAMPLES)][:AEQ_SAMPLES]))
        made = logits_view(made) if view else made  # its own graph: viewed after
        if made is None:
            raise ConversionError("ai-edge-quantizer's model has no SOFTMAX before its first output to score")
        return made
