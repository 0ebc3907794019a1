"""`mse`: the clipping of each range (a shared factor on both ends) that minimises the mean squared error of
int8 quantize-dequantize over the sampled values."""

from __future__ import annotations

import numpy as np

from edgekit.converters.int8.range_setting import RangeSetting

MSE_GRID = np.linspace(0.3, 1.0, 29)
MSE_VALUES = 1 << 14  # values the MSE search runs over, per tensor (an even share of those sampled)


class Mse(RangeSetting):
    name = "mse"
    start_order = 3

    def clip(self, values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
        return mse_range(values[:: max(1, values.size // MSE_VALUES)], lo, hi)


def mse_range(v: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The range of `MSE_GRID`'s factors times [lo, hi] whose int8 rounding of `v` errs least."""
    best, best_err = (lo, hi), np.inf
    for a in MSE_GRID:
        clo, chi = min(0.0, a * lo), max(0.0, a * hi)
        scale = (chi - clo) / 255.0 or 1.0
        zp = np.round(-128 - clo / scale)
        deq = (np.clip(np.round(v / scale) + zp, -128, 127) - zp) * scale
        err = float(np.mean((deq - v) ** 2))
        if err < best_err:
            best, best_err = (clo, chi), err
    return best
