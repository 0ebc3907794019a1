"""Output-error statistics shared by conversion checks and the bench harness (numpy only)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def compare_outputs(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float | None]:
    """max/mean abs error, SNR in dB, and top-1 agreement for classifier-shaped outputs."""
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    cand = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    err = cand - ref
    noise = float(np.sum(err**2))
    signal = float(np.sum(ref**2))
    if noise == 0:
        snr = math.inf
    elif signal == 0:
        snr = -math.inf
    else:
        snr = 10 * math.log10(signal / noise)
    agreement = element_agreement(reference, candidate)
    if agreement is None and ref.shape[1] > 1:
        agreement = float(np.mean(ref.argmax(axis=1) == cand.argmax(axis=1)))
    return {
        "samples": len(ref),
        "max_abs_error": _round(float(np.max(np.abs(err))) if err.size else 0.0),
        "mean_abs_error": _round(float(np.mean(np.abs(err))) if err.size else 0.0),
        "snr_db": _round(snr if math.isfinite(snr) else (999.0 if snr > 0 else -999.0)),
        "top1_agreement": None if agreement is None else _round(agreement),
    }


def element_agreement(reference: np.ndarray, candidate: np.ndarray) -> float | None:
    """For a dense output (a mask or heatmap: axes besides the batch and the last), the share of elements
    whose class agrees: the argmax over the last axis, or > 0.5 for one channel in [0, 1]. None for other
    outputs (per-sample class scores are agreed on by their argmax over all values)."""
    ref, cand = np.asarray(reference), np.asarray(candidate)
    if ref.ndim < 3 or ref.size == 0 or ref.shape[-1] == 0:
        return None
    if ref.shape[-1] > 1:
        return float(np.mean(ref.argmax(axis=-1) == cand.argmax(axis=-1)))
    if float(np.min(ref)) >= 0 and float(np.max(ref)) <= 1:
        return float(np.mean((ref > 0.5) == (cand > 0.5)))
    return None


def output_role(values: np.ndarray) -> str:
    """`mask` for a dense output of per-element classes or probabilities ((N, ..., K) scores, or one channel
    in [0, 1]: a segmentation mask, a heatmap); `scores` for per-sample class scores; else `values`."""
    v = np.asarray(values)
    dense = v.ndim >= 3 and any(d > 1 for d in v.shape[1:-1])  # (N, 1, 1, K): one class per sample
    if dense and v.size and float(np.min(v)) >= 0 and (v.shape[-1] > 1 or float(np.max(v)) <= 1):
        return "mask"
    return "scores" if looks_like_scores(v) else "values"


def looks_like_scores(values: np.ndarray) -> bool:
    """Class scores: a last dimension over 1 and no negative value (softmax, sigmoid or counts)."""
    return values.ndim >= 2 and values.shape[-1] > 1 and float(np.min(values)) >= 0


# what a per-sample loss against the float model measures, by the task of the output (`per_sample_losses`)
LOSSES = ("kl", "mse", "cosine", "iou")


def per_sample_losses(reference: np.ndarray, candidate: np.ndarray, kind: str, threshold: float = 0.5) -> np.ndarray:
    """One loss per sample (axis 0) of `candidate` against `reference`, lower is better, 0 where they match:
    `kl` the KL divergence of the candidate's softmax from the reference's (both logits, last axis the
    classes; pass log-probabilities for probabilities); `mse` the squared error over the reference's mean
    square (one scale for every sample); `cosine` one minus the cosine similarity (embeddings); `iou` one
    minus the intersection over union of the elements over `threshold` (masks, maps; 0 where both are
    empty)."""
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    cand = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    if ref.shape != cand.shape:
        raise ValueError(f"outputs of one shape are needed, got {ref.shape} and {cand.shape}")
    if kind == "kl":
        lp, lq = _log_softmax(ref), _log_softmax(cand)
        return np.maximum(np.sum(np.exp(lp) * (lp - lq), axis=1), 0.0)
    if kind == "mse":
        scale = float(np.mean(ref**2)) or 1.0
        return np.mean((cand - ref) ** 2, axis=1) / scale
    if kind == "cosine":
        norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
        same = np.all(ref == cand, axis=1)
        cos = np.divide(np.sum(ref * cand, axis=1), norms, out=np.zeros(len(ref)), where=norms > 0)
        return np.where(same, 0.0, np.clip(1.0 - cos, 0.0, 2.0))
    if kind == "iou":
        a, b = ref > threshold, cand > threshold
        union = np.sum(a | b, axis=1)
        inter = np.sum(a & b, axis=1)
        return np.where(union > 0, 1.0 - inter / np.maximum(union, 1), 0.0)
    raise ValueError(f"unknown loss {kind!r}; known: {', '.join(LOSSES)}")


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _round(value: float, digits: int = 6) -> float:
    """Six significant digits: all a report needs, and it keeps the model metadata small."""
    return float(f"{value:.{digits}g}")


COLLAPSE_CORRELATION = 0.9  # below it a candidate's outputs no longer follow the reference's


def collapse_check(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """Whether a candidate collapsed against its reference on the same samples: outputs constant over the
    samples while the reference's vary, or a Pearson correlation of every output value under
    COLLAPSE_CORRELATION (the symptom of int8 files whose ranges or scales squeeze every output alike)."""
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    cand = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    n = len(ref)
    varies = bool(n > 1 and ref.size and np.ptp(ref, axis=0).max() > 0)
    tolerance = 1e-6 * max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-12)
    constant = varies and float(np.ptp(cand, axis=0).max()) <= tolerance
    r = None if constant or not varies else float(np.corrcoef(ref.ravel(), cand.ravel())[0, 1])
    r = None if r is None or not math.isfinite(r) else _round(r)
    if constant:
        verdict = f"collapsed: the same outputs for all {n} samples, where the reference's vary"
    elif r is not None and r < COLLAPSE_CORRELATION:
        verdict = f"collapsed: its outputs correlate with the reference's at r={r:.3f} (under {COLLAPSE_CORRELATION})"
    else:
        verdict = f"not collapsed: r={r:.3f} with the reference at n={n}" if r is not None else \
            f"not judged: the reference's outputs do not vary over the {n} samples"
    return {"collapsed": constant or (r is not None and r < COLLAPSE_CORRELATION), "constant": constant,
            "correlation": r, "threshold": COLLAPSE_CORRELATION, "verdict": verdict}
