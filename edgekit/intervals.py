"""A candidate classifier against its reference on the same samples: the top-1 change and the agreement, each
with a 95 % interval, a verdict in words, and accuracy budgets judged on the interval.

The intervals come from scipy (imported when first needed, never at import time). Without it (armv7l without
Debian's python3-scipy) every result keeps its point estimate and n, its intervals are None, and it carries
`SCIPY_HINT`. Base layer: imports nothing of edgekit."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

CONFIDENCE = 0.95
NO_SLOWER = 1.05  # "no slower": a p50 at most 5 % above another's (timings move that much run to run)
SCIPY_HINT = "no 95 % intervals: they need scipy >= 1.7 (apt install python3-scipy, or pip install scipy)"

Interval = tuple[float, float]
BudgetStatus = Literal["met", "unresolved", "missed"]


@dataclass(frozen=True)
class PairedComparison:
    """Candidate against reference on the same n samples. `change_points` is the candidate's top-1 minus the
    reference's, in points (None without labels); `lost`/`gained` count the samples only the reference/only
    the candidate classified right; `agreement` is the share of samples whose top-1 class both give alike."""

    n: int
    change_points: float | None = None
    change_interval: Interval | None = None
    lost: int | None = None
    gained: int | None = None
    agreement: float | None = None
    agreement_interval: Interval | None = None
    verdict: str = ""
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: intervals as [low, high] lists, figures to six significant digits."""
        return {
            "n": self.n,
            "change_points": _round(self.change_points),
            "change_interval": _round_pair(self.change_interval),
            "lost": self.lost,
            "gained": self.gained,
            "agreement": _round(self.agreement),
            "agreement_interval": _round_pair(self.agreement_interval),
            "confidence": CONFIDENCE,
            "verdict": self.verdict,
            "hint": self.hint,
        }


@dataclass(frozen=True)
class BudgetVerdict:
    """An accuracy budget (the most top-1 points the candidate may lose) judged on the interval of the loss
    (what the data cannot resolve is not missed). `met`: the interval's upper end is within the budget. `missed`: its lower end is over it,
    and so the point estimate too. `unresolved`: the interval straddles the budget; not a missed budget: a
    caller chooses on `within_on_point` and says `samples_to_resolve`. Without scipy there is no interval and
    the point estimate alone decides met or missed (`judged_on` == "point")."""

    status: BudgetStatus
    budget_points: float
    loss_points: float
    loss_interval: Interval | None
    judged_on: Literal["interval", "point"]
    samples_to_resolve: int | None
    message: str

    @property
    def missed(self) -> bool:
        """True for the one status a caller turns into a failing exit code."""
        return self.status == "missed"

    @property
    def within(self) -> bool:
        """Met, or unresolved and within the budget on the point estimate: a file a caller may choose (what
        the data cannot resolve is not missed)."""
        return self.status == "met" or (self.status == "unresolved" and self.within_on_point)

    @property
    def within_on_point(self) -> bool:
        """Whether the point estimate of the loss is within the budget: the choice where it is unresolved."""
        return self.loss_points <= self.budget_points

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as `PairedComparison.to_dict`."""
        return {
            "status": self.status,
            "budget_points": self.budget_points,
            "loss_points": _round(self.loss_points),
            "loss_interval": _round_pair(self.loss_interval),
            "judged_on": self.judged_on,
            "within_on_point": self.within_on_point,
            "samples_to_resolve": self.samples_to_resolve,
            "message": self.message,
        }


def compare(*, reference_correct: ArrayLike | None = None, candidate_correct: ArrayLike | None = None,
            agree: ArrayLike | None = None) -> PairedComparison:
    """Paired comparison from per-sample booleans: whether the reference and the candidate classified each
    sample right (labelled data), and/or whether their top-1 classes agree. Give both `*_correct` or neither."""
    if (reference_correct is None) != (candidate_correct is None):
        raise ValueError("give both reference_correct and candidate_correct, or neither")
    given = [np.asarray(a, bool).ravel() for a in (reference_correct, candidate_correct, agree) if a is not None]
    if not given or len({len(a) for a in given}) != 1:
        raise ValueError(f"per-sample arrays of one length are needed, got lengths {[len(a) for a in given]}")
    n = len(given[0])
    counts: dict[str, int] = {}
    if reference_correct is not None:
        ref, cand = given[0], given[1]
        counts = {"both": int(np.sum(ref & cand)), "lost": int(np.sum(ref & ~cand)),
                  "gained": int(np.sum(~ref & cand))}
    agreed = None if agree is None else int(np.sum(given[-1]))
    return compare_counts(n, agreed=agreed, **counts)


def matches(candidate_correct: ArrayLike, reference_correct: ArrayLike) -> PairedComparison | None:
    """The candidate's top-1 against another file's on the same samples, where it matches it ("matches its
    accuracy within the interval"): the change is not distinguishable from 0, or a gain -- the
    interval's upper end is not below 0 (without scipy, the point estimate). None where the candidate loses."""
    c = compare(reference_correct=reference_correct, candidate_correct=candidate_correct)
    assert c.change_points is not None  # both per-sample arrays given
    high = c.change_interval[1] if c.change_interval is not None else c.change_points
    return c if high >= 0 else None


def no_slower(p50_ms: float, other_p50_ms: float) -> bool:
    """Whether a p50 counts as no slower than another's: at most `NO_SLOWER` times it. With smaller and
    `matches`, what "dominates" means."""
    return p50_ms <= NO_SLOWER * other_p50_ms


def compare_counts(n: int, *, both: int | None = None, lost: int | None = None, gained: int | None = None,
                   agreed: int | None = None) -> PairedComparison:
    """Paired comparison from counts over n samples: `both` right, only the reference right (`lost`), only
    the candidate right (`gained`; the rest neither), and/or `agreed` samples of the same top-1 class."""
    _check_counts(n, both, lost, gained, agreed)
    binomtest = _binomtest()
    fields: dict[str, Any] = {"n": n, "hint": None if binomtest else SCIPY_HINT}
    if agreed is not None:
        fields["agreement"] = agreed / n
        fields["agreement_interval"] = _clopper_pearson(binomtest, agreed, n) if binomtest else None
    if both is not None and lost is not None and gained is not None:
        fields.update(lost=lost, gained=gained, change_points=100.0 * (gained - lost) / n,
                      change_interval=_paired_change(binomtest, both, lost, gained, n) if binomtest else None)
    return PairedComparison(**fields, verdict=_verdict(fields))


def _check_counts(n: int, both: int | None, lost: int | None, gained: int | None, agreed: int | None) -> None:
    table = [c for c in (both, lost, gained) if c is not None]
    if n <= 0 or len(table) not in (0, 3) or (agreed is None and not table):
        raise ValueError(f"n > 0 and both/lost/gained, agreed, or all four are needed (n={n}, both={both}, "
                         f"lost={lost}, gained={gained}, agreed={agreed})")
    if table and (min(table) < 0 or sum(table) > n):
        raise ValueError(f"both={both}, lost={lost}, gained={gained} do not fit in n={n}")
    if agreed is not None and not 0 <= agreed <= n:
        raise ValueError(f"agreed={agreed} is not within 0..{n}")


def judge_budget(comparison: PairedComparison, max_drop_points: float) -> BudgetVerdict:
    """Judge a budget of at most `max_drop_points` top-1 points lost on the comparison's interval; where the
    interval straddles the budget, decide on the point estimate and say how many samples would resolve it."""
    if comparison.change_points is None:
        raise ValueError("a top-1 budget needs labelled data: the comparison has no top-1 change")
    budget, loss, n = float(max_drop_points), 0.0 - comparison.change_points, comparison.n  # no -0.0
    if comparison.change_interval is None:
        status: BudgetStatus = "met" if loss <= budget else "missed"
        message = f"{_budget_words(status, budget)} on the point estimate, a loss of {loss:.2f} points at n={n}"
        return BudgetVerdict(status, budget, loss, None, "point", None, f"{message}; {SCIPY_HINT}")
    low, high = -comparison.change_interval[1], -comparison.change_interval[0]
    spread = f"the loss is {_span(low, high)} points at n={n} (95 % interval)"
    if high <= budget or low > budget:
        status = "met" if high <= budget else "missed"
        return BudgetVerdict(status, budget, loss, (low, high), "interval", None,
                             f"{_budget_words(status, budget)}: {spread}")
    needed = samples_to_resolve(n, loss, (low, high), budget)
    more = (f"about {_two_figures(needed)} samples at the rates observed would resolve it" if needed is not None
            else "no sample count resolves a loss equal to the budget")
    message = (f"the data cannot resolve the {budget:g}-point budget: {spread}; "
               f"{'within' if loss <= budget else 'over'} it on the point estimate, a loss of {loss:.2f} points; "
               f"{more}")
    return BudgetVerdict("unresolved", budget, loss, (low, high), "point", needed, message)


def samples_to_resolve(n: int, loss: float, interval: Interval, budget: float) -> int | None:
    """Samples at which the loss interval would clear the budget, at the rates observed: the interval's
    half-width toward the budget shrinks as 1/sqrt(n), so n * (half-width / distance to the budget)^2.
    None when the point estimate equals the budget (no n resolves it)."""
    gap = abs(budget - loss)
    if gap == 0:
        return None
    half = interval[1] - loss if loss < budget else loss - interval[0]
    return max(n + 1, math.ceil(n * (half / gap) ** 2))


@dataclass(frozen=True)
class LowerLosses:
    """Whether a candidate's per-sample losses are lower than a reference's by more than `margin` of them, on
    the same n samples (the reference's loss times 1 - margin, minus the candidate's, sample by sample):
    scipy's one-sided Wilcoxon signed-rank test (Pratt's treatment of zero differences) at level `alpha`.
    `better` needs the mean loss lower by the margin too: a test of ranks can favour a candidate whose rare
    large losses make its mean the worse. Without scipy `p` is None and nothing is better."""

    n: int
    reference_mean: float
    candidate_mean: float
    p: float | None
    alpha: float
    margin: float = 0.0

    @property
    def mean_lower(self) -> bool:
        """Whether the candidate's mean loss is under the reference's by the margin (the point estimate)."""
        return self.candidate_mean < (1 - self.margin) * self.reference_mean

    @property
    def better(self) -> bool:
        return self.p is not None and self.p <= self.alpha and self.mean_lower

    @property
    def leaning(self) -> bool:
        """Whether the candidate leans better (ranks and mean both its way) without being resolved so."""
        return self.p is not None and self.p < 0.5 and self.mean_lower

    def samples_to_resolve(self) -> int | None:
        """Samples at which the test would resolve at `alpha`, at the rates observed (its z grows as
        sqrt(n)); None where the candidate does not lean better (no n resolves it)."""
        if not self.leaning or self.p is None:
            return None
        from scipy.stats import norm

        z, needed = float(norm.isf(self.p)), float(norm.isf(self.alpha))
        return self.n if z >= needed else max(self.n + 1, math.ceil(self.n * (needed / z) ** 2))

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "reference_mean": _round(self.reference_mean),
                "candidate_mean": _round(self.candidate_mean), "p": _round(self.p), "alpha": _round(self.alpha),
                "margin": self.margin}


def lower_losses(reference: ArrayLike, candidate: ArrayLike, alpha: float = 1 - CONFIDENCE,
                 margin: float = 0.0) -> LowerLosses:
    """`LowerLosses` of two per-sample loss arrays of one length (finite, aligned sample by sample); `margin`
    the share of the reference's losses the candidate's must be under (0: merely lower)."""
    ref, cand = np.asarray(reference, np.float64).ravel(), np.asarray(candidate, np.float64).ravel()
    if len(ref) != len(cand) or not len(ref):
        raise ValueError(f"per-sample losses of one length are needed, got {len(ref)} and {len(cand)}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must lie in [0, 1), got {margin}")
    means = float(np.mean(ref)), float(np.mean(cand))
    differences = (1 - margin) * ref - cand  # > 0 where the candidate's loss is lower by the margin
    p: float | None = 1.0
    if np.any(differences != 0):
        try:
            from scipy.stats import wilcoxon
        except ImportError:
            p = None
        else:
            p = float(wilcoxon(differences, zero_method="pratt", alternative="greater").pvalue)
    return LowerLosses(len(ref), *means, p=p, alpha=alpha, margin=margin)


def mean_lower_bound(values: ArrayLike, confidence: float = CONFIDENCE) -> float | None:
    """The one-sided lower bound of a mean at `confidence`, from scipy's bootstrap (BCa, 9,999 resamples, a fixed
    seed): a mean carried by one or two large values is not resolved above much. None without scipy."""
    x = np.asarray(values, np.float64).ravel()
    if not len(x):
        raise ValueError("no values")
    if np.all(x == x[0]):
        return float(x[0])
    try:
        from scipy.stats import bootstrap
    except ImportError:
        return None
    found = bootstrap((x,), np.mean, confidence_level=confidence, alternative="greater", method="BCa",
                      n_resamples=9999, random_state=0)
    low = float(found.confidence_interval.low)
    return low if math.isfinite(low) else float(np.min(x))


def agrees_less(candidate_agrees: ArrayLike, reference_agrees: ArrayLike) -> float | None:
    """The one-sided p that a candidate agrees with some model on fewer samples than a reference file does,
    from whether each agreed on each of the same samples: the exact McNemar test (a binomial test of the
    samples only one of them agrees on). None without scipy."""
    cand, ref = np.asarray(candidate_agrees, bool).ravel(), np.asarray(reference_agrees, bool).ravel()
    if len(cand) != len(ref):
        raise ValueError(f"per-sample arrays of one length are needed, got {len(cand)} and {len(ref)}")
    only_reference, only_candidate = int(np.sum(ref & ~cand)), int(np.sum(cand & ~ref))
    binomtest = _binomtest()
    if binomtest is None:
        return None
    if only_reference + only_candidate == 0:
        return 1.0
    return float(binomtest(only_reference, only_reference + only_candidate, 0.5, alternative="greater").pvalue)


def scipy_available() -> bool:
    """Whether intervals can be computed here (scipy >= 1.7, whose binomtest has proportion_ci)."""
    return _binomtest() is not None


def _binomtest() -> Callable[..., Any] | None:
    try:
        from scipy.stats import binomtest
    except ImportError:  # no scipy, or one older than 1.7 (Debian bullseye's 1.6)
        return None
    return binomtest


def _clopper_pearson(binomtest: Callable[..., Any], k: int, n: int) -> Interval:
    """The exact (Clopper-Pearson) interval of a proportion: never shorter than its nominal coverage."""
    ci = binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


def _paired_change(binomtest: Callable[..., Any], both: int, lost: int, gained: int, n: int) -> Interval:
    """The candidate's top-1 minus the reference's, in points: Newcombe's square-and-add interval for paired
    proportions (Newcombe 1998, method 10; as in Fagerland, Lydersen & Laake, "Statistical Analysis of
    Contingency Tables", ch. 8, which recommends it) combining the Wilson intervals of the two accuracies
    from scipy's `binomtest(...).proportion_ci(method="wilson")`. Chosen over the conditional exact interval
    of the discordant pairs scaled by their observed share: that one holds the share of flips as known, so
    when every flip goes one way (the usual int8 case) its loss end equals the point estimate, and a budget
    would be "met on the interval" by the very loss observed."""
    neither = n - both - lost - gained
    ref_right, cand_right = both + lost, both + gained
    p1, p2 = ref_right / n, cand_right / n
    ci1 = binomtest(ref_right, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    ci2 = binomtest(cand_right, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    margins = ref_right * (n - ref_right) * cand_right * (n - cand_right)
    psi = _correlation(both * neither - lost * gained, margins, n)
    d1_low, d1_high, d2_low, d2_high = p1 - ci1.low, ci1.high - p1, p2 - ci2.low, ci2.high - p2
    low = (p1 - p2) - math.sqrt(d1_low**2 + d2_high**2 - 2 * psi * d1_low * d2_high)
    high = (p1 - p2) + math.sqrt(d2_low**2 + d1_high**2 - 2 * psi * d2_low * d1_high)
    return -100.0 * high, -100.0 * low  # reference minus candidate -> candidate minus reference, in points


def _correlation(cross: int, margins: int, n: int) -> float:
    """The correlation of the two accuracies Newcombe's method subtracts, continuity-corrected as he gives it:
    0 for an empty margin or a cross-product in [0, n/2], else (cross - n/2) or cross over sqrt(margins)."""
    if margins == 0 or 0 <= cross <= n / 2:
        return 0.0
    return (cross - n / 2 if cross > 0 else cross) / math.sqrt(margins)


def _verdict(fields: dict[str, Any]) -> str:
    """'not distinguishable from 0 at n=297', 'loses 0.7-3.1 points at n=297', 'gains ...'; without labels
    the agreement; without scipy the point estimate alone."""
    n, change, interval = fields["n"], fields.get("change_points"), fields.get("change_interval")
    if change is None:
        agreement, ci = fields["agreement"], fields.get("agreement_interval")
        within = f" (95 % interval {_span(100 * ci[0], 100 * ci[1])} %)" if ci else ""
        return f"agrees on {100 * agreement:.1f} %{within} at n={n}"
    if interval is None:
        return f"{'gains' if change > 0 else 'loses'} {abs(change):.2f} points at n={n} (no interval)"
    low, high = interval
    if low <= 0 <= high:
        return f"not distinguishable from 0 at n={n}"
    if high < 0:
        return f"loses {_span(-high, -low)} points at n={n}"
    return f"gains {_span(low, high)} points at n={n}"


def _budget_words(status: BudgetStatus, budget: float) -> str:
    return f"{'over' if status == 'missed' else 'within'} the {budget:g}-point budget"


def _span(low: float, high: float) -> str:
    """'0.7-3.1', with a second decimal where one would show the two ends alike or an end as 0.0."""
    digits = 1 if high - low >= 0.2 and min(abs(low), abs(high)) >= 0.05 else 2
    return f"{low:.{digits}f} to {high:.{digits}f}" if low < 0 else f"{low:.{digits}f}-{high:.{digits}f}"


def _two_figures(count: int) -> str:
    """1,379,466 -> '1,400,000': a sample count projected from rates is no more precise than that."""
    return f"{round(count, 2 - len(str(count))):,}" if count >= 100 else str(count)


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def _round_pair(pair: Interval | None) -> list[float] | None:
    return None if pair is None else [float(f"{pair[0]:.6g}"), float(f"{pair[1]:.6g}")]
