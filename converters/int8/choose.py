"""Activation ranges beyond min/max for post-training int8, chosen on evidence.

TFLite's converter calibrates by running the float model and recording each activation's min and max;
one outlier then stretches a tensor's scale for every other value. Here the converter only calibrates
(`_experimental_calibrate_only`, as TFLite's own QuantizationDebugger does), the float model's activations
are sampled on the calibration data, and each range method proposes ranges from them (`minmax`, `percentile`,
`mse`, and `ema` and `extremes` of each sample's min and max).

Those and the other candidates (`bias`, `aeq`, `equalize`) are peers in converters/int8/, one module each
behind one protocol (`int8.base.Candidate`: make the file fitted on some samples, its basis), named in
one declared table (`int8.registry`); `int8.scoring` scores any of them on one path, never asking which one
it is. The quantizer itself is TFLite's (`mlir_quantize`), fed the edited ranges, so every op's constraints
(shared scales of concat and pooling, fixed softmax scales) stay TFLite's business.

`auto` decides on evidence (converters/int8/evidence.py): each candidate's per-sample losses against the
float model on held-out calibration-source samples (the KL divergence of its softmax from the float
model's for class scores; the loss the model's task declares otherwise), compared in the registry's order
against the winner so far, min/max first; a candidate replaces the winner only where a paired test finds its
losses a tenth lower at the family's level, more samples drawn in rounds where a comparison is close. Weight
rounding (`_escalate`, only where it can pay: `scoring.cannot_pay`) and the winner with its logits' op and
SOFTMAX in float (`_float_head`) follow, each compared with the winner the same way. Last, the file
is checked against min/max's on the verification samples (`_recheck`): where it is further from the float
model, at 95 %, min/max's file is written instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.int8 import registry
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.evidence import MARGIN, MoreHeldOut, in_time
from edgekit.converters.int8.ranges import quantize
from edgekit.converters.int8.scoring import (
    MIN_HELD_OUT,
    WORKERS,
    Scoring,
    cannot_pay,
    describe,
    folds,
    nothing_to_win,
    score_all,
)
from edgekit.errors import ConversionError
from edgekit.intervals import agrees_less, lower_losses
from edgekit.metrics import per_sample_losses

if TYPE_CHECKING:
    from edgekit.converters.int8.context import Context

# how far `auto` may go (`calibration.effort`): fast: the cheap candidates only; standard: weight rounding
# where the cheap candidates' winner still leaves a loss it could pay to win back; thorough: every candidate
# and weight rounding scored whatever the winner measured
EFFORTS = ("fast", "standard", "thorough")
RECHECK_ALPHA = 0.05  # the verification check: min/max's file written where the chosen one agrees less at 95 %


@dataclass
class RangeChoice:
    """The int8 file, what was measured, and the calibrated model the file was quantized from (its ranges
    written in, its biases corrected; None for ai-edge-quantizer's file): the accuracy-budget autopilot makes
    its mixes from it, so that they keep what auto chose."""

    tflite: bytes
    entry: dict[str, Any]
    basis: bytes | None = None
    # where the basis's constants were changed for int8 (GPTQ's kernels, bias's biases): the model whose
    # constants an op the autopilot keeps in float takes instead, so that float means float
    float_kernels: bytes | None = None


def choose(calibrated: bytes, io: str, method: str, samples: list, evaluate: Callable[[bytes, list], np.ndarray],
           *, extra: Sequence = (), more: MoreHeldOut | None = None, variants: dict[str, Callable[[], bytes]] | None = None,
           seed: int = 0, say=lambda _m: None, effort: str = "standard", loss: str = "auto", threshold: float = 0.5,
           verification: Sequence = (), output: str | None = None, allowed: float | None = None) -> RangeChoice:
    """The int8 model by `method` (an int8 candidate's name, converters/int8/registry.py); 'auto' decides on
    held-out samples (`scoring.folds`) and keeps min/max unless another is shown better.
    `evaluate(tflite, samples)` gives a model's first output on samples, stacked. `extra`: more samples of
    the same source, which the converter did not calibrate on: the candidates are scored on them (fewer
    than `2 * MIN_HELD_OUT`: on halves of all samples, two-fold); `more`: where still more can be read, in
    rounds, for comparisons the first ones do not resolve.
    `variants`: name -> a function making the calibrated model of the same function with other weights
    (converters/int8/equalization.py: weights rescaled in the calibrated model, made only where scored or chosen),
    for the candidate of that name (min/max ranges on it). min/max chosen is always the converter's own model.
    `effort` (auto only, `EFFORTS`): whether weight rounding may follow the cheap candidates (`_escalate`).
    `loss`: what a sample's loss against the float model is (`metrics.LOSSES`; auto: KL for class scores,
    mse otherwise), `threshold` the mask threshold of `iou`. `verification`: the samples the file is checked
    on against min/max's (`_recheck`). `output`: the signature name of the output scored (the source model's
    first; `evaluate` gives that one), where the model has several. `allowed`: the seconds auto may take,
    the verification after it counted in: past them no candidate is started, no round of samples drawn and
    weight rounding not started (None: no limit)."""
    from edgekit.converters.int8.context import Context

    started = time.perf_counter()
    samples = list(samples) + list(extra)
    n = len(samples)
    entry: dict[str, Any] = {"requested": method, "chosen": method, "scored_on": 0, "candidates": {},
                             "extra_samples": len(extra)}
    if method == "minmax" or (method == "auto" and n < 2 * MIN_HELD_OUT):
        entry["chosen"] = "minmax"
        if method == "auto":
            entry["note"] = f"{n} calibration samples are too few to rank methods (at least {2 * MIN_HELD_OUT})"
        return RangeChoice(quantize(calibrated, io), {**entry, "seconds": round(time.perf_counter() - started, 2)},
                           calibrated)
    groups, fit = folds(n - len(extra), len(extra), seed)
    ctx = Context(calibrated, io, dict(variants or {}), samples, groups, seed, converters_fit=fit, output=output)
    candidates = _candidates(method, entry, ctx)
    entry["scoring"] = "two_fold" if fit == ("a", "b") else "held_out"
    scoring = None
    if n >= 2 * MIN_HELD_OUT:
        scoring = score_all(entry, candidates, ctx, samples, groups, evaluate, say, two_fold=fit == ("a", "b"),
                            effort=effort, more=more or MoreHeldOut(), loss=loss, threshold=threshold,
                            deadline=None if allowed is None or method != "auto" else started + allowed,
                            after=_after(len(verification), n - len(extra)))
    if method == "auto":
        entry["chosen"] = "minmax"
        if scoring is not None:
            _walk(entry, candidates, scoring, say)
            _escalate(entry, candidates, ctx, scoring, say, effort)
            head = _float_head(entry, candidates, ctx, scoring, say)
            if head is not None:
                candidates[entry["chosen"]] = head
            entry["ranked_on"] = sum(scoring.evidence.rounds.sizes[:scoring.evidence.drawn])
    fitted = Fit(fit, [x for x, g in zip(samples, groups) if g in fit])
    chosen, final, basis = _final(entry, candidates, ctx, fitted)
    entry.update(chosen.findings())
    float_kernels = chosen.float_kernels(ctx, fitted)
    if verification and entry["chosen"] != "minmax" and method == "auto":
        plain = _recheck(entry, ctx, final, list(verification), evaluate, say, threshold)
        if plain is not None:
            final, basis, float_kernels = plain, calibrated, None
            entry.pop("weight_rounding", None)  # the file holds no rounded kernel, nor a float head
            for record in (entry.get("escalation"), entry.get("float_head")):
                if record and record.get("kept"):
                    record.update(kept=False, why="the verification check wrote min/max's file")
    entry["seconds"] = round(time.perf_counter() - started, 2)
    return RangeChoice(final, entry, basis, float_kernels)


def _after(verification: int, calibration: int) -> int:
    """Runs of a model on one sample that follow auto's choice: the verification check (the float model, the
    file and min/max's, two at once) and the verification (the file; on the calibration samples where none
    are held out)."""
    return int(1.5 * verification) + (verification or calibration)


def _walk(entry: dict[str, Any], candidates: dict[str, Candidate], scoring: Scoring, say) -> None:
    """The cheap candidates compared in the registry's order, each against the winner so far (min/max
    first), on the evidence; each comparison recorded in `entry["decisions"]` and said."""
    evidence = scoring.evidence
    order = [m for m in candidates if m in entry["candidates"] and evidence.has(m)]
    winner = "minmax"
    decisions = entry.setdefault("decisions", [])
    for i, m in enumerate(order):
        if m == "minmax":
            continue
        decided = evidence.compare(winner, m, live=order[i + 1:])
        decisions.append(decided.to_dict())
        say(decided.line(evidence.loss))
        if decided.kept:
            winner = m
    entry["chosen"] = winner


def _final(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context,
           fitted: Fit) -> tuple[Candidate, bytes, bytes | None]:
    """The chosen candidate, its file and its basis, fitted on `fitted`. Weight rounding kept by `_escalate`
    that fails there (refitted on every sample, two-fold) gives way to the winner it beat, and a float head
    to the file without it; each says why."""
    from edgekit.converters.int8.float_ops import FloatHead

    chosen = candidates[entry["chosen"]]
    try:
        return chosen, chosen.make(ctx, fitted, view=False, final=True), chosen.basis(ctx, fitted)
    except ConversionError as exc:
        if isinstance(chosen, FloatHead):
            entry["float_head"].update(kept=False, why=f"refitting it failed: {exc}")
            candidates[entry["chosen"]] = chosen.on
            return _final(entry, candidates, ctx, fitted)
        e = entry.get("escalation") or {}
        if not e.get("kept") or chosen.name != "gptq":
            raise
        entry["chosen"], e["kept"], e["why"] = e["against"], False, f"refitting it failed: {exc}"
        chosen = candidates[e["against"]]
        return chosen, chosen.make(ctx, fitted, view=False, final=True), chosen.basis(ctx, fitted)


def _candidates(method: str, entry: dict[str, Any], ctx: Context) -> dict[str, Candidate]:
    """The candidates to score, by name: the one asked for, or for auto every registered one offered on this
    conversion that can make a file with its inputs and outputs (why not is recorded in `entry`)."""
    if method != "auto":
        return {method: registry.load(method)}  # the recipe refused one that cannot run
    found = {}
    for name in registry.names():
        candidate = registry.load(name)
        if not candidate.offered(ctx):
            continue
        reason = candidate.unusable(ctx.io)
        if reason:
            entry.setdefault("skipped", {})[name] = reason
            continue
        found[name] = candidate
    return found


def _escalate(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context, scoring: Scoring, say,
              effort: str) -> None:
    """Weight rounding (converters/int8/gptq.py) on the winner's ranges (where the winner sets none, as bias
    correction and ai-edge-quantizer do, on the range method of the lowest mean loss: bias correction's
    biases answer min/max's rounding), scored as the others were and kept where the evidence shows it
    better than the winner; whether it ran, why, what it cost: `entry["escalation"]`."""
    from edgekit.converters.int8.gptq import Gptq
    from edgekit.converters.int8.range_setting import RangeSetting

    winner = entry["chosen"]
    won = entry["candidates"].get(winner)
    why = ("effort fast" if effort == "fast" else "nothing was scored" if won is None
           else None if effort == "thorough" else cannot_pay(scoring.evidence, winner, won))
    if why:
        entry["escalation"] = {"effort": effort, "ran": False, "why": why}
        return
    base = candidates[winner]
    if not isinstance(base, RangeSetting):
        setting = [m for m in entry["candidates"] if isinstance(candidates.get(m), RangeSetting)]  # min/max first
        base = candidates[min(setting, key=lambda m: entry["candidates"][m]["loss"])]
    if effort != "thorough":
        why, weights = _rounding_cannot_pay(ctx, base, winner, scoring, entry.get("scored_output") == "logits")
        why = why or _rounding_too_long(ctx, entry, scoring)
        if why:
            entry["escalation"] = {"effort": effort, "ran": False, "why": why, "weights_loss": weights}
            say(f"weight rounding: not scored ({why})")
            return
    rounding = Gptq(on=base)
    try:
        result = scoring.scorer(rounding)
    except ConversionError as exc:
        entry["escalation"] = {"effort": effort, "ran": False, "why": str(exc)}
        say(f"weight rounding: not scored ({exc})")
        return
    decided = scoring.evidence.compare(winner, rounding.name)
    entry["candidates"][rounding.name] = {**result, "on": base.name}
    entry["escalation"] = {"effort": effort, "ran": True, "on": base.name, "against": winner, "kept": decided.kept,
                           "seconds": result["seconds"]}
    entry.setdefault("decisions", []).append(decided.to_dict())
    say(f"weight rounding (gptq on {base.name}'s ranges): {describe(result, scoring.evidence.loss)}, "
        f"{result['seconds']:.1f} s; {decided.line(scoring.evidence.loss)}")
    if decided.kept:
        entry["chosen"] = rounding.name
        candidates[rounding.name] = rounding


def _rounding_cannot_pay(ctx: Context, base: Candidate, winner: str, scoring: Scoring,
                         view: bool) -> tuple[str | None, float]:
    """Why weight rounding cannot pay, or None; and the mean loss of the float model with every kernel rounded
    to its nearest int8 step (`weight_rounding.nearest_kernels`): all that rounding the weights costs, and so
    all that GPTQ can win back. Under a tenth of the winner's loss (the margin a candidate must beat), the
    loss is the activations' and GPTQ is not started (PaddleOCR's text detector: 79 s of GPTQ, not kept)."""
    from edgekit.converters.int8 import weight_rounding
    from edgekit.runtime.schema import with_tensor_data

    variant = getattr(base, "variant", "")
    kernels = weight_rounding.nearest_kernels(ctx.model(variant, False))
    if not kernels:
        return "no Conv / DepthwiseConv / Dense kernel to round", 0.0
    evidence = scoring.evidence
    weights = float(np.mean(evidence.measure_model(with_tensor_data(ctx.model(variant, view), kernels))))
    won = float(np.mean(evidence.first_losses(winner)))
    if weights >= MARGIN * won:
        return None, round(weights, 6)
    return (f"rounding every kernel to its nearest int8 step costs a mean {evidence.loss} of {weights:.3g} against "
            f"{winner}'s {won:.3g}: under a tenth of it, the loss is the activations'"), round(weights, 6)


def _rounding_too_long(ctx: Context, entry: dict[str, Any], scoring: Scoring) -> str | None:
    """Why weight rounding is not started for lack of time (`Evidence.deadline`: the time auto allows), or
    None. Its cost: a pass of the float model over the calibration samples collecting each layer's inputs (as
    long as collecting the activations took, where they were) and a candidate's scoring (the longest so far);
    PaddleOCR's text detector at 320x320: 74 s of a conversion the plain converter makes in 85 s."""
    scored = [c["seconds"] for c in entry["candidates"].values()]
    cost = ctx.seconds.get("activations", 2 * max(scored, default=0.0)) + max(scored, default=0.0)
    if in_time(scoring.evidence.deadline, cost):
        return None
    return f"about {cost:.0f} s more would take auto past the time it allows (effort thorough starts it)"


def _float_head(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context, scoring: Scoring,
                say) -> Candidate | None:
    """The winner with the op writing the logits and the SOFTMAX kept in float (converters/int8/float_ops.py),
    scored as the others were and kept where the evidence shows it better than the winner; what was found:
    `entry["float_head"]`. Returns the candidate to make the file with where it is kept."""
    from edgekit.converters.int8.float_ops import HEAD_SHARE, FloatHead, head_ops

    if entry.get("scored_output") != "logits":
        return None  # no class scores made by a SOFTMAX of logits
    winner = entry["chosen"]
    won = entry["candidates"][winner]
    ops, share = head_ops(ctx.calibrated, ctx.output)
    why = (None if ops else "no Dense or 1x1 Conv2D writes the logits the SOFTMAX reads")
    if why is None and share > HEAD_SHARE:
        why = f"the head holds {100 * share:.2f} % of the weights (float at most {100 * HEAD_SHARE:g} %)"
    head = FloatHead(candidates[winner], ops)
    # one quantize and one scoring: it runs wherever the winner's loss is over the floor
    why = why or head.unusable(ctx.io) or nothing_to_win(won, scoring.evidence.loss, winner)
    record: dict[str, Any] = {"ops": list(ops), "weights_share": round(share, 5), "against": winner}
    if why:
        entry["float_head"] = {**record, "ran": False, "why": why}
        return None
    try:
        result = scoring.scorer(head)
    except ConversionError as exc:
        entry["float_head"] = {**record, "ran": False, "why": str(exc)}
        say(f"float head: not scored ({exc})")
        return None
    decided = scoring.evidence.compare(winner, head.name)
    entry["float_head"] = {**record, "ran": True, "kept": decided.kept, "score": result}
    entry.setdefault("decisions", []).append(decided.to_dict())
    say(f"float head ({len(ops)} ops, {100 * share:.2f} % of the weights): {describe(result, scoring.evidence.loss)}, "
        f"{result['seconds']:.1f} s; {decided.line(scoring.evidence.loss)}")
    return head if decided.kept else None


def _recheck(entry: dict[str, Any], ctx: Context, final: bytes, verification: list, evaluate, say,
             threshold: float = 0.5) -> bytes | None:
    """The chosen file against min/max's (the converter's own) on the verification samples, which neither
    saw: where it agrees with the float model on fewer of them at 95 % (class scores: the exact McNemar test
    of the top-1; other outputs: their per-sample losses, as the candidates were compared, higher by the
    Wilcoxon test), min/max's file, said; else None. What was found: `entry["verification_check"]`."""
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="edgekit-recheck") as pool:
        plain = quantize(ctx.calibrated, ctx.io)  # while the float model runs (LiteRT releases Python's lock)
        running = [pool.submit(evaluate, model, verification) for model in (ctx.calibrated, final, plain)]
        reference, ours, theirs = (f.result() for f in running)
    record: dict[str, Any] = {"n": len(verification), "against": "minmax", "alpha": RECHECK_ALPHA}
    if entry.get("loss", "kl") == "kl":  # class scores: each sample's top-1
        top = np.asarray(reference).reshape(len(reference), -1).argmax(axis=1)
        agree = [np.asarray(o).reshape(len(o), -1).argmax(axis=1) == top for o in (ours, theirs)]
        p = agrees_less(agree[0], agree[1])
        record.update(measure="agreement", chosen=round(float(np.mean(agree[0])), 6),
                      minmax=round(float(np.mean(agree[1])), 6))
    else:  # the task's loss, as the candidates were compared on
        kind = str(entry["loss"])
        losses = [per_sample_losses(reference, o, kind, threshold) for o in (ours, theirs)]
        p = lower_losses(losses[0], losses[1], RECHECK_ALPHA).p if np.mean(losses[1]) < np.mean(losses[0]) else 1.0
        record.update(measure=f"{kind} loss", chosen=float(f"{np.mean(losses[0]):.6g}"),
                      minmax=float(f"{np.mean(losses[1]):.6g}"))
    worse = p is not None and p <= RECHECK_ALPHA
    record.update(p=None if p is None else float(f"{p:.4g}"), kept=not worse,
                  seconds=round(time.perf_counter() - began, 2))
    entry["verification_check"] = record
    chosen = entry["chosen"]
    what = (f"{record['measure']} {record['chosen']:.4g} against min/max's {record['minmax']:.4g} on "
            f"{len(verification)} verification samples" + ("" if p is None else f", p={p:.2g}"))
    if not worse:
        say(f"verification check: {chosen}'s file {what}: kept")
        return None
    entry["chosen"], entry["replaced"] = "minmax", chosen
    say(f"verification check: {chosen}'s file {what}: worse at 95 %, min/max's file written instead")
    return plain
