"""`ema`: each range the moving average of the per-sample minimum and maximum (factor 0.95, in calibration
order, the first sample's extremes to start), as ai-edge-quantizer calibrates
(litert_quantizer/utils/qsv_utils.py, `moving_average_update`), on TFLite's own quantizer: one sample's
outlier moves a range by 5 % of its excess instead of setting it. Read from the activations the range
methods collect (each sample's exact min and max lead its row), so it costs no calibration run of its own."""

from __future__ import annotations

import numpy as np

from edgekit.converters.int8.range_setting import RangeSetting
from edgekit.converters.int8.ranges import Activations

SMOOTHING = 0.95  # ai-edge-quantizer's default smoothing factor


class Ema(RangeSetting):
    name = "ema"
    start_order = 3

    def propose(self, acts: Activations, groups: tuple[str, ...]) -> dict[int, tuple[float, float]]:
        found = {}
        for index, recorded in acts.recorded.items():
            kept = [g for g in groups if index in acts.values.get(g, {})]
            if not kept:
                found[index] = recorded
                continue
            order = np.argsort(np.concatenate([acts.positions[g] for g in kept]), kind="stable")  # calibration order
            rows = np.concatenate([acts.values[g][index][:, :2] for g in kept])[order]
            lo, hi = moving_average(rows.astype(np.float64))
            lo, hi = min(lo, 0.0), max(hi, 0.0)
            found[index] = (lo, hi) if hi > lo else recorded
        return found


def moving_average(extremes: np.ndarray) -> tuple[float, float]:
    """The moving average of per-sample (min, max) rows in order: m = s * m + (1 - s) * x from the first row."""
    n = len(extremes)
    weights = (1 - SMOOTHING) * SMOOTHING ** np.arange(n - 1, -1, -1, dtype=np.float64)
    weights[0] = SMOOTHING ** (n - 1)
    lo, hi = weights @ extremes
    return float(lo), float(hi)
