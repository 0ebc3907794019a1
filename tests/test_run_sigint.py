"""A real SIGINT to `edgekit run` in a child process (README: "Ctrl-C keeps the summary"): exit 130, the
summary still printed, "edgekit: interrupted", no traceback.

The signal must land mid-run, whatever the machine's speed: on a folder, the child's stdout is a pipe
that the test stops reading after the first line, so the child blocks on a full pipe long before the
last image; on a stream (a file:// URL, reopened at its end), the run never ends by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np

from conftest import make_video

CLI = "import sys\nfrom edgekit.cli import main\nmain(sys.argv[1:], prog_name='edgekit')\n"


def start(tmp_path, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("EDGEKIT_DEBUG", None)
    err = (tmp_path / "stderr.txt").open("w")  # a file: only stdout may fill up and block the child
    proc = subprocess.Popen([sys.executable, "-c", CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=err,
                            text=True, env=env)
    err.close()
    proc.stderr_path = tmp_path / "stderr.txt"
    return proc


def interrupt_after_first_line(proc) -> tuple[str, str, str]:
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr_path.read_text()
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()  # the same buffered reader: nothing read ahead is lost
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return first, rest, proc.stderr_path.read_text()


def test_sigint_on_a_folder_run_keeps_the_json_summary(tmp_path, converted, digits_dir):
    folder = digits_dir / "train"
    total = len(list(folder.rglob("*.png")))
    assert total * 100 > 2 * 65536  # far more output than a pipe holds: the run cannot finish unread
    proc = start(tmp_path, "run", converted("int8"), "--source", folder, "--json")
    first, rest, stderr = interrupt_after_first_line(proc)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["edgekit: interrupted"]
    lines = [json.loads(line) for line in (first + rest).splitlines()]
    summary = lines[-1]["summary"]
    frames = lines[:-1]
    assert summary["interrupted"] is True
    assert 1 <= summary["frames"] == len(frames) < total
    assert [f["frame"] for f in frames] == list(range(len(frames)))


def test_sigint_on_a_stream_prints_the_text_summary(tmp_path, converted):
    video = make_video(tmp_path / "loop.avi", [np.full((32, 32, 3), 25 * i, np.uint8) for i in range(8)])
    proc = start(tmp_path, "run", converted("int8"), "--source", f"file://{video}")
    first, rest, stderr = interrupt_after_first_line(proc)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert first.startswith("frame_000000  ")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[1] == "edgekit: interrupted", stderr
    summary = lines[0]
    frames = int(summary.split(" frames in ")[0])
    assert frames == len((first + rest).splitlines()) >= 1
    assert " FPS), inference p50 " in summary and "dropped " in summary and "reconnects " in summary
