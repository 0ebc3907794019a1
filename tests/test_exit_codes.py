"""One test per row of the README exit-code table, each through the real CLI in a fresh interpreter:
the exit code, one line on stderr (no traceback) and the words that line must hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, make_video

# TensorFlow and Keras made unimportable, as on a device with only `pip install edgekit`
BLOCK_TF = """
import sys, importlib.abc
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorflow', 'keras', 'tf_keras', 'tensorflow_model_optimization'):
            raise ImportError(f'No module named {name!r} (blocked by the test)')
        return None
sys.meta_path.insert(0, _Block())
"""
CLI = "import sys\nfrom edgekit.cli import main\nmain(sys.argv[1:], prog_name='edgekit')\n"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("EDGEKIT_DEBUG", None)
    env.update(extra)
    return env


def cli(*args, prelude: str = "", env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-c", prelude + CLI, *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


def one_error_line(proc) -> str:
    """stderr holds exactly one non-empty line, an edgekit error, and no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("edgekit: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tiny_keras(tmp_path_factory) -> Path:
    """An untrained 28x28x1 -> 10 classifier (no training: these tests only need a loadable model)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Rescaling(1 / 255.0),
                              keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    path = tmp_path_factory.mktemp("exit_codes") / "tiny.keras"
    model.save(path)
    return path


# -- 0 ok ------------------------------------------------------------------------------------------
def test_0_ok_inspect_of_a_good_model(converted):
    proc = cli("inspect", converted("int8"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == ""
    assert "int8" in proc.stdout and "FULLY_CONNECTED" in proc.stdout


# -- 2 usage ---------------------------------------------------------------------------------------
def test_2_usage_two_modes_at_once(tmp_path):
    proc = cli("convert", tmp_path / "any.keras", "--int8", "--float16")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line == "edgekit: error: choose one mode, got --int8, --float16"


def test_2_usage_threads_zero(converted):
    proc = cli("bench", converted("int8"), "--threads", "0")
    assert proc.returncode == 2
    assert one_error_line(proc) == "edgekit: error: --threads: must be at least 1, got 0"


def test_2_usage_unknown_option_is_one_line_naming_the_help(converted):
    proc = cli("inspect", converted("int8"), "--bogus")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith("edgekit: error: No such option '--bogus'") and line.endswith("(see edgekit inspect --help)")


def test_2_usage_missing_argument_is_one_line():
    proc = cli("bench")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("edgekit: error: Missing argument 'MODELS...'")


def test_help_and_version_still_exit_0():
    for args in (("--help",), ("inspect", "--help"), ("--version",)):
        proc = cli(*args)
        assert proc.returncode == 0 and proc.stdout.strip() and proc.stderr == "", (args, proc.stderr)


# -- 3 model format --------------------------------------------------------------------------------
def test_3_model_format_missing_file(tmp_path):
    proc = cli("inspect", tmp_path / "nowhere.tflite")
    assert proc.returncode == 3
    line = one_error_line(proc)
    assert "nowhere.tflite" in line and "no such file" in line


def test_3_model_format_garbage_file(tmp_path):
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(os.urandom(4096))
    for command in (["inspect", garbage], ["bench", garbage, "--runs", "1"]):
        proc = cli(*command)
        assert proc.returncode == 3, (command, proc.stderr)
        line = one_error_line(proc)
        assert "garbage.tflite" in line and "TFL3" in line


def test_3_model_format_a_keras_file_that_is_not_a_zip(tmp_path):
    fake = tmp_path / "model.keras"
    fake.write_bytes(b"not a zip at all" * 64)
    proc = cli("convert", fake, "-o", tmp_path / "out.tflite")
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert "model.keras" in line and not (tmp_path / "out.tflite").exists()


# -- 4 calibration data ----------------------------------------------------------------------------
def test_4_calibration_folder_without_images(tmp_path, tiny_keras):
    calib = tmp_path / "calib"
    (calib / "cats").mkdir(parents=True)
    (calib / "cats" / "notes.txt").write_text("no pictures here")
    out = tmp_path / "tiny.int8.tflite"
    proc = cli("convert", tiny_keras, "--int8", "--calib", calib, "-o", out)
    assert proc.returncode == 4, proc.stderr
    line = one_error_line(proc)
    assert "calib" in line and "image" in line
    assert not out.exists()


# -- 5 conversion failed or broken output ----------------------------------------------------------
def test_5_a_model_whose_outputs_are_nan_is_refused_and_no_file_is_written(tmp_path, digits_dir):
    """README: 'A model whose outputs are NaN, or the same for every input, is an error and no file
    is written.' A Dense kernel full of NaN makes every output NaN, in Keras and in the .tflite."""
    import keras

    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")])
    kernel, bias = model.layers[-1].get_weights()
    model.layers[-1].set_weights([np.full_like(kernel, np.nan), bias])
    path = tmp_path / "nan.keras"
    model.save(path)
    out = tmp_path / "nan.float32.tflite"
    proc = cli("convert", path, "--calib", digits_dir / "train", "--calib-samples", "8", "-o", out)
    assert proc.returncode == 5, proc.stderr
    line = one_error_line(proc)
    assert "NaN" in line and "nan.keras" in line
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["nan.keras"]  # no temporary file left behind either


def _with_op_version(src: Path, dst: Path, op: str, version: int) -> Path:
    """A copy of a .tflite whose `op` claims another version (the flatbuffer object API, no TensorFlow)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    obj = s.ModelT.InitFromObj(s.Model.GetRootAs(src.read_bytes(), 0))
    for code in obj.operatorCodes:
        if max(code.builtinCode, code.deprecatedBuiltinCode) == getattr(s.BuiltinOperator, op):
            code.version = version
    builder = flatbuffers.Builder(0)
    builder.Finish(obj.Pack(builder), file_identifier=b"TFL3")
    dst.write_bytes(bytes(builder.Output()))
    return dst


def test_5_a_runtime_that_cannot_load_the_ops_names_them(tmp_path, converted):
    """README: `--runtime` exits with code 5, naming the ops, when that runtime would fail to load the
    model (FULLY_CONNECTED version 12 on tflite-runtime 2.14 is the classic)."""
    fits = cli("inspect", converted("int8"), "--runtime", "tflite-runtime==2.14")
    assert fits.returncode == 0 and fits.stderr.strip() == "", fits.stderr
    newer = _with_op_version(converted("int8"), tmp_path / "fc12.tflite", "FULLY_CONNECTED", 12)
    proc = cli("inspect", newer, "--runtime", "tflite-runtime==2.14")
    assert proc.returncode == 5, proc.stderr
    assert one_error_line(proc) == "edgekit: error: tflite-runtime==2.14 cannot load " \
        f"{newer}: FULLY_CONNECTED v12"


# -- 6 input shape ---------------------------------------------------------------------------------
def test_6_run_on_a_folder_with_an_unreadable_image(tmp_path, converted, digits_dir):
    folder = tmp_path / "images"
    folder.mkdir()
    for src in sorted((digits_dir / "test" / "3").glob("*.png"))[:3]:
        (folder / src.name).write_bytes(src.read_bytes())
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 50)
    proc = cli("run", converted("int8"), "--source", folder)
    assert proc.returncode == 6, proc.stderr
    assert len(proc.stdout.splitlines()) == 3  # the three good images still ran
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    # a warning for the file, the summary, then the error that sets the exit code
    assert lines[-1].startswith("edgekit: error: 1 input(s) could not be read") and "broken.png" in lines[-1]
    assert "3 frames in" in proc.stderr and "unreadable 1" in proc.stderr


def test_6_an_image_folder_for_a_model_that_takes_no_images(tmp_path, digits_dir):
    model = _tiny_vector_model(tmp_path)
    proc = cli("run", model, "--source", digits_dir / "test" / "3", "--task", "classify")
    assert proc.returncode == 6, proc.stderr
    line = one_error_line(proc)
    assert "expected an image input" in line and "(1, 4)" in line


def _tiny_vector_model(tmp_path: Path) -> Path:
    """A [1, 4] -> 2 x [1, 2] SPLIT model, written with the flatbuffer object API (no TensorFlow)."""
    from test_probe_cli import split_model

    path = tmp_path / "vector.tflite"
    path.write_bytes(split_model(2))
    return path


# -- 7 output exists -------------------------------------------------------------------------------
def test_7_output_exists_and_is_kept(tmp_path, converted):
    out = tmp_path / "bench.json"
    out.write_text("keep me")
    proc = cli("bench", converted("int8"), "--runs", "2", "--warmup", "0", "--json", out)
    assert proc.returncode == 7, proc.stderr
    line = one_error_line(proc)
    assert "bench.json" in line and "--force" in line
    assert out.read_text() == "keep me"


# -- 8 source disconnected -------------------------------------------------------------------------
def test_8_a_stream_whose_file_goes_away_ends_with_exit_8(tmp_path, converted):
    """A file:// URL is opened like a camera stream: at its end it is reopened (a reconnect). Delete the
    file while it plays: every reopen fails, and after 5 retries with backoff the run stops with 8."""
    video = make_video(tmp_path / "stream.avi", [np.full((32, 32, 3), 40 * i, np.uint8) for i in range(6)])
    out = (tmp_path / "stdout.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-c", CLI, "run", str(converted("int8")), "--source",
                             f"file://{video}"], stdout=out, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 60
        while (tmp_path / "stdout.txt").read_text().count("\n") < 20:  # it has looped at least twice
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        video.unlink()
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        waited = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    assert proc.returncode == 8, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("edgekit: error: camera file://") and "could not be opened after 6 tries" in lines[0]
    assert 5.0 < waited < 30, waited  # 0.25 + 0.5 + 1 + 2 + 2 s of backoff, not a hang
    assert (tmp_path / "stdout.txt").read_text().count("stream_") == 0  # frames of a stream are frame_NNNNNN
    assert "frame_000000" in (tmp_path / "stdout.txt").read_text()


# -- 9 missing dependency --------------------------------------------------------------------------
def test_9_convert_without_tensorflow_says_what_to_install(tmp_path):
    model = tmp_path / "m.keras"
    model.write_bytes(b"whatever")
    proc = cli("convert", model, prelude=BLOCK_TF)
    assert proc.returncode == 9, proc.stderr
    line = one_error_line(proc)
    assert "pip install 'edgekit[convert]'" in line and "tensorflow" in line


# -- 10 a device failed ----------------------------------------------------------------------------
def test_10_a_device_that_cannot_be_reached_is_one_line_per_host(tmp_path, converted):
    from sshd import free_port

    config = tmp_path / "ssh_config"
    config.write_text(f"Host pi\n  HostName 127.0.0.1\n  Port {free_port()}\n  BatchMode yes\n")
    proc = cli("bench", converted("int8"), "--on", "pi", env=_env(EDGEKIT_SSH_COMMAND=f"ssh -F {config}"))
    assert proc.returncode == 10, proc.stderr
    assert one_error_line(proc) == "edgekit: error: pi: connection refused: is sshd running on the device, on that port?"
    assert proc.stdout == ""


# -- 11 accuracy budget missed ---------------------------------------------------------------------
def test_11_a_pruned_file_that_misses_the_budget_is_written_and_exits_11(tmp_path, digits_keras, digits_dir):
    """90 % of the channels removed and one epoch of fine-tuning, in float16 (no int8 autopilot): --max-drop
    is a check of the file against the original model on --eval-data, missed on its interval; the file is
    written all the same, the training warning names its fix, and the error line says by how much."""
    out = tmp_path / "p90.tflite"
    proc = cli("convert", digits_keras, "--float16", "--prune", "0.9", "--prune-structure", "channels",
               "--epochs", "1", "--train-data", digits_dir / "train", "--max-drop", "0.5",
               "--eval-data", digits_dir / "test", "-o", out)
    assert proc.returncode == 11, proc.stderr
    assert "Traceback" not in proc.stderr and out.is_file()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("edgekit: error: ")]
    assert len(errors) == 1, proc.stderr
    assert "misses --max-drop against the original model on" in errors[0]
    low, high = map(float, re.search(r"the loss is ([\d.]+)-([\d.]+) points at n=360", errors[0]).groups())
    assert 0.5 < low < high  # missed on the interval, not only on the point estimate
    warned = [line for line in proc.stderr.splitlines() if line.startswith("edgekit: warning: training loses")]
    assert len(warned) == 1 and "--epochs" in warned[0] and "n=216" in warned[0], proc.stderr


# -- 70 internal error -----------------------------------------------------------------------------
BREAK_INSPECT = """
import edgekit.runtime.inspect as _inspect
def _boom(*args, **kwargs):
    raise RuntimeError("boom from the test\\nsecond line")
_inspect.inspect_file = _boom
"""


def test_70_an_unexpected_exception_is_one_line_without_a_traceback(tmp_path):
    proc = cli("inspect", tmp_path / "m.tflite", prelude=BREAK_INSPECT)
    assert proc.returncode == 70, proc.stderr
    line = one_error_line(proc)
    assert line == ("edgekit: internal error: RuntimeError: boom from the test "
                    "(set EDGEKIT_DEBUG=1 for the traceback)")


def test_70_edgekit_debug_shows_the_traceback(tmp_path):
    proc = cli("inspect", tmp_path / "m.tflite", prelude=BREAK_INSPECT, env=_env(EDGEKIT_DEBUG="1"))
    assert proc.returncode != 0 and proc.returncode != 70
    assert "Traceback (most recent call last)" in proc.stderr
    assert "RuntimeError: boom from the test" in proc.stderr and "_boom" in proc.stderr


def test_help_the_docs_and_the_errors_show_one_table_of_exit_codes():
    """`edgekit --help`, the README's and the docs' tables (rendered from EXIT_CODES, checked by
    test_contracts) and errors.py's classes all show the same codes."""
    import edgekit.errors as errors
    from click.testing import CliRunner

    from edgekit.cli import main

    codes = {code for code, _ in errors.EXIT_CODES}
    help_text = CliRunner().invoke(main, ["--help"]).output
    for code, meaning in errors.EXIT_CODES:
        assert f"{code:>3}  {meaning}" in help_text
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EdgekitError)]
    assert {c.exit_code for c in classes} <= codes
    tree = errors.__doc__.split("\n\n")[1]
    for c in classes:
        assert re.search(rf"{c.__name__} +exit {c.exit_code}\b", tree), c.__name__
    for path in (ROOT / "README.md", ROOT / "docs" / "exit-codes.md"):
        text = path.read_text()
        assert {int(c) for c in re.findall(r"^\| (\d+) \|", text, re.M)} == codes, path
