"""What a model path holds, judged by its bytes and never by its name: a Keras `.keras` archive (a zip), an HDF5
file (a legacy Keras `.h5`), a SavedModel folder or a TFLite flatbuffer.

Cheap and free of TensorFlow: `convert` asks it before TensorFlow starts (seconds), so bytes that are no model
are refused at once in edgekit's words, and a real model with an unusual extension (`.hdf5`, `.model`) is
loaded as what it is.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from edgekit.errors import ModelFormatError
from edgekit.files import check_regular_tree, read_head

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
TFLITE_IDENTIFIER = b"TFL3"  # bytes 4..8 of a .tflite (runtime.flatbuffer.FILE_IDENTIFIER)
SUFFIXES = {"keras": ".keras", "h5": ".h5", "saved_model": "", "tflite": ".tflite"}  # what loaders expect
# what a file that is no model most often is, by its first bytes: named in the refusal
_OTHERS = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
           (b"%PDF", "a PDF document"), (b"\x1f\x8b", "a gzip file"), (b"\x80\x02", "a Python pickle"),
           (b"\x93NUMPY", "a numpy .npy array"))


def model_kind(path: str | Path) -> str:
    """"keras", "h5", "saved_model" or "tflite", from the bytes (a folder: its saved_model.pb); ModelFormatError
    for what is none of these, what does not exist, and a SavedModel folder holding anything but regular files
    (a FIFO would block TensorFlow's reader for ever)."""
    path = Path(path)
    if not path.exists():
        raise ModelFormatError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            check_regular_tree(path, error=ModelFormatError)
            return "saved_model"
        raise ModelFormatError(f"{path}: a folder, but not a SavedModel (no saved_model.pb)")
    head = read_head(path, 16, error=ModelFormatError)
    if head.startswith(HDF5_SIGNATURE):
        return "h5"
    if head.startswith(b"PK") and zipfile.is_zipfile(path):
        return "keras"  # converters/model_safety reads it (with caps) and checks its config.json
    if head[4:8] == TFLITE_IDENTIFIER:
        return "tflite"
    raise ModelFormatError(f"{path}: not a Keras model (.keras, .h5) or a SavedModel folder ({_what(head)})")


def _what(head: bytes) -> str:
    """A few words on bytes that are no model, for the refusal."""
    if not head:
        return "the file is empty"
    for magic, name in _OTHERS:
        if head.startswith(magic):
            return f"it holds {name}"
    return "it holds text" if _is_text(head) else "its bytes match no model format"


def _is_text(head: bytes) -> bool:
    for cut in range(4):  # the 16 bytes read may end inside a UTF-8 character
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return all(c.isprintable() or c in "\t\n\r" for c in text)
    return False
