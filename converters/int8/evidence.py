"""The evidence `auto` decides on (converters/int8/choose.py): each candidate's per-sample losses against the
float model on held-out samples, and the comparisons made on them.

A candidate replaces the winner so far (min/max first: the converter's own file) only where its per-sample
losses are shown lower by `MARGIN` at the family's level: a one-sided paired test, scipy's Wilcoxon
signed-rank test on the per-sample differences, and a mean lower by the margin too
(`edgekit.intervals.lower_losses`). Agreement counts of a few
samples decide nothing. The candidates are compared in one fixed order, each against the winner so far,
and the family of comparisons holds its error at `FAMILY_ALPHA`: each comparison, at each look, is tested at
`FAMILY_ALPHA / (comparisons x looks)` (Bonferroni's bound, which holds whatever the dependence between
the tests and wherever the winner moved).

Where a comparison is not resolved and the calibration source has more samples, more are drawn in rounds
(`Rounds`: each doubles the count, up to a cap): the float model and the candidates still to be compared
are run on them, and the test looks again. No round is drawn where the candidate does not lean better
(ranks and mean), or where the samples the test would need at the rates observed exceed what the source
can give: drawing then would cost time and could not change the file.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.intervals import LowerLosses, lower_losses
from edgekit.metrics import per_sample_losses

FAMILY_ALPHA = 0.05  # the chance that any comparison of one conversion replaces a file by one not better
# what "better" is: losses lower by a tenth of the winner's. A candidate consistently a little better replaces
# nothing (the simpler file stays): on a third-party face-expression CNN every candidate measured within 10 % of
# min/max's mean KL (0.00561; extremes 0.00587), and the one picked there on two samples of 200 agreed with the
# float model on 4 images fewer; where a candidate won on test images its KL was far lower (an EfficientNetB0:
# min/max 0.0056, extremes 0.0016; the outlier CNN: min/max 0.317, equalize 0.00002)
MARGIN = 0.1
# samples past the first held-out ones are read (start, count): the calibration source's next ones
MoreSamples = Callable[[int, int], list]


@dataclass(frozen=True)
class MoreHeldOut:
    """Where more held-out samples come from: `read(start, count)` past the first ones, `available` of them,
    at most `cap` held-out samples in all (the first ones included)."""

    read: MoreSamples | None = None
    available: int = 0
    cap: int = 0


@dataclass(frozen=True)
class Comparison:
    """One decision: `candidate` against the winner so far (`against`) on the same held-out samples, the
    test (`LowerLosses`: n, means, p, the level), how many looks it took, kept or not and why, and what
    drawing more samples for it cost."""

    candidate: str
    against: str
    test: LowerLosses
    looks: int
    kept: bool
    why: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "against": self.against, **self.test.to_dict(),
                "looks": self.looks, "kept": self.kept, "why": self.why, "seconds": round(self.seconds, 2)}

    def line(self, loss: str) -> str:
        """The `-v` line: what was compared, on how many samples, the test, kept or not."""
        t = self.test
        p = "no p (scipy missing)" if t.p is None else f"p={t.p:.2g}"
        cost = f", {self.seconds:.1f} s measuring more samples" if self.seconds >= 0.05 else ""
        return (f"{self.candidate} against {self.against}: mean {loss} {t.candidate_mean:.4g} vs "
                f"{t.reference_mean:.4g} on {t.n} held-out samples, {p} (level {t.alpha:.2g}, "
                f"{self.looks} look{'s' if self.looks > 1 else ''}{cost}): "
                f"{'kept' if self.kept else 'not kept'}: {self.why}")


class Rounds:
    """The held-out samples in chunks: the first given, each later one read from the source when first needed
    (`more(start, count)`, the same samples however often read), each doubling the count, up to `cap` in
    all and what the source has (`available` past the first)."""

    def __init__(self, first: Sequence, more: MoreSamples | None = None, available: int = 0, cap: int = 0):
        self.first = list(first)
        self.sizes = [len(self.first)]
        room = min(cap, len(self.first) + available) if more is not None else len(self.first)
        while sum(self.sizes) < room:
            self.sizes.append(min(sum(self.sizes), room - sum(self.sizes)))
        self._more = more
        self._last: tuple[int, list] | None = None

    @property
    def looks(self) -> int:
        """The most looks a comparison can take: one a chunk."""
        return len(self.sizes)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def samples(self, chunk: int) -> list:
        if chunk == 0:
            return self.first
        if self._last is None or self._last[0] != chunk:
            assert self._more is not None  # no chunk past the first without a source
            self._last = (chunk, list(self._more(sum(self.sizes[1:chunk]), self.sizes[chunk])))
        return self._last[1]


def in_time(deadline: float | None, cost: float) -> bool:
    """Whether work of `cost` seconds started now ends by `deadline` (`time.perf_counter()`; None: no limit)."""
    return deadline is None or time.perf_counter() + cost <= deadline


class Evidence:
    """Each candidate's per-sample losses (and top-1 agreement with the float model, for class scores) chunk
    by chunk, the files they were measured on (to measure them on more chunks), and the comparisons.
    `evaluate(tflite, samples)` gives a model's first output; `reference` is the float model scored (the
    candidates' logits view where they are scored on logits); `loss` a `metrics.LOSSES` kind; `logits`:
    the outputs are logits (else class scores are compared as log-probabilities)."""

    def __init__(self, rounds: Rounds, evaluate: Callable[[bytes, list], np.ndarray], reference: bytes, loss: str,
                 *, classes: bool, logits: bool, threshold: float = 0.5, alpha: float = FAMILY_ALPHA):
        self.rounds, self.evaluate, self.reference = rounds, evaluate, reference
        self.loss, self.classes, self.logits, self.threshold = loss, classes, logits, threshold
        self.alpha = alpha  # per comparison and look: set by `plan`
        self.drawn = 1  # chunks drawn so far
        self.per_sample = 0.0  # seconds one model takes on one sample (the float model's, on the first chunk)
        self.deadline: float | None = None  # `time.perf_counter()` past which no round is drawn
        self._files: dict[str, bytes | None] = {}
        self._scores: dict[str, dict[int, tuple[np.ndarray, np.ndarray | None]]] = {}
        self._reference: tuple[int, np.ndarray] | None = None
        self._lock = threading.Lock()

    def plan(self, comparisons: int) -> float:
        """The level each test is made at, for a family of `comparisons` each looking up to `rounds.looks`
        times."""
        self.alpha = FAMILY_ALPHA / max(1, comparisons) / self.rounds.looks
        return self.alpha

    def measure(self, reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-sample losses of `candidate` against `reference` (outputs on the same samples), and whether each
        sample's top-1 agrees (class scores only)."""
        ref, cand = reference, candidate
        if self.loss == "kl" and not self.logits:  # probabilities: their logs are logits of the same softmax
            ref, cand = (np.log(np.clip(np.asarray(a, np.float64), 1e-7, None)) for a in (ref, cand))
        losses = per_sample_losses(ref, cand, self.loss, self.threshold)
        agrees = None
        if self.classes:
            flat = [np.asarray(a).reshape(len(a), -1) for a in (reference, candidate)]
            agrees = flat[0].argmax(axis=1) == flat[1].argmax(axis=1)
        return losses, agrees

    def add(self, name: str, file: bytes | None, losses: np.ndarray, agrees: np.ndarray | None) -> None:
        """A candidate measured on the first chunk; `file`, the file it was measured on (None where it was
        fitted twice, two-fold: there is no chunk past the first then)."""
        with self._lock:
            self._files[name] = file
            self._scores[name] = {0: (losses, agrees)}

    def measure_model(self, model: bytes) -> np.ndarray:
        """The per-sample losses of another model (a float one: what some change alone costs) on the first
        chunk, against the float model."""
        samples = self.rounds.samples(0)
        if self._reference is None or self._reference[0] != 0:
            self._reference = (0, self.evaluate(self.reference, samples))
        return self.measure(self._reference[1], self.evaluate(model, samples))[0]

    def first_losses(self, name: str) -> np.ndarray:
        """A candidate's losses on the first chunk."""
        return self._scores[name][0][0]

    def has(self, name: str) -> bool:
        return name in self._scores

    def losses(self, name: str) -> np.ndarray:
        """Its losses on every chunk it was measured on, in chunk order."""
        return np.concatenate([self._scores[name][j][0] for j in sorted(self._scores[name])])

    def disagreements(self, name: str) -> tuple[int, int] | None:
        """(samples whose top-1 differs from the float model's, samples measured); None for outputs that are
        not class scores."""
        agrees = [self._scores[name][j][1] for j in sorted(self._scores[name])]
        if any(a is None for a in agrees):
            return None
        every = np.concatenate([a for a in agrees if a is not None])
        return int(np.sum(~every)), len(every)

    def compare(self, winner: str, candidate: str, live: Sequence[str] = ()) -> Comparison:
        """`candidate` against `winner` on every chunk drawn, drawing more while the test is not resolved
        (`Rounds`); `live`: candidates still to be compared, measured on each chunk drawn meanwhile."""
        started, looks = time.perf_counter(), 0
        while True:
            self._measure([winner, candidate], self.drawn)
            test = lower_losses(self.losses(winner), self.losses(candidate), self.alpha, MARGIN)
            looks += 1
            why = self._resolved(test) or self._late(test, 2 + len(live))
            if why is not None:
                break
            self.drawn += 1
            self._measure([winner, candidate, *live], self.drawn)
        return Comparison(candidate, winner, test, looks, test.better, why, time.perf_counter() - started)

    def _resolved(self, test: LowerLosses) -> str | None:
        """Why the comparison ends here (kept, or not and why), or None where another round may resolve it."""
        if test.better:
            return f"its losses are lower at p={test.p:.2g}, under the level {test.alpha:.2g}"
        if test.p is None:
            return "no test without scipy: the simpler file stays"
        if not test.leaning:
            if test.p <= 0.5:  # the ranks lean its way, the mean does not: a few samples carry the winner's
                return ("its losses lean lower in rank, but their mean is not a tenth under the winner's (a few "
                        "samples decide it): the simpler file stays")
            if test.mean_lower:  # a few large losses of the winner's carry the mean; its other losses are lower
                return (f"its mean loss is a tenth under the winner's, but not its losses sample by sample (p={test.p:.2g}): "
                        "a few samples carry the mean: the simpler file stays")
            return "its losses are not lower (ranks and mean): the simpler file stays"
        needed = test.samples_to_resolve()
        if self.drawn >= self.rounds.looks:
            source = (f"the calibration source has no more samples to rank on (the cap is {self.rounds.total})"
                      if len(self.rounds.sizes) > 1 else "no more samples to rank on")
            return f"not resolved at n={test.n} ({source}; about {needed} would resolve it): the simpler file stays"
        if needed is not None and needed > self.rounds.total:
            return (f"not resolved at n={test.n}: about {needed} samples would resolve it, the source gives "
                    f"{self.rounds.total} at most: the simpler file stays")
        return None

    def _late(self, test: LowerLosses, models: int) -> str | None:
        """Why the next round is not drawn for lack of time (`deadline`: the time auto allows), or None: it
        runs the float model and `models` files on as many samples again."""
        cost = self.rounds.sizes[self.drawn] * (1 + models) * self.per_sample
        if in_time(self.deadline, cost):
            return None
        return (f"not resolved at n={test.n}: {self.rounds.sizes[self.drawn]} more samples (about {cost:.0f} s) "
                "would take auto past the time it allows: the simpler file stays")

    def _measure(self, names: Sequence[str], chunks: int) -> None:
        """Every one of `names` measured on chunks 0..chunks-1 (each read once a round, the float model run once
        on it)."""
        for j in range(chunks):
            missing = [n for n in dict.fromkeys(names) if j not in self._scores[n]]
            if not missing:
                continue
            samples = self.rounds.samples(j)
            if self._reference is None or self._reference[0] != j:
                self._reference = (j, self.evaluate(self.reference, samples))
            for name in missing:
                file = self._files[name]
                assert file is not None, name  # two-fold scoring draws no chunk past the first
                self._scores[name][j] = self.measure(self._reference[1], self.evaluate(file, samples))
