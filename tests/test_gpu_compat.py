"""edgekit.runtime.gpu_compat: the Python port of LiteRT's GPU-delegate compatibility rules.

Real models are converted with TensorFlow once per module; rule cases that TensorFlow cannot produce
on demand are written as flatbuffers with the schema's object API, and the OpSignature cases of the
C++ gpu_compatibility_test.cc are ported one to one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from edgekit.errors import ModelFormatError
from edgekit.runtime import gpu_compat as gc
from edgekit.runtime.gpu_compat import OpSignature, TensorSpec, check_model, check_signature, summary

TYPE_MESSAGE = "OP is supported, but tensor type/shape isn't compatible."


# ---------------------------------------------------------------------------------------------
# Models converted with TensorFlow (module scope: TF is imported and each model converted once)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def _convert_fn(tf, fn, specs, ops=None) -> bytes:
    module = tf.Module()
    module.f = tf.function(fn, input_signature=specs, autograph=False)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    if ops:
        converter.target_spec.supported_ops = ops
    return converter.convert()


def _cnn(tf, batch_size):
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([
        tf.keras.Input((16, 16, 3), batch_size=batch_size),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.DepthwiseConv2D(3),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
        tf.keras.layers.Softmax(),
    ])


@pytest.fixture(scope="module")
def cnn(tf):
    return _cnn(tf, batch_size=1)


@pytest.fixture(scope="module")
def cnn_float(tf, cnn) -> bytes:
    return tf.lite.TFLiteConverter.from_keras_model(cnn).convert()


@pytest.fixture(scope="module")
def cnn_int8(tf, cnn) -> bytes:
    converter = tf.lite.TFLiteConverter.from_keras_model(cnn)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]

    def representative():
        rng = np.random.default_rng(0)
        for _ in range(4):
            yield [rng.random((1, 16, 16, 3), dtype=np.float32)]

    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8
    return converter.convert()


@pytest.fixture(scope="module")
def cnn_fp16(tf, cnn) -> bytes:
    converter = tf.lite.TFLiteConverter.from_keras_model(cnn)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


def _verdicts(buf, **kw):
    return [(r["op"], r["reason"]) for r in check_model(buf, **kw)]


def test_float_keras_cnn_is_fully_compatible(cnn_float):
    for mode in gc.MODES:
        results = check_model(cnn_float, mode=mode)
        assert [r["op"] for r in results] == ["CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "RESHAPE",
                                              "FULLY_CONNECTED", "SOFTMAX"]
        assert all(r["compatible"] and r["reason"] is None for r in results), results
        s = summary(results)
        assert s == {"compatible": True, "fallback_ops": [], "op_share": 1.0, "weight_share": None}


def test_keras_cnn_with_a_dynamic_batch_leaves_its_flatten_shape_ops_on_the_cpu(tf):
    # With batch_size=None, Flatten becomes SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE(x, shape): the
    # rules reject SHAPE, the shrink_axis_mask slice and a RESHAPE whose shape is a runtime tensor.
    buf = tf.lite.TFLiteConverter.from_keras_model(_cnn(tf, batch_size=None)).convert()
    reasons = dict(_verdicts(buf))
    assert reasons["SHAPE"] == "Not supported op SHAPE"
    assert reasons["STRIDED_SLICE"] == "StridedSlice does not support shrink_axis_mask parameter."
    assert reasons["RESHAPE"] == "Expected 1 runtime input tensor(s), but node has 2 runtime input(s)."
    assert reasons["PACK"] == TYPE_MESSAGE  # int32 tensors; the offline rules alone accept PACK
    assert dict(_verdicts(buf, mode="offline"))["PACK"] is None
    assert reasons["CONV_2D"] is None and reasons["FULLY_CONNECTED"] is None


def test_unique_is_not_compatible(tf):
    buf = _convert_fn(tf, lambda x: tf.unique(x)[0], [tf.TensorSpec([8], tf.float32)])
    for mode in gc.MODES:
        assert _verdicts(buf, mode=mode) == [("UNIQUE", "Not supported op UNIQUE")]
    s = summary(check_model(buf))
    assert s["compatible"] is False and s["op_share"] == 0.0
    assert s["fallback_ops"] == [{"index": 0, "op": "UNIQUE", "reason": "Not supported op UNIQUE"}]


def test_int32_add_is_refused_by_the_delegate_for_its_tensor_types(tf):
    buf = _convert_fn(tf, lambda x, y: x + y, [tf.TensorSpec([1, 4, 4, 3], tf.int32)] * 2)
    assert _verdicts(buf) == [("ADD", TYPE_MESSAGE)]
    # gpu_compatibility.cc alone has no type rule for ADD
    assert _verdicts(buf, mode="offline") == [("ADD", None)]


def test_flex_op_is_not_compatible(tf):
    buf = _convert_fn(tf, lambda x: tf.linalg.det(x), [tf.TensorSpec([1, 3, 3], tf.float32)],
                      ops=[tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])
    for mode in gc.MODES:
        assert _verdicts(buf, mode=mode) == [
            ("FlexMatrixDeterminant", "Not supported custom op FlexMatrixDeterminant")]


def test_port_conv3d_model(tf):
    # TEST(CheckGpuDelegateCompatibility, Conv3DModel)
    buf = _convert_fn(tf, lambda x: tf.nn.conv3d(x, tf.ones([2, 2, 2, 3, 4]), [1] * 5, "VALID"),
                      [tf.TensorSpec([1, 4, 4, 4, 3], tf.float32)])
    assert summary(check_model(buf, mode="offline"))["fallback_ops"][0]["reason"] == "Not supported op CONV_3D"


def test_port_flex_model(tf):
    # TEST(CheckGpuDelegateCompatibility, FlexModel): an ADD converted with SELECT_TF_OPS only
    buf = _convert_fn(tf, lambda x, y: x + y, [tf.TensorSpec([1, 4], tf.float32)] * 2,
                      ops=[tf.lite.OpsSet.SELECT_TF_OPS])
    fallback = summary(check_model(buf, mode="offline"))["fallback_ops"]
    assert fallback[0] == {"index": 0, "op": "FlexAddV2", "reason": "Not supported custom op FlexAddV2"}


def test_full_int8_cnn_needs_quantized_ops_allowed(cnn_int8):
    results = check_model(cnn_int8)
    assert [(r["op"], r["version"]) for r in results] == [
        ("CONV_2D", 3), ("DEPTHWISE_CONV_2D", 3), ("MAX_POOL_2D", 2), ("RESHAPE", 1), ("FULLY_CONNECTED", 4),
        ("SOFTMAX", 2)]
    assert summary(results)["compatible"]
    assert summary(check_model(cnn_int8, mode="offline"))["compatible"]
    # without allow_quant_ops the delegate takes float tensors only
    assert {reason for _, reason in _verdicts(cnn_int8, allow_quant_ops=False)} == {TYPE_MESSAGE}


def test_float16_weights_are_bypassed_by_the_delegate_but_not_by_the_offline_check(cnn_fp16):
    delegate = check_model(cnn_fp16)
    assert [r["op"] for r in delegate].count("DEQUANTIZE") == 4
    assert summary(delegate)["compatible"], delegate
    # op_signature.cc sees the dequantized filter and bias as two more runtime inputs
    offline = dict((r["op"], r["reason"]) for r in check_model(cnn_fp16, mode="offline"))
    assert offline["CONV_2D"] == "Expected 1 or 2 input tensor(s), but node has 3 runtime inputs."


def test_logical_op_needs_a_float_cast_or_select_after_it(tf):
    buf = _convert_fn(tf, lambda x, y: tf.greater(x, y), [tf.TensorSpec([1, 4, 4, 3], tf.float32)] * 2)
    assert _verdicts(buf) == [("GREATER", "Not supported logical op case")]


def test_symmetric_mirror_pad_is_not_compatible(tf):
    buf = _convert_fn(tf, lambda x: tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="SYMMETRIC"),
                      [tf.TensorSpec([1, 4, 4, 3], tf.float32)])
    assert _verdicts(buf) == [
        ("MIRROR_PAD", "Only Reflective padding is supported for Mirror Pad operation. But node has 2")]


# ---------------------------------------------------------------------------------------------
# Flatbuffers written with the schema's object API: rules that read options, versions, custom ops
# ---------------------------------------------------------------------------------------------

def _tensor_type(name):
    from ai_edge_litert import schema_py_generated as schema

    return getattr(schema.TensorType, name)


def tiny_model(op, inputs, outputs, options=None, version=1, custom_options=None) -> bytes:
    """One-op model. inputs: [(type, shape, const ndarray or None)]; outputs: [(type, shape)];
    op: a BuiltinOperator name or ("CUSTOM", custom_code); options: (BuiltinOptions name, XxxOptionsT)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT()
    m.version = 3
    m.buffers = [schema.BufferT()]
    code = schema.OperatorCodeT()
    name, custom = (op, None) if isinstance(op, str) else op
    builtin = getattr(schema.BuiltinOperator, name)
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    if custom:
        code.customCode = custom
    m.operatorCodes = [code]
    sub = schema.SubGraphT()
    sub.tensors = []
    for type_name, shape, data in inputs:
        t = schema.TensorT()
        t.type, t.shape, t.name = _tensor_type(type_name), list(shape), f"in{len(sub.tensors)}"
        if data is not None:
            b = schema.BufferT()
            b.data = list(np.ascontiguousarray(data).tobytes())
            m.buffers.append(b)
            t.buffer = len(m.buffers) - 1
        sub.tensors.append(t)
    for type_name, shape in outputs:
        t = schema.TensorT()
        t.type, t.shape, t.name = _tensor_type(type_name), list(shape), f"out{len(sub.tensors)}"
        sub.tensors.append(t)
    n_in = len(inputs)
    operator = schema.OperatorT()
    operator.opcodeIndex = 0
    operator.inputs = list(range(n_in))
    operator.outputs = list(range(n_in, n_in + len(outputs)))
    if options is not None:
        operator.builtinOptionsType = getattr(schema.BuiltinOptions, options[0])
        operator.builtinOptions = options[1]
    if custom_options is not None:
        operator.customOptions = list(custom_options)
    sub.operators = [operator]
    sub.inputs = [i for i, (_, _, d) in enumerate(inputs) if d is None]
    sub.outputs = operator.outputs
    m.subgraphs = [sub]
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _options(name, **fields):
    from ai_edge_litert import schema_py_generated as schema

    o = getattr(schema, name + "T")()
    for k, v in fields.items():
        setattr(o, k, v)
    return name, o


def _conv(version=1, **conv_fields):
    w = np.zeros((4, 3, 3, 3), np.float32)
    return tiny_model("CONV_2D", [("FLOAT32", (1, 8, 8, 3), None), ("FLOAT32", w.shape, w)],
                      [("FLOAT32", (1, 6, 6, 4))],
                      options=_options("Conv2DOptions", **{"strideW": 1, "strideH": 1, **conv_fields}),
                      version=version)


def test_options_are_read_from_the_flatbuffer():
    assert _verdicts(_conv()) == [("CONV_2D", None)]
    assert _verdicts(_conv(strideW=0)) == [
        ("CONV_2D", "Incorrect stride values: stride_height = 1, stride_width = 0")]
    assert _verdicts(_conv(dilationHFactor=0)) == [
        ("CONV_2D", "Incorrect dilation values: dilation_height = 0, dilation_width = 1")]
    assert _verdicts(_conv(fusedActivationFunction=5)) == [("CONV_2D", "TfLiteFusedActivation.kTfLiteActSignBit")]
    softmax = tiny_model("SOFTMAX", [("FLOAT32", (1, 10), None)], [("FLOAT32", (1, 10))],
                         options=_options("SoftmaxOptions", beta=2.0))
    assert _verdicts(softmax, mode="offline") == [("SOFTMAX", "Softmax.beta != 1 is not supported.")]


def test_delegate_version_limits_and_rank_limit():
    assert _verdicts(_conv(version=7)) == [("CONV_2D", "Max version supported: 6. Requested version 7.")]
    assert _verdicts(_conv(version=7), mode="offline") == [("CONV_2D", None)]
    rank5 = tiny_model("ADD", [("FLOAT32", (1, 2, 2, 2, 2), None)] * 2, [("FLOAT32", (1, 2, 2, 2, 2))],
                       options=_options("AddOptions"))
    assert _verdicts(rank5) == [("ADD", TYPE_MESSAGE)]
    assert _verdicts(rank5, mode="offline") == [("ADD", None)]


def test_mean_needs_constant_int32_axes():
    axes = np.array([1, 2], np.int64)
    buf = tiny_model("MEAN", [("FLOAT32", (1, 4, 4, 3), None), ("INT64", (2,), axes)], [("FLOAT32", (1, 3))])
    assert _verdicts(buf, mode="offline") == [("MEAN", "MEAN supports int32 tensor for axes. But node has INT64")]


def test_custom_pooling_reads_its_options_only_at_runtime():
    # MediaPipe stores TfLitePoolParams {padding, stride_w, stride_h, filter_w, filter_h, activation}
    params = np.array([1, 2, 2, 2, 2, 0], "<i4").tobytes()
    buf = tiny_model(("CUSTOM", "MaxPoolingWithArgmax2D"), [("FLOAT32", (1, 4, 4, 3), None)],
                     [("FLOAT32", (1, 2, 2, 3)), ("FLOAT32", (1, 2, 2, 3))], custom_options=params)
    assert _verdicts(buf) == [("MaxPoolingWithArgmax2D", None)]
    # op_signature.cc never fills custom_initial_data, and a custom op has no builtin_data
    assert _verdicts(buf, mode="offline") == [("MaxPoolingWithArgmax2D", "Unable to retrieve builtin_data.")]


def test_resampler_from_a_flatbuffer():
    buf = tiny_model(("CUSTOM", "Resampler"), [("FLOAT32", (2, 4, 4, 3), None), ("FLOAT32", (1, 4, 4, 2), None)],
                     [("FLOAT32", (2, 4, 4, 3))])
    assert _verdicts(buf) == [("Resampler", "src.b != warp.b")]


# ---------------------------------------------------------------------------------------------
# The OpSignature cases of gpu_compatibility_test.cc (LiteRT 2bd0c6fa), one to one
# ---------------------------------------------------------------------------------------------

def _add(dims0, dims1) -> OpSignature:
    return OpSignature("ADD", inputs=[TensorSpec(dims=dims0), TensorSpec(dims=dims1)], builtin_data={"activation": 0})


def test_port_fc_const_input():
    sig = OpSignature("FULLY_CONNECTED", inputs=[TensorSpec(is_const=True)],
                      builtin_data={"activation": 0, "weights_format": 0, "keep_num_dims": False})
    assert check_signature(sig) == "FullyConnected doesn't support constant input."


@pytest.mark.parametrize("dims0, dims1, expected", [
    ([4, 1, 2], [2], None),  # Add1Dto3DBroadcastSuccess
    ([1, 100, 256], [100, 256], "Doesn't support broadcasting - input0: [1,100,256], input1: [100,256]"),
    ([4, 1, 1, 2], [1, 1, 2], "Doesn't support broadcasting - input0: [4,1,1,2], input1: [1,1,2]"),
    ([1, 128, 513, 3], [128, 513, 3], None),  # Add3Dto4DBroadcastSuccess
    ([1, 512, 512, 1], [1, 1], None),  # Add2Dto4DBroadcastSuccess
    ([1, 384, 384, 3], [1, 1], None),  # Add2Dto4DBroadcastSuccess2
    ([1, 4, 4, 10], [1, 10], None),  # Add2Dto4DBroadcastSuccess3
])
def test_port_add_broadcast(dims0, dims1, expected):
    assert check_signature(_add(dims0, dims1)) == expected


def test_enhanced_broadcast_accepts_what_standard_refuses():
    # the offline entry point passes kEnhancedBroadcast
    assert check_signature(_add([1, 100, 256], [100, 256]), enhanced_broadcast=True) is None
    assert check_signature(_add([4, 1, 1, 2], [1, 1, 2]), enhanced_broadcast=True) is None
    assert check_signature(_add([1, 4, 4, 2], [4, 3, 2]), enhanced_broadcast=True) == (
        "Doesn't support broadcasting - input0: [1,4,4,2], input1: [4,3,2]")


def _basic_lstm(depth: int) -> OpSignature:
    const = [False, True, True, False, False]
    return OpSignature("LSTM", inputs=[TensorSpec("FLOAT32", is_const=c) for c in const],
                       outputs=[TensorSpec(), TensorSpec(), TensorSpec(), TensorSpec(dims=[2, depth])],
                       builtin_data={"kernel_type": 1, "activation": 4, "cell_clip": 0.0, "proj_clip": 0.0})


def test_port_basic_lstm_activation_depth():
    assert check_signature(_basic_lstm(5)) == "BasicLSTM activation depth must be a multiple of 4."
    assert check_signature(_basic_lstm(8)) is None


@pytest.mark.parametrize("src, warp, out, expected", [
    ([2, 4, 4, 3], [1, 4, 4, 2], [2, 4, 4, 3], "src.b != warp.b"),  # ResamplerMismatchedBatch
    ([1, 4, 4, 3], [1, 4, 4, 1], [1, 4, 4, 3], "warp.c < 2"),  # ResamplerInvalidChannels
])
def test_port_resampler(src, warp, out, expected):
    sig = OpSignature("CUSTOM", custom_name="Resampler",
                      inputs=[TensorSpec("FLOAT32", src), TensorSpec("FLOAT32", warp)],
                      outputs=[TensorSpec("FLOAT32", out)])
    assert check_signature(sig) == expected


# ---------------------------------------------------------------------------------------------
# summary(), corrupt input, import hygiene
# ---------------------------------------------------------------------------------------------

def test_summary_shares():
    results = [{"index": 0, "op": "CONV_2D", "version": 1, "compatible": True, "reason": None},
               {"index": 1, "op": "UNIQUE", "version": 1, "compatible": False, "reason": "Not supported op UNIQUE"},
               {"index": 2, "op": "FULLY_CONNECTED", "version": 1, "compatible": True, "reason": None},
               {"index": 3, "op": "SOFTMAX", "version": 1, "compatible": True, "reason": None}]
    s = summary(results, {0: 300, 1: 100, 2: 600})
    assert s == {"compatible": False, "op_share": 0.75, "weight_share": 0.9,
                 "fallback_ops": [{"index": 1, "op": "UNIQUE", "reason": "Not supported op UNIQUE"}]}
    assert summary([]) == {"compatible": True, "fallback_ops": [], "op_share": 1.0, "weight_share": None}
    assert summary(results, {})["weight_share"] == 1.0


def test_corrupt_models_raise_model_format_error():
    good = _conv()
    with pytest.raises(ModelFormatError, match="no 'TFL3' identifier"):
        check_model(b"not a model at all")
    with pytest.raises(ModelFormatError):
        check_model(good[:40])
    with pytest.raises(ModelFormatError):
        check_model(b"\xff\xff\xff\x7fTFL3" + bytes(64))
    rng = np.random.default_rng(0)
    for _ in range(300):  # flipped bytes: a verdict or a one-line ModelFormatError, nothing else
        bad = bytearray(good)
        for pos in rng.integers(8, len(bad), size=4):
            bad[pos] = int(rng.integers(0, 256))
        for mode in gc.MODES:
            try:
                check_model(bytes(bad), mode=mode)
            except ModelFormatError as exc:
                assert "\n" not in str(exc)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError):
        check_model(_conv(), mode="analyzer")


def test_module_does_not_import_tensorflow():
    code = ("import sys\nfrom edgekit.runtime import gpu_compat\n"
            "print(','.join(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
