"""gpu_compatibility.cc for the tensor ops: type changes (CAST, BITCAST, QUANTIZE, DEQUANTIZE), shape and
data movement (RESHAPE, CONCATENATION, GATHER, SLICE, PAD, RESIZE, ...), selection and reductions."""

from __future__ import annotations

from edgekit.runtime.gpu_compat.checks import (
    Flags,
    _check_axes_are_int32_const,
    _check_inputs_consts_outputs,
    _check_inputs_outputs,
    _check_tensor_is_available,
    _reduces_to_1d_vector,
    _retrieve_builtin_data,
    _type_enum,
    _type_name,
)
from edgekit.runtime.gpu_compat.signature import _MIRROR_REFLECT, _TYPE_SIZE, OpSignature

REDUCE = frozenset({"REDUCE_ALL", "REDUCE_ANY", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "SUM"})


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



def cumsum(sig: OpSignature, flags: Flags) -> str | None:
    return _check_cumsum(sig)


def one_hot(sig: OpSignature, flags: Flags) -> str | None:
    return _check_one_hot(sig)


def select(sig: OpSignature, flags: Flags) -> str | None:
    return _check_select_v2(sig)


def accept(sig: OpSignature, flags: Flags) -> str | None:
    """Ops the rules take as they are."""
    return None


def one_in_one_out(sig: OpSignature, flags: Flags) -> str | None:
    return _check_inputs_outputs(sig, 1, 1)


def _bitcast_shapes(in_dims: list[int], out_dims: list[int], in_size: int, out_size: int) -> str | None:
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


def bitcast(sig: OpSignature, flags: Flags) -> str | None:
    if e := _check_inputs_outputs(sig, 1, 1):
        return e
    in_size = _TYPE_SIZE.get(sig.inputs[0].type)
    if in_size is None:
        return "Could not parse input type"
    out_size = _TYPE_SIZE.get(sig.outputs[0].type)
    if out_size is None:
        return "Could not parse output type"
    return _bitcast_shapes(sig.inputs[0].dims, sig.outputs[0].dims, in_size, out_size)


def cast(sig: OpSignature, flags: Flags) -> str | None:
    if e := _check_inputs_outputs(sig, 1, 1):
        return e
    src, dst = sig.inputs[0].type, sig.outputs[0].type
    if src == "BOOL" and dst in ("FLOAT16", "FLOAT32"):
        return None
    if src in ("FLOAT16", "FLOAT32") and dst == "BOOL":
        return None
    if src in ("FLOAT32", "INT32") and dst in ("FLOAT32", "INT32"):
        return None
    return f"Not supported Cast case. Input type: {_type_name(src)} and output type: {_type_name(dst)}"


def builtin_data_only(sig: OpSignature, flags: Flags) -> str | None:
    return _retrieve_builtin_data(sig)[1]


def densify(sig: OpSignature, flags: Flags) -> str | None:
    return _check_inputs_outputs(sig, 0, 1)


def depth_space(sig: OpSignature, flags: Flags) -> str | None:
    if e := _check_inputs_outputs(sig, 1, 1):
        return e
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return e
    if opts["block_size"] == 1:
        return f"{sig.op} block_size = 1 is a no-op."
    if opts["block_size"] < 1:
        return f"{sig.op} block_size must be > 1."
    return None


def dequantize(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
    if len(ins) != 1 or len(outs) != 1:
        return f"Expected 1 input & output each from Dequantize, got: {len(ins)}, {len(outs)}"
    if ins[0].type == "INT16":
        return "Unsupported dequantization type."
    return None


def embedding_lookup(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
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


def dynamic_update_slice(sig: OpSignature, flags: Flags) -> str | None:
    if len(sig.inputs) != 3:
        return "DynamicUpdateSlice requires 3 inputs."
    operand, update, start = sig.inputs
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


def gather(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
    if _check_inputs_consts_outputs(sig, 2, 0, 1) and _check_inputs_consts_outputs(sig, 1, 1, 1):
        return "Op can only handle 1 or 2 operand(s)."
    for spec in (ins[0], ins[1], outs[0]):
        if len(spec.dims) > 4:  # kMaxBhwcDims
            return "Gather only supports up to 4D input, indices and output."
    if flags.reducible_gather_indices:
        if not _reduces_to_1d_vector(ins[1].dims):
            return "Only support indices that reduce to a 1D vector (all leading dimensions must be 1)"
    elif len(ins[1].dims) != 1:
        return "Only support 1D indices"
    return None if ins[1].type == "INT32" else "Only accept INT32 indices"


def const_axes(sig: OpSignature, flags: Flags) -> str | None:
    """MEAN, the reductions and REVERSE_V2: one runtime input, constant int32 axes."""
    if e := _check_inputs_consts_outputs(sig, 1, 1, 1):
        return e
    return _check_axes_are_int32_const(sig, 1)


def slice_(sig: OpSignature, flags: Flags) -> str | None:
    ins = sig.inputs
    if len(ins) < 3:
        return f"SLICE requires 3 inputs, but node has {len(ins)} inputs."
    if len(ins[0].dims) not in (3, 4):
        return (f"SLICE supports for 3 or 4 dimensional tensors only, but node has {len(ins[0].dims)} "
                "dimensional tensors.")
    return None


def strided_slice(sig: OpSignature, flags: Flags) -> str | None:
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return e
    if opts["ellipsis_mask"]:
        return "StridedSlice does not support ellipsis_mask."
    if opts["new_axis_mask"]:
        return "StridedSlice does not support new_axis_mask."
    if opts["shrink_axis_mask"]:
        return "StridedSlice does not support shrink_axis_mask parameter."
    if len(sig.inputs) < 4:
        return "STRIDED_SLICE requires 4 inputs."
    if len(sig.inputs[0].dims) not in (3, 4):
        return "STRIDED_SLICE supports for 3 or 4 dimensional tensors only."
    return None


def topk(sig: OpSignature, flags: Flags) -> str | None:
    return _check_inputs_outputs(sig, 1, 2)


def resize_bilinear(sig: OpSignature, flags: Flags) -> str | None:
    if e := _check_inputs_outputs(sig, 1, 1):
        return e
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return e
    if opts["align_corners"] and opts["half_pixel_centers"]:
        return "If half_pixel_centers is True, align_corners must be False."
    return None


def resize_nearest_neighbor(sig: OpSignature, flags: Flags) -> str | None:
    return _check_inputs_outputs(sig, 1, 1) or _retrieve_builtin_data(sig)[1]


def pad(sig: OpSignature, flags: Flags) -> str | None:
    if sig.op == "MIRROR_PAD":
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
    paddings = sig.inputs[1]
    if len(paddings.dims) != 2:
        return f"Invalid paddings tensor dimension: expected 2 dim, got {len(paddings.dims)} dim"
    if paddings.dims[0] not in (3, 4) or paddings.dims[1] != 2:
        return f"Invalid paddings tensor shape: expected 4x2 or 3x2, got {paddings.dims[0]}x{paddings.dims[1]}"
    return None


RULES = {
    "BITCAST": bitcast, "CAST": cast, "CONCATENATION": builtin_data_only, "CUMSUM": cumsum, "DENSIFY": densify,
    "DEPTH_TO_SPACE": depth_space, "SPACE_TO_DEPTH": depth_space, "DEQUANTIZE": dequantize,
    "EMBEDDING_LOOKUP": embedding_lookup, "DYNAMIC_UPDATE_SLICE": dynamic_update_slice, "GATHER": gather,
    "HARD_SWISH": one_in_one_out, "MEAN": const_axes, "REVERSE_V2": const_axes, **dict.fromkeys(REDUCE, const_axes),
    **dict.fromkeys(("PACK", "RELU_N1_TO_1", "PRELU", "SPLIT", "SPLIT_V", "RELU", "RELU6", "LEAKY_RELU"), accept),
    "ONE_HOT": one_hot, **dict.fromkeys(("QUANTIZE", "RESHAPE", "TILE", "TRANSPOSE"), one_in_one_out),
    "SELECT": select, "SELECT_V2": select, "SLICE": slice_, "STRIDED_SLICE": strided_slice, "TOPK_V2": topk,
    "RESIZE_BILINEAR": resize_bilinear, "RESIZE_NEAREST_NEIGHBOR": resize_nearest_neighbor,
    "PAD": pad, "PADV2": pad, "MIRROR_PAD": pad,
}
