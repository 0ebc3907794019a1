"""gpu_compatibility.cc for the layers: convolutions, pooling, fully connected, batch matmul, LSTM,
softmax, and the custom ops the delegate knows (MediaPipe's transpose-conv-bias, pooling with argmax,
unpooling, Resampler)."""

from __future__ import annotations

from edgekit.runtime.gpu_compat.checks import (
    Flags,
    _check_convolution_input_output,
    _check_inputs_consts_outputs,
    _check_inputs_outputs,
    _check_kernels_and_strides,
    _check_strides,
    _check_strides_and_dilation,
    _check_tensor_is_available,
    _is_activation_supported,
    _num_elements,
    _retrieve_builtin_data,
    _retrieve_custom_initial_data,
    _runtime_inputs,
)
from edgekit.runtime.gpu_compat.signature import _ACT_SIGMOID, _ACT_TANH, _LSTM_FULL, OpSignature


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


def _check_conv_options(sig: OpSignature) -> tuple[dict | None, str | None]:
    """Input/output, strides, dilation and activation: what CONV_2D and DEPTHWISE_CONV_2D share."""
    if e := _check_convolution_input_output(sig):
        return None, e
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return None, e
    if e := _check_strides_and_dilation(opts["stride_height"], opts["stride_width"],
                                        opts["dilation_height_factor"], opts["dilation_width_factor"]):
        return None, e
    return opts, _is_activation_supported(opts["activation"])


def _check_depthwise_conv(sig: OpSignature) -> str | None:
    opts, e = _check_conv_options(sig)
    if e or opts is None:  # (no options: an error said why)
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


def pooling_2d(sig: OpSignature, flags: Flags) -> str | None:
    return _check_pooling_2d(sig)


def depthwise_conv_2d(sig: OpSignature, flags: Flags) -> str | None:
    return _check_depthwise_conv(sig)


def custom(sig: OpSignature, flags: Flags) -> str | None:
    return _check_custom_op(sig)


def conv_2d(sig: OpSignature, flags: Flags) -> str | None:
    return _check_conv_options(sig)[1]


def transpose_conv(sig: OpSignature, flags: Flags) -> str | None:
    if e := _check_convolution_input_output(sig):
        return e
    opts, e = _retrieve_builtin_data(sig)
    return e or _check_strides(opts["stride_height"], opts["stride_width"])


def batch_matmul(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
    if not (len(ins) == 2 and len(outs) == 1):
        return f"Expected 2 inputs and 1 output, got: {len(ins)} inputs and {len(outs)} outputs"
    return None


def fully_connected(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
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


def lstm(sig: OpSignature, flags: Flags) -> str | None:
    ins, outs = sig.inputs, sig.outputs
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


def softmax(sig: OpSignature, flags: Flags) -> str | None:
    opts, e = _retrieve_builtin_data(sig)
    if e:
        return e
    return "Softmax.beta != 1 is not supported." if opts["beta"] != 1 else None


RULES = {
    "AVERAGE_POOL_2D": pooling_2d, "MAX_POOL_2D": pooling_2d, "BATCH_MATMUL": batch_matmul, "CONV_2D": conv_2d,
    "DEPTHWISE_CONV_2D": depthwise_conv_2d, "FULLY_CONNECTED": fully_connected, "LSTM": lstm, "SOFTMAX": softmax,
    "TRANSPOSE_CONV": transpose_conv, "CUSTOM": custom,
}
