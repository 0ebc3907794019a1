"""Where `edgekit tune` keeps its study, and who may time on a device.

Storage is Optuna's: an embedded SQLite file or a journal file on one machine (nothing to start), a
PostgreSQL server shared by many workers. A trial's worker beats a heartbeat into RDB storage; a worker that
dies leaves a trial whose heartbeat stops, which the next worker to start a trial marks failed and Optuna's
RetryHeartbeatStaleTrialCallback queues again with the same settings (a dead worker of this machine is
found at once by its process id: tuner._recover_local).

A device is leased to one trial at a time (two trials timing on one Pi at once would each measure the other):
a PostgreSQL advisory lock where the study lives on PostgreSQL (every worker sees it; a dead worker's
connection closes and its lock goes with it), a file lock beside a local storage file (the kernel releases
it with the process)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from edgekit.errors import MissingDependencyError, UsageError

HEARTBEAT_SECONDS = 10
GRACE_SECONDS = 60  # a RUNNING trial without a heartbeat for this long belongs to a dead worker
RETRIES = 3  # a trial whose worker died is queued again at most this many times
POLL_SECONDS = 0.25  # how often a trial waiting for one of several machines tries them again
JOURNAL_SUFFIXES = (".log", ".journal", ".jsonl")


def import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise MissingDependencyError("`tune` searches with Optuna: pip install 'edgekit[convert]'") from None
    return optuna


def storage_url(storage: str | None, out: Path) -> str:
    """The storage the study lives in: Optuna's URL (`sqlite:///PATH`, `postgresql://...`), or a journal file's
    path; None: `out/study.db` (SQLite). `postgresql://` is served by psycopg 3."""
    if storage is None:
        return f"sqlite:///{(out / 'study.db').resolve()}"
    if storage.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + storage.split("://", 1)[1]
    if "://" in storage:
        if not storage.startswith(("sqlite:///", "postgresql+")):
            raise UsageError(f"takes sqlite:///PATH, postgresql://... or a journal file, got {storage!r}",
                             param="storage")
        return storage
    if not storage.endswith(JOURNAL_SUFFIXES):
        raise UsageError(f"{storage!r}: a journal file ends with {', '.join(JOURNAL_SUFFIXES)}; a database is a "
                         "URL (sqlite:///PATH, postgresql://USER@HOST/DB)", param="storage")
    return storage


def is_server(url: str) -> bool:
    return url.startswith("postgresql")


def open_storage(url: str, *, grace: int = GRACE_SECONDS) -> Any:
    """An Optuna storage for `url`: RDB with heartbeats and retries, or a journal file."""
    optuna = import_optuna()
    if "://" not in url:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(url))
    if url.startswith("postgresql+psycopg://"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise MissingDependencyError("a PostgreSQL study needs psycopg: pip install 'psycopg[binary]'") from None
    interval = max(1, min(HEARTBEAT_SECONDS, grace // 3))
    try:
        return optuna.storages.RDBStorage(url, heartbeat_interval=interval, grace_period=grace,
                                          heartbeat_stale_trial_callback=retry_callback(),
                                          engine_kwargs={"pool_pre_ping": True} if is_server(url) else None)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's and the driver's many errors: one line
        raise UsageError(f"cannot open the study storage {redacted(url)}: {str(exc).splitlines()[0]}",
                         param="storage") from None


def retry_callback() -> Any:
    """Optuna's callback that queues a dead worker's trial again (its settings, `failed_trial` naming it)."""
    import optuna

    return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)


def redacted(url: str) -> str:
    """A storage URL with its password hidden, as it may be printed."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def _lock_key(device: str) -> int:
    """A device's name as PostgreSQL's advisory lock key (a signed 64-bit integer)."""
    return int.from_bytes(hashlib.sha256(b"edgekit-device:" + device.encode()).digest()[:8], "big", signed=True)


class _Held:
    """A device's lease while it is held: `release()` gives it back."""

    def __init__(self, release: Callable[[], None]) -> None:
        self.release = release


def _acquire_file(url: str, unit: str, wait: bool) -> _Held | None:
    path = url.removeprefix("sqlite:///") if "://" in url else url
    folder = Path(path).with_name(Path(path).name + ".leases")
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", unit) + "-" + f"{_lock_key(unit) & 0xFFFFFFFF:08x}"
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return _Held(lambda: os.close(fd))  # the lock goes with the descriptor


def _acquire_advisory(url: str, unit: str, wait: bool) -> _Held | None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    conn = engine.connect()  # the lock is this session's: it ends with the connection (a dead worker's too)
    key = {"k": _lock_key(unit)}
    if wait:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), key)
    elif not conn.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"), key).scalar():
        conn.close()
        engine.dispose()
        return None

    def release() -> None:
        try:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), key)
        finally:
            conn.close()
            engine.dispose()

    return _Held(release)


@contextlib.contextmanager
def lease(url: str, units: Sequence[str]) -> Iterator[str]:
    """Hold one of `units` (the machines of one device kind: `--on pi4=pi@a --on pi4=pi@b`) for the block,
    and say which: no other trial of any worker on this storage times on it meanwhile. Blocks until one is
    free (several: each tried in turn, every POLL_SECONDS)."""
    acquire = _acquire_advisory if is_server(url) else _acquire_file
    held: tuple[str, _Held] | None = None
    while held is None:
        held = next(((u, h) for u in units if (h := acquire(url, u, len(units) == 1)) is not None), None)
        if held is None:
            time.sleep(POLL_SECONDS)
    try:
        yield held[0]
    finally:
        held[1].release()
