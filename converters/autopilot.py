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
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from edgekit.converters._tf import import_tf, keras_prints_to_logging

SKIP_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})
DEBUG_SAMPLES = 64


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
    def of(cls, tflite: bytes) -> "OpGraph":
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
    total_ops: int = 0
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_points": self.budget_points, "met": self.met, "eval_data": self.eval_data,
            "float_top1": round(self.float_top1, 5), "plain_int8_drop": round(self.plain_drop, 3),
            "drop": round(self.drop, 3), "float_ops": self.float_ops, "total_ops": self.total_ops,
            "float_share": round(len(self.float_ops) / self.total_ops, 4) if self.total_ops else 0.0,
            "sensitivity": self.sensitivity[:10], "trials": self.trials, "decisions": self.decisions,
            "seconds": round(self.seconds, 2),
        }


def _quick_p50(tflite: bytes, runs: int = 50) -> float:
    """Median invoke time (ms) on one CPU thread, for what a decision cost; `edgekit bench` is the full story."""
    from edgekit.runtime.timing import time_invokes
    from edgekit.runtime.model import Model

    model = Model(tflite, delegate="cpu", num_threads=1)
    for info in model.inputs:
        model.interpreter.set_tensor(info.index, np.zeros(info.shape, info.dtype))
    time_invokes(model.interpreter, 5)
    return float(np.median(time_invokes(model.interpreter, runs)))


def autopilot(converter, representative: Callable[[], Iterable], plain: bytes,
              evaluate: Callable[[bytes], float], float_top1: float, budget_points: float, *,
              max_trials: int = 8, progress=None) -> AutopilotResult:
    """`converter` is configured for int8 with `representative`; `plain` is its output; `evaluate` gives
    top-1 of a .tflite on the evaluation data. Returns the first mix (in trial order) within the budget,
    or the best one found when none fits."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    drop_of = lambda tflite: float(100.0 * (float_top1 - evaluate(tflite)))  # noqa: E731
    plain_drop = drop_of(plain)
    graph = OpGraph.of(plain)
    result = AutopilotResult(plain, plain_drop <= budget_points, budget_points, float_top1, plain_drop,
                             plain_drop, total_ops=len(graph.ops))
    if result.met:
        result.seconds = time.perf_counter() - started
        return result
    say(f"int8 loses {plain_drop:.2f} points (budget {budget_points:g}): ranking layers by quantization error")
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
        debugger = tf.lite.experimental.QuantizationDebugger(converter=converter, debug_dataset=samples,
                                                             debug_options=options)
        debugger.run()
    errors = {_verified_tensor(key): float(np.mean(stats["channel_relative_error"]))
              for key, stats in debugger.layer_statistics.items()}
    ranked = sorted(((name, err) for name, err in errors.items() if name in graph.ops), key=lambda kv: -kv[1])
    result.sensitivity = [{"tensor": name, "op": graph.ops[name], "relative_error": round(err, 5)}
                          for name, err in ranked]

    def quantize_without(float_ops: tuple[str, ...]) -> bytes:
        with keras_prints_to_logging(), warnings.catch_warnings():  # setting options re-quantizes
            warnings.simplefilter("ignore")
            debugger.options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=list(float_ops))
            return debugger.get_nondebug_quantized_model()

    for name, err in ranked[:max_trials]:
        unit = graph.unit(name)
        drop = drop_of(quantize_without(unit))
        result.trials.append({"tensor": name, "float_ops": list(unit), "relative_error": round(err, 5),
                              "drop": round(drop, 3)})
        say(f"trial: {graph.ops[name]} {name[:60]} in float -> drop {drop:.2f}")
    base_size, base_p50 = len(plain), _quick_p50(plain)
    best = (plain_drop, 0, plain, [])
    chosen: list[str] = []
    for trial in sorted(result.trials, key=lambda t: (t["drop"], len(t["float_ops"]))):
        if trial["drop"] >= plain_drop:
            continue  # bought nothing alone; a later mix may still need it, but never first
        chosen = list(dict.fromkeys(chosen + trial["float_ops"]))
        candidate = quantize_without(tuple(chosen))
        drop = drop_of(candidate)
        p50 = _quick_p50(candidate)
        result.decisions.append({
            "keep_float": trial["float_ops"], "ops_in_float": len(chosen), "drop": round(drop, 3),
            "size_bytes": len(candidate), "size_cost_bytes": len(candidate) - base_size,
            "p50_ms": round(p50, 4), "latency_cost_ms": round(p50 - base_p50, 4),
        })
        if (drop, len(chosen)) < best[:2]:
            best = (drop, len(chosen), candidate, list(chosen))
        if drop <= budget_points:
            break
    result.drop, _, result.tflite, result.float_ops = best
    result.met = result.drop <= budget_points
    result.seconds = time.perf_counter() - started
    return result
