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
from edgekit.bench import _rss_bytes
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


def test_ctrl_c_during_a_conversion_keeps_the_earlier_file(tmp_path, digits_keras, digits_dir):
    out = tmp_path / "model.tflite"
    out.write_bytes(b"the earlier file")
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "convert", str(digits_keras), "--int8", "--calib",
                             str(digits_dir / "train"), "-o", str(out), "--force"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6.0)  # TensorFlow imported, the model loading or converting
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    # 130: Python handled Ctrl-C; -SIGINT: it came while TensorFlow's converter (MLIR/LLVM, which
    # installs its own handler) was running, and the process was ended by the signal (a shell shows 130);
    # 0: it finished first, and then the new file is complete
    assert proc.returncode in (130, -signal.SIGINT, 0), err
    assert "Traceback" not in err
    data = out.read_bytes()
    if data != b"the earlier file":  # the interrupt came after the atomic replace: a whole model
        from edgekit.runtime import Model

        assert Model(data).metadata["mode"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tflite"]  # no temporary files left
