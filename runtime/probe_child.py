"""The child side of the probe (runtime/probe.py): it reads the model's bytes from stdin, loads them,
runs one inference on zeros under the address-space limit its parent set, and prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError, InputShapeError, InvokeError
from edgekit.runtime.graph_rules import MAX_TENSOR_ENV
from edgekit.runtime.model import Model

OPEN_SIZE = 64  # the size an unsized open axis is probed at


def _probe(content: bytes, backend: str, where: str, delegate: str) -> dict[str, Any]:
    model = Model(content, num_threads=1, delegate=delegate, backend=backend or None, probe=False, where=where)
    written_open = any(s < 0 and d <= 1 for t in model.inputs for s, d in zip(t.shape_signature[1:], t.shape[1:]))
    if not model.unsized and not written_open:
        model.invoke_raw([np.zeros(i.shape, i.dtype) for i in model.inputs])
    else:  # open sizes written as 1 (which may not prepare there, or prepare and fail to run: a U-Net's skip
        # join of 2x2 and 1x1): run once at OPEN_SIZE on each open axis; a size this net cannot take is an
        # error, not a danger (what the probe is for are crashes and memory)
        try:
            model.invoke_raw([np.zeros([OPEN_SIZE if s < 0 and i > 0 else d
                                        for i, (d, s) in enumerate(zip(t.shape, t.shape_signature))], t.dtype)
                              for t in model.inputs])
        except (InputShapeError, InvokeError):
            pass
    return {"ok": True, "inputs": [t.to_dict() for t in model.inputs],
            "outputs": [t.to_dict() for t in model.outputs], "accelerator": model.delegate.accelerator}


def main(backend: str, where: str, limit_mb: int, delegate: str = "cpu") -> None:  # pragma: no cover - runs in the child
    out_of_memory = f"{where}: it needs more than the {limit_mb} MB the probe allows ({MAX_TENSOR_ENV} raises it)"
    try:
        out = _probe(sys.stdin.buffer.read(), "" if backend == "-" else backend, where, delegate)
    except EdgekitError as exc:
        # a failed allocation under the address-space limit reads as a bare "RuntimeError", or as a kernel or
        # XNNPACK failing to prepare or allocate: say which limit the load ran under (not for an op it lacks)
        message = str(exc)
        if message.endswith("cannot load it: RuntimeError"):
            message = out_of_memory
        elif "the interpreter cannot load it: " in message and any(
                word in message for word in ("failed to prepare", "failed to reshape", "llocat", "emory")):
            message = message.replace("the interpreter cannot load it: ", "the interpreter cannot load it "
                                      f"(probed with at most {limit_mb} MB of memory; {MAX_TENSOR_ENV} raises it): ", 1)
        out = {"ok": False, "error": message, "exit_code": exc.exit_code}
    except MemoryError:
        out = {"ok": False, "error": out_of_memory, "exit_code": 3}
    print(json.dumps(out), flush=True)
    os._exit(0)  # no interpreter teardown: a kernel that corrupted memory must not turn a verdict into a crash
