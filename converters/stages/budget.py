"""Budget: the accuracy-budget autopilot. int8 is measured on the evaluation data and the most sensitive
layers are kept in float (or at int16 activations) until the drop fits `budget.max_drop`; then the int8 file
it found, plain int8, and the float16 and dynamic-range files of the same model are compared against the
float model the user gave (paired, with 95 % intervals), the budget judged on the interval, and a file that
another one dominates is never handed back (converters/dominance.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.dominance import INT8_ONLY, Candidate, Choice, choose, interleaved_p50, judged
from edgekit.converters.loading import SourceModel
from edgekit.converters.quantize import configure, run_converter
from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.stages import Say
from edgekit.converters.stages.calibrate import Calibrated
from edgekit.converters.stages.load import Loaded, labelled
from edgekit.converters.stages.quantize import Quantized, _zeros_stay
from edgekit.errors import ConversionError, one_line
from edgekit.runtime.model import Model

if TYPE_CHECKING:
    from edgekit.converters.autopilot import AutopilotResult
    from edgekit.converters.finetune import LabelledData

READS = frozenset({"budget", "max_drop", "seed", "strict", "mode", "io", "target", "prune", "pruning",
                   "output_path", "output"})
KEYS = ("autopilot",)
OTHER_MODES = ("float16", "dynamic")  # the files of the same model compared with the int8 one


def file_paths(output: Path, given: bool, mode: str) -> tuple[Path, Path | None]:
    """Where the budget stage's files go: (the handed-back file's path, the int8 file's where another mode
    won, else None; `mode` is the handed-back file's, and `output` the int8 conversion's). With `output` given,
    the winner goes there and the int8 file beside it as `<output stem>.int8.tflite`; without, the default
    `<model>.int8.tflite` stays the int8 file's name and the winner is `<model>.<mode>.tflite`."""
    if mode == "int8":
        return output, None
    if given:
        return output, output.with_name(f"{output.stem}.int8.tflite")
    return output.with_name(output.name.removesuffix(".int8.tflite") + f".{mode}.tflite"), output


@dataclass(frozen=True)
class Budgeted:
    """The file handed back (the choice's), what the autopilot measured, and the candidates compared."""

    tflite: bytes
    result: AutopilotResult
    max_drop: float
    int16: bool = False  # `budget.int16`: int16 activations were tried before float
    choice: Choice | None = None
    plain_comparison: dict[str, Any] | None = None  # plain int8 against the float model
    int8_file: str | None = None  # the name of the int8 file written beside, where another mode won

    @property
    def mode(self) -> str:
        """The mode of the file handed back: int8, or float16/dynamic where the int8 file was dominated."""
        return "int8" if self.choice is None else self.choice.chosen.mode

    @property
    def beside(self) -> bytes | None:
        """The int8 file the search found, to write beside the output where another mode was handed back."""
        if self.choice is None or self.choice.chosen.mode == "int8":
            return None
        return self.choice.candidates[0].tflite

    @property
    def missed(self) -> tuple[str, ...]:
        """The budget missed on the interval and on the point estimate (exit 11; the file is written)."""
        verdict = None if self.choice is None else self.choice.chosen.budget
        if verdict is None or not verdict.missed:
            return ()
        return (f"the file misses `budget.max_drop` {self.max_drop:g}: {verdict.message}",)

    @property
    def warnings(self) -> list[str]:
        budget, chosen = self.result, None if self.choice is None else self.choice.chosen
        if (budget.met if chosen is None else chosen.fits) or self.missed:
            return []
        every = "" if budget.every_op_float_drop is None else (
            f"; not even every op in float does ({budget.every_op_float_drop:.2f} points: the float model's own "
            "difference from Keras on this data)")
        kinds = "int8, int16x8 and float" if self.int16 else "int8 and float"
        said = "" if chosen is None or chosen.budget is None else f"; {chosen.budget.message}"
        return [f"no mix of {kinds} layers met `budget.max_drop` {self.max_drop:g}: kept the best found "
                f"({budget.drop:.2f} points, {len(budget.float_ops)} op(s) in float){every}{said}"]

    def metadata(self) -> dict[str, Any]:
        section = self.result.to_dict()
        if self.choice is not None:
            section.update(self.choice.to_dict(), plain_int8_comparison=self.plain_comparison,
                           int8_file=self.int8_file)
        return {"autopilot": section}


class _Scores:
    """Top-1 classes of a .tflite on the evaluation data, kept per file: the autopilot's search asks for
    (top-1, agreement with the float model); the comparisons afterwards reuse the classes."""

    def __init__(self, x: Any, labels: np.ndarray, float_classes: np.ndarray):
        self.x, self.labels, self.float_classes = x, labels, float_classes
        self._seen: dict[bytes, np.ndarray] = {}

    def classes(self, tflite: bytes) -> np.ndarray:
        key = hashlib.sha256(tflite).digest()
        if key not in self._seen:
            outputs = Model(tflite, delegate="cpu", probe=False).predict(self.x)
            assert isinstance(outputs, np.ndarray)  # one output: stages/load.py refuses `budget` on others
            self._seen[key] = np.argmax(outputs, axis=-1)
        return self._seen[key]

    def __call__(self, tflite: bytes) -> tuple[float, float]:
        classes = self.classes(tflite)
        return float(np.mean(classes == self.labels)), float(np.mean(classes == self.float_classes))


def within_budget(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, calibrated: Calibrated,
                  quantized: Quantized, say: Say, evaluated: LabelledData | None = None) -> Budgeted:
    """The mixes are made from `quantized.basis`, the calibrated model the plain int8 file was quantized from
    (its chosen ranges, its corrected biases or equalised weights), where given, and ranked on it (else on the
    converter's model), at `quantized.shapes`, the input sizes the plain file was converted at. The budget's
    reference is `loaded.source`, the model the user gave: a pruning loss counts against it."""
    from edgekit.converters.autopilot import autopilot

    calib, budget, max_drop = calibrated.calib, recipe.budget, recipe.max_drop
    # the pipeline runs this stage with a budget (BudgetSpec requires its max_drop), on int8: calibrated
    assert budget is not None and max_drop is not None and calib is not None
    data = evaluated or labelled(budget.eval_data, loaded, "budget.eval_data", seed=recipe.seed,
                                 strict=recipe.strict)  # `evaluated`: read by the train stage already
    labels = data.y
    assert labels is not None  # labelled data without `targets` has class labels
    float_classes = np.argmax(loaded.source.predict(data.x), axis=-1)
    scores = _Scores(data.x, labels, float_classes)
    say(f"checking the accuracy budget of {max_drop:g} points on {data.source}")
    converter = configure(source.tflite_converter(quantized.shapes), recipe.mode, recipe.io,
                          calib.representative_dataset)
    result = autopilot(converter, calib.representative_dataset, quantized.tflite, scores,
                       float(np.mean(float_classes == labels)), max_drop, eval_samples=len(labels),
                       int16=budget.int16, progress=say, calibrated=quantized.basis,
                       float_kernels=quantized.float_kernels, keep_float=quantized.float_head)
    result.eval_data = data.source
    candidates = _candidates(recipe, source, quantized, result.tflite, scores, say)
    judged(candidates, labels, float_classes, max_drop)
    for candidate, p50 in zip(candidates, interleaved_p50([c.tflite for c in candidates])):
        candidate.p50_ms = p50
    choice = choose(candidates, labels)
    say(f"handing back {choice.chosen.name}: {choice.reason}")
    plain = candidates[1] if result.tflite != quantized.tflite else candidates[0]  # see _candidates
    assert plain.comparison is not None
    int8_path = file_paths(recipe.output_path, recipe.output is not None, choice.chosen.mode)[1]
    int8_file = None if int8_path is None else int8_path.name
    return Budgeted(choice.chosen.tflite, result, max_drop, budget.int16, choice, plain.comparison.to_dict(),
                    int8_file)


def _candidates(recipe: ConvertRecipe, source: SourceModel, quantized: Quantized, found: bytes, scores: _Scores,
                say: Say) -> list[Candidate]:
    """The search's int8 file first, plain int8 where it differs, then the float16 and dynamic-range files of
    the same model (those the target or the `io` asked for cannot take marked `refused`)."""
    candidates = [Candidate("int8", "int8", found, scores.classes(found))]
    if found != quantized.tflite:
        candidates.append(Candidate("plain int8", "int8", quantized.tflite, scores.classes(quantized.tflite)))
    for mode, tflite in _other_modes(recipe, source, quantized.shapes, say).items():
        candidates.append(Candidate(mode, mode, tflite, scores.classes(tflite), refused=_refused(recipe, mode)))
    return candidates


def _other_modes(recipe: ConvertRecipe, source: SourceModel, shapes: dict, say: Say) -> dict[str, bytes]:
    """The float16 and dynamic-range files of the model the int8 one was made from, as `convert` makes them
    (float16 keeps in float32 the constants it cannot hold); a mode that does not convert is left out."""
    from edgekit.converters.fp16_weights import keep_float32_constants

    def made(mode: str) -> bytes:
        return run_converter(configure(source.tflite_converter(shapes), mode, "float32", None,
                                       sparse=_zeros_stay(recipe)))

    files = {}
    for mode in OTHER_MODES:
        try:
            tflite = made(mode)
            files[mode] = keep_float32_constants(tflite, lambda: made("float32"))[0] if mode == "float16" else tflite
        except ConversionError as exc:
            say(f"no {mode} file to compare with: {one_line(exc)}")
    return files


def _refused(recipe: ConvertRecipe, mode: str) -> str | None:
    """Why a float16 or dynamic-range file may not be handed back for this recipe, or None."""
    if recipe.target in INT8_ONLY:
        return f"`target` {recipe.target} runs full-integer int8 files only"
    if recipe.io != "float32":
        return f"its input and output are float32, not the `io` {recipe.io} asked for"
    return None

