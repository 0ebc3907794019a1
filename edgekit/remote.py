"""`edgekit bench --on [user@]host[:port]` and `edgekit doctor --on ...`: measure on the device itself.

The system OpenSSH client does the talking (so ~/.ssh/config, agents, ProxyJump and keys work as they do
for `ssh`; EDGEKIT_SSH_COMMAND replaces `ssh`, like GIT_SSH_COMMAND). Per host: one connection asks the
device's Python for its edgekit version and which files it already holds (by sha256), a second sends a
tar of the missing ones and runs the device's own `python -m edgekit bench ... --json -` in a private
temporary folder, which it removes. Nothing of the SSH round trip is inside the timed loop: the device's
harness times its own invokes. Hosts run in parallel; a failed host is one line with its fix, and the
others' results are still returned.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.bounded import STDOUT_CAP, Bounded, printable, run_bounded, strip_controls
from edgekit.contracts import load_schema
from edgekit.errors import MissingDependencyError, ModelFormatError, UsageError, one_line
from edgekit.remote_scripts import PROBE, RUN, TFLITE_REFERENCE
from edgekit.runtime.entry_check import problems as problems_of
from edgekit.runtime.model_kind import model_kind

MIN_DEVICE_EDGEKIT = "0.2.0"  # the first with `device` in bench rows
KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL when the device stops what edgekit started there
# sh -c KILLED_AFTER sh SECONDS CMD...: CMD sent SIGTERM after SECONDS, SIGKILL KILL_GRACE later (coreutils'
# timeout: its process group too; busybox's from 1.35), or SIGKILL at once where timeout has no -k: a device
# Python that never answers, ignoring SIGHUP and SIGTERM, is not left running
KILLED_AFTER = (f'limit=$1; shift; if timeout -k 1 1 true >/dev/null 2>&1; then exec timeout -k {KILL_GRACE:g} "$limit" "$@"; '
                'elif command -v timeout >/dev/null 2>&1; then exec timeout -s KILL "$limit" "$@"; '
                'else exec "$@"; fi')
# what PROBE prints, as the schema subset edgekit.runtime.entry_check reads
PROBE_ANSWER = {"type": "object", "required": ["python", "edgekit", "machine", "present"], "properties": {
    "python": {"type": "string", "maxLength": 64}, "executable": {"type": ["string", "null"], "maxLength": 4096},
    "edgekit": {"type": ["string", "null"], "maxLength": 64}, "machine": {"type": "string", "maxLength": 64},
    "present": {"type": "array", "items": {"type": "string", "maxLength": 64}},
    "features": {"type": "array", "items": {"type": "string", "maxLength": 64}}}}
STAGE = "~/.cache/edgekit/remote"
SSH_ENV = "EDGEKIT_SSH_COMMAND"


def _remote_word(arg: str) -> str:
    """One argument for the device's shell, quoted, except that a leading ~/ stays the device user's home
    (`remote_python="~/edgekit/bin/python"`, as a Pi's venv is named): shlex.quote alone kept the ~ literal."""
    if arg == "~" or arg.startswith("~/"):
        rest = arg[2:]
        return '"$HOME"' + ("/" + shlex.quote(rest) if rest else "")
    return shlex.quote(arg)


@dataclass(frozen=True)
class Host:
    spec: str  # as given
    target: str  # [user@]host, for ssh
    port: int | None = None


def parse_host(spec: str) -> Host:
    """`[user@]host[:port]`, `[user@][v6::addr]:port`, or a Host alias of ~/.ssh/config."""
    m = re.fullmatch(r"((?:[^@\s]+@)?)(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]@]+)(?::(\d+))?", spec.strip())
    if not m:
        raise UsageError(f"{spec!r}: give [user@]host[:port] (a name, an address or an ~/.ssh/config alias)",
                         param="hosts")
    user, name, port = m.groups()
    if port is not None and not 0 < int(port) < 65536:
        raise UsageError(f"{spec!r}: port {port} is not in 1..65535", param="hosts")
    return Host(spec, user + name.strip("[]"), int(port) if port else None)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def ssh_base() -> list[str]:
    argv = shlex.split(os.environ.get(SSH_ENV) or "ssh")
    if not argv or shutil.which(argv[0]) is None:
        raise MissingDependencyError(f"needs the OpenSSH client ({argv[0] if argv else 'ssh'} not found): "
                                     "apt install openssh-client (or set EDGEKIT_SSH_COMMAND)", param="hosts")
    return argv


@dataclass
class HostFailure(Exception):
    message: str

    def __str__(self) -> str:
        return self.message


_SSH_PROBLEMS = (
    ("Could not resolve hostname", "cannot resolve the host name: check it, or its Host entry in ~/.ssh/config"),
    ("Connection refused", "connection refused: is sshd running on the device, on that port?"),
    ("timed out", "unreachable (connect timed out): check the address, the network and --connect-timeout"),
    ("No route to host", "unreachable (no route to host): check the address and the network"),
    ("Network is unreachable", "unreachable (network is unreachable): check the network"),
    ("Permission denied", "authentication failed: install your key on the device (ssh-copy-id HOST); "
                          "edgekit runs ssh with BatchMode=yes, so it cannot answer password prompts"),
    ("Host key verification failed", "the device's host key is unknown or changed: connect once with "
                                      "`ssh HOST` to check and accept it"),
)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ssh_problem(host: Host, stderr: str) -> str:
    for needle, message in _SSH_PROBLEMS:
        if needle in stderr:
            return message.replace("HOST", host.target)
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return f"ssh failed: {printable(lines[-1]) if lines else 'exit 255, no message'}"


@dataclass
class Session:
    """How to reach the devices: the ssh command and its limits."""

    remote_python: str = "python3"
    connect_timeout: float = 10.0
    timeout: float = 600.0
    keep: bool = False
    deadline: float = 0.0  # monotonic time by which everything must be done (set per run)

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HostFailure(f"timed out (`timeout` {self.timeout:g} s)")
        return left

    def ssh(self, host: Host, argv: list[str], *, stdin=None) -> Bounded:
        """Run argv on the host, its output bounded (edgekit.bounded); HostFailure for what ssh itself could
        not do, and for a device that sends more than a report's worth on stdout."""
        cmd = ssh_base() + ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
                            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
        if host.port is not None:
            cmd += ["-p", str(host.port)]
        # `exec`: the command replaces the login shell that sshd runs it in (dash and busybox ash keep waiting
        # for a lone `-c` command), so the device's edgekit sees its session end when the connection drops
        cmd += ["--", host.target, "exec " + " ".join(_remote_word(a) for a in argv)]
        try:
            done = run_bounded(cmd, stdin=stdin, timeout=self.remaining())
        except subprocess.TimeoutExpired:
            raise HostFailure(f"timed out (`timeout` {self.timeout:g} s)") from None
        if done.overflow:
            raise HostFailure(f"the device sent more than {STDOUT_CAP >> 20} MiB on stdout; stopped it")
        if done.returncode < 0:
            raise HostFailure(f"the connection dropped: ssh was killed by {_signal_name(-done.returncode)} on this "
                              "machine; run again")
        if done.returncode == 255:
            raise HostFailure(_ssh_problem(host, done.stderr.decode(errors="replace")))
        if done.returncode == 127:
            raise HostFailure(f"{self.remote_python} is not on the device (exit 127): set `remote_python` to the path "
                              "of the Python that has edgekit (e.g. ~/venv/bin/python)")
        return done


@dataclass(frozen=True)
class Item:
    """A file or folder sent to the device, named on it by the sha256 of its content."""

    path: Path
    key: str
    kind: str  # "file" or "dir"

    @property
    def spec(self) -> dict[str, str]:
        return {"key": self.key, "kind": self.kind, "name": self.path.name}

    @property
    def size(self) -> int:
        files = [self.path] if self.kind == "file" else [p for p in self.path.rglob("*") if p.is_file()]
        return sum(p.stat().st_size for p in files)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def item_for(path: Path) -> Item:
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if q.is_file() and not q.name.startswith(".")):
            h.update(f"{p.relative_to(path).as_posix()}\0{_sha256(p)}\n".encode())
        return Item(path, "d" + h.hexdigest()[:63], "dir")
    return Item(path, _sha256(path), "file")


def _tar_of(items: list[Item]):
    """A temporary file holding a tar of the items, members named by key (the device's layout)."""
    spool = tempfile.TemporaryFile()  # noqa: SIM115 (returned; the caller closes it)
    with tarfile.open(fileobj=spool, mode="w") as tar:
        for item in items:
            if item.kind == "file":
                tar.add(item.path, arcname=item.key)
                continue
            for p in sorted(q for q in item.path.rglob("*") if q.is_file() and not q.name.startswith(".")):
                tar.add(p, arcname=f"{item.key}/{p.relative_to(item.path).as_posix()}")
    spool.seek(0)
    return spool


def _error_line(stderr: bytes, code: int) -> str:
    """The device's error as one printable line (its last `edgekit: error:` line, else its last line)."""
    lines = [printable(ln) for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if ln.startswith(("edgekit: error:", "edgekit: internal error:"))]
    line = (errors or lines or [f"exit {code}"])[-1].removeprefix("edgekit: error: ")
    return line if code == 124 else f"the device's edgekit failed (exit {code}): {line}"


def _clean(value: Any) -> Any:
    """A device's JSON with every string stripped of escape and control codes (they reach a terminal)."""
    if isinstance(value, str):
        return strip_controls(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {strip_controls(str(k)): _clean(v) for k, v in value.items()}
    return value


def probe(session: Session, host: Host, keys: list[str]) -> dict[str, Any]:
    """The device's Python and edgekit, and which keys it holds; HostFailure when it cannot run edgekit."""
    limit = str(max(1, round(min(session.remaining(), 60.0))))
    done = session.ssh(host, ["sh", "-c", KILLED_AFTER, "sh", limit, session.remote_python, "-c", PROBE, STAGE, *keys])
    try:
        info = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError, RecursionError):
        raise HostFailure(f"{session.remote_python} on the device did not run edgekit's probe (exit "
                          f"{done.returncode}): {_error_line(done.stderr, done.returncode)}") from None
    wrong = next(problems_of(info, PROBE_ANSWER), None)
    if wrong:
        raise HostFailure(f"{session.remote_python} on the device answered the probe with something else than "
                          f"edgekit's probe prints ({printable(wrong, 120)})")
    return info


def require_edgekit(session: Session, info: dict[str, Any]) -> None:
    version = info.get("edgekit")
    if version is None:
        raise HostFailure(f"no edgekit for {info.get('executable') or session.remote_python} (Python "
                          f"{info.get('python')}) on the device: run `{session.remote_python} -m pip install "
                          "edgekit` there, or pass --remote-python with the Python of the venv that has it")
    if _version_tuple(version) < _version_tuple(MIN_DEVICE_EDGEKIT):
        raise HostFailure(f"edgekit {version} on the device is too old (need >= {MIN_DEVICE_EDGEKIT}): run "
                          f"`{session.remote_python} -m pip install -U edgekit` there")


FEATURES = {TFLITE_REFERENCE: "a float .tflite as `reference`"}  # what PROBE finds, in words
_KINDS = {"keras": "a Keras model", "h5": "a Keras .h5 model", "saved_model": "a SavedModel"}  # model_kind's, in words


def require_features(session: Session, info: dict[str, Any], needs: tuple[str, ...]) -> None:
    """HostFailure when the device's edgekit lacks a feature the run needs (it predates it)."""
    lacking = [f for f in needs if f not in info.get("features", [])]
    if lacking:
        raise HostFailure(f"edgekit {info.get('edgekit')} on the device cannot take {FEATURES[lacking[0]]} (a "
                          f"newer edgekit can): run `{session.remote_python} -m pip install -U edgekit` there")


@dataclass
class HostResult:
    host: Host
    ok: bool = False
    report: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    copied_bytes: int = 0
    reused: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"host": self.host.spec, "ok": self.ok, "edgekit": self.info.get("edgekit"),
                "python": self.info.get("python"), "copied_bytes": self.copied_bytes, "reused": self.reused,
                "seconds": round(self.seconds, 3), "error": self.error}


def run_edgekit(session: Session, host: Host, items: list[Item], args: list[str],
                result: HostResult, *, needs: tuple[str, ...] = ()) -> Bounded:
    """`python -m edgekit ARGS` on the device with the items in place ({item:N} in args = item N's path);
    `needs`: the FEATURES its edgekit must have."""
    info = probe(session, host, [i.key for i in items])
    result.info = info
    require_edgekit(session, info)
    require_features(session, info, needs)
    distinct = list({i.key: i for i in items}.values())  # a file given twice (a model as its reference) goes once
    missing = [i for i in distinct if i.key not in set(info["present"])]
    result.reused = len(distinct) - len(missing)
    result.copied_bytes = sum(i.size for i in missing)
    left = session.remaining()  # the device stops the benchmark itself, grace included, before we give up
    spec = {"stage": STAGE, "items": [i.spec for i in items], "args": args, "keep": session.keep,
            "timeout": max(1.0, left - 1.0 - KILL_GRACE), "grace": KILL_GRACE, "limit": session.timeout}
    with _tar_of(missing) as tar:  # and should its Python hang, ignoring SIGTERM, KILLED_AFTER stops it
        return session.ssh(host, ["sh", "-c", KILLED_AFTER, "sh", str(math.ceil(left)), session.remote_python,
                                  "-c", RUN, json.dumps(spec)], stdin=tar)


def bench_host(session: Session, host: Host, models: list[Path], bench_args: list[str],
               data: Path | None, reference: Path | None = None) -> HostResult:
    """One host's benchmark; never raises for what went wrong on the device (it is in the result). The
    reference .tflite and the data travel as the models do."""
    result = HostResult(host)
    start = time.monotonic()
    try:
        extra = [(flag, path) for flag, path in (("--reference", reference), ("--data", data)) if path is not None]
        items = [item_for(p) for p in [*models, *(path for _, path in extra)]]
        args = ["bench", *(f"{{item:{i}}}" for i in range(len(models))), *bench_args, "--json", "-"]
        for i, (flag, _) in enumerate(extra, start=len(models)):
            args += [flag, f"{{item:{i}}}"]
        needs = (TFLITE_REFERENCE,) if reference is not None else ()
        done = run_edgekit(session, host, items, args, result, needs=needs)
        if done.returncode != 0:
            raise HostFailure(_error_line(done.stderr, done.returncode))
        try:
            result.report = _clean(json.loads(done.stdout))
        except (ValueError, RecursionError):
            raise HostFailure("the device's edgekit printed no bench report (is it a different program "
                              "named edgekit?)") from None
        wrong = next(problems_of(result.report, load_schema("edgekit.bench/1")), None)
        if wrong:
            result.report = None
            raise HostFailure(f"the device's bench report breaks edgekit.bench/1 ({printable(wrong, 160)})")
        result.ok = True
    except HostFailure as exc:
        result.error = str(exc)
    result.seconds = time.monotonic() - start
    return result


def _for_each_host(hosts: list[str], work) -> list[HostResult]:
    parsed = [parse_host(h) for h in hosts]
    if len({h.spec for h in parsed}) < len(parsed):
        raise UsageError("each host once", param="hosts")
    ssh_base()
    with ThreadPoolExecutor(max_workers=min(16, len(parsed))) as pool:
        return list(pool.map(work, parsed))


def check_reference(reference: Path) -> None:
    """UsageError, before anything connects, for a `reference` the device cannot run: only a float .tflite
    runs there (a Keras model or SavedModel needs TensorFlow, which a device seldom has). Judged by its bytes."""
    if not reference.exists():
        raise UsageError(f"{reference}: no such file or folder", param="reference")
    try:
        kind = model_kind(reference)
    except ModelFormatError as exc:  # bytes that are no model: say what `reference` takes with `hosts`
        raise ModelFormatError(f"{reference} is no model ({one_line(exc)}); with `hosts` the reference is a "
                               "float .tflite", param="reference") from None
    if kind != "tflite":
        stem = reference.stem if reference.suffix in (".keras", ".h5", ".hdf5") else reference.name  # as convert names it
        raise UsageError(f"{reference} is {_KINDS[kind]}, which needs TensorFlow; with `hosts` the device runs the "
                         f"reference: convert it to a float .tflite: edgekit convert {reference}, then pass "
                         f"{reference.parent / (stem + '.float32.tflite')}", param="reference")


def bench_on(hosts: list[str], models: list[Path], session: Session, *, bench_args: list[str],
             data: Path | None = None, reference: Path | None = None) -> list[HostResult]:
    """Benchmark the models on every host in parallel (against `reference`, a float .tflite, when given);
    a HostResult per host, in the order given."""
    for m in models:
        if not m.is_file():
            raise UsageError(f"{m}: no such model file")
    if data is not None and not data.exists():
        raise UsageError(f"{data}: no such file or folder", param="data")
    if reference is not None:
        check_reference(reference)
    session.deadline = time.monotonic() + session.timeout
    return _for_each_host(hosts, lambda h: bench_host(session, h, models, bench_args, data, reference))


def merged_report(results: list[HostResult], models: list[Path], *, data: Path | None,
                  remote_data: str | None, reference: Path | None = None) -> dict[str, Any]:
    """One edgekit.bench/1 report: a row per (model, host) with the host and its device; `hosts` says
    how each host fared and, with a reference, what ran it there; `reference` is the first such host's.
    Paths are the workstation's, not the device's temporary copies."""
    from edgekit._version import __version__

    ok = [(r.host, r.report) for r in results if r.ok and r.report is not None]  # an ok host has its report
    first = ok[0][1] if ok else {}
    hosts = [r.summary() for r in results]
    if reference is not None:
        for entry, r in zip(hosts, results):
            ref = (r.report or {}).get("reference") if r.ok else None
            entry["reference"] = {**ref, "path": str(reference)} if ref else None
    report: dict[str, Any] = {"schema": "edgekit.bench/1", "edgekit": __version__,
                              "settings": first.get("settings"), "data": first.get("data"),
                              "reference": next((h["reference"] for h in hosts if h.get("reference")), None),
                              "models": [], "hosts": hosts}
    if report["data"]:
        report["data"] = {**report["data"], "path": str(data) if data is not None else remote_data}
    for host, bench in ok:
        for path, row in zip(models, bench["models"]):
            report["models"].append({**row, "path": str(path), "host": host.spec})
    return report


def doctor_host(session: Session, host: Host) -> HostResult:
    result = HostResult(host)
    start = time.monotonic()
    try:
        done = run_edgekit(session, host, [], ["doctor", "--json"], result)
        if done.returncode != 0:
            raise HostFailure(_error_line(done.stderr, done.returncode))
        try:
            report = _clean(json.loads(done.stdout))
        except RecursionError:
            raise ValueError("nested too deeply") from None
        wrong = next(problems_of(report, load_schema("edgekit.doctor/1")), None) if isinstance(report, dict) else "not an object"
        if wrong:
            raise HostFailure(f"the device's doctor report breaks edgekit.doctor/1 ({printable(wrong, 160)})")
        result.report = {**report, "host": host.spec}
        result.ok = True
    except HostFailure as exc:
        result.error = str(exc)
    except ValueError:
        result.error = "the device's edgekit printed no doctor report"
    result.seconds = time.monotonic() - start
    return result


def doctor_on(hosts: list[str], session: Session) -> list[HostResult]:
    session.deadline = time.monotonic() + session.timeout
    return _for_each_host(hosts, lambda h: doctor_host(session, h))
