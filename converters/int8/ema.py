"""`ema`: each range the moving average of the per-sample minimum and maximum (factor 0.95, in calibration
order, the first sample's extremes to start), as ai-edge-quantizer calibrates
(litert_quantizer/utils/qsv_utils.py, `moving_average_update`), on TFLite's own quantizer: one sample's
outlier moves a range by 5 % of its excess instead of setting it. Read from the activations the range
methods collect (each sample's exact min and max lead its row), so it costs no calibration run of its own."""

from __future__ import annotations

import numpy as np

from edgekit.converters.int8.range_setting import FromSampleExtremes

SMOOTHING = 0.95  # ai-edge-quantizer's default smoothing factor


def moving_average(extremes: np.ndarray) -> tuple[float, float]:
    """The moving average of per-sample (min, max) rows in order: m = s * m + (1 - s) * x from the first row."""
    n = len(extremes)
    weights = (1 - SMOOTHING) * SMOOTHING ** np.arange(n - 1, -1, -1, dtype=np.float64)
    weights[0] = SMOOTHING ** (n - 1)
    lo, hi = weights @ extremes
    return float(lo), float(hi)


class Ema(FromSampleExtremes):
    name = "ema"
    start_order = 3
    reduce = staticmethod(moving_average)
