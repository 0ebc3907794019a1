"""The one preprocessing code path: calibration, QAT data, evaluation and the runtime all call this.

Convention (the same as TFLite's image NormalizationOptions): read an image as RGB uint8, convert
to the model's channel count (1 = grayscale, 3 = RGB), resize to the model's input size with
`stretch`, `letterbox` (keep aspect, pad with black) or `crop` (keep aspect, centre crop), then
`(pixel - mean) / std` per channel. Defaults mean 0 and std 1 feed raw 0-255 pixels, which is
right for Keras models that rescale inside.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from edgekit.errors import InputShapeError, ModelFormatError, UsageError, one_line
from edgekit.files import read_regular
from edgekit.runtime.imagesize import check_pixels

RESIZE_MODES = ("stretch", "letterbox", "crop")


def _as_tuple(value: float | Sequence[float], name: str) -> tuple[float, ...]:
    values = (value,) if isinstance(value, (int, float)) else tuple(value)
    if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise UsageError(f"--{name} must be finite numbers, got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class PreprocessSpec:
    """How raw images become model input. Stored as JSON in the model's edgekit metadata."""

    height: int
    width: int
    channels: int
    resize: str = "stretch"
    mean: tuple[float, ...] = field(default=(0.0,))
    std: tuple[float, ...] = field(default=(1.0,))

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise InputShapeError(
                f"image models need 1 (grayscale) or 3 (RGB) input channels, this one has {self.channels}"
            )
        if self.height < 1 or self.width < 1:
            raise InputShapeError(f"image input size must be positive, got {self.height}x{self.width}")
        if self.resize not in RESIZE_MODES:
            raise UsageError(f"must be one of {', '.join(RESIZE_MODES)}, got {self.resize!r}", param="resize")
        mean = _as_tuple(self.mean, "mean")
        std = _as_tuple(self.std, "std")
        for name, values in (("mean", mean), ("std", std)):
            if len(values) not in (1, self.channels):
                allowed = "1 value" if self.channels == 1 else f"1 or {self.channels} values"
                raise UsageError(f"needs {allowed} for this {self.channels}-channel input, got {len(values)}",
                                 param=name)
        if any(s == 0 for s in std):
            raise UsageError("must not be 0", param="std")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    @property
    def color(self) -> str:
        return "GRAY" if self.channels == 1 else "RGB"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean"], d["std"], d["color"], d["layout"] = list(self.mean), list(self.std), self.color, "NHWC"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreprocessSpec:
        try:
            return cls(
                height=int(d["height"]),
                width=int(d["width"]),
                channels=int(d["channels"]),
                resize=str(d.get("resize", "stretch")),
                mean=tuple(d.get("mean", (0.0,))),
                std=tuple(d.get("std", (1.0,))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"preprocessing metadata is incomplete ({exc})") from None

    @classmethod
    def for_input_shape(
        cls, shape: Sequence[int | None], *, resize: str = "stretch", mean=(0.0,), std=(1.0,)
    ) -> PreprocessSpec:
        """Spec for an NHWC image input of `shape` (batch first)."""
        sizes = [s for s in shape[1:] if s is not None and s >= 1]
        if len(shape) != 4 or len(sizes) != 3:
            raise InputShapeError(
                f"expected an image input of shape (batch, height, width, channels), got {tuple(shape)}"
            )
        h, w, c = sizes
        return cls(height=int(h), width=int(w), channels=int(c), resize=resize, mean=mean, std=std)


# any channel count and bit depth, EXIF orientation applied (IMREAD_UNCHANGED would ignore it); alpha is
# dropped by OpenCV here, as the models take RGB or gray
_READ_FLAGS = 2 | 4  # cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR


MAX_IMAGE_FILE_BYTES = 512 * 1024**2


def decode_image(data: bytes, where: str = "image") -> np.ndarray:
    """Encoded bytes -> uint8 array, HxW (gray) or HxWx3 (RGB). Alpha is dropped, 16-bit scaled. An image
    whose header declares more pixels than the limit is refused before it is decoded (runtime.imagesize)."""
    import cv2

    declared = check_pixels(data, where)
    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), _READ_FLAGS) if data else None
    except cv2.error as exc:  # e.g. an image larger than OpenCV's own pixel limit
        raise InputShapeError(f"{where}: cannot decode ({one_line(exc)})") from None
    if arr is None:
        raise InputShapeError(f"{where}: not a readable image")
    if arr.shape[0] * arr.shape[1] > declared[0] * declared[1]:  # a header read wrongly: never trust it
        raise InputShapeError(f"{where}: decodes to {arr.shape[1]}x{arr.shape[0]}, more than its header's "
                              f"{declared[1]}x{declared[0]}")
    try:
        return to_rgb_or_gray(arr, order="BGR")
    except InputShapeError as exc:
        raise InputShapeError(f"{where}: {exc}") from None


def read_image(path: str | Path) -> np.ndarray:
    """Read an image file as RGB (or gray) uint8; a missing, corrupt or oversized file is a one-line error.
    The bytes are read here (a regular file within MAX_IMAGE_FILE_BYTES) and decoded from memory: OpenCV
    never sees the path (a name that is not UTF-8 crashed cv2.imread), nor a FIFO or a device."""
    where = os.fspath(path)
    try:
        data = read_regular(path, limit=MAX_IMAGE_FILE_BYTES, error=InputShapeError)
    except InputShapeError as exc:
        raise InputShapeError(f"{where}: cannot read image ({str(exc).removeprefix(where + ': ')})") from None
    return decode_image(data, where)


def to_rgb_or_gray(arr: np.ndarray, order: str = "RGB") -> np.ndarray:
    """Normalise a decoded frame: uint8, HxW or HxWx3 in RGB order. `order` is the input's order."""
    if arr.ndim == 2 and arr.dtype == np.uint8:
        return arr
    import cv2

    if arr.dtype == np.uint16:
        arr = (arr / 257.0).round().astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise InputShapeError(f"unsupported image dtype {arr.dtype}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        return arr
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise InputShapeError(f"unsupported image shape {arr.shape}")
    if arr.shape[2] == 4:
        code = cv2.COLOR_BGRA2RGB if order == "BGR" else cv2.COLOR_RGBA2RGB
        return cv2.cvtColor(arr, code)
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB) if order == "BGR" else arr


def crop_box(h: int, w: int, height: int, width: int) -> tuple[int, int, int, int]:
    """The centred (y0, y1, x0, x1) region of an h x w image with the aspect of height x width."""
    if h * width > w * height:  # source is taller than the target aspect: cut rows
        keep = max(1, min(h, round(w * height / width)))
        y0 = (h - keep) // 2
        return y0, y0 + keep, 0, w
    keep = max(1, min(w, round(h * width / height)))
    x0 = (w - keep) // 2
    return 0, h, x0, x0 + keep


class Placement(NamedTuple):
    """Where a resize takes its pixels and puts them: the source rows and columns kept (crop), the output
    region they fill (letterbox leaves black around it) and OpenCV's interpolation."""

    src: tuple[int, int, int, int]  # y0, y1, x0, x1 of the source
    dst: tuple[int, int, int, int]  # y0, y1, x0, x1 of the output
    interpolation: int


def placement(h: int, w: int, height: int, width: int, mode: str) -> Placement:
    """The resize `mode` of an h x w image to height x width: area averaging when it shrinks, else linear."""
    import cv2

    src, dst = (0, h, 0, w), (0, height, 0, width)
    if mode == "letterbox":
        s = min(height / h, width / w)
        sh, sw = max(1, round(h * s)), max(1, round(w * s))
        top, left = (height - sh) // 2, (width - sw) // 2
        dst = (top, top + sh, left, left + sw)
    elif mode == "crop":  # cut the source to the target's aspect first, then scale only what is kept
        src = crop_box(h, w, height, width)  # (scaling the whole image first can need gigabytes)
    area_in = (src[1] - src[0]) * (src[3] - src[2])
    area_out = (dst[1] - dst[0]) * (dst[3] - dst[2])
    return Placement(src, dst, cv2.INTER_AREA if area_out < area_in else cv2.INTER_LINEAR)


def _resize(img: np.ndarray, height: int, width: int, mode: str) -> np.ndarray:
    import cv2

    h, w = img.shape[:2]
    if (h, w) == (height, width):
        return img
    (y0, y1, x0, x1), (t, b, left, right), interpolation = placement(h, w, height, width, mode)
    scaled = cv2.resize(img[y0:y1, x0:x1], (right - left, b - t), interpolation=interpolation)
    if (b - t, right - left) == (height, width):
        return scaled
    out = np.zeros((height, width) + img.shape[2:], img.dtype)
    out[t:b, left:right] = scaled
    return out


def geometry(image: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """Channel conversion and resize, still uint8: HxW for 1 channel, HxWx3 for 3."""
    import cv2

    img = image
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    elif img.ndim == 3 and img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_RGBA2RGB)
    if img.dtype != np.uint8:
        raise InputShapeError(f"images must be uint8 (see to_rgb_or_gray), got {img.dtype}")
    if img.ndim == 2 and spec.channels == 3:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    elif img.ndim == 3 and spec.channels == 1:
        img = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    return _resize(img, spec.height, spec.width, spec.resize)


@functools.lru_cache(maxsize=64)
def normalize_table(spec: PreprocessSpec) -> np.ndarray:
    """`(pixel - mean) / std` for every uint8 pixel value: float32, shape (1, 256, channels).
    Normalising through this table is exact (the same float32 arithmetic) and one lookup."""
    values = np.arange(256, dtype=np.float32)[:, None]
    table = (values - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    table = np.broadcast_to(table, (256, spec.channels))
    return np.ascontiguousarray(table.reshape(1, 256, spec.channels), dtype=np.float32)


def _lookup(img: np.ndarray, table: np.ndarray) -> np.ndarray:
    import cv2

    lut = table[..., :1] if img.ndim == 2 else table
    out = cv2.LUT(img, np.ascontiguousarray(lut))
    return out[:, :, None] if out.ndim == 2 else out


def prepare(image: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """One decoded image (HxW or HxWx3 RGB uint8) -> float32 HxWxC model input."""
    return _lookup(geometry(image, spec), normalize_table(spec))


class InputEncoder:
    """Image -> the model's typed input batch of one, with normalisation and quantization fused into
    one lookup table built from `normalize_table` and `quantize`: the same numbers as
    `quantize(prepare(image, spec), tensor)`, for a fraction of the per-frame cost."""

    def __init__(self, spec: PreprocessSpec, tensor):
        from edgekit.runtime.quant import quantize

        self.spec = spec
        self.table = np.ascontiguousarray(quantize(normalize_table(spec), tensor))
        self._lut = self.table[..., :1] if spec.channels == 1 else self.table
        identity = np.arange(256, dtype=self.table.dtype)[None, :, None]
        # raw pixels into a float32 input: a cast is the whole transform
        self._cast = self.table.dtype == np.float32 and bool(np.all(self.table == identity))
        self._dtype = self.table.dtype
        self._shape = (spec.height, spec.width) if spec.channels == 1 else (spec.height, spec.width, 3)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        img = image if image.shape == self._shape and image.dtype == np.uint8 else geometry(image, self.spec)
        out: np.ndarray
        if self._cast:
            out = img.astype(np.float32)
        else:
            import cv2

            out = cv2.LUT(img, self._lut)
        return out.reshape((1,) + self._shape[:2] + (self.spec.channels,))


def load_and_prepare(path: str | Path, spec: PreprocessSpec) -> np.ndarray:
    return prepare(read_image(path), spec)


def load_batch(paths, spec: PreprocessSpec) -> np.ndarray:
    """Several image files -> one float32 (N, H, W, C) batch through `prepare`."""
    return np.stack([load_and_prepare(p, spec) for p in paths]).astype(np.float32, copy=False)
