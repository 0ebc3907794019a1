"""Load, allocate and invoke a model in a child process with a time and memory limit, so that a model
that crashes the native interpreter becomes a clear error in the parent instead of killing it.

    python -m edgekit.runtime.probe MODEL.tflite     # prints one JSON line
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError, ModelFormatError, UnsafeModelError


def _limit_memory(mb: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mb * 1024**2, mb * 1024**2))
    return apply


def probe_model(path: str | Path, *, timeout: float = 60.0, memory_mb: int = 4096) -> dict[str, Any]:
    """{"ok": True, "inputs": ..., "outputs": ...} when the model loads and runs one inference on
    zeros; UnsafeModelError when the child crashes, hangs or runs out of memory; the child's own
    edgekit error otherwise."""
    cmd = [sys.executable, "-m", "edgekit.runtime.probe", os.fspath(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_limit_memory(memory_mb) if os.name == "posix" else None)
    except subprocess.TimeoutExpired:
        raise _unsafe(path, f"loading and one inference took over {timeout:.0f} s") from None
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise _unsafe(path, f"the interpreter crashed ({name}) while loading or running it")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise _unsafe(path, f"the probe exited with {proc.returncode} ({tail[:200]})")
    result = json.loads(lines[-1])
    if not result.get("ok"):
        message = result.get("error", "unknown error")
        error = ModelFormatError(message)
        error.exit_code = int(result.get("exit_code", ModelFormatError.exit_code))
        error.reason = message.removeprefix(f"{path}: ")
        raise error
    return result


def _unsafe(path: str | Path, reason: str) -> UnsafeModelError:
    """The error for a model the child could not load and run; `reason` (what happened, without the path)
    rides along for callers that word their own message."""
    error = UnsafeModelError(f"{path}: unsafe or malformed model: {reason}")
    error.reason = reason
    return error


def _child(path: str) -> dict[str, Any]:
    import numpy as np

    from edgekit.runtime.model import Model

    model = Model(path, num_threads=1, delegate="cpu")
    model.invoke_raw([np.zeros(i.shape, i.dtype) for i in model.inputs])
    return {"ok": True, "inputs": [t.to_dict() for t in model.inputs],
            "outputs": [t.to_dict() for t in model.outputs]}


if __name__ == "__main__":  # pragma: no cover - exercised through probe_model in a child process
    try:
        out = _child(sys.argv[1])
    except EdgekitError as exc:
        out = {"ok": False, "error": str(exc), "exit_code": exc.exit_code}
    except MemoryError:
        out = {"ok": False, "error": f"{sys.argv[1]}: ran out of memory while loading", "exit_code": 3}
    print(json.dumps(out), flush=True)
