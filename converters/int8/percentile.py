"""`percentile`: each range clipped to the 0.01 / 99.99 percentiles of what the tensor held."""

from __future__ import annotations

import numpy as np

from edgekit.converters.int8.range_setting import RangeSetting

PERCENTILE = 99.99


class Percentile(RangeSetting):
    name = "percentile"
    start_order = 2

    def clip(self, values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
        p_lo, p_hi = np.percentile(values, (100 - PERCENTILE, PERCENTILE))  # both ends from one partition
        lo = 0.0 if lo == 0.0 else min(0.0, float(p_lo))
        hi = 0.0 if hi == 0.0 else max(0.0, float(p_hi))
        return lo, hi
