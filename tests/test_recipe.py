"""The convert recipe (converters/recipe.py): each option declared once, every bad combination refused
before TensorFlow is imported, in the library's own words; the CLI's options come from the same
declarations and show the same errors with flags."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from edgekit.cli import convert as convert_command
from edgekit.cli_options import CLI_ONLY, cli_name, dest, param_flags
from edgekit.converters.recipe import (SPECS, BudgetSpec, CalibrationSpec, ConvertRecipe, Preprocessing,
                                       PruningSpec, TrainingSpec, declared)
from edgekit.errors import MissingDependencyError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def test_default_output_sits_beside_the_model_and_names_the_mode():
    assert ConvertRecipe(model="a/b/net.keras", mode="float16").output_path == Path("a/b/net.float16.tflite")
    assert ConvertRecipe(model="a/saved", mode="dynamic").output_path == Path("a/saved.dynamic.tflite")


TRAIN = TrainingSpec(data="t")

# (what to build, the error as the library says it, as the CLI says it)
REFUSALS = [
    (lambda: ConvertRecipe(model="m", mode="int4"), "mode: must be one of float32, float16, dynamic, int8, int16x8",
     "the mode (--int8, --float16, --dynamic, --int16x8): must be one of"),
    (lambda: ConvertRecipe(model="m", mode="int8"), "mode='int8' needs calibration data: set calib",
     "--int8 needs calibration data: set --calib"),
    (lambda: ConvertRecipe(model="m", mode="int16x8"), "mode='int16x8' needs calibration data",
     "--int16x8 needs calibration data"),
    (lambda: ConvertRecipe(model="m", mode="float16", io="int8"), "io: is not available with mode='float16'",
     "--io: is not available with --float16"),
    (lambda: ConvertRecipe(model="m", mode="int8", io="int16", calib="d"), "io: is not available with mode='int8'",
     "--io: is not available with --int8"),
    (lambda: CalibrationSpec(samples=0), "calibration.samples: must be at least 1, got 0",
     "--calib-samples: must be at least 1, got 0"),
    (lambda: CalibrationSpec(method="best"), "calibration.method: must be one of auto, minmax",
     "--calib-method: must be one of"),
    (lambda: ConvertRecipe(model="m", mode="float32", calibration=CalibrationSpec(method="mse")),
     "calibration.method: sets int8 post-training ranges: it needs mode='int8' without training.qat",
     "--calib-method: sets int8 post-training ranges: it needs --int8 without --qat"),
    (lambda: Preprocessing(std=0), "preprocessing.std: must not be 0", "--std: must not be 0"),
    (lambda: Preprocessing(mean=()), "preprocessing.mean: needs at least one value", "--mean: needs at least one"),
    (lambda: Preprocessing(resize="squash"), "preprocessing.resize: must be one of stretch, letterbox, crop",
     "--resize: must be one of"),
    (lambda: PruningSpec(1.2), "pruning.sparsity: is the share of weights to remove, in [0, 1)",
     "--prune: is the share"),
    (lambda: PruningSpec(schedule="constant"), "pruning.schedule: needs pruning.sparsity",
     "--prune-schedule: needs --prune"),
    (lambda: PruningSpec(structure="2:4"), "pruning.structure: needs pruning.sparsity",
     "--prune-structure: needs --prune"),
    (lambda: PruningSpec(0.3, structure="2:4"), "pruning.structure: 2:4 removes 0.5 of the weights; set "
     "pruning.sparsity to 0.5", "--prune-structure: 2:4 removes 0.5 of the weights; set --prune to 0.5"),
    (lambda: PruningSpec(0.5, structure="9"), "pruning.structure: must be unstructured, M:N",
     "--prune-structure: must be unstructured"),
    (lambda: PruningSpec(0.5, structure="block:1"), "pruning.structure: block:K needs a block size K >= 2",
     "--prune-structure: block:K"),
    (lambda: PruningSpec(0.5, schedule="cubic"), "pruning.schedule: must be one of polynomial, constant",
     "--prune-schedule: must be one of"),
    (lambda: ConvertRecipe(model="m", pruning=PruningSpec(0.5)), "pruning.sparsity: fine-tunes the model: set "
     "training.data", "--prune: fine-tunes the model: set --train-data"),
    (lambda: ConvertRecipe(model="m", mode="int8", training=TrainingSpec(qat=True)),
     "training.qat: fine-tunes the model: set training.data", "--qat: fine-tunes the model: set --train-data"),
    (lambda: ConvertRecipe(model="m", mode="float16", training=TrainingSpec(data="t", qat=True)),
     "training.qat: trains for 8-bit integer inference; use it with mode='int8', not mode='float16'",
     "--qat: trains for 8-bit integer inference; use it with --int8, not --float16"),
    (lambda: ConvertRecipe(model="m", training=TrainingSpec(epochs=5)), "training.epochs apply to training: set "
     "pruning.sparsity and/or training.qat", "--epochs apply to training: set --prune and/or --qat"),
    (lambda: ConvertRecipe(model="m", mode="float16", training=TRAIN), "training.data apply to training",
     "--train-data apply to training"),
    (lambda: TrainingSpec(epochs=0), "training.epochs: must be at least 1", "--epochs: must be at least 1"),
    (lambda: TrainingSpec(batch_size=0), "training.batch_size: must be at least 1", "--batch-size: must be"),
    (lambda: TrainingSpec(lr=0.0), "training.lr: must be positive, got 0", "--lr: must be positive"),
    (lambda: BudgetSpec(max_drop=1.0), "budget.max_drop: needs budget.eval_data", "--max-drop: needs --eval-data"),
    (lambda: BudgetSpec(eval_data="e"), "budget.eval_data: is for the accuracy budget: set budget.max_drop too",
     "--eval-data: is for the accuracy budget: set --max-drop too"),
    (lambda: BudgetSpec(max_drop=-1.0, eval_data="e"), "budget.max_drop: is in top-1 points and must be >= 0",
     "--max-drop: is in top-1 points"),
    (lambda: ConvertRecipe(model="m", mode="float16", budget=BudgetSpec(max_drop=1, eval_data="e")),
     "budget.max_drop: chooses which layers of an int8 model stay in float; it needs mode='int8' with "
     "io='float32'", "--max-drop: chooses which layers of an int8 model stay in float; it needs --int8 with "
     "--io float32"),
    (lambda: ConvertRecipe(model="m", mode="int8", training=TrainingSpec(data="t", qat=True),
                           budget=BudgetSpec(max_drop=1, eval_data="e")),
     "budget.max_drop: works on post-training int8; it cannot be combined with training.qat",
     "--max-drop: works on post-training int8; it cannot be combined with --qat"),
    (lambda: ConvertRecipe(model="m", target="tpu"), "target: must be one of cpu, gpu, nnapi, npu",
     "--target: must be one of"),
    (lambda: ConvertRecipe(model="m", input_shape=(1, 0, 4, 3)), "input_shape: (1, 0, 4, 3): every dimension",
     "--input-shape: (1, 0, 4, 3): every dimension"),
    (lambda: ConvertRecipe(model="m", calib={}), "calib: names no input", "--calib: names no input"),
]


@pytest.mark.parametrize("build, library, cli", REFUSALS, ids=[r[1].split(":")[0][:40] for r in REFUSALS])
def test_every_bad_recipe_is_refused_in_the_librarys_words_and_the_clis(build, library, cli):
    with pytest.raises(UsageError) as err:
        build()
    assert library in str(err.value)
    assert "--" not in str(err.value)  # the library never names a flag
    assert cli in err.value.render(cli_name)


def test_ai_edge_quantizer_with_integer_io_is_a_usage_error():
    with pytest.raises((UsageError, MissingDependencyError), match="calibration.method: ai-edge-quantizer writes float32 inputs and outputs here, not int8"):
        ConvertRecipe(model="m", mode="int8", io="int8", calib="d", calibration=CalibrationSpec(method="aeq"))


def test_pruning_to_zero_is_an_exact_no_op_and_m_n_implies_its_sparsity():
    assert not ConvertRecipe(model="m", pruning=PruningSpec(0.0), training=TRAIN).trains
    assert ConvertRecipe(model="m", pruning=PruningSpec(0.5, structure="2:4"), training=TRAIN).prune == 0.5


def test_training_data_alone_calibrates_an_int8_conversion():
    recipe = ConvertRecipe(model="m", mode="int8", training=TRAIN)
    assert recipe.train_data == Path("t") and not recipe.trains


def test_the_recipe_round_trips_through_json_and_rejects_unknown_keys():
    recipe = ConvertRecipe(model="m.keras", mode="int8", io="uint8", calib="data", input_shape={"img": (1, 8, 8, 3)},
                           calibration=CalibrationSpec(samples=50, method="mse"),
                           preprocessing=Preprocessing(mean=(127.5,), std=(127.5,), resize="crop"),
                           pruning=PruningSpec(0.5, structure="2:4"), training=TrainingSpec(data="t", epochs=2),
                           budget=None)
    assert ConvertRecipe.from_dict(recipe.to_dict()) == recipe
    stored = recipe.stored()  # what the model's metadata keeps
    assert set(stored) == {"input_shape", "calibration", "preprocessing", "pruning", "training"}
    assert stored["calibration"] == {"samples": 50, "method": "mse"} and stored["training"] == {"data": "t", "epochs": 2}
    again = ConvertRecipe.from_dict({**stored, "model": "m.keras", "mode": "int8", "io": "uint8", "calib": "data"})
    assert again == recipe
    with pytest.raises(UsageError, match="unknown recipe keys: calib_sample"):
        ConvertRecipe.from_dict({"model": "m.keras", "calib_sample": 3})


# -- one declaration: the CLI's options are the declared fields, one each, and back ----------------------------

def _declared_keys() -> set[str]:
    keys = {f.name for f, _ in declared(ConvertRecipe) if f.name != "mode"}
    for name, kind in SPECS.items():
        keys |= {f"{name}.{f.name}" for f, _ in declared(kind)}
    return keys


def test_every_convert_option_maps_to_exactly_one_declared_field_and_back():
    by_dest = {}
    for key in _declared_keys():
        spec, _, name = key.rpartition(".")
        field = next(f for f, _ in declared(SPECS[spec] if spec else ConvertRecipe) if f.name == name)
        by_dest[dest(spec or None, field)] = key
    params = [p for p in convert_command.params if isinstance(p, click.Option) and p.name not in CLI_ONLY]
    assert sorted(p.name for p in params) == sorted(by_dest)  # each field has its option, no option without one
    flags = param_flags()
    for p in params:
        assert flags[by_dest[p.name]] in p.opts, (p.name, p.opts)
    assert len(set(flags.values())) == len(flags)  # no flag serves two fields
    modes = [p for p in convert_command.params if p.name == "modes"]
    assert sorted(o for p in modes for o in p.opts) == ["--dynamic", "--float16", "--int16x8", "--int8"]


def test_the_api_takes_at_most_twelve_parameters_besides_the_specs():
    import inspect

    import edgekit

    params = inspect.signature(edgekit.convert).parameters
    specs = [n for n in params if n in SPECS]
    assert sorted(specs) == sorted(SPECS)
    assert len(params) - len(specs) <= 12


# -- the library speaks in its parameters' names ---------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


def test_no_message_raised_in_converters_or_runtime_names_a_cli_flag():
    found = []
    for folder in ("converters", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    found += [f"{path.relative_to(ROOT)}:{node.lineno}: {sub.value!r}" for sub in ast.walk(node.exc)
                              if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                              and FLAG.search(sub.value)]
    assert found == []
