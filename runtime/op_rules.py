"""Preflight checks of each operator against what its LiteRT kernel assumes without checking: which
operands may be missing (-1), how many operands it takes, which quantization it reads, and option
values it loops over. The operand part comes from runtime/data/op_table.json, derived from LiteRT's
kernel sources (scripts/make_op_table.py); the quantization and option rules from files that crashed
a bare interpreter (tests/test_native_crashes.py makes each class of them).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from edgekit.errors import ModelFormatError
from edgekit.runtime.flatbuffer import ModelView, OperatorView, TensorView

TABLE = Path(__file__).with_name("data") / "op_table.json"

# kernels that rescale through the per-tensor scale (TfLiteTensor.params.scale), which is 0 for a tensor
# without quantization or with per-channel scales: an int8 ADD of either aborts (SIGABRT)
READS_TENSOR_SCALE = frozenset({"ADD", "SUB", "SQUARED_DIFFERENCE", "LESS", "GREATER", "EQUAL", "NOT_EQUAL",
                                "LESS_EQUAL", "GREATER_EQUAL"})
READS_TENSOR_SCALE_INT16 = frozenset({"SQRT", "RSQRT", "LOG"})  # their int16 kernels, likewise (SIGSEGV)
QUANTIZED_TYPES = frozenset({"INT8", "UINT8", "INT16"})

# where the probe of the table (scripts/make_op_table.py probe) crashed what the kernel sources allow
_COUNTS = {"DEPTHWISE_CONV_2D": (3, 3)}  # 2 inputs pass Prepare's count check and crash at invoke, 5 runs of 5
_NOT_OPTIONAL = {"RESHAPE": {1}}  # -1 as the shape tensor crashed 5 of 5 runs (reshape.cc:135 reads it unchecked)
# the LSTMs' input gate bias may be missing only with the input gate itself (CIFG: no input-to-input weights);
# alone it is dereferenced (unidirectional_sequence_lstm.cc:573), 5 runs of 5
_GATE_BIAS_WITH_GATE = {"LSTM": (12, 1), "UNIDIRECTIONAL_SEQUENCE_LSTM": (12, 1)}

# options the kernels loop over without a bound: LRN with radius -5 or 2^30 crashed (SIGSEGV)
_OPTION_RANGES = {"LocalResponseNormalizationOptions": {"Radius": (0, 2**20)}}


@functools.lru_cache(maxsize=1)
def op_table() -> dict[str, dict[str, Any]]:
    """{builtin op name: {"inputs": [min, max] | None, "outputs": ..., "optional_inputs": [...]}}."""
    return json.loads(TABLE.read_text(encoding="utf-8"))["ops"]


def operand_counts(name: str, kind: str = "inputs") -> tuple[int | None, int | None]:
    """(least, most) inputs or outputs a builtin's kernel takes; None where it sets no bound."""
    if kind == "inputs" and name in _COUNTS:
        return _COUNTS[name]
    lo, hi = op_table().get(name, {}).get(kind) or (None, None)
    return lo, hi


def check_operands(view: ModelView, op: OperatorView, where: str) -> None:
    """Operand counts the kernel checks with an assertion, and -1 ("no tensor") only where the kernel
    takes an optional operand: elsewhere it reads a null tensor (CONV_2D, FULLY_CONNECTED, SOFTMAX ...
    crashed with a -1 operand)."""
    name = view.op_name(op)
    entry = op_table().get(name)
    if -1 in op.outputs:
        raise ModelFormatError(f"{where}: operator {op.index} ({name}) has a missing output (-1)")
    if entry is None:  # custom ops and codes the table does not know: their kernels check for themselves
        return
    for kind, operands in (("inputs", op.inputs), ("outputs", op.outputs)):
        lo, hi = operand_counts(name, kind)
        if (lo is not None and len(operands) < lo) or (hi is not None and len(operands) > hi):
            want = str(lo) if lo == hi else f"at least {lo}" if hi is None else f"at most {hi}" if lo is None \
                else f"{lo} to {hi}"
            raise ModelFormatError(f"{where}: operator {op.index} ({name}) has {len(operands)} {kind}; its kernel "
                                   f"takes {want}")
    optional = set(entry.get("optional_inputs") or ()) - _NOT_OPTIONAL.get(name, set())
    bias, gate = _GATE_BIAS_WITH_GATE.get(name, (None, None))
    if bias is not None and gate is not None and len(op.inputs) > bias and op.inputs[bias] == -1 \
            and op.inputs[gate] != -1:
        optional.discard(bias)
    for position, tensor in enumerate(op.inputs):
        if tensor == -1 and position not in optional:
            raise ModelFormatError(f"{where}: operator {op.index} ({name}) has no tensor for input {position}, which "
                                   "its kernel requires")


def check_quantization(view: ModelView, op: OperatorView, tensors: tuple[TensorView, ...], where: str) -> None:
    """Integer operands of the kernels that read one per-tensor scale have exactly one scale."""
    name = view.op_name(op)
    if name not in READS_TENSOR_SCALE and name not in READS_TENSOR_SCALE_INT16:
        return
    types = QUANTIZED_TYPES if name in READS_TENSOR_SCALE else frozenset({"INT16"})
    for i in op.inputs + op.outputs:
        if i < 0 or tensors[i].type_name not in types:
            continue
        q = tensors[i].quantization
        scales = 0 if q is None else len(q.scales)
        if scales != 1:
            what = "no quantization scale" if scales == 0 else f"{scales} (per-channel) scales"
            raise ModelFormatError(f"{where}: operator {op.index} ({name}) takes {tensors[i].type_name} tensor {i} "
                                   f"({tensors[i].name!r}) with {what}; its kernel needs exactly one")


def check_option_ranges(op: OperatorView, where: str) -> None:
    ranges = _OPTION_RANGES.get(op.options_type_name or "")
    options = op.options() if ranges else None
    if ranges is None or options is None:
        return
    for field, (lo, hi) in ranges.items():
        value = getattr(options, field)()
        if not lo <= value <= hi:
            raise ModelFormatError(f"{where}: operator {op.index} has {field} = {value}, outside {lo}..{hi}")
