"""The float model behind bench's `reference`: a Keras model or SavedModel evaluated in TensorFlow, or a float
.tflite (its float twin) run by edgekit.runtime without TensorFlow. Either gives its outputs on the samples
prepared for the candidate, matched to the candidate's outputs by name."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import InputShapeError
from edgekit.runtime.model import Model
from edgekit.runtime.model_kind import model_kind

Inputs = np.ndarray | dict[str, np.ndarray]


class Reference:
    """The float model behind `--reference`: `format` (keras, h5, saved_model or tflite) and `device` (the
    TensorFlow device, or the runtime that ran a .tflite) for the report, and `outputs` on the samples."""

    def __init__(self, path: Path):
        self.path = path
        self._cache: dict[Hashable, dict[str, np.ndarray]] = {}
        self.format = model_kind(path)  # by its bytes: a .tflite never imports TensorFlow
        if self.format == "tflite":
            self._tflite: Model | None = Model(path)
            self.device = f"{self._tflite.backend.name} {self._tflite.backend.version}"
            self._inputs = [(t.name, tuple(None if s < 0 else d for d, s in zip(t.shape[1:], t.shape_signature[1:])))
                            for t in self._tflite.inputs]
        else:
            from edgekit.converters.loading import load_model

            self._tflite, self._source = None, load_model(path)
            self.format, self.device = self._source.format, self._source.device
            self._inputs = [(t.name, tuple(t.shape[1:])) for t in self._source.inputs]

    @property
    def runner(self) -> str:
        """What ran it, in words for the report: "TensorFlow on /device:CPU:0" or "ai_edge_litert 2.3.0"."""
        return self.device if self._tflite is not None else f"TensorFlow on {self.device}"

    def _predict(self, x: Inputs) -> dict[str, np.ndarray]:
        if self._tflite is None:
            return self._source.predict_all(x)
        out = self._tflite.predict(x)
        return out if isinstance(out, dict) else {self._tflite.output_names[0]: out}

    def _check_inputs(self, model: Model, x: Inputs) -> None:
        names, mine = model.input_names, [name for name, _ in self._inputs]
        if len(self._inputs) == 1 and len(names) == 1:
            pairs = [(self._inputs[0][1], np.asarray(x))]
        elif sorted(mine) == sorted(names):
            assert isinstance(x, dict)  # several inputs come by name (for the type checker)
            pairs = [(shape, x[name]) for name, shape in self._inputs]
        else:
            raise InputShapeError(f"`reference` {self.path} takes the inputs {', '.join(mine)}, "
                                  f"the .tflite takes {', '.join(names)}: not the same model")
        for want, a in pairs:
            if len(want) != a.ndim - 1 or any(w is not None and w != g for w, g in zip(want, a.shape[1:])):
                raise InputShapeError(f"`reference` {self.path} takes inputs of shape {want}, the .tflite "
                                      f"takes {tuple(a.shape[1:])}: not the same model")

    def outputs(self, key: Hashable, model: Model, x: Inputs, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Float outputs on the same inputs, under the .tflite's output names: matched by name (a single
        output by position), never by shape; shapes must match the .tflite's."""
        self._check_inputs(model, x)
        if key not in self._cache:
            self._cache[key] = self._predict(x)
        ref = self._cache[key]
        if sorted(ref) == sorted(got):
            matched = {name: ref[name] for name in got}
        elif len(ref) == len(got) == 1:
            matched = {next(iter(got)): next(iter(ref.values()))}
        else:
            raise InputShapeError(f"`reference` {self.path} has the outputs {', '.join(ref)}, the .tflite has "
                                  f"{', '.join(got)}: cannot match them by name (not the same model?)")
        for name, values in matched.items():
            if tuple(values.shape[1:]) != tuple(got[name].shape[1:]):
                raise InputShapeError(f"`reference` {self.path} outputs shape {tuple(values.shape[1:])}"
                                      f"{f' for {name!r}' if len(got) > 1 else ''}, the .tflite outputs "
                                      f"{tuple(got[name].shape[1:])}: not the same model")
        return matched

    def describe(self, top1: float | None) -> dict[str, Any]:
        """The report's `reference` entry."""
        return {"path": str(self.path), "format": self.format, "device": self.device, "top1": top1}
