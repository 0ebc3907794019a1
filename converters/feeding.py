"""Feeding representative-dataset samples to a LiteRT interpreter of a model being converted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def size_open_inputs(interp, sample) -> bool:
    """An open-size model (-1 in an input's signature, a U-Net's height and width) at the size of `sample`
    (a representative-dataset entry in input order): unsized, LiteRT allocates it at 1 and its kernels fail
    ("input->dims->data[1] > 0"). Call before allocate_tensors; a dict sample goes through the signature
    runner, which sizes itself. True when an input was resized (allocate again)."""
    if isinstance(sample, dict):
        return False
    resized = False
    for d, x in zip(interp.get_input_details(), sample):
        if -1 in tuple(d.get("shape_signature", ())) and tuple(d["shape"]) != np.shape(x):
            interp.resize_tensor_input(d["index"], list(np.shape(x)))
            resized = True
    return resized


def feeder(interp) -> Callable[[Any], None]:
    """Runs the interpreter on one representative-dataset sample (a list in input order, or a dict by
    signature name), the inputs of a float model."""
    details = interp.get_input_details()

    def feed(sample) -> None:
        if isinstance(sample, dict):
            runner = interp.get_signature_runner()
            runner(**sample)
            return
        for d, x in zip(details, sample):
            interp.set_tensor(d["index"], np.asarray(x, d["dtype"]))
        interp.invoke()

    return feed


def debugging_interpreter(tflite: bytes, sample):
    """An interpreter of `tflite` whose every intermediate tensor stays readable, sized for `sample`: the
    builtin kernels without the XNNPACK delegate (LiteRT does not warn that keeping them is for debugging,
    as it does for the default resolver)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_content=tflite, experimental_preserve_all_tensors=True,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    size_open_inputs(interp, sample)
    interp.allocate_tensors()
    return interp
