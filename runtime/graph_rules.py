"""Preflight checks of a model's structure as a whole: which subgraphs call which, signatures, constant
strings, and how much tensor memory one operator needs at once. Each rule is a crash or an unbounded
allocation found by hand-building files (tests/test_native_crashes.py holds one generator per rule).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import numpy as np

from edgekit.errors import ModelFormatError
from edgekit.runtime.flatbuffer import NUMPY_TYPES, ModelView, OperatorView, SubgraphView, TensorView

DEFAULT_MAX_TENSOR_MB = 1024
MAX_TENSOR_ENV = "EDGEKIT_MAX_TENSOR_MB"


def max_tensor_bytes() -> int:
    """The tensor memory one operator may need at once: EDGEKIT_MAX_TENSOR_MB (default 1024) MiB."""
    raw = os.environ.get(MAX_TENSOR_ENV, "")
    try:
        mb = float(raw) if raw.strip() else DEFAULT_MAX_TENSOR_MB
    except ValueError:
        mb = DEFAULT_MAX_TENSOR_MB
    return int(max(mb, 1.0) * 1024**2)


@functools.cache
def _call_fields(options_type: str) -> tuple[str, ...]:
    """The fields of an options table that name subgraphs: *SubgraphIndex, Subgraph, *SubgraphIndices."""
    from edgekit.runtime.schema import schema_module

    cls = getattr(schema_module(), options_type, None)
    return tuple(n for n in dir(cls) if n.endswith(("SubgraphIndex", "SubgraphIndices")) or n == "Subgraph") \
        if cls is not None else ()


def subgraph_calls(op: OperatorView) -> list[int]:
    """The subgraphs an operator runs (WHILE, IF, CALL_ONCE, CALL and the StableHLO control ops), from every
    field of its options that the schema names for a subgraph."""
    calls: list[int] = []
    for type_name, read in ((op.options_type_name, op.options), (op.options_2_type_name, op.options_2)):
        fields = _call_fields(type_name) if type_name and type_name != "NONE" else ()
        options = read() if fields else None
        for name in fields if options is not None else ():
            if name.endswith("SubgraphIndices"):
                values = getattr(options, name + "AsNumpy")()
                calls.extend(int(v) for v in (values if isinstance(values, np.ndarray) else ()))
            else:
                calls.append(int(getattr(options, name)()))
    return calls


def check_calls(view: ModelView, where: str) -> None:
    """Every subgraph an operator runs exists and none runs itself, directly or through others (two
    subgraphs whose CALL_ONCE name each other recursed until the stack overflowed: SIGSEGV)."""
    count = len(view.subgraphs)
    graph: dict[int, set[int]] = {}
    for sub in view.subgraphs:
        edges = graph.setdefault(sub.index, set())
        for op in sub.operators:
            for target in subgraph_calls(op):
                if not 0 < target < count:
                    raise ModelFormatError(f"{where}: operator {op.index} of subgraph {sub.index} runs subgraph "
                                           f"{target}, not one of subgraphs 1..{count - 1}")
                edges.add(target)
    cycle = _cycle(graph)
    if cycle:
        raise ModelFormatError(f"{where}: subgraphs {' -> '.join(map(str, cycle))} run each other in a loop")


def _cycle(graph: dict[int, set[int]]) -> list[int] | None:
    """A path that comes back to where it started, or None (an iterative depth-first walk: no recursion limit)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in graph:
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def check_signatures(view: ModelView, where: str) -> None:
    """A signature runs a subgraph that exists and names tensors of it (subgraph 5 of a one-subgraph model
    crashed the interpreter's signature setup: SIGSEGV)."""
    for sig in view.signatures:
        if not 0 <= sig.subgraph < len(view.subgraphs):
            raise ModelFormatError(f"{where}: signature {sig.key!r} runs subgraph {sig.subgraph} of "
                                   f"{len(view.subgraphs)}")
        n = len(view.subgraphs[sig.subgraph].tensors)
        for name, index in sig.inputs + sig.outputs:
            if not 0 <= index < n:
                raise ModelFormatError(f"{where}: signature {sig.key!r} names tensor {index} for {name!r}; its "
                                       f"subgraph has {n}")


def check_strings(view: ModelView, sub: SubgraphView, where: str) -> None:
    """A constant STRING tensor is TFLite's packed layout: a count N, N + 1 offsets rising from the end of
    the header to the end of the buffer (the reader trusts them)."""
    for tensor in sub.tensors:
        if tensor.type_name != "STRING":
            continue
        data = view.buffer_bytes(tensor.buffer)
        if data is None:
            continue
        raw = bytes(data)
        count = int.from_bytes(raw[:4], "little", signed=True) if len(raw) >= 4 else -1  # -1: not even a count
        ok = count >= 0 and 4 * (count + 2) <= len(raw)
        if ok:
            offsets = np.frombuffer(raw, "<i4", count + 1, 4).astype(np.int64)
            ok = offsets[0] == 4 * (count + 2) and offsets[-1] == len(raw) and bool(np.all(np.diff(offsets) >= 0))
        if not ok:
            raise ModelFormatError(f"{where}: tensor {tensor.index} ({tensor.name!r}) holds strings whose offsets "
                                   "do not fit its buffer")


def _itemsize(tensor: TensorView) -> int:
    """Bytes of one element (INT4 counted as a byte); strings count 0."""
    kind = NUMPY_TYPES.get(tensor.type_name or "")
    if kind is not None:
        return np.dtype(kind).itemsize
    return {"INT4": 1, "COMPLEX64": 8, "COMPLEX128": 16}.get(tensor.type_name or "", 0)


def tensor_bytes(tensor: TensorView) -> int:
    """Bytes of a tensor at its written shape (open dimensions as written, usually 1)."""
    n = 1
    for d in tensor.shape:
        n *= max(int(d), 0)
    return n * _itemsize(tensor)


def _constant_ints(view: ModelView, tensor: TensorView) -> np.ndarray | None:
    data = view.buffer_bytes(tensor.buffer)
    kind = {"INT32": "<i4", "INT64": "<i8"}.get(tensor.type_name or "")
    if data is None or kind is None or len(data) % np.dtype(kind).itemsize:
        return None
    return np.frombuffer(bytes(data), kind).astype(np.float64)  # float: products of 2^62 do not wrap


_SHAPE_OPERAND = {"ONE_HOT": 1, "TILE": 1, "FILL": 0, "BROADCAST_TO": 1}  # the operand that sizes the output


def _implied_output_bytes(view: ModelView, op: OperatorView, tensors: tuple[TensorView, ...]) -> float:
    """The output size a kernel computes from a constant operand rather than from the written shape (ONE_HOT's
    depth, TILE's multiples, FILL's and BROADCAST_TO's dims); 0 for other operators."""
    name, ins = view.op_name(op), op.inputs
    where = _SHAPE_OPERAND.get(name)
    if where is None or len(ins) <= where or not op.outputs or op.outputs[0] < 0 or min(ins) < 0:
        return 0.0
    values = _constant_ints(view, tensors[ins[where]])
    if values is None or not len(values):
        return 0.0
    base = float(np.prod([max(d, 1) for d in tensors[ins[0]].shape], dtype=np.float64)) if name in ("ONE_HOT", "TILE") \
        else 1.0
    return base * float(np.prod(np.maximum(values, 1))) * _itemsize(tensors[op.outputs[0]])


def _working_sets(view: ModelView, sub: SubgraphView) -> Iterator[tuple[str, float]]:
    """(what, bytes) of every operator's non-constant operands taken together, and of each graph input
    and output alone: the least memory the interpreter needs for each."""
    tensors = sub.tensors
    sizes = [0 if view.buffer_bytes(t.buffer) is not None else tensor_bytes(t) for t in tensors]  # constants: 0
    for op in sub.operators:
        operands = {i for i in op.inputs + op.outputs if i >= 0}
        yield f"operator {op.index} ({view.op_name(op)})", \
            sum(sizes[i] for i in operands) + _implied_output_bytes(view, op, tensors)
    for i in set(sub.inputs + sub.outputs):
        yield f"tensor {i} ({tensors[i].name!r})", tensor_bytes(tensors[i])


def check_memory(view: ModelView, sub: SubgraphView, where: str) -> None:
    """No operator needs more tensor memory at once than max_tensor_bytes() (a 1 KB file with a
    12000x12000x3 float input asked for 1.7 GB; ONE_HOT with a depth of 2^30 for 4 GB)."""
    limit = max_tensor_bytes()
    for what, size in _working_sets(view, sub):
        if size > limit:
            raise ModelFormatError(f"{where}: {what} needs {size / 1024**2:,.0f} MiB of tensors at once, over the "
                                   f"limit of {limit / 1024**2:,.0f} MiB ({MAX_TENSOR_ENV} raises it)")
