"""int8 candidates behind one protocol (converters/int8/): a candidate is one class and its registration;
`auto` scores it beside the declared ones on the one generic path, and asked for by name its file is the
file written. The declared table is the recipe's list and is imported lazily."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import ClassVar

import numpy as np
import pytest

from edgekit.converters.int8 import registry
from edgekit.converters.int8.range_setting import RangeSetting


class Shrunk(RangeSetting):
    """A dummy candidate: each min/max range shrunk by 10 % at both ends; keeps every file it makes."""

    name = "shrunk"
    made: ClassVar[list[bytes]] = []

    def clip(self, values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
        return 0.9 * lo, 0.9 * hi

    def make(self, ctx, fit, *, view: bool, final: bool = False) -> bytes:
        made = super().make(ctx, fit, view=view, final=final)
        Shrunk.made.append(made)
        return made


@pytest.fixture
def shrunk():
    Shrunk.made = []
    registry.register("shrunk", Shrunk)
    yield Shrunk
    registry.unregister("shrunk")


@pytest.fixture(scope="module")
def outlier_digits(digits_keras, digits_dir):
    """The digits CNN's calibrated TFLite model with two output channels of its first convolution scaled 200x
    (the second's weights divided back: the same function), so that min/max leaves something to win; and
    200 training digits: 100 to calibrate, 100 to score on."""
    import keras
    import tensorflow as tf
    from helpers import with_activation_outliers

    from edgekit.converters.int8 import ranges
    from edgekit.runtime import ImageFolder, read_image

    model = keras.saving.load_model(digits_keras)
    first, second = [layer.name for layer in model.layers if isinstance(layer, keras.layers.Conv2D)][:2]
    with_activation_outliers(model, first, second)
    folder = ImageFolder.scan(digits_dir / "train")
    x = np.stack([read_image(f) for f in folder.files[:200]])[..., None].astype(np.float32)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s[None]] for s in x[:100])
    return ranges.calibrated_model(converter), [[s[None]] for s in x]


def _first_output(tflite: bytes, samples: list) -> np.ndarray:
    from edgekit.runtime import Model

    model = Model(tflite, probe=False, num_threads=1)
    return np.concatenate([model.run(*sample)[0] for sample in samples])


def _choose(outlier_digits, method: str):
    from edgekit.converters.int8.choose import choose

    calibrated, samples = outlier_digits
    return choose(calibrated, "float32", method, samples[:100], _first_output, extra=samples[100:])


def test_a_registered_candidate_is_scored_by_auto_beside_the_declared_ones(shrunk, outlier_digits):
    from edgekit.converters.int8.choose import choose

    lines: list[str] = []
    calibrated, samples = outlier_digits
    choice = choose(calibrated, "float32", "auto", samples[:100], _first_output, extra=samples[100:],
                    say=lambda line: lines.append(str(line)))
    r = choice.entry
    assert r["candidates"]["minmax"]["agreement"] < 1.0  # the outliers leave something to win
    cheap = [m for m in r["candidates"] if m != "gptq"]  # weight rounding may follow them (`_escalate`)
    assert cheap[::len(cheap) - 1] == ["minmax", "shrunk"]
    s = r["candidates"]["shrunk"]
    assert set(s) >= {"agreement", "snr_db", "loss", "seconds"} and r["loss"] == "kl"
    assert 0.0 <= s["agreement"] <= 1.0 and s["loss"] >= 0
    assert any("calibration method shrunk: agreement" in line for line in lines)
    # compared last, against the winner so far, on the held-out samples: the test and the verdict recorded
    decided = [d for d in r["decisions"] if d["candidate"] == "shrunk"]
    assert len(decided) == 1 and decided[0]["n"] >= 100 and 0 <= decided[0]["p"] <= 1
    assert any(line.startswith("shrunk against ") for line in lines)
    assert len(shrunk.made) == 1  # fitted once, on the calibration samples (held-out scoring)


def test_a_registered_candidate_asked_for_by_name_writes_the_file_it_made(shrunk, outlier_digits):
    from edgekit.converters.int8 import ranges

    calibrated, samples = outlier_digits
    choice = _choose(outlier_digits, "shrunk")
    assert choice.entry["chosen"] == "shrunk" and list(choice.entry["candidates"]) == ["shrunk"]
    assert choice.tflite == shrunk.made[-1]  # the final file: made by the candidate, the one scored
    plain = ranges.quantize(calibrated, "float32")
    assert choice.tflite != plain
    # its ranges: min/max x 0.9 of the activations on the calibration samples (the same random draws)
    acts = ranges.collect(calibrated, samples[:100], ["a"] * 100)
    expected = ranges.propose(acts, lambda v, lo, hi: (0.9 * lo, 0.9 * hi), ("a",))
    assert ranges.quantize(calibrated, "float32", expected) == choice.tflite
    assert ranges.quantize(choice.basis, "float32") == choice.tflite  # the basis the budget autopilot gets


def test_weight_rounding_follows_the_cheap_winner_on_its_ranges_as_far_as_the_effort_allows(outlier_digits):
    """`--calib-effort`: fast never rounds weights; thorough scores GPTQ on the cheap candidates' winner's ranges
    (the range method of the lowest mean loss where the winner sets none) on the same held-out samples, and
    keeps it only where the paired test shows it better than the winner, as every candidate must be against
    the winner before it; the cheap candidates choose alike either way."""
    from edgekit.converters.int8 import weight_rounding
    from edgekit.converters.int8.choose import choose
    from edgekit.converters.int8.range_setting import RangeSetting

    calibrated, samples = outlier_digits
    runs, lines = {}, []
    for effort in ("fast", "thorough"):
        runs[effort] = choose(calibrated, "float32", "auto", samples[:100], _first_output, extra=samples[100:],
                              effort=effort, say=lambda line: lines.append(str(line)))
    fast, thorough = runs["fast"].entry, runs["thorough"].entry
    assert fast["escalation"] == {"effort": "fast", "ran": False, "why": "effort fast"}
    assert "gptq" not in fast["candidates"] and fast["chosen"] != "gptq"
    e = thorough["escalation"]
    assert e["ran"] and e["effort"] == "thorough" and e["against"] == fast["chosen"]
    setting = [m for m in fast["candidates"] if isinstance(registry.load(m), RangeSetting)]
    best = min(setting, key=lambda m: thorough["candidates"][m]["loss"])
    assert e["on"] == (e["against"] if e["against"] in setting else best)
    scored = thorough["candidates"]["gptq"]
    assert scored["on"] == e["on"] and scored["seconds"] == e["seconds"] > 0
    decided = next(d for d in thorough["decisions"] if d["candidate"] == "gptq")
    assert decided["candidate"] == "gptq" and decided["against"] == e["against"] and decided["kept"] == e["kept"]
    assert e["kept"] == (decided["p"] <= decided["alpha"] and decided["candidate_mean"] < decided["reference_mean"])
    assert thorough["chosen"] == ("gptq" if e["kept"] else fast["chosen"])
    if e["kept"]:  # the file holds the kernels GPTQ rounded, on the winner's ranges
        assert thorough["weight_rounding"] == {"method": "gptq", "on": e["on"], "layers": 5, "differ": []}
    else:
        assert runs["thorough"].tflite == runs["fast"].tflite
    assert weight_rounding.int8_kernels(runs["thorough"].tflite)
    assert any(line.startswith(f"weight rounding (gptq on {e['on']}'s ranges): agreement") for line in lines)
    print(f"winner {e['against']} {thorough['candidates'][e['against']]}; gptq {scored}; kept {e['kept']}")


def test_the_declared_candidates_are_the_recipes_and_the_metadata_schemas():
    from edgekit.converters.int8.choose import EFFORTS
    from edgekit.converters.recipe import CALIB_EFFORTS, CALIB_LOSSES, CALIB_METHODS
    from edgekit.metrics import LOSSES

    assert CALIB_EFFORTS == EFFORTS and CALIB_LOSSES == ("auto", *LOSSES)
    assert set(CALIB_METHODS) == {"auto", *registry.CANDIDATES}
    for name in registry.names():
        assert registry.load(name).name == name
    range_setting = _schema_range_setting()
    assert set(range_setting["requested"]["enum"]) == set(CALIB_METHODS)
    assert set(range_setting["chosen"]["enum"]) == set(registry.CANDIDATES)


def _schema_range_setting() -> dict:
    from pathlib import Path

    import edgekit

    schema = json.loads((Path(edgekit.__file__).parent / "schemas" / "metadata-1.schema.json").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "range_setting" in node.get("properties", {}):
                found.append(node["properties"]["range_setting"]["properties"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert len(found) == 1
    return found[0]


def test_registering_imports_nothing_and_names_are_unique():
    code = ("import sys; import edgekit.converters.recipe, edgekit.converters.int8.registry as r; "
            "print(r.names()); "
            "print([m for m in sys.modules if m.startswith('edgekit.converters.int8.') and m != r.__name__ "
            "or m.split('.')[0] in ('tensorflow', 'keras')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[1] == "[]", out  # the table names modules; none is imported until a candidate is used
    with pytest.raises(ValueError, match="exists already"):
        registry.register("minmax", Shrunk)
    registry.register("misnamed", Shrunk)
    try:
        with pytest.raises(ValueError, match="calls itself 'shrunk'"):
            registry.load("misnamed")
    finally:
        registry.unregister("misnamed")
    assert "misnamed" not in registry.names()


def test_ai_edge_quantizers_basis_carries_its_ranges_for_the_budget_autopilot(outlier_digits):
    """The budget autopilot makes its mixes with TFLite's quantizer from the chosen file's `basis`. For
    ai-edge-quantizer's file that is the calibrated model with the ranges it chose (`ranges.of_int8_file`),
    not min/max's: TFLite's quantizer on it gives the activations aeq's scales and zero points, and a file
    that answers as aeq's does, where min/max's (the outliers' range) does not."""
    from edgekit.converters.int8 import ranges
    from edgekit.runtime.inspect import operators

    calibrated, samples = outlier_digits
    choice = _choose(outlier_digits, "aeq")
    assert choice.entry["chosen"] == "aeq" and choice.basis is not None and choice.basis != calibrated
    ours = ranges.quantize(choice.basis, "float32")

    def activations(tflite: bytes) -> dict[str, tuple[float, int]]:
        view, sub, _ = operators(tflite)
        return {t.name: (float(t.quantization.scales[0]), int(t.quantization.zero_points[0])) for t in sub.tensors
                if t.type_name == "INT8" and view.buffer_bytes(t.buffer) is None and len(t.quantization.scales) == 1}

    theirs, mine = activations(choice.tflite), activations(ours)
    shared = set(theirs) & set(mine)
    assert len(shared) >= 6  # every activation of the digits CNN but its input
    assert all(mine[n] == pytest.approx(theirs[n], rel=1e-6) for n in shared)
    held = samples[100:]
    aeq_top, our_top = _first_output(choice.tflite, held).argmax(-1), _first_output(ours, held).argmax(-1)
    minmax_top = _first_output(ranges.quantize(calibrated, "float32"), held).argmax(-1)
    float_top = _first_output(calibrated, held).argmax(-1)
    assert np.mean(our_top == aeq_top) >= 0.99
    assert np.mean(our_top == float_top) > np.mean(minmax_top == float_top)


def test_every_op_in_float_on_bias_corrections_basis_is_the_float_model(outlier_digits):
    """The budget autopilot's mixes come from the basis; the ops it keeps in float take the float model's
    constants back (`float_kernels`). On bias correction's basis they kept the corrected biases, and
    "every op in float" lost 0.56 points on a MobileNetV3Small where the float model lost none."""
    from edgekit.converters.autopilot import OpGraph, _Search

    calibrated, samples = outlier_digits
    choice = _choose(outlier_digits, "bias")
    assert choice.entry["chosen"] == "bias" and choice.float_kernels is not None
    every = tuple(OpGraph.of(choice.basis).ops)
    held = samples[100:140]
    reference = _first_output(calibrated, held)
    ours = _Search(choice.basis, None, {}, lambda _t: (0.0, None), float_kernels=choice.float_kernels)
    np.testing.assert_allclose(_first_output(ours.build(every), held), reference, atol=1e-5)
    kept = _Search(choice.basis, None, {}, lambda _t: (0.0, None))  # the corrected biases: not the float model
    assert np.max(np.abs(_first_output(kept.build(every), held) - reference)) > 1e-4


def test_ema_ranges_are_ai_edge_quantizers_moving_average_of_each_samples_extremes(outlier_digits):
    """`ema` (converters/int8/ema.py): each tensor's range is litert_quantizer's own `moving_average_update`
    (factor 0.95) run over the per-sample min and max of the calibration samples, in their order, with 0
    included; the file is TFLite's quantizer given those ranges."""
    from litert_quantizer.utils import qsv_utils

    from edgekit.converters.int8 import ranges
    from edgekit.converters.int8.ema import Ema

    calibrated, samples = outlier_digits
    acts = ranges.collect(calibrated, samples[:100], ["a"] * 100)
    ours = Ema().propose(acts, ("a",))
    assert set(ours) == set(acts.recorded) and len(ours) >= 5
    moved = 0
    for index, (lo, hi) in ours.items():
        qsv: dict = {}
        for mn, mx in acts.values["a"][index][:, :2]:
            qsv = qsv_utils.moving_average_update(qsv, {"min": np.float64(mn), "max": np.float64(mx)})
        expected = (min(float(qsv["min"]), 0.0), max(float(qsv["max"]), 0.0))
        assert (lo, hi) == pytest.approx(expected, rel=1e-6, abs=1e-9)
        recorded = acts.recorded[index]
        assert recorded[0] - 1e-6 <= lo and hi <= recorded[1] + 1e-6  # within the extremes over all samples
        moved += (lo, hi) != pytest.approx(recorded)
    assert moved >= len(ours) // 2  # an average of extremes, not the extremes
    # fitted on two interleaved halves (two-fold scoring's refit on all): still in calibration order
    halves = ranges.collect(calibrated, samples[:100], ["a", "b"] * 50)
    both, first = Ema().propose(halves, ("a", "b")), Ema().propose(halves, ("a",))
    assert all(both[i] == pytest.approx(ours[i]) for i in ours)
    assert any(first[i] != pytest.approx(ours[i]) for i in ours)
    choice = _choose(outlier_digits, "ema")
    assert choice.entry["chosen"] == "ema" and choice.tflite == ranges.quantize(calibrated, "float32", ours)


def test_weight_rounding_that_fails_leaves_the_cheap_winners_file(outlier_digits, monkeypatch):
    """GPTQ failing on a graph it did not foresee (here its Hessian step raising numpy's LinAlgError) is one line
    in `escalation` (not in `skipped`), and the file is the cheap candidates' winner's: the conversion goes on."""
    from edgekit.converters.int8 import weight_rounding
    from edgekit.converters.int8.choose import choose

    calibrated, samples = outlier_digits

    def run(effort: str):
        return choose(calibrated, "float32", "auto", samples[:100], _first_output, extra=samples[100:],
                      effort=effort)

    fast = run("fast")

    def broken(*_args, **_kw):
        raise np.linalg.LinAlgError("Matrix is not positive definite")

    monkeypatch.setattr(weight_rounding, "gptq_weights", broken)
    failed = run("thorough")
    why = "GPTQ weight rounding failed on this model: Matrix is not positive definite"
    assert failed.entry["escalation"] == {"effort": "thorough", "ran": False, "why": why}
    assert "gptq" not in failed.entry["candidates"] and "gptq" not in failed.entry.get("skipped", {})
    assert failed.entry["chosen"] == fast.entry["chosen"] and failed.tflite == fast.tflite


def test_extremes_ranges_are_percentiles_of_each_samples_extremes_whatever_their_order(outlier_digits):
    """`extremes` (converters/int8/extremes.py): each tensor's range runs from the 5th percentile of the
    per-sample minima to the 95th of the per-sample maxima (0 included), the same whichever order or halves
    the samples come in; the file is TFLite's quantizer given those ranges."""
    from edgekit.converters.int8 import ranges
    from edgekit.converters.int8.extremes import Extremes

    calibrated, samples = outlier_digits
    acts = ranges.collect(calibrated, samples[:100], ["a"] * 100)
    ours = Extremes().propose(acts, ("a",))
    assert set(ours) == set(acts.recorded) and len(ours) >= 5
    narrower = 0
    for index, (lo, hi) in ours.items():
        mins, maxes = acts.values["a"][index][:, 0], acts.values["a"][index][:, 1]
        assert lo == pytest.approx(min(float(np.percentile(mins, 5)), 0.0))
        assert hi == pytest.approx(max(float(np.percentile(maxes, 95)), 0.0))
        recorded = acts.recorded[index]
        assert recorded[0] - 1e-6 <= lo and hi <= recorded[1] + 1e-6
        narrower += hi - lo < 0.99 * (recorded[1] - recorded[0])
    assert narrower >= len(ours) // 2
    shuffled = ranges.collect(calibrated, samples[:100][::-1], ["a", "b"] * 50)
    again = Extremes().propose(shuffled, ("a", "b"))
    assert all(again[i] == pytest.approx(ours[i]) for i in ours)
    choice = _choose(outlier_digits, "extremes")
    assert choice.entry["chosen"] == "extremes" and choice.tflite == ranges.quantize(calibrated, "float32", ours)
    # the autopilot clips single tensors by a method's `clip`; a method of the samples' extremes has none
    from edgekit.converters.int8.range_setting import clip_of

    for name in ("extremes", "ema"):
        with pytest.raises(ValueError, match="sets a range from each sample's extremes"):
            clip_of(name)
    assert clip_of("percentile")(np.arange(100.0), 0.0, 99.0)[1] < 99.0


def test_weight_rounding_is_not_started_where_rounding_the_weights_costs_under_a_tenth_of_the_loss(outlier_digits):
    """GPTQ can win back at most what rounding the weights costs: the float model with every kernel at its
    nearest int8 step (`weight_rounding.nearest_kernels`, each output channel on TFLite's own grid). On the
    digits CNN with activation outliers that is a small part of min/max's loss (the activations' ranges make
    it), and the default effort does not start weight rounding there; the kernels' q are integers, each
    channel's largest at 127."""
    from edgekit.converters.int8 import weight_rounding
    from edgekit.converters.int8.choose import _rounding_cannot_pay
    from edgekit.converters.int8.context import Context
    from edgekit.converters.int8.evidence import MoreHeldOut
    from edgekit.converters.int8.minmax import MinMax
    from edgekit.converters.int8.scoring import folds, score_all

    calibrated, samples = outlier_digits
    groups, fit = folds(100, len(samples) - 100, 0)
    ctx = Context(calibrated, "float32", {}, samples, groups, 0, converters_fit=fit)
    entry: dict = {"requested": "minmax", "candidates": {}}
    scoring = score_all(entry, {"minmax": MinMax()}, ctx, samples, groups, _first_output, lambda _m: None,
                        two_fold=False, effort="standard", more=MoreHeldOut(), loss="auto", threshold=0.5)
    why, weights = _rounding_cannot_pay(ctx, MinMax(), "minmax", scoring, entry["scored_output"] == "logits")
    plain = entry["candidates"]["minmax"]["loss"]
    print(f"rounding the weights alone: mean KL {weights:.4g}, min/max's file {plain:.4g}")
    assert why is not None and "the loss is the activations'" in why and 0 <= weights < 0.1 * plain
    layers = {layer.weight: layer for layer in weight_rounding.layers_of(calibrated)}
    kernels = weight_rounding.nearest_kernels(calibrated)
    assert set(kernels) == set(layers) and len(kernels) >= 3
    for index, w in kernels.items():
        scale = weight_rounding.tflite_scale(layers[index].w.reshape(w.shape[0], -1))[:, None]
        if layers[index].kind == "DEPTHWISE_CONV_2D":
            continue
        q = w.reshape(w.shape[0], -1) / scale
        assert np.allclose(q, np.rint(q), atol=1e-3) and np.allclose(np.abs(q).max(axis=1), 127, atol=1e-3)


class Oracle(RangeSetting):
    """A dummy candidate whose file is the float model itself: no loss on the held-out samples, so auto keeps
    it. Its final file, marked, is made to disagree with the float model wherever `SPOIL` says (the test's
    `evaluate` swaps its top two classes)."""

    name = "oracle"
    SPOIL = b"SPOIL"
    spoil = False

    def make(self, ctx, fit, *, view: bool, final: bool = False) -> bytes:
        made = ctx.model("", view)
        return self.SPOIL + made if final and self.spoil else made

    def basis(self, ctx, fit) -> bytes | None:
        return ctx.calibrated


def _spoiling(tflite: bytes, samples: list) -> np.ndarray:
    """`_first_output`, but a file marked by Oracle gives its top two classes swapped on every sample."""
    if not tflite.startswith(Oracle.SPOIL):
        return _first_output(tflite, samples)
    out = _first_output(tflite[len(Oracle.SPOIL):], samples)
    top = np.argsort(out, axis=1)[:, -2:]
    rows = np.arange(len(out))
    out[rows, top[:, 0]], out[rows, top[:, 1]] = out[rows, top[:, 1]].copy(), out[rows, top[:, 0]].copy()
    return out


@pytest.mark.parametrize("spoil", [False, True])
def test_a_file_further_from_the_float_model_than_minmaxs_on_the_verification_samples_gives_way(outlier_digits,
                                                                                              spoil):
    """Verification closes the loop: auto's file is run beside min/max's on the verification samples; where
    it agrees with the float model on fewer of them at 95 %, min/max's file is written and the line says so,
    else the chosen file stays."""
    from edgekit.converters.int8 import ranges
    from edgekit.converters.int8.choose import choose

    calibrated, samples = outlier_digits
    Oracle.spoil = spoil
    registry.register("oracle", Oracle)
    lines: list[str] = []
    try:
        choice = choose(calibrated, "float32", "auto", samples[:100], _spoiling, extra=samples[100:],
                        verification=samples[100:], say=lambda line: lines.append(str(line)), effort="fast")
    finally:
        registry.unregister("oracle")
    r = choice.entry
    check = r["verification_check"]
    assert check["n"] == 100 and check["measure"] == "agreement" and check["kept"] == (not spoil)
    if not spoil:
        assert r["chosen"] == "oracle" and check["chosen"] == 1.0 and "replaced" not in r
        assert any(line.startswith("verification check: oracle's file") and line.endswith("kept") for line in lines)
        return
    assert r["chosen"] == "minmax" and r["replaced"] == "oracle" and check["chosen"] == 0.0 and check["p"] < 1e-6
    assert choice.tflite == ranges.quantize(calibrated, "float32") and choice.basis == calibrated
    assert any("min/max's file written instead" in line for line in lines)
