"""No dominated file (a file is dominated where another is smaller, no slower and matches its top-1 within
the interval): the files the accuracy-budget autopilot may hand back -- its int8 result,
plain int8, and the float16 and dynamic-range files of the same model -- each with its size, its p50 on this
CPU and its paired comparison against the float model the user gave, judged against the budget.

B dominates A when B matches A's accuracy within the 95 % interval (the paired comparison of B against A on
the same samples is not distinguishable from 0, or B gains), B is smaller, and B is no slower: its p50 is at
most `NO_SLOWER` times A's (the timing noise of a shared CPU). The chosen file is never dominated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.intervals import NO_SLOWER, BudgetVerdict, PairedComparison, compare, judge_budget, no_slower
from edgekit.intervals import matches as accuracy_matches

TIMING_ROUNDS = 7  # interleaved rounds: every candidate timed in each, the order rotated
ROUND_SECONDS = 0.03  # about this long per candidate and round (5 to 50 invokes)
INT8_ONLY = ("npu",)  # targets whose accelerator runs full-integer files only


@dataclass
class Candidate:
    """One file the autopilot may hand back and what it measured on the evaluation data."""

    name: str  # "int8" (the search's result), "plain int8", "float16", "dynamic"
    mode: str  # int8 | float16 | dynamic
    tflite: bytes
    classes: np.ndarray  # top-1 class per evaluation sample
    comparison: PairedComparison | None = None  # against the float model the user gave
    budget: BudgetVerdict | None = None
    p50_ms: float | None = None
    refused: str | None = None  # why it may not be handed back (the target, the io asked for)
    dominated_by: str | None = None

    @property
    def size(self) -> int:
        return len(self.tflite)

    @property
    def fits(self) -> bool:
        """Within the budget: met on the interval, or unresolved and within it on the point estimate."""
        assert self.budget is not None
        return self.budget.within

    def to_dict(self) -> dict[str, Any]:
        assert self.comparison is not None and self.budget is not None
        return {"name": self.name, "mode": self.mode, "size_bytes": self.size,
                "p50_ms": None if self.p50_ms is None else round(self.p50_ms, 4),
                "comparison": self.comparison.to_dict(), "budget": self.budget.status,
                "dominated_by": self.dominated_by, "refused": self.refused}


@dataclass(frozen=True)
class Choice:
    """The candidate handed back, why, and every candidate as measured."""

    chosen: Candidate
    reason: str
    candidates: list[Candidate]

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen.name, "chosen_mode": self.chosen.mode, "reason": self.reason,
                "comparison": _dict(self.chosen.comparison), "budget": _dict(self.chosen.budget),
                "candidates": [c.to_dict() for c in self.candidates], "no_slower_tolerance": NO_SLOWER}


def _dict(value: PairedComparison | BudgetVerdict | None) -> dict[str, Any] | None:
    return None if value is None else value.to_dict()


def judged(candidates: list[Candidate], labels: np.ndarray, float_classes: np.ndarray, max_drop: float) -> None:
    """Each candidate's comparison against the float model (top-1 and agreement) and its budget verdict."""
    reference = float_classes == labels
    for c in candidates:
        c.comparison = compare(reference_correct=reference, candidate_correct=c.classes == labels,
                               agree=c.classes == float_classes)
        c.budget = judge_budget(c.comparison, max_drop)


def interleaved_p50(files: list[bytes], rounds: int = TIMING_ROUNDS,
                    sample: list[np.ndarray] | None = None) -> list[float]:
    """Median invoke time (ms) of each file on one CPU thread, timed in interleaved rounds (the order rotated
    each round), so that a load that comes and goes on a shared machine falls on every file alike; on
    `sample` (one float array a model input, batch 1) where given, else zeros (a kernel may refuse them:
    basic-pitch's int8 DIV refuses silence)."""
    from edgekit.runtime.model import Model
    from edgekit.runtime.quant import quantize
    from edgekit.runtime.timing import time_invokes

    runners = []
    for tflite in files:
        model = Model(tflite, delegate="cpu", num_threads=1, probe=False)
        for k, info in enumerate(model.inputs):
            fed = np.zeros(info.shape, info.dtype) if sample is None else quantize(sample[k], info)
            model.runner.set(info.index, fed)
        runners.append(model.runner)
    runs = [int(np.clip(ROUND_SECONDS * 1e3 / max(float(np.median(time_invokes(r, 5))), 1e-3), 5, 50))
            for r in runners]
    times: list[list[float]] = [[] for _ in files]
    for k in range(rounds):
        for i in [(k + j) % len(files) for j in range(len(files))]:
            times[i].extend(time_invokes(runners[i], runs[i]).tolist())
    return [float(np.median(t)) for t in times]


def matches(b: Candidate, a: Candidate, labels: np.ndarray) -> bool:
    """B matches A's accuracy: B against A on the same samples is not distinguishable from 0, or gains (the
    interval's upper end is not below 0; without scipy, the point estimate)."""
    return accuracy_matches(b.classes == labels, a.classes == labels) is not None


def dominates(b: Candidate, a: Candidate, labels: np.ndarray) -> bool:
    """B matches A's accuracy within the interval while being smaller and no slower (module docstring)."""
    assert a.p50_ms is not None and b.p50_ms is not None
    return b.size < a.size and no_slower(b.p50_ms, a.p50_ms) and matches(b, a, labels)


def choose(candidates: list[Candidate], labels: np.ndarray) -> Choice:
    """The file to hand back. Among those that may be (not `refused`) and fit the budget, the first
    candidate (the search's int8) where it fits, else the smallest; where none fits, the most accurate.
    Then, while another such file dominates it, the smallest that does."""
    allowed = [c for c in candidates if c.refused is None]
    fitting = [c for c in allowed if c.fits]
    pool = fitting or allowed
    for a in candidates:  # dominated by a file that may be handed back in its place: within the budget
        better = sorted((b for b in pool if b is not a and dominates(b, a, labels)), key=lambda b: b.size)
        a.dominated_by = better[0].name if better else None
    if candidates[0] in fitting:
        chosen = candidates[0]
    elif fitting:
        chosen = min(fitting, key=lambda c: c.size)
    else:
        chosen = max(allowed, key=lambda c: (_change(c), _agreement(c), -c.size))
    skipped = []
    while True:
        better = sorted((b for b in pool if b is not chosen and _standing(b) <= _standing(chosen)
                         and dominates(b, chosen, labels)), key=lambda b: b.size)
        if not better:
            break
        skipped.append(chosen)
        chosen = better[0]
    return Choice(chosen, _reason(chosen, skipped, candidates, labels, bool(fitting)), candidates)


def _standing(c: Candidate) -> int:
    """How a file stands against the budget, best first: met, unresolved within it on the point estimate,
    unresolved over it, missed. A dominating file never replaces one that stands better (a file "matching"
    within a wide interval may still miss the budget: exit 11 where the other would exit 0)."""
    assert c.budget is not None
    if c.budget.status == "unresolved":
        return 1 if c.budget.within_on_point else 2
    return {"met": 0, "missed": 3}[c.budget.status]


def _change(c: Candidate) -> float:
    return (c.comparison.change_points or 0.0) if c.comparison is not None else 0.0


def _agreement(c: Candidate) -> float:
    return (c.comparison.agreement or 0.0) if c.comparison is not None else 0.0


def _reason(chosen: Candidate, skipped: list[Candidate], candidates: list[Candidate], labels: np.ndarray,
            fitting: bool) -> str:
    """Why `chosen`: what it replaced (dominated), and why each smaller file did not win."""
    said = []
    if skipped:
        first = skipped[0]
        said.append(f"the {first.name} file is dominated: {chosen.name} matches its accuracy "
                    f"({_versus(chosen, first, labels)}), is {first.size - chosen.size:,} bytes smaller and "
                    f"{_speed(chosen, first)}")
    elif not fitting:
        said.append(f"no candidate is within the budget: {chosen.name} loses least")
    elif candidates[0] is not chosen and candidates[0].budget is not None:
        said.append(f"the {candidates[0].name} file is not within the budget ({candidates[0].budget.message}); "
                    f"{chosen.name} is, and no other file dominates it")
    else:
        said.append(f"{chosen.name} is within the budget and no other file dominates it")
    for c in candidates:
        if c is chosen or c in skipped or c.size >= chosen.size:
            continue
        said.append(f"{c.name} is smaller but {_why_not(c, chosen, labels)}")
    return "; ".join(said)


def _why_not(c: Candidate, chosen: Candidate, labels: np.ndarray) -> str:
    if c.refused is not None:
        return c.refused
    if c.budget is not None and not c.fits:
        return f"not within the budget ({c.budget.message})"
    if not matches(c, chosen, labels):
        return f"does not match its accuracy ({_versus(c, chosen, labels)})"
    return f"{_speed(c, chosen)} (p50 on one thread)"


def _versus(b: Candidate, a: Candidate, labels: np.ndarray) -> str:
    return compare(reference_correct=a.classes == labels, candidate_correct=b.classes == labels).verdict


def _speed(b: Candidate, a: Candidate) -> str:
    """'1.6x slower on this CPU', 'no slower on this CPU (0.97x its p50)'."""
    assert a.p50_ms is not None and b.p50_ms is not None
    ratio = b.p50_ms / a.p50_ms
    if ratio > NO_SLOWER:
        return f"{ratio:.2f}x slower on this CPU"
    return f"no slower on this CPU ({ratio:.2f}x its p50, tolerance {NO_SLOWER:g}x)"
