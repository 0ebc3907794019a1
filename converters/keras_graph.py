"""A Keras 3 model's functional graph, read for the pass that rewrites weights by channel (converters/channels.py):
its call nodes in order, and how often each layer is called within the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def functional(model) -> Any | None:
    """The functional graph of a Keras 3 model: its own, or a Sequential's (built as one), else None."""
    return model if hasattr(model, "_nodes_by_depth") else getattr(model, "_functional", None)


@dataclass
class Graph:
    model: Any  # the functional model
    nodes: list  # keras Node objects, inputs first
    calls: dict[int, int]  # id(operation) -> its calls within the outermost model read (see call_counts)

    @classmethod
    def of(cls, model, calls: dict[int, int] | None = None) -> Graph:
        """`model`'s graph; `calls` as counted over the outermost model where `model` is nested in one (else
        counted over `model`). Raises AttributeError (or TypeError) for no Keras 3 functional or Sequential model."""
        model = functional(model)
        return cls(model, _nodes(model), call_counts(model) if calls is None else calls)


def call_counts(model) -> dict[int, int]:
    """id(operation) -> how often it is called in `model`'s graph and the graphs of the models nested in it (each
    read once, however often called): a layer shared by a nested model and the outer graph counts twice.
    Only these graphs' nodes count, not every node Keras keeps on a layer (`_inbound_nodes`): loading a
    Sequential adds its layers one by one and rebuilds its graph after each, so its first layer holds a node
    for every graph it was ever part of."""
    calls: dict[int, int] = {}
    graphs, seen = [functional(model)], set()
    while graphs:
        graph = graphs.pop()
        if id(graph) in seen:
            continue
        seen.add(id(graph))
        for n in _nodes(graph):
            calls[id(n.operation)] = calls.get(id(n.operation), 0) + 1
            if functional(n.operation) is not None:
                graphs.append(functional(n.operation))
    return calls


def _nodes(graph) -> list:
    """The call nodes of a Keras 3 functional graph, inputs first."""
    depths = graph._nodes_by_depth
    return [n for depth in sorted(depths, reverse=True) for n in depths[depth]]


def kind(op) -> str:
    return type(op).__name__


def activation(op) -> str:
    return getattr(getattr(op, "activation", None), "__name__", "")
