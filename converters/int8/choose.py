"""Activation ranges beyond min/max for post-training int8, chosen by measurement.

TFLite's converter calibrates by running the float model and recording each activation's min and max;
one outlier then stretches a tensor's scale for every other value. Here the converter only calibrates
(`_experimental_calibrate_only`, as TFLite's own QuantizationDebugger does), the float model's activations
are sampled on the calibration data, and each range method proposes ranges from them (`minmax`, `percentile`, `mse`).

Those and the other candidates (`bias`, `aeq`, `equalize`) are peers in converters/int8/, one module each
behind one protocol (`int8.base.Candidate`: make the file fitted on some samples, its basis), named in
one declared table (`int8.registry`); `int8.ranges` collects the activations they fit ranges on, and this
module scores any candidate on one path, never asking which one it is.

The quantizer itself is TFLite's (`mlir_quantize`), fed the edited ranges, so every op's constraints
(shared scales of concat and pooling, fixed softmax scales) stay TFLite's business. `auto` ranks the
methods on held-out calibration-source data (never on evaluation data; the range methods are `minmax`,
`percentile`, `mse`, and `ema` and `extremes` of each sample's min and max): each candidate is fitted on the
calibration samples, as the converter's own ranges are, and its int8 model compared with the float model
on more samples of the same source that neither the converter nor verification saw
(`calibration.ranking_samples`), so the file scored is the file written and each candidate is made once
(scoring on two folds and refitting the winner cost twice that, for the same ranking). Where the source
has fewer than `2 * MIN_HELD_OUT` more samples, the calibration samples are split in halves instead,
scored both ways and the winner refitted on all. For class scores made by a SOFTMAX the score is taken on
its input, the logits: probabilities of training-like samples are one-hot to within the int8 output's
fixed 1/256 step, so every method measured the same there (a MobileNetV3Small: 48.2 dB and 100 % for all
three), while the logits tell them apart, and the score is the mean KL divergence of each candidate's
softmax from the float model's (logit SNR punishes a clipped logit that was far ahead anyway). min/max is
kept unless another method's KL is `KL_MARGIN` lower (within it, more top-1 agreement decides; outputs
that are not class scores: SNR by `SNR_MARGIN_DB`), and always where its KL is under `KL_FLOOR` (scores
without logits: where it agrees with the float model on every held-out sample), where nothing past it is
scored, nor past a `conclusive` candidate (min/max on the equalised variant) that leaves as little; min/max is
always the converter's own model. After them, GPTQ weight rounding may be scored on the winner's ranges
(`_escalate`, as far as `calibration.effort` allows) and kept by the same rule against the winner; last,
the winner with its logits' op and SOFTMAX in float (`_float_head`, converters/int8/float_ops.py), kept by
that rule too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.int8 import registry
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.ranges import logits_view, quantize
from edgekit.errors import ConversionError
from edgekit.metrics import compare_outputs, looks_like_scores
from edgekit.progress import Step

if TYPE_CHECKING:
    from edgekit.converters.int8.context import Context

MIN_HELD_OUT = 20  # per half: fewer samples cannot rank methods, auto keeps min/max

def score(reference: np.ndarray, candidate: np.ndarray, logits: bool = False) -> dict[str, Any]:
    """Agreement (for class scores), SNR and largest error against `reference`; for `logits`, also the mean
    KL divergence of the candidate's softmax from the reference's."""
    cmp = compare_outputs(reference, candidate)
    scores = logits or looks_like_scores(reference)
    result = {"agreement": cmp["top1_agreement"] if scores else None, "snr_db": cmp["snr_db"],
              "max_abs_error": cmp["max_abs_error"]}
    if logits:
        result["kl"] = float(f"{kl_divergence(reference, candidate):.6g}")
    return result


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean KL(softmax(reference) || softmax(candidate)) over samples, from logits (last axis = classes)."""
    def log_softmax(z):
        z = np.asarray(z, np.float64).reshape(len(z), -1)
        z = z - z.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(reference), log_softmax(candidate)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=1)))


UNBEATABLE = "min/max agreed with the float model on every held-out sample: nothing left to win"
# class scores: min/max whose softmax is this close to the float model's (mean KL, nats) stays. Below it the
# candidates' differences were noise: two MobileNetV2s at 0.0012 and 0.0014, where percentile ranges measured
# a KL 30-70 % lower (on each half of the samples scored, too) and their files agreed with the float model on
# two test images fewer; where another candidate won on test images, min/max measured 0.0078 (a ViT with
# outlier features) to 0.37
KL_FLOOR = 0.003
CLOSE = f"min/max's softmax is within a KL divergence of {KL_FLOOR} of the float model's: what is left is noise"
SNR_MARGIN_DB = 0.5  # outputs that are not class scores: another method must beat min/max's SNR by this much
KL_MARGIN = 0.1  # class scores: another method's KL divergence must be this share under min/max's


def _better(candidate: dict[str, Any], plain: dict[str, Any]) -> bool:
    """Does a method measure better than min/max? For class scores with logits, a KL divergence from the
    float model's softmax lower by `KL_MARGIN`, and lower on each fold (within the margin, more top-1
    agreement); for other class scores more agreement; for other outputs SNR by `SNR_MARGIN_DB`. Where
    min/max agrees with the float model on every held-out sample, or its KL is under `KL_FLOOR`, min/max
    stays (the converter's own file)."""
    if plain["agreement"] is not None and _nothing_to_win(plain):
        return False
    return _improves(candidate, plain)


def _improves(candidate: dict[str, Any], plain: dict[str, Any]) -> bool:
    """`_better`'s measure without its floor: a KL lower by `KL_MARGIN` (and in each fold; within the margin,
    more agreement), more agreement without a KL, SNR by `SNR_MARGIN_DB` for outputs that are not scores."""
    if plain["agreement"] is None:
        return _snr(candidate) > _snr(plain) + SNR_MARGIN_DB
    if "kl" not in plain or "kl" not in candidate:
        return candidate["agreement"] > plain["agreement"]
    if candidate["kl"] < (1 - KL_MARGIN) * plain["kl"] and _lower_kl_in_each_fold(candidate, plain):
        return True
    return candidate["kl"] <= (1 + KL_MARGIN) * plain["kl"] and candidate["agreement"] > plain["agreement"]


def _nothing_to_win(plain: dict[str, Any], name: str = "minmax") -> str | None:
    """Why min/max's score (or the candidate `name`'s) leaves another candidate nothing to win, or None: its
    softmax is within `KL_FLOOR` of the float model's (said as agreeing on every held-out sample where it
    did), or, for scores without logits, it agreed with the float model on every held-out sample."""
    why = None
    agreed = plain["agreement"] is not None and plain["agreement"] >= 1.0
    if plain.get("kl") is not None:  # agreeing on every held-out sample is not enough where the softmax says
        # more: an EfficientNetB0 whose min/max file agreed on all 200 measured a KL of 0.0056, extremes'
        # 0.0016, and the test images told them apart (97.50 % against 98.89 % agreement)
        why = (UNBEATABLE if agreed else CLOSE) if plain["kl"] < KL_FLOOR else None
    elif agreed:
        why = UNBEATABLE
    return why if why is None or name == "minmax" else why.replace("min/max", name, 1)


def _lower_kl_in_each_fold(candidate: dict[str, Any], plain: dict[str, Any]) -> bool:
    """A lower mean KL must hold on each held-out half too: on a MobileNetV2 whose logits every method kept
    within 0.0015, percentile's mean 0.00087 against min/max's 0.00123 was one half's 0.00025 against
    0.00104 and the other's 0.00149 against 0.00142, and its file then agreed with float on two test images
    fewer than min/max's (99.17 % against 99.72 %)."""
    pairs = list(zip(candidate.get("folds") or [], plain.get("folds") or []))
    return all(c.get("kl") is not None and p.get("kl") is not None and c["kl"] < p["kl"] for c, p in pairs)


def _snr(s: dict[str, Any]) -> float:
    return -np.inf if s["snr_db"] is None else float(s["snr_db"])


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


def _cross_scores(make, samples, folds, reference, evaluate, logits: bool = False,
                  two_fold: bool = True) -> dict[str, Any]:
    """A model made from the "a" samples (`make(fit_group, fit_samples)`) scored against the float model on
    the "b" ones; where the groups are random halves of one set (no sample past the calibration ones,
    `_folds`: `two_fold`), also the other way round. The score over all scored samples, and each fold's (one
    way: each half of the held-out samples, alternate ones)."""
    outputs, per_fold = [], []
    for fit, held in (("a", "b"), ("b", "a"))[: 2 if two_fold else 1]:
        idx = [i for i, g in enumerate(folds) if g == held]
        fit_samples = [s for s, g in zip(samples, folds) if g == fit]
        out = evaluate(make(fit, fit_samples), [samples[i] for i in idx])
        outputs.append((idx, out))
        halves = [(idx, out)] if two_fold else [(idx[k::2], out[k::2]) for k in (0, 1)]
        per_fold += [score(reference[i], o, logits) for i, o in halves]
    order = np.concatenate([idx for idx, _ in outputs])
    result = score(reference[order], np.concatenate([out for _, out in outputs]), logits)
    result["folds"] = per_fold
    return result


def _folds(n_calibration: int, n_extra: int, seed: int) -> tuple[list[str], tuple[str, ...]]:
    """Each sample's group, and the groups the final file is fitted on. With `2 * MIN_HELD_OUT` samples or
    more past the calibration ones, candidates are fitted on the calibration samples ("a", what the converter
    calibrated on) and scored on those past them ("b"): the file scored is the file written. Else the
    samples are split in random halves, scored both ways, and the winner refitted on all ("a" and "b")."""
    if n_extra >= 2 * MIN_HELD_OUT:
        return ["a"] * n_calibration + ["b"] * n_extra, ("a",)
    n = n_calibration + n_extra
    return list(np.resize(np.array(["a", "b"], object), n)[np.random.default_rng(seed).permutation(n)]), ("a", "b")


def choose(calibrated: bytes, io: str, method: str, samples: list, evaluate: Callable[[bytes, list], np.ndarray],
           *, extra: Sequence = (), variants: dict[str, Callable[[], bytes]] | None = None, seed: int = 0,
           say=lambda _m: None, effort: str = "standard") -> RangeChoice:
    """The int8 model by `method` (an int8 candidate's name, converters/int8/registry.py); 'auto' ranks the
    candidates on held-out samples (`_folds`) and keeps min/max unless another measures better.
    `evaluate(tflite, samples)` gives a model's first output on samples, stacked. `extra`: more samples of
    the same source, which the converter did not calibrate on: the candidates are scored on them (fewer
    than `2 * MIN_HELD_OUT`: on halves of all samples, two-fold).
    `variants`: name -> a function making the calibrated model of the same function with other weights
    (converters/int8/equalization.py: weights rescaled in the calibrated model, made only where scored or chosen),
    for the candidate of that name (min/max ranges on it). min/max chosen is always the converter's own model.
    `effort` (auto only, `EFFORTS`): whether weight rounding may follow the cheap candidates (`_escalate`)."""
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
    folds, fit = _folds(n - len(extra), len(extra), seed)
    ctx = Context(calibrated, io, dict(variants or {}), samples, folds, seed, converters_fit=fit)
    candidates = _candidates(method, entry, ctx)
    entry["scoring"] = "two_fold" if fit == ("a", "b") else "held_out"
    scorer = None
    if n >= 2 * MIN_HELD_OUT:
        scorer = _score_all(entry, candidates, ctx, samples, folds, evaluate, say, two_fold=fit == ("a", "b"),
                            every=effort == "thorough")
    if method == "auto":
        plain = entry["candidates"]["minmax"]
        better = [m for m in entry["candidates"] if m != "minmax" and _better(entry["candidates"][m], plain)]
        entry["chosen"] = max(better, key=lambda m: _key(entry["candidates"][m])) if better else "minmax"
        if scorer is not None:
            _escalate(entry, candidates, ctx, scorer, say, effort)
            head = _float_head(entry, candidates, ctx, scorer, say)
            if head is not None:
                candidates[entry["chosen"]] = head
    fitted = Fit(fit, [x for x, g in zip(samples, folds) if g in fit])
    chosen, final, basis = _final(entry, candidates, ctx, fitted)
    entry.update(chosen.findings())
    float_kernels = chosen.float_kernels(ctx, fitted)
    if entry["chosen"] in entry["candidates"]:
        entry["agreement_spread_points"] = _spread(entry["candidates"][entry["chosen"]]["folds"])
    entry["seconds"] = round(time.perf_counter() - started, 2)
    return RangeChoice(final, entry, basis, float_kernels)


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


def _score_all(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context, samples: list,
               folds: list, evaluate, say, two_fold: bool = True,
               every: bool = False) -> Callable[[Candidate], dict[str, Any]]:
    """Each candidate's score against the float model on held-out samples (`_cross_scores`) into
    `entry["candidates"]` (each made by its `make`, with `view` its logits view); under auto, a candidate
    that cannot be made (ai-edge-quantizer failing, a bias correction with nothing to correct, an
    equalisation that changed the float function) is skipped with its reason, and nothing past min/max is
    scored where it leaves nothing to win (`_nothing_to_win`), nor past a `conclusive` one that leaves
    nothing (unless `every`). min/max is scored first (the range methods' activations collected meanwhile),
    the others `WORKERS` at a time. Gives the scorer, for `_escalate`."""
    auto = entry["requested"] == "auto"
    scored = _scored_model(ctx.calibrated, samples, evaluate, entry)
    logits = scored is not ctx.calibrated
    if logits:
        ctx.use_view(scored)
    held = [i for i, g in enumerate(folds) if two_fold or g == "b"]  # the float model on the samples scored
    found = evaluate(scored, [samples[i] for i in held])
    reference = np.zeros((len(samples), *found.shape[1:]), found.dtype)
    reference[held] = found

    def scorer(candidate: Candidate) -> dict[str, Any]:
        began = time.perf_counter()
        result = _cross_scores(lambda g, fit: candidate.make(ctx, Fit((g,), fit), view=logits), samples, folds,
                               reference, evaluate, logits, two_fold)
        return {**result, "seconds": round(time.perf_counter() - began, 2)}

    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="edgekit-ranges") as pool:
        if auto and any(c.fits_ranges for c in list(candidates.values())[1:]):  # their activations, collected
            pool.submit(ctx.activations)  # while min/max is scored (spent for nothing where it wins outright)
        _score_batches(entry, candidates, lambda m: scorer(candidates[m]), pool, say,
                       f" ({_how(two_fold, len(held))})", every)
    entry["scored_on"] = len(held)
    return scorer


# how far `auto` may go (`calibration.effort`): fast: the cheap candidates only; standard: weight rounding
# where the cheap candidates' winner still leaves a loss on the held-out samples; thorough: weight rounding
# scored whatever the winner measured
EFFORTS = ("fast", "standard", "thorough")


def _escalate(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context,
              scorer: Callable[[Candidate], dict[str, Any]], say, effort: str) -> None:
    """Weight rounding (converters/int8/gptq.py) on the winner's ranges (where the winner sets none, as bias
    correction and ai-edge-quantizer do, on the best-scored range method's: bias correction's biases answer
    min/max's rounding), scored as the others were and kept where it is `_better` than the winner, as a
    candidate must be than min/max; whether it ran, why, what it cost: `entry["escalation"]`."""
    from edgekit.converters.int8.gptq import Gptq
    from edgekit.converters.int8.range_setting import RangeSetting

    winner = entry["chosen"]
    won = entry["candidates"].get(winner)
    why = "effort fast" if effort == "fast" else None if won is None else _nothing_to_win(won, winner)
    if won is None or (why and effort != "thorough"):
        entry["escalation"] = {"effort": effort, "ran": False, "why": why or "nothing was scored"}
        return
    base = candidates[winner]
    if not isinstance(base, RangeSetting):
        setting = [m for m in entry["candidates"] if isinstance(candidates[m], RangeSetting)]  # min/max first
        base = candidates[max(setting, key=lambda m: _key(entry["candidates"][m]))]
    rounding = Gptq(on=base)
    try:
        result = scorer(rounding)
    except ConversionError as exc:
        entry["escalation"] = {"effort": effort, "ran": False, "why": str(exc)}
        say(f"weight rounding: not scored ({exc})")
        return
    kept = _better(result, won)  # thorough scores it where the winner left nothing: kept by the same floor
    entry["candidates"][rounding.name] = {**result, "on": base.name}
    entry["escalation"] = {"effort": effort, "ran": True, "on": base.name, "against": winner, "kept": kept,
                           "seconds": result["seconds"]}
    say(f"weight rounding (gptq on {base.name}'s ranges): {_describe(result)} against {winner}'s "
        f"{_describe(won)}, {result['seconds']:.1f} s: {'kept' if kept else 'not kept'}")
    if kept:
        entry["chosen"] = rounding.name
        candidates[rounding.name] = rounding


def _float_head(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context,
                scorer: Callable[[Candidate], dict[str, Any]], say) -> Candidate | None:
    """The winner with the op writing the logits and the SOFTMAX kept in float (converters/int8/float_ops.py),
    scored as the others were and kept where it is `_better` than the winner; what was found:
    `entry["float_head"]`. Returns the candidate to make the file with where it is kept."""
    from edgekit.converters.int8.float_ops import HEAD_SHARE, FloatHead, head_ops

    if entry.get("scored_output") != "logits":
        return None  # no class scores made by a SOFTMAX of logits
    winner = entry["chosen"]
    won = entry["candidates"][winner]
    ops, share = head_ops(ctx.calibrated)
    why = (None if ops else "no Dense or 1x1 Conv2D writes the logits the SOFTMAX reads")
    if why is None and share > HEAD_SHARE:
        why = f"the head holds {100 * share:.2f} % of the weights (float at most {100 * HEAD_SHARE:g} %)"
    head = FloatHead(candidates[winner], ops)
    why = why or head.unusable(ctx.io) or _nothing_to_win(won, winner)
    record: dict[str, Any] = {"ops": list(ops), "weights_share": round(share, 5), "against": winner}
    if why:
        entry["float_head"] = {**record, "ran": False, "why": why}
        return None
    try:
        result = scorer(head)
    except ConversionError as exc:
        entry["float_head"] = {**record, "ran": False, "why": str(exc)}
        say(f"float head: not scored ({exc})")
        return None
    kept = _better(result, won)
    entry["float_head"] = {**record, "ran": True, "kept": kept, "score": result}
    say(f"float head ({len(ops)} ops, {100 * share:.2f} % of the weights): {_describe(result)} against "
        f"{winner}'s {_describe(won)}, {result['seconds']:.1f} s: {'kept' if kept else 'not kept'}")
    return head if kept else None


def _score_batches(entry: dict[str, Any], candidates: dict[str, Candidate], score_one, pool, say, how: str,
                   every: bool = False) -> None:
    """min/max first, then the rest, into `entry` (`_score_all`); under auto (not `every`), the rest end
    where a `conclusive` candidate that measures better than min/max leaves nothing to win: those not
    started by then are skipped, said after the scored ones."""
    auto = entry["requested"] == "auto"
    methods = tuple(candidates)
    said = _counted(say, len(methods))

    def enough(m: str, result) -> bool:
        plain = entry["candidates"].get("minmax")
        return (auto and not every and candidates[m].conclusive and isinstance(result, dict)
                and plain is not None and bool(_nothing_to_win(result, m)) and _improves(result, plain))

    for batch in (methods[:1], methods[1:]):
        results = _scores(score_one, batch, pool, lambda m: candidates[m].start_order, enough)
        unstarted = [m for m, r in results.items() if r is UNSTARTED]
        for m, result in results.items():
            if result is UNSTARTED:
                continue
            if isinstance(result, ConversionError):
                if not auto or m == "minmax":  # auto goes on without a candidate that cannot be made
                    raise result
                entry.setdefault("skipped", {})[m] = str(result)
                said(f"calibration method {m}: skipped ({result})")
                continue
            entry["candidates"][m] = result
            said(f"calibration method {m}: {_describe(result)}", how)
            why = _nothing_to_win(result) if auto and m == "minmax" else None
            if why:
                for rest in methods[methods.index(m) + 1:]:  # `_better` would keep min/max whatever they measure
                    entry.setdefault("skipped", {})[rest] = why
                return
        decided = next((m for m, r in results.items() if r is not UNSTARTED and enough(m, r)), "")
        for m in unstarted:  # said after the scored ones
            entry.setdefault("skipped", {})[m] = _nothing_to_win(results[decided], decided)
            said(f"calibration method {m}: not scored ({decided} left nothing to win)")


# candidates scored at the same time: LiteRT runs a model with Python's lock released (two threads running a ViT
# 200 times each: 0.21 s, against 0.40 s one after the other), so a second candidate's work runs meanwhile;
# TFLite's quantizer keeps the lock (two at once: as long as one after the other)
WORKERS = 2


def _counted(say, total: int) -> Callable[..., None]:
    """`say` with each line a counted `Step` of `total` where there are several methods to score (how they
    are scored is left to the summary then: the line stays short)."""
    done = [0]

    def said(line: str, how: str = "") -> None:
        done[0] += 1
        say(line + how if total < 2 else Step(f"{line} [{done[0]}/{total}]", stage="calibration",
                                               done=done[0], total=total))

    return said


# a method `_scores` did not start: an earlier one was `enough`
UNSTARTED = object()


def _scores(score_one: Callable[[str], dict[str, Any]], methods: tuple[str, ...], pool,
            start_order: Callable[[str], int],
            enough: Callable[[str, Any], bool] = lambda _m, _r: False) -> dict[str, Any]:
    """Each method's `score_one(m)`, or the ConversionError it raised, in `methods`' order; on `pool`'s
    `WORKERS` threads (each its own interpreters; the `Context` makes what they share once), started in
    `start_order` (`Candidate.start_order`), at most `WORKERS` submitted at once. Once a result is
    `enough(m, result)`, no more are submitted: `UNSTARTED` (those running finish and count; one queued
    behind the pool's other work is cancelled where no worker took it yet)."""
    def attempt(m: str):
        try:
            return score_one(m)
        except ConversionError as exc:
            return exc

    if len(methods) <= 1:
        return {m: attempt(m) for m in methods}
    waiting = sorted(methods, key=start_order)
    running: dict[Future, str] = {}
    results: dict[str, Any] = {}
    ended = False
    while running or (waiting and not ended):  # submitted one by one: a worker done takes no next one itself
        while waiting and not ended and len(running) < WORKERS:
            m = waiting.pop(0)
            running[pool.submit(attempt, m)] = m
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            m = running.pop(future)
            results[m] = future.result()
            ended = ended or enough(m, results[m])
        if ended:  # one queued behind the pool's other work (`ctx.activations`) that no worker took yet
            for future in [f for f in running if f.cancel()]:
                del running[future]
    return {m: results.get(m, UNSTARTED) for m in methods}


def _how(two_fold: bool, held: int) -> str:
    return f"two-fold on {held} samples" if two_fold else f"fitted on the calibration samples, scored on {held} more"


def _scored_model(calibrated: bytes, samples: list, evaluate, entry: dict[str, Any]) -> bytes:
    """The model the candidates are made from while they are scored: where the first output is class scores
    made by a SOFTMAX, the calibrated model with the logits as that output (`logits_view`: the same tensors
    and recorded ranges, so each candidate's logits are those of its real file); else the calibrated model."""
    entry["scored_output"] = "output"
    if isinstance(samples[0], dict):  # fed by signature: a view whose outputs differ loses the signature
        return calibrated
    if not looks_like_scores(evaluate(calibrated, samples[:1])):
        return calibrated
    view = logits_view(calibrated)
    if view is None:
        return calibrated
    entry["scored_output"] = "logits"
    return view


def _key(s: dict[str, Any]) -> tuple[float, float, float]:
    """Higher is better: lower KL divergence where measured, then agreement, then SNR."""
    return (-s.get("kl", 0.0), s["agreement"] if s["agreement"] is not None else 0.0, _snr(s))


def _spread(results: list[dict[str, Any]]) -> float | None:
    agreements = [r["agreement"] for r in results if r["agreement"] is not None]
    return round(100.0 * (max(agreements) - min(agreements)), 3) if agreements else None


def _describe(s: dict[str, Any]) -> str:
    parts = [] if s["agreement"] is None else [f"agreement {100 * s['agreement']:.2f}%"]
    return ", ".join(parts + [f"SNR {s['snr_db']:.1f} dB"])
