"""The child-process probe by default (runtime/probe.py) and its verdicts kept by sha256 (runtime/verdicts.py):
a file is probed once per runtime, convert's own outputs never, and the verdict is only advice about the
same bytes."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from edgekit.errors import ModelFormatError, UnsafeModelError
from edgekit.runtime import verdicts
from edgekit.runtime.model import Model
from edgekit.runtime.probe import verdict_name
from tflite_build import Tensor, one_op


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(folder))
    return folder / "probes"


def relu(n: int = 4) -> bytes:
    return one_op("RELU", [Tensor((1, n))], [Tensor((1, n))])


def kept(cache) -> dict[str, dict]:
    """The verdicts kept, by sha256."""
    if not cache.is_dir():
        return {}
    return {p.name.split("-")[0]: json.loads(p.read_text()) for p in cache.glob("*.json")}


def test_the_first_load_probes_and_keeps_the_verdict_under_the_files_sha256(cache, tmp_path):
    path = tmp_path / "relu.tflite"
    path.write_bytes(relu())
    model = Model(path)
    assert kept(cache) == {hashlib.sha256(relu()).hexdigest(): {"ok": True}}
    np.testing.assert_array_equal(model.invoke_raw([np.array([[-1, 2, -3, 4]], np.float32)])[0], [[0, 2, 0, 4]])


def test_a_second_load_takes_the_verdict_without_probing(cache):
    Model(relu())
    name, = (p.stem for p in cache.glob("*.json"))
    verdicts.remember(name, {"ok": False, "unsafe": True, "reason": "planted by the test"})
    with pytest.raises(UnsafeModelError, match="planted by the test"):
        Model(relu())  # the same bytes: the kept verdict answers
    Model(relu(5))  # other bytes: probed, and fine
    assert Model(relu(), probe=True)  # probe=True asks the child again, and its answer replaces the kept one
    assert verdicts.recall(name) == {"ok": True}


def test_a_file_changed_through_mmap_with_its_times_put_back_is_checked_again(cache, tmp_path):
    """A verdict is found by the bytes' sha256 on every load, never by the path or the file's times: a write
    through a shared mmap that puts the mtime back leaves (size, mtime) as they were, and the new bytes are
    still checked from scratch (here: refused, a kept bad verdict for them)."""
    import mmap
    import os

    path = tmp_path / "relu.tflite"
    path.write_bytes(relu())
    Model(path)
    before = os.stat(path)
    other = one_op("RELU6", [Tensor((1, 4))], [Tensor((1, 4))])
    assert len(other) == len(relu())
    verdicts.remember(verdict_name(other, Model(other, probe=False).runtime),
                      {"ok": False, "unsafe": True, "reason": "the new bytes' verdict"})
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mapped:
        mapped[:] = other
        mapped.flush()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    with pytest.raises(UnsafeModelError, match="the new bytes' verdict"):
        Model(path)


def test_a_verdict_holds_for_the_tensor_budget_it_was_made_under(cache, tmp_path, monkeypatch):
    path = tmp_path / "wide.tflite"
    path.write_bytes(one_op("RELU", [Tensor((1, 600, 600, 3))], [Tensor((1, 600, 600, 3))]))
    Model(path)  # 8 MiB of tensors: fine under 1024 MiB, and kept
    monkeypatch.setenv("EDGEKIT_MAX_TENSOR_MB", "4")
    with pytest.raises(ModelFormatError, match="over the limit of 4 MiB"):
        Model(path)


def test_probe_false_never_starts_a_child_nor_keeps_anything(cache):
    Model(relu(), probe=False)
    assert kept(cache) == {}


def test_with_the_cache_off_every_load_probes_and_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    Model(relu())
    assert verdicts.cache_dir() is None and not any(tmp_path.rglob("*.json"))


def test_a_verdict_holds_for_the_same_runtime_only():
    assert verdicts.key(relu(), "ai_edge_litert 2.3.0") != verdicts.key(relu(), "tflite_runtime 2.14.0")
    assert verdicts.key(relu(), "ai_edge_litert 2.3.0").startswith(hashlib.sha256(relu()).hexdigest())


def test_an_unwritable_cache_costs_a_probe_and_nothing_else(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(blocker))
    Model(relu())
    assert blocker.read_text() == ""


def resize_to(n: int) -> bytes:
    """RESIZE_BILINEAR of a 2x2 image to a constant n x n: the file writes a 2x2 output shape, and the kernel
    sizes the output from the constant."""
    return one_op("RESIZE_BILINEAR", [Tensor((1, 2, 2, 3)), Tensor((2,), "INT32", data=[n, n])],
                  [Tensor((1, 2, 2, 3))], "ResizeBilinearOptions")


def test_the_childs_memory_is_bounded_where_the_file_does_not_say_what_it_needs(cache):
    """Loaded in this process, the 6000 x 6000 resize of a 1 KB file took 2.3 GB resident (a 432 MB output,
    XNNPACK's and the arena's copies). The probe's child may use 512 MB + the 1024 MiB tensor budget: it fails
    there, and the parent says so in one line."""
    with pytest.raises(ModelFormatError, match=r"^resize.tflite: the interpreter cannot load it \(probed with at "
                                               r"most 1536 MB of memory; EDGEKIT_MAX_TENSOR_MB raises it\): "):
        Model(resize_to(6000), where="resize.tflite")
    assert Model(resize_to(600)).outputs[0].shape == (1, 600, 600, 3)


def test_what_convert_wrote_is_known_good_without_a_probe(digits_keras, cache, tmp_path):
    """(digits_keras: a test of this run's own conversion, deselected where models come prebuilt)"""
    import edgekit

    result = edgekit.convert(digits_keras, mode="float32", output=tmp_path / "f.tflite")
    data = result.path.read_bytes()
    assert verdicts.recall(verdict_name(data, Model(data, probe=False).runtime)) == {"ok": True, "written": True}


def test_the_child_never_imports_an_edgekit_folder_from_the_working_folder(tmp_path, monkeypatch, cache):
    """`python -c` puts the working folder first on the child's path; an edgekit/ there (a source checkout's,
    or one planted beside a model) would be what the child imports (the ARM step's x86 venv, run from the
    checkout, lost edgekit.runtime that way)."""
    shadow = tmp_path / "edgekit"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the shadow edgekit was imported')\n")
    monkeypatch.chdir(tmp_path)
    from edgekit.runtime.probe import probe_bytes

    assert probe_bytes(relu(), "relu.tflite")["ok"]


def test_a_child_that_cannot_run_is_an_error_and_no_verdict(cache, tmp_path, monkeypatch):
    """A probe whose child cannot even import edgekit says nothing about the file: it is one line (exit 9)
    and nothing is kept, so the file is probed again once the environment is mended (a broken venv of the
    ARM step once left 'unsafe' verdicts on good files)."""
    from edgekit.errors import MissingDependencyError

    (tmp_path / "edgekit").mkdir()
    (tmp_path / "edgekit" / "__init__.py").write_text("raise ImportError('no edgekit here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # ahead of the installed edgekit, unlike the working folder
    with pytest.raises(MissingDependencyError, match="the child-process probe could not run"):
        Model(relu())
    assert kept(cache) == {}
    monkeypatch.delenv("PYTHONPATH")
    assert Model(relu()) is not None


def _child_that(tmp_path, monkeypatch, action: str) -> None:
    """The probe's child is `sys.executable`: here a real process that does `action` (sleep, kill itself)."""
    import sys

    script = tmp_path / "child.sh"
    script.write_text(f"#!/bin/sh\n{action}\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))


@pytest.mark.parametrize("action, said", [("exec sleep 30", "took over 1 s"), ("kill -KILL $$", "SIGKILL")])
def test_a_verdict_the_machine_may_have_caused_is_an_error_and_not_kept(cache, tmp_path, monkeypatch, action, said):
    """A child out of time (a busy machine) or SIGKILLed (the system's OOM killer picks processes) says
    nothing lasting about the file: the load fails (exit 3), the next load probes again."""
    from edgekit.runtime import probe

    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 1.0)
    with monkeypatch.context() as m:
        _child_that(tmp_path, m, action)
        with pytest.raises(UnsafeModelError, match=said):
            Model(relu())
    assert kept(cache) == {}
    Model(relu())
    assert list(kept(cache).values()) == [{"ok": True}]


def test_a_real_crash_is_kept(cache, tmp_path, monkeypatch):
    _child_that(tmp_path, monkeypatch, "kill -SEGV $$")
    with pytest.raises(UnsafeModelError, match="SIGSEGV"):
        Model(relu())
    assert [v["reason"] for v in kept(cache).values()] == ["the interpreter crashed (SIGSEGV) while loading or running it"]


def test_probe_true_where_no_child_can_start_is_an_error_not_a_silent_skip(cache, monkeypatch):
    """A frozen app (PyInstaller) has no interpreter to start a child with: the default load goes on
    unprobed, an explicit probe=True says it cannot."""
    import sys

    from edgekit.errors import MissingDependencyError

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert Model(relu()) is not None
    with pytest.raises(MissingDependencyError, match="cannot probe it: no Python interpreter"):
        Model(relu(), probe=True)



def test_a_load_hashes_the_bytes_once_for_all_its_verdicts(cache, monkeypatch):
    """The lookup, the probe's verdict and the delegate's all name the same sha256: computed once."""
    from edgekit.runtime import model as model_module

    calls = []
    real = verdicts.digest

    def counted(content):
        calls.append(len(content))
        return real(content)

    monkeypatch.setattr(verdicts, "digest", counted)
    monkeypatch.setattr(model_module, "digest", counted)
    Model(relu(6))  # not known: looked up, preflighted, probed, kept
    Model(relu(6))  # known good
    assert calls == [len(relu(6))] * 2
