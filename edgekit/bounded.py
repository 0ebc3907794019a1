"""A child process whose output is bounded, and text from elsewhere made safe to print on one line.

`bench --on` reads what a device sends: a device (or a program pretending to be one) may stream stdout for
ever, print 200 MB on stderr, or fill it with terminal escape codes. `run_bounded` keeps at most a cap of
each stream (stdout past its cap kills the child: a report is never that large; of stderr the first
quarter of the cap and the last cap are kept, the rest drained and dropped), `printable` turns any text into one short line of printable characters (its start and its end).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass

STDOUT_CAP = 64 * 1024**2
STDERR_CAP = 1024**2
LINE_CAP = 300
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass
class Bounded:
    returncode: int
    stdout: bytes
    stderr: bytes
    overflow: bool = False  # stdout passed its cap and the child was killed


def run_bounded(cmd: list[str], *, stdin=None, timeout: float, stdout_cap: int = STDOUT_CAP,
                stderr_cap: int = STDERR_CAP) -> Bounded:
    """Run `cmd`; subprocess.TimeoutExpired after `timeout` s, the child killed first. The pipes are read as
    raw file descriptors by two threads, never closed under them, so a grandchild that holds them open (an
    ssh ControlPersist master, a wrapper script) cannot stretch the timeout. The child stays in the caller's
    process group: whatever stops the caller (Ctrl-C, a killed terminal) stops it too."""
    proc = subprocess.Popen(cmd, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # both PIPE: files (for the type checker)
    out, err, tail = bytearray(), bytearray(), bytearray()
    overflow = threading.Event()

    def drain_out(fd: int) -> None:
        while chunk := _read(fd):
            if len(out) + len(chunk) > stdout_cap:
                overflow.set()
                _kill(proc)
                return
            out.extend(chunk)

    def drain_err(fd: int) -> None:  # the first and the last part: errors come last
        while chunk := _read(fd):
            room = stderr_cap // 4 - len(err)
            if room > 0:
                err.extend(chunk[:room])
                chunk = chunk[room:]
            tail.extend(chunk)
            if len(tail) > 2 * stderr_cap:
                del tail[:-stderr_cap]

    readers = [threading.Thread(target=drain_out, args=(stdout.fileno(),), daemon=True),
               threading.Thread(target=drain_err, args=(stderr.fileno(),), daemon=True)]
    for reader in readers:
        reader.start()
    grace = 10.0  # after the child exits, for the readers to finish what the pipes still hold
    try:
        code = proc.wait(timeout=timeout)
    except BaseException:  # the timeout, or Ctrl-C: the child goes, then the error
        _kill(proc)
        grace = 1.0
        raise
    finally:
        until = time.monotonic() + grace  # unless a process other than the child holds a pipe
        for reader in readers:
            reader.join(timeout=max(0.0, until - time.monotonic()))
        if not any(r.is_alive() for r in readers):  # else a process outside the group holds a pipe: leave it
            stdout.close()
            stderr.close()
    if overflow.is_set():
        _kill(proc)
    err.extend(b"\n[... cut ...]\n" + tail[-stderr_cap:] if len(tail) > stderr_cap else tail)
    return Bounded(code, bytes(out), bytes(err), overflow.is_set())


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child, then reap it."""
    try:
        proc.kill()
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def strip_controls(text: str) -> str:
    """`text` without terminal escape sequences and control characters (new lines and tabs kept)."""
    return _CONTROL.sub(" ", _ESCAPES.sub("", text))


def printable(text: str | bytes, limit: int = LINE_CAP) -> str:
    """One line of at most `limit` printable characters: escape sequences and control characters removed,
    runs of white space folded."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join(strip_controls(text).split())
    half = (limit - 5) // 2
    return text if len(text) <= limit else text[:half] + " ... " + text[-half:]
