"""`equalize`: min/max ranges on the cross-layer equalised calibrated model (converters/int8/equalization.py: the
same function with other weights, made by the convert stage where a channel moves enough and handed to
`choose.choose` as a variant)."""

from __future__ import annotations

from edgekit.converters.int8.context import Context
from edgekit.converters.int8.range_setting import RangeSetting


class Equalize(RangeSetting):
    name = "equalize"
    variant = "equalize"
    fits_ranges = False  # on its own model's activations
    clips = False
    conclusive = True
    costly = True

    def offered(self, ctx: Context) -> bool:
        return self.variant in ctx.variants
