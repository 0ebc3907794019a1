"""Activation ranges beyond min/max for post-training int8, chosen by measurement.

TFLite's converter calibrates by running the float model and recording each activation's min and max;
one outlier then stretches a tensor's scale for every other value. Here the converter only calibrates
(`_experimental_calibrate_only`, as TFLite's own QuantizationDebugger does), the float model's activations
are sampled on the calibration data, and each method proposes ranges:

- `minmax`: the converter's own ranges (the plain converter's model: the same tensors and outputs);
- `percentile`: each range clipped to the 0.01 / 99.99 percentiles of what the tensor held;
- `mse`: the clipping of each range (a shared factor on both ends) that minimises the mean squared
  error of int8 quantize-dequantize over the sampled values.

Beside them `auto` scores min/max with each layer's bias corrected for its int8 kernel's mean error
(`bias`, converters/bias_correction.py), ai-edge-quantizer's file (converters/aeq.py) and variants: the
calibrated model of the same function with other weights (`equalize`, converters/equalize.py), with
min/max ranges.

The quantizer itself is TFLite's (`mlir_quantize`), fed the edited ranges, so every op's constraints
(shared scales of concat and pooling, fixed softmax scales) stay TFLite's business. `auto` ranks the
methods on held-out calibration-source data (never on evaluation data): each candidate is fitted on the
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
that are not class scores: SNR by `SNR_MARGIN_DB`), and always where min/max agrees with the float model
on every held-out sample or its KL is under `KL_FLOOR`, where nothing past it is scored; min/max is
always the converter's own model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.converters import aeq, bias_correction
from edgekit.converters.feeding import debugging_interpreter, feeder
from edgekit.converters.quantize import quantize_calibrated, run_converter
from edgekit.converters.recipe import aeq_unusable
from edgekit.errors import ConversionError, one_line
from edgekit.metrics import compare_outputs, looks_like_scores
from edgekit.progress import Step

METHODS = ("minmax", "percentile", "mse")
MIN_HELD_OUT = 20  # per half: fewer samples cannot rank methods, auto keeps min/max
VALUES_PER_TENSOR = 1 << 16  # sampled activation values kept per tensor, over all samples
PERCENTILE = 99.99
MSE_GRID = np.linspace(0.3, 1.0, 29)
AEQ_SAMPLES = 32  # ai-edge-quantizer calibrates on at most this many (a moving average: the last weigh most)
MSE_VALUES = 1 << 14  # values the MSE search runs over, per tensor (an even share of those sampled)


def calibrated_model(converter) -> bytes:
    """The float model with the converter's calibration ranges recorded on its tensors."""
    converter._experimental_calibrate_only = True
    try:
        return run_converter(converter)
    finally:
        converter._experimental_calibrate_only = False


def quantize(calibrated: bytes, io: str, ranges: dict[int, tuple[float, float]] | None = None,
             denylisted_nodes: Iterable[str] = ()) -> bytes:
    """TFLite's int8 quantizer on the calibrated model, with `ranges` (tensor index -> (lo, hi)) replacing
    the recorded ones; io float32, int8 or uint8 as the converter's inference_input/output_type; the ops
    writing `denylisted_nodes` stay float (the autopilot's mixes)."""
    return quantize_calibrated(with_ranges(calibrated, ranges) if ranges else calibrated, io, denylisted_nodes)


def _schema():
    from edgekit.runtime.schema import schema_module

    return schema_module()


def with_ranges(calibrated: bytes, ranges: dict[int, tuple[float, float]]) -> bytes:
    from edgekit.runtime.schema import pack, patched, unpack

    made = patched(calibrated, ranges=ranges)
    if made is not None:
        return made
    model = unpack(calibrated)
    tensors = model.subgraphs[0].tensors
    for index, (lo, hi) in ranges.items():
        tensors[index].quantization.min = [float(lo)]
        tensors[index].quantization.max = [float(hi)]
    return pack(model, len(calibrated))


def logits_view(tflite: bytes) -> bytes | None:
    """The model with its first output moved to the logits: the input of the SOFTMAX that makes it (through
    a DEQUANTIZE in an int8 model with float outputs); None when no SOFTMAX makes it. Probabilities of
    training-like samples are one-hot to within the int8 output's fixed 1/256 step, so every range method
    scores the same SNR there (a MobileNetV3Small: 48.2 dB each); the logits still tell them apart."""
    from edgekit.runtime.schema import pack, unpack

    s = _schema()
    model = unpack(tflite)
    graph = model.subgraphs[0]

    def code(op) -> int:
        c = model.operatorCodes[op.opcodeIndex]
        return max(c.builtinCode, c.deprecatedBuiltinCode)

    producer = {t: op for op in graph.operators for t in op.outputs}
    first = int(graph.outputs[0])
    op = producer.get(first)
    if op is not None and code(op) == s.BuiltinOperator.DEQUANTIZE:
        op = producer.get(int(op.inputs[0]))
    if op is None or code(op) != s.BuiltinOperator.SOFTMAX:
        return None
    logits = int(op.inputs[0])
    # the probabilities stay an output (second): a SOFTMAX feeding nothing would be dropped by TFLite's
    # export, and ai-edge-quantizer's file is refused when its ops change there (converters/aeq.py)
    graph.outputs = [logits, first, *(int(t) for t in graph.outputs[1:])]
    for signature in model.signatureDefs or []:
        for entry in signature.outputs or []:
            if entry.tensorIndex == first:
                entry.tensorIndex = logits
    return pack(model, len(tflite))


def ranged_tensors(calibrated: bytes) -> dict[int, tuple[float, float]]:
    """Activation tensors of the main graph that carry a calibration range (graph inputs excluded: their
    range is the data's), index -> (min, max)."""
    s = _schema()
    graph = s.Model.GetRootAs(calibrated, 0).Subgraphs(0)
    inputs = set(graph.InputsAsNumpy().tolist())
    found = {}
    for i in range(graph.TensorsLength()):
        q = graph.Tensors(i).Quantization()
        if i in inputs or q is None or q.MinLength() != 1 or q.MaxLength() != 1:
            continue
        found[i] = (float(q.Min(0)), float(q.Max(0)))
    return found


# ops whose int8 output range TFLite's quantizer does not take from calibration: a fixed scale (SOFTMAX, LOGISTIC,
# TANH) or their input's (the rest). A range proposed there changes nothing: the file was byte-identical with
# these outputs' ranges replaced (a ViT's 57 RESHAPE / TRANSPOSE outputs, an EfficientNetB0's 65 LOGISTIC
# ones; each op in tests/test_ranges.py), so their values are not collected (a quarter of a ViT's tensors; a
# CONCATENATION's range is used)
RANGE_NOT_USED = frozenset({"SOFTMAX", "LOGISTIC", "TANH", "RESHAPE", "TRANSPOSE", "EXPAND_DIMS", "GATHER", "SLICE",
                            "STRIDED_SLICE", "PAD", "MAX_POOL_2D", "AVERAGE_POOL_2D"})


def settable_tensors(calibrated: bytes) -> dict[int, tuple[float, float]]:
    """`ranged_tensors` whose range the int8 quantizer uses (not outputs of `RANGE_NOT_USED` ops)."""
    from edgekit.runtime.inspect import operators

    _, _, ops = operators(calibrated)
    fixed = {int(t) for _, name, op in ops if name in RANGE_NOT_USED for t in op.outputs}
    return {i: r for i, r in ranged_tensors(calibrated).items() if i not in fixed}


@dataclass
class Activations:
    """Sampled values of each ranged tensor, per sample group (the two halves "a" and "b", or "fit"): a row
    a sample, its exact min and max first."""

    recorded: dict[int, tuple[float, float]]
    values: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)

    def pooled(self, groups: Iterable[str], index: int) -> np.ndarray:
        parts = [self.values[g][index].ravel() for g in groups if index in self.values.get(g, {})]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def collect(calibrated: bytes, samples: list, groups: list[str], *, seed: int = 0) -> Activations:
    """Run the float model on every sample and keep a random share of the values of each tensor whose range
    the quantizer uses (`settable_tensors`), after that sample's exact min and max, by group. The rows are
    filled in place and each tensor's random positions drawn at once: per sample and tensor, one read, two
    reductions and one gather."""
    recorded = settable_tensors(calibrated)
    acts = Activations(recorded)
    interp = debugging_interpreter(calibrated, samples[0])
    feed = feeder(interp)
    rng = np.random.default_rng(seed)
    per_sample = max(64, VALUES_PER_TENSOR // max(1, len(samples)))
    row_of, count = [], {}
    for group in groups:  # each sample's row in its group's arrays
        row_of.append(count.get(group, 0))
        count[group] = row_of[-1] + 1
    picks: dict[int, np.ndarray | None] = {}
    for j, (sample, group) in enumerate(zip(samples, groups)):
        feed(sample)
        bucket = acts.values.setdefault(group, {})
        for index in recorded:
            v = interp.get_tensor(index).ravel()
            rows = bucket.get(index)
            if rows is None:
                if index not in picks:  # int32: as many bytes as the values kept (an EfficientNetB0: 32 MB)
                    picks[index] = (rng.integers(0, v.size, (len(samples), per_sample)).astype(np.int32)
                                    if v.size > per_sample else None)
                width = 2 + (v.size if picks[index] is None else per_sample)
                rows = bucket[index] = np.empty((count[group], width), np.float32)
            if v.size == 0:  # an empty tensor (a recurrence's unused state): its recorded range stands
                rows[row_of[j]] = recorded[index]
                continue
            row = rows[row_of[j]]
            row[0], row[1] = v.min(), v.max()
            row[2:] = v if picks[index] is None else v[picks[index][j]]
    return acts


def _mse_range(v: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    best, best_err = (lo, hi), np.inf
    for a in MSE_GRID:
        clo, chi = min(0.0, a * lo), max(0.0, a * hi)
        scale = (chi - clo) / 255.0 or 1.0
        zp = np.round(-128 - clo / scale)
        deq = (np.clip(np.round(v / scale) + zp, -128, 127) - zp) * scale
        err = float(np.mean((deq - v) ** 2))
        if err < best_err:
            best, best_err = (clo, chi), err
    return best


def propose(acts: Activations, method: str, groups: Iterable[str],
            only: set[int] | None = None) -> dict[int, tuple[float, float]]:
    """index -> (lo, hi) by `method` from the values of `groups` (of the tensors in `only`, else all)."""
    groups = tuple(groups)
    ranges = {}
    for index, recorded in acts.recorded.items():
        if only is not None and index not in only:
            continue
        v = acts.pooled(groups, index)
        if v.size == 0:
            ranges[index] = recorded
            continue
        lo, hi = float(min(v.min(), 0.0)), float(max(v.max(), 0.0))
        if method == "percentile":  # both ends from one partition of the values
            p_lo, p_hi = np.percentile(v, (100 - PERCENTILE, PERCENTILE))
            lo = 0.0 if lo == 0.0 else min(0.0, float(p_lo))
            hi = 0.0 if hi == 0.0 else max(0.0, float(p_hi))
        elif method == "mse":
            lo, hi = _mse_range(v[:: max(1, v.size // MSE_VALUES)], lo, hi)
        if hi - lo <= 0:
            lo, hi = recorded
        ranges[index] = (lo, hi)
    return ranges


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
    if plain["agreement"] is None:
        return _snr(candidate) > _snr(plain) + SNR_MARGIN_DB
    if _nothing_to_win(plain):
        return False
    if "kl" not in plain or "kl" not in candidate:
        return candidate["agreement"] > plain["agreement"]
    if candidate["kl"] < (1 - KL_MARGIN) * plain["kl"] and _lower_kl_in_each_fold(candidate, plain):
        return True
    return candidate["kl"] <= (1 + KL_MARGIN) * plain["kl"] and candidate["agreement"] > plain["agreement"]


def _nothing_to_win(plain: dict[str, Any]) -> str | None:
    """Why min/max's score leaves another candidate nothing to win, or None: it agreed with the float model on
    every held-out sample, or its softmax is within `KL_FLOOR` of the float model's."""
    if plain["agreement"] is not None and plain["agreement"] >= 1.0:
        return UNBEATABLE
    return CLOSE if plain.get("kl") is not None and plain["kl"] < KL_FLOOR else None


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
           *, extra: list = (), variants: dict[str, Callable[[], bytes]] | None = None, seed: int = 0,
           say=lambda _m: None) -> RangeChoice:
    """The int8 model by `method`; 'auto' ranks the methods (and ai-edge-quantizer, converters/aeq.py, where
    it can run) on held-out samples (`_folds`) and keeps min/max unless another measures better.
    `evaluate(tflite, samples)` gives a model's first output on samples, stacked. `extra`: more samples of
    the same source, which the converter did not calibrate on: the candidates are scored on them (fewer
    than `2 * MIN_HELD_OUT`: on halves of all samples, two-fold).
    `variants`: name -> a function making the calibrated model of the same function with other weights
    (converters/equalize.py: weights rescaled in the calibrated model, made only where scored or chosen),
    each one more candidate with min/max ranges. min/max chosen is always the converter's own model."""
    started = time.perf_counter()
    samples = list(samples) + list(extra)
    variants = dict(variants or {})
    n = len(samples)
    entry: dict[str, Any] = {"requested": method, "chosen": method, "scored_on": 0, "candidates": {},
                             "extra_samples": len(extra)}
    if method == "minmax" or (method == "auto" and n < 2 * MIN_HELD_OUT):
        entry["chosen"] = "minmax"
        if method == "auto":
            entry["note"] = f"{n} calibration samples are too few to rank methods (at least {2 * MIN_HELD_OUT})"
        return RangeChoice(quantize(calibrated, io), {**entry, "seconds": round(time.perf_counter() - started, 2)},
                           calibrated)
    methods = _candidates(method, io, entry, variants)
    folds, fit = _folds(n - len(extra), len(extra), seed)
    entry["scoring"] = "two_fold" if fit == ("a", "b") else "held_out"
    make = _Makers(calibrated, io, variants, samples, folds, seed, converters_fit=fit)
    if n >= 2 * MIN_HELD_OUT:
        _score_all(entry, methods, make, calibrated, samples, folds, evaluate, say, two_fold=fit == ("a", "b"))
    if method == "auto":
        plain = entry["candidates"]["minmax"]
        better = [m for m in entry["candidates"] if m != "minmax" and _better(entry["candidates"][m], plain)]
        entry["chosen"] = max(better, key=lambda m: _key(entry["candidates"][m])) if better else "minmax"
    chosen = entry["chosen"]
    fit_samples = [x for x, g in zip(samples, folds) if g in fit]
    final, basis = make(chosen, fit, fit_samples, False, final=True), make.basis(chosen, fit, fit_samples)
    if chosen in entry["candidates"]:
        entry["agreement_spread_points"] = _spread(entry["candidates"][chosen]["folds"])
    entry["seconds"] = round(time.perf_counter() - started, 2)
    return RangeChoice(final, entry, basis)


class _Makers:
    """Each candidate's int8 model for `choose`; a variant's calibrated model, the activations collected for
    fitting ranges, the logits views and the corrected biases are made once, when first needed (by whichever
    of `choose`'s threads needs them first: the others wait for it)."""

    def __init__(self, calibrated: bytes, io: str, variants: dict[str, Callable[[], bytes]], samples: list,
                 folds: list, seed: int, converters_fit: tuple[str, ...] = ("a", "b")):
        self.calibrated, self.io, self.variants = calibrated, io, variants
        self.samples, self.folds, self.seed = samples, folds, seed
        self.converters_fit = converters_fit  # the groups the converter calibrated on: min/max there is its own
        self.made: dict[str, bytes] = {}  # the variants' calibrated models
        self.acts: dict[str, Activations] = {}
        self.views: dict[str, bytes | None] = {}  # logits views, by calibrated model ("" or a variant's name)
        self.proposed: dict[tuple[str, tuple[str, ...]], dict] = {}  # ranges, by method and fitting groups
        self.corrected: dict[tuple[str, ...], tuple] = {}  # bias correction (and the view measured on), by groups
        self.aeq_files: dict[tuple[str, ...], bytes] = {}  # ai-edge-quantizer's file, by fitting groups
        self.plain: dict[bool, bytes] = {}  # the converter's int8 model (float I/O; of the view: True), once made
        self._lock = threading.Lock()
        self._locks: dict[tuple[int, Any], threading.Lock] = {}

    def _once(self, cache: dict, key, make: Callable[[], Any]):
        """`cache[key]`, made by `make` once however many threads ask at the same time."""
        with self._lock:
            lock = self._locks.setdefault((id(cache), key), threading.Lock())
        with lock:
            if key not in cache:
                cache[key] = make()
        return cache[key]

    def base(self, m: str) -> bytes:
        """The calibrated model method `m` starts from: the converter's, or a variant's."""
        return self._once(self.made, m, self.variants[m]) if m in self.variants else self.calibrated

    def ranges_of(self, m: str) -> Activations:  # the range methods share one collection on the calibrated model
        def collected() -> Activations:  # only the samples some range is fitted on
            pairs = [(x, g) for x, g in zip(self.samples, self.folds) if g in self.converters_fit]
            return collect(self.base(m), [x for x, _ in pairs], [g for _, g in pairs], seed=self.seed)

        return self._once(self.acts, m if m in self.variants else "", collected)

    def model(self, m: str, view: bool) -> bytes:
        """Method `m`'s calibrated model (the converter's, or a variant's), with `view` its logits view
        (`logits_view`: the same tensors and recorded ranges)."""
        key = m if m in self.variants else ""
        if not view:
            return self.base(m)
        return self._once(self.views, key, lambda: logits_view(self.base(m)))

    def __call__(self, m: str, groups: tuple[str, ...], fit_samples: list, view: bool, final: bool = False) -> bytes:
        """Method `m`'s int8 model with ranges fitted on `groups` / `fit_samples`; with `view`, its logits
        view (the same tensors and recorded ranges as the file). Bias correction's is the file it measured on
        with its biases written in, but for the `final` file: TFLite's quantizer on the corrected float model
        (`basis`, which the budget autopilot quantizes its mixes from), which rounds a few int32 biases one
        step the other way (converters/bias_correction.py)."""
        if m == aeq.NAME:  # its own quantizer's file, from the calibrated model's graph (ranges dropped)
            made = self._once(self.aeq_files, groups, lambda: aeq.quantize(
                self.calibrated, fit_samples[:: max(1, len(fit_samples) // AEQ_SAMPLES)][:AEQ_SAMPLES]))
            made = logits_view(made) if view else made  # its own graph: viewed after
            if made is None:
                raise ConversionError("ai-edge-quantizer's model has no SOFTMAX before its first output to score")
            return made
        if m == bias_correction.NAME and not final:
            measured_on, correction = self._correction(groups, fit_samples, view)
            if measured_on == view and self.io == "float32":  # the file it measured on, its biases written in
                return correction.tflite
        model, ranges = self._resolve(m, groups, fit_samples, view)
        made = quantize(model, self.io, ranges)
        if m == "minmax" and ranges is None and self.io == "float32":
            self.plain.setdefault(view, made)  # bias correction's first int8 model
        return made

    def basis(self, m: str, groups: tuple[str, ...], fit_samples: list) -> bytes | None:
        """The calibrated model method `m`'s file is quantized from, its ranges written in; None for
        ai-edge-quantizer's (its own quantizer's file)."""
        if m == aeq.NAME:
            return None
        model, ranges = self._resolve(m, groups, fit_samples, False)
        return with_ranges(model, ranges) if ranges else model

    def _resolve(self, m: str, groups: tuple[str, ...], fit_samples: list,
                 view: bool) -> tuple[bytes, dict | None]:
        """Method `m`'s calibrated model (`view`: its logits view) and the ranges to quantize it with (None:
        those recorded in it)."""
        model = self.model(m, view)
        if m == bias_correction.NAME:  # biases corrected on the fitting samples: one set a fold
            return bias_correction.with_biases(model, self._correction(groups, fit_samples, view)[1].biases), None
        rule = "minmax" if m in self.variants else m
        if rule == "minmax" and groups == self.converters_fit:
            return model, None
        return model, self._once(self.proposed, (m, groups), lambda: propose(self.ranges_of(m), rule, groups))

    def _correction(self, groups: tuple[str, ...], fit_samples: list,
                    view: bool) -> tuple[bool, bias_correction.Correction]:
        """The biases corrected on `groups` (one set a fold), and whether they were measured on the logits view
        (the model first asked for; the other has the same tensors)."""
        return self._once(self.corrected, groups, lambda: (view, self._bias_corrected(fit_samples, view)))

    def _bias_corrected(self, fit_samples: list, view: bool) -> bias_correction.Correction:
        """converters/bias_correction.py's biases on `fit_samples`, measured on the model scored (`view`; its
        tensors are the file's); any failure is one line (auto skips it)."""
        try:
            made = bias_correction.corrected(self.model("", view), fit_samples, lambda c: quantize(c, "float32"),
                                             first=self.plain.get(view))
        except ConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - a graph it did not foresee: one line, auto goes on
            raise ConversionError(f"bias correction failed on this model: {one_line(exc)[:200]}") from None
        if made is None:
            raise ConversionError("bias correction found no layer with a bias to correct")
        return made


def _candidates(method: str, io: str, entry: dict[str, Any], variants: dict) -> tuple[str, ...]:
    """The methods to score: the one asked for, or for auto the range methods, the `variants` and
    ai-edge-quantizer where it can run (why not is recorded in `entry`)."""
    if method != "auto":
        return (method,)  # the recipe refused aeq where it cannot run
    reason = aeq_unusable(io)
    if reason:
        entry["skipped"] = {aeq.NAME: reason}
        return (*METHODS, bias_correction.NAME, *variants)
    return (*METHODS, bias_correction.NAME, *variants, aeq.NAME)


def _score_all(entry: dict[str, Any], methods: tuple[str, ...], make: _Makers, calibrated: bytes, samples: list,
               folds: list, evaluate, say, two_fold: bool = True) -> None:
    """Each method's score against the float model on held-out samples (`_cross_scores`) into
    `entry["candidates"]` (`make(m, groups, fit_samples, view)` makes method m's model, with `view` its
    logits view); under auto, a candidate that cannot be made (ai-edge-quantizer failing, a bias correction
    with nothing to correct, an equalisation that changed the float function) is skipped with its reason,
    and nothing past min/max is scored where it leaves nothing to win (`_nothing_to_win`). min/max is
    scored first (the range methods' activations collected meanwhile), the others `WORKERS` at a time."""
    auto = entry["requested"] == "auto"
    scored = _scored_model(calibrated, samples, evaluate, entry)
    logits = scored is not calibrated
    if logits:
        make.views.setdefault("", scored)
    held = [i for i, g in enumerate(folds) if two_fold or g == "b"]  # the float model on the samples scored
    found = evaluate(scored, [samples[i] for i in held])
    reference = np.zeros((len(samples), *found.shape[1:]), found.dtype)
    reference[held] = found

    def score_one(m: str) -> dict[str, Any]:
        began = time.perf_counter()
        result = _cross_scores(lambda g, fit: make(m, (g,), fit, logits), samples, folds, reference, evaluate,
                               logits, two_fold)
        return {**result, "seconds": round(time.perf_counter() - began, 2)}

    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="edgekit-ranges") as pool:
        if auto and {"percentile", "mse"} & set(methods):  # the range methods' activations, collected while
            pool.submit(make.ranges_of, "minmax")  # min/max is scored (spent for nothing where it wins outright)
        _score_batches(entry, methods, score_one, pool, say, f" ({_how(two_fold, len(held))})")
    entry["scored_on"] = len(held)


def _score_batches(entry: dict[str, Any], methods: tuple[str, ...], score_one, pool, say, how: str) -> None:
    """min/max first, then the rest, into `entry` (`_score_all`)."""
    auto = entry["requested"] == "auto"
    said = _counted(say, len(methods))
    for batch in (methods[:1], methods[1:]):
        for m, result in _scores(score_one, batch, pool).items():
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


def _scores(score_one: Callable[[str], dict[str, Any]], methods: tuple[str, ...], pool) -> dict[str, Any]:
    """Each method's `score_one(m)`, or the ConversionError it raised, in `methods`' order; on `pool`'s
    `WORKERS` threads (each its own interpreters; `_Makers` makes what they share once)."""
    def attempt(m: str):
        try:
            return score_one(m)
        except ConversionError as exc:
            return exc

    if len(methods) <= 1:
        return {m: attempt(m) for m in methods}
    futures = {m: pool.submit(attempt, m) for m in sorted(methods, key=_start_order)}
    return {m: futures[m].result() for m in methods}


def _start_order(m: str) -> int:
    """The order candidates start in: a variant (its moved ranges measured on every sample) first, then bias
    correction, which needs no activations: the worker free first takes it while the other still collects
    them for percentile and mse (a ViT: percentile first left that worker waiting 0.25 s; the two range
    methods started together, 2.6 s of scoring)."""
    return {bias_correction.NAME: 1, "percentile": 2, "mse": 3, "minmax": 4, aeq.NAME: 5}.get(m, 0)


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

