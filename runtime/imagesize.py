"""An encoded image's size from its header, before anything decodes it.

OpenCV decodes whatever a header declares (its own cap is 2^30 pixels: a 30000x30000 PNG of a few KB takes
5 GiB), and it has no header-only reader. The formats edgekit reads from folders (PNG, JPEG, GIF, BMP,
WebP, TIFF, PNM) state their size in a fixed place; `image_size` finds it there, and `check_pixels` refuses
an image larger than the limit (EDGEKIT_MAX_IMAGE_PIXELS) before it is decoded, and any other format (its
size cannot be known before OpenCV allocates it).
"""

from __future__ import annotations

import os
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
    """The first start-of-frame, found the way libjpeg finds markers: bytes up to an FF are skipped, FF fill
    bytes and FF 00 (a stuffed zero) are no marker, SOI/EOI/RSTn/TEM have no length, every other marker's
    segment is skipped by its length (decode_image still refuses a decode larger than this said)."""
    if d[:2] != b"\xff\xd8":
        return None
    i = 2
    while (i := d.find(b"\xff", i)) >= 0 and i + 3 < len(d):
        marker = d[i + 1]
        if marker in (0xFF, 0x00, 0x01, 0xD8) or 0xD0 <= marker <= 0xD7:
            i += 1 if marker == 0xFF else 2
            continue
        if marker == 0xD9:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            h, w = struct.unpack(">HH", d[i + 5:i + 9])
            return h, w
        i += 2 + struct.unpack(">H", d[i + 2:i + 4])[0]
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


def _pnm(d: bytes):
    """P1-P6: magic, then width and height as decimal tokens; white space and #-comments between them."""
    if len(d) < 3 or d[:1] != b"P" or d[1:2] not in b"123456" or not d[2:3].isspace():
        return None
    numbers: list[int] = []
    i, end = 2, min(len(d), 1 << 16)
    while len(numbers) < 2 and i < end:
        c = d[i:i + 1]
        if c.isspace():
            i += 1
        elif c == b"#":
            i = d.find(b"\n", i, end)
            if i < 0:
                return None
        elif c.isdigit():
            j = i
            while j < end and d[j:j + 1].isdigit():
                j += 1
            numbers.append(int(d[i:j][:12]))
            i = j
        else:
            return None
    return (numbers[1], numbers[0]) if len(numbers) == 2 else None


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


def check_pixels(data: bytes, where: str) -> tuple[int, int]:
    """InputShapeError when the header declares more pixels than the limit, or when it is not the header of a
    format whose size can be read before decoding (JPEG 2000, AVIF, EXR, HDR ... would be decoded blind)."""
    size = image_size(data)
    if size is None:
        raise InputShapeError(f"{where}: not a readable image (edgekit reads PNG, JPEG, GIF, BMP, WebP, TIFF "
                              "and PNM)")
    if size[0] * size[1] > max_pixels():
        raise InputShapeError(f"{where}: {size[1]}x{size[0]} is more than {max_pixels():,} pixels "
                              "(EDGEKIT_MAX_IMAGE_PIXELS raises the limit)")
    return size
