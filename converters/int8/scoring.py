"""Scoring int8 candidates for `choose.choose`: each made from the converter's calibrated model, fitted on
some samples, and measured against the float model on others, sample by sample (converters/int8/evidence.py).

Each candidate is fitted on the calibration samples, as the converter's own ranges are, and its int8 model
compared with the float model on more samples of the same source that neither the converter nor
verification saw (`calibration.ranking_samples`), so the file scored is the file written and each candidate
is made once. Where the source has fewer than `2 * MIN_HELD_OUT` more samples, the calibration samples are
split in halves instead, scored both ways and the winner refitted on all. For class scores made by a
SOFTMAX the candidates are measured on its input, the logits: probabilities of training-like samples are
one-hot to within the int8 output's fixed 1/256 step, so every method measured the same there (a
MobileNetV3Small: 48.2 dB and 100 % for all three), while the logits tell them apart.

Candidates are scored `WORKERS` at a time, min/max first. Scoring stops early where what is left cannot
pay: min/max's loss not resolved above its floor (`nothing_to_win`), a `conclusive` candidate that leaves as little and
measures better than min/max, and `costly` ones where min/max disagrees with the float model on too few
samples for winning them back to be shown (`cannot_pay`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.evidence import FAMILY_ALPHA, MARGIN, Evidence, MoreHeldOut, Rounds, in_time
from edgekit.converters.int8.ranges import logits_view
from edgekit.errors import ConversionError
from edgekit.intervals import lower_losses, mean_lower_bound
from edgekit.metrics import compare_outputs, looks_like_scores
from edgekit.progress import Step

if TYPE_CHECKING:
    from edgekit.converters.int8.context import Context

MIN_HELD_OUT = 20  # per half: fewer samples cannot rank methods, auto keeps min/max

# a candidate's mean loss this close to the float model leaves nothing to win: nothing past it is scored (a
# cost rule: the simpler file stays, as the test would keep it). KL (class scores, nats): two MobileNetV2s at
# 0.0012 and 0.0014, where percentile ranges measured a KL 30-70 % lower and their files agreed with the float
# model on two test images fewer; where another candidate won on test images, min/max measured 0.0078 (a ViT
# with outlier features) to 0.37. mse: the squared error over the float output's mean square (30 dB SNR);
# cosine: a similarity of 0.999; iou: 99 % of a mask
LOSS_FLOOR = {"kl": 0.003, "mse": 0.001, "cosine": 0.001, "iou": 0.01}
UNBEATABLE = "min/max agreed with the float model on every held-out sample: nothing left to win"
CLOSE = (f"min/max's softmax is within a KL divergence of {LOSS_FLOOR['kl']} of the float model's: what is left "
         "is noise")

# candidates scored at the same time: LiteRT runs a model with Python's lock released (two threads running a ViT
# 200 times each: 0.21 s, against 0.40 s one after the other), so a second candidate's work runs meanwhile;
# TFLite's quantizer keeps the lock (two at once: as long as one after the other)
WORKERS = 2
UNSTARTED = object()  # a method `_scores` did not start: an earlier one was `enough`
FIRST = 8  # samples the float model runs on first where time is bounded: the cost of ranking foreseen from them


@dataclass(frozen=True)
class Late:
    """A method `_scores` did not start: scoring it would take auto past the time it allows."""

    why: str


@dataclass
class Scoring:
    """What `score_all` leaves for the decisions: the evidence, and a scorer for candidates made later
    (weight rounding, the float head) on the same samples."""

    evidence: Evidence
    scorer: Callable[[Candidate], dict[str, Any]]


def folds(n_calibration: int, n_extra: int, seed: int) -> tuple[list[str], tuple[str, ...]]:
    """Each sample's group, and the groups the final file is fitted on. With `2 * MIN_HELD_OUT` samples or
    more past the calibration ones, candidates are fitted on the calibration samples ("a", what the converter
    calibrated on) and scored on those past them ("b"): the file scored is the file written. Else the
    samples are split in random halves, scored both ways, and the winner refitted on all ("a" and "b")."""
    if n_extra >= 2 * MIN_HELD_OUT:
        return ["a"] * n_calibration + ["b"] * n_extra, ("a",)
    n = n_calibration + n_extra
    return list(np.resize(np.array(["a", "b"], object), n)[np.random.default_rng(seed).permutation(n)]), ("a", "b")


def nothing_to_win(score: dict[str, Any], loss: str, name: str = "minmax") -> str | None:
    """Why a candidate's score (min/max's, or that of `name`) leaves another nothing to win, or None: its mean
    loss is under `LOSS_FLOOR` (said as agreeing on every held-out sample where it did), or not resolved above
    it (`loss_low`, its one-sided 95 % lower bound: a mean one or two samples carry, where no candidate can be
    shown better on the rest)."""
    floor = LOSS_FLOOR[loss]
    if score.get("loss") is None or score.get("loss_low", score["loss"]) >= floor:
        return None
    agreed = score.get("agreement") is not None and score["agreement"] >= 1.0
    if score["loss"] >= floor:
        why = (f"min/max's mean {loss} {score['loss']:.3g} is not resolved above {floor} (its 95 % lower bound: "
               f"{score['loss_low']:.3g}): what is left is a few samples' noise")
    elif loss == "kl":
        why = UNBEATABLE if agreed else CLOSE
    else:
        why = f"min/max's mean {loss} loss is under {floor}: what is left is noise"
    return why if name == "minmax" else why.replace("min/max", name, 1)


def cannot_pay(evidence: Evidence, name: str, score: dict[str, Any]) -> str | None:
    """Why costly work (equalisation, weight rounding) cannot pay against `name`'s file, or
    None: its loss under the floor, or, for class scores, fewer samples that disagree with the float model
    than a candidate winning back every one could show better at the comparisons' level (k of them: 0.5^k
    at most that level, the exact sign test)."""
    why = nothing_to_win(score, evidence.loss, name)
    found = evidence.disagreements(name)
    if why is not None or found is None:
        return why
    wrong, n = found
    needed = math.ceil(math.log2(1 / evidence.alpha))
    if wrong >= needed:
        return None
    return (f"{name} disagrees with the float model on {wrong} of {n} held-out samples: winning back every "
            f"one could not be shown at the level {evidence.alpha:.2g} (that takes {needed})")


def comparisons(candidates: dict[str, Candidate], logits: bool, effort: str) -> int:
    """The comparisons a conversion may make: each candidate past min/max, weight rounding unless `fast`,
    the float head where the outputs are logits."""
    return max(0, len(candidates) - 1) + (effort != "fast") + logits


def score_all(entry: dict[str, Any], candidates: dict[str, Candidate], ctx: Context, samples: list, groups: list,
              evaluate, say, *, two_fold: bool, effort: str, more: MoreHeldOut, loss: str,
              threshold: float, deadline: float | None = None, after: int = 0) -> Scoring | None:
    """Each candidate's score against the float model on held-out samples into `entry["candidates"]` (each
    made by its `make`, with `view` its logits view) and its per-sample losses into the evidence; under auto,
    a candidate that cannot be made is skipped with its reason, and scoring ends where what is left cannot
    pay (`nothing_to_win`, a `conclusive` candidate, `cannot_pay` for `costly` ones; `effort` thorough
    scores every one). min/max is scored first (the range methods' activations collected meanwhile), the
    others `WORKERS` at a time. `deadline` (`time.perf_counter()`; None: no limit), less the time of `after`
    runs of a model on one sample that follow the choice (the verification check and the verification
    itself): no candidate is started that would end past it (each foreseen to take as long as the longest
    scored), and where the float model on its first `FIRST` samples foretells that min/max and one more
    could not be scored by then, nothing is ranked: None, every other candidate skipped and said (min/max's
    file, as the test would keep it)."""
    auto = entry["requested"] == "auto"
    scored = _scored_model(ctx.calibrated, samples, evaluate, entry, ctx.output)
    logits = scored is not ctx.calibrated
    if logits:
        ctx.use_view(scored)
    held = [i for i, g in enumerate(groups) if two_fold or g == "b"]  # the float model on the samples scored
    began = time.perf_counter()
    found, deadline = _reference(scored, [samples[i] for i in held], evaluate, deadline, after)
    if isinstance(found, Late):
        for m in list(candidates)[1:]:
            entry.setdefault("skipped", {})[m] = found.why
        say(f"auto keeps min/max: {found.why}")
        return None
    per_sample = (time.perf_counter() - began) / max(1, len(held))
    classes = logits or looks_like_scores(found)
    kind = ("kl" if classes else "mse") if loss == "auto" else loss
    rounds = Rounds([samples[i] for i in held]) if two_fold else Rounds([samples[i] for i in held], more.read,
                                                                          more.available, more.cap)
    evidence = Evidence(rounds, evaluate, scored, kind, classes=classes, logits=logits, threshold=threshold)
    evidence.per_sample = per_sample
    evidence.deadline = deadline
    alpha = evidence.plan(comparisons(candidates, logits, effort) if auto else 1)
    entry["loss"] = kind
    entry["test"] = {"family_alpha": FAMILY_ALPHA, "comparisons": comparisons(candidates, logits, effort) if auto else 1,
                     "looks": rounds.looks, "alpha": float(f"{alpha:.6g}"), "most_samples": rounds.total}
    reference = np.zeros((len(samples), *found.shape[1:]), found.dtype)
    reference[held] = found

    def scorer(candidate: Candidate) -> dict[str, Any]:
        began = time.perf_counter()
        outputs, file = _cross_outputs(lambda g, fit: candidate.make(ctx, Fit((g,), fit), view=logits), samples,
                                       groups, evaluate, two_fold)
        losses, agrees = evidence.measure(reference[held], outputs)
        evidence.add(candidate.name, file, losses, agrees)
        cmp = compare_outputs(reference[held], outputs)
        low = mean_lower_bound(losses)
        return {"agreement": None if agrees is None else float(np.mean(agrees)), "snr_db": cmp["snr_db"],
                "max_abs_error": cmp["max_abs_error"], "loss": float(f"{np.mean(losses):.6g}"),
                **({} if low is None else {"loss_low": float(f"{low:.6g}")}),
                "seconds": round(time.perf_counter() - began, 2)}

    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="edgekit-ranges") as pool:
        if auto and any(c.fits_ranges for c in list(candidates.values())[1:]):  # their activations, collected
            pool.submit(ctx.activations)  # while min/max is scored (spent for nothing where it wins outright)
        _score_batches(entry, candidates, lambda m: scorer(candidates[m]), pool, say,
                       f" ({_how(two_fold, len(held))})", evidence, effort == "thorough", _fits(entry, deadline))
    entry["scored_on"] = len(held)
    return Scoring(evidence, scorer)


def _reference(scored: bytes, held: list, evaluate, deadline: float | None,
               after: int) -> tuple[np.ndarray | Late, float | None]:
    """The float model's outputs on the held-out samples, and the deadline for ranking: `deadline` less
    `after` runs on one sample. Where time is bounded, the float model runs on its first `FIRST` samples
    first: `Late` where they foretell (its time on one sample, for each sample of every run) that the rest
    of it, min/max and one more candidate (two at once) would end past that."""
    if deadline is None or len(held) <= FIRST:
        return evaluate(scored, held), deadline
    began = time.perf_counter()
    first = evaluate(scored, held[:FIRST])
    one = (time.perf_counter() - began) / FIRST
    deadline -= one * after
    cost = one * (3 * len(held) - FIRST)
    if not in_time(deadline, cost):
        return Late(f"ranking candidates on {len(held)} held-out samples would take about {cost:.0f} s more, past "
                    "the time auto allows (effort thorough ranks them)"), deadline
    return np.concatenate([first, evaluate(scored, held[FIRST:])]), deadline


def _fits(entry: dict[str, Any], deadline: float | None) -> Callable[[], Late | None]:
    """Whether another candidate may start: `Late` where, taking as long as the longest scored so far, it
    would end past `deadline`."""
    def fits() -> Late | None:
        cost = max((c["seconds"] for c in entry["candidates"].values()), default=0.0)
        if in_time(deadline, cost):
            return None
        return Late(f"about {cost:.0f} s more would take auto past the time it allows (effort thorough scores it)")
    return fits


def _cross_outputs(make, samples, groups, evaluate, two_fold: bool) -> tuple[np.ndarray, bytes | None]:
    """The outputs of a model made from the "a" samples (`make(fit_group, fit_samples)`) on the "b" ones;
    where the groups are random halves of one set (`two_fold`), also the other way round, each sample's
    output in sample order. The file measured, where there is one (not two-fold)."""
    parts, file = [], None
    for fit, held in (("a", "b"), ("b", "a"))[: 2 if two_fold else 1]:
        idx = [i for i, g in enumerate(groups) if g == held]
        file = make(fit, [s for s, g in zip(samples, groups) if g == fit])
        parts.append((idx, evaluate(file, [samples[i] for i in idx])))
    order = np.concatenate([idx for idx, _ in parts])
    outputs = np.concatenate([out for _, out in parts])[np.argsort(order, kind="stable")]
    return outputs, None if two_fold else file


def _score_batches(entry: dict[str, Any], candidates: dict[str, Candidate], score_one, pool, say, how: str,
                   evidence: Evidence | None = None, every: bool = False,
                   fits: Callable[[], Late | None] = lambda: None) -> None:
    """min/max first, then the rest, into `entry` (`score_all`); under auto (not `every`), nothing past
    min/max where it leaves nothing to win, no `costly` candidate where work cannot pay against it, and
    the rest end where a `conclusive` candidate that measures better than min/max leaves nothing to win:
    those not started by then are skipped, said after the scored ones; nor one that `fits` says is `Late`."""
    auto = entry["requested"] == "auto"
    methods = tuple(candidates)
    said = _counted(say, len(methods))
    loss = entry.get("loss", "kl")

    def enough(m: str, result) -> bool:
        if not (auto and not every and candidates[m].conclusive and isinstance(result, dict)
                and nothing_to_win(result, loss, m)) or evidence is None or not evidence.has("minmax"):
            return False
        return lower_losses(evidence.losses("minmax"), evidence.losses(m), evidence.alpha, MARGIN).better

    batches = [methods[:1], methods[1:]]
    while batches:
        batch = batches.pop(0)
        results = _scores(score_one, batch, pool, lambda m: candidates[m].start_order, enough,
                          (lambda: None) if batch == methods[:1] else fits)  # min/max always
        unstarted = [m for m, r in results.items() if r is UNSTARTED]
        for m, result in results.items():
            if result is UNSTARTED:
                continue
            if isinstance(result, Late):
                entry.setdefault("skipped", {})[m] = result.why
                said(f"calibration method {m}: not scored ({result.why})")
                continue
            if isinstance(result, ConversionError):
                if not auto or m == "minmax":  # auto goes on without a candidate that cannot be made
                    raise result
                entry.setdefault("skipped", {})[m] = str(result)
                said(f"calibration method {m}: skipped ({result})")
                continue
            entry["candidates"][m] = result
            said(f"calibration method {m}: {describe(result, loss)}", how)
            if auto and m == "minmax" and batches:
                why = None if every else nothing_to_win(result, loss)
                if why:
                    for rest in methods[1:]:  # the test would keep min/max whatever they measure
                        entry.setdefault("skipped", {})[rest] = why
                    return
                batches = [_paying(entry, candidates, batches[0], evidence, result, said, every)]
        decided = next((m for m, r in results.items() if r is not UNSTARTED and not isinstance(r, Late)
                        and enough(m, r)), "")
        for m in unstarted:  # said after the scored ones
            entry.setdefault("skipped", {})[m] = nothing_to_win(results[decided], loss, decided)
            said(f"calibration method {m}: not scored ({decided} left nothing to win)")


def _paying(entry: dict[str, Any], candidates: dict[str, Candidate], rest: tuple[str, ...], evidence: Evidence | None,
            plain: dict[str, Any], said, every: bool) -> tuple[str, ...]:
    """`rest` without the `costly` candidates where work cannot pay against min/max (`cannot_pay`), each
    skipped and said."""
    why = None if every or evidence is None else cannot_pay(evidence, "minmax", plain)
    if why is None:
        return rest
    for m in [m for m in rest if candidates[m].costly]:
        entry.setdefault("skipped", {})[m] = why
        said(f"calibration method {m}: not scored ({why})")
    return tuple(m for m in rest if not candidates[m].costly)


def _counted(say, total: int) -> Callable[..., None]:
    """`say` with each line a counted `Step` of `total` where there are several methods to score (how they
    are scored is left to the summary then: the line stays short)."""
    done = [0]

    def said(line: str, how: str = "") -> None:
        done[0] += 1
        say(line + how if total < 2 else Step(f"{line} [{min(done[0], total)}/{total}]", stage="calibration",
                                               done=min(done[0], total), total=total))

    return said


def _scores(score_one: Callable[[str], dict[str, Any]], methods: tuple[str, ...], pool,
            start_order: Callable[[str], int],
            enough: Callable[[str, Any], bool] = lambda _m, _r: False,
            fits: Callable[[], Late | None] = lambda: None) -> dict[str, Any]:
    """Each method's `score_one(m)`, or the ConversionError it raised, in `methods`' order; on `pool`'s
    `WORKERS` threads (each its own interpreters; the `Context` makes what they share once), started in
    `start_order` (`Candidate.start_order`), at most `WORKERS` submitted at once. Once a result is
    `enough(m, result)`, no more are submitted: `UNSTARTED` (those running finish and count; one queued
    behind the pool's other work is cancelled where no worker took it yet). One that `fits` finds `Late` when
    its turn comes is not started: that `Late`."""
    def attempt(m: str):
        try:
            return score_one(m)
        except ConversionError as exc:
            return exc

    if len(methods) <= 1:
        return {m: fits() or attempt(m) for m in methods}
    waiting = sorted(methods, key=start_order)
    running: dict[Future, str] = {}
    results: dict[str, Any] = {}
    ended = False
    while running or (waiting and not ended):  # submitted one by one: a worker done takes no next one itself
        while waiting and not ended and len(running) < WORKERS:
            m = waiting.pop(0)
            if (late := fits()) is not None:
                results[m] = late
                continue
            running[pool.submit(attempt, m)] = m
        if not running:
            break
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


def _scored_model(calibrated: bytes, samples: list, evaluate, entry: dict[str, Any], output: str | None) -> bytes:
    """The model the candidates are made from while they are scored: where the first output is class scores
    made by a SOFTMAX, the calibrated model with the logits as that output (`logits_view`: the same tensors
    and recorded ranges, so each candidate's logits are those of its real file); else the calibrated model."""
    entry["scored_output"] = "output"
    if isinstance(samples[0], dict):  # fed by signature: a view whose outputs differ loses the signature
        return calibrated
    if not looks_like_scores(evaluate(calibrated, samples[:1])):
        return calibrated
    view = logits_view(calibrated, output)
    if view is None:
        return calibrated
    entry["scored_output"] = "logits"
    return view


def describe(s: dict[str, Any], loss: str) -> str:
    parts = [] if s.get("agreement") is None else [f"agreement {100 * s['agreement']:.2f}%"]
    return ", ".join(parts + [f"mean {loss} {s['loss']:.4g}", f"SNR {s['snr_db']:.1f} dB"])
