"""A model's first output on representative-dataset samples: what converters/int8/choose.py scores range
methods on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from edgekit.converters.feeding import size_open_inputs
from edgekit.runtime.backend import get_backend
from edgekit.runtime.quant import dequantize, quantize


def first_output(tflite: bytes, samples: list, output: str | None = None) -> np.ndarray:
    """A model's first output (dequantized) on representative-dataset samples, stacked: the one its signature
    names `output` (the source model's first: the graph may list its outputs in another order), else the
    graph's first."""

    def params(d):
        scale, zero = d["quantization"]
        return SimpleNamespace(dtype=d["dtype"], scale=scale, zero_point=zero, quantized=bool(scale))

    runner = get_backend().runner(model_content=tflite, num_threads=None)
    if size_open_inputs(runner, samples[0]):  # an open-size model, at the samples' size
        runner.allocate()
    if isinstance(samples[0], dict):  # several inputs: fed by signature name
        first = output if output in runner.signature_details()[1] else sorted(runner.signature_details()[1])[0]
        return np.concatenate([runner.run_signature(None, **s)[first] for s in samples]).astype(np.float32)
    ins, outs = runner.input_details(), runner.output_details()
    out = _named(runner, outs, output)
    outputs = []
    for sample in samples:
        for d, x in zip(ins, sample):
            runner.set(d["index"], quantize(x, params(d)))
        runner.invoke()
        outputs.append(dequantize(runner.get(out["index"]), params(out)))
    return np.concatenate(outputs)


def _named(runner, outs: list, output: str | None):
    """The output detail the signature names `output`; the first where there is none."""
    if output is None or len(outs) == 1:
        return outs[0]
    try:
        index = int(runner.signature_details()[1][output]["index"])
    except (AttributeError, KeyError, IndexError, RuntimeError, ValueError, TypeError):
        return outs[0]
    return next((d for d in outs if int(d["index"]) == index), outs[0])
