"""What the candidates of one `choose.choose` share, each made once when first needed (by whichever of
`choose`'s threads needs it first: the others wait for it): a variant's calibrated model, the activations
collected for fitting ranges, the logits views, and whatever a candidate keeps per fit (`once`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from edgekit.converters.int8 import ranges


class Context:
    """The converter's calibrated model, the samples with their groups, and the variants: name -> a function
    making the calibrated model of the same function with other weights (converters/int8/equalization.py)."""

    def __init__(self, calibrated: bytes, io: str, variants: dict[str, Callable[[], bytes]], samples: list,
                 folds: list, seed: int, converters_fit: tuple[str, ...] = ("a", "b"), output: str | None = None):
        self.calibrated, self.io, self.variants = calibrated, io, variants
        self.output = output  # the scored output's signature name (None: the graph's first; `ranges.scored_tensor`)
        self.samples, self.folds, self.seed = samples, folds, seed
        self.converters_fit = converters_fit  # the groups the converter calibrated on: min/max there is its own
        self.plain: dict[bool, bytes] = {}  # the converter's int8 model (float I/O; of the view: True), once made
        self.seconds: dict[str, float] = {}  # what shared work took ("activations": one pass collecting them)
        self._made: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._locks: dict[Any, threading.Lock] = {}

    def once(self, key: Any, make: Callable[[], Any]) -> Any:
        """What `make` gives, made once under `key` however many threads ask at the same time."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._made:
                self._made[key] = make()
        return self._made[key]

    def _key(self, variant: str) -> str:
        return variant if variant in self.variants else ""

    def base(self, variant: str = "") -> bytes:
        """The calibrated model a candidate starts from: the converter's (""), or a variant's."""
        key = self._key(variant)
        return self.once(("variant", key), self.variants[key]) if key else self.calibrated

    def activations(self, variant: str = "") -> ranges.Activations:
        """The values of that calibrated model's tensors on the samples some range is fitted on (one
        collection a calibrated model, shared by the range methods)."""
        def collected() -> ranges.Activations:
            began = time.perf_counter()
            pairs = [(x, g) for x, g in zip(self.samples, self.folds) if g in self.converters_fit]
            found = ranges.collect(self.base(variant), [x for x, _ in pairs], [g for _, g in pairs], seed=self.seed)
            self.seconds.setdefault("activations", time.perf_counter() - began)
            return found

        return self.once(("activations", self._key(variant)), collected)

    def model(self, variant: str, view: bool) -> bytes:
        """That calibrated model, with `view` its logits view (`ranges.logits_view`: the same tensors and
        recorded ranges)."""
        if not view:
            return self.base(variant)
        return self.once(("view", self._key(variant)), lambda: ranges.logits_view(self.base(variant), self.output))

    def use_view(self, view: bytes) -> None:
        """The logits view of the converter's calibrated model, made already (`choose._scored_model`)."""
        self._made.setdefault(("view", ""), view)
