"""Affine quantization of tensors: float <-> int with a scale and a zero point."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class QuantParams(Protocol):
    """What quantize and dequantize read of a tensor (TensorInfo has it): read-only, so frozen ones fit."""

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def scale(self) -> float: ...

    @property
    def zero_point(self) -> int: ...

    @property
    def quantized(self) -> bool: ...


def quantize(x: np.ndarray, info: QuantParams) -> np.ndarray:
    """Float values -> the tensor's dtype, using its scale and zero point when it is quantized."""
    if not info.quantized:
        return np.asarray(x, dtype=info.dtype)
    limits = np.iinfo(info.dtype)
    q = np.round(np.asarray(x, np.float32) / np.float32(info.scale)) + info.zero_point
    return np.clip(q, limits.min, limits.max).astype(info.dtype)


def dequantize(q: np.ndarray, info: QuantParams) -> np.ndarray:
    if not info.quantized:
        return np.asarray(q, dtype=np.float32)
    return (q.astype(np.float32) - np.float32(info.zero_point)) * np.float32(info.scale)
