"""What a conversion returns (TensorFlow-free, so `edgekit.ConvertResult` imports without it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ConvertResult:
    """What one conversion wrote: the file, its size, the metadata stored in it, warnings to show (the user
    must act on them), notes (worth knowing, nothing to do: what a MediaPipe reader cannot take) and changes
    (what edgekit chose where the user did not say: the batch closed to 1, constants kept in float32)."""

    path: Path
    size_bytes: int
    metadata: dict[str, Any]
    seconds: float
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    missed: tuple[str, ...] = ()  # budgets the user gave that the file misses (the CLI exits 11 after writing)

    @property
    def verification(self) -> dict[str, Any] | None:
        """Float model vs .tflite on the calibration samples (None without calibration data)."""
        return self.metadata.get("verification")

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "size_bytes": self.size_bytes, "seconds": self.seconds,
                "warnings": list(self.warnings), "notes": list(self.notes),
                "changes": list(self.changes), "missed": list(self.missed), "metadata": self.metadata}
