"""Library calls leave the process alone: no fd redirection, no hook swaps, no global backend switch.

An app that loads a detector and a classifier in parallel, or converts a model while its own threads
log to stderr, must keep its stderr and its hooks. Only the CLI silences native logs (edgekit.runtime.quiet).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import threading
from pathlib import Path

from conftest import DIGITS


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_ino, st.st_dev


@contextlib.contextmanager
def _stderr_into(path: Path):
    """Point fd 2 at `path` for the test (the test's own choice), and give the path."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.dup2(fd, 2)
        yield path
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


class _Witness(threading.Thread):
    """Writes numbered marker lines to fd 2 and samples the process-wide state until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.written = 0
        self.hooks = set()
        self.streams = set()
        self.fds = set()

    def run(self) -> None:
        while not self.stop.is_set():
            os.write(2, f"edgekit-marker-{self.written}\n".encode())
            self.written += 1
            self.hooks.add(id(sys.unraisablehook))
            self.streams.add((id(sys.stdout), id(sys.stderr)))
            self.fds.add((_identity(1), _identity(2)))
            self.stop.wait(0.001)


def _libm() -> str | None:
    """glibc's libm: a real shared library that is not a TFLite delegate (load_delegate fails on it)."""
    return next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6")
                 if os.path.exists(p)), ctypes.util.find_library("m"))


def test_parallel_model_loads_keep_stderr_and_hooks(converted, tmp_path):
    from edgekit.runtime import Model

    path = converted("int8")
    not_a_delegate = _libm()
    not_an_elf = tmp_path / "libfake_delegate.so"
    not_an_elf.write_bytes(b"not an ELF file")
    hook = sys.unraisablehook
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def load(n: int) -> None:
        try:
            start.wait()
            for i in range(25):
                delegate = None
                if i % 5 == 0:  # a deliberately failing delegate load now and then
                    delegate = str(not_a_delegate if (n + i) % 2 and not_a_delegate else not_an_elf)
                model = Model(path, num_threads=1, delegate=delegate)
                assert model.delegate.accelerator == "cpu"
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    with _stderr_into(tmp_path / "stderr.txt") as log:
        out_before, err_before = _identity(1), _identity(2)
        witness = _Witness()
        witness.start()
        loaders = [threading.Thread(target=load, args=(n,)) for n in range(2)]
        for t in loaders:
            t.start()
        for t in loaders:
            t.join()
        witness.stop.set()
        witness.join()
        out_after, err_after = _identity(1), _identity(2)
    assert not errors, errors
    assert (out_after, err_after) == (out_before, err_before)
    assert witness.fds == {(out_before, err_before)}, "fd 1 or 2 pointed elsewhere while models loaded"
    assert sys.unraisablehook is hook and witness.hooks == {id(hook)}
    text = log.read_text()
    lost = [i for i in range(witness.written) if f"edgekit-marker-{i}\n" not in text]
    assert not lost, f"{len(lost)} of {witness.written} lines another thread wrote to fd 2 were lost"
    assert "Exception ignored" not in text and "Traceback" not in text, text[-2000:]


def test_convert_keeps_fds_streams_and_environment(digits_keras, tmp_path):
    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe

    environ = dict(os.environ)
    streams = id(sys.stdout), id(sys.stderr)
    with _stderr_into(tmp_path / "stderr.txt") as log:
        before = _identity(1), _identity(2)
        witness = _Witness()
        witness.start()
        try:
            convert(ConvertRecipe(model=digits_keras, mode="dynamic", calib=DIGITS / "train",
                                  output=tmp_path / "d.tflite"))
        finally:
            witness.stop.set()
            witness.join()
        after = _identity(1), _identity(2)
    assert after == before and witness.fds == {before}, "convert() redirected fd 1 or 2"
    assert witness.streams == {streams}, "convert() replaced sys.stdout or sys.stderr"
    assert dict(os.environ) == environ
    text = log.read_text()
    lost = [i for i in range(witness.written) if f"edgekit-marker-{i}\n" not in text]
    assert not lost, f"{len(lost)} of {witness.written} lines another thread wrote to fd 2 were lost"


def test_html_plots_leave_matplotlib_backend_and_pyplot_alone():
    import matplotlib

    from edgekit.html_report import plots

    backend = dict.__getitem__(matplotlib.rcParams, "backend")
    had_pyplot = "matplotlib.pyplot" in sys.modules
    rows = [{"variant": v, "top1": t, "p50_ms": ms, "pareto": p, "size_bytes": size,
             "per_class_top1": {"0": t, "1": t - 0.01}}
            for v, t, ms, p, size in (("float32", 0.97, 0.30, True, 90_000), ("int8", 0.96, 0.12, True, 25_000))]
    summary = {"rows": rows,
               "bench": {"models": [{"accuracy": {"reference_per_class_top1": {"0": 0.97, "1": 0.96}}}]}}
    images = plots(summary)
    assert set(images) == {"Accuracy vs latency", "Size per variant", "Per-class accuracy change"}
    assert all(images.values())
    assert dict.__getitem__(matplotlib.rcParams, "backend") == backend
    if not had_pyplot:
        assert "matplotlib.pyplot" not in sys.modules, "the report imported pyplot (its global figure manager)"
