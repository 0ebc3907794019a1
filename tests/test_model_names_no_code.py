"""A model file is data: a delegate hint in its edgekit metadata that names a library (an absolute path, a
path relative to the working folder, a library shipped beside the data) is never loaded. A real shared
library whose constructor leaves a mark proves it: the user's own `--delegate PATH` runs it (the premise),
the same path written into the model never does, in `bench`, `run`, `run --probe`, `inspect --probe` and
`Model()`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from edgekit.converters.metadata_writer import add_metadata
from edgekit.runtime import Model, read_edgekit_metadata
from helpers import shared_library

CONSTRUCTOR = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    const char *path = getenv("EDGEKIT_TEST_MARK");
    if (path) { int fd = open(path, O_CREAT | O_WRONLY | O_APPEND, 0644); if (fd >= 0) { write(fd, "ran\n", 4); close(fd); } }
}
"""


@pytest.fixture(scope="module")
def marker_library(tmp_path_factory) -> Path:
    """libmark.so: appends a line to $EDGEKIT_TEST_MARK when any process loads it."""
    return shared_library(tmp_path_factory.mktemp("lib"), "mark", CONSTRUCTOR)


def _naming(model: Path, hints: list, out: Path) -> Path:
    entry = read_edgekit_metadata(model.read_bytes())
    entry["delegates"] = hints
    out.write_bytes(add_metadata(model.read_bytes(), entry))
    return out


def _cli(*args, cwd: Path, mark: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGEKIT_TEST_MARK": str(mark), "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "edgekit.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_the_marker_library_runs_when_the_user_names_it(marker_library, converted, tmp_path):
    """The premise: loading libmark.so leaves a mark, so a missing mark below means it was not loaded."""
    mark = tmp_path / "mark"
    result = _cli("bench", converted("int8"), "--runs", "2", "--delegate", marker_library, cwd=tmp_path, mark=mark)
    assert result.returncode == 0, result.stderr
    assert mark.read_text().startswith("ran")


@pytest.mark.parametrize("where", ["absolute", "relative", "bare name beside the data"])
def test_a_library_named_in_the_model_is_never_loaded(marker_library, converted, digits_dir, tmp_path, where):
    work = tmp_path / "work"
    data = work / "data"
    shutil.copytree(digits_dir / "test" / "3", data / "3")
    (work / "evil").mkdir()
    shutil.copy(marker_library, work / "evil" / "libmark.so")
    shutil.copy(marker_library, data / "libmark.so")
    named = {"absolute": str(marker_library), "relative": "evil/libmark.so", "bare name beside the data":
             "libmark.so"}[where]
    model = _naming(converted("int8"), [{"accelerator": named, "reason": "x"}, {"accelerator": "cpu", "reason": "y"}],
                    work / "m.tflite")
    from helpers import run_cli_many

    mark = tmp_path / "mark"
    argvs = {"bench": ["bench", model, "--data", data, "--runs", "2", "--json", "-"],
             "run": ["run", model, "--source", data / "3", "--max-frames", "2"],
             "run --probe": ["run", model, "--probe", "--source", data / "3", "--max-frames", "2"],
             "inspect --probe": ["inspect", model, "--probe"]}
    many = run_cli_many(list(argvs.values()), cwd=work, env={**os.environ, "EDGEKIT_TEST_MARK": str(mark)})
    runs = dict(zip(argvs, many.runs))
    for what, result in runs.items():
        assert result.returncode == 0, (what, result.stderr)
        assert "Traceback" not in result.stderr, (what, result.stderr)
    assert not mark.exists(), f"the library's constructor ran: {mark.read_text()}"
    entry = json.loads(runs["bench"].stdout)["models"][0]
    assert entry["accelerator"] == "cpu" and entry["fallbacks"] == []
    for what in ("bench", "run"):  # the metadata check drops the hints, with one warning line
        warned = [ln for ln in runs[what].stderr.splitlines() if ln.startswith("edgekit: warning:")]
        assert len(warned) == 1 and "delegates ignored" in warned[0] and named in warned[0], runs[what].stderr


@pytest.mark.parametrize("hints", ["/tmp/libx.so", ["gpu", 5], [{"accelerator": ["x"]}], 7, {"accelerator": "npu"},
                                   [{"accelerator": "xnnpack", "reason": "the CPU"}]])
def test_hints_of_any_shape_give_a_model_that_runs_on_the_cpu(converted, tmp_path, hints, monkeypatch):
    monkeypatch.setenv("EDGEKIT_TEST_MARK", str(tmp_path / "mark"))
    model = Model(_naming(converted("int8"), hints, tmp_path / "m.tflite"))
    assert model.delegate.accelerator == "cpu"
    assert model.predict(__import__("numpy").zeros((1, 8, 8, 1), "float32")).shape == (1, 10)
    assert not (tmp_path / "mark").exists()


@pytest.mark.parametrize("hints", ["/tmp/libx.so", ["gpu", 5, "evil/libx.so"], [{"accelerator": ["x"]}], 7])
def test_the_delegate_chooser_itself_never_loads_what_hints_name(marker_library, hints, tmp_path, monkeypatch):
    """`choose` is public: hints handed to it directly (not through a checked metadata entry) are names only."""
    from edgekit.runtime.delegates import choose

    monkeypatch.setenv("EDGEKIT_TEST_MARK", str(tmp_path / "mark"))
    loaded = []
    as_paths = [str(marker_library)] if hints == "/tmp/libx.so" else hints
    choice = choose(as_paths, None, lambda lib: loaded.append(lib))
    assert choice.accelerator == "cpu" and loaded == [] and not (tmp_path / "mark").exists()
    assert any("cannot name a library" in f["reason"] for f in choice.fallbacks)
