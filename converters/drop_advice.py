"""A training run that loses top-1: judged against `training.warn_drop` on the interval of the final file's
loss (edgekit.intervals.judge_budget), which stage lost it, and the fix this run's own measurements point to
(the held-out curve of the pruning fine-tune) beside the project's measured figures (docs/convert.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgekit.intervals import PairedComparison, judge_budget

# docs/convert.md (tests/perf/test_channel_pruning.py): MobileNetV2 at 64x64, half its channels removed, lost
# 1.11-1.67 points after 16 epochs of fine-tuning and 0.00-0.56 after 32 (seeds 0, 1, 2)
CHANNEL_EPOCHS = 32
CHANNEL_FIGURES = ("channel pruning is a re-training: MobileNetV2 with half its channels removed lost 1.1-1.7 "
                   f"points after 16 epochs and 0-0.6 after {CHANNEL_EPOCHS} (docs/convert.md)")
MAX_EPOCHS_SAID = 256  # an extrapolation past this says "more than"


@dataclass(frozen=True)
class Run:
    """What the fine-tune was asked to do (the parts a fix changes)."""

    epochs: int
    sparsity: float = 0.0
    channels: bool = False
    distill: float = 0.0
    qat: bool = False
    int8: bool = False


def advise(comparisons: dict[str, PairedComparison], warn_drop: float, curve: list[float], run: Run,
           reference: float | None) -> dict[str, Any] | None:
    """The `compression.drop` entry: the final file's loss against the original model judged against
    `warn_drop`, the stage that lost most, the fixes, and the warning (None where within); None without a
    final comparison. `reference`: the original model's top-1 on the held-out data."""
    final = comparisons.get("final")
    if final is None or final.change_points is None:
        return None
    verdict = judge_budget(final, warn_drop)
    over = not verdict.within
    judged = ("on its interval" if verdict.status == "missed" and verdict.judged_on == "interval" else
              "on its point estimate" + (" (the interval straddles it)" if verdict.status == "unresolved" else
                                         " (no interval without scipy)"))
    cause = _cause(comparisons)
    fixes = _fixes(cause, curve, run, warn_drop, final, reference) if over else []
    warning = None
    if over:
        warning = (f"training loses {_loss_words(final)} against the original model on the held-out data, "
                   f"over `training.warn_drop` ({warn_drop:g}) {judged}; the {cause} lost most of it. Fix: "
                   + "; ".join(fixes))
    return {"warn_drop": warn_drop, "verdict": verdict.to_dict(), "cause": cause, "fixes": fixes,
            "warning": warning}


def _loss_words(c: PairedComparison) -> str:
    assert c.change_points is not None
    if c.change_interval is None:
        return f"{-c.change_points:.1f} points of top-1 at n={c.n}"
    low, high = -c.change_interval[1], -c.change_interval[0]
    return f"{-c.change_points:.1f} points of top-1 ({low:.1f} to {high:.1f} at 95 %, n={c.n})"


def _cause(comparisons: dict[str, PairedComparison]) -> str:
    """'pruning', 'QAT' or 'conversion': the step from one measured stage to the next that lost most."""
    losses = [(name, -c.change_points) for name, c in
              ((s, comparisons.get(s)) for s in ("pruned", "qat", "final")) if c is not None and c.change_points is not None]
    steps, before = [], 0.0
    for name, loss in losses:
        steps.append((loss - before, {"pruned": "pruning", "qat": "QAT", "final": "conversion"}[name]))
        before = loss
    return max(steps)[1]


def _fixes(cause: str, curve: list[float], run: Run, warn_drop: float, final: PairedComparison,
           reference: float | None) -> list[str]:
    if cause == "pruning":
        return _pruning_fixes(curve, run, warn_drop, final, reference)
    if cause == "QAT":
        return [f"train longer (`training.epochs={max(2 * run.epochs, 8)}`)",
                "keep the layers that lose it in float (`training.skip_layers`)",
                "or quantize after training without `training.qat`, with `budget.max_drop` keeping the most "
                "sensitive layers in float"]
    if run.int8:
        return ["`budget.max_drop` keeps the int8 layers that lose it in float"]
    return ["the conversion of the trained model loses it: see the verification line"]


def _pruning_fixes(curve: list[float], run: Run, warn_drop: float, final: PairedComparison,
                   reference: float | None) -> list[str]:
    fixes: list[str] = []
    longer = None if reference is None else epochs_to_recover(curve, run.epochs, reference, warn_drop, final.n)
    if longer is not None:
        fixes.append(longer)
    elif len(curve) >= 2:
        fixes.append(f"held-out top-1 stopped rising ({_curve_words(curve[-2:])} over the last epoch): more "
                     "epochs at this rate will not recover it")
    if run.channels:
        fixes.append(f"{CHANNEL_FIGURES}: `training.epochs={max(CHANNEL_EPOCHS, run.epochs * 2)}`")
    if run.sparsity > 0.1:
        fixes.append(f"a lower `pruning.sparsity={round(run.sparsity / 2, 2):g}`")
    if run.distill == 0:
        fixes.append("`training.distill=0.5` (the original model's outputs as targets: it helped where the "
                     "fine-tune was short, docs/convert.md)")
    return fixes


def epochs_to_recover(curve: list[float], epochs: int, reference: float, warn_drop: float, n: int) -> str | None:
    """'train longer: `training.epochs=N`' where the held-out top-1 still rose in the last epoch (by one
    sample or more): N extrapolates that last gain in a straight line to the original model's top-1
    (`reference`) less `warn_drop` points. Optimistic: fine-tunes slow down. curve[0] is before the fine-tune."""
    if len(curve) < 2 or curve[-1] - curve[-2] < 1.0 / n:
        return None
    gain, target = curve[-1] - curve[-2], reference - warn_drop / 100.0
    total = epochs + (max(1, math.ceil((target - curve[-1]) / gain)) if target > curve[-1] else 1)
    said = f"`training.epochs={total}`" if total <= MAX_EPOCHS_SAID else f"more than {MAX_EPOCHS_SAID} epochs"
    return (f"train longer: {said} at least (held-out top-1 still rising: {_curve_words(curve[-2:])} in epoch "
            f"{len(curve) - 1}; {total} epochs at that rate, and fine-tunes slow down)")


def _curve_words(values: list[float]) -> str:
    return " -> ".join(f"{100 * v:.1f} %" for v in values)
