"""Which ops of a .tflite the LiteRT/TFLite GPU delegate would leave on the CPU, and why.

Pure Python over the flatbuffer schema that LiteRT ships (no TensorFlow import). It ports two
pieces of TFLite's C++:

* the op rules, ``CheckGpuDelegateCompatibility`` in google-ai-edge/LiteRT
  ``tflite/tools/versioning/gpu_compatibility.cc`` at commit 468ca7df210c2b095ef36a4364bbf67cb6c6ebb3
  (read at the commit named here; not copied into this repository), together with
  the flatbuffer-to-``OpSignature`` conversion it runs on
  (``tflite/converter/tools/versioning/op_signature.cc`` at 6e59417fbc2d);
* the gates the GPU delegate itself puts around those rules when it picks the nodes to take
  (``GetOpsToReplace``, ``NewOperationParser``, the parsers' ``IsSupported`` with their
  ``CheckMaxSupportedOpVersion`` limits, and ``IsAllAllowedTensors``: the allowed tensor types and
  the rank limit) in ``tflite/delegates/gpu/common/model_builder.cc`` at 34ec5badbbbf.

``check_model(buf, mode="delegate")`` (the default) answers "what would the GPU delegate take";
``mode="offline"`` is exactly the C++ offline entry point ``CheckGpuDelegateCompatibility(op_code,
op, subgraph, model)``: the op rules alone, with enhanced broadcasting, and no type, rank or version
checks (so an int32 ADD passes there, while the delegate refuses it for its int32 tensors).

Why not TFLite's own analyzer: ``ai_edge_litert._pywrap_analyzer_wrapper.ModelAnalyzer(path, True,
True)`` in ai-edge-litert 2.3.0, and ``tf.lite.experimental.Analyzer.analyze(...,
gpu_compatibility=True)`` in TensorFlow 2.21, print "Your model looks compatible with GPU delegate"
for every model we fed them, including a lone UNIQUE, an int32 ADD and a FlexMatrixDeterminant
(checked by hand when this module was written), so their verdict carries no information.

What this does not model: the delegate only takes the largest partition of supported ops by default
(``max_delegated_partitions = 1``), so a compatible op cut off from it by CPU ops still runs on the
CPU; and the closed-source LiteRT GPU accelerator may accept more than the open-source delegate.
Lines marked ``# approximation:`` are where the port cannot see what the C++ sees.

Layout: ``signature`` (OpSignature), ``checks`` (the shared helpers of gpu_compatibility.cc),
``rules`` (check_signature: a table from op to rule) over ``rules_elementwise``, ``rules_nn`` and
``rules_tensor``; ``reader`` (GetOpSignature/ParseOpData over ``runtime.flatbuffer.ModelView``);
``delegate`` (model_builder.cc's gates). Only the names in ``__all__`` are public.
"""

from __future__ import annotations

from typing import Any

from edgekit.runtime.flatbuffer import ModelView, corrupt_as_format_error
from edgekit.runtime.gpu_compat.delegate import delegate_verdicts
from edgekit.runtime.gpu_compat.reader import _signature, read
from edgekit.runtime.gpu_compat.rules import _guarded, check_signature
from edgekit.runtime.gpu_compat.signature import OpSignature, TensorSpec

__all__ = ["DELEGATE_SOURCE", "MODES", "RULES_SOURCE", "OpSignature", "TensorSpec", "check_model",
           "check_signature", "summary"]

RULES_SOURCE = ("google-ai-edge/LiteRT", "tflite/tools/versioning/gpu_compatibility.cc",
                "468ca7df210c2b095ef36a4364bbf67cb6c6ebb3")
DELEGATE_SOURCE = ("google-ai-edge/LiteRT", "tflite/delegates/gpu/common/model_builder.cc",
                   "34ec5badbbbfd4d2147d1362f299f58843f84dfc")
MODES = ("delegate", "offline")

def check_model(model: bytes | ModelView, *, mode: str = "delegate",
                allow_quant_ops: bool = True) -> list[dict[str, Any]]:
    """One verdict per operator of subgraph 0: {"index", "op", "version", "compatible", "reason"}.

    mode="delegate": what the open-source GPU delegate would take (its op list and version limits,
    the op rules with standard broadcasting, then tensor types and rank); allow_quant_ops mirrors
    the delegate option of that name (on by default in TfLiteGpuDelegateOptionsV2Default).
    mode="offline": the C++ offline check alone (op rules, enhanced broadcasting).
    `model` is the file's bytes or a parsed ModelView. A corrupt model raises ModelFormatError."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    view = ModelView.of(model)
    with corrupt_as_format_error():
        tensors, ops = read(view)

    if mode == "offline":
        reasons = {op.index: _guarded(op.display, lambda op=op: check_signature(
            _signature(op, tensors, runtime=False), enhanced_broadcast=True)) for op in ops}
    else:
        reasons = delegate_verdicts(tensors, ops, allow_quant_ops)
    return [{"index": op.index, "op": op.display, "version": op.version, "compatible": reasons[op.index] is None,
             "reason": reasons[op.index]} for op in ops]


def summary(results: list[dict[str, Any]], weight_bytes_by_op: dict[int, int] | None = None) -> dict[str, Any]:
    """Roll check_model() up: overall verdict, the ops left on the CPU, the share of ops the GPU
    takes and, given each op's constant-input bytes, the share of those bytes in GPU ops."""
    fallback = [{"index": r["index"], "op": r["op"], "reason": r["reason"]} for r in results if not r["compatible"]]
    n = len(results)
    weight_share = None
    if weight_bytes_by_op is not None:
        total = sum(int(weight_bytes_by_op.get(r["index"], 0)) for r in results)
        on_gpu = sum(int(weight_bytes_by_op.get(r["index"], 0)) for r in results if r["compatible"])
        weight_share = round(on_gpu / total, 4) if total else 1.0
    return {
        "compatible": not fallback,
        "fallback_ops": fallback,
        "op_share": round(1 - len(fallback) / n, 4) if n else 1.0,
        "weight_share": weight_share,
    }
