"""Accuracy-budget autopilot for int8: keep the most quantization-sensitive tensors in float until the
accuracy drop on the evaluation data fits the budget (selective quantization).

1. The plain int8 model is measured; within budget, nothing changes.
2. TFLite's quantization debugger runs every op quantized against its float twin on calibration samples.
   Each op's output gets a sensitivity: the median over channels of the quantization error relative to the
   channel's own signal. (The debugger's usual rmse/scale cannot see a range problem: it measures error in
   units of the quantization step, and a few outliers make the step huge for every channel.)
3. A tensor is kept in float with the ops on both sides of it (its producer and its consumers), since an
   int8 consumer would quantize it again with the same range. The most sensitive candidates are tried one
   by one (trial = convert with them in float and measure accuracy), then added in the order of what
   they bought until the budget is met. Every decision records the size and latency it cost.
4. When no combination of those meets the budget (each sensitive tensor alone bought nothing, as on a
   depthwise net whose error is spread over many layers), the search accumulates: the k most sensitive
   tensors go to float together, k bisected between none (int8 misses) and all (the float model), then
   the tensors the mix does not need are taken out again, in chunks that halve, least sensitive first.
   The same search then runs in graph order (the first k ops from the input): mostly one float region
   from the input, where the ranking's float ops are islands that each pay a QUANTIZE and a DEQUANTIZE
   (a consumer further on, such as a residual ADD, goes with its input, and the shrink may open gaps).
   With `int16`, the sensitivity order first puts them at int16 activations (int16x8, ai-edge-quantizer's
   mix: the file stays int8-sized, but TFLite's int16 kernels are slow reference ones).
   Of the mixes that meet the budget, the fastest file is kept (measured p50, one thread, interleaved).
   Every budget the float model meets is met; "not met" means not even by every op in float.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.converters._tf import import_tf, keras_prints_to_logging
from edgekit.errors import EdgekitError, one_line
from edgekit.progress import Step

SKIP_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})
DEBUG_SAMPLES = 64
PATIENCE = 4  # sensitive tensors in a row that bought nothing end the trials
UNNEEDED_TRIALS = 40  # at most this many mixes try tensors of an accumulated mix back in int8 (`_shrink`)


def channel_relative_error(float_values, quant_values, scale: float, zero_point: int) -> float:
    """Median over channels (last axis) of rms(dequantized - float) / rms(float)."""
    with np.errstate(all="ignore"):
        f = np.asarray(float_values, np.float64)
        q = (np.asarray(quant_values, np.int64) - int(zero_point)) * float(scale)
        f2 = f.reshape(-1, f.shape[-1]) if f.ndim > 1 else f.reshape(-1, 1)
        e2 = q.reshape(f2.shape) - f2
        signal = np.sqrt(np.mean(f2**2, axis=0))
        noise = np.sqrt(np.mean(e2**2, axis=0))
    live = np.isfinite(signal) & np.isfinite(noise) & (signal > 1e-12)
    return float(np.median(noise[live] / signal[live])) if live.any() else 0.0


def _verified_tensor(key: str) -> str:
    """The op output a debugger statistic belongs to: keys read `NumericVerify/{name}{digit}:{index}`
    (the debugger's own layer_statistics_dump strips them the same way)."""
    name = key.rsplit(":", 1)[0].split("/", 1)[1]
    return name[:-1] if name[-1:].isdigit() else name


@dataclass(frozen=True)
class OpGraph:
    """Quantizable ops of a converted model: output tensor name -> op name, and tensor -> consumers."""

    ops: dict[str, str]  # output tensor name -> op type
    consumers: dict[str, tuple[str, ...]]  # tensor name -> output names of the ops reading it

    @classmethod
    def of(cls, tflite: bytes) -> OpGraph:
        from edgekit.runtime.inspect import operators

        _, sub, walked = operators(tflite)
        tensor_name = [t.name for t in sub.tensors]
        ops: dict[str, str] = {}
        consumers: dict[str, list[str]] = {}
        for _, kind, op in walked:
            if kind in SKIP_OPS or not op.outputs:
                continue
            out = tensor_name[op.outputs[0]]
            ops[out] = kind
            for i in op.inputs:
                if i >= 0:
                    consumers.setdefault(tensor_name[i], []).append(out)
        return cls(ops, {k: tuple(v) for k, v in consumers.items()})

    def unit(self, tensor: str) -> tuple[str, ...]:
        """The ops to keep in float so that `tensor` stays float: its producer and its consumers."""
        return tuple(dict.fromkeys((tensor,) + tuple(c for c in self.consumers.get(tensor, ()) if c in self.ops)))


@dataclass
class AutopilotResult:
    tflite: bytes
    met: bool
    budget_points: float
    float_top1: float
    plain_drop: float
    drop: float
    eval_data: str | None = None
    float_ops: list[str] = field(default_factory=list)
    int16_ops: list[str] = field(default_factory=list)  # ops at int16 activations (int16x8), int8 weights
    int16_refused: str | None = None  # why an int16x8 mix could not be made or run
    total_ops: int = 0
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    plain_agreement: float | None = None
    agreement: float | None = None
    clipped: dict[str, str] = field(default_factory=dict)  # tensor -> range method, kept int8
    resolution_points: float | None = None  # one evaluation image, in top-1 points
    float16_weights: dict[str, Any] | None = None  # the float ops' weights as float16: what it measured
    every_op_float_drop: float | None = None  # the drop with every op in float, when the search got that far
    latency_choice: dict[str, Any] | None = None  # mixes that met the budget: which was fastest (`_fastest`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_points": self.budget_points, "met": self.met, "eval_data": self.eval_data,
            "float_top1": round(self.float_top1, 5), "plain_int8_drop": round(self.plain_drop, 3),
            "drop": round(self.drop, 3), "float_ops": self.float_ops, "total_ops": self.total_ops,
            "float_share": round(len(self.float_ops) / self.total_ops, 4) if self.total_ops else 0.0,
            "int16_ops": self.int16_ops,
            "int16_share": round(len(self.int16_ops) / self.total_ops, 4) if self.total_ops else 0.0,
            "int16_refused": self.int16_refused,
            "sensitivity": self.sensitivity[:10], "trials": self.trials, "decisions": self.decisions,
            "seconds": round(self.seconds, 2), "plain_int8_agreement": self.plain_agreement,
            "agreement": self.agreement, "clipped": self.clipped,
            "resolution_points": None if self.resolution_points is None else round(self.resolution_points, 4),
            "below_resolution": self.resolution_points is not None and self.budget_points < self.resolution_points,
            "float16_weights": self.float16_weights, "every_op_float_drop": self.every_op_float_drop,
            "latency_choice": self.latency_choice,
        }


def _quick_p50(tflite: bytes, runs: int = 50) -> float:
    """Median invoke time (ms) on one CPU thread, for what a decision cost; `edgekit bench` is the full story."""
    from edgekit.runtime.model import Model
    from edgekit.runtime.timing import time_invokes

    model = Model(tflite, delegate="cpu", num_threads=1, probe=False)
    for info in model.inputs:
        model.runner.set(info.index, np.zeros(info.shape, info.dtype))
    time_invokes(model.runner, 5)
    return float(np.median(time_invokes(model.runner, runs)))


@dataclass
class _Search:
    """The state of one autopilot run: how to build a candidate and what it measures."""

    calibrated: bytes
    acts: Any  # ranges.Activations of the calibration samples
    index_of: dict[str, int]
    measure: Callable[[bytes], tuple[float, float | None]]  # -> (drop in points, agreement with float or None)
    samples: list = field(default_factory=list)  # the calibration samples, for ai-edge-quantizer's mixes
    float_kernels: bytes | None = None  # where `calibrated`'s constants were changed for int8: the float ones
    _wide: Any = None  # aeq.Calibration, made on the first int16x8 mix
    _float_layers: dict[str, dict[int, np.ndarray]] | None = None  # float_ops.float_constants, read once
    mixes: dict[tuple, tuple] = field(default_factory=dict)  # (int16x8?, ops) -> a mix measured (`_accumulate`)
    # ops the int8 file keeps in float whatever the mix (its float head, converters/int8/float_ops.py); an int16x8
    # mix has them at int16 activations
    keep_float: tuple[str, ...] = ()

    def build16(self, int16_ops: tuple[str, ...]) -> bytes:
        """ai-edge-quantizer's int8 with the ops writing `int16_ops` at int16 activations (int16x8), from
        one calibration (converters/int8/aeq_quantizer.py); raises ConversionError where it cannot quantize the model,
        ImportError without the package."""
        from edgekit.converters.int8 import aeq_quantizer as aeq

        if self._wide is None:  # min/max over every calibration sample, as TFLite's converter sets ranges
            self._wide = aeq.Calibration(self.calibrated, self.samples, min_max=True)
        return self._wide.quantize(int16=tuple(dict.fromkeys((*int16_ops, *self.keep_float))))

    def build(self, float_ops: tuple[str, ...] = (), clipped: dict[str, str] | None = None) -> bytes:
        """int8 with `float_ops` (and `keep_float`) kept in float and `clipped` tensors' ranges set by a method
        (name -> method)."""
        from edgekit.converters.int8 import ranges
        from edgekit.converters.int8.range_setting import clip_of

        overrides = {}
        for name, method in (clipped or {}).items():
            index = self.index_of.get(name)
            if index is not None and index in self.acts.recorded:
                overrides.update(ranges.propose(self.acts, clip_of(method), ("fit",), only={index}))
        kept = tuple(dict.fromkeys((*float_ops, *self.keep_float)))
        return ranges.quantize(self._with_float_kernels(kept), "float32", overrides or None, denylisted_nodes=kept)

    def _with_float_kernels(self, float_ops: tuple[str, ...]) -> bytes:
        """The calibrated model, the ops kept in float given the float model's constants where its own were
        changed for int8 (a GPTQ basis's rounded kernels, bias correction's biases: float would otherwise keep
        them, and "every op in float" would not be the float model)."""
        if not float_ops or self.float_kernels is None:
            return self.calibrated
        from edgekit.converters.int8.float_ops import float_constants, with_float_constants

        if self._float_layers is None:  # read once a search (the basis has the same tensors)
            self._float_layers = float_constants(self.float_kernels)
        return with_float_constants(self.calibrated, self._float_layers, float_ops)


def _better_result(a: tuple[float, float | None, int], b: tuple[float, float | None, int]) -> bool:
    """(drop, agreement, float ops): less drop, then more agreement with the float model, then fewer ops."""
    return (a[0], -(a[1] or 0.0), a[2]) < (b[0], -(b[1] or 0.0), b[2])


def _rank(calibrated: bytes, representative, graph: OpGraph) -> list[tuple[str, float]]:
    """Op outputs by sensitivity, from TFLite's quantization debugger (see the module docstring), run on
    the calibrated model the mixes are made from, quantized with numeric verification: its ranges, its
    tensor names. (Given the converter, the debugger calibrated a model of its own, named by a new trace:
    none of its names were a chosen candidate's basis's, and the search went unranked.)"""
    from edgekit.converters.quantize import quantize_calibrated

    tf = import_tf()

    def samples():
        for i, sample in enumerate(representative()):
            if i >= DEBUG_SAMPLES:
                break
            yield sample

    options = tf.lite.experimental.QuantizationDebugOptions(
        layer_direct_compare_metrics={"channel_relative_error": channel_relative_error})
    with keras_prints_to_logging(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the debugger runs tf.lite.Interpreter, which warns it is deprecated
        debug_model = quantize_calibrated(calibrated, "float32", verify=True)
        debugger = tf.lite.experimental.QuantizationDebugger(quant_debug_model_content=debug_model,
                                                             debug_dataset=samples, debug_options=options)
        debugger.run()
    errors = {_verified_tensor(key): float(np.mean(stats["channel_relative_error"]))
              for key, stats in debugger.layer_statistics.items()}
    ranked = [(name, err) for name, err in errors.items() if name in graph.ops and graph.ops[name] != "SOFTMAX"]
    # a SOFTMAX is not ranked: its int8 output has TFLite's fixed 1/256 scale (no range to set), and the
    # relative error of probabilities near 0 rounded to 0 is near 1 whatever the model (it topped every
    # ranking once the output op was named right); its input is its producer's output, ranked as such
    return sorted(ranked, key=lambda kv: -kv[1])


def _search(converter, representative, measure, calibrated: bytes | None = None,
            float_kernels: bytes | None = None, keep_float: tuple[str, ...] = ()) -> _Search:
    from edgekit.converters.int8 import ranges
    from edgekit.runtime.schema import schema_module

    calibrated = calibrated or ranges.calibrated_model(converter)
    samples = list(representative())
    acts = ranges.collect(calibrated, samples, ["fit"] * len(samples))
    s = schema_module()
    graph = s.Model.GetRootAs(calibrated, 0).Subgraphs(0)
    index_of = {graph.Tensors(i).Name().decode(): i for i in range(graph.TensorsLength())}
    return _Search(calibrated, acts, index_of, measure, samples, float_kernels if calibrated else None,
                   keep_float=keep_float if calibrated else ())


def _trials(search: _Search, graph: OpGraph, ranked, plain: tuple[float, float | None], budget: float,
            max_trials: int | None, say) -> list[dict[str, Any]]:
    """Each sensitive tensor alone: its range clipped (percentile, MSE) and, failing that, in float.
    Without `max_trials`, the ranking is walked until PATIENCE tensors in a row bought nothing."""
    trials, idle = [], 0
    for name, err in ranked[:max_trials] if max_trials else ranked:
        best: dict[str, Any] | None = None
        for action, method in (("clip", "percentile"), ("clip", "mse"), ("float", None)):
            if action == "clip" and name not in search.index_of:
                continue
            tflite = search.build(graph.unit(name) if action == "float" else (),
                                  {name: method} if method is not None else None)  # None: float
            drop, agree = search.measure(tflite)
            trial = {"tensor": name, "action": action if action == "float" else f"clip:{method}",
                     "float_ops": list(graph.unit(name)) if action == "float" else [], "relative_error": round(err, 5),
                     "drop": round(drop, 3), "agreement": agree}
            trials.append(trial)
            say(Step(f"trial {len(trials)}: {graph.ops[name]} {name[:50]} {trial['action']} -> drop {drop:.2f}",
                     stage="autopilot trials", done=len(trials)))
            if best is None or _better_result((drop, agree, len(trial["float_ops"])),
                                              (best["drop"], best["agreement"], len(best["float_ops"]))):
                best = trial
            if action == "clip" and drop <= budget:
                break  # an int8 fix that fits: no need to try float
        assert best is not None  # float always runs, unless a clip that fits ran before it
        helped = _better_result((best["drop"], best["agreement"], 0), (plain[0], plain[1], 0))
        idle = 0 if helped else idle + 1
        if best["drop"] <= budget or (not max_trials and idle >= PATIENCE):
            break
    return trials


@dataclass
class _Costs:
    """What a mix costs against plain int8: each decision's record."""

    plain_size: int
    plain_p50: float

    @classmethod
    def of(cls, plain_tflite: bytes) -> _Costs:
        return cls(len(plain_tflite), _quick_p50(plain_tflite))

    def decision(self, candidate: bytes, float_ops: list[str], drop: float, agree, kept: bool,
                 **what) -> dict[str, Any]:
        p50 = _quick_p50(candidate)
        return {**what, "ops_in_float": len(float_ops), "drop": round(drop, 3), "agreement": agree, "kept": kept,
                "size_bytes": len(candidate), "size_cost_bytes": len(candidate) - self.plain_size,
                "p50_ms": round(p50, 4), "latency_cost_ms": round(p50 - self.plain_p50, 4)}


_Mix = tuple[float, float | None, int, bytes, list[str], dict[str, str]]  # drop, agreement, ops in float, file,
# float ops, clipped tensors (name -> method)


def _combine(search: _Search, trials, plain_tflite: bytes, plain, budget: float, result, costs: _Costs) -> tuple:
    """Add the trials that helped, best first; keep an addition only when it improves the mix."""
    best: _Mix = (plain[0], plain[1], 0, plain_tflite, [], {})
    useful = [t for t in trials if _better_result((t["drop"], t["agreement"], 0), (plain[0], plain[1], 0))]
    useful.sort(key=lambda t: (t["drop"], -(t["agreement"] or 0.0), len(t["float_ops"])))
    seen = set()
    for trial in useful:
        if trial["tensor"] in seen:
            continue  # one action per tensor: its best
        seen.add(trial["tensor"])
        float_ops = list(dict.fromkeys(best[4] + trial["float_ops"]))
        clipped = dict(best[5], **({trial["tensor"]: trial["action"][5:]} if trial["action"].startswith("clip") else {}))
        candidate = search.build(tuple(float_ops), clipped)
        drop, agree = search.measure(candidate)
        kept = _better_result((drop, agree, len(float_ops)), best[:3])
        result.decisions.append(costs.decision(candidate, float_ops, drop, agree, kept, tensor=trial["tensor"],
                                               action=trial["action"], keep_float=trial["float_ops"]))
        if kept:
            best = (drop, agree, len(float_ops), candidate, float_ops, clipped)
        if best[0] <= budget:
            break
    return best


def _accumulate(search: _Search, graph: OpGraph, order: list[str], best: tuple, budget: float, result,
                costs: _Costs, say, wide: bool = False, graph_order: bool = False) -> tuple | None:
    """No combination of single tensors met the budget: the first k tensors of `order` go to float (with
    `wide`, to int16x8) together, k bisected between none and all, then the ones the mix does not need go
    back to int8 (module docstring, step 4). A mix another order measured is not measured again. Returns the
    smallest mix that meets the budget, or None when not even all of them do. A mix is (drop, agreement, ops
    in float, file, float ops, clipped, int16 ops)."""
    base_ops, clipped = ([], {}) if wide else (best[4], best[5])  # int16x8 mixes are ai-edge-quantizer's files
    kind = ":int16x8" if wide else ":graph" if graph_order else ""

    def mix(chosen: list[int], action: str, tensor: str | None = None) -> tuple:
        ops = list(dict.fromkeys(base_ops + [op for i in chosen for op in graph.unit(order[i])]))
        key = (wide, frozenset(ops))
        if key in search.mixes:  # another order measured the same mix (every op in float, at least)
            return search.mixes[key], search.mixes[key][0] <= budget
        if not wide:
            candidate = search.build(tuple(ops), clipped)
            drop, agree = search.measure(candidate)
        else:
            try:
                candidate = search.build16(tuple(ops))
                drop, agree = search.measure(candidate)
            except (EdgekitError, ImportError, RuntimeError, ValueError) as exc:  # a quantizer or runtime that cannot
                say(f"{action}{kind}: {len(chosen)} of {len(order)} tensors: {one_line(exc)}")
                if len(chosen) == len(order):  # the first mix: the step is left out (a later one only misses)
                    result.int16_refused = one_line(exc)
                return None, False
        meets = drop <= budget
        float_ops, int16_ops = ([], ops) if wide else (ops, [])
        result.decisions.append(costs.decision(
            candidate, float_ops, drop, agree, meets, tensor=tensor or (order[chosen[0]] if chosen else None),
            action=action + kind, keep_float=[op for op in float_ops if op not in base_ops],
            **({"tensors_in_int16": len(chosen), "ops_in_int16": len(int16_ops)} if wide
               else {"tensors_in_float": len(chosen)})))
        say(Step(f"mix {len(result.decisions)}, {action}{kind}: {len(chosen)} of {len(order)} tensors, {len(ops)} "
                 f"ops in {'int16x8' if wide else 'float'} -> drop {drop:.2f}", stage="autopilot mixes",
                 done=len(result.decisions)))
        search.mixes[key] = (drop, agree, len(float_ops), candidate, float_ops, clipped, int16_ops)
        return search.mixes[key], meets

    every, meets = mix(list(range(len(order))), "accumulate")
    if not wide and every is not None:
        result.every_op_float_drop = every[0]
    if not meets:
        return None
    lo, hi, found = 0, len(order), every  # lo misses (the mix so far), hi meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got, meets = mix(list(range(mid)), "accumulate")
        lo, hi, found = (lo, mid, got) if meets else (mid, hi, found)
    return _shrink(list(range(hi)), found, lambda chosen, first: mix(chosen, "unneeded", tensor=order[first]))


def _shrink(chosen: list[int], found: tuple, mix: Callable[[list[int], int], tuple]) -> tuple:
    """The tensors of an accumulated mix that it does not need, taken back out: chunks of them at a time,
    last in the order first, the chunks halving down to single tensors (delta debugging), at most
    `UNNEEDED_TRIALS` mixes. The bisection's first k tensors hold the few the budget needs wherever
    the order put them: on an EfficientNetB0 it needed the 217 most sensitive of 303, which one tensor
    at a time (the 12 least sensitive) left 251 ops in float. The last tensor added stays (one fewer missed)."""
    keep, tries, size = chosen[-1], 0, max(1, (len(chosen) - 1) // 2)
    while tries < UNNEEDED_TRIALS:
        removable = [c for c in reversed(chosen) if c != keep]
        for chunk in [removable[k:k + size] for k in range(0, len(removable), size)]:
            if tries >= UNNEEDED_TRIALS:
                break
            got, meets = mix([c for c in chosen if c not in chunk], chunk[0])
            tries += 1
            if meets and got is not None:
                chosen, found = [c for c in chosen if c not in chunk], got
        if size == 1:
            break
        size = max(1, size // 2)
    return found


def _accumulated(search: _Search, graph: OpGraph, ranked, best: tuple, budget: float, result, costs: _Costs, say,
                 int16: bool) -> tuple:
    """No combination of single tensors met the budget: the accumulating search (module docstring, step 4)
    in two orders, with `int16` first at int16x8 activations; of the mixes that meet it, the fastest
    (`_fastest`)."""
    say(f"no combination of single tensors met the budget (best {best[0]:.2f} points): accumulating"
        + (", int16x8 activations first, then float" if int16 else ""))
    by_sensitivity = [name for name, _ in ranked]
    by_sensitivity += [name for name in graph.ops if name not in set(by_sensitivity)]  # unranked ops: last
    found: dict[str, tuple | None] = {}
    if int16:
        found["int16x8"] = _accumulate(search, graph, by_sensitivity, best, budget, result, costs, say, wide=True)
    found["float"] = _accumulate(search, graph, by_sensitivity, best, budget, result, costs, say)
    if found["float"] is not None:  # every op in float met it: so does the graph order's last mix
        say("the float mix in graph order next (from the input), the fastest file kept")
        found["float in graph order"] = _accumulate(search, graph, list(graph.ops), best, budget, result, costs, say,
                                                  graph_order=True)
    met: dict[str, tuple] = {}
    for name, mix in found.items():  # two orders may end at the same mix: it is timed once, under the first name
        if mix is not None and all(mix[3] != other[3] for other in met.values()):
            met[name] = mix
    return _fastest(met, result, say) if len(met) > 1 else next(iter(met.values()), best)


def _fastest(mixes: dict[str, tuple], result: AutopilotResult, say) -> tuple:
    """Of the mixes that met the budget, the fastest on one CPU thread (timed interleaved); within
    `intervals.NO_SLOWER` of it, the smallest file. The sensitivity order keeps the ops its ranking names,
    scattered over the graph: each float island pays a QUANTIZE and a DEQUANTIZE, and a lone 1x1 conv in
    float costs 3-11 % of an EfficientNetB0's p50; the graph order's mix is mostly one region from the
    input. On the benchmark's EfficientNetB0 (`--max-drop 0.5`) the sensitivity order met the budget with 42
    of 239 ops in float at 1.20x the int8 file's p50, the graph order with 19 at 1.02x. TFLite's int16x8
    kernels are reference code that XNNPACK does not run (every op at int16: 37x int8's p50)."""
    from edgekit.converters.dominance import interleaved_p50
    from edgekit.intervals import NO_SLOWER, no_slower

    p50 = dict(zip(mixes, interleaved_p50([mix[3] for mix in mixes.values()])))
    fastest = min(p50, key=lambda k: p50[k])
    near = [k for k in mixes if no_slower(p50[k], p50[fastest])]
    chosen = min(near, key=lambda k: len(mixes[k][3]))
    runner_up = sorted(p50, key=lambda k: p50[k])[1]
    why = (f"the smallest file within {NO_SLOWER:g}x of the fastest" if len(near) > 1
           else f"{p50[runner_up] / p50[chosen]:.2f}x faster than the {runner_up} mix")
    result.latency_choice = {"mixes": [
        {"name": name, "p50_ms": round(p50[name], 4), "size_bytes": len(mix[3]), "drop": round(mix[0], 3),
         "ops": len(mix[6] if name == "int16x8" else mix[4])} for name, mix in mixes.items()],
        "chosen": chosen, "reason": why}
    say(f"{len(mixes)} mixes met the budget: {chosen} kept, {why} ("
        + "; ".join(f"{name} {p50[name]:.3f} ms" for name in mixes) + ")")
    return mixes[chosen]


def _try_float16_weights(result: AutopilotResult, measure, say) -> None:
    """The mix's float ops with their weights stored as float16 (converters/fp16_weights.py): kept when it
    loses nothing -- no more drop and no less agreement with the float model than float32 weights."""
    from edgekit.converters.fp16_weights import float16_weights

    candidate, stored = float16_weights(result.tflite)
    if not stored:
        return
    drop, agree = measure(candidate)
    kept = drop <= result.drop and (agree or 0.0) >= (result.agreement or 0.0)
    result.float16_weights = {"constants": stored, "size_bytes": len(candidate),
                              "size_saved_bytes": len(result.tflite) - len(candidate), "drop": round(drop, 3),
                              "agreement": agree, "kept": kept}
    say(f"float16 weights for the float ops: drop {drop:.2f}, {len(result.tflite) - len(candidate):,} bytes "
        "smaller" + ("" if kept else " (lost accuracy: float32 weights kept)"))
    if kept:
        result.tflite, result.drop, result.agreement = candidate, drop, agree


def autopilot(converter, representative: Callable[[], Iterable], plain: bytes,
              evaluate: Callable[[bytes], Any], float_top1: float, budget_points: float, *,
              max_trials: int | None = None, eval_samples: int | None = None, int16: bool = False,
              progress=None, calibrated: bytes | None = None, float_kernels: bytes | None = None,
              keep_float: tuple[str, ...] = ()) -> AutopilotResult:
    """`converter` is configured for int8 with `representative`; `plain` is its output; `evaluate` gives
    top-1 of a .tflite on the evaluation data, or (top-1, agreement with the float model). The mixes are made
    from `calibrated`, the calibrated model `plain` was quantized from, where given (else the converter's):
    a mix of the converter's min/max model starts from a worse file than a `plain` of better ranges or
    corrected biases, and loses what they bought for every op it keeps in int8. `float_kernels`: where
    `calibrated`'s constants were changed for int8 (GPTQ's rounded kernels, corrected biases), the model
    whose constants the ops kept in float take; `keep_float`: ops `plain` keeps in float (its float head),
    kept so in every mix. Returns
    the first mix within the budget (where the accumulating search ran, the fastest of its mixes that meet it),
    or the best one found (least drop, then most agreement) when none fits."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()

    def measure(tflite: bytes) -> tuple[float, float | None]:
        got = evaluate(tflite)
        top1, agree = got if isinstance(got, tuple) else (got, None)
        # rounded once, here: trials store this value, and every comparison must see the same one
        return round(100.0 * (float_top1 - top1), 3), agree

    plain_result = measure(plain)
    graph = OpGraph.of(plain)
    result = AutopilotResult(plain, plain_result[0] <= budget_points, budget_points, float_top1, plain_result[0],
                             plain_result[0], total_ops=len(graph.ops), plain_agreement=plain_result[1])
    if eval_samples:
        result.resolution_points = 100.0 / eval_samples
        if budget_points < result.resolution_points and not result.met:
            say(f"`budget.max_drop` {budget_points:g} is below what {eval_samples} images resolve (one image = "
                f"{result.resolution_points:.2f} points): it means losing no image; ties go to agreement with float")
    if result.met:
        result.seconds = time.perf_counter() - started
        return result
    say(f"int8 loses {plain_result[0]:.2f} points (budget {budget_points:g}): ranking layers by quantization error")
    search = _search(converter, representative, measure, calibrated, float_kernels, keep_float)
    # ops are named as in the calibrated model: the names TFLite's quantizer matches `denylisted_nodes` against
    # and ai-edge-quantizer's scopes. Its int8 model renames a graph output's int8 tensor ('...:0' becomes
    # '...:01', the DEQUANTIZE after it takes the name), and a denylist of those names left the last op, the
    # SOFTMAX, in int8: "every op in float" lost 8.89 points on an EfficientNetB0 whose float file lost none.
    graph = OpGraph.of(search.calibrated)
    result.total_ops = len(graph.ops)
    ranked = _rank(search.calibrated, representative, graph)
    result.sensitivity = [{"tensor": name, "op": graph.ops[name], "relative_error": round(err, 5)}
                          for name, err in ranked]
    result.trials = _trials(search, graph, ranked, plain_result, budget_points, max_trials, say)
    costs = _Costs.of(plain)
    best = _combine(search, result.trials, plain, plain_result, budget_points, result, costs)
    best = (*best, [])
    if best[0] > budget_points:
        best = _accumulated(search, graph, ranked, best, budget_points, result, costs, say, int16)
    result.drop, result.agreement, _, result.tflite, result.float_ops, result.clipped, result.int16_ops = best
    if result.float_ops:
        _try_float16_weights(result, measure, say)
    result.met = result.drop <= budget_points
    result.seconds = time.perf_counter() - started
    return result
