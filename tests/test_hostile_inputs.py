"""Inputs that used to hang or crash: decoder failures, crash-prone model values, dead cameras,
odd frames, foreign delegate libraries, odd runtime specs, name clashes, Ctrl-C and closed pipes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, FakeCapture
from edgekit.cli import main
from edgekit.errors import InputShapeError, SourceDisconnectedError, UsageError
from edgekit.run import run_stream
from edgekit.runtime import Camera, ImageFiles, Model, PreprocessSpec, prepare
from edgekit.runtime.compat import check_runtime


def test_a_decoder_failure_in_the_reader_thread_is_an_error_not_a_hang(digits_dir):
    paths = sorted((digits_dir / "test" / "1").glob("*.png"))[:20]

    def explode(image):
        raise MemoryError("cannot allocate 30 GB")

    seen = []
    source = ImageFiles(paths, transform=explode, on_error=lambda p, e: seen.append(str(e)), chunk=4)
    done = threading.Event()
    threading.Thread(target=lambda: (list(source), done.set()), daemon=True).start()
    assert done.wait(10), "the image reader hung"
    assert len(seen) == 20 and "MemoryError" in seen[0]


def test_centre_crop_of_a_very_long_image_cuts_before_it_scales():
    img = np.zeros((1, 200_000), np.uint8)
    started = time.perf_counter()
    assert prepare(img, PreprocessSpec(224, 224, 1, resize="crop")).shape == (224, 224, 1)
    assert time.perf_counter() - started < 1.0


def _mutated(path, tmp_path, edit):
    """A copy of the model with one field changed through the flatbuffer object API."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    obj = schema.ModelT.InitFromObj(schema.Model.GetRootAs(path.read_bytes(), 0))
    edit(obj)
    builder = flatbuffers.Builder(0)
    builder.Finish(obj.Pack(builder), file_identifier=b"TFL3")
    out = tmp_path / "mutated.tflite"
    out.write_bytes(bytes(builder.Output()))
    return out


def _set_input_quant(scale=None, zero_point=None):
    def edit(obj):
        sub = obj.subgraphs[0]
        q = sub.tensors[sub.inputs[0]].quantization
        if scale is not None:
            q.scale = [scale]
        if zero_point is not None:
            q.zeroPoint = [zero_point]
    return edit


def _set_pool_filter(obj):
    from ai_edge_litert import schema_py_generated as schema

    for op in obj.subgraphs[0].operators:
        if isinstance(op.builtinOptions, schema.Pool2DOptionsT):
            op.builtinOptions.filterWidth = -1


@pytest.mark.parametrize("edit, text", [
    (_set_input_quant(scale=0.0), "scale that is not positive"),
    (_set_input_quant(zero_point=2_147_483_647), "zero point outside INT8"),
    (_set_pool_filter, "FilterWidth < 1"),
])
def test_values_that_crash_the_interpreter_are_refused_before_it_loads(tmp_path, converted, edit, text):
    bad = _mutated(converted("int8", "int8"), tmp_path, edit)
    # in a child process: should the check ever regress, the crash must not take the test run down
    code = ("import sys\nfrom edgekit.runtime import Model\nfrom edgekit.errors import ModelFormatError\n"
            "try:\n    Model(sys.argv[1])\nexcept ModelFormatError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"the interpreter crashed (exit {out.returncode})"
    assert text in out.stdout


def test_a_camera_that_opens_but_never_delivers_gives_up_without_spinning():
    opens = []

    def opener(device):
        opens.append(time.monotonic())
        return FakeCapture([], fail_after=0)

    started = time.monotonic()
    with pytest.raises(SourceDisconnectedError, match="delivers no frames"):
        list(Camera("mute", opener=opener, max_reconnects=3, backoff=0.02))
    assert len(opens) == 4 and time.monotonic() - started < 3


def test_a_read_that_raises_reopens_the_camera_and_odd_frames_are_skipped():
    good = np.zeros((4, 4, 3), np.uint8)
    frames = [good, np.zeros((0, 0, 3), np.uint8), np.zeros((4, 4, 2), np.uint8), good, good]
    calls = {"opens": 0}

    class Flaky(FakeCapture):
        def read(self):
            if calls["opens"] == 1 and self.count == 2:
                raise OSError("USB hiccup")
            return super().read()

    def opener(device):
        calls["opens"] += 1
        return Flaky(frames, fps=500)

    cam = Camera("flaky", opener=opener, backoff=0.01)
    got = [f for _, f in zip(range(6), cam)]
    assert len(got) == 6 and all(f.image.shape == (4, 4, 3) for f in got)
    assert cam.stats.reconnects >= 1 and cam.stats.errors >= 2


def test_save_dir_names_stay_unique_across_subfolders(tmp_path, converted, digits_dir):
    src = tmp_path / "src"
    for sub in ("a", "b"):
        (src / sub).mkdir(parents=True)
        (src / sub / "x.png").write_bytes(next((digits_dir / "test" / "4").glob("*.png")).read_bytes())
    result = CliRunner().invoke(main, ["run", str(converted("int8")), "--source", str(src), "--save-dir",
                                       str(tmp_path / "out")])
    assert result.exit_code == 0, result.stderr
    assert len(list((tmp_path / "out").iterdir())) == 2


def test_run_on_a_save_dir_that_is_a_file_is_a_usage_error(tmp_path, converted, digits_dir):
    (tmp_path / "f").write_text("x")
    result = CliRunner().invoke(main, ["run", str(converted("int8")), "--source", str(digits_dir / "test" / "1"),
                                       "--save-dir", str(tmp_path / "f")])
    assert result.exit_code == 2 and "is a file" in result.stderr


def test_a_library_that_is_not_a_delegate_falls_back_quietly(converted):
    import ctypes.util
    import os

    libm = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6")
                 if os.path.exists(p)), ctypes.util.find_library("m"))
    assert libm, "glibc's libm is needed as a shared library that is not a delegate"
    result = subprocess.run([sys.executable, "-m", "edgekit.cli", "bench", str(converted("int8")), "--runs", "3",
                             "--delegate", libm, "--json", "-"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    entry = __import__("json").loads(result.stdout)["models"][0]
    assert entry["accelerator"] == "cpu" and "tflite_plugin_create_delegate" in entry["fallbacks"][0]["reason"]


@pytest.mark.parametrize("value", ["foo", "CPU", "cpu,gpu", 123, ["gpu"]])
def test_nonsense_delegates_are_usage_errors(converted, value):
    with pytest.raises(UsageError):
        Model(converted("int8"), delegate=value)


@pytest.mark.parametrize("spec", ["tflite-runtime==2.99", "tflite-runtime==2.14==3", "99999999999999999999.1",
                                  "tensorflow==9.0", "foo==1"])
def test_runtime_specs_that_cannot_be_answered_are_usage_errors(spec):
    with pytest.raises(UsageError):
        check_runtime({"op_versions": {"ADD": [1]}}, spec)


def test_ctrl_c_during_a_run_keeps_the_summary(converted, digits_dir):
    def stop_after_three(frame, results, ms):
        if frame.index == 2:
            raise KeyboardInterrupt

    summary = run_stream(Model(converted("int8")), ImageFiles(sorted((digits_dir / "test" / "6").glob("*.png"))),
                         on_result=stop_after_three)
    assert summary.interrupted and summary.frames == 3 and summary.to_dict()["interrupted"]


def test_a_closed_pipe_ends_the_run_quietly(converted, digits_dir):
    """`edgekit run ... | head -n 1`, with edgekit's own exit status: its stdout is a pipe whose reader takes
    one line and leaves while edgekit still has ~1,400 lines to write (far more than a pipe buffer holds)."""
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "run", str(converted("int8")), "--source",
                             str(digits_dir / "train"), "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # the reader leaves; edgekit's next write gets EPIPE
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith(b"{") and first.endswith(b"\n")
    assert code == 141, (code, err)  # 128 + SIGPIPE, what a shell reports for `cat` in the same place
    assert err == "", err  # no Traceback, no BrokenPipeError, no "Exception ignored" at exit


def test_unreadable_pixel_types_name_the_file(tmp_path):
    import cv2

    from edgekit.runtime import read_image

    path = tmp_path / "float.tiff"
    cv2.imwrite(str(path), np.zeros((4, 4), np.float32))
    with pytest.raises(InputShapeError, match="float.tiff"):
        read_image(path)


@pytest.fixture(scope="module")
def string_models(tmp_path_factory):
    """Two models the real TFLite converter writes: strings in and out (a TILE of a [1, 2] string input), and
    a label lookup (an int32 index in, its STRING label out)."""
    import tensorflow as tf

    class Strings(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 2], tf.string)])
        def tile(self, s):
            return {"out": tf.tile(s, [2, 1])}

        @tf.function(input_signature=[tf.TensorSpec([1], tf.int32)])
        def lookup(self, index):
            return {"label": tf.gather(tf.constant(["cat", "dog", "bird"]), index)}

    module, folder = Strings(), tmp_path_factory.mktemp("strings")
    paths = {}
    for name in ("tile", "lookup"):
        function = getattr(module, name).get_concrete_function()
        paths[name] = folder / f"{name}.tflite"
        paths[name].write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([function], module).convert())
    return paths


def test_a_model_with_string_tensors_is_refused_at_load_in_one_line(string_models):
    """`Model` on a STRING input or output was exit 70 at the first predict ("could not convert string to
    float"); it is a ModelFormatError (exit 3) at load, naming the tensor, before any probe starts."""
    from edgekit.errors import ModelFormatError

    for name, words in (("tile", "input 's' holds STRING values"), ("lookup", "output 'label' holds STRING values")):
        for source in (string_models[name], string_models[name].read_bytes()):
            with pytest.raises(ModelFormatError) as err:
                Model(source)
            assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
            assert "numbers only (float, integer and bool tensors)" in str(err.value)



def test_a_string_model_known_good_from_an_earlier_probe_is_still_refused(string_models):
    """Bytes a runtime before this check recorded as good skip the preflight and the probe; not this check."""
    from edgekit.errors import ModelFormatError
    from edgekit.runtime.backend import get_backend
    from edgekit.runtime.probe import known_good, trust

    data, backend = string_models["tile"].read_bytes(), get_backend(None)
    trust(data, f"{backend.name} {backend.version}")
    assert known_good(data, f"{backend.name} {backend.version}")
    with pytest.raises(ModelFormatError, match="input 's' holds STRING values"):
        Model(data)


def test_bench_and_run_refuse_a_string_model_in_one_line_and_inspect_still_reads_it(string_models, digits_dir):
    from helpers import run_cli_many

    path = string_models["tile"]
    many = run_cli_many([["bench", path, "--runs", "2"], ["run", path, "--source", digits_dir / "test" / "1"],
                         ["inspect", path]], cwd=ROOT, timeout=300)
    for done in many.runs[:2]:
        assert done.returncode == 3 and len(done.error_lines) == 1, done.stderr
        assert done.error_lines[0] == (f"edgekit: error: {path}: input 's' holds STRING values; edgekit's runtime "
                                       "feeds and reads numbers only (float, integer and bool tensors)")
    inspected = many.runs[2]
    assert inspected.returncode == 0, inspected.stderr
    assert "string [1, 2]" in inspected.stdout and "string [2, 2]" in inspected.stdout and "TILE" in inspected.stdout


@pytest.mark.parametrize("kind", ["STRING", "COMPLEX64", "COMPLEX128", "RESOURCE", "VARIANT", "INT4", "BFLOAT16",
                                  "INT2", "UINT4", "FLOAT8_E4M3FN", "FLOAT8_E5M2"])
def test_tensor_types_the_runtime_cannot_feed_are_refused_by_name(kind):
    """A RESHAPE whose input and output are of `kind`: a complex input took the real part of what came out
    (numpy's ComplexWarning), FLOAT8 and INT4 took int8 bits, RESOURCE failed at invoke: refused at load."""
    from tflite_build import Tensor, one_op

    from edgekit.errors import ModelFormatError

    data = one_op("RESHAPE", [Tensor((1, 2), kind, name="x"), Tensor((2,), "INT32", data=[2, 1])],
                  [Tensor((2, 1), kind)], "ReshapeOptions", newShape=[2, 1])
    with pytest.raises(ModelFormatError, match=f"input 'x' holds {kind} values; edgekit's runtime feeds"):
        Model(data, probe=False)


@pytest.mark.parametrize("kind", ["FLOAT32", "FLOAT16", "FLOAT64", "INT8", "UINT8", "INT16", "UINT16", "INT32",
                                  "UINT32", "INT64", "UINT64", "BOOL"])
def test_numeric_tensor_types_still_run(kind):
    from tflite_build import Tensor, one_op

    data = one_op("RESHAPE", [Tensor((1, 2), kind), Tensor((2,), "INT32", data=[2, 1])],
                  [Tensor((2, 1), kind)], "ReshapeOptions", newShape=[2, 1])
    got = Model(data, probe=False).predict(np.array([[1.0, 0.0]], np.float32))
    assert got.dtype == np.float32 and got.ravel().tolist() == [1.0, 0.0]
