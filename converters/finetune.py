"""The training stages of `edgekit convert`: bridge -> prune with fine-tuning -> QAT, each measured.

Training data comes from class folders through the runtime preprocessing (the same code calibration,
bench and the device use) into a tf.data pipeline. With more than one accelerator visible the stages run
under tf.distribute.MirroredStrategy.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from edgekit.converters._tf import import_tf
from edgekit.converters.bridge import to_tf_keras
from edgekit.converters.pruning import PruningCallback, Structure, prunable_variables
from edgekit.converters.qat import calibrate_ranges, quantize_aware, widen_dead_ranges
from edgekit.converters.training import dataset
from edgekit.errors import CalibrationError, ConversionError, MissingDependencyError, ModelFormatError, UsageError

DEFAULT_LR = {"prune": 1e-3, "qat": 1e-5}
RANGE_SAMPLES = 512  # training samples that set the QAT ranges before fine-tuning
# Adam's update is m / sqrt(v): the size of a gradient hardly matters, but one above ~1e19 squares to inf in v
# and the weights turn NaN. QAT of a pruned EfficientNetB0 has gradients of 1e21 at its stem from the first
# step (its loss stays 2.3); clipping each gradient value keeps its sign and keeps v finite.
GRADIENT_CLIP = 1e6


@dataclass(frozen=True)
class FinetuneSpec:
    prune: float = 0.0
    schedule: str = "polynomial"
    structure: Structure = Structure("unstructured")
    qat: bool = False
    epochs: int = 3
    batch_size: int = 32
    lr: float | None = None  # None: DEFAULT_LR per stage
    skip_layers: frozenset[str] = frozenset()
    logdir: Path | None = None
    seed: int = 0


@dataclass(frozen=True)
class LabelledData:
    x: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]
    source: str


@dataclass
class FinetuneResult:
    model: Any  # tf_keras model to convert (QAT when spec.qat)
    pruned: Any = None  # the pruned float tf_keras model, when pruning ran
    stages: list[dict[str, Any]] = field(default_factory=list)
    accuracy: dict[str, float] = field(default_factory=dict)  # stage -> top-1 on the validation data
    replicas: int = 1
    bridge: dict[str, Any] = field(default_factory=dict)
    pruned_layers: list[str] = field(default_factory=list)
    qat_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    kept_float: dict[str, str] = field(default_factory=dict)  # QAT: layer -> class kept float, output quantized
    widened_ranges: list[str] = field(default_factory=list)  # QAT: activation ranges that saw only zeros
    range_samples: int = 0


def select_strategy(devices: list[str] | None = None):
    """MirroredStrategy over `devices`, or over every GPU when more than one is visible; else the default."""
    tf = import_tf()
    if devices is None:
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] if len(gpus) > 1 else None
    if devices and len(devices) > 1:
        return tf.distribute.MirroredStrategy(devices=devices)
    return tf.distribute.get_strategy()


def top1(predict: Callable[[np.ndarray], np.ndarray], data: LabelledData) -> float:
    return float(np.mean(np.argmax(predict(data.x), axis=-1) == data.y))


def _outputs_probabilities(model, x: np.ndarray) -> bool:
    y = np.asarray(model(x[:64], training=False))
    return bool(np.all(y >= 0) and np.allclose(y.sum(axis=-1), 1.0, atol=1e-3))


def _check_labels(model, data: LabelledData, what: str) -> None:
    outputs = model.outputs[0].shape[-1]
    if len(data.classes) != outputs:
        raise CalibrationError(f"{data.source}: has {len(data.classes)} classes, the model outputs {outputs} scores",
                               param=what)


def _fit(model, data: LabelledData, spec: FinetuneSpec, lr: float, probabilities: bool, callbacks: list,
         stage: str, progress) -> None:
    """Keras progress lines (one per epoch) when `progress` is set, else quiet."""
    import tf_keras

    model.compile(optimizer=tf_keras.optimizers.Adam(lr, clipvalue=GRADIENT_CLIP),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=not probabilities),
                  metrics=["accuracy"])
    if spec.logdir is not None:
        callbacks = callbacks + [tf_keras.callbacks.TensorBoard(log_dir=str(spec.logdir / stage))]
    ds = dataset(data.x, data.y, batch_size=spec.batch_size, seed=spec.seed)
    callbacks = callbacks + [tf_keras.callbacks.TerminateOnNaN()]
    if progress is not None:
        progress(f"{stage}: fine-tuning for {spec.epochs} epoch(s) at learning rate {lr:g}")
    history = model.fit(ds, epochs=spec.epochs, callbacks=callbacks, verbose=2 if progress is not None else 0,
                        shuffle=False)
    losses = history.history.get("loss", [])
    if not np.all(np.isfinite(losses)) or not all(np.all(np.isfinite(w)) for w in model.get_weights()):
        what = ("the loss became NaN" if not np.all(np.isfinite(losses))
                else f"the weights stopped being finite (last loss {losses[-1]:.4g})")
        raise ConversionError(
            f"{stage} fine-tuning diverged: {what}; nothing was written. Try a lower `training.lr` (it was {lr:g}) "
            "or a larger `training.batch_size`"
        )


@contextlib.contextmanager
def _seeded_random_layers(model, seed: int) -> Iterator[None]:
    """Layers that draw random numbers in training (Dropout, noise, random augmentation) seed themselves
    from the global generators, so a repeatable fine-tune of such a model needs the global seed. It is
    set only then, and Python's, numpy's and TensorFlow's global seeds are put back afterwards (TF's
    per-op seed counter restarts: ops created later under a seed the caller had set draw as if just
    seeded). The data order never needs it: the tf.data shuffle has its own seed."""
    if not any(hasattr(m, "_random_generator") for m in model.submodules):  # tf_keras BaseRandomLayer
        yield
        return
    import tf_keras
    from tensorflow.python.eager import context
    from tf_keras.src import backend

    saved = (random.getstate(), np.random.get_state(), context.global_seed(),
             getattr(backend._SEED_GENERATOR, "generator", None))  # tf_keras' own layer-seed source
    tf_keras.utils.set_random_seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        import_tf().random.set_seed(saved[2])
        backend._SEED_GENERATOR.generator = saved[3]


def finetune(keras_model, spec: FinetuneSpec, train: LabelledData, val: LabelledData | None, *,
             devices: list[str] | None = None, progress=None) -> FinetuneResult:
    """Prune and/or train with quantization in the loop; every stage is timed, and evaluated on `val`.
    `spec.seed` fixes the data order (and, for models with random layers, their draws; see
    `_seeded_random_layers`): the same seed fine-tunes alike."""
    with contextlib.ExitStack() as scope:
        return _finetune(keras_model, spec, train, val, devices, progress, scope)


def _finetune(keras_model, spec: FinetuneSpec, train: LabelledData, val: LabelledData | None,
              devices: list[str] | None, progress, scope: contextlib.ExitStack) -> FinetuneResult:
    tf = import_tf()

    if keras_model is None:
        raise ModelFormatError("pruning and QAT need a Keras model (.keras, .h5); this SavedModel has no layers")
    if spec.logdir is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise MissingDependencyError("writes TensorBoard logs: pip install tensorboard", param="training.logdir")
    strategy = select_strategy(devices)
    result = FinetuneResult(model=None, replicas=strategy.num_replicas_in_sync)
    predict = lambda m: (lambda x: np.asarray(m.predict(x, verbose=0, batch_size=256)))  # noqa: E731

    started = time.perf_counter()
    with strategy.scope():
        bridged = to_tf_keras(keras_model, train.x[:64])
    model = bridged.model
    scope.enter_context(_seeded_random_layers(model, spec.seed))
    result.bridge = {"from": bridged.source_api, "max_abs_error": bridged.max_abs_error,
                     "flattened": list(bridged.flattened)}
    result.stages.append({"stage": "bridge", "seconds": round(time.perf_counter() - started, 2)})
    unknown = sorted(spec.skip_layers - {layer.name for layer in model.layers})
    if unknown:
        raise UsageError(f"names no layer {', '.join(unknown)}; the model has "
                         + ", ".join(layer.name for layer in model.layers if type(layer).__name__ != "InputLayer"),
                         param="training.skip_layers")
    _check_labels(model, train, "training.data")
    if val is not None:
        _check_labels(model, val, "training.val_data")
        result.accuracy["float"] = top1(predict(model), val)
    probabilities = _outputs_probabilities(model, train.x)
    steps = int(np.ceil(len(train.x) / spec.batch_size)) * spec.epochs

    if spec.prune > 0:
        started = time.perf_counter()
        with strategy.scope():
            variables = prunable_variables(model, spec.skip_layers, spec.structure)
            if not variables:
                raise ModelFormatError("the model has no layer edgekit can prune (Dense, Conv, DepthwiseConv)")
            writer = None
            if spec.logdir is not None:
                writer = tf.summary.create_file_writer(str(spec.logdir / "prune" / "sparsity"))
            callback = PruningCallback(variables, target=spec.prune, schedule=spec.schedule,
                                       structure=spec.structure, end_step=max(1, int(0.7 * steps)),
                                       frequency=max(1, steps // 20), writer=writer)
            _fit(model, train, spec, spec.lr or DEFAULT_LR["prune"], probabilities, [callback], "prune", progress)
        result.pruned = model
        result.pruned_layers = sorted({layer for layer, _ in variables})
        result.stages.append({"stage": "prune", "seconds": round(time.perf_counter() - started, 2)})
        if val is not None:
            result.accuracy["pruned"] = top1(predict(model), val)

    if spec.qat:
        started = time.perf_counter()
        with strategy.scope():
            qat_model, result.kept_float = quantize_aware(model, skip=spec.skip_layers,
                                                          preserve_sparsity=spec.prune > 0)
            result.qat_ranges, dead = calibrate_ranges(qat_model, model, train.x[:RANGE_SAMPLES], spec.batch_size)
            result.range_samples = min(len(train.x), RANGE_SAMPLES)
            _fit(qat_model, train, spec, spec.lr or DEFAULT_LR["qat"], probabilities, [], "qat", progress)
            result.widened_ranges = dead + [n for n in widen_dead_ranges(qat_model) if n not in dead]
        model = qat_model
        result.stages.append({"stage": "qat", "seconds": round(time.perf_counter() - started, 2)})
        if val is not None:
            result.accuracy["qat"] = top1(predict(model), val)
    result.model = model
    return result
