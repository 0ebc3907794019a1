"""Silencing native logs for the CLI: a process-wide change, so only the CLI makes it.

Library calls (Model(), convert(), training) never touch file descriptors, environment variables or
hooks: an app that loads two models in parallel keeps its stderr. The `edgekit` command enters
`native_output_silenced()` once, around a whole subcommand, in its main thread.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator

# read by TensorFlow and gRPC when they are imported; set only where the user has not chosen a level
_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "GRPC_VERBOSITY": "ERROR"}


def _writes_to(stream, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # CliRunner's BytesIO, closed streams
        return False


def _stream_on(fd: int, like) -> io.TextIOWrapper:
    """A text stream on `fd` (which it owns) with `like`'s encoding and buffering."""
    return io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=True), encoding=like.encoding, errors=like.errors,
                            line_buffering=True, write_through=True)


@contextlib.contextmanager
def native_output_silenced() -> Iterator[None]:
    """Inside, what C/C++ code writes to fds 1 and 2 (LiteRT's "INFO: Created TensorFlow Lite XNNPACK
    delegate", TensorFlow and MLIR logs) goes to /dev/null, while Python's `sys.stdout` and `sys.stderr`
    keep writing where fds 1 and 2 pointed; TensorFlow's and absl's Python loggers are turned down to errors.
    Everything is restored on exit. Not thread-safe by nature: for the CLI only. EDGEKIT_DEBUG=1 leaves
    everything visible."""
    if os.environ.get("EDGEKIT_DEBUG"):
        yield
        return
    env = {name: os.environ.get(name) for name in _QUIET_ENV}
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    tf_logger = logging.getLogger("tensorflow")  # what tf.get_logger() returns; creating it first is harmless
    tf_level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    absl_verbosity = _absl_verbosity(None)
    streams = {fd: pair for fd, pair in ((1, ("stdout", sys.stdout)), (2, ("stderr", sys.stderr))) if _is_open(fd)}
    for _, stream in streams.values():
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in streams}
    devnull = os.open(os.devnull, os.O_WRONLY)
    replaced = {}
    try:
        for fd, (name, stream) in streams.items():
            if _writes_to(stream, fd):  # Python's own writes keep going where fd 1/2 pointed
                replaced[name] = _stream_on(os.dup(saved[fd]), stream)
                setattr(sys, name, replaced[name])
            os.dup2(devnull, fd)
        yield
    finally:
        for name, stream in replaced.items():
            if getattr(sys, name) is stream:
                setattr(sys, name, streams[1 if name == "stdout" else 2][1])
            try:
                stream.flush()  # it stays open: a logging handler created inside may still hold it
            except Exception:  # BrokenPipeError (`edgekit run | head`): drop it now, not at exit  # noqa: BLE001
                with contextlib.suppress(Exception):
                    stream.close()
        for fd in streams:
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
        os.close(devnull)
        tf_logger.setLevel(tf_level)
        if absl_verbosity is not None:
            _absl_verbosity(absl_verbosity)
        for name, before in env.items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def _is_open(fd: int) -> bool:
    """fd 1 or 2 may be closed (`edgekit ... >&-`, some daemons): leave such an fd alone."""
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _absl_verbosity(restore: int | None) -> int | None:
    """Turn absl's Python logger (tf_keras logs through it) down to errors, or restore `restore`;
    returns the previous verbosity (None without absl)."""
    try:
        import absl.logging
    except ImportError:
        return None
    previous = absl.logging.get_verbosity()
    absl.logging.set_verbosity(absl.logging.ERROR if restore is None else restore)
    return previous
