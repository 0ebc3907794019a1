"""Files: atomic, no-clobber writes (a reader sees the old file or the whole new one, never half; the data
goes to an unnamed file (Linux's O_TMPFILE) linked into place when whole, so a write killed with SIGKILL
leaves nothing; where the system has none, a named temporary that the next write beside it removes), and
bounded reads of regular files and trees (no FIFO, device or endless symlink reaches a reader)."""

from __future__ import annotations

import errno
import os
import secrets
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
    unnamed = _open_unnamed(parent)  # the only sure test (access() says yes to root on a read-only mount)
    if unnamed is not None:
        os.close(unnamed)
        return
    try:
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
        if not (pid.isascii() and pid.isdigit() and len(pid) <= 9) or process_alive(int(pid)):
            continue
        try:
            os.unlink(path.parent / name)
        except OSError:
            pass


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (another user's counts)."""
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
    fd = _open_unnamed(path.parent)
    if fd is None:
        return _write_named(path, data, force)
    try:
        with os.fdopen(fd, "wb") as fh:
            if force and path.exists():
                os.fchmod(fh.fileno(), _file_mode(path))  # a replaced file keeps its mode
            _write_synced(fh, data)
            try:
                _link_into_place(fh.fileno(), path, force)
            except OSError:  # a sandbox that refuses links through /proc: the named way, which says what failed
                return _write_named(path, data, force)
    except OSError as exc:
        raise EdgekitError(f"{path}: write failed ({exc.strerror or exc})") from None
    return path


def _open_unnamed(folder: Path) -> int | None:
    """A file in `folder` that has no name until it is linked into place (O_TMPFILE): a writer killed even
    with SIGKILL leaves nothing behind. None where the system, the file system (NFS) or a missing /proc
    (the link goes through /proc/self/fd) allows none, or the folder refuses it: then a named temporary."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY | os.O_CLOEXEC, 0o666)  # 0o666 less the umask, as open() gives
    except OSError:  # EOPNOTSUPP, EISDIR (a kernel without O_TMPFILE), EACCES: the named path says which
        return None


def _write_synced(fh, data: bytes) -> None:
    fh.write(data)
    fh.flush()
    os.fsync(fh.fileno())


def _link_into_place(fd: int, path: Path, force: bool) -> None:
    """Give the unnamed file `fd` the name `path`: linked there (never over a file) without `force`; with
    it, linked beside under a temporary name and renamed over `path` (a link cannot replace), so only a
    kill between those two calls leaves a (whole) temporary, which the next write of `path` removes."""
    source = f"/proc/self/fd/{fd}"
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:  # a folder fd makes os.link call linkat(AT_SYMLINK_FOLLOW); plain link() on /proc fails (EXDEV)
        if not force:
            try:
                os.link(source, path.name, dst_dir_fd=folder)
            except FileExistsError:
                raise OutputExistsError(f"{path} exists; set `force` to replace it") from None
            return
        temporary = _link_temporary(source, path, folder)
        try:
            os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        os.close(folder)


def _link_temporary(source: str, path: Path, folder: int) -> str:
    """`source` linked into `folder` under a fresh temporary name for `path`; that name."""
    for _ in range(100):
        name = f"{_temp_prefix(path)}{secrets.token_hex(4)}.tmp"
        try:
            os.link(source, name, dst_dir_fd=folder)
            return name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _write_named(path: Path, data: bytes, force: bool) -> Path:
    """`atomic_write_bytes` through a named temporary, where no unnamed file can be made: a writer killed
    with SIGKILL leaves it, and the next write of `path` removes it (its name carries the writer's pid)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"{path.parent}: cannot write there ({exc.strerror or exc})") from None
    try:
        os.chmod(tmp, _file_mode(path))
        with os.fdopen(fd, "wb") as fh:
            _write_synced(fh, data)
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
