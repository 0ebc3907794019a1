"""Reading the flatbuffer for the rules: GetOpSignature(op_code, op, subgraph, model) and ParseOpData,
over the shared `runtime.flatbuffer.ModelView`."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from edgekit.errors import ModelFormatError
from edgekit.runtime.flatbuffer import ModelView, OperatorView
from edgekit.runtime.gpu_compat.signature import _LSTM_BASIC, _LSTM_FULL, OpSignature, TensorSpec


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


def _builtin_data(op: OperatorView, name: str) -> dict[str, Any] | None:
    """ParseOpData for the params the rules read. Builtin ops always get a params struct (ParseOpData
    allocates one even when the options table is missing); custom ops get none."""
    if name == "CUSTOM":
        return None
    spec = _OPTIONS.get(name)
    if spec is None:
        return {}
    type_name, reader, zero = spec
    options = op.options(type_name) if op.options_type_name == type_name else None
    if options is None:
        # approximation: a missing or mistyped options table is read as zero-initialised params
        return dict(zero)
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


def _tensors(view: ModelView) -> list[_Tensor]:
    tensors = []
    for t in view.first_subgraph().tensors:
        # ConvertTensorType leaves kTfLiteNoType for a type it does not know.
        # approximation: TfLiteTypeGetName's spelling of the FLOAT8 types is assumed
        type_name = (t.type_name or "NOTYPE").replace("FLOAT8_", "FLOAT8")
        b = view.buffer(t.buffer) if 0 < t.buffer < view.buffer_count else None
        const_offline = b is not None and len(b.data) > 0
        const_runtime = const_offline or (b is not None and b.offset > 1 and b.size > 0)
        # approximation: at run time IsConstantTensor() is kTfLiteMmapRo, which we take to be any
        # buffer with data, data stored by offset, or an external buffer (IsTensorBackedByExternalBuffer)
        tensors.append(_Tensor(type_name, list(t.shape), const_offline, const_runtime or bool(t.external_buffer),
                               t.is_variable, -1 in t.shape_signature))
    return tensors


def _ops(view: ModelView) -> list[_Op]:
    codes = view.op_codes
    ops = []
    for op in view.first_subgraph().operators:
        if op.opcode_index >= len(codes):
            raise ModelFormatError(f"operator {op.index} uses opcode {op.opcode_index}, but the model has {len(codes)}")
        code = codes[op.opcode_index]  # code.name is GetBuiltinCode (schema_utils.cc)
        custom = code.custom_code if code.is_custom else ""
        raw = op.custom_options if code.is_custom else b""
        ops.append(_Op(op.index, code.name, custom if code.is_custom else code.name, custom, code.version,
                       list(op.inputs), list(op.outputs), _builtin_data(op, code.name), raw))
    return ops


def read(view: ModelView) -> tuple[list[_Tensor], list[_Op]]:
    """The tensors and operators of subgraph 0, as the rules and the delegate gates read them."""
    return _tensors(view), _ops(view)


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
