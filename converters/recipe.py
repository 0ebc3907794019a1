"""The convert recipe: what the user asked for, as a tree of small frozen specs, each option declared once.

    ConvertRecipe                       model, mode, io, output, force, calib, input_shapes, seed, strict,
    ├── preprocessing: Preprocessing    target, trust_model
    ├── calibration: CalibrationSpec
    ├── pruning: PruningSpec | None
    ├── training: TrainingSpec | None
    ├── budget: BudgetSpec | None
    └── info: ModelInfo

Every field carries its declaration (`option(...)`: default, help, CLI flag, choices, a check). The specs
validate themselves on construction, before TensorFlow is imported; `edgekit convert`'s options are made
from the same declarations (edgekit/cli_options.py), and a test proves that every flag maps to exactly one
field and back. Errors name parameters as the API spells them ("calibration.samples"); the CLI shows flags.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from edgekit.declare import declared, option  # the options' declarations (edgekit/declare.py)
from edgekit.errors import MissingDependencyError, UsageError
from edgekit.runtime.delegates import TARGETS
from edgekit.runtime.preprocess import RESIZE_MODES

MODES = ("float32", "float16", "dynamic", "int8", "int16x8")
IO_TYPES = {
    "float32": ("float32",),
    "float16": ("float32",),
    "dynamic": ("float32",),
    "int8": ("float32", "int8", "uint8"),
    "int16x8": ("float32", "int16"),
}
NEEDS_CALIBRATION = frozenset({"int8", "int16x8"})
CALIB_EFFORTS = ("fast", "standard", "thorough")  # int8.choose.EFFORTS, said here without importing it
CALIB_LOSSES = ("auto", "kl", "mse", "cosine", "iou")  # auto and metrics.LOSSES
CALIB_METHODS = ("auto", "minmax", "percentile", "mse", "ema", "extremes", "bias", "aeq", "equalize", "gptq")  # auto and the int8
# candidates of converters/int8/registry.py (tests/test_int8_candidates.py checks they are the same)
SCHEDULES = ("polynomial", "constant")  # converters/pruning.py builds these


class _Spec:
    """Validation shared by the specs: choices and each field's own check, named `PARAM.field`."""

    PARAM = ""
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # every spec is a dataclass

    def _param(self, name: str) -> str:
        return f"{self.PARAM}.{name}" if self.PARAM else name

    def _check_declared(self) -> None:
        for f, opt in declared(self):
            value = getattr(self, f.name)
            for v in (value.values() if isinstance(value, dict) else [value]):
                if v is None:
                    continue
                if opt.choices is not None and v not in opt.choices:
                    raise UsageError(f"must be one of {', '.join(map(str, opt.choices))}, got {v!r}",
                                     param=self._param(f.name))
                why = opt.check(v) if opt.check is not None else None
                if why:
                    raise UsageError(why, param=self._param(f.name))

    def to_dict(self, defaults: bool = True) -> dict[str, Any]:
        """The spec as JSON; without `defaults`, only what differs from them (`from_dict` restores the rest)."""
        return {f.name: _plain(getattr(self, f.name), defaults) for f in dataclasses.fields(self)
                if f.init and (defaults or not _is_default(f, getattr(self, f.name)))}


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return value == f.default
    if f.default_factory is not dataclasses.MISSING:
        return value == f.default_factory()
    return False


def _plain(value: Any, defaults: bool = True) -> Any:
    if isinstance(value, _Spec):
        return value.to_dict(defaults)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {"" if k is None else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _at_least(n: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be at least {n:g}, got {v:g}"


def _fraction(v: float) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


def _positive(v: float) -> str | None:
    return None if v > 0 else f"must be positive, got {v:g}"


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"takes a number or comma-separated numbers, got {text!r}") from None


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"takes comma-separated sizes like 1,224,224,3, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _per_input(value: Any, convert: Callable[[Any], Any]) -> Any:
    return {name: convert(v) for name, v in value.items()} if isinstance(value, dict) else convert(value)


def _float_tuple(value: Any) -> tuple[float, ...]:
    values = (value,) if isinstance(value, (int, float)) else tuple(value)
    if not values:
        raise UsageError("needs at least one value")
    return tuple(float(v) for v in values)


def _path_or_none(value: Any) -> Path | None:
    return None if value is None else Path(value)


def _zero_if_none(value: float | None) -> float:
    return 0.0 if value is None else value


@dataclass(frozen=True)
class Preprocessing(_Spec):
    """How images become model input: one value for every image input, or {input name: value}."""

    PARAM = "preprocessing"
    resize: str | dict = option("stretch", "stretch (default), letterbox or crop; NAME=MODE per image input.",
                                choices=RESIZE_MODES, per_input=True)
    mean: tuple[float, ...] | dict = option((0.0,), "Subtracted from pixels [0] (one value or per channel; "
                                            "NAME=... per input).", per_input=True, parse=_floats)
    std: tuple[float, ...] | dict = option((1.0,), "Pixels are divided by it after the mean [1] (NAME=... per "
                                           "input).", per_input=True, parse=_floats,
                                           check=lambda v: "must not be 0" if 0 in v else None)

    def __post_init__(self) -> None:
        for key in ("mean", "std"):
            try:
                object.__setattr__(self, key, _per_input(getattr(self, key), _float_tuple))
            except UsageError as exc:
                raise UsageError(str(exc), param=self._param(key)) from None
        self._check_declared()


@dataclass(frozen=True)
class CalibrationSpec(_Spec):
    """How calibration samples are drawn from `calib` and how int8 activation ranges are set."""

    PARAM = "calibration"
    samples: int = option(200, "Calibration samples drawn (a seeded shuffle).", flag="--calib-samples", kind=int,
                          check=_at_least(1))
    method: str = option("auto", "--int8 activation ranges (bias: min/max with each layer's bias corrected for "
                         "its int8 kernel's mean error; aeq: ai-edge-quantizer's recipe; equalize: min/max "
                         "after cross-layer equalisation of the weights); auto measures each on held-out "
                         "calibration data and keeps the best.", flag="--calib-method",
                         choices=CALIB_METHODS)
    ranking_samples: int = option(400, "Range methods other than minmax are ranked and fitted on up to this "
                                  "many samples: the calibration ones and more of the same source, never the "
                                  "verification ones.", flag="--calib-ranking-samples", kind=int,
                                  check=_at_least(1))
    ranking_max: int = option(1600, "Where two int8 candidates are too close for the held-out samples to tell "
                              "apart, auto draws more of the same source in rounds (each doubling the count), "
                              "up to this many held-out samples.", flag="--calib-ranking-max", kind=int,
                              check=_at_least(1))
    loss: str = option("auto", "What auto compares int8 candidates on, per sample against the float model: kl "
                       "(class scores: the KL divergence of the softmax), mse (values, landmarks, boxes), "
                       "cosine (embeddings), iou (masks and maps: the elements over --calib-threshold); auto: "
                       "kl for class scores, mse otherwise.", flag="--calib-loss", choices=CALIB_LOSSES)
    threshold: float = option(0.5, "The value over which an element of a mask or map counts as set, for "
                              "--calib-loss iou.", flag="--calib-threshold", kind=float)
    effort: str = option("standard", "How far auto goes: fast: the cheap candidates only (ranges, bias correction, "
                         "equalisation); standard: GPTQ weight rounding after them where it can pay, and auto's "
                         "own work within 1.5x the converter's conversion time; thorough: every candidate and "
                         "weight rounding scored always, with no limit of time.", flag="--calib-effort",
                         choices=CALIB_EFFORTS)

    def __post_init__(self) -> None:
        self._check_declared()


@dataclass(frozen=True)
class Structure:
    """A `pruning.structure` parsed: what pruning keeps in each group of weights (converters/pruning.py)."""

    kind: str  # "unstructured", "m:n", "block" or "channels" (whole output channels: converters/channels.py)
    m: int = 0  # m:n: non-zero weights kept per group
    n: int = 1  # group size along the input axis (m:n and block)

    @classmethod
    def parse(cls, text: str | None) -> Structure:
        if text is None or text == "unstructured":
            return cls("unstructured")
        if text == "channels":
            return cls("channels")
        if text.startswith("block:"):
            size = text[len("block:"):]
            if not size.isdigit() or int(size) < 2:
                raise UsageError(f"block:K needs a block size K >= 2, got {text!r}", param="pruning.structure")
            return cls("block", 0, int(size))
        parts = text.split(":")
        if len(parts) == 2 and all(p.isdigit() for p in parts) and 0 < int(parts[0]) < int(parts[1]):
            return cls("m:n", int(parts[0]), int(parts[1]))
        raise UsageError(
            f"must be unstructured, M:N (at most M non-zero weights in every N, e.g. 2:4), block:K or channels, got "
            f"{text!r}",
            param="pruning.structure")

    @property
    def implied_sparsity(self) -> float | None:
        return 1.0 - self.m / self.n if self.kind == "m:n" else None

    def __str__(self) -> str:
        return {"unstructured": "unstructured", "m:n": f"{self.m}:{self.n}", "block": f"block:{self.n}",
                "channels": "channels"}[self.kind]


@dataclass(frozen=True)
class PruningSpec(_Spec):
    """Pruning with fine-tuning (needs `training.data`)."""

    PARAM = "pruning"
    sparsity: float | None = option(None, "Prune this share of each kernel's weights (of each layer's output "
                                    "channels with --prune-structure channels), in [0, 1), with fine-tuning.",
                                    flag="--prune", kind=float,
                                    check=lambda v: None if 0.0 <= v < 1.0 else
                                    f"is the share of weights to remove, in [0, 1); got {v:g}")
    schedule: str = option("polynomial", "Ramp the sparsity up, or hold it from the start.",
                           flag="--prune-schedule", choices=SCHEDULES)
    structure: str | None = option(None, "unstructured (default), M:N (at most M non-zero in every N, e.g. 2:4) "
                                   "or block:K (K consecutive weights), along the input axis; or channels (whole "
                                   "output channels of Conv and Dense layers removed: a smaller, faster model).",
                                   flag="--prune-structure")

    def __post_init__(self) -> None:
        if self.sparsity is None:
            raise UsageError("needs `pruning.sparsity`", param=self._param("structure" if self.structure
                                                                            else "schedule"))
        self._check_declared()
        implied = Structure.parse(self.structure).implied_sparsity
        if implied is not None and self.sparsity != 0.0 and abs(self.sparsity - implied) > 5e-4:
            raise UsageError(f"{self.structure} removes {implied:g} of the weights; set `pruning.sparsity` to "
                             f"{implied:g} (got {self.sparsity:g})", param=self._param("structure"))


@dataclass(frozen=True)
class TrainingSpec(_Spec):
    """Fine-tuning data and settings, for pruning and quantization-aware training. With int8 and neither,
    `data` also serves as calibration data."""

    PARAM = "training"
    data: Path | None = option(None, "Image class folders, or a .npz/.npy of samples and labels, for "
                               "--prune/--qat.", flag="--train-data", kind=Path)
    val_data: Path | None = option(None, "Labelled data to measure the training stages on [0.15 of "
                                   "--train-data, held out: never trained on].", kind=Path)
    qat: bool = option(False, "Quantization-aware training before --int8 (no --calib needed).", kind=bool)
    epochs: int = option(3, "Fine-tuning epochs per training stage.", kind=int, check=_at_least(1))
    batch_size: int = option(32, "Fine-tuning batch size.", kind=int, check=_at_least(1))
    lr: float | None = option(None, "Adam learning rate [1e-3 pruning, 1e-5 QAT].", kind=float, check=_positive)
    skip_layers: tuple[str, ...] = option((), "Comma-separated layer names to leave unpruned and in float.",
                                          parse=_names)
    logdir: Path | None = option(None, "Write TensorBoard logs (losses, sparsity) here.", kind=Path)
    distill: float = option(0.0, "Weight (0-1) of the original model's outputs in the targets of the "
                            "fine-tuning after pruning (knowledge distillation; 0: the labels only).",
                            kind=float, check=_fraction)
    warn_drop: float = option(1.0, "Warn, naming the cause and the measured fix, where training loses more top-1 "
                              "points than this against the original model on the held-out data (a warning; "
                              "--max-drop is the budget that fails).", kind=float,
                              check=lambda v: None if v >= 0 else f"is in top-1 points and must be >= 0, got {v:g}")

    def __post_init__(self) -> None:
        for key in ("data", "val_data", "logdir"):
            object.__setattr__(self, key, _path_or_none(getattr(self, key)))
        object.__setattr__(self, "skip_layers", tuple(self.skip_layers))
        # distill not given (None): the labels alone (it was a TypeError in the fine-tune)
        object.__setattr__(self, "distill", _zero_if_none(self.distill))
        self._check_declared()


@dataclass(frozen=True)
class BudgetSpec(_Spec):
    """The accuracy-budget autopilot (int8): keep the most sensitive layers at int16 activations or in float
    until the drop fits."""

    PARAM = "budget"
    max_drop: float | None = option(None, "int8 accuracy budget in top-1 points: keep the most sensitive layers "
                                    "in float until the drop on --eval-data fits (after --prune in a float mode: "
                                    "a check of the file against the original model; exit 11 when missed).",
                                    kind=float,
                                    check=lambda v: None if v >= 0 else f"is in top-1 points and must be >= 0, "
                                    f"got {v:g}")
    eval_data: Path | None = option(None, "Labelled data (class folders or .npz/.npy with labels) for "
                                    "--max-drop.", kind=Path)
    int16: bool = option(False, "--max-drop also tries the sensitive layers at int16 activations (int16x8), "
                         "before float: int8-sized, but TFLite's int16 kernels are reference ones; of the mixes "
                         "that meet the budget, the fastest file is kept.", flag="--max-drop-int16", kind=bool)

    def __post_init__(self) -> None:
        object.__setattr__(self, "eval_data", _path_or_none(self.eval_data))
        if self.max_drop is None:
            given = "budget.eval_data" if self.eval_data is not None or not self.int16 else "budget.int16"
            raise UsageError("is for the accuracy budget: set `budget.max_drop` too", param=given)
        if self.eval_data is None:
            raise UsageError("needs `budget.eval_data` (labelled data) to measure the drop",
                             param="budget.max_drop")
        self._check_declared()


@dataclass(frozen=True)
class ModelInfo(_Spec):
    """What the standard TFLite Metadata says about the model (MediaPipe Tasks, Android Studio and the TFLite
    Support library show it), and what no tensor tells: an audio input's sample rate, the class names."""

    PARAM = "info"
    name: str | None = option(None, "Model name in the TFLite Metadata [the model file's stem].")
    description: str | None = option(None, "Model description in the TFLite Metadata.")
    version: str | None = option(None, "Model version in the TFLite Metadata.", flag="--model-version")
    author: str | None = option(None, "Author in the TFLite Metadata.")
    license: str | None = option(None, "Licence in the TFLite Metadata.")
    sample_rate: int | None = option(None, "An audio input's sample rate in Hz (its TFLite Metadata says so; "
                                     "MediaPipe's AudioClassifier needs it).", kind=int, check=_positive)
    labels: Path | tuple[str, ...] | None = option(None, "Class names, one per line (or, from Python, a list), "
                                                   "for data without class folders: stored as class folders' "
                                                   "names are; their count must be the model's classes.",
                                                   kind=Path)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _labels(self.labels))
        self._check_declared()


def _labels(value: Any) -> Path | tuple[str, ...] | None:
    """A labels file as a Path, or class names given in memory as a tuple of one-line, non-empty strings."""
    if value is None or isinstance(value, (str, Path)):
        return None if value is None else Path(value)
    names = tuple(value) if isinstance(value, (list, tuple)) else None
    if not names:
        raise UsageError(f"is a labels file or a list of class names, got {value!r}", param="info.labels")
    for name in names:
        if not isinstance(name, str) or not name.strip() or "\n" in name:
            raise UsageError(f"class names are non-empty one-line strings, got {name!r}", param="info.labels")
    return tuple(n.strip() for n in names)


class InMemorySource:
    """Calibration data handed over in memory (converters/calibration.py's InMemoryCalibration is one): the
    recipe keeps it as given, where a path becomes a Path."""


def _calib_sources(calib: Any, in_memory: type) -> Any:
    """Paths become Path; {input name: source} keeps its names (None: the only input)."""
    if calib is None or isinstance(calib, in_memory):
        return calib
    if isinstance(calib, dict):
        if not calib:
            raise UsageError("names no input", param="calib")
        return {k: v if isinstance(v, in_memory) else Path(v) for k, v in calib.items()}
    return Path(calib)


def _input_shapes(shapes: Any) -> dict | None:
    """{name or None: (1, H, W, C)}: every dimension a positive integer, but for the batch (the first), which
    may be left open (None, or -1 as TFLite writes it) to keep it open."""
    if shapes is None or shapes == {}:
        return None
    if not isinstance(shapes, dict):
        shapes = {None: shapes}
    out = {}
    for name, shape in shapes.items():
        name = name or None  # "" in a stored recipe: the only input
        dims = tuple(shape)
        batch = () if not dims or dims[0] in (None, -1) else dims[:1]
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in batch + dims[1:]):
            raise UsageError(f"{'' if name is None else name + '='}{shape}: every dimension must be a positive "
                             "integer, e.g. 1,224,224,3 (-1 for the batch keeps it open)", param="input_shape")
        out[name] = (dims[0] if batch else None, *dims[1:])
    return out


def _mode_or_default(mode: str | None, target: str | None) -> tuple[str, bool]:
    """`mode`, or where it is not given (None) float16 for target gpu, else float32; and whether the target
    chose it."""
    if mode is not None:
        return mode, False
    return ("float16" if target == "gpu" else "float32"), target == "gpu"


def aeq_unusable(io: str) -> str | None:
    """Why ai-edge-quantizer (converters/int8/aeq_quantizer.py) cannot quantize a conversion with this `io`, or None."""
    if io != "float32":
        return f"ai-edge-quantizer writes float32 inputs and outputs here, not {io}"
    if not aeq_installed():
        return "ai-edge-quantizer is not installed (pip install litert-quantizer)"
    return None


def aeq_installed() -> bool:
    return importlib.util.find_spec("litert_quantizer") is not None


SPECS = {"preprocessing": Preprocessing, "calibration": CalibrationSpec, "pruning": PruningSpec,
         "training": TrainingSpec, "budget": BudgetSpec, "info": ModelInfo}


@dataclass(frozen=True)
class ConvertRecipe(_Spec):
    """One conversion. Bad combinations are rejected here, before TensorFlow is imported."""

    model: Path
    mode: str = option(None, "float32, float16, dynamic, int8 or int16x8 [float16 with --target gpu, else "
                              "float32].", flag="", choices=MODES)
    io: str = option("float32", "Input/output type.", choices=("float32", "int8", "uint8", "int16"))
    calib: Any = option(None, "Image folder or .npy/.npz array; NAME=DIR|FILE per input of a multi-input model "
                        "(or one .npz keyed by input name).", per_input=True, parse=Path)
    input_shape: dict | None = option(None, "Fix an open input size: 1,H,W,C, or NAME=1,H,W,C per input. A batch "
                                      "of -1 stays open; else an open batch becomes 1 where an op needs a fixed "
                                      "shape or the target asks for one (said when done).",
                                      per_input=True, parse=_shape)
    seed: int = option(0, "Seed of the calibration shuffle and of training.", kind=int)
    strict: bool = option(False, "An unreadable calibration or training image is an error (default: skip, "
                          "report).", kind=bool)
    output: Path | None = option(None, "Output .tflite [<model>.<mode>.tflite].", kind=Path, aliases=("-o",))
    force: bool = option(False, "Replace an existing output file.", kind=bool)
    target: str | None = option(None, "Record delegate hints for this accelerator (gpu: float16 unless a mode is "
                                "given).", choices=TARGETS)
    trust_model: bool = option(False, "Allow objects from modules outside Keras in the model config (Lambda is "
                               "refused anyway).", kind=bool)
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)
    pruning: PruningSpec | None = None
    training: TrainingSpec | None = None
    budget: BudgetSpec | None = None
    info: ModelInfo = field(default_factory=ModelInfo)
    mode_from_target: bool = field(default=False, init=False)  # mode=None became float16 for target="gpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        mode, from_target = _mode_or_default(self.mode, self.target)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "mode_from_target", from_target)
        object.__setattr__(self, "calib", _calib_sources(self.calib, InMemorySource))
        object.__setattr__(self, "input_shape", _input_shapes(self.input_shape))
        object.__setattr__(self, "output", _path_or_none(self.output))
        for name, kind in SPECS.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, kind(**value))
        self._check_declared()
        if self.io not in IO_TYPES[self.mode]:
            raise UsageError(f"is not available with `mode={self.mode}`; choose {', '.join(IO_TYPES[self.mode])}",
                             param="io")
        self._check_training()
        self._check_budget()
        self._check_calibration()

    def _check_calibration(self) -> None:
        if self.mode in NEEDS_CALIBRATION and self.calib is None and self.train_data is None:
            raise UsageError(f"`mode={self.mode}` needs calibration data: set `calib` (an image folder or "
                             ".npy/.npz file)")
        batched = [shape for shape in (self.input_shape or {}).values() if shape[0] not in (None, 1)]
        if self.mode in NEEDS_CALIBRATION and batched:
            raise UsageError(f"fixes a batch of {batched[0][0]}, but `mode={self.mode}` calibrates one sample at a "
                             "time: give a batch of 1, or -1 to keep it open (the runtime then takes any batch)",
                             param="input_shape")
        method = self.calibration.method
        if method != "auto" and (self.mode != "int8" or self.qat):
            raise UsageError("sets int8 post-training ranges: it needs `mode=int8` without `training.qat` (QAT "
                             "learns its ranges)", param="calibration.method")
        if method == "aeq" and aeq_unusable(self.io):
            error = UsageError if aeq_installed() else MissingDependencyError
            raise error(aeq_unusable(self.io), param="calibration.method")

    def _check_training(self) -> None:
        training = self.training or TrainingSpec()
        if training.qat and self.mode != "int8":
            raise UsageError(f"trains for 8-bit integer inference; use it with `mode=int8`, not `mode={self.mode}`",
                             param="training.qat")
        if self.trains and training.data is None:
            what = "training.qat" if training.qat else "pruning.sparsity"
            raise UsageError("fine-tunes the model: set `training.data` (labelled data)", param=what)
        if training.distill and not self.prune:
            raise UsageError("distils the original model into the pruned one: set `pruning.sparsity`",
                             param="training.distill")
        if self.training is not None and self.pruning is None and not training.qat:  # pruning to 0 is a no-op
            given = [f.name for f, _ in declared(training) if getattr(training, f.name) != f.default]
            if given and not (given == ["data"] and self.mode in NEEDS_CALIBRATION):
                names = ", ".join(f"`training.{n}`" for n in given)
                raise UsageError(f"{names} apply to training: set `pruning.sparsity` and/or `training.qat`")

    def _check_budget(self) -> None:
        if self.budget is None:
            return
        if self.mode != "int8" and self.trains:  # a check of the trained file against the original model
            if self.budget.int16:
                raise UsageError("tries int16 activations in the int8 autopilot; it needs `mode=int8`",
                                 param="budget.int16")
            return
        if self.mode != "int8" or self.io != "float32":
            raise UsageError("chooses which layers of an int8 model stay in float; it needs `mode=int8` with "
                             "`io=float32` (or, in another mode, `pruning.sparsity` to check the pruned file "
                             "against)", param="budget.max_drop")
        if self.qat:
            raise UsageError("works on post-training int8; it cannot be combined with `training.qat`",
                             param="budget.max_drop")

    # -- what the pipeline asks of it ----------------------------------------------------------------
    @property
    def qat(self) -> bool:
        return self.training is not None and self.training.qat

    @property
    def prune(self) -> float | None:
        return None if self.pruning is None else self.pruning.sparsity

    @property
    def train_data(self) -> Path | None:
        return None if self.training is None else self.training.data

    @property
    def max_drop(self) -> float | None:
        return None if self.budget is None else self.budget.max_drop

    @property
    def trains(self) -> bool:
        """Whether a training stage runs: pruning with a sparsity above 0, or QAT."""
        return self.qat or bool(self.prune)

    @property
    def output_path(self) -> Path:
        """`output`, or `<model>.<mode>.tflite` beside the input."""
        if self.output is not None:
            return self.output
        base = self.model.name.rstrip("/")
        stem = base.rsplit(".", 1)[0] if self.model.suffix in (".keras", ".h5", ".hdf5") else base
        return self.model.parent / f"{stem}.{self.mode}.tflite"

    @property
    def notes(self) -> tuple[str, ...]:
        """What edgekit chose for the user, said out loud (never silently)."""
        if self.mode_from_target:
            return ("target gpu without a mode: converting to float16, the GPU delegate's native precision "
                    "(choose a mode to change it)",)
        return ()

    def to_dict(self, defaults: bool = True) -> dict[str, Any]:
        """The recipe as JSON (the model's metadata stores it without defaults, as `recipe`); in-memory data
        shows as its source."""
        d = super().to_dict(defaults)
        d.update(model=str(self.model), mode=self.mode, io=self.io)
        calib = self.calib
        if calib is not None or defaults:
            d["calib"] = None if calib is None else {str(k): str(v) for k, v in calib.items()} \
                if isinstance(calib, dict) else str(calib)
        return d

    def stored(self) -> dict[str, Any]:
        """What the model's metadata keeps as `recipe`: every option that differs from its default, but for
        what the metadata says elsewhere (`mode`, `io`, `source`, `calibration.source`) and where the file was
        written. With mode, io and model added back, `from_dict` rebuilds the recipe."""
        d = self.to_dict(defaults=False)
        for key in ("model", "mode", "io", "output", "force", "calib"):
            d.pop(key, None)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConvertRecipe:
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown recipe keys: {', '.join(unknown)}")
        return cls(**d)
