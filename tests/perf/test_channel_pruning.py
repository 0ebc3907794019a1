"""Channel pruning against the dense int8 file (issue 30): a MobileNetV2 (alpha 1.0, 96x96 RGB) and a small
ResNet trained here, seeded, on the bundled digits; `--int8 --prune 0.5 --prune-structure channels` with
fine-tuning against the dense `--int8` file of the same model: invoke p50 at one and two threads (interleaved,
in one run), size, multiply-adds, and the top-1 drop against float on the 360 test digits after fine-tuning
on the labels (the default) for three seeds of the data order; at the first seed also distilled from the
float model (`--distill 0.5`) and fine-tuned for the default 3 epochs, to compare.
`python -m pytest -m perf -s tests/perf/test_channel_pruning.py` (about 20 minutes on 2 cores, most of it
training)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import edgekit
from edgekit.runtime import PreprocessSpec
from tests.helpers import labelled_images
from tests.perf.test_int8_ranges import _application, _fit

pytestmark = pytest.mark.perf
ROUNDS = 300  # interleaved rounds of (dense, pruned) per thread count; each round times INNER invokes
INNER = 10  # back to back: one 0.1 ms invoke timed alone read 0.49x-0.75x for the same pair at two threads


def _resnet(path, digits_dir):
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)

    def block(x, width, stride=1):
        h = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(
            layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)))
        h = layers.BatchNormalization(momentum=0.9)(layers.Conv2D(width, 3, padding="same", use_bias=False)(h))
        if stride != 1 or x.shape[-1] != width:
            x = layers.BatchNormalization(momentum=0.9)(layers.Conv2D(width, 1, strides=stride, use_bias=False)(x))
        return layers.ReLU()(layers.Add()([x, h]))

    inp = keras.Input((32, 32, 1))
    x = layers.ReLU()(layers.BatchNormalization(momentum=0.9)(
        layers.Conv2D(32, 3, padding="same", use_bias=False)(layers.Rescaling(1 / 255)(inp))))
    for width, stride in ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1)):
        x = block(x, width, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return _fit(keras.Model(inp, layers.Dense(10, activation="softmax")(x)), path, digits_dir, 12)


def _p50s(paths, threads: int) -> list[float]:
    from ai_edge_litert.interpreter import Interpreter

    interps = []
    for path in paths:
        interp = Interpreter(model_path=str(path), num_threads=threads)
        interp.allocate_tensors()
        d = interp.get_input_details()[0]
        interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        for _ in range(10):
            interp.invoke()
        interps.append(interp)
    times = [[] for _ in paths]
    for _ in range(ROUNDS):
        for interp, got in zip(interps, times):
            start = time.perf_counter()
            for _ in range(INNER):
                interp.invoke()
            got.append((time.perf_counter() - start) / INNER)
    return [float(np.median(t)) for t in times]


def _top1(path, x, y) -> float:
    from edgekit.runtime import Model

    return float(np.mean(Model(path).predict(x).argmax(1) == y))


def _row(name, keras_path, digits_dir, tmp_path, epochs, seeds):
    """The dense int8 file and the channel-pruned one per seed (the fine-tune's data order, the calibration
    draw), plus, at the first seed, one distilled (`distill=0.5`) and one fine-tuned for the default epochs:
    drops against float, p50 ratios of the first seed's file."""
    import keras

    reference = keras.models.load_model(keras_path)
    x, y = labelled_images(digits_dir / "test", PreprocessSpec(*reference.input_shape[1:]))
    float_top1 = float(np.mean(reference.predict(x, verbose=0).argmax(1) == y))
    dense = edgekit.convert(keras_path, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{name}.dense.tflite")

    def pruned(seed, distill=0.0, epochs=epochs):
        return edgekit.convert(keras_path, mode="int8", pruning=edgekit.PruningSpec(0.5, structure="channels"),
                               output=tmp_path / f"{name}.channels.{seed}.{distill}.{epochs}.tflite", seed=seed,
                               training=edgekit.TrainingSpec(data=digits_dir / "train", epochs=epochs, distill=distill))

    files = [pruned(seed) for seed in seeds]
    distilled, short = pruned(seeds[0], 0.5), pruned(seeds[0], epochs=edgekit.TrainingSpec().epochs)
    ch = files[0].metadata["compression"]["prune"]["channels"]
    average = files[0].metadata["compression"]["weight_average"]
    drop = {"dense": 100 * (float_top1 - _top1(dense.path, x, y)),
            "seeds": [100 * (float_top1 - _top1(f.path, x, y)) for f in files],
            "distilled": 100 * (float_top1 - _top1(distilled.path, x, y)),
            "short": 100 * (float_top1 - _top1(short.path, x, y))}
    drop["pruned"] = float(np.mean(drop["seeds"]))
    ratios = {}
    for threads in (1, 2):
        d, p = _p50s([dense.path, files[0].path], threads)
        ratios[threads] = p / d
        print(f"  {name} {threads} thread(s): invoke p50 dense {1e3 * d:.3f} ms, pruned {1e3 * p:.3f} ms, ratio {p / d:.2f}")
    print(f"{name}: float top-1 {100 * float_top1:.2f} %; int8 dense drop {drop['dense']:+.2f}, channel-pruned "
          f"(0.5, {epochs} epochs of fine-tuning on the labels, weight average decay {average['decay']:g}, "
          f"{average['batch_norm_layers']} BatchNorm layers re-estimated) drop per seed "
          f"{', '.join(f'{d:+.2f}' for d in drop['seeds'])}, mean {drop['pruned']:+.2f} (seed {seeds[0]}: --distill "
          f"0.5 {drop['distilled']:+.2f}, {edgekit.TrainingSpec().epochs} epochs {drop['short']:+.2f}); size "
          f"{dense.size_bytes} -> {files[0].size_bytes} B "
          f"({files[0].size_bytes / dense.size_bytes:.2f}x); multiply-adds {ch['macs'][0]:,} -> "
          f"{ch['macs'][1]:,} ({ch['macs'][1] / ch['macs'][0]:.2f}x)")
    return ratios, drop, float_top1


# One fine-tune's drop moves by a point or more with the data order alone, so the bound is on the mean over
# three seeds. The MobileNetV2 is alpha 1.0 at 96x96: at 64x64 (0.35: 0.05 ms an invoke, 1.0: 0.15 ms) two
# threads on a 2-vCPU VM pay a fixed ~0.09 ms an invoke in most processes (the worker's wake-up), and the
# ratio read 0.54 or 0.77 for the same pair of files; at 96x96 it read 0.50 in each of four processes. Its
# fine-tune needs 32 epochs: the 1.0 network at 64x64 lost +1.67, +1.11, +1.11 after 16 epochs on the labels
# (-0.56, +0.00, +0.00 with --distill 0.5) and +0.56, +0.00, +0.56 after 32.
MODELS = {  # name: (build(path, digits_dir), fine-tuning epochs, the float model's least top-1, seeds)
    "MobileNetV2 1.0 96x96": (lambda path, d: _application(path, d, "MobileNetV2", 20, cosine=True, alpha=1.0,
                                                           size=96), 32, 0.95, (0, 1, 2)),
    "ResNet 32x32": (_resnet, 8, 0.95, (0, 1, 2)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_channel_pruned_int8_is_faster_than_dense_int8(name, digits_dir, tmp_path):
    build, epochs, least, seeds = MODELS[name]
    short = name.split()[0]
    ratios, drop, float_top1 = _row(short, build(tmp_path / f"{short}.keras", digits_dir), digits_dir, tmp_path,
                                    epochs, seeds)
    assert float_top1 >= least  # the floor: a model trained here to >= 95 %
    assert all(r <= 0.67 for r in ratios.values()), ratios  # >= 1.5x faster at one and two threads
    assert drop["pruned"] <= 1.0, drop  # the mean over the seeds
