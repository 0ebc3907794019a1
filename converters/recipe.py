"""The convert recipe: what the user asked for, validated once, frozen, serialisable."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _per_input(value: Any, convert) -> Any:
    return {name: convert(v) for name, v in value.items()} if isinstance(value, dict) else convert(value)


def _values(value: Any) -> list:
    return list(value.values()) if isinstance(value, dict) else [value]


def _calib_sources(calib: Any, in_memory: type) -> Any:
    """Paths become Path; {input name: source} keeps its names (None: the only input)."""
    if calib is None or isinstance(calib, in_memory):
        return calib
    if isinstance(calib, dict):
        if not calib:
            raise UsageError("--calib names no input")
        return {k: v if isinstance(v, in_memory) else Path(v) for k, v in calib.items()}
    return Path(calib)


def _input_shapes(shapes: Any) -> dict | None:
    """{name or None: (1, H, W, C)}: every dimension a positive integer."""
    if shapes is None or shapes == {}:
        return None
    if not isinstance(shapes, dict):
        shapes = {None: shapes}
    out = {}
    for name, shape in shapes.items():
        dims = tuple(shape)
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
            raise UsageError(f"--input-shape {'' if name is None else name + '='}{shape}: every dimension must be "
                             "a positive integer, e.g. 1,224,224,3")
        out[name] = dims
    return out


CALIB_METHODS = ("auto", "minmax", "percentile", "mse", "aeq")  # see converters/ranges.py and converters/aeq.py


def aeq_unusable(io: str) -> str | None:
    """Why ai-edge-quantizer (converters/aeq.py) cannot quantize a conversion with this --io, or None."""
    if io != "float32":
        return f"ai-edge-quantizer writes float32 inputs and outputs here, not --io {io}"
    if not aeq_installed():
        return "ai-edge-quantizer is not installed (pip install litert-quantizer)"
    return None


def aeq_installed() -> bool:
    return importlib.util.find_spec("litert_quantizer") is not None


@dataclass(frozen=True)
class ConvertRecipe:
    """One conversion. Bad combinations are rejected here, before TensorFlow is imported."""

    model: Path
    mode: str | None = None  # None: float16 with target="gpu" (the GPU delegate's native precision), else float32
    io: str = "float32"
    calib: Any = None  # a folder or .npy/.npz path, in-memory samples, or {input name: either} per input
    calib_samples: int = 200
    seed: int = 0
    calib_method: str = "auto"  # int8 ranges: auto (measured), minmax, percentile, mse or aeq (ai-edge-quantizer)
    # image preprocessing: one value for every image input, or {input name: value} per input
    resize: str | dict = "stretch"
    mean: tuple[float, ...] | dict = (0.0,)
    std: tuple[float, ...] | dict = (1.0,)
    output: Path | None = None
    force: bool = False
    target: str | None = None  # cpu, gpu, nnapi or npu: delegate hints stored in the model
    trust_model: bool = False  # allow objects from modules outside Keras in the model config
    strict: bool = False  # an unreadable calibration image is an error instead of skipped and reported
    # training stages (pruning, quantization-aware training); see converters/finetune.py
    prune: float | None = None  # target sparsity in [0, 1); 0 is an exact no-op
    prune_schedule: str = "polynomial"
    prune_structure: str | None = None  # unstructured, M:N or block:K
    qat: bool = False
    train_data: Path | None = None
    val_data: Path | None = None
    epochs: int = 3
    batch_size: int = 32
    lr: float | None = None
    skip_layers: tuple[str, ...] = ()
    logdir: Path | None = None
    # accuracy-budget autopilot (int8): keep the most sensitive layers in float until the drop fits
    max_drop: float | None = None  # top-1 points lost against the float model on eval_data
    eval_data: Path | None = None
    # fixed input sizes for conversion and calibration: {input name (None: the only input): (1, H, W, C)}
    input_shapes: dict | None = None
    mode_from_target: bool = field(default=False, init=False)  # mode=None became float16 for target="gpu"

    def __post_init__(self) -> None:
        from edgekit.converters.calibration import InMemoryCalibration

        object.__setattr__(self, "model", Path(self.model))
        if self.mode is None:
            object.__setattr__(self, "mode", "float16" if self.target == "gpu" else "float32")
            object.__setattr__(self, "mode_from_target", self.target == "gpu")
        object.__setattr__(self, "calib", _calib_sources(self.calib, InMemoryCalibration))
        object.__setattr__(self, "input_shapes", _input_shapes(self.input_shapes))
        for key in ("output", "train_data", "val_data", "logdir", "eval_data"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, Path(getattr(self, key)))
        object.__setattr__(self, "skip_layers", tuple(self.skip_layers))
        object.__setattr__(self, "mean", _per_input(self.mean, lambda v: tuple(float(x) for x in v)))
        object.__setattr__(self, "std", _per_input(self.std, lambda v: tuple(float(x) for x in v)))
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.io not in IO_TYPES[self.mode]:
            raise UsageError(
                f"--io {self.io} is not available with {self.mode}; choose {', '.join(IO_TYPES[self.mode])}"
            )
        self._check_training()
        self._check_autopilot()
        if self.mode in NEEDS_CALIBRATION and self.calib is None and self.train_data is None:
            raise UsageError(f"{self.mode} needs calibration data: pass --calib DIR|FILE.npy|FILE.npz")
        if self.calib_method not in CALIB_METHODS:
            raise UsageError(f"--calib-method must be one of {', '.join(CALIB_METHODS)}, got {self.calib_method!r}")
        if self.calib_method != "auto" and (self.mode != "int8" or self.qat):
            raise UsageError(f"--calib-method {self.calib_method} sets int8 post-training ranges: it needs --int8 "
                             "without --qat (QAT learns its ranges)")
        if self.calib_method == "aeq" and aeq_unusable(self.io):
            error = UsageError if aeq_installed() else MissingDependencyError
            raise error(f"--calib-method aeq: {aeq_unusable(self.io)}")
        if self.calib_samples < 1:
            raise UsageError(f"--calib-samples must be at least 1, got {self.calib_samples}")
        for resize in _values(self.resize):
            if resize not in RESIZE_MODES:
                raise UsageError(f"--resize must be one of {', '.join(RESIZE_MODES)}, got {resize!r}")
        if any(s == 0 for std in _values(self.std) for s in std):
            raise UsageError("--std must not be 0")
        if self.target is not None and self.target not in TARGETS:
            raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")

    def _check_training(self) -> None:
        from edgekit.converters.pruning import SCHEDULES, Structure  # pure Python: no TensorFlow

        if self.prune is not None and not 0.0 <= self.prune < 1.0:
            raise UsageError(f"--prune is the share of weights to remove, in [0, 1); got {self.prune:g}")
        structure = Structure.parse(self.prune_structure)
        if self.prune_structure is not None and self.prune is None:
            raise UsageError("--prune-structure needs --prune SPARSITY")
        implied = structure.implied_sparsity
        if implied is not None and self.prune not in (0.0, None) and abs(self.prune - implied) > 5e-4:
            raise UsageError(f"--prune-structure {structure} removes {implied:g} of the weights; "
                             f"pass --prune {implied:g} (got {self.prune:g})")
        if self.prune_schedule not in SCHEDULES:
            raise UsageError(f"--prune-schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {self.prune_schedule!r}")
        if self.qat and self.mode != "int8":
            raise UsageError(f"--qat trains for 8-bit integer inference; use it with --int8, not --{self.mode}")
        if self.trains and self.train_data is None:
            what = "--qat" if self.qat else "--prune"
            raise UsageError(f"{what} fine-tunes the model: pass --train-data DIR (images in class folders)")
        if self.prune is None and not self.qat:
            given = [flag for flag, value, default in (
                ("--train-data", self.train_data, None), ("--val-data", self.val_data, None),
                ("--epochs", self.epochs, 3), ("--batch-size", self.batch_size, 32), ("--lr", self.lr, None),
                ("--skip-layers", self.skip_layers, ()), ("--logdir", self.logdir, None),
            ) if value != default]
            if given and not (given == ["--train-data"] and self.mode in NEEDS_CALIBRATION):
                raise UsageError(f"{', '.join(given)} apply to training: add --prune SPARSITY and/or --qat")
        if self.epochs < 1 or self.batch_size < 1:
            raise UsageError("--epochs and --batch-size must be at least 1")
        if self.lr is not None and not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr:g}")

    def _check_autopilot(self) -> None:
        if self.max_drop is None:
            if self.eval_data is not None:
                raise UsageError("--eval-data is for the accuracy budget: add --max-drop POINTS")
            return
        if not self.max_drop >= 0:
            raise UsageError(f"--max-drop is in top-1 points and must be >= 0, got {self.max_drop:g}")
        if self.mode != "int8" or self.io != "float32":
            raise UsageError("--max-drop chooses which layers of an --int8 model stay in float; "
                             "it needs --int8 with float32 I/O")
        if self.qat:
            raise UsageError("--max-drop works on post-training int8; it cannot be combined with --qat")
        if self.eval_data is None:
            raise UsageError("--max-drop needs --eval-data DIR (images in class folders) to measure the drop")

    @property
    def trains(self) -> bool:
        """Whether a training stage runs: pruning with a sparsity above 0, or QAT."""
        return self.qat or bool(self.prune)

    @property
    def output_path(self) -> Path:
        """`-o`, or `<model>.<mode>.tflite` beside the input."""
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

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for key in ("model", "output", "train_data", "val_data", "logdir", "eval_data"):
            d[key] = None if d[key] is None else str(d[key])
        calib = self.calib
        d["calib"] = None if calib is None else {str(k): str(v) for k, v in calib.items()} if isinstance(calib, dict) \
            else str(calib)
        d["input_shapes"] = None if self.input_shapes is None else \
            {"" if k is None else k: list(v) for k, v in self.input_shapes.items()}
        d["skip_layers"] = list(self.skip_layers)
        for key in ("mean", "std"):
            value = getattr(self, key)
            d[key] = {k: list(v) for k, v in value.items()} if isinstance(value, dict) else list(value)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ConvertRecipe":
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown recipe keys: {', '.join(unknown)}")
        return cls(**d)
