"""`aeq`: ai-edge-quantizer's own file (converters/int8/aeq_quantizer.py), from the calibrated model's graph (its recorded
ranges dropped); float32 inputs and outputs only, and only where the package is installed."""

from __future__ import annotations

from edgekit.converters.int8 import aeq_quantizer as aeq
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.ranges import logits_view, of_int8_file, with_ranges
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
        made = logits_view(made, ctx.output) if view else made  # its own graph: viewed after
        if made is None:
            raise ConversionError("ai-edge-quantizer's model has no SOFTMAX before its first output to score")
        return made

    def basis(self, ctx: Context, fit: Fit) -> bytes | None:
        """The calibrated model with the activation ranges of ai-edge-quantizer's file (`ranges.of_int8_file`):
        TFLite's quantizer on it makes a file close to that one, which the budget autopilot's mixes start
        from. Without it they started from min/max's: the clean EfficientNetB0 of the int8 benchmark loses
        0.83 point with these ranges (ai-edge-quantizer's own file 0.56, min/max 1.67), and `--max-drop 0.5`
        kept 43 of 239 ops in float to win back what min/max lost, 1.27x the int8 file's p50."""
        found = of_int8_file(self.make(ctx, fit, view=False), ctx.calibrated)
        return with_ranges(ctx.calibrated, found) if found else None
