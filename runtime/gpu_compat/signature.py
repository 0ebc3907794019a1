"""OpSignature (tflite/tools/versioning/op_signature.h): what the GPU rules see of one operator, and the
TfLite enums and sizes they compare against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

