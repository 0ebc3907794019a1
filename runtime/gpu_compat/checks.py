"""The shared helpers of gpu_compatibility.cc: tensor counts, strides, kernels, axes, broadcasting. Each
returns None for absl::OkStatus() and the status message otherwise; `if (e := ...): return e` is
RETURN_IF_ERROR."""

from __future__ import annotations

from typing import NamedTuple

from edgekit.runtime.gpu_compat.signature import _ACT_SIGN_BIT, _TFLITE_TYPES, OpSignature, TensorSpec


class Flags(NamedTuple):
    """GpuCompatibilityFlags: kStandard is both False; the offline check enables enhanced broadcasting."""

    enhanced_broadcast: bool = False
    reducible_gather_indices: bool = False


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
    if n == 1 and (e := _check_tensor_is_available(sig, 1)):
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

