"""`edgekit inspect --probe` and `edgekit run --probe` (README "Untrusted models"): a good model probes
fine and gives the same answers; a model that really crashes LiteRT's native code is a one-line exit 3.

The crashing model is real: a BROADCAST_ARGS of two constant shapes that do not broadcast passes edgekit's
preflight, and LiteRT's kernel aborts while the model loads (SIGABRT). The models are written here with the flatbuffer object API, so these tests need
no TensorFlow. (The earlier crasher, a SPLIT whose `num_splits` disagrees with its outputs, is now caught
by the preflight: see the test of `run` without --probe.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

CLI = "import sys\nfrom edgekit.cli import main\nmain(sys.argv[1:], prog_name='edgekit')\n"


def split_model(num_splits: int) -> bytes:
    """x [1, 4] float32 -> SPLIT on axis 1 -> a [1, 2], b [1, 2]; `num_splits` as given (2 is right)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    def tensor(name, shape, kind, buffer):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, shape, kind, buffer
        return t

    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.SPLIT
    code.version = 1
    axis = s.BufferT()
    axis.data = np.frombuffer(np.int32(1).tobytes(), np.uint8)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2, 3]
    op.builtinOptionsType = s.BuiltinOptions.SplitOptions
    op.builtinOptions = s.SplitOptionsT()
    op.builtinOptions.numSplits = num_splits
    sub = s.SubGraphT()
    sub.name = "main"
    sub.tensors = [tensor("axis", [], s.TensorType.INT32, 1), tensor("x", [1, 4], s.TensorType.FLOAT32, 2),
                   tensor("a", [1, 2], s.TensorType.FLOAT32, 3), tensor("b", [1, 2], s.TensorType.FLOAT32, 4)]
    sub.operators, sub.inputs, sub.outputs = [op], [1], [2, 3]
    model = s.ModelT()
    model.version, model.description = 3, "split"
    model.operatorCodes, model.subgraphs = [code], [sub]
    model.buffers = [s.BufferT(), axis, s.BufferT(), s.BufferT(), s.BufferT()]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def crashing_model() -> bytes:
    """x [1, 4] float32 -> RELU -> y, beside BROADCAST_ARGS of the constant shapes [2, 3] and [5], which do
    not broadcast: LiteRT's kernel aborts (SIGABRT) while the model loads. The preflight has no rule for it:
    this is what the child-process probe is for."""
    from tflite_build import Op, Tensor, model

    shape = lambda *v: Tensor((len(v),), "INT32", data=list(v))  # noqa: E731
    return model([[Op("RELU", [Tensor((1, 4))], [Tensor((1, 4))]),
                   Op("BROADCAST_ARGS", [shape(2, 3), shape(5)], [Tensor((2,), "INT32")])]],
                 graph_inputs=[[0]], graph_outputs=[[1, 4]])


def int8_add_model(out_scale: float, in_scale: float = 0.5) -> bytes:
    """x, y [1, 4] int8 (scale `in_scale`) -> ADD -> z [1, 4] int8 (scale `out_scale`), zero points 0.
    LiteRT's int8 ADD needs 2 * in_scale / (2**20 * out_scale) < 1: at or over 1 its Prepare aborts."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    def tensor(name, buffer, scale):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, [1, 4], s.TensorType.INT8, buffer
        t.quantization = s.QuantizationParametersT()
        t.quantization.scale, t.quantization.zeroPoint = [scale], [0]
        return t

    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.ADD
    code.version = 2
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    op.builtinOptionsType = s.BuiltinOptions.AddOptions
    op.builtinOptions = s.AddOptionsT()
    sub = s.SubGraphT()
    sub.name = "main"
    sub.tensors = [tensor("x", 1, in_scale), tensor("y", 2, in_scale), tensor("model/quant_add/add", 3, out_scale)]
    sub.operators, sub.inputs, sub.outputs = [op], [0, 1], [2]
    model = s.ModelT()
    model.version, model.description = 3, "int8 add"
    model.operatorCodes, model.subgraphs = [code], [sub]
    model.buffers = [s.BufferT() for _ in range(4)]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def cli(*args, timeout: float = 120):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("EDGEKIT_DEBUG", None)
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def error_lines(proc) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def crasher(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "broadcast_crash.tflite"
    path.write_bytes(crashing_model())
    return path


@pytest.fixture(scope="module")
def split_ok(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "split_ok.tflite"
    path.write_bytes(split_model(2))
    return path


def test_the_crashing_model_really_kills_an_unprotected_interpreter(crasher):
    """The premise of the tests below: without a child process this model takes the process down."""
    code = ("import sys, numpy as np\nfrom edgekit.runtime import Model\n"
            "m = Model(sys.argv[1], delegate='cpu', num_threads=1, probe=False)\n"
            "m.invoke_raw([np.zeros((1, 4), np.float32)])\nprint('survived')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(crasher)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGABRT and "survived" not in proc.stdout


def test_inspect_probe_of_a_good_model_adds_the_probe_and_changes_nothing_else(split_ok):
    plain = cli("inspect", split_ok, "--json")
    probed = cli("inspect", split_ok, "--json", "--probe")
    assert plain.returncode == 0 and probed.returncode == 0, probed.stderr
    a, b = json.loads(plain.stdout), json.loads(probed.stdout)
    probe = b.pop("probe")
    assert a == b
    assert probe["ok"] is True
    assert [(t["name"], t["shape"]) for t in probe["outputs"]] == [("a", [1, 2]), ("b", [1, 2])]


def test_inspect_probe_of_the_digits_model_text_output(converted):
    plain = cli("inspect", converted("int8"))
    probed = cli("inspect", converted("int8"), "--probe")
    assert plain.returncode == 0 and probed.returncode == 0, probed.stderr
    assert probed.stderr.strip() == ""
    assert plain.stdout.splitlines()[:3] == probed.stdout.splitlines()[:3]


def test_inspect_probe_of_a_crashing_model_is_one_line_exit_3(crasher):
    without = cli("inspect", crasher)  # inspect alone reads the flatbuffer, it never runs the model
    assert without.returncode == 0 and "BROADCAST_ARGS" in without.stdout
    proc = cli("inspect", crasher, "--probe")
    assert proc.returncode == 3
    lines = error_lines(proc)
    assert len(lines) == 1 and _crashed_or_refused(lines[0], crasher), lines
    assert proc.stdout == ""


def test_run_probe_of_a_crashing_model_is_one_line_exit_3(crasher, digits_dir):
    proc = cli("run", crasher, "--probe", "--source", digits_dir / "test" / "3" / "0045.png", "--task", "raw")
    assert proc.returncode == 3
    lines = error_lines(proc)
    assert len(lines) == 1 and _crashed_or_refused(lines[0], crasher), lines
    assert proc.stdout == ""


def _crashed_or_refused(line: str, crasher) -> bool:
    return line == (f"edgekit: error: {crasher}: unsafe or malformed model: the interpreter crashed (SIGABRT) while "
                    "loading or running it")


@pytest.mark.parametrize("command", ["run", "bench"])
def test_run_and_bench_probe_a_file_they_have_no_verdict_for_by_default(crasher, digits_dir, command):
    args = ["--source", digits_dir / "test" / "3", "--task", "raw"] if command == "run" else ["--runs", "2"]
    proc = cli(command, crasher, *args)
    assert proc.returncode == 3, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and _crashed_or_refused(lines[0], crasher), lines


def test_no_probe_is_the_users_own_risk(crasher, digits_dir):
    proc = cli("run", crasher, "--no-probe", "--source", digits_dir / "test" / "3", "--task", "raw")
    assert proc.returncode == -signal.SIGABRT


@pytest.mark.parametrize("num_splits", [3, 0])
def test_run_without_probe_on_a_split_whose_count_is_wrong_is_one_line_exit_3(num_splits, tmp_path, digits_dir):
    """The former crasher: a SPLIT whose num_splits is not its 2 outputs killed the interpreter (SIGSEGV).
    The preflight now rejects it before LiteRT sees it, so even without --probe it is a one-line error."""
    path = tmp_path / f"split_{num_splits}.tflite"
    path.write_bytes(split_model(num_splits))
    proc = cli("run", path, "--source", digits_dir / "test" / "3" / "0045.png", "--task", "raw")
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert error_lines(proc) == [f"edgekit: error: {path}: operator 0 has NumSplits = {num_splits} but 2 outputs"]
    assert proc.stdout == ""


def _answers(stdout: str) -> list[tuple]:
    rows = [json.loads(line) for line in stdout.splitlines()]
    return [(r["name"], [(x["label"], round(x["score"], 6)) for x in r["results"]]) for r in rows[:-1]]


def test_run_probe_of_a_good_model_gives_the_same_answers(converted, digits_dir):
    args = ("run", converted("int8"), "--source", digits_dir / "test" / "7", "--json", "--top-k", "2")
    plain, probed = cli(*args), cli(*args, "--probe")
    assert plain.returncode == 0 and probed.returncode == 0, probed.stderr
    a, b = _answers(plain.stdout), _answers(probed.stdout)
    assert len(a) == len(list((digits_dir / "test" / "7").glob("*.png"))) > 10
    assert a == b
    assert sum(r[1][0][0] == "7" for r in a) >= len(a) - 2


def test_run_probe_of_a_file_that_is_not_a_model_is_exit_3(tmp_path, digits_dir):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\0\0\0\0TFL3" + os.urandom(200))
    proc = cli("run", bad, "--probe", "--source", digits_dir / "test" / "3")
    assert proc.returncode == 3
    lines = error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("edgekit: error:") and "bad.tflite" in lines[0]


# 2 * 0.5 / 2**20 = 9.54e-7: the smallest output scale LiteRT's int8 ADD takes beside inputs of scale 0.5
@pytest.mark.parametrize("factor, runs", [(1.02, True), (0.98, False), (1e-3, False)])
def test_an_int8_add_whose_output_scale_its_kernel_aborts_on_is_refused_before_loading(factor, runs, tmp_path):
    """QAT on an untrained MobileNetV3Small gave an ADD output scale 6.5e-9 beside an input's 0.0039, and the
    file killed the process (SIGABRT in the kernel's Prepare). The preflight computes the kernel's own
    condition: just over the limit the file runs in a bare interpreter, just under it aborts there, and edgekit
    refuses it with one line before LiteRT sees it."""
    path = tmp_path / "add.tflite"
    path.write_bytes(int8_add_model(factor * 2 * 0.5 / 2**20))
    bare = ("import sys, numpy as np\nfrom ai_edge_litert.interpreter import Interpreter\n"
            "it = Interpreter(model_path=sys.argv[1]); it.allocate_tensors()\n"
            "for d in it.get_input_details(): it.set_tensor(d['index'], np.full((1, 4), 3, np.int8))\n"
            "it.invoke(); print(it.get_tensor(it.get_output_details()[0]['index']).tolist())\n")
    proc = subprocess.run([sys.executable, "-c", bare, str(path)], capture_output=True, text=True, timeout=60)
    assert (proc.returncode == 0) == runs, (proc.returncode, proc.stderr[-300:])
    if runs:
        assert json.loads(proc.stdout) == [[127] * 4]  # 3 + 3 at scale 0.5 = 3.0: far past the output's range
    if runs:
        from edgekit.runtime import Model

        Model(path, delegate="cpu")  # the preflight lets it through
        return
    run = cli("run", path, "--source", tmp_path, "--task", "raw")
    assert run.returncode == 3, (run.returncode, run.stderr)
    line, = error_lines(run)
    assert line.startswith(f"edgekit: error: {path}: operator 0 (ADD -> 'model/quant_add/add') has output scale ")
    assert "under 2^-19 of its input's 0.5: LiteRT's int8 kernel aborts on it" in line
