"""Measure: what training achieved, on the exported file (sparsity per kernel, gzip sizes, accuracy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.converters.compression import compression_report
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.stages import Say
from edgekit.converters.stages.quantize import Quantized
from edgekit.converters.stages.train import Trained

READS = frozenset({"pruning", "training", "prune", "qat", "train_data"})  # what compression_report reads
KEYS = ("compression",)


@dataclass(frozen=True)
class Measured:
    compression: dict[str, Any]

    def metadata(self) -> dict[str, Any]:
        return {"compression": self.compression}


def measure(recipe: ConvertRecipe, trained: Trained, quantized: Quantized, tflite: bytes, say: Say) -> Measured:
    """`tflite`: the file written (after the budget, where one ran); the float and pruned files it is compared
    with are converted at the sizes it was (`quantized.shapes`: an open size that only converts at the
    calibration samples' size)."""
    say("measuring the exported model (sparsity, gzip sizes, accuracy)")
    return Measured(compression_report(recipe, trained.original, trained.tuned, tflite, trained.val,
                                       quantized.seconds, quantized.shapes, trained.sample_sizes))
