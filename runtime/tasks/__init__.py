"""Tasks on top of `Model`: image classification, detection, and raw outputs, behind one interface.

Each task takes a decoded image (HxW gray or HxWx3 RGB uint8), applies the model's stored preprocessing and
returns plain results. `task_for(model)` picks the task a model was built for. `TASKS` is the declared table
of tasks (`--task` name -> "module:Class"), imported when used; `edgekit run` reads only the `Task`
interface (tasks/base.py), so adding a task is one class and its line here (or, outside the library, a
`TASKS[name] = SomeTask` entry made by the caller).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgekit.runtime.model import Model
    from edgekit.runtime.tasks.base import Task

# name -> "module:Class" (or the class itself, for a task added by the caller); `task_for` asks them in
# this order, FALLBACK last
TASKS: dict[str, str | type[Task]] = {
    "classify": "edgekit.runtime.tasks.classify:Classifier",
    "detect": "edgekit.runtime.tasks.detect:Detector",
    "raw": "edgekit.runtime.tasks.raw:RawTask",
}
FALLBACK = "raw"  # the task of a model no other task claims

_WHERE = {
    "Classification": "edgekit.runtime.tasks.classify",
    "Classifier": "edgekit.runtime.tasks.classify",
    "top_indices": "edgekit.runtime.tasks.classify",
    "DETECTION_OP": "edgekit.runtime.tasks.detect",
    "Detection": "edgekit.runtime.tasks.detect",
    "Detector": "edgekit.runtime.tasks.detect",
    "RawResult": "edgekit.runtime.tasks.raw",
    "RawTask": "edgekit.runtime.tasks.raw",
    "raw_results": "edgekit.runtime.tasks.raw",
    "ImageTask": "edgekit.runtime.tasks.base",
    "RunSettings": "edgekit.runtime.tasks.base",
    "Task": "edgekit.runtime.tasks.base",
}

__all__ = ["DETECTION_OP", "FALLBACK", "TASKS", "Classification", "Classifier", "Detection", "Detector", "ImageTask",
           "RawResult", "RawTask", "RunSettings", "Task", "raw_results", "task_class", "task_for", "top_indices"]


def task_class(name: str) -> type[Task]:
    """The class of task `name` (KeyError when TASKS has no such task), its module imported on first use."""
    entry = TASKS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        return getattr(importlib.import_module(module), attr)
    return entry


def task_for(model: Model) -> str:
    """The first task in TASKS whose class `matches` the model, else FALLBACK: "detect" for models ending in
    the detection post-processing op or with a raw YOLO or SSD head, "classify" for one (1, K) output, "raw"
    otherwise."""
    for name in TASKS:
        if name != FALLBACK and task_class(name).matches(model):
            return name
    return FALLBACK


def __getattr__(name: str):
    """The tasks' names, imported on first use: reading TASKS loads no task."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'edgekit.runtime.tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
