"""The GPU delegate's own gates around the rules (model_builder.cc): which ops have a parser, their max
versions, the parsers that answer without the rules, the allowed tensor types and the rank limit, and
the float16-weights DEQUANTIZE bypass of FP16GraphPartitionHelper."""

from __future__ import annotations

from edgekit.runtime.gpu_compat.reader import _Op, _signature, _Tensor
from edgekit.runtime.gpu_compat.rules import _guarded, check_signature
from edgekit.runtime.gpu_compat.signature import OpSignature

_RULES, _OK, _ELEMENTWISE, _CAST = "rules", "ok", "elementwise", "cast"
# NewOperationParser: op -> (CheckMaxSupportedOpVersion limit or None, what IsSupported does)
_PARSERS: dict[str, tuple[int | None, str]] = {
    **dict.fromkeys(("ABS", "ADD", "ADD_N", "COS", "DIV", "EQUAL", "ELU", "EXP", "FLOOR", "FLOOR_DIV", "FLOOR_MOD", "GELU", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "LOGISTIC", "LOG", "LOGICAL_AND", "MAXIMUM", "MINIMUM", "NEG", "NOT_EQUAL", "POW", "RSQRT", "SIGN", "SIN", "SQRT", "SQUARE", "SQUARED_DIFFERENCE", "SUB", "TANH"), (2, _ELEMENTWISE)),
    "MUL": (3, _ELEMENTWISE),
    "AVERAGE_POOL_2D": (2, _RULES), "MAX_POOL_2D": (2, _RULES),
    "BATCH_MATMUL": (None, _RULES),
    "CAST": (None, _CAST),
    "CONCATENATION": (2, _RULES),
    "CONV_2D": (6, _RULES), "DEPTHWISE_CONV_2D": (6, _RULES),
    "CUMSUM": (1, _RULES), "DENSIFY": (1, _RULES),
    "DEPTH_TO_SPACE": (None, _RULES), "SPACE_TO_DEPTH": (2, _RULES),
    "FULLY_CONNECTED": (9, _RULES),
    "GATHER": (1, _RULES),
    "HARD_SWISH": (None, _RULES),
    "LSTM": (4, _RULES),
    "MEAN": (None, _RULES),
    "MIRROR_PAD": (2, _RULES), "PAD": (2, _RULES), "PADV2": (2, _RULES),
    "ONE_HOT": (1, _RULES),
    "PACK": (None, _RULES),
    "REDUCE_MAX": (None, _RULES), "REDUCE_MIN": (None, _RULES), "REDUCE_PROD": (None, _RULES),
    "SUM": (None, _RULES),
    "RELU": (2, _OK), "RELU6": (2, _OK), "RELU_0_TO_1": (2, _OK), "RELU_N1_TO_1": (2, _OK),
    "LEAKY_RELU": (2, _OK),
    "PRELU": (1, _OK),
    "RESHAPE": (1, _RULES),
    "RESIZE_BILINEAR": (3, _RULES), "RESIZE_NEAREST_NEIGHBOR": (3, _RULES),
    "SELECT": (1, _RULES), "SELECT_V2": (1, _RULES),
    "SLICE": (2, _RULES),
    "SOFTMAX": (2, _RULES),
    "SPLIT": (None, _RULES), "SPLIT_V": (None, _RULES),
    "STRIDED_SLICE": (4, _RULES),
    "TILE": (None, _RULES),
    "TRANSPOSE": (4, _RULES),
    "TRANSPOSE_CONV": (3, _RULES),
    "UNPACK": (None, _OK),
}
_QUANT_PARSERS = {"DEQUANTIZE": (3, _RULES), "QUANTIZE": (2, _RULES)}  # only with allow_quant_ops
_CUSTOM_PARSERS = {"Convolution2DTransposeBias": (None, _RULES), "MaxPoolingWithArgmax2D": (2, _RULES),
                   "MaxUnpooling2D": (None, _RULES), "Resampler": (None, _RULES)}
_LOGICAL = frozenset({"GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOT_EQUAL"})  # IsLogicalCode
_TYPE_SHAPE_MESSAGE = "OP is supported, but tensor type/shape isn't compatible."


class _Graph:
    def __init__(self, tensors: list[_Tensor], ops: list[_Op]):
        self.tensors, self.ops = tensors, ops
        self.producers: dict[int, list[int]] = {}
        self.consumers: dict[int, list[int]] = {}
        for op in ops:  # GetTensorInfo counts every occurrence
            for t in op.inputs:
                self.consumers.setdefault(t, []).append(op.index)
            for t in op.outputs:
                self.producers.setdefault(t, []).append(op.index)


def _is_fp16_weight_dequantize(op: _Op, tensors: list[_Tensor]) -> bool:
    if op.name != "DEQUANTIZE" or not op.inputs or not 0 <= op.inputs[0] < len(tensors):
        return False
    t = tensors[op.inputs[0]]
    return t.type == "FLOAT16" and t.const_runtime


def _check_logical(op: _Op, g: _Graph) -> str | None:
    out = op.outputs[0]
    consumers = g.consumers.get(out, [])
    if len(g.producers.get(out, [])) != 1 or len(consumers) != 1:
        return "Not supported logical op case"
    nxt = g.ops[consumers[0]]
    dst = g.tensors[nxt.outputs[0]].type if nxt.outputs and 0 <= nxt.outputs[0] < len(g.tensors) else "NOTYPE"
    if nxt.name in ("CAST", "SELECT", "SELECT_V2") and dst in ("FLOAT16", "FLOAT32"):
        return None
    return "Not supported logical op case."


def _check_cast(op: _Op, sig: OpSignature, g: _Graph) -> str | None:
    src = g.tensors[op.inputs[0]].type if 0 <= op.inputs[0] < len(g.tensors) else "NOTYPE"
    dst = g.tensors[op.outputs[0]].type if 0 <= op.outputs[0] < len(g.tensors) else "NOTYPE"
    if src == "BOOL" and dst in ("FLOAT16", "FLOAT32"):
        producers = g.producers.get(op.inputs[0], [])
        if len(producers) != 1 or len(g.consumers.get(op.inputs[0], [])) != 1:
            return "Not supported cast case"
        if len(g.consumers.get(op.outputs[0], [])) != 1:
            return "Cast from bool not supported for outputs"
        if g.ops[producers[0]].name in _LOGICAL:
            return None
    return check_signature(sig)


def _allowed_types(name: str, allow_quant_ops: bool) -> tuple[set[str], set[str]]:
    allowed_in, allowed_out = {"FLOAT32", "FLOAT16"}, {"FLOAT32", "FLOAT16"}
    if allow_quant_ops:
        allowed_in |= {"INT8", "UINT8"}
        allowed_out |= {"INT8", "UINT8"}
    if name in _LOGICAL:
        allowed_out.add("BOOL")
    if name == "CAST":
        allowed_in |= {"BOOL", "FLOAT32", "INT32"}
        allowed_out |= {"FLOAT32", "INT32", "BOOL"}
    if name == "ONE_HOT":
        allowed_in.add("INT32")
    if name in ("SELECT", "SELECT_V2"):
        allowed_in.add("BOOL")
    if name == "LOGICAL_AND":
        allowed_in.add("BOOL")
        allowed_out.add("BOOL")
    if name == "GATHER":
        allowed_in.add("INT32")
    return allowed_in, allowed_out


def _all_allowed(indices: list[int], allowed: set[str], tensors: list[_Tensor]) -> bool:
    """IsAllAllowedTensors: no tensor of rank 5 or more; arena tensors of an allowed type only."""
    for i in indices:
        if i < 0 or i >= len(tensors):
            continue
        t = tensors[i]
        if len(t.dims) >= 5:
            return False
        # approximation: allocation_type == kTfLiteArenaRw is taken as "neither constant nor a
        # variable"; tensors that only become kTfLiteDynamic at run time are checked too.
        if not t.const_runtime and not t.is_variable and t.type not in allowed:
            return False
    return True


def _delegate_verdict(op: _Op, g: _Graph, remap: dict[int, int], allow_quant_ops: bool) -> str | None:
    """GetOpsToReplace's node_supported_fn for one node: IsSupported, then the tensor types."""
    if op.name == "CUSTOM":
        parser = _CUSTOM_PARSERS.get(op.custom_name)
    else:
        parser = _PARSERS.get(op.name) or (_QUANT_PARSERS.get(op.name) if allow_quant_ops else None)
    sig = _signature(op, g.tensors, runtime=True, remap=remap)
    if parser is None:
        # approximation (wording only): the delegate's UnsupportedOperationParser says just
        # "Operation is not supported."; the offline wording names the op. For other custom ops the
        # delegate asks NewCustomOperationParser, which knows none in the open-source build.
        return f"Not supported custom op {op.custom_name}" if op.name == "CUSTOM" else f"Not supported op {op.name}"
    max_version, kind = parser
    if max_version is not None and op.version > max_version:
        return f"Max version supported: {max_version}. Requested version {op.version}."
    if kind == _ELEMENTWISE and op.name in _LOGICAL:
        status = _guarded(op.display, lambda: _check_logical(op, g))
    elif kind == _CAST:
        status = _guarded(op.display, lambda: _check_cast(op, sig, g))
    elif kind == _OK:
        status = None
    else:  # the parsers call CheckGpuDelegateCompatibility(context, node, registration): kStandard flags
        status = _guarded(op.display, lambda: check_signature(sig))
    if status:
        return status
    allowed_in, allowed_out = _allowed_types(op.name, allow_quant_ops)
    inputs = [remap.get(i, i) for i in op.inputs]
    if not _all_allowed(inputs, allowed_in, g.tensors) or not _all_allowed(op.outputs, allowed_out, g.tensors):
        return _TYPE_SHAPE_MESSAGE
    return None



def delegate_verdicts(tensors: list[_Tensor], ops: list[_Op], allow_quant_ops: bool) -> dict[int, str | None]:
    """{op index: None, or why the delegate leaves it on the CPU} for every operator of subgraph 0."""
    reasons: dict[int, str | None] = {}
    g = _Graph(tensors, ops)
    # FP16GraphPartitionHelper: a DEQUANTIZE of constant float16 weights is bypassed; the ops
    # that read its output see the float16 constant instead.
    fp16 = {op.index for op in ops if _is_fp16_weight_dequantize(op, tensors)}
    remap = {ops[i].outputs[0]: ops[i].inputs[0] for i in fp16 if ops[i].outputs}
    for op in ops:
        if op.index not in fp16:
            reasons[op.index] = _delegate_verdict(op, g, remap, allow_quant_ops)
    for i in fp16:
        # approximation: the bypassed DEQUANTIZE only matters when a CPU op still reads it
        cpu = [c for c in g.consumers.get(ops[i].outputs[0], []) if reasons.get(c)] if ops[i].outputs else []
        reasons[i] = (f"DEQUANTIZE of float16 weights feeds op {cpu[0]}, which stays on the CPU" if cpu
                      else None)
    return reasons
