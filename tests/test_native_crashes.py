"""Files that crash LiteRT's native code or ask it for unbounded memory: one generator per class, each
refused in one line (exit 3) by the preflight before LiteRT sees the bytes, on every path (Model, run,
bench, inspect --probe). Premise tests show the bare interpreter really crashes on a sample of each class,
so the refusals are not of harmless files. The files are written with the flatbuffer object API
(tests/tflite_build.py): no TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from edgekit.runtime.inspect import analyze
from edgekit.runtime.model import Model
from edgekit.runtime.op_rules import READS_TENSOR_SCALE, op_table, operand_counts
from edgekit.runtime.preflight import validate
from helpers import run_cli_many
from tflite_build import Op, Tensor, model, one_op

from edgekit.errors import ModelFormatError

BARE = ("import sys\nfrom ai_edge_litert.interpreter import Interpreter\n"
        "i = Interpreter(model_content=sys.stdin.buffer.read(), num_threads=1)\n"
        "for key in i.get_signature_list():\n    i.get_signature_runner(key).get_input_details()\n"
        "i.allocate_tensors()\ni.invoke()\nprint('ran')\n")


def bare_interpreter(data: bytes, tries: int = 4) -> int:
    """The exit status of a plain LiteRT interpreter loading and running `data` in a child, the first crash
    (< 0) of `tries` runs: a missing operand is a read out of bounds, whose outcome moves with the memory
    layout, so each run gets an environment of another size."""
    for i in range(tries):
        env = dict(os.environ, EDGEKIT_TEST_PAD="x" * (397 * i))
        proc = subprocess.run([sys.executable, "-c", BARE], input=data, capture_output=True, timeout=120, env=env)
        if proc.returncode < 0:
            break
    return proc.returncode


def refused(data: bytes) -> str:
    with pytest.raises(ModelFormatError) as err:
        validate(data, "m.tflite")
    return str(err.value)


def F(*shape, **kw) -> Tensor:
    return Tensor(shape, **kw)


def Q(*shape, kind="INT8", scale=0.05) -> Tensor:
    return Tensor(shape, kind, scales=[scale], zero_points=[0])


# -- a missing operand (-1) where the kernel requires one -----------------------------------------------------

def _operands(name: str, kind: str = "inputs") -> int:
    """How many inputs (or outputs) to give a hand-made `name`: the least its kernel takes, else one."""
    least, _ = operand_counts(name, kind)
    return 1 if least is None else least


def _inputs(name: str) -> int:
    """Inputs to give a hand-made `name`: its least count, one where none is required but some are taken."""
    return _operands(name) or (0 if operand_counts(name)[1] == 0 else 1)


def missing_operand_cases():
    """Every builtin with a kernel, with -1 at each input position the table calls required."""
    for name, entry in sorted(op_table().items()):
        if not entry.get("kernel"):
            continue
        optional = set(entry.get("optional_inputs") or ())
        for position in range(_inputs(name)):
            if position not in optional:
                yield name, position


def _with_missing(name: str, position: int) -> bytes:
    inputs = [F(1, 4) for _ in range(_inputs(name))]
    inputs[position] = -1
    return one_op(name, inputs, [F(1, 4) for _ in range(_operands(name, "outputs"))])


def test_every_builtin_with_a_missing_required_operand_is_refused_naming_it():
    cases = list(missing_operand_cases())
    assert len({name for name, _ in cases}) > 150  # the table covers the schema's builtins
    for name, position in cases:
        message = refused(_with_missing(name, position))
        assert f"({name}) has no tensor for input {position}" in message, (name, position, message)


PREMISES = {  # the red team's crashes: operands, output, options
    "CONV_2D": ([F(1, 4, 4, 1), -1, F(1, data=np.zeros(1))], F(1, 4, 4, 1), "Conv2DOptions",
                {"strideW": 1, "strideH": 1}),
    "FULLY_CONNECTED": ([F(1, 4), -1, -1], F(1, 4), "FullyConnectedOptions", {}),
    "LOGISTIC": ([-1], F(1, 4), None, {}),
    "CONCATENATION": ([-1, F(1, 4)], F(1, 8), "ConcatenationOptions", {"axis": 1}),
    "TANH": ([-1], F(1, 4), None, {}),
    "DIV": ([F(1, 4), -1], F(1, 4), "DivOptions", {}),
}


@pytest.mark.parametrize("name", sorted(PREMISES))
def test_premise_a_missing_required_operand_crashes_the_bare_interpreter(name):
    inputs, output, options, values = PREMISES[name]
    data = one_op(name, inputs, [output], options, **values)
    assert bare_interpreter(data) < 0
    assert "which its kernel requires" in refused(data)


def test_optional_operands_stay_accepted():
    """A fully connected layer or a transposed convolution without a bias is a real model: it loads and runs."""
    fc = one_op("FULLY_CONNECTED", [F(1, 4), F(3, 4, data=np.ones((3, 4))), -1], [F(1, 3)], "FullyConnectedOptions")
    out = Model(fc, probe=False).invoke_raw([np.ones((1, 4), np.float32)])[0]
    np.testing.assert_array_equal(out, [[4, 4, 4]])


def test_operand_counts_the_kernel_asserts_are_refused():
    message = refused(one_op("FULLY_CONNECTED", [F(1, 4)], [F(1, 4)], "FullyConnectedOptions"))
    assert "has 1 inputs; its kernel takes 2 to 3" in message
    assert "missing output" in refused(one_op("RELU", [F(1, 4)], [-1]))


# -- integer operands of kernels that read one per-tensor scale ------------------------------------------------

def quantization_cases():
    for name in sorted(READS_TENSOR_SCALE):
        out = F(1, 4, type="BOOL") if name not in ("ADD", "SUB", "SQUARED_DIFFERENCE") else Q(1, 4)
        for kind, tensor in (("no scale", F(1, 4, type="INT8")),
                             ("per-channel", Tensor((1, 4), "INT8", scales=[0.1] * 4, zero_points=[0] * 4, axis=1))):
            yield name, kind, one_op(name, [tensor, Q(1, 4)], [out])


@pytest.mark.parametrize("name,kind,data", list(quantization_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_integer_operands_without_one_scale_are_refused(name, kind, data):
    message = refused(data)
    assert f"({name}) takes INT8 tensor 0" in message
    assert ("no quantization scale" if kind == "no scale" else "4 (per-channel) scales") in message


@pytest.mark.parametrize("name,kind", [("ADD", "no scale"), ("LESS", "per-channel")])
def test_premise_such_operands_abort_the_bare_interpreter(name, kind):
    data = next(d for n, k, d in quantization_cases() if n == name and k == kind)
    assert bare_interpreter(data) < 0


def test_a_per_channel_weight_stays_accepted_where_kernels_take_one():
    weights = Tensor((3, 4), "INT8", data=np.ones((3, 4)), scales=[0.1, 0.2, 0.3], zero_points=[0, 0, 0])
    validate(one_op("FULLY_CONNECTED", [Q(1, 4), weights, -1], [Q(1, 3)], "FullyConnectedOptions"))
    alpha = Tensor((1, 4), "INT8", data=np.ones((1, 4)), scales=[0.1] * 4, zero_points=[0] * 4, axis=1)
    validate(one_op("PRELU", [Q(1, 4), alpha], [Q(1, 4)]))


# -- subgraphs that run each other, signatures, strings --------------------------------------------------------

def call_loops():
    """Subgraphs 1..n that run the next in a ring (CALL_ONCE, or WHILE's body), n = 1 .. 4."""
    for n in range(1, 5):
        for via in ("CALL_ONCE", "WHILE"):
            subgraphs = [[Op("CALL_ONCE", [], [], "CallOnceOptions", {"initSubgraphIndex": 1}),
                          Op("RELU", [F(1, 4)], [F(1, 4)])]]
            for i in range(1, n + 1):
                nxt = i % n + 1
                if via == "CALL_ONCE":
                    subgraphs.append([Op("CALL_ONCE", [], [], "CallOnceOptions", {"initSubgraphIndex": nxt})])
                else:
                    subgraphs.append([Op("WHILE", [F(1, type="INT32")], [F(1, type="INT32")], "WhileOptions",
                                         {"condSubgraphIndex": nxt, "bodySubgraphIndex": nxt})])
            yield n, via, model(subgraphs, graph_inputs=[[0]] + [[] for _ in range(n)],
                                graph_outputs=[[1]] + [[] for _ in range(n)])


@pytest.mark.parametrize("n,via,data", list(call_loops()), ids=lambda v: str(v) if not isinstance(v, bytes) else "")
def test_subgraphs_that_run_each_other_in_a_loop_are_refused(n, via, data):
    assert "run each other in a loop" in refused(data)


def test_premise_two_subgraphs_calling_each_other_crash_the_bare_interpreter():
    data = next(d for n, via, d in call_loops() if n == 2 and via == "CALL_ONCE")
    assert bare_interpreter(data) < 0


def test_a_call_to_a_subgraph_that_is_not_there_is_refused():
    data = model([[Op("CALL_ONCE", [], [], "CallOnceOptions", {"initSubgraphIndex": 7}),
                   Op("RELU", [F(1, 4)], [F(1, 4)])]])
    assert "runs subgraph 7" in refused(data)


@pytest.mark.parametrize("signature,words", [
    ({"subgraph": 5, "inputs": {"x": 0}, "outputs": {"y": 1}}, "runs subgraph 5 of 1"),
    ({"inputs": {"x": 999}, "outputs": {"y": 1}}, "names tensor 999 for 'x'"),
    ({"inputs": {"x": 0}, "outputs": {"y": 2**31}}, f"names tensor {2**31} for 'y'"),
])
def test_signatures_naming_what_is_not_there_are_refused(signature, words):
    assert words in refused(model([[Op("RELU", [F(1, 4)], [F(1, 4)])]], signatures=[signature]))


def test_premise_a_signature_of_a_missing_subgraph_crashes_the_bare_interpreter():
    data = model([[Op("RELU", [F(1, 4)], [F(1, 4)])]], signatures=[{"subgraph": 5, "inputs": {"x": 0},
                                                                     "outputs": {"y": 1}}])
    assert bare_interpreter(data) < 0


def _strings(count: int, offsets: list[int], tail: bytes) -> bytes:
    return np.array([count, *offsets], "<i4").tobytes() + tail


def string_buffers(seed: int = 0, n: int = 40):
    """(valid?, buffer): TFLite's packed strings, good ones and ones with a count or an offset out of place."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        words = [bytes(rng.integers(97, 123, rng.integers(0, 6)).astype(np.uint8)) for _ in range(rng.integers(1, 4))]
        header = 4 * (len(words) + 2)
        offsets = list(np.cumsum([header] + [len(w) for w in words]))
        yield True, _strings(len(words), offsets, b"".join(words))
        bad = list(offsets)
        how = rng.integers(0, 4)
        if how == 0:
            bad[-1] += int(rng.integers(1, 10**6))  # past the end
        elif how == 1 and len(bad) > 2:
            bad[1], bad[2] = bad[2] + 1, bad[1]  # falling
        elif how == 2:
            bad[0] = 0  # inside the header
        else:
            yield False, _strings(-int(rng.integers(1, 2**31 - 1)), bad, b"".join(words))
            continue
        yield False, _strings(len(words), bad, b"".join(words))


def _strings_model(buffer: bytes) -> bytes:
    return model([[Op("RESHAPE", [F(1, type="STRING", data=buffer), F(1, type="INT32", data=[1])],
                      [F(1, type="STRING")])]], graph_inputs=[[]], graph_outputs=[[2]])


def test_constant_strings_are_checked_against_their_buffer():
    for ok, buffer in string_buffers():
        data = _strings_model(buffer)
        if ok:
            validate(data)
        else:
            assert "holds strings whose offsets do not fit its buffer" in refused(data)


# -- memory a file can ask for -------------------------------------------------------------------------------

def memory_cases():
    yield "a 12000x12000x3 float input", one_op("RELU", [F(1, 12000, 12000, 3)], [F(1, 12000, 12000, 3)])
    yield "ONE_HOT of depth 2^30", one_op(
        "ONE_HOT", [F(1, type="INT32"), F(data=np.int32(2**30), type="INT32"), F(data=np.float32(1)),
                    F(data=np.float32(0))], [F(1, 1)], "OneHotOptions", axis=-1)
    yield "TILE by 2^14 x 2^14", one_op("TILE", [F(1, 4), F(2, type="INT32", data=[2**14, 2**14])], [F(1, 4)])
    yield "FILL of 2^31 elements", one_op("FILL", [F(2, type="INT32", data=[2**16, 2**15]), F(data=np.float32(1))],
                                          [F(1, 1)])
    yield "BROADCAST_TO 2^30", one_op("BROADCAST_TO", [F(1, 1), F(2, type="INT32", data=[2**15, 2**15])], [F(1, 1)])


@pytest.mark.parametrize("what,data", list(memory_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_file_asking_for_more_tensor_memory_than_the_limit_is_refused(what, data):
    assert "of tensors at once, over the limit of 1,024 MiB (EDGEKIT_MAX_TENSOR_MB raises it)" in refused(data)


def test_the_tensor_memory_limit_is_configurable(monkeypatch):
    data = one_op("RELU", [F(1, 600, 600, 3)], [F(1, 600, 600, 3)])  # 8.2 MB at once
    validate(data)
    monkeypatch.setenv("EDGEKIT_MAX_TENSOR_MB", "4")
    assert "needs 8 MiB of tensors at once, over the limit of 4 MiB" in refused(data)


def test_lrn_radius_outside_what_its_kernel_loops_over_is_refused():
    def lrn(radius):
        return one_op("LOCAL_RESPONSE_NORMALIZATION", [F(1, 2, 2, 4)], [F(1, 2, 2, 4)],
                      "LocalResponseNormalizationOptions", radius=radius, bias=1.0, alpha=1.0, beta=0.5)

    for radius in (-5, 2**30):  # 2^30 crashes too, after looping for 12 s
        assert f"Radius = {radius}, outside 0..1048576" in refused(lrn(radius))
    assert bare_interpreter(lrn(-5)) < 0
    validate(lrn(2))


# -- every command ----------------------------------------------------------------------------------------------

def one_of_each_class():
    yield "missing operand", _with_missing("CONV_2D", 1)
    yield "int8 ADD without a scale", next(d for n, k, d in quantization_cases() if n == "ADD")
    yield "CALL_ONCE loop", next(d for n, via, d in call_loops() if n == 2)
    yield "signature of subgraph 5", model([[Op("RELU", [F(1, 4)], [F(1, 4)])]],
                                           signatures=[{"subgraph": 5, "inputs": {"x": 0}, "outputs": {"y": 1}}])
    yield "12000x12000x3 input", next(d for w, d in memory_cases())


def test_each_class_is_one_line_exit_3_in_every_command(tmp_path, digits_dir):
    argvs, names = [], []
    for i, (what, data) in enumerate(one_of_each_class()):
        path = tmp_path / f"case{i}.tflite"
        path.write_bytes(data)
        for argv in (["run", path, "--source", digits_dir / "test" / "3", "--max-frames", "1"],
                     ["bench", path, "--runs", "2", "--warmup", "1"], ["inspect", path, "--probe", "--no-gpu"]):
            argvs.append(argv)
            names.append(f"{what}: {argv[0]}")
    many = run_cli_many(argvs)
    for name, r in zip(names, many.runs):
        assert r.returncode == 3, (name, r.stderr)
        assert len(r.error_lines) == 1 and r.error_lines[0].startswith("edgekit: error: "), (name, r.stderr)
    assert many.peak_mb < 1024


# -- where the kernels' own sources allow what crashes (the probe of scripts/make_op_table.py) -----------------

def test_a_reshape_whose_shape_tensor_is_missing_is_refused():
    data = one_op("RESHAPE", [F(1, 4), -1], [F(4)])
    assert bare_interpreter(data) < 0
    assert "(RESHAPE) has no tensor for input 1" in refused(data)
    validate(one_op("RESHAPE", [F(1, 4)], [F(4)], "ReshapeOptions", newShape=[4]))  # the one-input form


def test_a_depthwise_convolution_without_a_bias_operand_is_refused():
    data = one_op("DEPTHWISE_CONV_2D", [F(1, 4, 4, 2), F(1, 3, 3, 2, data=np.ones((1, 3, 3, 2)))], [F(1, 4, 4, 2)],
                  "DepthwiseConv2DOptions", strideW=1, strideH=1, depthMultiplier=1)
    assert bare_interpreter(data) < 0
    assert "(DEPTHWISE_CONV_2D) has 2 inputs; its kernel takes 3" in refused(data)


def _lstm(missing: set[int]) -> bytes:
    """A UNIDIRECTIONAL_SEQUENCE_LSTM's 24 operands (inputs 18 and 19 are its state variables), `missing` as -1."""
    inputs = [-1 if i in missing else F(1, 4) for i in range(24)]
    return one_op("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs, [F(1, 1, 4)])


def test_an_lstms_input_gate_bias_may_be_missing_only_with_its_input_gate():
    assert "(UNIDIRECTIONAL_SEQUENCE_LSTM) has no tensor for input 12" in refused(_lstm({12}))
    for cifg in ({1, 5, 9, 12}, {1, 5, 9, 12, 20}):  # no input gate at all: a CIFG LSTM
        validate(_lstm(cifg))


def test_the_probe_says_what_the_preflight_says_on_every_class():
    """`inspect --probe` and the default probe run the same preflight in the child: the verdicts agree, word
    for word, with the in-process one."""
    from edgekit.runtime.probe import probe_bytes

    cases = [data for _, data in one_of_each_class()]
    cases += [d for i, (_, _, d) in enumerate(quantization_cases()) if i % 4 == 0]
    cases += [data for _, data in memory_cases()][1:] + [_strings_model(next(b for ok, b in string_buffers() if not ok))]
    for data in cases:
        here = refused(data)
        with pytest.raises(ModelFormatError) as there:
            probe_bytes(data, "m.tflite")
        assert str(there.value) == here


def test_operators_sharing_one_huge_inputs_vector_are_refused_before_the_work_grows():
    """20,000 operators whose inputs and outputs are the same 200,000-entry vector: 8 billion operand reads
    from an 880 KB file. Refused (a corrupt flatbuffer, exit 3) in well under a second of parsing."""
    import flatbuffers
    from edgekit.runtime.schema import schema_module

    s = schema_module()
    b = flatbuffers.Builder(1024)
    s.OperatorStartInputsVector(b, 200_000)
    for _ in range(200_000):
        b.PrependInt32(0)
    operands = b.EndVector()
    name = b.CreateString("t")
    s.TensorStart(b), s.TensorAddName(b, name)
    tensor = s.TensorEnd(b)
    s.OperatorStart(b), s.OperatorAddInputs(b, operands), s.OperatorAddOutputs(b, operands)
    op = s.OperatorEnd(b)

    def vector(start, items, prepend):
        start(b, len(items))
        for item in items:
            prepend(item)
        return b.EndVector()

    ops = vector(s.SubGraphStartOperatorsVector, [op] * 20_000, b.PrependUOffsetTRelative)
    tensors = vector(s.SubGraphStartTensorsVector, [tensor], b.PrependUOffsetTRelative)
    io_ = vector(s.SubGraphStartInputsVector, [0], b.PrependInt32)
    s.SubGraphStart(b), s.SubGraphAddTensors(b, tensors), s.SubGraphAddOperators(b, ops)
    s.SubGraphAddInputs(b, io_), s.SubGraphAddOutputs(b, io_)
    subgraphs = vector(s.ModelStartSubgraphsVector, [s.SubGraphEnd(b)], b.PrependUOffsetTRelative)
    s.OperatorCodeStart(b)
    codes = vector(s.ModelStartOperatorCodesVector, [s.OperatorCodeEnd(b)], b.PrependUOffsetTRelative)
    s.BufferStart(b)
    buffers = vector(s.ModelStartBuffersVector, [s.BufferEnd(b)], b.PrependUOffsetTRelative)
    s.ModelStart(b), s.ModelAddVersion(b, 3), s.ModelAddSubgraphs(b, subgraphs)
    s.ModelAddOperatorCodes(b, codes), s.ModelAddBuffers(b, buffers)
    b.Finish(s.ModelEnd(b), b"TFL3")
    data = bytes(b.Output())
    assert len(data) < 1_000_000
    for load in (lambda: Model(data, probe=False), lambda: analyze(data)):
        with pytest.raises(ModelFormatError, match="declares far more than its bytes hold"):
            load()
