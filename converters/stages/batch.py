"""An open batch that leaves ops on the GPU delegate's CPU: the quantize stage converts again at batch 1."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgekit.converters.loading import TensorSpec
from edgekit.converters.shapes import batch_of_one, keep_open_hint, open_batches
from edgekit.converters.stages import Say
from edgekit.converters.stages.load import Loaded


class ShapeFromBatch(Exception):
    """Raised on an int8 conversion's float model, before it is calibrated, where the open batch leaves ops
    on the GPU delegate's CPU (`BatchCause`): the conversion starts again at batch 1 at once."""

    def __init__(self, cause: BatchCause):
        super().__init__("the open batch computes shapes at run time")
        self.cause = cause


@dataclass(frozen=True)
class BatchCause:
    """Ops that compute a shape at run time from an open batch, which the GPU rules leave on the CPU
    (runtime/open_dims.py): `names` the inputs to close, `before` every op left on the CPU, `ops` the caused."""

    names: list[str]
    before: list[dict[str, Any]]
    ops: list[int]

    @classmethod
    def of(cls, loaded: Loaded, shapes: dict, tflite: bytes) -> BatchCause | None:
        from edgekit.runtime.gpu_compat import check_model
        from edgekit.runtime.open_dims import open_dimension

        names = open_batches(_current(loaded, shapes), loaded.given)
        before = [r for r in check_model(tflite) if not r["compatible"]] if names else []
        cause = open_dimension(tflite, before) if before else None
        if cause is None or not cause["batch_only"]:  # other open dimensions: batch 1 alone would not fix the ops
            return None
        return cls(names, before, cause["ops"])

    @staticmethod
    def probe(loaded: Loaded, shapes: dict) -> Callable[[bytes], None]:
        """What `_converted` runs on an int8 conversion's float model before calibrating it: stops it where the
        batch must close."""
        def probe(model: bytes) -> None:
            if (cause := BatchCause.of(loaded, shapes, model)) is not None:
                raise ShapeFromBatch(cause)
        return probe


def _current(loaded: Loaded, shapes: dict) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, shapes.get(t.name, t.shape), t.dtype) for t in loaded.inputs)


def batch_closed(loaded: Loaded, shapes: dict, tflite: bytes | None, cause: BatchCause | None,
                 convert: Callable[[dict], tuple], say: Say) -> tuple[tuple, dict, str] | None:
    """An open batch that leaves ops on the CPU of the GPU delegate because they compute a shape at run time
    (a Flatten's or a Reshape's): converted again at batch 1 and kept where the GPU rules leave fewer ops on
    the CPU. `cause`: found on an int8 conversion's float model (`tflite` None: nothing to keep, it was
    never calibrated at the open batch). (what `convert` gave, the shapes, what to say), or None."""
    from edgekit.runtime.gpu_compat import check_model

    cause = cause or (BatchCause.of(loaded, shapes, tflite) if tflite is not None else None)
    if cause is None:
        return None
    current = _current(loaded, shapes)
    closed = {**shapes, **{t.name: t.shape for t in batch_of_one(current, cause.names) if t.name in cause.names}}
    say(f"converting {'again ' if tflite else ''}at batch 1: {len(cause.ops)} op(s) compute a shape at run time "
        "from the open batch")
    again = convert(closed)
    after = [r for r in check_model(again[0]) if not r["compatible"]]
    if tflite is not None and len(after) >= len(cause.before):
        return None
    ops = ", ".join(dict.fromkeys(r["op"] for r in cause.before if r["index"] in cause.ops))
    return again, closed, (f"converted at batch 1: with the batch open, {len(cause.ops)} op(s) ({ops}) compute "
                           f"a shape at run time and the GPU delegate leaves them on the CPU ({len(cause.before)} "
                           f"op(s) on the CPU -> {len(after)}); {keep_open_hint(current, cause.names)}")
