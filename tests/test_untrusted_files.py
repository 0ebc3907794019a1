"""One loading contract for the files a user points edgekit at (edgekit/files.py): a model path that is a
FIFO, a device, a symlink to /dev/zero or a symlink loop is one line, at once, with bounded memory; a
SavedModel holding a FIFO is refused before TensorFlow reads it; a write killed with SIGKILL (edgekit's
writer, and `edgekit convert`) leaves no temporary, and where the system has no unnamed files, one that the
next write beside it removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT
from edgekit.errors import ModelFormatError
from edgekit.files import atomic_write_bytes, check_regular_tree, read_regular
from edgekit.runtime import Model


def _hostile_paths(tmp_path):
    """(name, path) of every kind of model path that is not a regular file."""
    os.mkfifo(tmp_path / "fifo.tflite")
    (tmp_path / "zero.tflite").symlink_to("/dev/zero")
    (tmp_path / "null.tflite").symlink_to("/dev/null")
    (tmp_path / "a.tflite").symlink_to(tmp_path / "b.tflite")
    (tmp_path / "b.tflite").symlink_to(tmp_path / "a.tflite")
    (tmp_path / "dangling.tflite").symlink_to(tmp_path / "nothing")
    (tmp_path / "dir.tflite").mkdir()
    return [(p.name, p) for p in sorted(tmp_path.iterdir())]


def test_model_paths_that_are_not_regular_files_are_refused_without_reading(tmp_path):
    for name, path in _hostile_paths(tmp_path):
        started = time.monotonic()
        with pytest.raises(ModelFormatError) as err:
            Model(path)
        assert time.monotonic() - started < 5, name
        assert str(path) in str(err.value) and "\n" not in str(err.value), name


@pytest.mark.parametrize("command", [["inspect"], ["bench", "--runs", "2"], ["run", "--source", "0"],
                                     ["inspect", "--probe"]])
def test_the_cli_on_a_fifo_or_dev_zero_is_one_line_exit_3(tmp_path, command):
    from helpers import run_cli_many

    cases = _hostile_paths(tmp_path)
    many = run_cli_many([command[:1] + [str(path)] + command[1:] for _, path in cases], cwd=ROOT, timeout=120)
    for (name, _), done in zip(cases, many.runs):
        lines = done.error_lines
        assert done.returncode == 3 and len(lines) == 1 and lines[0].startswith("edgekit: error:"), (name, done.stderr)


def test_a_file_that_grows_past_the_limit_while_read_is_refused(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, limit=100) == b"x" * 100
    path.write_bytes(b"x" * 101)
    with pytest.raises(ModelFormatError, match="more than the 100"):
        read_regular(path, limit=100, error=ModelFormatError)


def test_a_tree_with_a_fifo_a_device_or_a_dangling_link_is_refused(tmp_path):
    (tmp_path / "variables").mkdir()
    (tmp_path / "saved_model.pb").write_bytes(b"pb")
    assert check_regular_tree(tmp_path) == [tmp_path / "saved_model.pb"]
    for make in (lambda p: os.mkfifo(p), lambda p: p.symlink_to("/dev/zero"), lambda p: p.symlink_to("/nothing")):
        bad = tmp_path / "variables" / "variables.data-00000-of-00001"
        make(bad)
        with pytest.raises(ModelFormatError, match="variables.data"):
            check_regular_tree(tmp_path, error=ModelFormatError)
        bad.unlink()


def test_a_saved_model_whose_variables_file_is_a_fifo_is_refused_before_tensorflow_reads_it(tmp_path):
    saved = tmp_path / "saved"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    os.mkfifo(saved / "variables" / "variables.data-00000-of-00001")
    (saved / "variables" / "variables.index").write_bytes(b"")
    done = subprocess.run([sys.executable, "-m", "edgekit.cli", "convert", str(saved), "--output",
                           str(tmp_path / "out.tflite")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("edgekit:")]
    assert done.returncode == 3, done.stderr[-600:]
    assert len(lines) == 1 and "is a FIFO" in lines[0], done.stderr[-600:]
    assert not (tmp_path / "out.tflite").exists()


# imported by every Python process of a command (PYTHONPATH), the spawned converter too: an fsync of a file in
# $EDGEKIT_TEST_HOLD_FSYNC blocks, so the command is killed there, its bytes written and not yet in place
HOLD_FSYNC = """import os, time
folder = os.environ.get("EDGEKIT_TEST_HOLD_FSYNC")
if folder:
    real_fsync = os.fsync
    def held_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(folder + "/"):
            time.sleep(120)
        return real_fsync(fd)
    os.fsync = held_fsync
"""


def _open_in(session: int, folder) -> dict[str, int]:
    """{target: size} of the files the processes of `session` hold open in `folder` (an unnamed file reads
    "#INODE (deleted)")."""
    held = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != session:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(f"{folder}/"):
                    held[target] = os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:  # gone or closed meanwhile
            continue
    return held


def _killed_while_writing(argv: list, folder, hook, timeout: float = 300) -> dict[str, int]:
    """Run `argv` in a session of its own; once one of its processes holds a written file in `folder` (its
    bytes there, fsync blocked), SIGKILL the whole session, as a terminal's kill of the command would. What
    it held then."""
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOLD_FSYNC)
    env = {**os.environ, "EDGEKIT_TEST_HOLD_FSYNC": str(folder),
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([str(a) for a in argv], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        held: dict[str, int] = {}
        while not any(held.values()) or _open_in(proc.pid, folder) != held:  # written, and 0.2 s later the same
            assert proc.poll() is None, f"the writer ended (exit {proc.returncode}): {proc.stderr.read()[-800:]}"
            assert time.monotonic() < deadline, "the writer never reached its write"
            held = _open_in(proc.pid, folder)
            time.sleep(0.2 if any(held.values()) else 0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    while _open_in(proc.pid, folder) and time.monotonic() < deadline:  # the session's other processes die too
        time.sleep(0.02)
    return held


def _write(out, force: bool = True, tmpfile: bool = True) -> list:
    """A child that writes 10 MB to `out` with edgekit's atomic writer (without O_TMPFILE: as on macOS)."""
    code = ("import os, sys\nfrom edgekit import files\n" + ("" if tmpfile else "del os.O_TMPFILE\n") +
            f"files.atomic_write_bytes(sys.argv[1], b'x' * 10_000_000, force={force})\n")
    return [sys.executable, "-c", code, out]


@pytest.mark.parametrize("before", [None, b"the user's model"])
def test_a_write_killed_with_sigkill_leaves_no_temporary_and_the_old_file_whole(tmp_path, before):
    """SIGKILL at the slowest moment of a write (inside fsync, the 10 MB written): the folder holds what it
    held before, byte for byte; the data was in an unnamed file that died with the writer."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "model.tflite"
    if before is not None:
        out.write_bytes(before)
    held = _killed_while_writing(_write(out), folder, tmp_path / "hook")
    [(target, size)] = held.items()
    assert size == 10_000_000 and target.startswith(f"{folder}/#") and target.endswith(" (deleted)"), held
    assert [p.name for p in folder.iterdir()] == ([] if before is None else [out.name])
    assert before is None or out.read_bytes() == before
    atomic_write_bytes(out, b"whole", force=True)
    assert out.read_bytes() == b"whole" and [p.name for p in folder.iterdir()] == [out.name]


def test_without_o_tmpfile_a_killed_write_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    """Where the system has no O_TMPFILE (macOS, the BSDs: the child drops it from `os`), the temporary has
    a name: SIGKILL leaves it, the next write of that output removes it, and a live writer's is kept."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "model.tflite"
    out.write_bytes(b"the user's model")
    held = _killed_while_writing(_write(out, tmpfile=False), folder, tmp_path / "hook")
    assert list(held.values()) == [10_000_000], held
    left = sorted(p.name for p in folder.iterdir())
    assert len(left) == 2 and left[0].startswith(".model.tflite.edgekit-") and left[1] == out.name, left
    assert out.read_bytes() == b"the user's model"
    live = folder / f".model.tflite.edgekit-{_host()}-{os.getpid()}-keep.tmp"  # this machine's, alive
    live.write_bytes(b"a writer that is still running")
    atomic_write_bytes(out, b"whole", force=True)
    assert out.read_bytes() == b"whole"
    assert sorted(p.name for p in folder.iterdir()) == sorted([out.name, live.name])


@pytest.mark.parametrize("force", [False, True])
def test_edgekit_convert_killed_while_it_writes_leaves_the_output_folder_as_it_was(tmp_path, force):
    """The real `edgekit convert` of a Keras model (TensorFlow in its spawned child), killed with SIGKILL once
    the .tflite's bytes are written (fsync of the output blocked): no temporary in the output folder, and
    with --force the file it was replacing is still the user's, byte for byte."""
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    model.save(tmp_path / "small.keras")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "small.tflite"
    if force:
        out.write_bytes(b"the user's model")
    argv = [sys.executable, "-m", "edgekit", "convert", tmp_path / "small.keras", "--output", out,
            *(["--force"] if force else [])]
    held = _killed_while_writing(argv, folder, tmp_path / "hook")
    [(target, size)] = held.items()
    assert target.startswith(f"{folder}/#") and size > 1000, held
    assert [p.name for p in folder.iterdir()] == ([out.name] if force else [])
    assert not force or out.read_bytes() == b"the user's model"


def _edited(model_path, out, edit):
    from edgekit.runtime.schema import pack, unpack

    obj = unpack(model_path.read_bytes())
    edit(obj)
    out.write_bytes(pack(obj))
    return out


def _largest_weight(obj):
    sub = obj.subgraphs[0]
    return max((t for t in sub.tensors if t.buffer and obj.buffers[t.buffer].data is not None),
               key=lambda t: len(obj.buffers[t.buffer].data))


def test_a_buffer_offset_that_wraps_past_2_to_the_64_is_refused_where_litert_would_read_before_the_file(
        converted, tmp_path):
    def edit(obj):
        buffer = obj.buffers[_largest_weight(obj).buffer]
        buffer.data, buffer.offset, buffer.size = None, 2**64 - 16, 16

    path = _edited(converted("float32"), tmp_path / "wrap.tflite", edit)
    with pytest.raises(ModelFormatError, match="points past the end of the file"):
        Model(path)
    done = subprocess.run([sys.executable, "-m", "edgekit.cli", "bench", str(path), "--runs", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 3 and "points past the end of the file" in done.stderr


@pytest.mark.parametrize("group", ["/etc/passwd", "missing-group", "fifo"])
def test_a_tensor_in_an_external_buffer_is_refused_before_litert_sees_it(converted, tmp_path, group):
    from edgekit.runtime.schema import schema_module

    s = schema_module()
    if group == "fifo":
        os.mkfifo(tmp_path / "weights.bin")
        group = str(tmp_path / "weights.bin")

    def edit(obj):
        tensor = _largest_weight(obj)
        named = s.ExternalBufferGroupT()
        named.name = group
        external = s.ExternalBufferT()
        external.id, external.group, external.offset = 1, 0, 0
        external.length = len(obj.buffers[tensor.buffer].data)
        obj.externalBufferGroups, obj.externalBuffers = [named], [external]
        obj.buffers[tensor.buffer].data = None
        tensor.externalBuffer = 1

    path = _edited(converted("float32"), tmp_path / "external.tflite", edit)
    with pytest.raises(ModelFormatError, match="external buffer"):
        Model(path)
    for command in (["bench", str(path), "--runs", "2"], ["run", str(path), "--source", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "edgekit.cli", *command], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert done.returncode == 3 and "reads no file a model names" in done.stderr, done.stderr


def test_a_kernel_that_fails_at_invoke_in_bench_is_one_line_exit_3(tmp_path):
    """GATHER of index 10^6 into 10 rows: LiteRT loads and allocates the model, then the kernel refuses the
    index at invoke. bench's timing loop calls the interpreter itself; that failure was exit 70."""
    import tensorflow as tf

    class Gather(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1], tf.int32)])
        def __call__(self, index):
            return tf.gather(tf.reshape(tf.range(10, dtype=tf.float32), [10, 1]), index)

    module = Gather()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.__call__.get_concrete_function()], module)
    path = tmp_path / "gather.tflite"
    path.write_bytes(converter.convert())
    np.save(tmp_path / "index.npy", np.full((4,), 10**6, np.int32))  # 4 samples of the input [1]
    for command in (["bench", str(path), "--runs", "2"], ["bench", str(path), "--data", str(tmp_path / "index.npy")]):
        done = subprocess.run([sys.executable, "-m", "edgekit.cli", *command], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert done.returncode == 3 and len(lines) == 1 and "inference failed" in lines[0], done.stderr


def test_a_saved_model_folder_linked_to_a_folder_holding_a_fifo_is_refused(tmp_path):
    saved, other = tmp_path / "saved", tmp_path / "other"
    saved.mkdir()
    other.mkdir()
    (saved / "saved_model.pb").write_bytes(b"pb")
    os.mkfifo(other / "variables.index")
    (saved / "variables").symlink_to(other)
    with pytest.raises(ModelFormatError, match="is a FIFO"):
        check_regular_tree(saved, error=ModelFormatError)
    (other / "variables.index").unlink()
    (other / "variables.index").write_bytes(b"i")
    (other / "back").symlink_to(saved)  # a loop through the link: each folder once
    assert [p.name for p in check_regular_tree(saved)] == ["saved_model.pb", "variables.index"]


def _host() -> str:
    """The machine's name as temporaries carry it."""
    import socket

    return "".join(c for c in socket.gethostname() if c.isascii() and (c.isalnum() or c in "._")) or "host"


def test_temporaries_with_odd_names_are_left_alone(tmp_path):
    host = _host()
    odd = [f".m.tflite.edgekit-{host}-{'9' * 30}-x.tmp", f".m.tflite.edgekit-{host}-\u00b2-x.tmp",
           ".m.tflite.edgekit-otherhost-1-x.tmp", ".m.tflite.edgekit-x.tmp"]
    for name in odd:
        (tmp_path / name).write_bytes(b"")
    atomic_write_bytes(tmp_path / "m.tflite", b"ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(odd + ["m.tflite"])


def test_a_bounded_child_whose_grandchild_holds_the_pipes_still_times_out_on_time():
    from edgekit.bounded import run_bounded

    started = time.monotonic()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            run_bounded(["sh", "-c", "sleep 61 & sleep 62; true"], timeout=1)
        assert time.monotonic() - started < 5
    finally:
        subprocess.run(["pkill", "-f", "sleep 6[12]"])
