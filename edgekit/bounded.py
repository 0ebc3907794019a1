"""A child process whose output is bounded, and text from elsewhere made safe to print on one line.

`bench --on` reads what a device sends: a device (or a program pretending to be one) may stream stdout for
ever, print 200 MB on stderr, or fill it with terminal escape codes. `run_bounded` keeps at most a cap of
each stream (stdout past its cap kills the child: a report is never that large; of stderr the first
quarter of the cap and the last cap are kept, the rest drained and dropped), `printable` turns any text into one short line of printable characters (its start and its end).
"""

from __future__ import annotations

import re
import subprocess
import threading
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
    """Run `cmd`; subprocess.TimeoutExpired after `timeout` s (the child killed first)."""
    proc = subprocess.Popen(cmd, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = bytearray(), bytearray()
    overflow = threading.Event()

    tail = bytearray()

    def drain_out() -> None:
        while chunk := proc.stdout.read1(1 << 16):
            if len(out) + len(chunk) > stdout_cap:
                overflow.set()
                proc.kill()
                return
            out.extend(chunk)

    def drain_err() -> None:  # the first and the last part: errors come last
        while chunk := proc.stderr.read1(1 << 16):
            room = stderr_cap // 4 - len(err)
            if room > 0:
                err.extend(chunk[:room])
                chunk = chunk[room:]
            tail.extend(chunk)
            if len(tail) > 2 * stderr_cap:
                del tail[:-stderr_cap]

    readers = [threading.Thread(target=drain_out, daemon=True), threading.Thread(target=drain_err, daemon=True)]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for reader in readers:
            reader.join(timeout=5)
        proc.stdout.close()
        proc.stderr.close()
    if len(tail) > stderr_cap:
        err.extend(b"\n[... cut ...]\n" + tail[-stderr_cap:])
    else:
        err.extend(tail)
    return Bounded(code, bytes(out), bytes(err), overflow.is_set())


def printable(text: str | bytes, limit: int = LINE_CAP) -> str:
    """One line of at most `limit` printable characters: escape sequences and control characters removed,
    runs of white space folded."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = _CONTROL.sub(" ", _ESCAPES.sub("", text))
    text = " ".join(text.split())
    half = (limit - 5) // 2
    return text if len(text) <= limit else text[:half] + " ... " + text[-half:]
