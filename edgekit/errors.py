"""The edgekit exception hierarchy and the exit codes it maps to: one table, EXIT_CODES, from which
`edgekit --help`, the README's table and the tests are made.

    EdgekitError                       exit 1
    ├── UsageError                     exit 2
    ├── ModelFormatError               exit 3
    │   ├── UnsafeModelError           exit 3
    │   └── InvokeError                exit 3
    ├── CalibrationError               exit 4
    ├── ConversionError                exit 5
    │   └── UnsupportedOpsError        exit 5
    ├── InputShapeError                exit 6
    ├── OutputExistsError              exit 7
    ├── SourceDisconnectedError        exit 8
    ├── MissingDependencyError         exit 9
    ├── RemoteError                    exit 10
    └── BudgetMissedError              exit 11

An error speaks in the library's own words: it names parameters as the Python API spells them
(`param`, and `name` or `name=value` between backticks in the message). The CLI renders the same error
with its flags (`EdgekitError.render`), so `edgekit.convert(m, preprocessing=Preprocessing(std=0))` says
"preprocessing.std: must not be 0" where `edgekit convert --std 0` says "--std: must not be 0".

Kept free of third-party imports: the runtime and the CLI both raise these.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# (code, what it means): the one list of exit codes
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "ok"),
    (1, "error: any other edgekit error"),
    (2, "usage: a bad option or combination of options"),
    (3, "model format: missing, unreadable or not a model; unsafe; the interpreter failed on it"),
    (4, "calibration data: missing, empty, image-free, unreadable, non-finite, wrong shape"),
    (5, "conversion failed (ops named when the converter names them) or its output is broken"),
    (6, "input data: a source or data file that cannot be read, or data that does not fit the model's input"),
    (7, "output exists (pass --force)"),
    (8, "source disconnected: a camera or stream that could not be (re)opened after 5 retries in a row"),
    (9, "missing dependency (pip install \"edgekit[convert]\")"),
    (10, "a device (--on HOST) could not be reached or could not run edgekit; the others' results are kept"),
    (11, "an accuracy budget you gave was missed, on its 95 % interval and its point estimate: the file is "
         "written and the report says by how much"),
    (70, "internal error (EDGEKIT_DEBUG=1 shows the traceback)"),
    (130, "interrupted (Ctrl-C)"),
    (141, "stdout closed by its reader (| head)"),
)
INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130
BROKEN_PIPE_EXIT = 141

# `name` or `name=value`: a parameter named in a message, rendered by whoever shows the error
_PARAM = re.compile(r"`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?:=([^`]*))?`")

Namer = Callable[[str, "str | None"], str]


def api_name(param: str, value: str | None = None) -> str:
    """A parameter as the Python API spells it: `calibration.samples`, `mode='int8'`."""
    return param if value is None else f"{param}={value!r}"


def render_params(text: str, name: Namer = api_name) -> str:
    """`text` with each `param` or `param=value` named by `name`: the errors' and warnings' one rendering."""
    return _PARAM.sub(lambda m: name(m.group(1), m.group(2)), text)


class EdgekitError(Exception):
    """Base of every error edgekit raises on purpose; the CLI prints it on one line.

    `param`: the parameter the error is about (the API's name, "calibration.samples"), shown before the
    message; parameters named inside the message are written `name` or `name=value`."""

    exit_code = 1

    def __init__(self, message: object = "", *, param: str | None = None):
        super().__init__(message)
        self.param = param

    def render(self, name: Namer = api_name) -> str:
        """The message with every parameter named by `name` (the CLI passes its flags)."""
        text = render_params(str(self.args[0]) if self.args else "", name)
        return f"{name(self.param, None)}: {text}" if self.param else text

    def __str__(self) -> str:
        return self.render()


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

    def __init__(self, message: object = "", ops: tuple[str, ...] = (), *, param: str | None = None):
        super().__init__(message, param=param)
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


class BudgetMissedError(EdgekitError):
    """An accuracy budget the user gave (`budget.max_drop`) that the result misses on the interval and on the
    point estimate (one the data cannot resolve is not missed). Nothing is lost: the file is
    written; its exit code is for scripts that must not ship it."""

    exit_code = 11


def one_line(message: object) -> str:
    """Collapse a message to its first non-empty line, for errors that come from libraries."""
    for line in str(message).splitlines():
        if line.strip():
            return line.strip()
    return type(message).__name__ if not isinstance(message, str) else "unknown error"
