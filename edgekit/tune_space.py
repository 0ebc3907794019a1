"""What `edgekit tune` searches: a trial's settings sampled from an Optuna trial (define-by-run: a setting exists
only where its parent chose it), turned into ConvertRecipe keywords, and the sweep's fixed variants as the
study's first trials, so that the search starts where `sweep` ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.converters.recipe import CALIB_METHODS, BudgetSpec, PruningSpec, TrainingSpec

MODES = ("float32", "float16", "dynamic", "int8", "int16x8")
ISLAND_DROPS = (0.25, 0.5, 1.0, 2.0)  # the autopilot as one move: keep ops in float until the drop is within
PRUNINGS = ("none", "unstructured", "2:4", "channels")  # 2:4: half of every 4 weights, its share fixed
SPARSITY = (0.2, 0.7, 0.1)  # low, high, step
EPOCHS = (1, 4)
INPUT_SIZES = (96, 128, 160, 192, 224)  # one open image input (H and W None): the sizes tried
FIRST_SIZE = 224  # the first trials' (the size mobile classifiers are most often trained at)


def suggest(trial: Any, *, trainable: bool, sizes: bool = False) -> dict[str, Any]:
    """A trial's settings, each named as the study stores it ("mode", "qat", "calib_method", "float_islands",
    "islands_max_drop", "islands_int16", "pruning", "sparsity", "epochs", "input_size"); pruning and QAT only
    where `trainable` (training data given), the input size where `sizes` (the model's one image input is
    open)."""
    mode = trial.suggest_categorical("mode", MODES)
    params: dict[str, Any] = {"mode": mode}
    if sizes:
        params["input_size"] = trial.suggest_categorical("input_size", INPUT_SIZES)
    if mode == "int8":
        params.update(_int8(trial, trainable))
    if trainable and mode != "float32":
        pruning = trial.suggest_categorical("pruning", PRUNINGS)
        params["pruning"] = pruning
        if pruning == "2:4":
            params["sparsity"] = 0.5
        elif pruning != "none":
            low, high, step = SPARSITY
            params["sparsity"] = trial.suggest_float("sparsity", low, high, step=step)
        if pruning != "none" or params.get("qat"):
            params["epochs"] = trial.suggest_int("epochs", *EPOCHS)
    return params


def _int8(trial: Any, trainable: bool) -> dict[str, Any]:
    """QAT (with training data), else post-training int8: its range method and its islands."""
    if trainable and trial.suggest_categorical("qat", (False, True)):
        return {"qat": True}  # ranges learnt in training: no calibration method, no autopilot (post-training)
    params: dict[str, Any] = {"qat": False} if trainable else {}
    params["calib_method"] = trial.suggest_categorical("calib_method", CALIB_METHODS)
    if trial.suggest_categorical("float_islands", (False, True)):
        params["islands_max_drop"] = trial.suggest_categorical("islands_max_drop", ISLAND_DROPS)
        # the sensitive ops tried at int16 activations before float (int8-sized; TFLite's int16 kernels are
        # reference code: the device's p50 says whether that pays)
        params["islands_int16"] = trial.suggest_categorical("islands_int16", (False, True))
    return params


def first_trials(*, trainable: bool, max_drop: float, sizes: bool = False) -> list[dict[str, Any]]:
    """The sweep's variants as trial parameters (as `suggest` names them), in the sweep's order: the study
    starts from them, so its front holds every file `sweep` would build. `max_drop`: the islands' budget."""
    if sizes:
        return [{**p, "input_size": FIRST_SIZE} for p in first_trials(trainable=trainable, max_drop=max_drop)]
    none: dict[str, Any] = {"pruning": "none"} if trainable else {}
    int8: dict[str, Any] = {"mode": "int8", "calib_method": "auto", "float_islands": False, **none}
    found: list[dict[str, Any]] = [{"mode": "float32"}, {"mode": "float16", **none}, {"mode": "dynamic", **none},
             {**int8, **({"qat": False} if trainable else {})}, {"mode": "int16x8", **none}]
    islands = min(ISLAND_DROPS, key=lambda d: abs(d - max_drop))
    found.append({**found[3], "float_islands": True, "islands_max_drop": islands, "islands_int16": False})
    if trainable:
        found += [{"mode": "int8", "qat": True, **none, "epochs": 3},
                  {**int8, "pruning": "channels", "sparsity": 0.5, "qat": False, "epochs": 3}]
    return found


def recipe_keywords(params: dict[str, Any], *, calib: Path, eval_data: Path, train_data: Path | None,
                    seed: int, channels: int = 3) -> dict[str, Any]:
    """ConvertRecipe keywords (output and model aside) for a trial's settings (`channels`: the open image
    input's, where the size is searched)."""
    from edgekit.converters.recipe import CalibrationSpec

    mode = params["mode"]
    kw: dict[str, Any] = {"mode": mode, "seed": seed}
    if "input_size" in params:
        kw["input_shape"] = (1, params["input_size"], params["input_size"], channels)
    if mode in ("int8", "int16x8") and not params.get("qat"):
        kw["calib"] = calib
    if "calib_method" in params:
        kw["calibration"] = CalibrationSpec(method=params["calib_method"])
    if "islands_max_drop" in params:
        # the autopilot measures on the evaluation data, as sweep's int8-auto does
        kw["budget"] = BudgetSpec(max_drop=params["islands_max_drop"], eval_data=eval_data,
                                  int16=bool(params.get("islands_int16")))
    pruning = params.get("pruning", "none")
    if pruning != "none":
        kw["pruning"] = PruningSpec(round(params["sparsity"], 2), structure=None if pruning == "unstructured" else pruning)
    if pruning != "none" or params.get("qat"):
        assert train_data is not None  # suggest() offers training only with it (for the type checker)
        # no val_data: training measures itself on a held-out split of the training data, never on the
        # evaluation data the trials are judged on
        kw["training"] = TrainingSpec(data=train_data, qat=bool(params.get("qat")), epochs=params["epochs"])
    return kw


def describe(params: dict[str, Any]) -> str:
    """A trial's settings in a few words: "int8 calib=percentile islands<=0.5 channels 50 % 2 epochs"."""
    words = [params["mode"]]
    if "input_size" in params:
        words.append(f"{params['input_size']}x{params['input_size']}")
    if "calib_method" in params:
        words.append(f"calib={params['calib_method']}")
    if "islands_max_drop" in params:
        words.append(f"{'int16/float' if params.get('islands_int16') else 'float'} islands<={params['islands_max_drop']:g}")
    if params.get("pruning", "none") != "none":
        words.append(f"{params['pruning']} {100 * params['sparsity']:.0f} %")
    if params.get("qat"):
        words.append("qat")
    if "epochs" in params:
        words.append(f"{params['epochs']} epoch{'s' if params['epochs'] > 1 else ''}")
    return " ".join(words)
