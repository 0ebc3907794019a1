"""Magnitude pruning with fine-tuning, on tf_keras models (see bridge.py).

One mask mechanism serves three structures, all grouped along the kernel's input axis, which is the
contiguous axis of TFLite's CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED weights:
- unstructured: the smallest weights of each kernel, whatever their position;
- M:N: at most M non-zero weights in every N consecutive ones (2:4 is the pattern sparse kernels use);
- block:K: K consecutive weights pruned together (runs of zeros, which gzip and sparse formats reward).
A schedule ramps each kernel's sparsity from 0 to the target (polynomial, as in Zhu & Gupta 2017) or
holds it from the first step (constant); after every training step the masks are applied again, so a
pruned weight stays zero. Biases and normalisation parameters are never pruned. Transposed convolutions,
embedding tables, a recurrence's gate matrices (LSTM, GRU, SimpleRNN, Bidirectional) and attention's
query/key/value/output projections are pruned unstructured only.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from edgekit.converters.recipe import Structure  # the parsed `pruning.structure`, declared with the spec

SCHEDULES = ("polynomial", "constant")  # the recipe and the CLI offer these
# weights that pruning removes, per layer class (tf_keras names); each has its input axis at -2
PRUNABLE = {
    "Dense": ("kernel",),
    "Conv1D": ("kernel",),
    "Conv2D": ("kernel",),
    "Conv3D": ("kernel",),
    "DepthwiseConv2D": ("depthwise_kernel",),
    "SeparableConv2D": ("depthwise_kernel", "pointwise_kernel"),
}
# weights pruned only unstructured: in TFLite their input axis is not the innermost one of a kernel in Keras's
# axis -2 (transposed convolutions: Keras holds (h, w, out, in)), or they are no conv/dense kernel at all (an
# embedding table, a recurrence's gate matrices, attention's einsum projections); tfmot prunes the first ones
UNSTRUCTURED_ONLY = {
    "Conv1DTranspose": ("kernel",),
    "Conv2DTranspose": ("kernel",),
    "Conv3DTranspose": ("kernel",),
    "Embedding": ("embeddings",),
    "LSTM": ("cell.kernel", "cell.recurrent_kernel"),
    "GRU": ("cell.kernel", "cell.recurrent_kernel"),
    "SimpleRNN": ("cell.kernel", "cell.recurrent_kernel"),
    "Bidirectional": ("forward_layer.cell.kernel", "forward_layer.cell.recurrent_kernel",
                      "backward_layer.cell.kernel", "backward_layer.cell.recurrent_kernel"),
    "MultiHeadAttention": ("_query_dense.kernel", "_key_dense.kernel", "_value_dense.kernel",
                           "_output_dense.kernel"),
}
# layers with weights that hold no kernel to prune (they stay as they are, like tfmot does)
NOTHING_TO_PRUNE = frozenset({"BatchNormalization", "LayerNormalization", "GroupNormalization", "PReLU",
                              "Normalization", "Rescaling",
                              "LayerScale", "ConstantOp"})


def sparsity_at(step: int, *, target: float, schedule: str, end_step: int) -> float:
    """The sparsity a kernel should have after `step` training steps."""
    if schedule == "constant" or end_step <= 0:
        return target
    progress = min(1.0, step / end_step)
    return target * (1.0 - (1.0 - progress) ** 3)


def _groups(weights: np.ndarray, size: int, pad_value: float) -> np.ndarray:
    """|weights| as (rows, groups, size): `size` consecutive values along the input axis (-2), the last
    group padded with `pad_value`."""
    moved = np.moveaxis(np.abs(weights), -2, -1).reshape(-1, weights.shape[-2])
    pad = (-moved.shape[1]) % size
    if pad:
        moved = np.pad(moved, ((0, 0), (0, pad)), constant_values=pad_value)
    return moved.reshape(moved.shape[0], -1, size)


def _ungroup(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    inputs = shape[-2]
    flat = mask.reshape(mask.shape[0], -1)[:, :inputs]
    moved_shape = shape[:-2] + (shape[-1], inputs)
    return np.moveaxis(flat.reshape(moved_shape), -1, -2)


def mask_for(weights: np.ndarray, sparsity: float, structure: Structure) -> np.ndarray:
    """A 0/1 mask that removes a `sparsity` share of `weights` by magnitude, in `structure`."""
    if sparsity <= 0.0:
        return np.ones_like(weights)
    if structure.kind == "unstructured":
        k = int(math.floor(sparsity * weights.size))
        if k == 0:
            return np.ones_like(weights)
        order = np.argsort(np.abs(weights), axis=None, kind="stable")
        mask = np.ones(weights.size, weights.dtype)
        mask[order[:k]] = 0
        return mask.reshape(weights.shape)
    if structure.kind == "m:n":
        # padding counts as zeros already pruned (as runtime.sparsity counts a partial group)
        groups = _groups(weights, structure.n, -1.0)
        implied = structure.implied_sparsity
        assert implied is not None  # m:n implies one (for the type checker)
        drop = int(round(min(1.0, sparsity / implied) * (structure.n - structure.m)))
        ranks = np.argsort(np.argsort(groups, axis=-1, kind="stable"), axis=-1, kind="stable")
        mask = (ranks >= drop).astype(weights.dtype)
    else:  # block: whole groups go, the weakest by mean magnitude first, until `sparsity` of the weights
        groups = _groups(weights, structure.n, np.nan)
        score = np.nanmean(groups, axis=-1).ravel()
        real = np.sum(~np.isnan(groups), axis=-1).ravel()  # a partial last group holds fewer weights
        order = np.argsort(score, kind="stable")
        k = int(np.searchsorted(np.cumsum(real[order]), math.floor(sparsity * weights.size), side="right"))
        keep = np.ones(score.size, weights.dtype)
        keep[order[:k]] = 0
        mask = np.repeat(keep.reshape(groups.shape[0], groups.shape[1], 1), structure.n, axis=-1)
    return _ungroup(mask, weights.shape).astype(weights.dtype)


def prunable_variables(model, skip: frozenset[str], structure: Structure) -> list[tuple[str, Any]]:
    """(layer name, variable) for every kernel to prune; an unknown layer with weights is an error, and so
    is a structure whose groups would not be contiguous in the layer's TFLite weights."""
    from edgekit.errors import ModelFormatError

    found = []
    for layer in model.layers:
        name = type(layer).__name__
        if layer.name in skip or not layer.weights:
            continue
        scattered = name == "Conv3D" or getattr(layer, "depth_multiplier", 1) != 1
        if structure.kind != "unstructured" and name in PRUNABLE and scattered:
            raise ModelFormatError(
                f"layer {layer.name!r} ({name}) stores its TFLite weights with the input axis not innermost, so "
                f"{structure} groups would not be consecutive there; add it to `training.skip_layers` or prune "
                "unstructured"
            )
        if name in UNSTRUCTURED_ONLY and structure.kind != "unstructured":
            raise ModelFormatError(
                f"layer {layer.name!r} ({name}) is pruned unstructured only (its TFLite weights hold no {structure} "
                "groups along a kernel's innermost axis); add it to `training.skip_layers` or prune unstructured"
            )
        attrs = PRUNABLE.get(name) or UNSTRUCTURED_ONLY.get(name)
        if attrs is not None:
            for attr in attrs:
                found.append((layer.name, functools.reduce(getattr, attr.split("."), layer)))
        elif name not in NOTHING_TO_PRUNE:
            raise ModelFormatError(
                f"layer {layer.name!r} ({name}) has weights edgekit cannot prune; add it to `training.skip_layers` "
                "to leave it dense"
            )
    return found


class PruningCallback:
    """A tf_keras callback: every `frequency` steps recompute the masks for the scheduled sparsity; after
    every step apply them. Built lazily so that this module imports without TensorFlow."""

    def __new__(cls, variables, *, target: float, schedule: str, structure: Structure, end_step: int,
                frequency: int, writer=None):
        import tensorflow as tf
        import tf_keras

        class _Callback(tf_keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.step = 0
                self.masks: list[Any] = []  # tf.constant tensors

            def _update_masks(self) -> None:
                s = sparsity_at(self.step, target=target, schedule=schedule, end_step=end_step)
                masks = [mask_for(np.asarray(v.numpy(), np.float32), s, structure) for _, v in variables]
                self.masks = [tf.constant(m, v.dtype) for m, (_, v) in zip(masks, variables)]
                if writer is not None:
                    with writer.as_default(step=self.step):
                        tf.summary.scalar("pruning/target_sparsity", s)
                        for (layer, v), m in zip(variables, masks):
                            tf.summary.scalar(f"pruning/{layer}/{v.name.split('/')[-1].split(':')[0]}",
                                              1.0 - float(m.mean()))
                    writer.flush()

            def _apply(self) -> None:
                for (_, v), m in zip(variables, self.masks):
                    v.assign(v * m)

            def on_train_begin(self, logs=None) -> None:
                self._update_masks()
                self._apply()

            def on_train_batch_end(self, batch, logs=None) -> None:
                self.step += 1
                if self.step <= end_step and self.step % frequency == 0:
                    self._update_masks()
                self._apply()

            def on_train_end(self, logs=None) -> None:
                self.step = max(self.step, end_step)
                self._update_masks()  # the final sparsity, whatever the schedule reached
                self._apply()

        return _Callback()
