"""Sample arrays from .npy and .npz files, read only after their headers say what they hold.

`numpy.load` allocates what a header claims (a 200-byte .npy can claim 4 TB) and inflates a .npz member
whatever its size (3 MiB of zeros become 4 GiB). Here every header is read first: numeric arrays only (no
pickles, no object arrays), at most `limit` bytes in all, each .npz member a .npy that inflates at most
MAX_RATIO:1 past 64 MiB and holds no more than its header says; the file itself is a regular file (no FIFO
or device: see edgekit.files). Used by calibration, bench and the detection anchors.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Literal, overload

import numpy as np

from edgekit.errors import EdgekitError, InputShapeError, one_line
from edgekit.files import open_regular

MAX_ARRAY_BYTES = 4 * 1024**3
MAX_RATIO = 200  # uncompressed / compressed, per .npz member over BOMB_FLOOR: more is a zip bomb
BOMB_FLOOR = 64 * 1024**2
MAX_MEMBERS = 1024


def load_arrays(path: str | Path, *, error: type[EdgekitError] = InputShapeError,
                limit: int = MAX_ARRAY_BYTES) -> np.ndarray | dict[str, np.ndarray]:
    """The array of a .npy, or {key: array} of a .npz; `error` ("PATH: ...") for anything else, for a
    file past the limits, or for one that holds Python objects."""
    path = Path(path)
    with open_regular(path, error=error) as fh:  # a regular file, opened once, or `error`
        try:
            head = fh.read(4)
            fh.seek(0)
            if head.startswith(b"PK"):
                return _npz(fh, path, error, limit)
            return _read(fh, str(path), error, limit, os.fstat(fh.fileno()).st_size)
        except EdgekitError:
            raise
        except Exception as exc:  # zipfile, zlib, lzma, numpy's header parser: all the file's fault  # noqa: BLE001
            raise error(f"{path}: not a readable numpy file ({type(exc).__name__}: {one_line(exc)[:200]})") from None


def check_arrays(path: str | Path, *, error: type[EdgekitError] = InputShapeError,
                 limit: int = MAX_ARRAY_BYTES) -> None:
    """The checks of `load_arrays` that need no data: a regular .npy or .npz whose headers are numeric,
    within `limit` and (a .npy's) within the file, and no zip bomb by its directory; `error` as there. For a
    caller that refuses a bad file before the work it would start (the data is read, and checked, later)."""
    path = Path(path)
    with open_regular(path, error=error) as fh:
        try:
            head = fh.read(4)
            fh.seek(0)
            if head.startswith(b"PK"):
                _npz(fh, path, error, limit, data=False)
            else:
                _read(fh, str(path), error, limit, os.fstat(fh.fileno()).st_size, data=False)
        except EdgekitError:
            raise
        except Exception as exc:  # as in load_arrays  # noqa: BLE001
            raise error(f"{path}: not a readable numpy file ({type(exc).__name__}: {one_line(exc)[:200]})") from None


def _header(fh, where: str, error: type[EdgekitError]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) from a .npy header, the stream left at the data."""
    try:
        major, _ = np.lib.format.read_magic(fh)
    except ValueError:
        raise error(f"{where}: not a .npy array (no numpy magic)") from None
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(fh, max_header_size=10_000)
    if dtype.hasobject or dtype.kind not in "biuf":  # bool, integers, floats: no objects, times or complex
        raise error(f"{where}: holds {dtype} values; edgekit reads bool, integer and float arrays only (never pickles)")
    return tuple(int(d) for d in shape), bool(fortran), dtype


@overload
def _read(fh, where: str, error: type[EdgekitError], limit: int, available: int | None,
          data: Literal[True] = True) -> np.ndarray: ...


@overload
def _read(fh, where: str, error: type[EdgekitError], limit: int, available: int | None,
          data: bool) -> np.ndarray | None: ...


def _read(fh, where: str, error: type[EdgekitError], limit: int, available: int | None,
          data: bool = True) -> np.ndarray | None:
    """One .npy from `fh`: its header checked against `limit` and the `available` bytes, then its data read
    straight into the array (no second copy); without `data`, None after the header's checks."""
    start = fh.tell()
    shape, fortran, dtype = _header(fh, where, error)
    nbytes = int(np.prod(shape, dtype=np.float64) * dtype.itemsize)
    if nbytes > limit:
        raise error(f"{where}: the header claims {nbytes} bytes of {dtype} {list(shape)}, more than the {limit} "
                    "allowed")
    if available is not None and nbytes > available - (fh.tell() - start):
        raise error(f"{where}: the header claims {nbytes} bytes, the file holds fewer")
    if not data:
        return None
    array = np.empty(shape[::-1] if fortran else shape, dtype)
    flat = array.reshape(-1).view(np.uint8).data if nbytes else memoryview(b"")  # the array's own bytes
    done = 0
    while done < nbytes:
        got = fh.readinto(flat[done:done + (1 << 24)])
        if not got:
            raise error(f"{where}: ends after {done} of the {nbytes} bytes its header claims")
        done += got
    return array.T if fortran else array


def _npz(fh, path: Path, error: type[EdgekitError], limit: int, data: bool = True) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    left = limit
    with zipfile.ZipFile(fh) as zf:
        members = zf.infolist()
        if len(members) > MAX_MEMBERS:
            raise error(f"{path}: {len(members)} arrays, more than the {MAX_MEMBERS} allowed")
        inflated, stored = sum(m.file_size for m in members), os.fstat(fh.fileno()).st_size
        if inflated > BOMB_FLOOR and inflated > MAX_RATIO * max(1, stored):  # many members just under the floor
            raise error(f"{path}: {stored} bytes that inflate {inflated // max(1, stored)}:1, a zip bomb; refusing")
        names = [m.filename for m in members]
        if len(set(names)) != len(names):
            raise error(f"{path}: holds an array name twice")
        for m in members:
            where = f"{path}[{m.filename}]"
            if not m.filename.endswith(".npy") or m.is_dir():
                raise error(f"{where}: a .npz member that is not a .npy array")
            if m.file_size > BOMB_FLOOR and m.file_size > MAX_RATIO * max(1, m.compress_size):
                raise error(f"{where}: compressed {m.file_size // max(1, m.compress_size)}:1, a zip bomb; refusing")
            with zf.open(m) as fh:
                array = _read(fh, where, error, left, m.file_size, data)
            if array is None:
                continue
            left -= array.nbytes
            arrays[m.filename[:-4]] = array
    return arrays
