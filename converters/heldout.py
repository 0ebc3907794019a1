"""Held-out data for the training stages: what pruning and QAT are measured on, never trained on.

Without `training.val_data`, a seeded split of the training data stratified by class (VAL_SHARE of each class,
at least one sample of every class that has two) is held out before any stage trains; with it, the given
data. Samples are compared by a hash of their decoded arrays, so the same image under two paths counts as
one: a measurement on data that shares samples with another is not independent of it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from edgekit.converters.finetune import LabelledData

VAL_SHARE = 0.15
MIN_HELD_OUT = 20  # below this many held-out samples an interval says little: nothing is held out


@dataclass(frozen=True)
class HeldOut:
    """The training data split in two: `train` trains, `held` measures; `rows` are `held`'s indices in the
    data as read, `described` says where the held-out data came from (the metadata's `val_data`)."""

    train: LabelledData
    held: LabelledData
    rows: np.ndarray
    described: str


def take(data: LabelledData, rows: np.ndarray) -> LabelledData:
    """The samples of `data` at `rows` (every input and every output's targets alike)."""
    return LabelledData(data.x[rows], None if data.y is None else data.y[rows], data.classes, data.source,
                        tuple(a[rows] for a in data.others), {k: v[rows] for k, v in data.targets.items()},
                        data.names)


def held_rows(labels: np.ndarray | None, n: int, share: float, seed: int) -> np.ndarray:
    """Sorted indices of the held-out share of n samples: per class where there are class labels (each class
    that has two samples or more gives at least one), else of all."""
    rng = np.random.default_rng(seed)
    if labels is None or labels.ndim != 1:
        return np.sort(rng.permutation(n)[:int(round(share * n))])
    rows: list[int] = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        k = min(len(members) - 1, max(1, int(round(share * len(members)))))
        rows.extend(members[:k])
    return np.sort(np.asarray(rows, np.int64))


def split(data: LabelledData, seed: int, share: float = VAL_SHARE) -> HeldOut | None:
    """`share` of `data` held out (seeded, stratified); None where that leaves fewer than MIN_HELD_OUT."""
    n = len(data.x)
    rows = held_rows(data.y, n, share, seed)
    if len(rows) < MIN_HELD_OUT:
        return None
    kept = np.setdiff1d(np.arange(n), rows)
    described = f"split: {len(rows)} of {n} training samples ({100 * share:g} %), seed {seed}"
    return HeldOut(take(data, kept), take(data, rows), rows, described)


def fingerprints(data: LabelledData) -> list[bytes]:
    """One hash per sample of its decoded inputs (every input, bytes and shape)."""
    return fingerprints_of([data.x, *data.others])


def fingerprints_of(arrays: list[np.ndarray]) -> list[bytes]:
    """One hash per sample of the inputs' arrays (sample i of each), as `fingerprints`."""
    out = []
    for i in range(len(arrays[0])):
        h = hashlib.blake2b(digest_size=16)
        for a in arrays:
            h.update(str(a[i].shape).encode())
            h.update(np.ascontiguousarray(a[i]).tobytes())
        out.append(h.digest())
    return out


def shared_samples(a: LabelledData, b: LabelledData) -> int:
    """How many samples of `a` are also in `b` (by their decoded arrays)."""
    theirs = set(fingerprints(b))
    return sum(f in theirs for f in fingerprints(a))
