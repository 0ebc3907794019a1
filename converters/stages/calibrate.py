"""Calibrate: the calibration samples (from `calib`, or the training data for int8 without training), the
held-out ones verification runs on, and more of them for `auto` to rank range methods on."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.converters.calibration import CalibrationSet, held_out_count, load_for_inputs, load_held_out
from edgekit.converters.int8.evidence import MoreHeldOut
from edgekit.converters.labels import check_folders
from edgekit.converters.loading import SourceModel
from edgekit.converters.recipe import NEEDS_CALIBRATION, ConvertRecipe
from edgekit.converters.shapes import check_open_image_sources
from edgekit.converters.stages import Say
from edgekit.converters.stages.load import Loaded
from edgekit.errors import CalibrationError

if TYPE_CHECKING:
    from edgekit.converters.finetune import LabelledData

READS = frozenset({"calib", "train_data", "mode", "calibration", "seed", "strict", "trains", "qat"})
KEYS = ("labels", "calibration")
VERIFY_SAMPLES = 200  # held-out samples verification runs on, when the calibration source has them
MIN_HELD_OUT = 20     # fewer: verification runs on the calibration samples (and says so)


@dataclass(frozen=True)
class Calibrated:
    """The calibration samples (None without calibration data), where they came from, and the class names
    the file stores (those given, else the data's own where they count the model's classes)."""

    calib: CalibrationSet | None
    source: Any = None
    held_out: CalibrationSet | None = None  # samples of the same source not drawn for calibration
    ranking: CalibrationSet | None = None  # more of them, past the held-out ones: auto ranks on these too
    labels: tuple[str, ...] = ()
    used_for: str = "quantization"  # or "verification", after QAT (which learns its ranges)
    requested: int = 0  # `calibration.samples`
    seed: int = 0
    more: MoreHeldOut | None = None  # still more, read in rounds where auto's comparisons need them

    @property
    def verification_set(self) -> tuple[CalibrationSet | None, str]:
        """What verification runs on: held-out samples when there are enough, else the calibration ones."""
        if self.held_out is not None and len(self.held_out) >= MIN_HELD_OUT:
            return self.held_out, "held-out"
        return self.calib, "calibration"

    @property
    def warnings(self) -> list[str]:
        if self.calib is None:
            return []
        skipped = [f"skipped {len(self.calib.skipped)} unreadable calibration image(s) (`strict` makes this an "
                   f"error); first: {self.calib.skipped[0][1]}"] if self.calib.skipped else []
        return [*self.calib.notes, *skipped]

    def metadata(self) -> dict[str, Any]:
        calib, labels = self.calib, list(self.labels)
        if calib is None:
            return {"calibration": None, "labels": labels}
        return {"labels": labels, "calibration": {
            "source": str(self.source), "used_for": self.used_for,
            "samples": len(calib), "requested": self.requested,
            "seed": self.seed, "skipped": len(calib.skipped),
            "skipped_files": [{"file": f, "reason": r} for f, r in calib.skipped[:20]],
        }}  # quantize adds `range_setting` (its KEYS: calibration.range_setting)


def calibrate(recipe: ConvertRecipe, source: SourceModel, loaded: Loaded, say: Say,
              held_out: LabelledData | None = None) -> Calibrated:
    """`source`: the model to convert (the trained one, after training); `loaded.labels`: the class names
    given, which stand for the data's own (checked to agree); `held_out`: the samples the training stages
    are measured on, left out of calibration drawn from the training data (the final file is measured there:
    its ranges must not have seen them)."""
    calib_source = recipe.calib or (recipe.train_data if recipe.mode in NEEDS_CALIBRATION else None)
    if calib_source is None:
        return Calibrated(None, labels=loaded.labels)
    sources = calib_source if isinstance(calib_source, dict) else {None: calib_source}
    check_open_image_sources(loaded.inputs, sources)
    say(f"reading calibration data from {calib_source}")
    spec = recipe.calibration
    leave_out = held_out if recipe.calib is None else None  # drawn from the training data: not the held-out
    calib = load_for_inputs(sources, loaded.inputs, loaded.specs,
                            samples=spec.samples + (0 if leave_out is None else len(leave_out.x)),
                            seed=recipe.seed, strict=recipe.strict)
    if leave_out is not None:
        calib = _without(calib, leave_out, spec.samples)
    if any(isinstance(s, Path) and s.is_dir() for s in sources.values()):  # class folders name classes
        check_folders(loaded.labels, calib.classes, calib_source, "calib" if recipe.calib else "training.data")
    _check_token_ids(source, calib)
    held = ranking = more = None
    if not recipe.trains:  # after training, every training sample has been seen: none is held out
        held = load_held_out(sources, loaded.inputs, loaded.specs, after=spec.samples,
                             count=VERIFY_SAMPLES, seed=recipe.seed, strict=recipe.strict)
        if held is not None:
            _check_token_ids(source, held)
        ranking = _ranking_extra(recipe, sources, loaded, calib)
        if ranking is not None:
            _check_token_ids(source, ranking)
            more = _more_held_out(recipe, sources, loaded, source)
    out_dim = source.output_shape[-1] if source.output_shape else None
    labels = loaded.labels or (tuple(calib.classes) if len(calib.classes) == out_dim else ())
    return Calibrated(calib, calib_source, held, ranking, labels,
                      "verification" if recipe.qat else "quantization", spec.samples, recipe.seed, more)


def _without(calib: CalibrationSet, held_out: LabelledData, samples: int) -> CalibrationSet:
    """The first `samples` of `calib` that are not held out (by their decoded arrays): `calib` was drawn with
    as many more as there are held-out samples, so the count asked for stays where the data has it."""
    from edgekit.converters.heldout import fingerprints, fingerprints_of

    held = set(fingerprints(held_out))
    keep = np.flatnonzero([f not in held for f in fingerprints_of(calib.arrays())])[:samples]
    return replace(calib, x=calib.x[keep], labels=None if calib.labels is None else calib.labels[keep],
                   others=tuple(o[keep] for o in calib.others),
                   targets={k: v[keep] for k, v in calib.targets.items()})


def _ranking_extra(recipe: ConvertRecipe, sources: dict, loaded: Loaded, calib) -> CalibrationSet | None:
    """Samples past the calibration and verification ones, for `auto` to rank range methods on as well
    (up to `calibration.ranking_samples` in all); None where nothing is ranked or the source has no more."""
    spec = recipe.calibration
    extra = spec.ranking_samples - len(calib)
    if recipe.mode != "int8" or recipe.qat or spec.method == "minmax" or extra <= 0:
        return None
    return load_held_out(sources, loaded.inputs, loaded.specs, after=spec.samples + VERIFY_SAMPLES,
                         count=extra, seed=recipe.seed, strict=recipe.strict)


def _more_held_out(recipe: ConvertRecipe, sources: dict, loaded: Loaded, source: SourceModel) -> MoreHeldOut | None:
    """The samples past the ranking ones, read when `auto` asks for them (`calibration.ranking_max` held-out
    samples at most); None where there are none or nothing is ranked."""
    spec = recipe.calibration
    after = spec.samples + VERIFY_SAMPLES + max(0, spec.ranking_samples - spec.samples)
    available = held_out_count(sources, loaded.inputs, loaded.specs, after=after)
    if spec.method != "auto" or available <= 0:
        return None

    def read(start: int, count: int) -> list:
        found = load_held_out(sources, loaded.inputs, loaded.specs, after=after + start, count=count,
                              seed=recipe.seed, strict=recipe.strict)
        if found is None:
            return []
        _check_token_ids(source, found)
        return list(found.representative_dataset())

    return MoreHeldOut(read, available, spec.ranking_max)


def _check_token_ids(source: SourceModel, calib: CalibrationSet) -> None:
    """Token ids an Embedding fed by a model input cannot look up: said as bad calibration data (exit 4), not
    left to the converter's calibration, whose GATHER fails with "index out of bounds" (exit 5)."""
    inputs = list(getattr(source.keras_model, "inputs", None) or ())
    for layer in getattr(source.keras_model, "layers", ()):
        size = getattr(layer, "input_dim", None)
        if type(layer).__name__ != "Embedding" or not isinstance(size, int):
            continue
        try:
            fed = next((i for i, t in enumerate(inputs) if t is layer.input), None)
        except (AttributeError, ValueError):  # a shared layer has no single input
            continue
        if fed is None or fed >= len(calib.arrays()):
            continue
        ids = calib.arrays()[fed]
        if np.issubdtype(ids.dtype, np.integer) and ids.size and int(ids.max()) >= size:
            raise CalibrationError(f"{calib.source}: token ids go up to {int(ids.max())}, but input "
                                   f"{source.inputs[fed].name!r} feeds Embedding {layer.name!r} of {size} ids "
                                   f"(0..{size - 1})", param="calib")
