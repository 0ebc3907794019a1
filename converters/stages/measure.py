"""Measure: what training achieved, on the exported file (sparsity per kernel, gzip sizes, accuracy on the
held-out data against the original model), and, with a budget in a mode the int8 autopilot does not serve,
the file checked against the original model on `budget.eval_data`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.converters.compression import compression_report
from edgekit.converters.finetune import LabelledData
from edgekit.converters.loading import SourceModel
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.stages import Say
from edgekit.converters.stages.quantize import Quantized
from edgekit.converters.stages.train import Trained
from edgekit.intervals import compare, judge_budget
from edgekit.runtime.model import Model

READS = frozenset({"pruning", "training", "prune", "qat", "train_data", "mode", "budget", "max_drop"})
KEYS = ("compression",)


@dataclass(frozen=True)
class Measured:
    compression: dict[str, Any]
    dependence: tuple[str, ...] = ()  # the held-out data is not independent of other data (stages/train.py)

    @property
    def warnings(self) -> list[str]:
        """The drop over `training.warn_drop` with its cause and fix, and held-out data that is not independent."""
        drop = self.compression.get("drop") or {}
        return [*self.dependence, *([drop["warning"]] if drop.get("warning") else [])]

    @property
    def missed(self) -> tuple[str, ...]:
        """The budget the user gave, missed on its interval (exit 11 after the file is written)."""
        check = self.compression.get("budget_check") or {}
        verdict = check.get("verdict") or {}
        if verdict.get("status") != "missed":
            return ()
        return (f"the file misses `budget.max_drop` against the original model on {check['eval_data']}: "
                f"{verdict['message']}",)

    def metadata(self) -> dict[str, Any]:
        return {"compression": self.compression}


def measure(recipe: ConvertRecipe, trained: Trained, quantized: Quantized, tflite: bytes, say: Say) -> Measured:
    """`tflite`: the file written (after the budget, where one ran); the float and pruned files it is compared
    with are converted at the sizes it was (`quantized.shapes`: an open size that only converts at the
    calibration samples' size)."""
    say("measuring the exported model (sparsity, gzip sizes, accuracy)")
    compression = compression_report(recipe, trained.original, trained.tuned, tflite, trained.val,
                                     quantized.seconds, quantized.shapes, trained.sample_sizes, trained.val_from)
    if recipe.max_drop is not None and recipe.mode != "int8" and trained.eval is not None:
        say(f"checking the file against the original model on {trained.eval.source} (`budget.max_drop`)")
        compression["budget_check"] = budget_check(trained.original, tflite, trained.eval, recipe.max_drop)
    return Measured(compression, tuple(trained.warnings))


def budget_check(original: SourceModel, tflite: bytes, data: LabelledData, max_drop: float) -> dict[str, Any]:
    """The file against the original model on `data` (one classifier output), judged on the interval of its
    loss (edgekit.intervals.judge_budget): the `compression.budget_check` entry."""
    assert data.y is not None  # labelled data without targets has class labels
    reference = np.argmax(np.asarray(original.predict(data.x)), axis=-1)
    outputs = Model(tflite, delegate="cpu", probe=False).predict(data.x)
    assert isinstance(outputs, np.ndarray)  # one output: stages/load.py refuses `budget` on others
    candidate = np.argmax(outputs, axis=-1)
    comparison = compare(reference_correct=reference == data.y, candidate_correct=candidate == data.y,
                         agree=candidate == reference)
    verdict = judge_budget(comparison, max_drop)
    return {"eval_data": data.source, "max_drop": max_drop, "comparison": comparison.to_dict(),
            "verdict": verdict.to_dict()}
