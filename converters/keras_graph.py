"""A Keras 3 model's functional graph, read for the passes that rewrite weights by channel
(converters/equalize.py, converters/channels.py): its call nodes in order, who reads each tensor, which tensors
are the model's outputs, and how often each layer is called."""

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
    readers: dict[int, list]  # id(KerasTensor) -> the nodes that read it (each once)
    outputs: set[int]  # id() of the model's output tensors
    calls: dict[int, int]  # id(operation) -> its calls, in this graph or any other (a layer shared with a nested model)

    @classmethod
    def of(cls, model) -> "Graph":
        """Raises AttributeError (or TypeError) for a model that is no Keras 3 functional or Sequential one."""
        model = functional(model)
        depths = model._nodes_by_depth  # noqa: SLF001 - Keras 3's graph
        nodes = [n for depth in sorted(depths, reverse=True) for n in depths[depth]]
        readers: dict[int, list] = {}
        calls: dict[int, int] = {}
        for n in nodes:
            for t in {id(t): t for t in n.input_tensors}.values():  # a node reading a tensor twice (h, h) once
                readers.setdefault(id(t), []).append(n)
            calls[id(n.operation)] = calls.get(id(n.operation), 0) + 1
        for n in nodes:  # every call Keras recorded, in whichever graph
            calls[id(n.operation)] = max(calls[id(n.operation)], len(getattr(n.operation, "_inbound_nodes", ())))
        return cls(model, nodes, readers, {id(t) for t in model.outputs}, calls)

    def sole_reader(self, tensor):
        """The one node that reads `tensor`, where it is no model output and that node's layer is called once."""
        users = self.readers.get(id(tensor), [])
        if id(tensor) in self.outputs or len(users) != 1 or self.calls[id(users[0].operation)] != 1:
            return None
        return users[0]


def kind(op) -> str:
    return type(op).__name__


def activation(op) -> str:
    return getattr(getattr(op, "activation", None), "__name__", "")
