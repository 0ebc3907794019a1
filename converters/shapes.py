"""The inputs a conversion works with: the model's own, with `--input-shape` fixing open sizes, and the
image preprocessing of each (None for inputs that are not images)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.converters.loading import SourceModel, TensorSpec
from edgekit.errors import CalibrationError, InputShapeError, UsageError
from edgekit.runtime.preprocess import PreprocessSpec


def fixed_inputs(source: SourceModel,
                 shapes: dict[str | None, tuple[int | None, ...]] | None) -> tuple[TensorSpec, ...]:
    """The model's inputs with the given sizes applied (None: the only input). A shape must keep the
    input's rank and every size the model fixes itself."""
    if not shapes:
        return source.inputs
    names = source.input_names
    if None in shapes:
        if len(names) != 1:
            raise UsageError(f"the model has {len(names)} inputs ({', '.join(names)}): give a shape per input "
                             "name, {NAME: (1, H, W, C)}", param="input_shape")
        shapes = {names[0]: shapes[None]}
    unknown = [n for n in shapes if n is not None and n not in names]  # (None was replaced above)
    if unknown:
        raise UsageError(f"names {', '.join(unknown)}; the model's inputs are {', '.join(names)}",
                         param="input_shape")
    out = []
    for t in source.inputs:
        shape = shapes.get(t.name)
        if shape is not None:
            fits = len(shape) == len(t.shape) and all(d is None or d == s for d, s in zip(t.shape[1:], shape[1:]))
            if not fits or (shape[0] is None and t.shape[0] is not None):  # a batch the model fixes stays fixed
                shown = ",".join("-1" if d is None else str(d) for d in shape)
                raise InputShapeError(f"{t.name}={shown} does not fit the model's input {t.shape}",
                                      param="input_shape")
            t = TensorSpec(t.name, tuple(shape), t.dtype)
        out.append(t)
    return tuple(out)


FIXED_SHAPE_TARGETS = ("gpu", "nnapi", "npu")  # accelerators whose delegates plan for one input shape


def given_inputs(source: SourceModel, shapes: dict[str | None, tuple] | None) -> frozenset[str]:
    """The inputs whose size `input_shape` gives (a batch of -1 included: the user keeps it open)."""
    if not shapes:
        return frozenset()
    return frozenset(source.input_names[0] if name is None else name for name in shapes)


def open_batches(inputs: tuple[TensorSpec, ...], given: frozenset[str]) -> list[str]:
    """The inputs whose batch is open and that `input_shape` leaves to edgekit: the only dimension edgekit
    may close on its own."""
    return [t.name for t in inputs if t.shape and t.shape[0] is None and t.name not in given]


def batch_of_one(inputs: tuple[TensorSpec, ...], names: list[str]) -> tuple[TensorSpec, ...]:
    """`inputs` with the batch of `names` set to 1."""
    return tuple(TensorSpec(t.name, (1, *t.shape[1:]), t.dtype) if t.name in names else t for t in inputs)


def batch_for_target(inputs: tuple[TensorSpec, ...], target: str | None,
                     given: frozenset[str]) -> tuple[tuple[TensorSpec, ...], str | None]:
    """An accelerator target asks for a fixed batch: `inputs` with their open batch set to 1, and what to say
    (None: nothing changed)."""
    names = open_batches(inputs, given) if target in FIXED_SHAPE_TARGETS else []
    if not names:
        return inputs, None
    return batch_of_one(inputs, names), (f"converting at batch 1 for `target={target}`, whose delegate plans for "
                                         f"one input shape; {keep_open_hint(inputs, names)}")


def keep_open_hint(inputs: tuple[TensorSpec, ...], names: list[str]) -> str:
    """How to keep the batch of `names` open: `input_shape` with a batch of -1."""
    shown = [t for t in inputs if t.name in names]
    shapes = " ".join(f"`input_shape={'' if len(inputs) == 1 else t.name + '='}"
                      f"{','.join(['-1'] + ['N' if d is None else str(d) for d in t.shape[1:]])}`" for t in shown)
    return f"{shapes} keeps it open"


def is_image(t: TensorSpec) -> bool:
    return len(t.shape) == 4 and t.shape[-1] in (1, 3)


def is_open(t: TensorSpec) -> bool:
    return any(d is None for d in t.shape[1:])


_DEFAULTS = {"resize": "stretch", "mean": (0.0,), "std": (1.0,)}


def preprocessing(inputs: tuple[TensorSpec, ...], *, resize, mean, std) -> dict[str, PreprocessSpec | None]:
    """{input name: PreprocessSpec} for NHWC image inputs of a known size (1 or 3 channels), None for the
    rest. Each option is one value for every image input, or {input name: value}; they apply to image
    inputs only."""
    given = {"resize": resize, "mean": mean, "std": std}
    images = {t.name for t in inputs if is_image(t)}
    for flag, value in given.items():
        named = set(value) if isinstance(value, dict) else (set() if value == _DEFAULTS[flag] else None)
        wrong = sorted(named - images) if named is not None else ([] if images else ["*"])
        if wrong:
            what = "this model's input is " + ", ".join(str(t.shape) for t in inputs) if wrong == ["*"] else \
                f"{', '.join(wrong)} is not an image input of this model ({', '.join(sorted(images)) or 'none'})"
            raise UsageError(f"`preprocessing.mean`, `preprocessing.std` and `preprocessing.resize` apply to image "
                             f"inputs; {what}")

    def pick(flag: str, name: str):
        value = given[flag]
        return value.get(name, _DEFAULTS[flag]) if isinstance(value, dict) else value

    return {t.name: PreprocessSpec.for_input_shape(t.shape, resize=pick("resize", t.name), mean=pick("mean", t.name),
                                                   std=pick("std", t.name))
            if is_image(t) and not is_open(t) else None for t in inputs}


def check_open_image_sources(inputs: tuple[TensorSpec, ...], sources: dict[str | None, Any]) -> None:
    """An image folder cannot calibrate an input whose size is open: say which and how to fix it."""
    for t in inputs:
        source = sources.get(t.name, sources.get(None) if len(inputs) == 1 else None)
        if is_image(t) and is_open(t) and isinstance(source, Path) and source.is_dir():
            raise CalibrationError(f"input {t.name!r} has an open size {t.shape}: fix it with `input_shape` "
                                   f"{t.name}=1,H,W,{t.shape[-1]} to calibrate it with the images of {source}")


def sample_input(t: TensorSpec, fill: int = 32):
    """A mid-grey image (or zeros) of the input's shape (a batch of 1 where it is open), open sizes filled with
    `fill`: for a NaN probe."""
    import numpy as np

    shape = (t.shape[0] or 1,) + tuple(fill if d is None else d for d in t.shape[1:])
    return np.full(shape, 127.0 if is_image(t) else 0.0, np.float32)


def open_size_hint(inputs: tuple[TensorSpec, ...]) -> str | None:
    """What to tell a user whose conversion failed while some input size was left open."""
    open_inputs = [t for t in inputs if is_open(t)]
    if not open_inputs:
        return None
    said = ", ".join(f"{t.name} {t.shape} (dimension{'s' if sum(d is None for d in t.shape[1:]) > 1 else ''} "
                     f"{', '.join(str(i) for i, d in enumerate(t.shape) if d is None and i > 0)})" for t in open_inputs)
    fix = ", ".join(f"{t.name}=" + ",".join(["1"] + ["N" if d is None else str(d) for d in t.shape[1:]])
                    for t in open_inputs)
    return f"open input size: {said}; fix it with `input_shape` {fix}"
