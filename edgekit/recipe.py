"""The convert recipe: what the user asked for, validated once, frozen, serialisable."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.runtime.delegates import TARGETS
from edgekit.runtime.preprocess import RESIZE_MODES

MODES = ("float32", "float16", "dynamic", "int8", "int16x8")
IO_TYPES = {
    "float32": ("float32",),
    "float16": ("float32",),
    "dynamic": ("float32",),
    "int8": ("float32", "int8", "uint8"),
    "int16x8": ("float32", "int16"),
}
NEEDS_CALIBRATION = frozenset({"int8", "int16x8"})


@dataclass(frozen=True)
class ConvertRecipe:
    """One conversion. Bad combinations are rejected here, before TensorFlow is imported."""

    model: Path
    mode: str = "float32"
    io: str = "float32"
    calib: Path | None = None
    calib_samples: int = 200
    seed: int = 0
    resize: str = "stretch"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    output: Path | None = None
    force: bool = False
    target: str | None = None  # cpu, gpu, nnapi or npu: delegate hints stored in the model
    trust_model: bool = False  # allow objects from modules outside Keras in the model config
    strict: bool = False  # an unreadable calibration image is an error instead of skipped and reported

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        if self.calib is not None:
            object.__setattr__(self, "calib", Path(self.calib))
        if self.output is not None:
            object.__setattr__(self, "output", Path(self.output))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.io not in IO_TYPES[self.mode]:
            raise UsageError(
                f"--io {self.io} is not available with {self.mode}; choose {', '.join(IO_TYPES[self.mode])}"
            )
        if self.mode in NEEDS_CALIBRATION and self.calib is None:
            raise UsageError(f"{self.mode} needs calibration data: pass --calib DIR|FILE.npy|FILE.npz")
        if self.calib_samples < 1:
            raise UsageError(f"--calib-samples must be at least 1, got {self.calib_samples}")
        if self.resize not in RESIZE_MODES:
            raise UsageError(f"--resize must be one of {', '.join(RESIZE_MODES)}, got {self.resize!r}")
        if any(s == 0 for s in self.std):
            raise UsageError("--std must not be 0")
        if self.target is not None and self.target not in TARGETS:
            raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")

    @property
    def output_path(self) -> Path:
        """`-o`, or `<model>.<mode>.tflite` beside the input."""
        if self.output is not None:
            return self.output
        base = self.model.name.rstrip("/")
        stem = base.rsplit(".", 1)[0] if self.model.suffix in (".keras", ".h5", ".hdf5") else base
        return self.model.parent / f"{stem}.{self.mode}.tflite"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("model", "calib", "output"):
            d[key] = None if d[key] is None else str(d[key])
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ConvertRecipe":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown recipe keys: {', '.join(unknown)}")
        return cls(**d)
