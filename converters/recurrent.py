"""Recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional of them) as TFLite can convert them.

- Keras leaves the batch open; with an open batch TFLite's converter lowers the loop to TensorList ops it has
  no builtin for (the plain converter fails naming tf.TensorListReserve). At batch 1 it emits its fused
  sequence ops: `fixed_batch` gives each input a batch of 1 when the model has a recurrence and no size was
  given.
- TFLite's calibrator crashes natively (SIGSEGV) on those fused ops at int8 and int16x8, the plain converter
  included. A recurrence over a known, short number of steps is rebuilt unrolled (`unrolled`): the same
  layers with `unroll=True` and the same weights, proven to give the same outputs, which converts to plain
  int8 ops. An open or long sequence is refused with what would fix it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from edgekit.converters.loading import SourceModel, TensorSpec, keras_source
from edgekit.errors import ConversionError, UsageError, one_line

MAX_STEPS = 256  # an unrolled recurrence is one copy of the cell per step
SAME = 1e-4      # unrolled vs rolled, max difference over the output range


def recurrences(model: Any) -> list[Any]:
    """The recurrent layers of a Keras model (nested models and Bidirectional wrappers included)."""
    if model is None:
        return []
    import keras

    found = []
    for layer in getattr(model, "layers", ()):
        if isinstance(layer, (keras.layers.RNN, keras.layers.Bidirectional)):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(recurrences(layer))
    return found


def fixed_batch(source: SourceModel, inputs: tuple[TensorSpec, ...],
                given: frozenset[str] = frozenset()) -> tuple[tuple[TensorSpec, ...], str | None]:
    """`inputs` with an open batch set to 1 where the model has a recurrence, and what was done (None: nothing).
    `given`: the inputs whose size `input_shape` gives; an open batch there is the user's, and refused."""
    layers = recurrences(source.keras_model)
    if not layers or all(t.shape[0] is not None for t in inputs):
        return inputs, None
    names = ", ".join(f"{layer.name} ({type(layer).__name__})" for layer in layers[:3])
    if kept := [t.name for t in inputs if t.shape[0] is None and t.name in given]:
        raise UsageError(f"the recurrent layer(s) {names} convert to TFLite's sequence ops at a fixed batch only: "
                         f"give {', '.join(kept)} a batch (1) instead of -1", param="input_shape")
    fixed = tuple(TensorSpec(t.name, (1, *t.shape[1:]) if t.shape[0] is None else t.shape, t.dtype) for t in inputs)
    return fixed, (f"converting at batch 1: the recurrent layer(s) {names} convert to TFLite's sequence ops at a "
                   "fixed batch only (`input_shape` sets another)")


def rolled(model: Any) -> list[Any]:
    """The recurrent layers that run as a loop (not unrolled)."""
    out = []
    for layer in recurrences(model):
        inner = [layer.forward_layer, layer.backward_layer] if hasattr(layer, "forward_layer") else [layer]
        if any(not getattr(x, "unroll", True) for x in inner):
            out.append(layer)
    return out


def _steps(source: SourceModel, inputs: tuple[TensorSpec, ...], layers: list[Any]) -> int | None:
    """The sequence length the recurrences run over, None when any is open."""
    lengths = []
    for layer in layers:
        shape = getattr(layer, "input", None)
        shape = getattr(shape, "shape", None)
        lengths.append(shape[1] if shape is not None and len(shape) >= 3 else None)
    known = [n for n in lengths if n is not None]
    if len(known) < len(lengths):  # the model's own shapes leave it open: the sizes given fix it
        sized = [t.shape[1] for t in inputs if len(t.shape) >= 3]
        fixed = [n for n in sized if n is not None]
        return max(fixed) if fixed and len(fixed) == len(sized) else None
    return max(known)


def _unroll_config(layer) -> dict[str, Any]:
    config = layer.get_config()
    if "layer" in config:  # Bidirectional: both directions
        for key in ("layer", "backward_layer"):
            if config.get(key):
                config[key] = {**config[key], "config": {**config[key]["config"], "unroll": True}}
        return config
    return {**config, "unroll": True}


def unrolled(source: SourceModel, inputs: tuple[TensorSpec, ...], mode: str) -> tuple[SourceModel, str | None]:
    """The source with its rolled recurrences unrolled for `mode` int8/int16x8 (same weights, outputs checked
    equal on a seeded input), and what was done; a ConversionError where it cannot be."""
    layers = rolled(source.keras_model)
    if not layers:
        return source, None
    import keras

    names = ", ".join(layer.name for layer in layers[:3])
    steps = _steps(source, inputs, layers)
    if steps is None:
        raise ConversionError(f"{mode} of the recurrent layer(s) {names}: TFLite's calibrator crashes on its "
                              "sequence ops, so edgekit unrolls the recurrence, which needs a fixed number of steps; "
                              "the model's is open: give `input_shape=1,STEPS,FEATURES`, or use `mode=float16` or "
                              "`mode=dynamic`, which keep the sequence op")
    if steps > MAX_STEPS:
        raise ConversionError(f"{mode} of the recurrent layer(s) {names}: TFLite's calibrator crashes on its "
                              f"sequence ops, and {steps} steps are more than edgekit unrolls ({MAX_STEPS}); use "
                              "`mode=float16` or `mode=dynamic`, which keep the sequence op")
    targets = {id(layer) for layer in layers}

    def clone(layer):
        if id(layer) in targets:
            return type(layer).from_config(_unroll_config(layer))
        if isinstance(layer, keras.Model) and any(id(inner) in targets for inner in recurrences(layer)):
            return keras.models.clone_model(layer, clone_function=clone)  # a nested model holding one
        return layer.__class__.from_config(layer.get_config())

    try:  # on inputs of the sizes converted (an unrolled loop needs its number of steps when it is built)
        fixed = [keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t.name) for t in inputs]
        model = keras.models.clone_model(source.keras_model, input_tensors=fixed[0] if len(fixed) == 1 else fixed,
                                         clone_function=clone)
        model.set_weights(source.keras_model.get_weights())
    except Exception as exc:  # noqa: BLE001 - Keras raises many types for models it cannot clone
        raise ConversionError(f"{mode} of the recurrent layer(s) {names}: the model could not be rebuilt "
                              f"unrolled ({type(exc).__name__}: {one_line(exc)}); use `mode=float16` or "
                              "`mode=dynamic`") from None
    new = replace(keras_source(source, model), inputs=inputs)
    _check_same(source, new, inputs, names)
    return new, (f"unrolled the recurrent layer(s) {names} over {steps} steps for {mode} (TFLite's calibrator "
                 "crashes on the rolled sequence ops); the same weights, outputs checked equal")


def _check_same(source: SourceModel, new: SourceModel, inputs: tuple[TensorSpec, ...], names: str) -> None:
    rng = np.random.default_rng(0)
    xs = []
    for t in inputs:
        # fed one at a time at batch 1; the sizes converted are fixed past the batch (numpy rejects a None)
        shape: list[Any] = [4 if i == 0 else d for i, d in enumerate(t.shape)]
        xs.append(rng.integers(0, 2, shape).astype(t.dtype) if "int" in t.dtype
                  else rng.standard_normal(shape).astype(np.float32))
    for a, b in zip(source.predict_all(xs).values(), new.predict_all(xs).values()):
        span = float(np.max(a) - np.min(a)) or 1.0
        if float(np.max(np.abs(a - b))) > SAME * span:
            raise ConversionError(f"the recurrent layer(s) {names} unrolled do not give the model's outputs "
                                  f"(max difference {np.max(np.abs(a - b)):.3g}); use `mode=float16` or `mode=dynamic`")
