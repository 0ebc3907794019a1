"""Checks a .tflite must pass before LiteRT's native code sees it.

The interpreter trusts the flatbuffer: a zeroed scale, a zero point outside its type, a pooling
window of -1 or a tensor index past the end crash the process (SIGSEGV, SIGFPE) instead of raising.
These are the values such crashes were found with when fuzzing; each becomes a one-line
ModelFormatError here. It is not a sandbox: untrusted models belong in a separate process.
"""

from __future__ import annotations

import math

import numpy as np

from edgekit.errors import MissingDependencyError, ModelFormatError
from edgekit.runtime import graph_rules, op_rules
from edgekit.runtime.flatbuffer import ModelView, OperatorView, TensorView, corrupt_as_format_error
from edgekit.runtime.schema import schema_module

_INT_RANGES = {"INT8": (-128, 127), "UINT8": (0, 255), "INT16": (-32768, 32767), "UINT16": (0, 65535),
               "INT4": (-8, 7)}
_WINDOW_OPTIONS = {"Conv2DOptions": ("StrideW", "StrideH", "DilationWFactor", "DilationHFactor"),
                   "DepthwiseConv2DOptions": ("StrideW", "StrideH", "DilationWFactor", "DilationHFactor",
                                              "DepthMultiplier"),
                   "Pool2DOptions": ("StrideW", "StrideH", "FilterWidth", "FilterHeight"),
                   "TransposeConvOptions": ("StrideW", "StrideH"),
                   "Conv3DOptions": ("StrideD", "StrideW", "StrideH")}

# options whose count the kernel trusts to size its outputs: it must equal the op's number of outputs
_OUTPUT_COUNTS = {"SplitOptions": "NumSplits", "SplitVOptions": "NumSplits", "UnpackOptions": "Num"}

_DETECTION_INTS = ("max_detections", "max_classes_per_detection", "num_classes")
_DETECTION_FLOATS = ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale", "w_scale")


def _check_detection_options(raw: bytes, where: str, index: int) -> None:
    """TFLite_Detection_PostProcess reads its flexbuffer options without checking them: a missing key
    crashed the interpreter in fuzzing. Require every key, with sane values."""
    from flatbuffers import flexbuffers

    try:
        options = flexbuffers.Loads(raw)
    except Exception:  # noqa: BLE001
        options = None
    if not isinstance(options, dict):
        raise ModelFormatError(f"{where}: operator {index} (detection post-processing) has unreadable options")
    missing = [k for k in _DETECTION_INTS + _DETECTION_FLOATS if k not in options]
    if missing:
        raise ModelFormatError(f"{where}: operator {index} (detection post-processing) lacks {', '.join(missing)}")
    for key in _DETECTION_INTS:
        if not isinstance(options[key], int) or not 1 <= options[key] <= 100_000:
            raise ModelFormatError(f"{where}: operator {index} has {key} = {options[key]!r}")
    for key in _DETECTION_FLOATS:
        value = options[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ModelFormatError(f"{where}: operator {index} has {key} = {value!r}")


def validate(model: bytes | ModelView, where: str = "model") -> None:
    """Raise ModelFormatError when the flatbuffer holds values known to crash the interpreter."""
    view = ModelView.of(model, where)
    try:
        with corrupt_as_format_error(where):
            _validate(view, where)
    except MissingDependencyError:
        return  # tflite_runtime without ai-edge-litert: no schema module to check with


# TensorType values of the graph inputs and outputs that `Model` feeds from numbers and reads as numbers:
# floats, integers and bool. STRING, COMPLEX, RESOURCE, VARIANT, INT4/INT2/UINT4, BFLOAT16 and FLOAT8 are not
# (a string or a complex value is no float; LiteRT gives the packed and 8-bit types raw int8/uint8 bits, or no
# array at all).
# Numbers, not names: the check holds beside tflite-runtime alone (no schema module).
NUMERIC_IO_TYPES = {0: "FLOAT32", 1: "FLOAT16", 2: "INT32", 3: "UINT8", 4: "INT64", 6: "BOOL", 7: "INT16",
                    9: "INT8", 10: "FLOAT64", 12: "UINT64", 15: "UINT32", 16: "UINT16"}


def check_io_types(view: ModelView, where: str = "model") -> None:
    """ModelFormatError naming the first graph input or output (of the subgraph the interpreter runs) whose
    type is not a number: the runtime fails on the first float fed to it (STRING: "could not convert string
    to float") or reads it as a wrong number (a complex value's real part)."""
    with corrupt_as_format_error(where):
        sub = view.first_subgraph()
        named = {(kind, index): name for s in view.signatures if s.subgraph == sub.index
                 for kind, pairs in (("input", s.inputs), ("output", s.outputs)) for name, index in pairs}
        for kind, indices in (("input", sub.inputs), ("output", sub.outputs)):
            for i in indices:
                if 0 <= i < len(sub.tensors) and sub.tensors[i].type not in NUMERIC_IO_TYPES:
                    name = named.get((kind, i), sub.tensors[i].name)
                    raise ModelFormatError(f"{where}: {kind} {name[:80]!r} holds {_type_words(sub.tensors[i])}; "
                                           "edgekit's runtime feeds and reads numbers only (float, integer and "
                                           "bool tensors)")
                # an index past the tensors is the preflight's to refuse


def _type_words(tensor: TensorView) -> str:
    """"STRING values"; "values of type 5" without the schema module, or for a type it does not know."""
    try:
        type_name = tensor.type_name
    except MissingDependencyError:
        type_name = None
    return f"{type_name} values" if type_name else f"values of type {tensor.type}"


def _check_storage(view: ModelView, where: str) -> None:
    """Where the tensors' bytes are, checked without the schema module (so also beside tflite-runtime alone):
    every buffer inside the file, no tensor kept in an external file."""
    for i in range(view.buffer_count):  # offsets are uint64: LiteRT's sum wraps (2^64-16 read before the file)
        b = view.buffer(i)
        if b.offset > 1 and b.offset + b.size > len(view.data):
            raise ModelFormatError(f"{where}: buffer {i} points past the end of the file (offset {b.offset}, "
                                   f"size {b.size})")
    for sub in view.subgraphs:
        for tensor in sub.tensors:
            if tensor.external_buffer:
                raise ModelFormatError(f"{where}: tensor {tensor.index} ({tensor.name!r}) keeps its data in an "
                                       "external buffer; edgekit reads no file a model names")


def _validate(view: ModelView, where: str) -> None:
    _check_storage(view, where)
    schema_module()
    if not view.subgraphs:
        raise ModelFormatError(f"{where}: has no subgraph")
    custom_codes = view.custom_codes
    graph_rules.check_signatures(view, where)
    for sub in view.subgraphs:
        zero_ok = _zero_scale_ok(view, sub)
        for tensor in sub.tensors:
            _check_tensor(tensor, view.buffer_count, where, tensor.index in zero_ok)
        n_tensors = len(sub.tensors)
        for kind, indices in (("input", sub.inputs), ("output", sub.outputs)):
            for i, t in enumerate(indices):
                if not 0 <= t < n_tensors:
                    raise ModelFormatError(f"{where}: subgraph {kind} {i} points past the tensors")
        for op in sub.operators:
            if op.opcode_index >= len(custom_codes):
                raise ModelFormatError(f"{where}: operator {op.index} uses op code {op.opcode_index} "
                                       f"of {len(custom_codes)}")
            if any(not -1 <= t < n_tensors for t in op.inputs + op.outputs):
                raise ModelFormatError(f"{where}: operator {op.index} points past the tensors")
            if custom_codes[op.opcode_index] == "TFLite_Detection_PostProcess":
                _check_detection_options(op.custom_options, where, op.index)
            op_rules.check_operands(view, op, where)
            op_rules.check_quantization(view, op, sub.tensors, where)
            op_rules.check_option_ranges(op, where)
            _check_options(op, where)
            _check_rescale(view, op, sub.tensors, where)
        graph_rules.check_strings(view, sub, where)
        graph_rules.check_memory(view, sub, where)
    graph_rules.check_calls(view, where)


# int16x8 conversion of an LSTM gives the zeros of its initial state (a constant and the FILL of it) a scale
# of 0: a quantized zero is zero at any scale, and these kernels only multiply by it (the multiplier becomes
# 0; nothing divides by it). Read by any other op, or written by one, a zero scale is refused.
ZERO_SCALE_READERS = frozenset({"FILL", "FULLY_CONNECTED", "MUL"})
ZERO_SCALE_WRITERS = frozenset({"FILL"})


def _zero_scale_ok(view, sub) -> set[int]:
    """The tensors of `sub` whose scales may be exactly 0 (zero point 0): constants or FILL outputs that
    only ZERO_SCALE_READERS read."""
    zeros = set()
    for tensor in sub.tensors:
        q = tensor.quantization
        if q is not None and len(q.scales) and not np.any(np.asarray(q.scales) != 0) \
                and not np.any(np.asarray(q.zero_points) != 0):
            zeros.add(tensor.index)
    zeros -= set(sub.inputs) | set(sub.outputs)
    if not zeros:
        return zeros
    custom_codes = view.custom_codes
    for op in sub.operators:
        name = view.op_name(op) if op.opcode_index < len(custom_codes) else None  # a bad index is refused later
        zeros -= {t for t in op.inputs if name not in ZERO_SCALE_READERS}
        zeros -= {t for t in op.outputs if name not in ZERO_SCALE_WRITERS}
    return zeros


def _check_tensor(tensor: TensorView, n_buffers: int, where: str, zero_scale_ok: bool = False) -> None:
    """A known type, no negative dimension, a buffer in the list, and quantization the kernels can use
    (`zero_scale_ok`: a scale of exactly 0 is allowed, see _zero_scale_ok)."""
    t, kind, shape = tensor.index, tensor.type_name, tensor.shape
    if kind is None:
        raise ModelFormatError(f"{where}: tensor {t} has unknown type {tensor.type}")
    if any(d < 0 for d in shape):
        raise ModelFormatError(f"{where}: tensor {t} has a negative dimension {list(shape)}")
    if tensor.buffer >= n_buffers:
        raise ModelFormatError(f"{where}: tensor {t} points to buffer {tensor.buffer} of {n_buffers}")
    q = tensor.quantization
    if q is None or len(q.scales) == 0:
        return
    positive = all(math.isfinite(float(v)) and (v > 0 or (zero_scale_ok and v == 0)) for v in q.scales)
    if (kind in _INT_RANGES or kind in ("INT32", "INT64")) and not positive:
        raise ModelFormatError(f"{where}: tensor {t} ({tensor.name!r}) has a quantization scale that is "
                               "not positive")
    if kind in _INT_RANGES and len(q.zero_points):
        lo, hi = _INT_RANGES[kind]
        if q.zero_points.min() < lo or q.zero_points.max() > hi:
            raise ModelFormatError(f"{where}: tensor {t} has a zero point outside {kind}")
    if len(q.scales) > 1 and not 0 <= q.axis < max(1, len(shape)):
        raise ModelFormatError(f"{where}: tensor {t} is quantized along a dimension it does not have")
    if len(q.zero_points) not in (0, len(q.scales)):
        raise ModelFormatError(f"{where}: tensor {t} has {len(q.scales)} scales but {len(q.zero_points)} zero points")


# int8/uint8 ADD and SUB rescale both inputs to twice the larger input scale with 20 bits of headroom, then
# to the output scale; LiteRT aborts (TFLITE_CHECK in QuantizeMultiplierSmallerThanOneExp) when that last
# multiplier, 2 * max(input scales) / (2**20 * output scale), is not below 1
RESCALED = frozenset({"ADD", "SUB"})
_RESCALE_SHIFT = {"INT8": 20, "UINT8": 20}


def least_output_scale(top: float, type_name: str) -> float | None:
    """The least float32 output scale an int8/uint8 ADD or SUB takes beside a larger input scale `top`
    (2 * top < 2**20 * scale, as the kernel computes it, in double); None for the types it does not check."""
    shift = _RESCALE_SHIFT.get(type_name)
    if shift is None:
        return None
    s = np.float32(2.0 * top / float(2**shift))
    while not 2.0 * top < float(2**shift) * float(s):
        s = np.nextafter(s, np.float32(np.inf))
    return float(s)


def rescale_gap(view: ModelView, op: OperatorView, tensors: tuple[TensorView, ...]) -> tuple[float, float] | None:
    """(output scale, larger input scale) of an int8 ADD/SUB whose output scale its kernel cannot take, else
    None. QAT on an untrained MobileNetV3Small learned an ADD output scale of 6.5e-9 beside an input's
    0.0039: SIGABRT in the kernel's Prepare."""
    if len(op.inputs) != 2 or len(op.outputs) != 1 or min(op.inputs + op.outputs) < 0:
        return None
    out = tensors[op.outputs[0]]
    if out.type_name not in _RESCALE_SHIFT or view.op_name(op) not in RESCALED:
        return None
    first, second, scale = [_scale(tensors[i]) for i in op.inputs] + [_scale(out)]
    if first is None or second is None or scale is None:
        return None
    top = max(first, second)
    least = least_output_scale(top, out.type_name)  # a float: the type is one it checks (above)
    return (scale, top) if least is not None and scale < least else None


def _check_rescale(view: ModelView, op: OperatorView, tensors: tuple[TensorView, ...], where: str) -> None:
    gap = rescale_gap(view, op, tensors)
    if gap is not None:
        raise ModelFormatError(
            f"{where}: operator {op.index} ({view.op_name(op)} -> {tensors[op.outputs[0]].name!r}) has output "
            f"scale {gap[0]:.3g}, under 2^-19 of its input's {gap[1]:.3g}: LiteRT's int8 kernel aborts on it (a "
            "quantization range that collapsed)")


def _scale(tensor: TensorView) -> float | None:
    q = tensor.quantization
    return float(q.scales[0]) if q is not None and len(q.scales) == 1 else None


def _check_options(op: OperatorView, where: str) -> None:
    """Builtin options the kernels use unchecked: window sizes below 1, split counts that are not the
    number of outputs (SPLIT with num_splits 0 or 7 on two outputs crashed the interpreter)."""
    name = op.options_type_name or ""
    fields, count = _WINDOW_OPTIONS.get(name), _OUTPUT_COUNTS.get(name)
    if not (fields or count):
        return
    options = op.options(name)
    if options is None:
        return
    for field in fields or ():
        if getattr(options, field)() < 1:
            raise ModelFormatError(f"{where}: operator {op.index} has {field} < 1")
    if count and getattr(options, count)() != len(op.outputs):
        raise ModelFormatError(f"{where}: operator {op.index} has {count} = {getattr(options, count)()} "
                               f"but {len(op.outputs)} outputs")
