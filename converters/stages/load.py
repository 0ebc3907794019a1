"""Load: the float model, its inputs at the sizes conversion uses, and how images become each input."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters import recurrent
from edgekit.converters.calibration import labelled_data
from edgekit.converters.finetune import LabelledData
from edgekit.converters.labels import check_count, check_folders, class_names
from edgekit.converters.loading import SourceModel, TensorSpec, load_model
from edgekit.converters.recipe import NEEDS_CALIBRATION, ConvertRecipe
from edgekit.converters.shapes import batch_for_target, fixed_inputs, given_inputs, preprocessing
from edgekit.converters.stages import Say
from edgekit.errors import ConversionError, UsageError
from edgekit.runtime.preprocess import PreprocessSpec

READS = frozenset({"model", "trust_model", "budget", "info", "input_shape", "target", "mode", "trains",
                   "preprocessing"})
KEYS = ("preprocessing", "source")


@dataclass(frozen=True)
class Loaded:
    """The float model, its inputs at the sizes conversion uses, and how images become each input."""

    source: SourceModel
    inputs: tuple[TensorSpec, ...]
    specs: dict[str, PreprocessSpec | None]
    labels: tuple[str, ...] = ()  # the class names given (`info.labels`), checked against the outputs
    given: frozenset[str] = frozenset()  # the inputs `input_shape` sizes: their batch is the user's
    notes: list[str] = field(default_factory=list)
    file: str = ""  # the model file's name, as the metadata's `source` says it

    @property
    def spec(self) -> PreprocessSpec | None:
        """The preprocessing of a single-input model (None for several inputs, or no image)."""
        return self.specs[self.inputs[0].name] if len(self.inputs) == 1 else None

    @property
    def shapes(self) -> dict[str, tuple]:
        """The input sizes fixed for conversion (`input_shape`), by input name."""
        return {t.name: t.shape for t, given in zip(self.inputs, self.source.inputs) if t.shape != given.shape}

    def sample_sizes(self, arrays: list[np.ndarray]) -> dict[str, tuple] | None:
        """The open inputs at the size of these samples (one array per input; batch 1), None when none is
        open."""
        sized = {}
        for t, a in zip(self.inputs, arrays):
            if any(d is None for d in t.shape[1:]):
                sized[t.name] = (1, *a.shape[1:])
        return sized or None

    def metadata(self) -> dict[str, Any]:
        return {"preprocessing": self.spec.to_dict() if self.spec is not None else None,
                "source": {"file": self.file, "format": self.source.format, "sha256": self.source.sha256}}


def load(recipe: ConvertRecipe, say: Say) -> Loaded:
    say(f"loading {recipe.model}")
    source = load_model(recipe.model, trust=recipe.trust_model)
    if (len(source.inputs) > 1 or len(source.outputs) > 1) and recipe.budget is not None:
        raise UsageError(f"`budget` works on single-input, single-output models for now; {recipe.model} has "
                         f"{len(source.inputs)} input(s) and {len(source.outputs)} output(s)")
    labels = class_names(recipe.info.labels)
    check_count(labels, source.outputs, str(recipe.info.labels) if isinstance(recipe.info.labels, Path)
                else "the class names given")
    given = given_inputs(source, recipe.input_shape)
    inputs, fixed = recurrent.fixed_batch(source, fixed_inputs(source, recipe.input_shape), given)
    if fixed:
        say(fixed)
    inputs, closed = batch_for_target(inputs, recipe.target, given)
    if recipe.mode in NEEDS_CALIBRATION and not recipe.trains:
        source, unrolled = recurrent.unrolled(source, inputs, recipe.mode)
        if unrolled:
            say(unrolled)
    _check_int16_inputs(recipe.mode, inputs)
    prep = recipe.preprocessing
    return Loaded(source, inputs, preprocessing(inputs, resize=prep.resize, mean=prep.mean, std=prep.std), labels,
                  given, [closed] if closed else [], recipe.model.name)


def labelled(source, loaded: Loaded, param: str, *, seed: int, strict: bool, targets: bool = False) -> LabelledData:
    """Every sample of labelled data (class folders, or arrays with `y`), read as calibration data is; with
    `targets`, each output's training targets (converters/targets.py) too."""
    outputs = tuple(t.name for t in loaded.source.outputs) if targets else ()
    data = labelled_data(source, loaded.inputs, loaded.specs, param=param, seed=seed, strict=strict,
                         outputs=outputs)
    if isinstance(source, Path) and source.is_dir():  # class folders name classes
        check_folders(loaded.labels, data.classes, source, param)
    classes = data.classes or (() if data.labels is None else tuple(str(i) for i in range(int(data.labels.max()) + 1)))
    return LabelledData(data.x, data.labels, classes, str(source), data.others,
                        {name: data.targets[name] for name in outputs if name in data.targets},
                        tuple(t.name for t in loaded.inputs))


def _check_int16_inputs(mode: str, inputs: tuple[TensorSpec, ...]) -> None:
    """TFLite's int16x8 quantizer wants a float range for every input and gets none for integer ones (token
    ids): the plain converter fails there too ("Empty min/max for tensor ...")."""
    ints = [t for t in inputs if "int" in t.dtype]
    if mode == "int16x8" and ints:
        names = ", ".join(f"integer input {t.name!r} ({t.dtype})" for t in ints)
        raise ConversionError(f"`mode=int16x8` quantizes every activation to int16, and TFLite's int16x8 quantizer "
                              f"cannot take an {names}: use `mode=int8` (its token ids stay integers) or "
                              "`mode=dynamic`")
