"""Atomic, no-clobber file writes: a reader sees the old file or the whole new one, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgekit.errors import EdgekitError, OutputExistsError, UsageError


def check_writable(path: Path, force: bool) -> None:
    """Fail before any work when `path` is a folder, exists without `force`, or cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give a file path for the output")
    if path.exists() and not force:
        raise OutputExistsError(f"{path} exists; pass --force to replace it")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{parent}: output folder does not exist")
    try:  # the only sure test (access() says yes to root on a read-only mount)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{parent}: cannot write there ({exc.strerror or exc})") from None


def _file_mode(path: Path) -> int:
    """The mode a plain open() would give a new file (mkstemp makes 0600), or the replaced file's."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0o22)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_bytes(path: str | Path, data: bytes, *, force: bool = False) -> Path:
    """Write `data` to `path` through a temporary file in the same folder. Without `force` an
    existing file is never replaced, even one that appeared while we were writing."""
    path = Path(path)
    check_writable(path, force)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"{path.parent}: cannot write there ({exc.strerror or exc})") from None
    try:
        os.chmod(tmp, _file_mode(path))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise OutputExistsError(f"{path} exists; pass --force to replace it") from None
            os.unlink(tmp)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise EdgekitError(f"{path}: write failed ({exc.strerror or exc})") from None
        raise
    return path


def atomic_write_text(path: str | Path, text: str, *, force: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), force=force)
