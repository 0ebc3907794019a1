"""Load, allocate and invoke a model in a child process with a time and memory limit, so that a model
that crashes the native interpreter, or asks it for unbounded memory or time, becomes a clear error in
the parent instead of killing it. The bytes go to the child on its stdin (the child runs exactly what
the parent read), and the verdict is kept by sha256 (runtime/verdicts.py): a second load is free.

    python -m edgekit.runtime.probe MODEL.tflite     # prints one JSON line
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError, MissingDependencyError, ModelFormatError, UnsafeModelError, UsageError
from edgekit.runtime import verdicts
from edgekit.runtime.flatbuffer import read_model_file
from edgekit.runtime.graph_rules import MAX_TENSOR_ENV, max_tensor_bytes

log = logging.getLogger("edgekit.runtime")

PROBE_TIMEOUT_S = 60.0  # loading and one inference, in the child
BASE_MEMORY_MB = 512  # the child's Python, numpy and LiteRT take about 170 MB of address space

# the child drops the working folder from its path (`-c` puts it first: an edgekit/ folder there, a source
# checkout's or anyone's, would shadow the installed one), limits its own address space (no preexec_fn: the
# parent may have threads), then probes
_BOOT = ("import sys\n"
         "if sys.path and sys.path[0] in ('', '.'):\n"
         "    del sys.path[0]\n"
         "try:\n"
         "    import resource\n"
         "except ImportError:  # Windows: no address-space limit, the time limit still holds\n"
         "    resource = None\n"
         "if resource is not None:\n"
         "    limit = int(sys.argv[1]) * 1024**2\n"
         "    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
         "from edgekit.runtime.probe_child import main\n"
         "main(sys.argv[2], sys.argv[3], int(sys.argv[1]), sys.argv[4])\n")


def memory_limit_mb(size_bytes: int) -> int:
    """The child's address-space limit: the tensor budget, the runtime itself, and the model twice over."""
    return BASE_MEMORY_MB + (max_tensor_bytes() + 2 * size_bytes) // 1024**2


def probe_model(path: str | os.PathLike[str], *, timeout: float = PROBE_TIMEOUT_S,
                memory_mb: int | None = None) -> dict[str, Any]:
    """Probe the file at `path` (read within the model contract, edgekit.files), whatever the cache says."""
    return probe_bytes(read_model_file(Path(path)), str(path), timeout=timeout, memory_mb=memory_mb)


def probe_bytes(content: bytes, where: str, *, backend: str = "", timeout: float = PROBE_TIMEOUT_S,
                memory_mb: int | None = None, delegate: str = "cpu") -> dict[str, Any]:
    """{"ok": True, "inputs": ..., "outputs": ...} when the model loads and runs one inference on zeros
    (with `delegate`: "cpu" or the library the caller loaded; "accelerator" says what the child ran on);
    UnsafeModelError when the child crashes, hangs or runs out of memory; the child's own edgekit error
    (ModelFormatError, its exit code kept) otherwise."""
    limit = memory_mb or memory_limit_mb(len(content))
    cmd = [sys.executable, "-c", _BOOT, str(limit), backend or "-", where, delegate]
    try:
        proc = subprocess.run(cmd, input=content, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise _unsafe(where, f"loading and one inference took over {timeout:.0f} s", lasting=False) from None
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        raise _unsafe(where, f"the interpreter crashed ({name}) while loading or running it",
                      lasting=-proc.returncode != signal.SIGKILL)
    stdout = proc.stdout.decode("utf-8", "replace")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        stderr = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        if any("MemoryError" in line or "std::bad_alloc" in line for line in stderr):
            raise _unsafe(where, f"it needs more than the {limit} MB the probe allows ({MAX_TENSOR_ENV} raises it)")
        # no verdict at all: the child could not run (no edgekit or interpreter to import): not the file's doing
        raise ProbeFailed(f"{where}: the child-process probe could not run (exit {proc.returncode}: "
                          f"{(stderr or ['no output'])[-1][:200]}); load it with `probe=False` to skip it")
    result = json.loads(lines[-1])
    if not result.get("ok"):
        raise _child_error(result, where)
    return result


def _holds_for(content: bytes, runtime: str) -> str:
    """What a verdict holds for besides the bytes: this runtime and this memory limit."""
    return f"{runtime}|{memory_limit_mb(len(content))} MB"


def verdict_name(content: bytes, runtime: str, *, sha256: str | None = None) -> str:
    """The name a verdict about these bytes is kept under (`sha256`: their digest, when the caller has it)."""
    return verdicts.key(content, _holds_for(content, runtime), sha256=sha256)


def known_good(content: bytes, runtime: str, *, sha256: str | None = None) -> bool:
    """Whether these bytes (by sha256) passed the preflight and the probe on this runtime before."""
    kept = verdicts.recall(verdict_name(content, runtime, sha256=sha256))
    return bool(kept and kept["ok"])


def checked(content: bytes, where: str, *, backend: str, runtime: str, always: bool = False,
            delegate: str = "cpu", sha256: str | None = None) -> None:
    """Raise what the probe found about these bytes on this runtime (and `delegate`, the library the caller
    loaded, where not "cpu"): from the verdict cache when it knows them (unless `always`), else
    by probing now and keeping the verdict. A verdict is kept only when it is about the file: not for a
    child that lacked a dependency, ran out of time (the machine may have been busy) or was SIGKILLed (the
    system's OOM killer may have picked it)."""
    name = verdict_name(content, runtime, sha256=sha256)
    verdict = None if always else verdicts.recall(name)
    if verdict is None:
        if getattr(sys, "frozen", False) or not sys.executable:
            if always:  # asked for by name: not a silent no-op
                raise ProbeFailed(f"{where}: cannot probe it: no Python interpreter to start a child with "
                                  "(a frozen app); load it with `probe=None` or `probe=False`")
            log.debug("%s: not probed (no Python interpreter to start a child with)", where)
            return
        keep = True
        try:
            ran = probe_bytes(content, where, backend=backend, delegate=delegate, timeout=PROBE_TIMEOUT_S)
            verdict = {"ok": True}
            if delegate != "cpu" and ran.get("accelerator") == "cpu":
                # the delegate did not load under the child's memory limit (GPU drivers reserve much address
                # space): its kernels went unprobed; kept as such, so the next load does not try again
                verdict["delegate_unprobed"] = True
                log.info("%s: not probed with %s (it did not load in the probe's child)", where, delegate)
        except ProbeFailed:
            raise  # the environment's fault, not the file's: nothing to keep
        except _ProbeUnsafe as exc:
            verdict = {"ok": False, "unsafe": True, "reason": exc.reason}
            keep = exc.lasting
        except EdgekitError as exc:
            verdict = {"ok": False, "unsafe": False, "reason": getattr(exc, "reason", str(exc)),
                       "exit_code": exc.exit_code}
            keep = exc.exit_code not in (MissingDependencyError.exit_code, UsageError.exit_code)  # the child's
            # environment or arguments, not the file
        if keep:
            verdicts.remember(name, verdict)
    if not verdict["ok"]:
        if verdict.get("unsafe"):
            raise _unsafe(where, str(verdict.get("reason")))
        raise _child_error({"error": f"{where}: {verdict.get('reason')}", "exit_code": verdict.get("exit_code")},
                           where)


def trust(content: bytes, runtime: str) -> None:
    """Record bytes this process wrote and loaded itself (edgekit convert's output) as good."""
    verdicts.remember(verdict_name(content, runtime), {"ok": True, "written": True})


class ProbeFailed(MissingDependencyError):
    """The probe's child could not run at all: an environment problem, never kept as a verdict on the file."""


class _ProbeUnsafe(UnsafeModelError):
    """The probe's UnsafeModelError: `reason` (what happened, without the path) rides along for callers
    that word their own message; `lasting` says whether it is about the file alone (kept as a verdict)."""

    reason: str
    lasting: bool


class _ChildModelError(ModelFormatError):
    """The child's own edgekit error, its exit code kept; `reason` is its message without the path."""

    reason: str


def _unsafe(where: str, reason: str, *, lasting: bool = True) -> _ProbeUnsafe:
    """The error for a model the child could not load and run; `lasting` says whether it is about the file
    alone (a crash) or may be the machine's doing (a timeout, a SIGKILL): only the first is kept."""
    error = _ProbeUnsafe(f"{where}: unsafe or malformed model: {reason}")
    error.reason = reason
    error.lasting = lasting
    return error


def _child_error(result: dict[str, Any], where: str) -> _ChildModelError:
    message = str(result.get("error", "unknown error"))
    error = _ChildModelError(message)
    code = result.get("exit_code")
    error.exit_code = code if isinstance(code, int) and 1 <= code <= 125 else ModelFormatError.exit_code
    error.reason = message.removeprefix(f"{where}: ")
    return error


if __name__ == "__main__":  # pragma: no cover
    with open(sys.argv[1], "rb") as fh:
        content = fh.read()
    out = {}
    try:
        out = probe_bytes(content, sys.argv[1])
    except EdgekitError as exc:
        out = {"ok": False, "error": str(exc), "exit_code": exc.exit_code}
    print(json.dumps(out), flush=True)
