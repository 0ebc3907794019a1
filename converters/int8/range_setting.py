"""The range methods' common part: each tensor's int8 range set from the values it held on the fitting
samples (`clip`), and TFLite's quantizer run on the calibrated model with those ranges."""

from __future__ import annotations

import numpy as np

from edgekit.converters.int8 import registry
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.ranges import Activations, Clip, from_sample_extremes, propose, quantize, with_ranges


class RangeSetting(Candidate):
    """Ranges by `clip` on the activations of a calibrated model: the converter's, or the variant named
    `variant` (a candidate of its own: the same function with other weights)."""

    fits_ranges = True
    variant = ""  # "": the converter's calibrated model
    clips = True  # False: min/max, whose ranges on the converter's own samples are those it recorded

    def clip(self, values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
        """A tensor's range from its sampled `values` and their range [lo, hi] (0 included)."""
        return lo, hi

    def propose(self, acts: Activations, groups: tuple[str, ...]) -> dict[int, tuple[float, float]]:
        """Every tensor's range from the activations of the `groups` samples: `clip` of each one's values
        (a method that reads more than a tensor's pooled values, such as each sample's extremes, overrides
        this)."""
        return propose(acts, self.clip, groups)

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        model, ranges = self.resolve(ctx, fit, view)
        return quantize(model, ctx.io, ranges)

    def basis(self, ctx: Context, fit: Fit) -> bytes | None:
        model, ranges = self.resolve(ctx, fit, False)
        return with_ranges(model, ranges) if ranges else model

    def resolve(self, ctx: Context, fit: Fit, view: bool) -> tuple[bytes, dict[int, tuple[float, float]] | None]:
        """The calibrated model (`view`: its logits view) and the ranges to quantize it with (None: those
        recorded in it)."""
        model = ctx.model(self.variant, view)
        if not self.clips and fit.groups == ctx.converters_fit:
            return model, None
        return model, ctx.once(("ranges", self.name, fit.groups),
                               lambda: self.propose(ctx.activations(self.variant), fit.groups))


class FromSampleExtremes(RangeSetting):
    """A range method that reads each sample's exact (min, max), not a tensor's pooled values: `reduce` of
    the [n, 2] rows in calibration order (`ranges.from_sample_extremes`; `ema`, `extremes`)."""

    @staticmethod
    def reduce(extremes: np.ndarray) -> tuple[float, float]:
        raise NotImplementedError

    def propose(self, acts: Activations, groups: tuple[str, ...]) -> dict[int, tuple[float, float]]:
        return from_sample_extremes(acts, groups, self.reduce)


def clip_of(name: str) -> Clip:
    """The `clip` of the range method called `name` (the budget autopilot sets single tensors' ranges by
    name)."""
    candidate = registry.load(name)
    if not isinstance(candidate, RangeSetting):
        raise ValueError(f"the int8 candidate {name!r} sets no ranges")
    if isinstance(candidate, FromSampleExtremes):
        raise ValueError(f"the int8 candidate {name!r} sets a range from each sample's extremes, not by clipping "
                         "a tensor's values")
    return candidate.clip
