"""Ops of a .tflite that compute a tensor's shape while the model runs, and the open input dimension behind
them: why an accelerator leaves them on the CPU, and which `input_shape` would remove them.

Keras leaves the batch open (TFLite writes -1 in the input's shape signature). A `Flatten` or a `Reshape`
then takes its new shape from the data: SHAPE reads it, STRIDED_SLICE and PACK assemble it, and RESHAPE takes
it as a second, run-time input. The GPU delegate takes none of them (runtime/gpu_compat says why, op by op);
converted at a fixed size, the converter folds that shape into a constant and the ops are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgekit.runtime.flatbuffer import ModelView

_INTEGER = frozenset({"INT32", "INT64"})


@dataclass(frozen=True)
class OpenShapes:
    """The ops of subgraph 0 that read, compute or take a run-time shape, and the open dimensions they read."""

    ops: tuple[int, ...]  # op indices, in graph order
    dims: frozenset[int]  # positions that are open (-1) in the tensors SHAPE reads
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # the model's open inputs: (name, shape signature)
    count: int = 1  # the model's inputs, open or not

    @property
    def batch_only(self) -> bool:
        """Only the batch is open where shapes are read, and an input's batch is: a batch of 1 folds every one
        of these ops away."""
        return self.dims == frozenset({0}) and any(sig and sig[0] == -1 for _, sig in self.inputs)

    def fix(self) -> dict[str, list[int]] | None:
        """The `input_shape` that closes the batch of every open input (batch 1), or None when other sizes are
        open too (their size is the user's to choose)."""
        if not self.batch_only or any(-1 in sig[1:] for _, sig in self.inputs):
            return None
        return {name: [1, *sig[1:]] for name, sig in self.inputs if sig and sig[0] == -1}


def run_time_shapes(model: bytes | ModelView) -> OpenShapes:
    """Every op of subgraph 0 that reads a shape (SHAPE), computes with one (integer ops fed only by shapes
    and constants), or takes one among data (RESHAPE's new shape, a FILL's dims ...)."""
    view = ModelView.of(model)
    sub = view.first_subgraph()
    tensors = sub.tensors
    constant = {t.index for t in tensors if view.buffer_bytes(t.buffer) is not None}
    derived: set[int] = set()  # tensors that hold a shape computed at run time
    found: list[int] = []
    dims: set[int] = set()
    for op in sub.operators:
        runtime = [i for i in op.inputs if 0 <= i < len(tensors) and i not in constant]
        outputs = [o for o in op.outputs if 0 <= o < len(tensors)]  # a hostile file's indices are not trusted
        if 0 <= op.opcode_index < len(view.op_codes) and view.op_name(op) == "SHAPE":
            dims.update(d for i in runtime for d, s in enumerate(tensors[i].shape_signature) if s < 0)
            found.append(op.index)
            derived.update(outputs)
            continue
        shaped = [i for i in runtime if i in derived]
        if not shaped:
            continue
        found.append(op.index)
        if len(shaped) == len(runtime) and all(tensors[o].type_name in _INTEGER for o in outputs):
            derived.update(outputs)
    names = _input_names(view)
    open_inputs = tuple((names.get(i, tensors[i].name), tuple(tensors[i].shape_signature)) for i in sub.inputs
                        if any(s < 0 for s in tensors[i].shape_signature))
    return OpenShapes(tuple(found), frozenset(dims), open_inputs, len(sub.inputs))


def _input_names(view: ModelView) -> dict[int, str]:
    """{tensor index: the input's name in the first signature of subgraph 0} (the names convert and run use)."""
    signature = next((sig for sig in view.signatures if sig.subgraph == 0), None)
    return {index: name for name, index in signature.inputs} if signature is not None else {}


def open_dimension(model: bytes | ModelView, fallback: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Of the ops an accelerator leaves on the CPU (`fallback`: {"index", "op"} each), the ones an open input
    dimension causes (`all`: every one of them), the cause in a line ("SHAPE, RESHAPE compute a shape at run
    time because the batch is open; ...") and the `input_shape` that removes them; None when none is."""
    shapes = run_time_shapes(model)
    caused = [o for o in fallback if o["index"] in set(shapes.ops)]
    if not caused or not shapes.inputs or not shapes.dims:  # no input is open, or SHAPE reads no open size
        return None
    fix = shapes.fix()
    names = ", ".join(dict.fromkeys(o["op"] for o in caused))
    open_what = "the batch is open" if shapes.batch_only else \
        "input sizes are open (dimensions " + ", ".join(str(d) for d in sorted(shapes.dims)) + ")"
    shown = [f"`input_shape={_named(name, shape, shapes.count)}`" for name, shape in (fix or {}).items()]
    cure = "convert with " + (" ".join(shown) if shown else "`input_shape` fixing every open size")
    cause = f"{names} compute a shape at run time because {open_what}; {cure}"
    return {"ops": [o["index"] for o in caused], "all": len(caused) == len(fallback), "batch_only": shapes.batch_only,
            "inputs": [{"name": n, "shape_signature": list(s)} for n, s in shapes.inputs],
            "input_shape": fix, "cause": cause}


def _named(name: str, shape: list[int], count: int) -> str:
    dims = ",".join(map(str, shape))
    return dims if count == 1 else f"{name}={dims}"
