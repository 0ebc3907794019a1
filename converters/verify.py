"""Compare the converted model with the float model on the same preprocessed samples."""

from __future__ import annotations

import numpy as np

from edgekit.errors import ConversionError
from edgekit.metrics import compare_outputs

__all__ = ["check_not_collapsed", "compare_outputs"]


def check_not_collapsed(reference: np.ndarray, candidate: np.ndarray, what: str) -> None:
    """A converted model that outputs NaN, or the same thing for every input while the float model
    does not, is broken: raise instead of writing it."""
    cand = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    if not np.all(np.isfinite(cand)):
        raise ConversionError(f"{what}: the converted model outputs NaN or infinity on calibration samples")
    if len(cand) >= 2 and np.ptp(ref, axis=0).max() > 0 and np.ptp(cand, axis=0).max() == 0:
        raise ConversionError(
            f"{what}: the converted model's output is the same for every calibration sample (collapsed)"
        )
