"""The probe and delegates (runtime/model.py, runtime/probe.py): a delegate runs kernels of its own, so a
model loaded with one is probed with the very library loaded, after the file passed the preflight and the
CPU probe; hints never make edgekit load a library for a file the preflight refuses. The delegate here is a
real shared library built by the test (a no-op TfLite delegate that claims no nodes: the CPU runs them)."""

from __future__ import annotations

import shutil

import pytest
from edgekit.converters.metadata_writer import add_metadata
from edgekit.runtime import verdicts
from edgekit.runtime.model import Model
from edgekit.runtime.probe import verdict_name
from helpers import shared_library
from tflite_build import Tensor, one_op

from edgekit.errors import ModelFormatError

DELEGATE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/mman.h>
typedef struct TfLiteDelegate {
  void* data_;
  int (*Prepare)(void* context, struct TfLiteDelegate* delegate);
  void* CopyFromBufferHandle; void* CopyToBufferHandle; void* FreeBufferHandle;
  int64_t flags; void* opaque_delegate_builder;
} TfLiteDelegate;
__attribute__((constructor)) static void loaded(void) {  /* who loaded it: one line per process */
  const char* mark = getenv("EDGEKIT_TEST_MARK");
  FILE* f = mark ? fopen(mark, "a") : NULL;
  if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
}
static int prepare(void* c, TfLiteDelegate* d) { return 0; }  /* kTfLiteOk, no nodes claimed */
TfLiteDelegate* tflite_plugin_create_delegate(char** k, char** v, size_t n, void (*err)(const char*)) {
  const char* mb = getenv("FAKE_RESERVE_MB");  /* the address space a GPU driver reserves */
  if (mb) {
    void* p = mmap(NULL, (size_t)atol(mb) << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { if (err) err("cannot reserve its address space"); return NULL; }
  }
  TfLiteDelegate* d = calloc(1, sizeof *d);
  d->Prepare = prepare;
  return d;
}
void tflite_plugin_destroy_delegate(TfLiteDelegate* d) { free(d); }
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return shared_library(tmp_path_factory.mktemp("delegate"), "fake", DELEGATE)


@pytest.fixture
def npu(built, tmp_path, monkeypatch):
    """A fresh copy of the library (a new path: its constructor runs again) named by EDGEKIT_NPU_DELEGATE,
    a private verdict cache, and the file its constructor writes a pid to."""
    lib = tmp_path / "libnpu_test.so"
    shutil.copy(built, lib)
    mark = tmp_path / "loaded-by"
    monkeypatch.setenv("EDGEKIT_NPU_DELEGATE", str(lib))
    monkeypatch.setenv("EDGEKIT_TEST_MARK", str(mark))
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path / "cache"))
    return lib, mark


def _hinting_npu(model: bytes) -> bytes:
    return add_metadata(model, {"delegates": [{"accelerator": "npu", "reason": "test"},
                                              {"accelerator": "cpu", "reason": "fallback"}]})


def _loaded_by(mark) -> list[int]:
    return [int(line) for line in mark.read_text().split()] if mark.exists() else []


def test_a_file_the_preflight_refuses_never_makes_edgekit_load_the_library_its_hints_name(npu):
    _, mark = npu
    bad = _hinting_npu(one_op("ADD", [Tensor((1, 4)), -1], [Tensor((1, 4))]))
    with pytest.raises(ModelFormatError, match="has no tensor for input 1"):
        Model(bad)
    assert _loaded_by(mark) == []


def test_a_model_loaded_with_a_delegate_is_probed_with_that_library_once(npu):
    import os

    lib, mark = npu
    good = _hinting_npu(one_op("RELU", [Tensor((1, 4))], [Tensor((1, 4))]))
    model = Model(good)
    assert (model.delegate.accelerator, model.delegate.library) == ("npu", str(lib))
    assert model.checked_on == f"{model.runtime} with {lib}"
    loaders = _loaded_by(mark)
    assert len(loaders) == 2 and os.getpid() in loaders  # the probe's child, then this process
    assert verdicts.recall(verdict_name(good, model.checked_on)) == {"ok": True}
    assert verdicts.recall(verdict_name(good, model.runtime)) == {"ok": True}  # the CPU probe came first
    Model(good)
    assert len(_loaded_by(mark)) == 2  # known good with this library: no child again


def test_a_delegate_that_cannot_load_in_the_probes_child_is_recorded_as_unprobed(npu, monkeypatch):
    """A GPU driver reserves gigabytes of address space: under the child's limit the delegate fails and the
    child runs on the CPU. That verdict says so (not 'ok with the delegate'), and is not retried per load."""
    _, mark = npu
    monkeypatch.setenv("FAKE_RESERVE_MB", "8192")
    good = _hinting_npu(one_op("RELU", [Tensor((1, 8))], [Tensor((1, 8))]))
    model = Model(good)
    assert model.delegate.accelerator == "npu"  # this process has no such limit
    assert verdicts.recall(verdict_name(good, model.checked_on)) == {"ok": True, "delegate_unprobed": True}
    Model(good)
    assert len(_loaded_by(mark)) == 2
