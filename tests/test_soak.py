"""Long runs: memory, latency drift, file descriptors, threads. Slow tier (`pytest -m slow`), except the
Ctrl-C test, which is short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import ROOT, FakeCapture
from edgekit.runtime.timing import _rss_bytes
from edgekit.runtime import Camera, Classifier, Model, read_image


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_ten_thousand_invokes_hold_memory(converted, digits_dir):
    """Memory only; the p99 drift over the same run is a benchmark (tests/perf/test_soak_perf.py)."""
    clf = Classifier(Model(converted("int8"), num_threads=1))
    image = read_image(next((digits_dir / "test" / "8").glob("*.png")))
    for _ in range(500):
        clf.classify(image)
    rss0 = _rss_bytes()
    for _ in range(10_000):
        clf.classify(image)
    growth = (_rss_bytes() - rss0) / 2**20
    print(f"\nRSS growth {growth:.2f} MiB over 10,000 invokes")
    assert growth < 2.0


@pytest.mark.slow
def test_a_thousand_open_close_cycles_leave_fds_and_memory_flat(converted):
    path = converted("int8")
    for _ in range(50):
        Model(path)
    fds0, rss0 = _fds(), _rss_bytes()
    for _ in range(1000):
        model = Model(path)
        model.invoke_raw([np.zeros(i.shape, i.dtype) for i in model.inputs])
        del model
    growth = (_rss_bytes() - rss0) / 2**20
    print(f"\n1,000 Model cycles: fds {fds0} -> {_fds()}, RSS growth {growth:.2f} MiB")
    assert _fds() == fds0
    assert growth < 5.0


@pytest.mark.slow
def test_a_camera_that_drops_every_so_often_is_reconnected_each_time():
    frames = [np.zeros((8, 8, 3), np.uint8)]
    drops, per_session = 20, 40
    cam = Camera("soak", opener=lambda d: FakeCapture(frames, fps=400, fail_after=per_session), backoff=0.001)
    threads0 = threading.active_count()
    delivered = 0
    peak_threads = 0
    for _ in cam:
        delivered += 1
        peak_threads = max(peak_threads, threading.active_count())
        if cam.stats.reconnects == drops and delivered > drops * per_session * 0.5:
            break
    print(f"\n{cam.stats.reconnects} reconnects for {drops} drops, {delivered} frames, threads {threads0} -> "
          f"peak {peak_threads}")
    assert cam.stats.reconnects == drops
    assert peak_threads <= threads0 + 1  # one capture thread, never more
    time.sleep(0.1)
    assert threading.active_count() == threads0


def _read_pty(fd: int, into: list[bytes], seen: threading.Event, marker: bytes) -> None:
    """Collect a pty's output until the child closes it; set `seen` once `marker` has arrived."""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        into.append(chunk)
        if marker in b"".join(into):
            seen.set()


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT at its default in the child, as in a terminal: a test run started in the background of a
    non-interactive shell (`pytest &`, nohup) ignores SIGINT, and a child inherits that, so it would finish."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_conversion_keeps_the_earlier_file(tmp_path, digits_keras, digits_dir):
    """SIGINT is sent once the converter has said it is converting (its progress lines go to a terminal,
    so stderr is a pty here): the run is interrupted, never finished, and the earlier file stays whole."""
    import pty

    out = tmp_path / "model.tflite"
    out.write_bytes(b"the earlier file")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "convert", str(digits_keras), "--int8", "--calib",
                             str(digits_dir / "train"), "-o", str(out), "--force"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    os.close(slave)
    chunks: list[bytes] = []
    converting = threading.Event()
    reader = threading.Thread(target=_read_pty, args=(master, chunks, converting, b"converting to int8"),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not converting.wait(0.1) and proc.poll() is None and time.monotonic() < deadline:
            pass
        assert converting.is_set() and proc.poll() is None, b"".join(chunks).decode(errors="replace")
        proc.send_signal(signal.SIGINT)  # the TFLite converter is running now
        stdout, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
        reader.join(10)
        os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    # 130: Python handled Ctrl-C; -SIGINT: it came while TensorFlow's converter (MLIR/LLVM, which
    # installs its own handler) was running, and the process was ended by the signal (a shell shows 130)
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    assert "Traceback" not in err
    assert stdout == b"" and out.read_bytes() == b"the earlier file"  # no summary: it did not finish
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tflite"]  # no temporary files left
