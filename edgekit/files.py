"""Files: atomic, no-clobber writes (a reader sees the old file or the whole new one, never half, and a
write killed with SIGKILL leaves a temporary that the next write beside it removes), and bounded reads
of regular files and trees (no FIFO, device or endless symlink reaches a reader)."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

from edgekit.errors import EdgekitError, OutputExistsError, UsageError


def check_writable(path: Path, force: bool) -> None:
    """Fail before any work when `path` is a folder, exists without `force`, or cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give a file path for the output")
    if path.exists() and not force:
        raise OutputExistsError(f"{path} exists; set `force` to replace it")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{parent}: output folder does not exist")
    _remove_stale(path)
    try:  # the only sure test (access() says yes to root on a read-only mount)
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{parent}: cannot write there ({exc.strerror or exc})") from None


def _host() -> str:
    return "".join(c for c in socket.gethostname() if c.isascii() and (c.isalnum() or c in "._")) or "host"


def _temp_prefix(path: Path) -> str:
    """Temporaries beside `path` are named for it, the machine and the process writing them:
    `.NAME.edgekit-HOST-PID-` (a folder shared over NFS holds other machines' writers too)."""
    return f".{path.name}.edgekit-{_host()}-{os.getpid()}-"


def _remove_stale(path: Path) -> None:
    """Remove the temporaries a killed writer of `path` on this machine left (their process is gone); a
    live writer's stay, and so do other machines'."""
    prefix = f".{path.name}.edgekit-{_host()}-"
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith((".tmp", ".probe"))]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if not (pid.isascii() and pid.isdigit() and len(pid) <= 9) or _alive(int(pid)):
            continue
        try:
            os.unlink(path.parent / name)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


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
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
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
                raise OutputExistsError(f"{path} exists; set `force` to replace it") from None
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


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def read_head(path: str | Path, size: int, *, error: type[EdgekitError] = EdgekitError) -> bytes:
    """The first `size` bytes of a regular file (what `read_regular` refuses, refused the same way)."""
    with open_regular(path, error=error) as fh:
        return fh.read(size)


def read_regular(path: str | Path, *, limit: int, error: type[EdgekitError] = EdgekitError, what: str = "") -> bytes:
    """The bytes of `path` when it is a regular file (symlinks followed) of at most `limit` bytes. A FIFO,
    device, socket, folder or symlink loop is refused before a byte is read (and before a device is even
    opened), and so is a file that grows past `limit` while it is read. Errors are `error`, worded
    "PATH: ..." (`what` names the file's role, e.g. "model")."""
    with open_regular(path, error=error, what=what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise error(f"{_label(path, what)}: {size} bytes, more than the {limit} allowed")
        try:
            data = fh.read(size)  # one buffer of the stated size (an address-space limit allows that much)
            if more := fh.read(1):  # it grew while it was read
                data += more + fh.read(limit - len(data))
                if len(data) > limit or fh.read(1):
                    raise error(f"{_label(path, what)}: grew past the {limit} bytes allowed while it was read")
        except OSError as exc:
            raise error(f"{_label(path, what)}: cannot read ({exc.strerror or exc})") from None
        return data


def _label(path: str | Path, what: str) -> str:
    return f"{path}" + (f" ({what})" if what else "")


def open_regular(path: str | Path, *, error: type[EdgekitError] = EdgekitError, what: str = ""):
    """`path` opened for reading (a binary file object) when it is a regular file: stat first, so a device
    or FIFO is never opened (opening some devices acts), then opened without blocking and without taking a
    terminal, and checked again on the open file (it may have been swapped in between)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise error(f"{_label(path, what)}: no such file") from None
    except OSError as exc:
        raise error(f"{_label(path, what)}: cannot open ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{_label(path, what)}: is {_kind(info.st_mode)}, not a regular file")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"{_label(path, what)}: cannot open ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(f"{_label(path, what)}: is no longer a regular file")
    return os.fdopen(fd, "rb")


def check_regular_tree(folder: str | Path, *, error: type[EdgekitError] = EdgekitError, max_files: int = 100_000,
                       max_bytes: int = 64 * 1024**3) -> list[Path]:
    """The regular files under `folder` (a SavedModel, a data folder), sorted; `error` when any entry is a
    FIFO, device, socket, dangling or looping symlink, or the tree holds more than `max_files` files or
    `max_bytes` bytes: a library that reads such a tree (TensorFlow's SavedModel loader) would block or
    read without end. Symlinked folders are followed, as such a library would, each folder walked once."""
    found: list[Path] = []
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(folder, followlinks=True):
        here = os.stat(root)
        if (here.st_dev, here.st_ino) in seen:
            dirs[:] = []  # reached again through a symlink: its files are counted once
            continue
        seen.add((here.st_dev, here.st_ino))
        for name in dirs + files:
            path = Path(root) / name
            try:
                info = path.stat()
            except OSError as exc:
                raise error(f"{path}: {'a dangling or looping symlink' if path.is_symlink() else exc.strerror}") from None
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise error(f"{path}: is {_kind(info.st_mode)}, not a regular file")
            found.append(path)
            total += info.st_size
            if len(found) > max_files or total > max_bytes:
                raise error(f"{folder}: more than {max_files} files or {max_bytes} bytes")
    return sorted(found)
