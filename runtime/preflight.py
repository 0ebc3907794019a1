"""Checks a .tflite must pass before LiteRT's native code sees it.

The interpreter trusts the flatbuffer: a zeroed scale, a zero point outside its type, a pooling
window of -1 or a tensor index past the end crash the process (SIGSEGV, SIGFPE) instead of raising.
These are the values such crashes were found with when fuzzing; each becomes a one-line
ModelFormatError here. It is not a sandbox: untrusted models belong in a separate process.
"""

from __future__ import annotations

import math

from edgekit.errors import MissingDependencyError, ModelFormatError, one_line
from edgekit.runtime.metadata import check_identifier
from edgekit.runtime.schema import enum_names, schema_module

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
    except Exception:
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


def validate(buf: bytes, where: str = "model") -> None:
    """Raise ModelFormatError when the flatbuffer holds values known to crash the interpreter."""
    check_identifier(buf, where)
    root = int.from_bytes(bytes(buf[:4]), "little")
    if root + 4 > len(buf):
        raise ModelFormatError(f"{where}: root table offset {root} is past the end of the file")
    try:
        _validate(buf, where)
    except MissingDependencyError:
        return  # tflite_runtime without ai-edge-litert: no schema module to check with
    except ModelFormatError:
        raise
    except Exception as exc:  # the generated accessors raise anything on corrupt input
        raise ModelFormatError(f"{where}: flatbuffer is corrupt ({type(exc).__name__}: {one_line(exc)})") from None


def _validate(buf: bytes, where: str) -> None:
    schema = schema_module()
    model = schema.Model.GetRootAs(buf, 0)
    type_names = enum_names(schema.TensorType)
    option_names = enum_names(schema.BuiltinOptions)
    n_codes, n_buffers = model.OperatorCodesLength(), model.BuffersLength()
    custom_codes = [(model.OperatorCodes(i).CustomCode() or b"") for i in range(n_codes)]
    if model.SubgraphsLength() < 1:
        raise ModelFormatError(f"{where}: has no subgraph")
    for s in range(model.SubgraphsLength()):
        sub = model.Subgraphs(s)
        n_tensors = sub.TensorsLength()
        for t in range(n_tensors):
            tensor = sub.Tensors(t)
            kind = type_names.get(tensor.Type())
            if kind is None:
                raise ModelFormatError(f"{where}: tensor {t} has unknown type {tensor.Type()}")
            shape = tensor.ShapeAsNumpy() if tensor.ShapeLength() else []
            if any(d < 0 for d in shape):
                raise ModelFormatError(f"{where}: tensor {t} has a negative dimension {list(shape)}")
            if tensor.Buffer() >= n_buffers:
                raise ModelFormatError(f"{where}: tensor {t} points to buffer {tensor.Buffer()} of {n_buffers}")
            q = tensor.Quantization()
            if q is None or q.ScaleLength() == 0:
                continue
            scales = q.ScaleAsNumpy()
            if kind in _INT_RANGES or kind in ("INT32", "INT64"):
                if not all(math.isfinite(float(v)) and v > 0 for v in scales):
                    raise ModelFormatError(f"{where}: tensor {t} has a quantization scale that is not positive")
            if kind in _INT_RANGES and q.ZeroPointLength():
                lo, hi = _INT_RANGES[kind]
                zps = q.ZeroPointAsNumpy()
                if zps.min() < lo or zps.max() > hi:
                    raise ModelFormatError(f"{where}: tensor {t} has a zero point outside {kind}")
            if len(scales) > 1 and not 0 <= q.QuantizedDimension() < max(1, len(shape)):
                raise ModelFormatError(f"{where}: tensor {t} is quantized along a dimension it does not have")
        for i in range(sub.InputsLength()):
            if not 0 <= sub.Inputs(i) < n_tensors:
                raise ModelFormatError(f"{where}: subgraph input {i} points past the tensors")
        for i in range(sub.OutputsLength()):
            if not 0 <= sub.Outputs(i) < n_tensors:
                raise ModelFormatError(f"{where}: subgraph output {i} points past the tensors")
        for o in range(sub.OperatorsLength()):
            op = sub.Operators(o)
            if op.OpcodeIndex() >= n_codes:
                raise ModelFormatError(f"{where}: operator {o} uses op code {op.OpcodeIndex()} of {n_codes}")
            for get, count in ((op.Inputs, op.InputsLength()), (op.Outputs, op.OutputsLength())):
                for i in range(count):
                    if not -1 <= get(i) < n_tensors:
                        raise ModelFormatError(f"{where}: operator {o} points past the tensors")
            if custom_codes[op.OpcodeIndex()] == b"TFLite_Detection_PostProcess":
                raw = op.CustomOptionsAsNumpy().tobytes() if op.CustomOptionsLength() else b""
                _check_detection_options(raw, where, o)
            _check_options(schema, option_names.get(op.BuiltinOptionsType()), op, where, o)


def _check_options(schema, name: str | None, op, where: str, index: int) -> None:
    """Builtin options the kernels use unchecked: window sizes below 1, split counts that are not the
    number of outputs (SPLIT with num_splits 0 or 7 on two outputs crashed the interpreter)."""
    table = op.BuiltinOptions()
    fields, count = _WINDOW_OPTIONS.get(name or ""), _OUTPUT_COUNTS.get(name or "")
    if table is None or not (fields or count):
        return
    options = getattr(schema, name)()
    options.Init(table.Bytes, table.Pos)
    for field in fields or ():
        if getattr(options, field)() < 1:
            raise ModelFormatError(f"{where}: operator {index} has {field} < 1")
    if count and getattr(options, count)() != op.OutputsLength():
        raise ModelFormatError(f"{where}: operator {index} has {count} = {getattr(options, count)()} "
                               f"but {op.OutputsLength()} outputs")
