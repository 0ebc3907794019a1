"""Train: pruning and/or quantization-aware training of the float model, before it is converted, measured on
held-out data (`training.val_data`, else a split of the training data that no stage trains on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgekit.converters.finetune import FinetuneResult, FinetuneSpec, LabelledData, finetune
from edgekit.converters.heldout import shared_samples, split
from edgekit.converters.loading import SourceModel, keras_model_of_saved_model, trained_source
from edgekit.converters.recipe import NEEDS_CALIBRATION, ConvertRecipe, Structure
from edgekit.converters.stages import Say
from edgekit.converters.stages.load import Loaded, labelled

READS = frozenset({"training", "pruning", "prune", "qat", "seed", "strict", "trust_model", "budget", "calib", "mode"})
KEYS: tuple[str, ...] = ()  # what training achieved is measured on the exported file: stages/measure.py


@dataclass(frozen=True)
class Trained:
    """Pruning and/or QAT: the trained model to convert and what the stages measured."""

    source: SourceModel
    original: SourceModel
    tuned: FinetuneResult
    val: LabelledData | None
    sample_sizes: dict[str, tuple] | None = None  # open inputs at the training samples' size
    val_from: str | None = None  # where `val` came from: `training.val_data`'s path, or the split
    eval: LabelledData | None = None  # `budget.eval_data`, read here to check it against `val`
    warnings: list[str] = field(default_factory=list)  # held-out data that is not independent of other data


def train(recipe: ConvertRecipe, loaded: Loaded, progress, say: Say) -> Trained:
    training, pruning = recipe.training, recipe.pruning
    assert training is not None  # a conversion that trains has training data (the recipe checks it)
    say(f"reading training data from {training.data}")
    train_data = labelled(training.data, loaded, "training.data", seed=recipe.seed, strict=recipe.strict,
                          targets=True)
    val: LabelledData | None
    if training.val_data is not None:
        val = labelled(training.val_data, loaded, "training.val_data", seed=recipe.seed, strict=recipe.strict,
                       targets=True)
        val_from: str | None = str(training.val_data)
    else:
        held = split(train_data, recipe.seed)
        train_data, val, val_from = ((train_data, None, None) if held is None
                                     else (held.train, held.held, held.described))
        if held is not None:
            say(f"holding out {held.described} to measure training on")
    evaluated = (None if recipe.budget is None or recipe.budget.eval_data is None
                 else labelled(recipe.budget.eval_data, loaded, "budget.eval_data", seed=recipe.seed,
                               strict=recipe.strict))
    source = loaded.source
    if source.keras_model is None:
        source.keras_model = keras_model_of_saved_model(source.path, trust=recipe.trust_model)
    tuned = finetune(source.keras_model, FinetuneSpec(
        prune=recipe.prune or 0.0, schedule="polynomial" if pruning is None else pruning.schedule,
        structure=Structure.parse(None if pruning is None else pruning.structure), qat=recipe.qat,
        epochs=training.epochs, batch_size=training.batch_size, lr=training.lr,
        skip_layers=frozenset(training.skip_layers), logdir=training.logdir, seed=recipe.seed,
        distill=training.distill), train_data, val,
        progress=progress)
    inputs = train_data.inputs if isinstance(train_data.inputs, list) else [train_data.inputs]
    return Trained(trained_source(source, tuned.model), source, tuned, val, loaded.sample_sizes(inputs), val_from,
                   evaluated, dependence(recipe, val, evaluated))


def _same(a, b) -> bool:
    return isinstance(a, Path) and isinstance(b, Path) and a.resolve() == b.resolve()


def dependence(recipe: ConvertRecipe, val: LabelledData | None, evaluated: LabelledData | None) -> list[str]:
    """Warnings where the held-out data is not independent of the budget's evaluation data (the same path, or
    samples in common) or is the calibration data itself: a measurement on both is not two measurements."""
    training = recipe.training
    assert training is not None
    said = "`training.val_data`" if training.val_data is not None else "the split of `training.data` held out"
    out = []
    if val is not None and evaluated is not None and recipe.budget is not None:
        common = shared_samples(val, evaluated)
        if common or _same(training.val_data, recipe.budget.eval_data):
            out.append(f"{said} and `budget.eval_data` share {common} of {len(val.x)} samples: the training "
                       "stages' and the budget's measurements are not independent; give them separate data")
    calib = recipe.calib.values() if isinstance(recipe.calib, dict) else [recipe.calib]
    if recipe.mode in NEEDS_CALIBRATION and any(_same(training.val_data, c) for c in calib):
        out.append("`training.val_data` is the calibration data (`calib`): the file's accuracy on it is not "
                   "independent of its int8 ranges; give them separate data")
    return out
