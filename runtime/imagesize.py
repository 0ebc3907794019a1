"""An encoded image's size from its header, before anything decodes it.

OpenCV decodes whatever a header declares (its own cap is 2^30 pixels: a 30000x30000 PNG of a few KB takes
5 GiB), and it has no header-only reader. The formats edgekit reads from folders (PNG, JPEG, GIF, BMP,
WebP, TIFF, PNM) state their size in a fixed place; `image_size` finds it there, and `check_pixels` refuses
an image larger than MAX_PIXELS (EDGEKIT_MAX_IMAGE_PIXELS) before it is decoded.
"""

from __future__ import annotations

import os
import re
import struct

from edgekit.errors import InputShapeError

DEFAULT_MAX_PIXELS = 100_000_000  # 100 MP: decoded RGB 300 MB; a 12 MP phone photo is 12


def max_pixels() -> int:
    """The pixel limit: EDGEKIT_MAX_IMAGE_PIXELS when set to a positive whole number, else 100 MP."""
    value = os.environ.get("EDGEKIT_MAX_IMAGE_PIXELS", "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_PIXELS


def _png(d: bytes):
    if d[:8] == b"\x89PNG\r\n\x1a\n" and d[12:16] == b"IHDR":
        w, h = struct.unpack(">II", d[16:24])
        return h, w
    return None


def _gif(d: bytes):
    if d[:6] in (b"GIF87a", b"GIF89a"):
        w, h = struct.unpack("<HH", d[6:10])
        return h, w
    return None


def _bmp(d: bytes):
    if d[:2] == b"BM" and len(d) >= 26:
        size = struct.unpack("<I", d[14:18])[0]
        if size == 12:
            w, h = struct.unpack("<HH", d[18:22])
        else:
            w, h = struct.unpack("<ii", d[18:26])
        return abs(h), abs(w)
    return None


def _webp(d: bytes):
    if d[:4] != b"RIFF" or d[8:12] != b"WEBP":
        return None
    kind = d[12:16]
    if kind == b"VP8X" and len(d) >= 30:
        return 1 + int.from_bytes(d[27:30], "little"), 1 + int.from_bytes(d[24:27], "little")
    if kind == b"VP8L" and len(d) >= 25:
        bits = int.from_bytes(d[21:25], "little")
        return 1 + ((bits >> 14) & 0x3FFF), 1 + (bits & 0x3FFF)
    if kind == b"VP8 " and len(d) >= 30:
        w, h = struct.unpack("<HH", d[26:30])
        return h & 0x3FFF, w & 0x3FFF
    return None


def _jpeg(d: bytes):
    if d[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 < len(d):
        if d[i] != 0xFF:
            i += 1
            continue
        marker = d[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        length = struct.unpack(">H", d[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            h, w = struct.unpack(">HH", d[i + 5:i + 9])
            return h, w
        i += 2 + length
    return None


def _tiff(d: bytes):
    order = {b"II": "<", b"MM": ">"}.get(d[:2])
    if order is None or struct.unpack(order + "H", d[2:4])[0] != 42:
        return None
    ifd = struct.unpack(order + "I", d[4:8])[0]
    if ifd + 2 > len(d):
        return None
    size = {}
    for k in range(struct.unpack(order + "H", d[ifd:ifd + 2])[0]):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(d):
            break
        tag, kind = struct.unpack(order + "HH", d[entry:entry + 4])
        if tag in (256, 257):
            fmt = "H" if kind == 3 else "I"
            size[tag] = struct.unpack(order + fmt, d[entry + 8:entry + 8 + struct.calcsize(fmt)])[0]
    return (size[257], size[256]) if len(size) == 2 else None


_PNM = re.compile(rb"^P[1-7]\s+(?:#[^\n]*\s+)*(\d+)\s+(?:#[^\n]*\s+)*(\d+)")


def _pnm(d: bytes):
    m = _PNM.match(d[:1024])
    return (int(m.group(2)), int(m.group(1))) if m else None


def image_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from the header of a PNG, JPEG, GIF, BMP, WebP, TIFF or PNM; None when the format is
    not one of these or the header is cut short (the decoder then says what it can)."""
    for reader in (_png, _jpeg, _gif, _bmp, _webp, _tiff, _pnm):
        try:
            size = reader(data)
        except (struct.error, IndexError, ValueError):
            size = None
        if size is not None:
            return size
    return None


def check_pixels(data: bytes, where: str) -> None:
    """InputShapeError when the header declares more pixels than the limit."""
    size = image_size(data)
    if size is not None and size[0] * size[1] > max_pixels():
        raise InputShapeError(f"{where}: {size[1]}x{size[0]} is more than {max_pixels():,} pixels "
                              "(EDGEKIT_MAX_IMAGE_PIXELS raises the limit)")
