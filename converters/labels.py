"""The class names a user gives (`info.labels`) for data without class folders: read from a labels file (one
name per line, as TFLite's labels files are), checked against the model's outputs and against any class
folders the conversion reads. Class folders that name a class index otherwise are refused rather than one
silently winning: a class index means one name only. Folders named by the indices ("0", "1", ...) agree
with any names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from edgekit.converters.loading import TensorSpec
from edgekit.errors import InputShapeError, UsageError
from edgekit.files import read_regular

PARAM = "info.labels"
MAX_BYTES = 16 * 1024 * 1024  # far past any real label set (ImageNet-21k's names are ~400 KB)
MAX_NAMES, MAX_NAME = 100_000, 1024  # what the metadata schema (edgekit/schemas/metadata-1) takes
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def read_labels(path: Path) -> tuple[str, ...]:
    """The class names of a labels file: UTF-8 text, one name per line, surrounding spaces dropped. A blank line
    between names would shift every index after it: it is refused, as is a file that is not text."""
    try:  # the one reader of files a user names: a folder, device or FIFO is refused before it is opened
        text = read_regular(path, limit=MAX_BYTES, error=InputShapeError).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputShapeError(f"{path}: not UTF-8 text; a labels file has one class name per line",
                              param=PARAM) from None
    except InputShapeError as exc:
        raise InputShapeError(f"{exc}; a labels file has one class name per line", param=PARAM) from None
    if "\0" in text:
        raise InputShapeError(f"{path}: binary data; a labels file has one class name per line", param=PARAM)
    lines = [line.strip() for line in text.rstrip("\r\n\t ").splitlines()]
    blank = next((i for i, line in enumerate(lines) if not line), None)
    if not text.strip() or blank is not None:
        where = "is empty" if not text.strip() or blank is None else f"line {blank + 1} is blank"
        raise InputShapeError(f"{path}: {where}; a labels file has one class name per line", param=PARAM)
    return tuple(lines)


def class_names(given: Path | tuple[str, ...] | None) -> tuple[str, ...]:
    """`info.labels` as names: the file read, or the names given in memory; () when none were given. A name
    is printable text of at most MAX_NAME characters, as the metadata stores it."""
    if given is None:
        return ()
    names = read_labels(given) if isinstance(given, Path) else tuple(given)
    where = str(given) if isinstance(given, Path) else "the class names given"
    if len(names) > MAX_NAMES:
        raise InputShapeError(f"{where}: {len(names)} class names, more than the {MAX_NAMES} edgekit stores",
                              param=PARAM)
    for number, name in enumerate(names, 1):
        if len(name) > MAX_NAME or _CONTROL.search(name):
            what = f"longer than {MAX_NAME} characters" if len(name) > MAX_NAME else "holds a control character"
            raise InputShapeError(f"{where}: class name {number} {what}", param=PARAM)
    return names


def check_count(names: Sequence[str], outputs: Sequence[TensorSpec], where: str) -> None:
    """The names must be as many as the scores of some output (its last axis): else a one-line error naming
    the outputs' sizes."""
    if not names or any(t.shape and t.shape[-1] == len(names) for t in outputs):
        return
    sizes = " or ".join(f"{_last(t)} ({t.name})" for t in outputs)
    raise InputShapeError(f"{where}: {len(names)} class names, but the model gives {sizes} scores per sample: "
                          "one name per class, one per line", param=PARAM)


def check_folders(names: Sequence[str], classes: Sequence[str], source: object, param: str) -> None:
    """Class folders the conversion reads (`param`; sorted folder names are class 0, 1, ...) must give each
    class index the given name: the same names in the same order (the first classes of them, where a folder
    holds fewer), or folders named by the indices themselves ("0", "1", ...), which the names then name."""
    if not names or not classes:
        return
    numbered = all(c == str(i) for i, c in enumerate(classes))
    if len(classes) <= len(names) and (numbered or tuple(classes) == tuple(names[:len(classes)])):
        return
    first = next((i for i, (a, b) in enumerate(zip(classes, names)) if a != b), min(len(classes), len(names)))
    folder = repr(classes[first]) if first < len(classes) else "none"
    label = repr(names[first]) if first < len(names) else "none"
    raise UsageError(f"the class folders of {source} ({len(classes)}) and `{PARAM}` ({len(names)} names) disagree "
                     f"at class {first}: folder {folder}, label {label}; give the names in the folders' sorted "
                     f"order, or leave `{PARAM}` out to use the folder names", param=param)


def _last(t: TensorSpec) -> str:
    return "?" if not t.shape or t.shape[-1] is None else str(t.shape[-1])
