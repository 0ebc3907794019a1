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
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import ModelFormatError, one_line
from edgekit.runtime.schema import enum_names, schema_module

RULES_SOURCE = ("google-ai-edge/LiteRT", "tflite/tools/versioning/gpu_compatibility.cc",
                "468ca7df210c2b095ef36a4364bbf67cb6c6ebb3")
DELEGATE_SOURCE = ("google-ai-edge/LiteRT", "tflite/delegates/gpu/common/model_builder.cc",
                   "34ec5badbbbfd4d2147d1362f299f58843f84dfc")
MODES = ("delegate", "offline")

# TfLiteType, in enum order (tflite/core/c/c_api_types.h): the position is the value absl::StrCat
# prints for a raw enum, the name is what TfLiteTypeGetName() prints.
_TFLITE_TYPES = ("NOTYPE", "FLOAT32", "INT32", "UINT8", "INT64", "STRING", "BOOL", "INT16",
                 "COMPLEX64", "INT8", "FLOAT16", "FLOAT64", "COMPLEX128", "UINT64", "RESOURCE",
                 "VARIANT", "UINT32", "UINT16", "INT4", "BFLOAT16", "INT2", "UINT4", "FLOAT8E4M3FN",
                 "FLOAT8E5M2")
# GetSizeOfType() in tflite/util.cc; a type missing here makes it fail.
_TYPE_SIZE = {"FLOAT32": 4, "INT32": 4, "UINT32": 4, "UINT8": 1, "INT64": 8, "UINT64": 8, "BOOL": 1,
              "COMPLEX64": 8, "COMPLEX128": 16, "UINT16": 2, "INT16": 2, "INT8": 1, "FLOAT16": 2,
              "FLOAT64": 8,
              "BFLOAT16": 2}  # approximation: BFLOAT16 is assumed to be in the newest GetSizeOfType

# TfLiteFusedActivation values (they equal the schema's ActivationFunctionType values).
_ACT_SIGN_BIT, _ACT_TANH, _ACT_SIGMOID = 5, 4, 6
_MIRROR_REFLECT = 1  # kTfLiteMirrorPaddingReflect
_LSTM_FULL, _LSTM_BASIC = 0, 1


# ---------------------------------------------------------------------------------------------
# OpSignature (tflite/tools/versioning/op_signature.h)
# ---------------------------------------------------------------------------------------------

@dataclass
class TensorSpec:
    """OpSignatureTensorSpec: a TfLiteType name, the dims (the tensor's `shape`), constness."""

    type: str = "NOTYPE"
    dims: list[int] = field(default_factory=list)
    is_const: bool = False
    is_shape_dynamic: bool = False


@dataclass
class OpSignature:
    """OpSignature. `op` is the BuiltinOperator name ("CONV_2D", "CUSTOM", ...); `builtin_data`
    holds the TfLite*Params fields the rules read (None where the C++ pointer would be null, as
    for custom ops); `custom_initial_data` the TfLitePoolParams/TfLiteTransposeConvParams fields
    a custom op's options decode to (None when absent)."""

    op: str
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    version: int = 1
    custom_name: str = ""
    builtin_data: dict[str, Any] | None = None
    custom_initial_data: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------------
# The rules: a line-by-line port of gpu_compatibility.cc. Each helper returns None for
# absl::OkStatus() and the status message otherwise; `if (e := ...): return e` is RETURN_IF_ERROR.
# ---------------------------------------------------------------------------------------------

def _type_name(t: str) -> str:  # TfLiteTypeGetName
    return t


def _type_enum(t: str) -> int:  # the raw enum value absl::StrCat prints
    return _TFLITE_TYPES.index(t) if t in _TFLITE_TYPES else 0


def _op_name(sig: OpSignature) -> str:  # GetOpName
    return sig.custom_name if sig.op == "CUSTOM" else sig.op


def _num_elements(dims: list[int]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def _reduces_to_1d_vector(dims: list[int]) -> bool:
    if not dims:
        return False
    return all(d == 1 for d in dims[:-1])


def _retrieve_builtin_data(sig: OpSignature):
    if sig.builtin_data is None:
        return None, "Unable to retrieve builtin_data."
    return sig.builtin_data, None


def _retrieve_custom_initial_data(sig: OpSignature):
    if sig.custom_initial_data is None:
        return None, "Unable to retrieve custom_initial_data."
    return sig.custom_initial_data, None


def _is_activation_supported(activation: int) -> str | None:
    if activation == _ACT_SIGN_BIT:
        return "TfLiteFusedActivation.kTfLiteActSignBit"
    return None


def _runtime_inputs(sig: OpSignature) -> int:  # GetNumberOfRuntimeInputs
    return sum(1 for t in sig.inputs if not t.is_const and t.type != "NOTYPE")


def _check_inputs_outputs(sig: OpSignature, required_runtime_inputs: int, required_outputs: int) -> str | None:
    n = _runtime_inputs(sig)
    if n != required_runtime_inputs:
        return f"Expected {required_runtime_inputs} runtime input tensor(s), but node has {n} runtime input(s)."
    if len(sig.outputs) != required_outputs:
        return f"Expected {required_outputs} output tensor(s), but node has {len(sig.outputs)} output(s)."
    return None


def _check_inputs_consts_outputs(sig: OpSignature, required_runtime_inputs: int, required_const_inputs: int,
                                 required_outputs: int) -> str | None:
    n = sum(1 for t in sig.inputs if t.is_const)
    if n != required_const_inputs:
        return f"Expected {required_const_inputs} const input tensor(s), but node has {n} const input(s)."
    return _check_inputs_outputs(sig, required_runtime_inputs, required_outputs)


def _check_tensor_is_available(sig: OpSignature, idx: int) -> str | None:
    if idx >= len(sig.inputs):
        return f"Requested index goes beyond array size: {idx} vs {len(sig.inputs)}"
    return None


def _check_convolution_input_output(sig: OpSignature) -> str | None:
    n = _runtime_inputs(sig)
    if n < 1 or n > 2:
        return f"Expected 1 or 2 input tensor(s), but node has {n} runtime inputs."
    if len(sig.outputs) != 1:
        return f"Expected 1 output tensor(s), but node has {len(sig.outputs)} runtime outputs."
    if n == 1:
        if e := _check_tensor_is_available(sig, 1):
            return e
    return None


def _check_strides(h: int, w: int) -> str | None:
    if h <= 0 or w <= 0:
        return f"Incorrect stride values: stride_height = {h}, stride_width = {w}"
    return None


def _check_dilation(h: int, w: int) -> str | None:
    if h <= 0 or w <= 0:
        return f"Incorrect dilation values: dilation_height = {h}, dilation_width = {w}"
    return None


def _check_strides_and_dilation(sh: int, sw: int, dh: int, dw: int) -> str | None:
    return _check_strides(sh, sw) or _check_dilation(dh, dw)


def _check_kernels(h: int, w: int) -> str | None:
    if h <= 0 or w <= 0:
        return f"Incorrect kernel values: kernel_height = {h}, kernel_width = {w}"
    return None


def _check_kernels_and_strides(kh: int, kw: int, sh: int, sw: int) -> str | None:
    return _check_kernels(kh, kw) or _check_strides(sh, sw)


def _check_axes_are_int32_const(sig: OpSignature, idx: int) -> str | None:
    axes = sig.inputs[idx]
    if not axes.is_const:
        return _op_name(sig) + " is only supported with constant axes."
    if axes.type != "INT32":
        return _op_name(sig) + " supports int32 tensor for axes. But node has " + _type_name(axes.type)
    return None


def _check_pooling_2d(sig: OpSignature) -> str | None:
    if sig.custom_initial_data is not None:  # custom case with indices as a second output
        opts, e = _retrieve_custom_initial_data(sig)
        if e or (e := _check_inputs_outputs(sig, 1, 2)):
            return e
    else:  # common pooling with 1 output
        opts, e = _retrieve_builtin_data(sig)
        if e or (e := _check_inputs_outputs(sig, 1, 1)):
            return e
    if e := _check_kernels_and_strides(opts["filter_height"], opts["filter_width"], opts["stride_height"],
                                       opts["stride_width"]):
        return e
    return _is_activation_supported(opts["activation"])


def _check_depthwise_conv(sig: OpSignature) -> str | None:
    if e := _check_convolution_input_output(sig):
        return e
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return e
    if e := _check_strides_and_dilation(opts["stride_height"], opts["stride_width"],
                                        opts["dilation_height_factor"], opts["dilation_width_factor"]):
        return e
    if e := _is_activation_supported(opts["activation"]):
        return e
    depth_multiplier = opts["depth_multiplier"]
    inp, flt = sig.inputs[0], sig.inputs[1]
    bias = sig.inputs[2] if len(sig.inputs) > 2 else None
    out = sig.outputs[0]
    if len(inp.dims) != 4:
        return "input.dims.size != 4"
    if len(flt.dims) != 4:
        return "filter.dims.size != 4"
    if len(out.dims) != 4:
        return "output.dims.size != 4"
    if inp.dims[0] != out.dims[0]:
        return "input.b != output.b"
    input_depth, output_depth = inp.dims[3], out.dims[3]
    if flt.dims[3] != output_depth:
        return "filter.i != output.c"
    if output_depth != input_depth * depth_multiplier:
        return "output.c != input.c * depth_multiplier"
    if bias is not None and _num_elements(bias.dims) != output_depth:
        return "bias.size != output.c"
    return None


def _check_cumsum(sig: OpSignature) -> str | None:
    if len(sig.inputs) != 2 or len(sig.outputs) != 1:
        return "Expects 2 inputs and 1 output"
    i0, i1, o0 = sig.inputs[0], sig.inputs[1], sig.outputs[0]
    if (i0.type not in ("FLOAT16", "FLOAT32")) or o0.type != i0.type or (i1.type != "INT32" or not i1.is_const):
        return "Input/output must be float type and indices must be constant int32 type"
    return None


def _check_one_hot(sig: OpSignature) -> str | None:
    if len(sig.inputs) != 4 or len(sig.outputs) != 1:
        return "Expects 4 inputs and 1 output"
    error = ("Indices must be int32 type, on/off tensors must be constant, scalar, float type, axis must be -1 "
             "or last dim")
    if sig.inputs[0].type != "INT32":
        return error
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return e
    dims = sig.inputs[0].dims
    num_dims = len(dims)
    if opts["axis"] != -1 and (num_dims == 0 or opts["axis"] != dims[num_dims - 1]):
        return error
    for i in range(num_dims - 1):  # can only have batch and channels as non-singleton
        if num_dims > 3 and i == 0:
            continue
        if dims[i] != 1:
            return f"Unsupported non-singleton dim at {i}"
    on, off = sig.inputs[2], sig.inputs[3]
    if on.type != "FLOAT32" or off.type != "FLOAT32":
        return error
    if not on.is_const or not off.is_const or len(on.dims) > 1 or len(off.dims) > 1:
        return error
    if (on.dims and on.dims[0] > 1) or (off.dims and off.dims[0] > 1):
        return error
    return None


def _check_select_v2(sig: OpSignature) -> str | None:
    if len(sig.inputs) != 3 or len(sig.outputs) != 1:
        return "Expected 3 inputs and 1 output"
    error = ("Cond must be float or bool type, if, else tensors must either be the same shape as output or "
             "constant, scalar.")
    if sig.inputs[0].type not in ("BOOL", "FLOAT16", "FLOAT32"):
        return error
    output_dims = sig.outputs[0].dims
    cond_dims = sig.inputs[0].dims
    if cond_dims:
        offset = len(output_dims) - len(cond_dims)
        if offset < 0:
            return error
        for i, d in enumerate(cond_dims):
            if d != output_dims[offset + i] and d != 1:
                return error
    t_if, t_else = sig.inputs[1], sig.inputs[2]
    if t_if.dims and t_if.dims != output_dims and (len(t_if.dims) > 1 or t_if.dims[0] > 1):
        return error
    if not t_if.is_const and len(t_if.dims) == 2:
        return "2-D if tensor only supported if constant."
    if t_else.dims and t_else.dims != output_dims and (len(t_else.dims) > 1 or t_else.dims[0] > 1):
        return error
    if not t_else.is_const and len(t_else.dims) == 2:
        return "2-D else tensor only supported if constant."
    return None


def _check_custom_op(sig: OpSignature) -> str | None:
    name = sig.custom_name
    if name == "Convolution2DTransposeBias":
        if e := _check_tensor_is_available(sig, 1):
            return e
        opts, e = _retrieve_custom_initial_data(sig)
        return e or _check_strides(opts["stride_height"], opts["stride_width"])
    if name == "MaxPoolingWithArgmax2D":
        return _check_pooling_2d(sig)
    if name == "MaxUnpooling2D":
        if e := _check_inputs_outputs(sig, 2, 1):
            return e
        opts, e = _retrieve_custom_initial_data(sig)
        return e or _check_kernels_and_strides(opts["filter_height"], opts["filter_width"], opts["stride_height"],
                                               opts["stride_width"])
    if name == "Resampler":
        if e := _check_inputs_outputs(sig, 2, 1):
            return e
        src, warp = sig.inputs[0], sig.inputs[1]
        if len(src.dims) != 4 or len(warp.dims) != 4:
            return "src or warp dims size != 4"
        if src.dims[0] != warp.dims[0]:
            return "src.b != warp.b"
        if warp.dims[3] < 2:
            return "warp.c < 2"
        return None
    return f"Not supported custom op {name}"


def _check_is_broadcastable(longer: list[int], shorter: list[int]) -> bool:
    idx_1, idx_2 = len(longer) - 1, len(shorter) - 1
    for _ in range(max(idx_1, idx_2), -1, -1):
        d1 = 1 if idx_1 < 0 else longer[idx_1]
        d2 = 1 if idx_2 < 0 else shorter[idx_2]
        if d1 != d2 and d1 != 1 and d2 != 1:
            return False
        idx_1 -= 1
        idx_2 -= 1
    return True


def _check_add_mul_broadcast(in0: TensorSpec, in1: TensorSpec, enhanced_broadcast: bool) -> str | None:
    if len(in0.dims) > 1 and len(in1.dims) > 1 and len(in0.dims) != len(in1.dims):
        longer, shorter = (in0.dims, in1.dims) if len(in0.dims) >= len(in1.dims) else (in1.dims, in0.dims)
        if enhanced_broadcast:
            ok = _check_is_broadcastable(longer, shorter)
        else:
            ok = ((len(longer) == 4 and len(shorter) == 3 and longer[0] == 1)  # 3D to 4D with batch 1
                  or (len(longer) == 4 and len(shorter) == 2 and longer[0] == 1 and shorter[0] == 1
                      and shorter[1] == 1)  # 2D [1, 1] to 4D [1, x, y, z]
                  or (len(longer) == 4 and len(shorter) == 2 and longer[0] == shorter[0]
                      and longer[3] == shorter[1]))  # 2D [b, c] to 4D [b, x, y, c]
        if not ok:
            return (f"Doesn't support broadcasting - input0: [{','.join(map(str, in0.dims))}], "
                    f"input1: [{','.join(map(str, in1.dims))}]")
    return None


_ONE_ARG_ELEMENTWISE = frozenset({
    "ABS", "CEIL", "COS", "ELU", "EXP", "FLOOR", "GELU", "LOG", "LOGICAL_NOT", "LOGISTIC", "NEG", "ROUND",
    "RSQRT", "SIGN", "SIN", "SQRT", "SQUARE", "TANH"})
_TWO_ARG_ELEMENTWISE = frozenset({
    "ATAN2", "DIV", "EQUAL", "FLOOR_DIV", "FLOOR_MOD", "GREATER", "GREATER_EQUAL", "LOGICAL_AND", "LOGICAL_OR",
    "LESS", "LESS_EQUAL", "MAXIMUM", "MINIMUM", "NOT_EQUAL", "POW", "RIGHT_SHIFT", "STABLEHLO_REMAINDER",
    "STABLEHLO_SHIFT_LEFT", "SQUARED_DIFFERENCE", "SUB"})
_REDUCE = frozenset({"REDUCE_ALL", "REDUCE_ANY", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "SUM"})


def check_signature(sig: OpSignature, *, enhanced_broadcast: bool = False,
                    reducible_gather_indices: bool = False) -> str | None:
    """CheckGpuDelegateCompatibility(op_sig, flags): None when the GPU rules accept the op, else the
    C++ status message. The flags default to GpuCompatibilityFlags::kStandard, as in the C++."""
    op = sig.op
    ins, outs = sig.inputs, sig.outputs

    if op == "ADD":
        if len(ins) != 2:
            return "ADD requires two input tensors."
        if e := _check_add_mul_broadcast(ins[0], ins[1], enhanced_broadcast):
            return e
        return _retrieve_builtin_data(sig)[1]
    if op == "ADD_N":
        return None if len(ins) == 2 else "ADD_N only supports 2 inputs."
    if op in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        return _check_pooling_2d(sig)
    if op == "BATCH_MATMUL":
        if not (len(ins) == 2 and len(outs) == 1):
            return f"Expected 2 inputs and 1 output, got: {len(ins)} inputs and {len(outs)} outputs"
        return None
    if op == "BITCAST":
        if e := _check_inputs_outputs(sig, 1, 1):
            return e
        in_dims, out_dims = ins[0].dims, outs[0].dims
        in_size = _TYPE_SIZE.get(ins[0].type)
        if in_size is None:
            return "Could not parse input type"
        out_size = _TYPE_SIZE.get(outs[0].type)
        if out_size is None:
            return "Could not parse output type"
        if in_size == out_size:
            if in_dims != out_dims:
                return "If input and output types have the same element size, they must have the same shapes"
        elif in_size > out_size:
            if len(in_dims) + 1 != len(out_dims):
                return ("If input element size is greater than output element size, require that output rank "
                        "is one greater than input rank")
            if any(in_dims[d] != out_dims[d] for d in range(len(in_dims))):
                return "Shapes must match in all but last dim"
            if out_dims[-1] * out_size != in_size:
                return "Last output dim must be equal to input element size divided by output element size"
        else:
            if len(in_dims) != len(out_dims) + 1:
                return ("If output element size is greater than input element size, require that input rank "
                        "is one greater than output rank")
            if any(in_dims[d] != out_dims[d] for d in range(len(out_dims))):
                return "Shapes must match in all but last dim"
            if in_dims[-1] * in_size != out_size:
                return "Last input dim must be equal to output element size divided by input element size"
        return None
    if op == "CAST":
        if e := _check_inputs_outputs(sig, 1, 1):
            return e
        src, dst = ins[0].type, outs[0].type
        if src == "BOOL" and dst in ("FLOAT16", "FLOAT32"):
            return None
        if src in ("FLOAT16", "FLOAT32") and dst == "BOOL":
            return None
        if src in ("FLOAT32", "INT32") and dst in ("FLOAT32", "INT32"):
            return None
        return f"Not supported Cast case. Input type: {_type_name(src)} and output type: {_type_name(dst)}"
    if op == "CONCATENATION":
        return _retrieve_builtin_data(sig)[1]
    if op == "CONV_2D":
        if e := _check_convolution_input_output(sig):
            return e
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        if e := _check_strides_and_dilation(opts["stride_height"], opts["stride_width"],
                                            opts["dilation_height_factor"], opts["dilation_width_factor"]):
            return e
        return _is_activation_supported(opts["activation"])
    if op == "CUMSUM":
        return _check_cumsum(sig)
    if op == "DENSIFY":
        return _check_inputs_outputs(sig, 0, 1)
    if op == "DEPTHWISE_CONV_2D":
        return _check_depthwise_conv(sig)
    if op in ("DEPTH_TO_SPACE", "SPACE_TO_DEPTH"):
        if e := _check_inputs_outputs(sig, 1, 1):
            return e
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        if opts["block_size"] == 1:
            return f"{op} block_size = 1 is a no-op."
        if opts["block_size"] < 1:
            return f"{op} block_size must be > 1."
        return None
    if op == "DEQUANTIZE":
        if len(ins) != 1 or len(outs) != 1:
            return f"Expected 1 input & output each from Dequantize, got: {len(ins)}, {len(outs)}"
        if ins[0].type == "INT16":
            return "Unsupported dequantization type."
        return None
    if op == "EMBEDDING_LOOKUP":
        if len(ins) != 2:
            return f"Expected 2, but got {len(ins)} inputs."
        if len(outs) != 1:
            return f"Expected 1, but got {len(outs)} outputs."
        ids, value, out = ins[0], ins[1], outs[0]
        if len(ids.dims) != 1:
            return f"Expected 1D, but got {len(ids.dims)}D input #0."
        if len(value.dims) < 2:
            return f"Expected > 1D, but got {len(value.dims)}D input #1."
        if len(value.dims) != len(out.dims):
            return f"Expected {len(value.dims)}, but got {len(out.dims)} for output."
        for i in range(1, len(out.dims)):
            if value.dims[i] != out.dims[i]:
                return f"Expected {value.dims[i]}, but got {out.dims[i]} for output.dim[{i}]."
        if value.type not in ("INT8", "INT4", "INT2", "FLOAT32"):
            return f"Expected int8, int4, int2, or float32, but got {_type_name(value.type)} for input #1."
        return None
    if op == "DYNAMIC_UPDATE_SLICE":
        if len(ins) != 3:
            return "DynamicUpdateSlice requires 3 inputs."
        operand, update, start = ins
        if operand.type != update.type:
            return ("Array to update and updated slice must have the same data type, but got: array to update: "
                    f"{_type_enum(operand.type)}, updated slice: {_type_enum(update.type)}")
        if len(start.dims) != 1:
            return f"Start indices must be 1D, but got: {len(start.dims)}"
        if start.type != "INT32":
            return "start_indices must be of type int32."
        if len(update.dims) != len(operand.dims):
            return ("Operand and update must have the same number of dimensions, but got: operand: "
                    f"{len(operand.dims)}, update: {len(update.dims)}")
        return None
    if op == "FULLY_CONNECTED":
        if not ins:
            return "Expected at least 1 input"
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        if opts["weights_format"] != 0:  # kTfLiteFullyConnectedWeightsFormatDefault
            return f"Unsupported FullyConnected weights format: {opts['weights_format']}"
        if _runtime_inputs(sig) > 2:
            return "FullyConnected doesn't support more than 2 runtime inputs."
        if ins[0].is_const:
            return "FullyConnected doesn't support constant input."
        if opts["keep_num_dims"]:
            if not outs:
                return "Expected at least 1 output"
            if len(ins[0].dims) != len(outs[0].dims):
                return "Input and output dimensions different and FullyConnected doesn't support keep_num_dims."
        return None
    if op == "GATHER":
        if _check_inputs_consts_outputs(sig, 2, 0, 1) and _check_inputs_consts_outputs(sig, 1, 1, 1):
            return "Op can only handle 1 or 2 operand(s)."
        for spec in (ins[0], ins[1], outs[0]):
            if len(spec.dims) > 4:  # kMaxBhwcDims
                return "Gather only supports up to 4D input, indices and output."
        if reducible_gather_indices:
            if not _reduces_to_1d_vector(ins[1].dims):
                return "Only support indices that reduce to a 1D vector (all leading dimensions must be 1)"
        elif len(ins[1].dims) != 1:
            return "Only support 1D indices"
        return None if ins[1].type == "INT32" else "Only accept INT32 indices"
    if op == "HARD_SWISH":
        return _check_inputs_outputs(sig, 1, 1)
    if op == "LSTM":
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        if opts["kernel_type"] == _LSTM_FULL:
            if len(ins) not in (20, 24):
                return f"Expected 20 or 24 input tensors, but node has {len(ins)} input(s)."
            if len(outs) != 1:
                return f"Expected 1 output tensor, but node has {len(outs)} output(s)."
            if opts["activation"] not in (_ACT_SIGMOID, _ACT_TANH):
                return f"Only sigmoid or tanh activation is supported, but node has {opts['activation']}"
            return None
        # kTfLiteLSTMBasicKernel (ParseOpData admits no other kernel type)
        if e := _check_inputs_consts_outputs(sig, 3, 2, 4):
            return e
        if outs[3].dims and outs[3].dims[-1] % 4 != 0:
            return "BasicLSTM activation depth must be a multiple of 4."
        if opts["activation"] != _ACT_TANH:
            return f"Only TANH activation is supported. but node has {opts['activation']}"
        if opts["cell_clip"] != 0.0:
            return "cell_clip is not supported."
        if opts["proj_clip"] != 0.0:
            return "proj_clip is not supported."
        return None
    if op == "MEAN":
        if e := _check_inputs_consts_outputs(sig, 1, 1, 1):
            return e
        return _check_axes_are_int32_const(sig, 1)
    if op == "MUL":
        if len(ins) != 2:
            return "MUL requires two input tensors."
        if len(ins[0].dims) != len(ins[1].dims):
            if e := _check_add_mul_broadcast(ins[0], ins[1], enhanced_broadcast):
                return e
        opts, e = _retrieve_builtin_data(sig)
        return e or _is_activation_supported(opts["activation"])
    if op in ("PACK", "RELU_N1_TO_1", "PRELU", "SPLIT", "SPLIT_V", "RELU", "RELU6", "LEAKY_RELU"):
        return None
    if op == "ONE_HOT":
        return _check_one_hot(sig)
    if op in ("QUANTIZE", "RESHAPE", "TILE", "TRANSPOSE"):
        return _check_inputs_outputs(sig, 1, 1)
    if op in ("SELECT", "SELECT_V2"):
        return _check_select_v2(sig)
    if op == "SLICE":
        if len(ins) < 3:
            return f"SLICE requires 3 inputs, but node has {len(ins)} inputs."
        if len(ins[0].dims) not in (3, 4):
            return (f"SLICE supports for 3 or 4 dimensional tensors only, but node has {len(ins[0].dims)} "
                    "dimensional tensors.")
        return None
    if op == "SOFTMAX":
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        return "Softmax.beta != 1 is not supported." if opts["beta"] != 1 else None
    if op == "STRIDED_SLICE":
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        if opts["ellipsis_mask"]:
            return "StridedSlice does not support ellipsis_mask."
        if opts["new_axis_mask"]:
            return "StridedSlice does not support new_axis_mask."
        if opts["shrink_axis_mask"]:
            return "StridedSlice does not support shrink_axis_mask parameter."
        if len(ins) < 4:
            return "STRIDED_SLICE requires 4 inputs."
        if len(ins[0].dims) not in (3, 4):
            return "STRIDED_SLICE supports for 3 or 4 dimensional tensors only."
        return None
    if op == "TOPK_V2":
        return _check_inputs_outputs(sig, 1, 2)
    if op == "TRANSPOSE_CONV":
        if e := _check_convolution_input_output(sig):
            return e
        opts, e = _retrieve_builtin_data(sig)
        return e or _check_strides(opts["stride_height"], opts["stride_width"])
    if op == "RESIZE_BILINEAR":
        if e := _check_inputs_outputs(sig, 1, 1):
            return e
        opts, e = _retrieve_builtin_data(sig)
        if e:
            return e
        if opts["align_corners"] and opts["half_pixel_centers"]:
            return "If half_pixel_centers is True, align_corners must be False."
        return None
    if op == "RESIZE_NEAREST_NEIGHBOR":
        return _check_inputs_outputs(sig, 1, 1) or _retrieve_builtin_data(sig)[1]
    if op in _REDUCE:
        if e := _check_inputs_consts_outputs(sig, 1, 1, 1):
            return e
        return _check_axes_are_int32_const(sig, 1)
    if op in ("PAD", "PADV2", "MIRROR_PAD"):
        if op == "MIRROR_PAD":
            opts, e = _retrieve_builtin_data(sig)
            if e:
                return e
            if opts["mode"] != _MIRROR_REFLECT:
                return ("Only Reflective padding is supported for Mirror Pad operation. But node has "
                        f"{opts['mode']}")
        if e := _check_inputs_outputs(sig, 1, 1):
            return e
        if e := _check_tensor_is_available(sig, 1):
            return e
        pad = ins[1]
        if len(pad.dims) != 2:
            return f"Invalid paddings tensor dimension: expected 2 dim, got {len(pad.dims)} dim"
        if pad.dims[0] not in (3, 4) or pad.dims[1] != 2:
            return f"Invalid paddings tensor shape: expected 4x2 or 3x2, got {pad.dims[0]}x{pad.dims[1]}"
        return None
    if op == "REVERSE_V2":
        if e := _check_inputs_consts_outputs(sig, 1, 1, 1):
            return e
        return _check_axes_are_int32_const(sig, 1)
    if op in _ONE_ARG_ELEMENTWISE:
        return _check_inputs_consts_outputs(sig, 1, 0, 1)
    if op in _TWO_ARG_ELEMENTWISE:
        if _check_inputs_consts_outputs(sig, 2, 0, 1) and _check_inputs_consts_outputs(sig, 1, 1, 1):
            return "Op can only handle 1 or 2 operand(s)."
        activation = 0
        if op in ("DIV", "SUB") and sig.builtin_data is not None:
            activation = sig.builtin_data.get("activation", 0)
        return _is_activation_supported(activation)
    if op == "STABLEHLO_BROADCAST_IN_DIM":
        if _check_inputs_consts_outputs(sig, 1, 1, 1):
            return "requires one runtime input, one const input, and one output"
        if len(ins[1].dims) != 1:
            return "Only support 1D indices"
        if ins[1].type != "INT32":
            return "Only support int32 indices"
        if len(ins[0].dims) != ins[1].dims[0]:
            return "Require size(indices) = rank(operand)"
        return None
    if op == "STABLEHLO_CBRT":
        if e := _check_inputs_consts_outputs(sig, 1, 0, 1):
            return e
        if ins[0].type not in ("FLOAT16", "FLOAT32", "BFLOAT16"):
            return "Only support float inputs"
        if ins[0].type != outs[0].type:
            return "Input and output types must match"
        return None
    if op == "STABLEHLO_CLAMP":
        if e := _check_inputs_consts_outputs(sig, 3, 0, 1):
            return e
        if ins[0].type != ins[1].type or ins[1].type != ins[2].type:
            return "Clamp tensors must all be the same type"
        if ins[0].dims != ins[1].dims and _num_elements(ins[0].dims) != 1:
            return "Min tensor must be the same shape as the input, or a scalar"
        if ins[2].dims != ins[1].dims and _num_elements(ins[2].dims) != 1:
            return "Max tensor must be the same shape as the input, or a scalar"
        return None
    if op == "CUSTOM":
        return _check_custom_op(sig)
    return f"Not supported op {op}"


# ---------------------------------------------------------------------------------------------
# Reading the flatbuffer: GetOpSignature(op_code, op, subgraph, model) and ParseOpData.
# ---------------------------------------------------------------------------------------------

def _conv2d(o):
    return {"padding": o.Padding(), "stride_width": o.StrideW(), "stride_height": o.StrideH(),
            "dilation_width_factor": o.DilationWFactor(), "dilation_height_factor": o.DilationHFactor(),
            "activation": _act(o.FusedActivationFunction())}


def _depthwise(o):
    d = _conv2d(o)
    d["depth_multiplier"] = o.DepthMultiplier()
    return d


def _pool(o):
    return {"padding": o.Padding(), "stride_width": o.StrideW(), "stride_height": o.StrideH(),
            "filter_width": o.FilterWidth(), "filter_height": o.FilterHeight(),
            "activation": _act(o.FusedActivationFunction())}


def _fully_connected(o):
    fmt = o.WeightsFormat()
    if fmt not in (0, 1):  # ParseFullyConnected fails and leaves builtin_data null
        return None
    return {"activation": _act(o.FusedActivationFunction()), "weights_format": fmt,
            "keep_num_dims": bool(o.KeepNumDims())}


def _lstm(o):
    kernel = o.KernelType()
    if kernel not in (_LSTM_FULL, _LSTM_BASIC):  # ParseLSTM fails and leaves builtin_data null
        return None
    return {"activation": _act(o.FusedActivationFunction()), "cell_clip": o.CellClip(), "proj_clip": o.ProjClip(),
            "kernel_type": kernel}


def _act(value: int) -> int:  # ConvertActivation: anything unknown becomes kTfLiteActNone
    return value if 0 <= value <= 5 else 0


def _activation_only(o):
    return {"activation": _act(o.FusedActivationFunction())}


# op name -> (BuiltinOptions type name, reader, the zero-initialised params when the table is absent)
_OPTIONS: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "ADD": ("AddOptions", _activation_only, {"activation": 0}),
    "SUB": ("SubOptions", _activation_only, {"activation": 0}),
    "MUL": ("MulOptions", _activation_only, {"activation": 0}),
    "DIV": ("DivOptions", _activation_only, {"activation": 0}),
    "CONCATENATION": ("ConcatenationOptions",
                      lambda o: {"axis": o.Axis(), "activation": _act(o.FusedActivationFunction())},
                      {"axis": 0, "activation": 0}),
    "CONV_2D": ("Conv2DOptions", _conv2d,
                dict.fromkeys(("padding", "stride_width", "stride_height", "dilation_width_factor",
                               "dilation_height_factor", "activation"), 0)),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", _depthwise,
                          dict.fromkeys(("padding", "stride_width", "stride_height", "dilation_width_factor",
                                         "dilation_height_factor", "activation", "depth_multiplier"), 0)),
    "AVERAGE_POOL_2D": ("Pool2DOptions", _pool,
                        dict.fromkeys(("padding", "stride_width", "stride_height", "filter_width",
                                       "filter_height", "activation"), 0)),
    "DEPTH_TO_SPACE": ("DepthToSpaceOptions", lambda o: {"block_size": o.BlockSize()}, {"block_size": 0}),
    "SPACE_TO_DEPTH": ("SpaceToDepthOptions", lambda o: {"block_size": o.BlockSize()}, {"block_size": 0}),
    "FULLY_CONNECTED": ("FullyConnectedOptions", _fully_connected,
                        {"activation": 0, "weights_format": 0, "keep_num_dims": False}),
    "LSTM": ("LSTMOptions", _lstm, {"activation": 0, "cell_clip": 0.0, "proj_clip": 0.0, "kernel_type": 0}),
    "SOFTMAX": ("SoftmaxOptions", lambda o: {"beta": o.Beta()}, {"beta": 0.0}),
    "STRIDED_SLICE": ("StridedSliceOptions",
                      lambda o: {"begin_mask": o.BeginMask(), "end_mask": o.EndMask(),
                                 "ellipsis_mask": o.EllipsisMask(), "new_axis_mask": o.NewAxisMask(),
                                 "shrink_axis_mask": o.ShrinkAxisMask()},
                      dict.fromkeys(("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                     "shrink_axis_mask"), 0)),
    "TRANSPOSE_CONV": ("TransposeConvOptions",
                       lambda o: {"padding": o.Padding(), "stride_width": o.StrideW(), "stride_height": o.StrideH(),
                                  "activation": _act(o.FusedActivationFunction())},
                       dict.fromkeys(("padding", "stride_width", "stride_height", "activation"), 0)),
    "RESIZE_BILINEAR": ("ResizeBilinearOptions",
                        lambda o: {"align_corners": bool(o.AlignCorners()),
                                   "half_pixel_centers": bool(o.HalfPixelCenters())},
                        {"align_corners": False, "half_pixel_centers": False}),
    "RESIZE_NEAREST_NEIGHBOR": ("ResizeNearestNeighborOptions",
                                lambda o: {"align_corners": bool(o.AlignCorners()),
                                           "half_pixel_centers": bool(o.HalfPixelCenters())},
                                {"align_corners": False, "half_pixel_centers": False}),
    # schema REFLECT=0 / SYMMETRIC=1 -> kTfLiteMirrorPaddingReflect=1 / kTfLiteMirrorPaddingSymmetric=2
    "MIRROR_PAD": ("MirrorPadOptions", lambda o: {"mode": {0: 1, 1: 2}.get(o.Mode(), 0)}, {"mode": 0}),
    "ONE_HOT": ("OneHotOptions", lambda o: {"axis": o.Axis()}, {"axis": 0}),
    "GATHER": ("GatherOptions", lambda o: {"axis": o.Axis(), "batch_dims": o.BatchDims()},
               {"axis": 0, "batch_dims": 0}),
}
_OPTIONS["MAX_POOL_2D"] = _OPTIONS["AVERAGE_POOL_2D"]


def _builtin_data(schema, op, name: str) -> dict[str, Any] | None:
    """ParseOpData for the params the rules read. Builtin ops always get a params struct (ParseOpData
    allocates one even when the options table is missing); custom ops get none."""
    if name == "CUSTOM":
        return None
    spec = _OPTIONS.get(name)
    if spec is None:
        return {}
    type_name, reader, zero = spec
    table = op.BuiltinOptions()
    if table is None or op.BuiltinOptionsType() != getattr(schema.BuiltinOptions, type_name):
        # approximation: a missing or mistyped options table is read as zero-initialised params
        return dict(zero)
    options = getattr(schema, type_name)()
    options.Init(table.Bytes, table.Pos)
    return reader(options)


def _custom_initial_data(name: str, raw: bytes) -> dict[str, Any] | None:
    """What the delegate's custom parsers read from node->custom_initial_data: the raw custom options
    reinterpreted as TfLitePoolParams / TfLiteTransposeConvParams (MediaPipe writes those structs)."""
    # approximation: little-endian int32 fields; options too short for the struct count as absent.
    if name in ("MaxPoolingWithArgmax2D", "MaxUnpooling2D") and len(raw) >= 24:
        padding, sw, sh, fw, fh, act = struct.unpack_from("<6i", raw)
        return {"padding": padding, "stride_width": sw, "stride_height": sh, "filter_width": fw,
                "filter_height": fh, "activation": act}
    if name == "Convolution2DTransposeBias" and len(raw) >= 12:
        padding, sw, sh = struct.unpack_from("<3i", raw)
        return {"padding": padding, "stride_width": sw, "stride_height": sh}
    return None


@dataclass
class _Tensor:
    type: str
    dims: list[int]
    const_offline: bool  # buffer index > 0 with non-empty data (op_signature.cc)
    const_runtime: bool  # also data stored by offset (models > 2 GB) or in an external buffer
    is_variable: bool
    is_shape_dynamic: bool


@dataclass
class _Op:
    index: int
    name: str  # BuiltinOperator name, or "CUSTOM"
    display: str  # the custom code for custom ops
    custom_name: str
    version: int
    inputs: list[int]
    outputs: list[int]
    builtin_data: dict[str, Any] | None
    custom_options: bytes


def _int_vector(length: int, as_numpy, limit: int) -> list[int]:
    if length <= 0:
        return []
    if length * 4 > limit:
        raise ValueError(f"vector of {length} int32 is longer than the file")
    return [int(v) for v in as_numpy()]


def _read(buf: bytes) -> tuple[list[_Tensor], list[_Op]]:
    schema = schema_module()
    limit = len(buf)
    model = schema.Model.GetRootAs(buf, 0)
    if model.SubgraphsLength() < 1:
        raise ModelFormatError("model has no subgraph")
    sub = model.Subgraphs(0)
    builtin_names = enum_names(schema.BuiltinOperator)
    type_names = enum_names(schema.TensorType)
    for n in (model.BuffersLength(), model.OperatorCodesLength(), sub.TensorsLength(), sub.OperatorsLength()):
        if n * 4 > limit:
            raise ValueError(f"table vector of {n} entries is longer than the file")

    n_buffers = model.BuffersLength()
    buffer_state: dict[int, tuple[bool, bool]] = {}

    def buffer_kind(index: int) -> tuple[bool, bool]:
        if index not in buffer_state:
            if index == 0 or index >= n_buffers:
                buffer_state[index] = (False, False)
            else:
                b = model.Buffers(index)
                has_data = b.DataLength() > 0
                has_offset = b.Offset() > 1 and b.Size() > 0
                buffer_state[index] = (has_data, has_data or has_offset)
        return buffer_state[index]

    tensors: list[_Tensor] = []
    for i in range(sub.TensorsLength()):
        t = sub.Tensors(i)
        # ConvertTensorType leaves kTfLiteNoType for a type it does not know.
        # approximation: TfLiteTypeGetName's spelling of the FLOAT8 types is assumed
        type_name = type_names.get(t.Type(), "NOTYPE").replace("FLOAT8_", "FLOAT8")
        dims = _int_vector(t.ShapeLength(), t.ShapeAsNumpy, limit)
        signature = _int_vector(t.ShapeSignatureLength(), t.ShapeSignatureAsNumpy, limit)
        const_offline, const_runtime = buffer_kind(t.Buffer())
        # approximation: at run time IsConstantTensor() is kTfLiteMmapRo, which we take to be any
        # buffer with data, data stored by offset, or an external buffer (IsTensorBackedByExternalBuffer)
        external = bool(getattr(t, "ExternalBuffer", lambda: 0)())
        tensors.append(_Tensor(type_name, dims, const_offline, const_runtime or external, bool(t.IsVariable()),
                               -1 in signature))

    codes = []
    for i in range(model.OperatorCodesLength()):
        c = model.OperatorCodes(i)
        builtin = max(c.BuiltinCode(), c.DeprecatedBuiltinCode())  # GetBuiltinCode (schema_utils.cc)
        name = builtin_names.get(builtin, f"BUILTIN_{builtin}")
        custom = c.CustomCode().decode("utf-8", "replace") if name == "CUSTOM" and c.CustomCode() else ""
        codes.append((name, custom, c.Version()))

    ops: list[_Op] = []
    for i in range(sub.OperatorsLength()):
        op = sub.Operators(i)
        code_index = op.OpcodeIndex()
        if code_index >= len(codes):
            raise ModelFormatError(f"operator {i} uses opcode {code_index}, but the model has {len(codes)}")
        name, custom, version = codes[code_index]
        raw = b""
        if name == "CUSTOM" and op.CustomOptionsLength() > 0:
            if op.CustomOptionsLength() > limit:
                raise ValueError("custom options are longer than the file")
            raw = op.CustomOptionsAsNumpy().tobytes()
        ops.append(_Op(i, name, custom if name == "CUSTOM" else name, custom, version,
                       _int_vector(op.InputsLength(), op.InputsAsNumpy, limit),
                       _int_vector(op.OutputsLength(), op.OutputsAsNumpy, limit),
                       _builtin_data(schema, op, name), raw))
    return tensors, ops


def _spec(tensors: list[_Tensor], index: int, runtime: bool) -> TensorSpec:
    if index < 0 or index >= len(tensors):  # optional input, or an index the C++ also skips
        return TensorSpec()
    t = tensors[index]
    return TensorSpec(t.type, list(t.dims), t.const_runtime if runtime else t.const_offline, t.is_shape_dynamic)


def _signature(op: _Op, tensors: list[_Tensor], runtime: bool, remap: dict[int, int] | None = None) -> OpSignature:
    remap = remap or {}
    return OpSignature(
        op=op.name,
        inputs=[_spec(tensors, remap.get(i, i), runtime) for i in op.inputs],
        outputs=[_spec(tensors, i, runtime) for i in op.outputs],
        version=op.version,
        custom_name=op.custom_name,
        builtin_data=op.builtin_data,
        # offline (op_signature.cc) never sets custom_initial_data; at runtime the interpreter hands
        # the custom options to the node
        custom_initial_data=_custom_initial_data(op.custom_name, op.custom_options) if runtime else None,
    )


def _guarded(name: str, fn) -> str | None:
    try:
        return fn()
    except (IndexError, KeyError, TypeError) as exc:
        # approximation: the C++ would throw from .at() or read out of bounds on an operator with too
        # few tensors; we call such an operator unsupported instead.
        return f"{name}: operator has too few input/output tensors for its GPU rule ({type(exc).__name__})"


# ---------------------------------------------------------------------------------------------
# The delegate's own gates (model_builder.cc): which ops have a parser, their max versions, the
# parsers that answer without the rules, and the allowed tensor types / rank.
# ---------------------------------------------------------------------------------------------

_RULES, _OK, _ELEMENTWISE, _CAST = "rules", "ok", "elementwise", "cast"
# NewOperationParser: op -> (CheckMaxSupportedOpVersion limit or None, what IsSupported does)
_PARSERS: dict[str, tuple[int | None, str]] = {
    **{name: (2, _ELEMENTWISE) for name in (
        "ABS", "ADD", "ADD_N", "COS", "DIV", "EQUAL", "ELU", "EXP", "FLOOR", "FLOOR_DIV", "FLOOR_MOD", "GELU",
        "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "LOGISTIC", "LOG", "LOGICAL_AND", "MAXIMUM",
        "MINIMUM", "NEG", "NOT_EQUAL", "POW", "RSQRT", "SIGN", "SIN", "SQRT", "SQUARE", "SQUARED_DIFFERENCE",
        "SUB", "TANH")},
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


def check_model(buf: bytes, *, mode: str = "delegate", allow_quant_ops: bool = True) -> list[dict[str, Any]]:
    """One verdict per operator of subgraph 0: {"index", "op", "version", "compatible", "reason"}.

    mode="delegate": what the open-source GPU delegate would take (its op list and version limits,
    the op rules with standard broadcasting, then tensor types and rank); allow_quant_ops mirrors
    the delegate option of that name (on by default in TfLiteGpuDelegateOptionsV2Default).
    mode="offline": the C++ offline check alone (op rules, enhanced broadcasting).
    A corrupt model raises ModelFormatError."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    buf = bytes(buf)
    if len(buf) < 16 or buf[4:8] != b"TFL3":
        raise ModelFormatError("model is not a TFLite flatbuffer (no 'TFL3' identifier)")
    try:
        tensors, ops = _read(buf)
    except ModelFormatError:
        raise
    except Exception as exc:  # the generated accessors raise anything on corrupt input
        raise ModelFormatError(f"model flatbuffer is corrupt ({type(exc).__name__}: {one_line(exc)})") from None

    reasons: dict[int, str | None] = {}
    if mode == "offline":
        for op in ops:
            sig = _signature(op, tensors, runtime=False)
            reasons[op.index] = _guarded(op.display, lambda: check_signature(sig, enhanced_broadcast=True))
    else:
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
