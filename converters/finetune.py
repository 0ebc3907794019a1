"""The training stages of `edgekit convert`: bridge -> prune with fine-tuning -> QAT, each measured.

Training data comes from the one sample reader (class folders through the runtime preprocessing, the same
code calibration, bench and the device use; arrays with targets per output: converters/targets.py) into a
tf.data pipeline. With more than one accelerator visible the stages run under tf.distribute.MirroredStrategy.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters._tf import import_tf
from edgekit.converters.bridge import to_tf_keras
from edgekit.converters.epochs import epoch_lines, fit_step
from edgekit.converters.pruning import PruningCallback, Structure, prunable_variables
from edgekit.converters.qat import calibrate_ranges, quantize_aware, widen_dead_ranges
from edgekit.converters.targets import Target, outputs_of, primary, target_for
from edgekit.converters.training import dataset
from edgekit.errors import CalibrationError, ConversionError, MissingDependencyError, ModelFormatError, UsageError

DEFAULT_LR = {"prune": 1e-3, "qat": 1e-5}
RANGE_SAMPLES = 512  # training samples that set the QAT ranges before fine-tuning
# Adam's update is m / sqrt(v): the size of a gradient hardly matters, but one above ~1e19 squares to inf in v
# and the weights turn NaN. QAT of a pruned EfficientNetB0 has gradients of 1e21 at its stem from the first
# step (its loss stays 2.3); clipping each gradient value keeps its sign and keeps v finite.
GRADIENT_CLIP = 1e6
# The fine-tune after channel pruning ends on an exponential moving average of its weights whose horizon
# (1 / (1 - decay) steps) is this share of its steps, then re-estimates BatchNorm statistics under it
# (`_fit(average=True)`). On the benchmark MobileNetV2 0.35 (tests/perf/test_channel_pruning.py) the
# last weights of 16 epochs at a constant rate lost 2.50, 3.06 and 4.72 points at seeds 0, 1 and 2, the
# average -0.28, 1.67 and 3.06.
AVERAGE_SHARE = 0.15


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
    distill: float = 0.0  # the pruning stage's weight of the original model's outputs (converters/distill.py)


@dataclass(frozen=True)
class LabelledData:
    x: np.ndarray  # the first (or only) input's samples
    y: np.ndarray | None  # class indices for a single output (None: `targets` holds every output's)
    classes: tuple[str, ...]
    source: str
    others: tuple[np.ndarray, ...] = ()  # the other inputs' samples, in the model's input order
    targets: dict[str, np.ndarray] = field(default_factory=dict)  # output name -> targets, in output order
    names: tuple[str, ...] = ()  # the inputs' names, when there are several

    def by_name(self) -> np.ndarray | dict[str, np.ndarray]:
        """The samples as a .tflite is fed: the array, or a dict by input name."""
        return dict(zip(self.names, self.inputs)) if self.others else self.x

    @property
    def inputs(self) -> np.ndarray | list[np.ndarray]:
        """What the model is fed: the array, or one per input."""
        return [self.x, *self.others] if self.others else self.x

    def head(self, n: int) -> np.ndarray | list[np.ndarray]:
        return [self.x[:n], *(a[:n] for a in self.others)] if self.others else self.x[:n]


@dataclass
class FinetuneResult:
    model: Any  # tf_keras model to convert (QAT when spec.qat)
    pruned: Any = None  # the pruned float tf_keras model, when pruning ran
    stages: list[dict[str, Any]] = field(default_factory=list)
    accuracy: dict[str, float] = field(default_factory=dict)  # stage -> top-1 on the validation data
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> output -> its metric
    targets: list[Target] = field(default_factory=list)  # what each output was trained towards
    val_targets: list[Target] = field(default_factory=list)  # the same outputs' targets on the validation data
    replicas: int = 1
    bridge: dict[str, Any] = field(default_factory=dict)
    pruned_layers: list[str] = field(default_factory=list)
    channels: dict[str, Any] | None = None  # channel pruning: what each layer kept, what stayed whole, the cost
    qat_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    kept_float: dict[str, str] = field(default_factory=dict)  # QAT: layer -> class kept float, output quantized
    widened_ranges: list[str] = field(default_factory=list)  # QAT: activation ranges that saw only zeros
    range_samples: int = 0
    distill: dict[str, Any] | None = None  # the pruning stage's distillation: weight per output, temperature
    weight_average: dict[str, Any] | None = None  # channel pruning's fine-tune: the average's decay, BatchNorm update
    classes: dict[str, np.ndarray] = field(default_factory=dict)  # stage -> top-1 class per validation sample
    curve: list[float] = field(default_factory=list)  # pruning: validation top-1 before and after each epoch


def select_strategy(devices: list[str] | None = None):
    """MirroredStrategy over `devices`, or over every GPU when more than one is visible; else the default."""
    tf = import_tf()
    if devices is None:
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] if len(gpus) > 1 else None
    if devices and len(devices) > 1:
        return tf.distribute.MirroredStrategy(devices=devices)
    return tf.distribute.get_strategy()


def targets_of(model, data: LabelledData, param: str) -> list[Target]:
    """What each output of `model` trains towards, from `data` (converters/targets.py)."""
    outputs = outputs_of(model(data.head(64), training=False))
    if data.targets:
        given = list(data.targets.items())
    elif len(outputs) == 1 and data.y is not None:
        given = [(model.output_names[0], data.y)]
    else:
        raise CalibrationError(f"{data.source}: the model has {len(outputs)} outputs ({', '.join(model.output_names)})"
                               ": key each output's targets by its name in a .npz", param=param)
    if len(given) != len(outputs):
        raise CalibrationError(f"{data.source}: targets for {len(given)} output(s), the model has {len(outputs)}",
                               param=param)
    targets = []
    for (name, y), tensor, sample in zip(given, model.outputs, outputs):
        target = target_for(name, tuple(tensor.shape), y, sample, source=data.source, param=param)
        units = tensor.shape[-1]
        if target.kind == "classes" and data.classes and len(data.classes) != units:
            raise CalibrationError(f"{data.source}: has {len(data.classes)} classes, the model outputs {units} scores",
                                   param=param)
        targets.append(target)
    return targets


def scores_of(predict: Callable[[Any], Any], data: LabelledData, targets: list[Target],
              classes: dict[str, np.ndarray] | None = None, stage: str = "") -> dict[str, float]:
    """Each output's metric (converters/targets.py) on `data`; `predict` returns the outputs in any form
    `outputs_of` reads. With `classes`, the top-1 class per sample of the primary output, where it scores one
    class per sample, goes there as `stage` (the paired comparisons of converters/compression.py)."""
    outputs = outputs_of(predict(data.inputs), [t.output for t in targets])
    at = per_sample_output(targets)
    if classes is not None and at is not None:
        classes[stage] = np.argmax(np.asarray(outputs[at]).reshape(len(targets[at].y), -1), axis=-1)
    return {t.output: t.score(out) for t, out in zip(targets, outputs)}


def per_sample_output(targets: list[Target]) -> int | None:
    """The index of the primary output (`targets.primary`'s) where it scores one class per sample, else None
    (a map's pixels, values, masks: no paired top-1 comparison)."""
    at = next((i for i, t in enumerate(targets) if t.accuracy), None)
    return at if at is not None and targets[at].kind == "classes" and targets[at].y.ndim == 1 else None


def _measure(result: FinetuneResult, stage: str, predict, val: LabelledData, targets: list[Target]) -> None:
    result.scores[stage] = scores_of(predict, val, targets, result.classes, stage)
    accuracy = primary(result.scores[stage], targets)
    if accuracy is not None:
        result.accuracy[stage] = accuracy


def held_out_curve(val: LabelledData, targets: list[Target], curve: list[float]):
    """A tf_keras callback that appends the primary score on `val` to `curve` before training and after each
    epoch (the weights as trained, before any average): is the fine-tune still gaining when it stops?"""
    import tf_keras

    def score(model) -> None:
        scores = scores_of(lambda x: model.predict(x, verbose=0, batch_size=256), val, targets)
        value = primary(scores, targets)
        if value is not None:
            curve.append(round(value, 6))

    class HeldOutCurve(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None) -> None:
            score(self.model)

        def on_epoch_end(self, epoch: int, logs=None) -> None:
            score(self.model)

    return HeldOutCurve()


def _steps(data: LabelledData, spec: FinetuneSpec) -> int:
    """Optimizer steps of one training stage: `spec.epochs` passes over `data` in batches."""
    return int(np.ceil(len(data.x) / spec.batch_size)) * spec.epochs


def average_decay(steps: int) -> float:
    """The decay of the weight average over a fine-tune of `steps` (AVERAGE_SHARE); 0, no average, where its
    horizon would be under two steps."""
    horizon = AVERAGE_SHARE * steps
    return 0.0 if horizon < 2 else min(0.999, 1.0 - 1.0 / horizon)


def reestimate_batch_norm(model, inputs, batch_size: int, seed: int) -> dict[str, int]:
    """Each trainable BatchNormalization's moving mean and variance recomputed as the plain mean of its batch
    statistics over `inputs` (an array, or a list of them; whole batches in a seeded shuffle, as in training)
    under the model's weights as they are: SWA's BatchNorm update (Izmailov et al. 2018), for weights that
    are an average no batch was ever run through. Eager calls in training mode with a momentum of 1 - 1/k
    at the k-th batch; each layer's momentum is put back."""
    layers = [m for m in model.submodules if hasattr(m, "moving_mean") and hasattr(m, "momentum")
              and m.trainable and not getattr(m, "renorm", False)]
    if not layers:
        return {"batch_norm_layers": 0, "batches": 0}
    arrays = inputs if isinstance(inputs, list) else [inputs]
    order = np.random.default_rng(seed).permutation(len(arrays[0]))
    batches = [order[i:i + batch_size] for i in range(0, max(1, len(order) - batch_size + 1), batch_size)]
    saved = [m.momentum for m in layers]
    try:
        for k, rows in enumerate(batches, 1):
            for m in layers:
                m.momentum = 1.0 - 1.0 / k
            batch = [a[rows] for a in arrays]
            model(batch if isinstance(inputs, list) else batch[0], training=True)
    finally:
        for m, momentum in zip(layers, saved):
            m.momentum = momentum
    return {"batch_norm_layers": len(layers), "batches": len(batches)}


def _fit(model, data: LabelledData, spec: FinetuneSpec, lr: float, targets: list[Target], callbacks: list,
         stage: str, progress, average: bool = False) -> dict[str, Any] | None:
    """One progress line per epoch (converters/epochs.py) when `progress` is set; Keras itself prints
    nothing. With `average`, the model ends on an exponential moving average of its weights
    (`average_decay`) with its BatchNorm statistics re-estimated under it, and what was done is returned."""
    import tf_keras

    several = len(targets) > 1
    decay = average_decay(_steps(data, spec)) if average else 0.0
    model.compile(optimizer=tf_keras.optimizers.Adam(lr, clipvalue=GRADIENT_CLIP, use_ema=decay > 0,
                                                     ema_momentum=decay or 0.99),
                  loss=[t.loss() for t in targets] if several else targets[0].loss(),
                  metrics=[t.fit_metrics() for t in targets] if several else targets[0].fit_metrics())
    if spec.logdir is not None:
        callbacks = callbacks + [tf_keras.callbacks.TensorBoard(log_dir=str(spec.logdir / stage))]
    ds = dataset(data.inputs, [t.y for t in targets] if several else targets[0].y, batch_size=spec.batch_size,
                 seed=spec.seed)
    callbacks = callbacks + [tf_keras.callbacks.TerminateOnNaN()]
    if progress is not None:
        progress(fit_step(stage, spec.epochs, lr))
        callbacks = callbacks + [epoch_lines(stage, spec.epochs, progress)]
    history = model.fit(ds, epochs=spec.epochs, callbacks=callbacks, verbose=0, shuffle=False)
    losses = history.history.get("loss", [])
    if not np.all(np.isfinite(losses)) or not all(np.all(np.isfinite(w)) for w in model.get_weights()):
        what = ("the loss became NaN" if not np.all(np.isfinite(losses))
                else f"the weights stopped being finite (last loss {losses[-1]:.4g})")
        raise ConversionError(
            f"{stage} fine-tuning diverged: {what}; nothing was written. Try a lower `training.lr` (it was {lr:g}) "
            "or a larger `training.batch_size`"
        )
    if decay > 0:
        return {"decay": round(decay, 6), **reestimate_batch_norm(model, data.inputs, spec.batch_size, spec.seed)}
    return None


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


@dataclass
class _Stage:
    """What the pruning and QAT stages share: they fit `train` towards `targets`, time themselves and score
    the model on `val` into `result`."""

    spec: FinetuneSpec
    train: LabelledData
    val: LabelledData | None
    targets: list[Target]
    val_targets: list[Target]
    strategy: Any
    progress: Any
    result: FinetuneResult
    predict: Callable[[Any], Callable[[Any], Any]]
    teaching: list | None = None  # the pruning stage's targets with the original model's outputs (distillation)

    def _done(self, name: str, model, started: float) -> None:
        self.result.stages.append({"stage": name, "seconds": round(time.perf_counter() - started, 2)})
        if self.val is not None:
            _measure(self.result, "pruned" if name == "prune" else name, self.predict(model), self.val,
                     self.val_targets)

    def _curve(self) -> list:
        """The held-out curve's callback where there is held-out data and a top-1 to follow."""
        if self.val is None or not any(t.accuracy for t in self.val_targets):
            return []
        return [held_out_curve(self.val, self.val_targets, self.result.curve)]

    def prune(self, model, steps: int):
        spec, started = self.spec, time.perf_counter()
        with self.strategy.scope():
            variables = prunable_variables(model, spec.skip_layers, spec.structure)
            if not variables:
                raise ModelFormatError("the model has no layer edgekit can prune (Dense, Conv, DepthwiseConv, "
                                       "Embedding, LSTM, GRU, MultiHeadAttention)")
            writer = None
            if spec.logdir is not None:
                writer = import_tf().summary.create_file_writer(str(spec.logdir / "prune" / "sparsity"))
            callback = PruningCallback(variables, target=spec.prune, schedule=spec.schedule,
                                       structure=spec.structure, end_step=max(1, int(0.7 * steps)),
                                       frequency=max(1, steps // 20), writer=writer)
            _fit(model, self.train, spec, spec.lr or DEFAULT_LR["prune"], self.teaching or self.targets,
                 [callback, *self._curve()], "prune", self.progress)
        self.result.pruned = model
        self.result.pruned_layers = sorted({layer for layer, _ in variables})
        self._done("prune", model, started)
        return model

    def retrain(self, model):
        """Fine-tune a model whose channels were removed (converters/channels.py): no masks, only training."""
        spec, started = self.spec, time.perf_counter()
        with self.strategy.scope():
            self.result.weight_average = _fit(model, self.train, spec, spec.lr or DEFAULT_LR["prune"],
                                              self.teaching or self.targets, self._curve(), "prune", self.progress,
                                              average=True)
        self.result.pruned = model
        self._done("prune", model, started)
        return model

    def qat(self, model):
        spec, result, started = self.spec, self.result, time.perf_counter()
        with self.strategy.scope():
            sparse = spec.prune > 0 and spec.structure.kind != "channels"  # channel pruning leaves no zeros to keep
            qat_model, result.kept_float = quantize_aware(model, skip=spec.skip_layers, preserve_sparsity=sparse)
            result.qat_ranges, dead = calibrate_ranges(qat_model, model, self.train.head(RANGE_SAMPLES),
                                                       spec.batch_size)
            result.range_samples = min(len(self.train.x), RANGE_SAMPLES)
            _fit(qat_model, self.train, spec, spec.lr or DEFAULT_LR["qat"], self.targets, [], "qat", self.progress)
            result.widened_ranges = dead + [n for n in widen_dead_ranges(qat_model) if n not in dead]
        self._done("qat", qat_model, started)
        return qat_model


def _narrowed(keras_model, spec: FinetuneSpec, result: FinetuneResult):
    """The Keras 3 model with `spec.prune` of each prunable channel space removed (converters/channels.py), its
    report in `result.channels`; `spec.skip_layers` keep their channels."""
    from edgekit.converters import channels

    found = channels.plan(keras_model, spec.prune, skip=spec.skip_layers)
    if not found.removes_anything:
        why = "; ".join(sorted({f"{name}: {reason}" for name, reason in found.left.items()})[:4]) or "no Conv or Dense"
        raise ModelFormatError(f"channel pruning finds no channel it can remove ({why})")
    smaller = channels.shrink(keras_model, found)
    result.pruned_layers = sorted(name for name, (before, after) in found.kept.items() if after < before)
    result.channels = {"kept": {name: list(pair) for name, pair in found.kept.items()}, "left": dict(found.left),
                       "macs": [channels.macs(keras_model), channels.macs(smaller)],
                       "parameters": [int(keras_model.count_params()), int(smaller.count_params())]}
    return smaller


def _teaching(teacher, train: LabelledData, targets: list[Target], weight: float,
              result: FinetuneResult) -> list | None:
    """The pruning stage's targets with `weight` of the original model's outputs on the training samples
    (converters/distill.py); None, with why in `result.distill`, where those would not fit in memory."""
    from edgekit.converters.distill import MAX_TEACHER_BYTES, TEMPERATURE, Distilled

    names = [t.output for t in targets]
    one = outputs_of(teacher(train.head(1)), names)
    size = 4 * len(train.x) * sum(int(np.prod(o.shape[1:])) for o in one)
    if size > MAX_TEACHER_BYTES:
        result.distill = {"outputs": dict.fromkeys(names, 0.0), "why": (
            f"the original model's outputs on the training data would take {size / 2**20:.0f} MiB (more than "
            f"{MAX_TEACHER_BYTES // 2**20} MiB)")}
        return None
    result.distill = {"outputs": dict.fromkeys(names, weight), "temperature": TEMPERATURE}
    return [Distilled.of(t, out, weight) for t, out in zip(targets, outputs_of(teacher(train.inputs), names))]


def finetune(keras_model, spec: FinetuneSpec, train: LabelledData, val: LabelledData | None, *,
             devices: list[str] | None = None, progress=None) -> FinetuneResult:
    """Prune and/or train with quantization in the loop; every stage is timed, and evaluated on `val`.
    `spec.seed` fixes the data order (and, for models with random layers, their draws; see
    `_seeded_random_layers`): the same seed fine-tunes alike."""
    with contextlib.ExitStack() as scope:
        return _finetune(keras_model, spec, train, val, devices, progress, scope)


def _finetune(keras_model, spec: FinetuneSpec, train: LabelledData, val: LabelledData | None,
              devices: list[str] | None, progress, scope: contextlib.ExitStack) -> FinetuneResult:
    if keras_model is None:
        raise ModelFormatError("pruning and QAT need a Keras model (.keras, .h5); this SavedModel has no layers")
    if spec.logdir is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise MissingDependencyError("writes TensorBoard logs: pip install tensorboard", param="training.logdir")
    strategy = select_strategy(devices)
    result = FinetuneResult(model=None, replicas=strategy.num_replicas_in_sync)
    predict = lambda m: (lambda x: m.predict(x, verbose=0, batch_size=256))  # noqa: E731

    started = time.perf_counter()
    narrowed = _narrowed(keras_model, spec, result) if spec.prune > 0 and spec.structure.kind == "channels" else None
    with strategy.scope():
        bridged = to_tf_keras(keras_model if narrowed is None else narrowed, train.head(64))
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
    targets = result.targets = targets_of(model, train, "training.data")
    val_targets = result.val_targets = [] if val is None else targets_of(model, val, "training.val_data")
    teacher = predict(model if narrowed is None else keras_model)  # the model as it came, before pruning
    if val is not None:
        _measure(result, "float", teacher, val, val_targets)
    steps = _steps(train, spec)
    stage = _Stage(spec, train, val, targets, val_targets, strategy, progress, result, predict)
    if spec.prune > 0 and spec.distill > 0:
        stage.teaching = _teaching(teacher, train, targets, spec.distill, result)
    if spec.prune > 0:
        model = stage.prune(model, steps) if narrowed is None else stage.retrain(model)
    if spec.qat:
        model = stage.qat(model)
    result.model = model
    return result
