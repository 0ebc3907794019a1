"""Feeding representative-dataset samples to a model being converted, through a `Runner`
(edgekit.runtime.backend): the converters calibrate and score through the same seam as the runtime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgekit.runtime.backend import Runner, get_backend


def size_open_inputs(runner: Runner, sample) -> bool:
    """An open-size model (-1 in an input's signature, a U-Net's height and width) at the size of `sample`
    (a representative-dataset entry in input order): unsized, LiteRT allocates it at 1 and its kernels fail
    ("input->dims->data[1] > 0"). Call before `allocate`; a dict sample goes through the signature, which
    sizes itself. True when an input was resized (allocate again)."""
    if isinstance(sample, dict):
        return False
    resized = False
    for d, x in zip(runner.input_details(), sample):
        if -1 in tuple(d.get("shape_signature", ())) and tuple(d["shape"]) != np.shape(x):
            runner.resize(d["index"], list(np.shape(x)))
            resized = True
    return resized


def feeder(runner: Runner) -> Callable[[Any], None]:
    """Runs the model on one representative-dataset sample (a list in input order, or a dict by signature
    name), the inputs of a float model."""
    details = runner.input_details()
    set_input, invoke = runner.set, runner.invoke

    def feed(sample) -> None:
        if isinstance(sample, dict):
            runner.run_signature(None, **sample)
            return
        for d, x in zip(details, sample):
            set_input(d["index"], np.asarray(x, d["dtype"]))
        invoke()

    return feed


def debugging_interpreter(tflite: bytes, sample) -> Runner:
    """A runner of `tflite` whose every intermediate tensor stays readable (`get`), sized for `sample`: the
    builtin kernels without the XNNPACK delegate."""
    runner = get_backend().runner(model_content=tflite, num_threads=None, preserve_all_tensors=True,
                                  allocate=False)
    size_open_inputs(runner, sample)
    runner.allocate()
    return runner
