"""Train: pruning and/or quantization-aware training of the float model, before it is converted."""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.converters.finetune import FinetuneResult, FinetuneSpec, LabelledData, finetune
from edgekit.converters.loading import SourceModel, keras_model_of_saved_model, trained_source
from edgekit.converters.recipe import ConvertRecipe, Structure
from edgekit.converters.stages import Say
from edgekit.converters.stages.load import Loaded, labelled

READS = frozenset({"training", "pruning", "prune", "qat", "seed", "strict", "trust_model"})
KEYS: tuple[str, ...] = ()  # what training achieved is measured on the exported file: stages/measure.py


@dataclass(frozen=True)
class Trained:
    """Pruning and/or QAT: the trained model to convert and what the stages measured."""

    source: SourceModel
    original: SourceModel
    tuned: FinetuneResult
    val: LabelledData | None
    sample_sizes: dict[str, tuple] | None = None  # open inputs at the training samples' size


def train(recipe: ConvertRecipe, loaded: Loaded, progress, say: Say) -> Trained:
    training, pruning = recipe.training, recipe.pruning
    assert training is not None  # a conversion that trains has training data (the recipe checks it)
    say(f"reading training data from {training.data}")
    train_data = labelled(training.data, loaded, "training.data", seed=recipe.seed, strict=recipe.strict,
                          targets=True)
    val = (None if training.val_data is None
           else labelled(training.val_data, loaded, "training.val_data", seed=recipe.seed, strict=recipe.strict,
                         targets=True))
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
    return Trained(trained_source(source, tuned.model), source, tuned, val, loaded.sample_sizes(inputs))
