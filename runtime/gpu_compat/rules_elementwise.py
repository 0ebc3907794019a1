"""gpu_compatibility.cc for the elementwise ops: ADD, ADD_N, MUL, the one- and two-argument ops and the
elementwise StableHLO ops."""

from __future__ import annotations

from edgekit.runtime.gpu_compat.checks import (
    Flags,
    _check_add_mul_broadcast,
    _check_inputs_consts_outputs,
    _is_activation_supported,
    _num_elements,
    _retrieve_builtin_data,
)
from edgekit.runtime.gpu_compat.signature import OpSignature

ONE_ARG = frozenset({
    "ABS", "CEIL", "COS", "ELU", "EXP", "FLOOR", "GELU", "LOG", "LOGICAL_NOT", "LOGISTIC", "NEG", "ROUND",
    "RSQRT", "SIGN", "SIN", "SQRT", "SQUARE", "TANH"})
TWO_ARG = frozenset({
    "ATAN2", "DIV", "EQUAL", "FLOOR_DIV", "FLOOR_MOD", "GREATER", "GREATER_EQUAL", "LOGICAL_AND", "LOGICAL_OR",
    "LESS", "LESS_EQUAL", "MAXIMUM", "MINIMUM", "NOT_EQUAL", "POW", "RIGHT_SHIFT", "STABLEHLO_REMAINDER",
    "STABLEHLO_SHIFT_LEFT", "SQUARED_DIFFERENCE", "SUB"})


def add(sig: OpSignature, flags: Flags) -> str | None:
    ins = sig.inputs
    if len(ins) != 2:
        return "ADD requires two input tensors."
    if e := _check_add_mul_broadcast(ins[0], ins[1], flags.enhanced_broadcast):
        return e
    return _retrieve_builtin_data(sig)[1]


def add_n(sig: OpSignature, flags: Flags) -> str | None:
    return None if len(sig.inputs) == 2 else "ADD_N only supports 2 inputs."


def mul(sig: OpSignature, flags: Flags) -> str | None:
    ins = sig.inputs
    if len(ins) != 2:
        return "MUL requires two input tensors."
    if len(ins[0].dims) != len(ins[1].dims) and (
            e := _check_add_mul_broadcast(ins[0], ins[1], flags.enhanced_broadcast)):
        return e
    opts, e = _retrieve_builtin_data(sig)
    return e or _is_activation_supported(opts["activation"])


def one_arg(sig: OpSignature, flags: Flags) -> str | None:
    return _check_inputs_consts_outputs(sig, 1, 0, 1)


def two_arg(sig: OpSignature, flags: Flags) -> str | None:
    if _check_inputs_consts_outputs(sig, 2, 0, 1) and _check_inputs_consts_outputs(sig, 1, 1, 1):
        return "Op can only handle 1 or 2 operand(s)."
    activation = 0
    if sig.op in ("DIV", "SUB") and sig.builtin_data is not None:
        activation = sig.builtin_data.get("activation", 0)
    return _is_activation_supported(activation)


def stablehlo_broadcast_in_dim(sig: OpSignature, flags: Flags) -> str | None:
    ins = sig.inputs
    if _check_inputs_consts_outputs(sig, 1, 1, 1):
        return "requires one runtime input, one const input, and one output"
    if len(ins[1].dims) != 1:
        return "Only support 1D indices"
    if ins[1].type != "INT32":
        return "Only support int32 indices"
    if len(ins[0].dims) != ins[1].dims[0]:
        return "Require size(indices) = rank(operand)"
    return None


def stablehlo_cbrt(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
    if e := _check_inputs_consts_outputs(sig, 1, 0, 1):
        return e
    if ins[0].type not in ("FLOAT16", "FLOAT32", "BFLOAT16"):
        return "Only support float inputs"
    if ins[0].type != outs[0].type:
        return "Input and output types must match"
    return None


def stablehlo_clamp(sig: OpSignature, flags: Flags) -> str | None:
    ins = sig.inputs
    if e := _check_inputs_consts_outputs(sig, 3, 0, 1):
        return e
    if ins[0].type != ins[1].type or ins[1].type != ins[2].type:
        return "Clamp tensors must all be the same type"
    if ins[0].dims != ins[1].dims and _num_elements(ins[0].dims) != 1:
        return "Min tensor must be the same shape as the input, or a scalar"
    if ins[2].dims != ins[1].dims and _num_elements(ins[2].dims) != 1:
        return "Max tensor must be the same shape as the input, or a scalar"
    return None


RULES = {
    "ADD": add, "ADD_N": add_n, "MUL": mul,
    **dict.fromkeys(ONE_ARG, one_arg), **dict.fromkeys(TWO_ARG, two_arg),
    "STABLEHLO_BROADCAST_IN_DIM": stablehlo_broadcast_in_dim, "STABLEHLO_CBRT": stablehlo_cbrt,
    "STABLEHLO_CLAMP": stablehlo_clamp,
}
