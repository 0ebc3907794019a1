"""Configure a TFLiteConverter for each mode and run it, turning its failures into typed errors."""

from __future__ import annotations

import re
import signal
import threading
import warnings
from collections.abc import Callable, Iterable

from edgekit.converters._tf import import_tf, keras_prints_to_logging
from edgekit.converters.recipe import NEEDS_CALIBRATION
from edgekit.errors import ConversionError, UnsupportedOpsError, one_line

_OP_PATTERN = re.compile(r"'(tf\.[A-Za-z0-9_]+|tfl\.[A-Za-z0-9_]+)' op")


SPARSE_MODES = ("float32", "float16")  # XNNPACK's sparse kernels are float ones


def configure(converter, mode: str, io: str, representative: Callable[[], Iterable] | None, *,
              qat: bool = False, sparse: bool = False):
    """Set the converter's options for `mode`; returns the converter. With `qat` the model carries its
    quantization ranges (fake-quant ops from training): no representative data, and no
    TFLITE_BUILTINS_INT8 op set, which TF 2.21's converter only accepts with a representative dataset.
    With `sparse` (pruned weights) a float32 or float16 file stores its mostly-zero kernels in TFLite's
    sparse format (EXPERIMENTAL_SPARSITY: DENSIFY ops unpack them at load; XNNPACK's sparse path reads
    them where it runs); other modes ignore it."""
    tf = import_tf()
    sparsity = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY] if sparse and mode in SPARSE_MODES else []
    if mode == "float32":
        converter.optimizations = sparsity
        return converter
    converter.optimizations = [tf.lite.Optimize.DEFAULT, *sparsity]
    if qat:
        if io != "float32":
            converter.inference_input_type = getattr(tf, io)
            converter.inference_output_type = getattr(tf, io)
        return converter
    if mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif mode in NEEDS_CALIBRATION:
        converter.representative_dataset = representative
        if mode == "int8":
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        else:
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
            ]
        if io != "float32":
            converter.inference_input_type = getattr(tf, io)
            converter.inference_output_type = getattr(tf, io)
    return converter


def _error_text(error: BaseException) -> str:
    """The converter's own account of a failure: a ConverterError's message holds MLIR's diagnostics,
    and its `errors` (ConverterErrorData) name each failing operator and say why."""
    parts = [str(error)]
    for data in getattr(error, "errors", None) or ():
        name = getattr(getattr(data, "operator", None), "name", "")
        message = getattr(data, "error_message", "")
        parts.append(message if not name or name in message else f"'{name}' op: {message}")
    return "\n".join(parts)


def run_converter(converter) -> bytes:
    """`converter.convert()` (or a zero-argument callable that converts); errors name the ops the
    converter named. Its native log goes wherever fd 2 goes (the CLI silences it; a library caller
    decides with TF_CPP_MIN_LOG_LEVEL)."""
    convert = getattr(converter, "convert", converter)
    handler = signal.getsignal(signal.SIGINT)
    with keras_prints_to_logging(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return convert()
        except Exception as exc:  # the converter raises ConverterError, ValueError, RuntimeError  # noqa: BLE001
            error = exc
        finally:
            # MLIR/LLVM installs its own SIGINT handler, which kills the process: give Ctrl-C back to Python
            if handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, handler)
    text = _error_text(error)
    ops = tuple(sorted(set(_OP_PATTERN.findall(text))))
    if ops and ("not supported" in text or "failed to legalize" in text.lower()):
        raise UnsupportedOpsError(
            f"conversion failed: ops not supported by the TFLite builtins: {', '.join(ops)}", ops
        )
    # TFLite's error reporter joins its messages without a break ("out of boundsNode number 3 ...")
    said = re.sub(r"(?<=[^\s.:;])(Node number \d+)", r". \1", one_line(error))
    raise ConversionError(f"conversion failed: {said}", ops)


def quantize_calibrated(model: bytes, io: str, denylisted_nodes: Iterable[str] = (), *,
                        activations: str = "int8", verify: bool = False) -> bytes:
    """TFLite's quantizer (`mlir_quantize`) on a model whose tensors carry calibration ranges; io
    float32, int8 or uint8 as the converter's inference_input/output_type; the ops writing
    `denylisted_nodes` stay float; `activations` int8, or int16 (int16x8: int8 weights); `verify`: with
    TFLite's NumericVerify ops after each quantized op (the quantization debugger's model)."""
    tf = import_tf()
    from tensorflow.lite.python.convert import _types_pb2, mlir_quantize

    io_type = getattr(tf, io)
    nodes = list(denylisted_nodes) or None
    inference = _types_pb2.QUANTIZED_INT16 if activations == "int16" else _types_pb2.QUANTIZED_INT8
    return run_converter(lambda: mlir_quantize(model, input_data_type=io_type, output_data_type=io_type,
                                               denylisted_nodes=nodes, inference_type=inference,
                                               enable_numeric_verify=verify))
