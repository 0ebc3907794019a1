"""The edgekit exception hierarchy and the CLI exit codes it maps to.

    EdgekitError                       exit 1
    ├── UsageError                     exit 2   bad combination of options
    ├── ModelFormatError               exit 3   missing, unreadable or not-a-model file
    │   ├── UnsafeModelError           exit 3   refuses to run code embedded in a model
    │   └── InvokeError                exit 3   the interpreter failed on this model at run time
    ├── CalibrationError               exit 4   empty, image-free or non-finite calibration data
    ├── ConversionError                exit 5   the converter failed or its output is broken
    │   └── UnsupportedOpsError        exit 5   ops the target runtime cannot run
    ├── InputShapeError                exit 6   data that does not fit the model's input
    ├── OutputExistsError              exit 7   would overwrite a file without --force
    ├── SourceDisconnectedError        exit 8   a camera or stream that went away
    └── MissingDependencyError         exit 9   an optional extra is not installed

Kept free of third-party imports: the runtime and the CLI both raise these.
"""

from __future__ import annotations


class EdgekitError(Exception):
    """Base of every error edgekit raises on purpose; the CLI prints `str(err)` on one line."""

    exit_code = 1


class UsageError(EdgekitError):
    exit_code = 2


class ModelFormatError(EdgekitError):
    exit_code = 3


class UnsafeModelError(ModelFormatError):
    exit_code = 3


class InvokeError(ModelFormatError):
    exit_code = 3


class CalibrationError(EdgekitError):
    exit_code = 4


class ConversionError(EdgekitError):
    """Conversion failed; `ops` lists the offending ops when the converter named them."""

    exit_code = 5

    def __init__(self, message: str, ops: tuple[str, ...] = ()):
        super().__init__(message)
        self.ops = tuple(ops)


class UnsupportedOpsError(ConversionError):
    exit_code = 5


class InputShapeError(EdgekitError):
    exit_code = 6


class OutputExistsError(EdgekitError):
    exit_code = 7


class SourceDisconnectedError(EdgekitError):
    exit_code = 8


class MissingDependencyError(EdgekitError):
    exit_code = 9


class RemoteError(EdgekitError):
    """`--on HOST`: a device could not be reached or could not run edgekit (the other hosts' results stand)."""

    exit_code = 10


def one_line(message: object) -> str:
    """Collapse a message to its first non-empty line, for errors that come from libraries."""
    for line in str(message).splitlines():
        if line.strip():
            return line.strip()
    return type(message).__name__ if not isinstance(message, str) else "unknown error"
