"""Pruned float16 / float32 files in TFLite's sparse format against their dense files (issue 30): a
MobileNet-v1-shaped model (a 3x3 stride-2 stem of 3 channels, depthwise + 1x1 blocks, global average pooling:
the graph XNNPACK's sparse path is written for) with 80 % of each 1x1 kernel zeroed by magnitude, converted
as edgekit converts a pruned model (`quantize.configure(..., sparse=True)`). Prints size and invoke p50 at one
and two threads (interleaved, one run) and whether XNNPACK can run its sparse kernels on this CPU. Where it
can, the sparse file must be >= 1.3x faster; where it cannot (x86 with AVX), the run must show it: the same
speed as dense. `python -m pytest -m perf -s tests/perf/test_sparse_float.py` (about a minute)."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytestmark = pytest.mark.perf
ROUNDS = 60
ZEROS = 0.8


def _mobilenet_like(size: int = 96):
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((size, size, 3))
    h = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(32, 3, strides=2, padding="same",
                                                                   use_bias=False)(inp)))
    for width, stride in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (1024, 2)):
        h = layers.ReLU(6.0)(layers.BatchNormalization()(layers.DepthwiseConv2D(3, strides=stride, padding="same",
                                                                                use_bias=False)(h)))
        h = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(width, 1, use_bias=False)(h)))
    model = keras.Model(inp, layers.Dense(10, activation="softmax")(layers.GlobalAveragePooling2D()(h)))
    for layer in model.layers:
        if isinstance(layer, layers.Conv2D) and layer.kernel_size == (1, 1):
            w = layer.kernel.numpy()
            layer.kernel.assign(np.where(np.abs(w) >= np.quantile(np.abs(w), ZEROS), w, 0.0))
    return model


def _p50s(files: dict[str, bytes], threads: int) -> dict[str, float]:
    from ai_edge_litert.interpreter import Interpreter

    interps = {}
    for name, content in files.items():
        it = Interpreter(model_content=content, num_threads=threads)
        it.allocate_tensors()
        d = it.get_input_details()[0]
        it.set_tensor(d["index"], np.random.default_rng(0).random(d["shape"], np.float32))
        for _ in range(5):
            it.invoke()
        interps[name] = it
    times: dict[str, list[float]] = {n: [] for n in files}
    for r in range(ROUNDS):
        for name in (list(files) if r % 2 == 0 else list(files)[::-1]):
            start = time.perf_counter()
            interps[name].invoke()
            times[name].append(time.perf_counter() - start)
    return {n: float(np.median(t)) for n, t in times.items()}


def test_sparse_float_files_against_dense():
    from edgekit.converters._tf import import_tf
    from edgekit.converters.quantize import configure, run_converter
    from edgekit.runtime.sparsity import sparse_weights

    tf = import_tf()
    model = _mobilenet_like()
    files = {}
    for mode in ("float32", "float16"):
        for sparse in (False, True):
            converter = tf.lite.TFLiteConverter.from_keras_model(model)
            files[f"{mode}{' sparse' if sparse else ''}"] = run_converter(configure(converter, mode, "float32", None,
                                                                                   sparse=sparse))
    said = sparse_weights(files["float16 sparse"])
    print(f"\nsparse weights: {said['tensors']} kernels; XNNPACK sparse path here: {said['xnnpack_sparse_path']} "
          f"({said['why']})")
    for mode in ("float32", "float16"):
        dense, sparse = files[mode], files[f"{mode} sparse"]
        size = len(sparse) / len(dense)
        ratios = []
        for threads in (1, 2):
            p50 = _p50s({"dense": dense, "sparse": sparse}, threads)
            ratios.append(p50["sparse"] / p50["dense"])
            print(f"{mode} {ZEROS:.0%} zeros in the 1x1 kernels, {threads} thread(s): p50 dense "
                  f"{p50['dense'] * 1e3:.2f} ms, sparse {p50['sparse'] * 1e3:.2f} ms ({ratios[-1]:.2f}x); "
                  f"size {size:.2f}x")
        assert size <= 0.45
        if said["xnnpack_sparse_path"]:
            assert min(ratios) <= 1 / 1.3, ratios
        else:
            assert all(0.8 <= r <= 1.25 for r in ratios), ratios  # runs dense: the same kernels, the same time
