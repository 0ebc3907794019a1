"""Activation ranges for post-training int8: the converter's calibrated model, its recorded ranges, the
float activations sampled on calibration data, ranges proposed from them by a clip rule, and the int8 file
quantized by TFLite's own quantizer (`mlir_quantize`) with those ranges.

The candidates in this folder fit their files with these; `int8.choose` scores them and keeps one. The
quantizer itself is TFLite's, fed the edited ranges, so every op's constraints (shared scales of concat and
pooling, fixed softmax scales) stay TFLite's business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from edgekit.converters.feeding import debugging_interpreter, feeder
from edgekit.converters.quantize import quantize_calibrated, run_converter

VALUES_PER_TENSOR = 1 << 16  # sampled activation values kept per tensor, over all samples


def calibrated_model(converter, before: Callable[[bytes], None] | None = None) -> bytes:
    """The float model with the converter's calibration ranges recorded on its tensors. `before` sees the
    float model before it is calibrated and may raise to stop there: the calibration, as long as the
    converter's whole conversion on a large model (basic-pitch: 16 s of 19), is then not spent on a model
    that is thrown away. Its exception comes out as it was raised."""
    stopped: list[BaseException] = []
    quantize_model = getattr(converter, "_quantize", None)  # TFLiteConverterBase's step that calibrates
    if before is not None and quantize_model is not None:
        def checked(model, *args, **kwargs):
            try:
                before(model)
            except Exception as exc:  # raised again past the converter's own handling
                stopped.append(exc)
                raise
            return quantize_model(model, *args, **kwargs)

        converter._quantize = checked
    converter._experimental_calibrate_only = True
    try:
        made = run_converter(converter)
    except Exception:
        if stopped:
            raise stopped[0] from None
        raise
    finally:
        converter._experimental_calibrate_only = False
        if before is not None and quantize_model is not None:
            del converter._quantize  # the class's own again
    if before is not None and quantize_model is None:  # a converter without the step: seen once calibrated
        before(made)
    return made


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


def of_int8_file(int8: bytes, calibrated: bytes) -> dict[int, tuple[float, float]]:
    """The ranges another quantizer gave the calibrated model's activations: tensor index in `calibrated` ->
    the (lo, hi) that an int8 tensor of the same name in `int8` spans with its scale and zero point (per
    tensor; constants, per-channel and other types are left to the recorded ones)."""
    from edgekit.runtime.inspect import operators

    their_view, theirs, _ = operators(int8)
    our_view, ours, _ = operators(calibrated)
    by_name = {t.name: t for t in theirs.tensors
               if t.type_name == "INT8" and their_view.buffer_bytes(t.buffer) is None}
    found: dict[int, tuple[float, float]] = {}
    for tensor in ours.tensors:
        other = by_name.get(tensor.name)
        q = None if other is None else other.quantization
        if q is None or len(q.scales) != 1 or our_view.buffer_bytes(tensor.buffer) is not None:
            continue
        scale, zero = float(q.scales[0]), int(q.zero_points[0]) if len(q.zero_points) else 0
        found[tensor.index] = ((-128 - zero) * scale, (127 - zero) * scale)
    return found


def scored_tensor(tflite: bytes, output: str | None = None) -> int:
    """The graph tensor of the output the model's signature names `output` (the source model's first output:
    TFLite may list the graph's outputs in another order); the graph's first output without one."""
    from edgekit.runtime.schema import unpack

    return _named_output(unpack(tflite), output)


def _named_output(model, output: str | None) -> int:
    graph = model.subgraphs[0]
    signatures = model.signatureDefs or [] if output is not None else []
    for signature in signatures:
        for entry in signature.outputs or []:
            name = entry.name.decode() if isinstance(entry.name, bytes) else entry.name
            if name == output and int(entry.tensorIndex) in [int(t) for t in graph.outputs]:
                return int(entry.tensorIndex)
    return int(graph.outputs[0])


def logits_view(tflite: bytes, output: str | None = None) -> bytes | None:
    """The model with its first output (`scored_tensor`) moved to the logits: the input of the SOFTMAX that
    makes it (through a DEQUANTIZE in an int8 model with float outputs), first among the graph's outputs and
    under its name in the signature; None when no SOFTMAX makes it. Probabilities of training-like samples
    are one-hot to within the int8 output's fixed 1/256 step, so every range method scores the same SNR there
    (a MobileNetV3Small: 48.2 dB each); the logits still tell them apart."""
    from edgekit.runtime.schema import pack, unpack

    s = _schema()
    model = unpack(tflite)
    graph = model.subgraphs[0]

    def code(op) -> int:
        c = model.operatorCodes[op.opcodeIndex]
        return max(c.builtinCode, c.deprecatedBuiltinCode)

    producer = {t: op for op in graph.operators for t in op.outputs}
    first = _named_output(model, output)
    op = producer.get(first)
    if op is not None and code(op) == s.BuiltinOperator.DEQUANTIZE:
        op = producer.get(int(op.inputs[0]))
    if op is None or code(op) != s.BuiltinOperator.SOFTMAX:
        return None
    logits = int(op.inputs[0])
    # the probabilities stay an output (second): a SOFTMAX feeding nothing would be dropped by TFLite's
    # export, and ai-edge-quantizer's file is refused when its ops change there (converters/int8/aeq_quantizer.py)
    graph.outputs = [logits, first, *(int(t) for t in graph.outputs if int(t) != first)]
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
    positions: dict[str, list[int]] = field(default_factory=dict)  # each group's rows: the samples' positions

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
    row_of: list[int] = []
    count: dict[str, int] = {}
    for j, group in enumerate(groups):  # each sample's row in its group's arrays
        row_of.append(count.get(group, 0))
        count[group] = row_of[-1] + 1
        acts.positions.setdefault(group, []).append(j)
    picks: dict[int, np.ndarray | None] = {}
    for j, (sample, group) in enumerate(zip(samples, groups)):
        feed(sample)
        bucket = acts.values.setdefault(group, {})
        for index in recorded:
            v = interp.get(index).ravel()
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
            pick = picks[index]
            row[2:] = v if pick is None else v[pick[j]]
    return acts


Clip = Callable[[np.ndarray, float, float], tuple[float, float]]  # a tensor's values, their range -> its range


def from_sample_extremes(acts: Activations, groups: Iterable[str],
                         reduce: Callable[[np.ndarray], tuple[float, float]]) -> dict[int, tuple[float, float]]:
    """index -> (lo, hi) by `reduce` of each sample's exact (min, max) over the `groups` samples ([n, 2],
    float64, in calibration order), 0 included; the recorded range where nothing was collected or the
    result is empty (`ema`, `extremes`)."""
    found = {}
    for index, recorded in acts.recorded.items():
        kept = [g for g in groups if index in acts.values.get(g, {})]
        if not kept:
            found[index] = recorded
            continue
        order = np.argsort(np.concatenate([acts.positions[g] for g in kept]), kind="stable")
        lo, hi = reduce(np.concatenate([acts.values[g][index][:, :2] for g in kept])[order].astype(np.float64))
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        found[index] = (lo, hi) if hi > lo else recorded
    return found


def propose(acts: Activations, clip: Clip, groups: Iterable[str],
            only: set[int] | None = None) -> dict[int, tuple[float, float]]:
    """index -> (lo, hi) by a range method's `clip` (`int8.range_setting.clip_of(name)`) from the values of
    `groups` (of the tensors in `only`, else all)."""
    groups = tuple(groups)
    ranges = {}
    for index, recorded in acts.recorded.items():
        if only is not None and index not in only:
            continue
        v = acts.pooled(groups, index)
        if v.size == 0:
            ranges[index] = recorded
            continue
        lo, hi = clip(v, float(min(v.min(), 0.0)), float(max(v.max(), 0.0)))
        if hi - lo <= 0:
            lo, hi = recorded
        ranges[index] = (lo, hi)
    return ranges
