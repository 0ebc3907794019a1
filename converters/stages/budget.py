"""Budget: the accuracy-budget autopilot. int8 is measured on the evaluation data and the most sensitive
layers are kept in float (or at int16 activations) until the drop fits `budget.max_drop`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.loading import SourceModel
from edgekit.converters.quantize import configure
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.stages import Say
from edgekit.converters.stages.calibrate import Calibrated
from edgekit.converters.stages.load import Loaded, labelled
from edgekit.converters.stages.quantize import Quantized
from edgekit.runtime.model import Model

if TYPE_CHECKING:
    from edgekit.converters.autopilot import AutopilotResult

READS = frozenset({"budget", "max_drop", "seed", "strict", "mode", "io"})
KEYS = ("autopilot",)


@dataclass(frozen=True)
class Budgeted:
    """The file the autopilot kept and what it measured (converters/autopilot.py's result)."""

    tflite: bytes
    result: AutopilotResult
    max_drop: float
    int16: bool = False  # `budget.int16`: int16 activations were tried before float

    @property
    def warnings(self) -> list[str]:
        budget = self.result
        if budget.met:
            return []
        every = "" if budget.every_op_float_drop is None else (
            f"; not even every op in float does ({budget.every_op_float_drop:.2f} points: the float model's own "
            "difference from Keras on this data)")
        kinds = "int8, int16x8 and float" if self.int16 else "int8 and float"
        return [f"no mix of {kinds} layers met `budget.max_drop` {self.max_drop:g}: kept the best found "
                f"({budget.drop:.2f} points, {len(budget.float_ops)} op(s) in float){every}"]

    def metadata(self) -> dict[str, Any]:
        return {"autopilot": self.result.to_dict()}


def within_budget(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calibrated: Calibrated,
                  quantized: Quantized, say: Say) -> Budgeted:
    """The mixes are made from `quantized.basis`, the calibrated model the plain int8 file was quantized from
    (its chosen ranges, its corrected biases or equalised weights), where given; the sensitivity ranking is the
    converter's model's, at `quantized.shapes`, the input sizes the plain file was converted at."""
    from edgekit.converters.autopilot import autopilot

    calib, budget, max_drop = calibrated.calib, recipe.budget, recipe.max_drop
    # the pipeline runs this stage with a budget (BudgetSpec requires its max_drop), on int8: calibrated
    assert budget is not None and max_drop is not None and calib is not None
    data = labelled(budget.eval_data, loaded, "budget.eval_data", seed=recipe.seed, strict=recipe.strict)
    labels = data.y
    assert labels is not None  # labelled data without `targets` has class labels
    float_classes = np.argmax(source.predict(data.x), axis=-1)
    float_top1 = float(np.mean(float_classes == labels))
    say(f"checking the accuracy budget of {max_drop:g} points on {data.source}")

    def evaluate(tflite: bytes) -> tuple[float, float]:
        outputs = Model(tflite, delegate="cpu", probe=False).predict(data.x)
        assert isinstance(outputs, np.ndarray)  # one output: stages/load.py refuses `budget` on others
        classes = np.argmax(outputs, axis=-1)
        return float(np.mean(classes == labels)), float(np.mean(classes == float_classes))

    converter = configure(source.tflite_converter(quantized.shapes), recipe.mode, recipe.io,
                          calib.representative_dataset)
    result = autopilot(converter, calib.representative_dataset, quantized.tflite, evaluate, float_top1,
                       max_drop, eval_samples=len(labels), int16=budget.int16, progress=say,
                       calibrated=quantized.basis)
    result.eval_data = data.source
    return Budgeted(result.tflite, result, max_drop, budget.int16)
