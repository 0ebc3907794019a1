"""Sparsity counted on the kernels a .tflite really holds (not on the Keras model that produced it).

A kernel is the filter input of CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, CONV_3D or TRANSPOSE_CONV,
followed through a DEQUANTIZE when the weights are stored as float16 or int8 for a float op. Its last
axis is the input axis for CONV_2D ([out, h, w, in]) and FULLY_CONNECTED ([out, in]), so groups of
consecutive values along it are the groups that M:N sparsity constrains.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.errors import ModelFormatError
from edgekit.runtime.flatbuffer import NUMPY_TYPES, ModelView, SubgraphView, corrupt_as_format_error
from edgekit.runtime.inspect import _quantization, operators

UNPACKING = ("DEQUANTIZE", "DENSIFY")  # ops between a stored kernel and its op
KERNEL_OPS = {"CONV_2D": 1, "DEPTHWISE_CONV_2D": 1, "FULLY_CONNECTED": 1, "CONV_3D": 1, "TRANSPOSE_CONV": 1}


def group_zeros(values: np.ndarray, n: int) -> np.ndarray:
    """Zeros in each group of `n` consecutive values along the last axis (a partial last group is
    counted as if padded with zeros)."""
    rows = values.reshape(-1, values.shape[-1]) == 0
    pad = (-rows.shape[1]) % n
    if pad:
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=True)
    return rows.reshape(rows.shape[0], -1, n).sum(axis=-1)


def kernel_sparsity(model: bytes | ModelView, *, group: int | None = None) -> list[dict[str, Any]]:
    """One entry per kernel of the first subgraph: op, tensor name, shape, dtype, zero share; with `group`,
    also the fewest zeros found in any `group` consecutive values along the input axis."""
    view = ModelView.of(model, "model")
    with corrupt_as_format_error():
        return _kernels(view, group)


def _kernels(view: ModelView, group: int | None) -> list[dict[str, Any]]:
    _, sub, ops = operators(view)
    unpacked = {op.outputs[0]: op.inputs[0] for _, name, op in ops  # DEQUANTIZE / DENSIFY output -> its input
                if name in UNPACKING and op.inputs and op.outputs}
    found = []
    for index, name, op in ops:
        slot = KERNEL_OPS.get(name)
        if slot is None or len(op.inputs) <= slot:
            continue
        t_index = op.inputs[slot]
        for _ in range(len(UNPACKING)):  # float16 sparse weights: DENSIFY, then DEQUANTIZE
            t_index = unpacked.get(t_index, t_index)
        entry = _kernel(view, sub, t_index, group)
        if entry is not None:
            found.append({"op_index": index, "op": name, **entry})
    return found


def _kernel(view: ModelView, sub: SubgraphView, t_index: int, group: int | None) -> dict[str, Any] | None:
    """The zero share of one kernel tensor; None when it holds no readable values or zero is not a stored 0."""
    if not 0 <= t_index < len(sub.tensors):
        raise ModelFormatError(f"model: a kernel input points to tensor {t_index} of {len(sub.tensors)}")
    tensor = sub.tensors[t_index]
    data = view.buffer_bytes(tensor.buffer)
    dtype = tensor.type_name or str(tensor.type)
    np_type = NUMPY_TYPES.get(dtype)
    if data is None or np_type is None:
        return None
    shape = tensor.shape or (len(data),)
    values = np.frombuffer(data, np_type)
    if tensor.sparse:  # stored sparse (TFLite's sparsity table; a DENSIFY op unpacks it): the values kept
        size = int(np.prod(shape))
        if values.size > size:
            raise ModelFormatError(f"tensor {t_index}: {values.size} stored values for shape {shape}")
        return {"tensor": tensor.name, "shape": list(shape), "dtype": dtype.lower(), "stored": "sparse",
                "sparsity": round(1.0 - float(np.count_nonzero(values)) / max(1, size), 4)}
    if values.size != int(np.prod(shape)):
        raise ModelFormatError(f"tensor {t_index}: {values.size} values for shape {shape}")
    values = values.reshape(shape)
    q = _quantization(tensor)
    if q is not None and np.issubdtype(np_type, np.integer):
        zero_points = np.asarray(q["zero_points"])
        if np.any(zero_points != 0):
            return None  # asymmetric weights: zero is not a stored 0; kernels are symmetric in TFLite
    entry = {"tensor": tensor.name, "shape": list(shape), "dtype": dtype.lower(),
             "sparsity": round(float(np.mean(values == 0)), 4)}
    if group is not None:
        zeros = group_zeros(values, group)
        entry["min_zeros_per_group"] = int(zeros.min()) if zeros.size else 0
    return entry


def sparse_weights(model: bytes | ModelView) -> dict[str, Any] | None:
    """Where a file stores weights in TFLite's sparse format (tensors with a sparsity table, which DENSIFY
    ops unpack): how many, and whether XNNPACK's sparse kernels can run on this CPU (`xnnpack_sparse_path`,
    with `why`). None for a file without them. Read without the schema module, so also beside tflite-runtime.

    What XNNPACK does with them (its delegate and subgraph rewrite): weights that reach a node through
    DENSIFY set its sparse-inference hint; it then runs a chain that starts with a 3x3 stride-2 convolution
    of 3 channels and ends in a global average pooling in channels-first order, with sparse kernels for the
    1x1 convolutions of at least 2/3 zeros (float32; float16 only with Arm's fp16 arithmetic). On x86 it
    does so only without AVX: its sparse kernels are SSE ones, and with AVX its dense ones are faster. Which
    kernels ran is not reported back by LiteRT: this is whether they can."""
    view = ModelView.of(model, "model")
    with corrupt_as_format_error():  # tensors with a sparsity table: no schema module needed (tflite-runtime)
        stored = sum(t.sparse for sub in view.subgraphs for t in sub.tensors)
    if not stored:
        return None
    can, why = _xnnpack_sparse_here()
    return {"tensors": stored, "xnnpack_sparse_path": can, "why": why}


def _xnnpack_sparse_here() -> tuple[bool, str]:
    import platform

    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686", "x86"):
        flags = _cpu_flags()
        if flags is None:
            return False, "x86: its CPU flags are not readable here; XNNPACK runs its sparse kernels only without AVX"
        if "avx" in flags:
            return False, ("XNNPACK runs its sparse kernels on x86 only without AVX (they are SSE kernels; with AVX "
                           "its dense ones are faster): this CPU has AVX, so the file runs dense here")
        return True, "x86 without AVX: XNNPACK may run the sparse kernels where the graph qualifies"
    if machine.startswith(("arm", "aarch64")):
        return True, "Arm: XNNPACK runs the sparse kernels where the graph qualifies (float16 needs fp16 arithmetic)"
    return False, f"{machine}: XNNPACK's sparse kernels are for Arm and x86 without AVX"


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None
