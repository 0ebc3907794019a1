"""Atomic, no-clobber file writes: a reader sees the old file or the whole new one, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgekit.errors import OutputExistsError, UsageError


def check_writable(path: Path, force: bool) -> None:
    """Fail before any work when `path` exists and `force` is off, or its folder is missing."""
    if path.exists() and not force:
        raise OutputExistsError(f"{path} exists; pass --force to replace it")
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give a file path for the output")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent}: output folder does not exist")


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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str, *, force: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), force=force)
