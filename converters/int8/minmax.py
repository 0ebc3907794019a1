"""`minmax`: each range the min and max the tensor held, as TFLite's converter sets it; fitted on the
converter's own samples it is the plain converter's model, output for output."""

from __future__ import annotations

from edgekit.converters.int8.base import Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.range_setting import RangeSetting
from edgekit.converters.int8.ranges import quantize


class MinMax(RangeSetting):
    name = "minmax"
    start_order = 4
    clips = False

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        model, ranges = self.resolve(ctx, fit, view)
        made = quantize(model, ctx.io, ranges)
        if ranges is None and ctx.io == "float32":
            ctx.plain.setdefault(view, made)  # bias correction's first int8 model
        return made
