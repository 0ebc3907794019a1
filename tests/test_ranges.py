"""int8 activation ranges by --calib-method (converters/int8/choose.py): what auto measures and records, that
min/max is the plain converter's model, that percentile and MSE only ever narrow a range, and that
ai-edge-quantizer (converters/int8/aeq_quantizer.py), bias correction (converters/int8/bias_correction.py) and the cross-layer
equalised model (converters/int8/equalization.py) are scored as more candidates and can write the file themselves."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import run_cli

import edgekit
from edgekit.contracts import validate
from edgekit.converters.int8.scoring import UNBEATABLE, nothing_to_win
from edgekit.runtime import ImageFolder, Model, read_image


def _test_images(digits_dir):
    folder = ImageFolder.scan(digits_dir / "test")
    return np.stack([read_image(f) for f in folder.files])[..., None].astype(np.float32)


def _activation_scales(path) -> dict[str, float]:
    from ai_edge_litert import schema_py_generated as s

    graph = s.ModelT.InitFromObj(s.Model.GetRootAs(path.read_bytes(), 0)).subgraphs[0]
    return {t.name.decode(): float(t.quantization.scale[0]) for t in graph.tensors
            if t.type == s.TensorType.INT8 and t.buffer and t.quantization is not None
            and t.quantization.scale is not None and len(t.quantization.scale) == 1}


@pytest.fixture(scope="module")
def by_method(digits_keras, digits_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ranges")
    return {m: edgekit.convert(digits_keras, mode="int8", calib=digits_dir / "train", output=out / f"{m}.tflite",
                               calibration=edgekit.CalibrationSpec(method=m))
            for m in ("auto", "minmax", "percentile", "mse", "bias", "aeq")}


def test_auto_keeps_minmax_without_scoring_the_rest_where_it_agrees_on_every_held_out_sample(by_method):
    meta = by_method["auto"].metadata
    validate(meta, "edgekit.metadata/1")
    r = meta["calibration"]["range_setting"]
    # 200 calibration samples, the 200 verification samples skipped, 200 more of the 1,437 training digits:
    # the candidates fitted on the first, scored on the last
    assert r["requested"] == "auto" and r["scored_on"] == 200 and r["extra_samples"] == 200
    assert r["scoring"] == "held_out"
    assert r["scored_output"] == "logits"  # the digits CNN ends in a SOFTMAX
    assert list(r["candidates"]) == ["minmax"] and r["candidates"]["minmax"]["agreement"] == 1.0
    assert r["skipped"] == dict.fromkeys(("percentile", "mse", "ema", "extremes", "bias", "aeq"), UNBEATABLE) and r["chosen"] == "minmax"
    # nor does weight rounding follow (`--calib-effort standard`): the cheap winner left nothing to win
    assert r["escalation"] == {"effort": "standard", "ran": False, "why": UNBEATABLE}
    assert not r["equalization"]["candidate"]  # its channels move apart by 2.2x at most: not worth a candidate


@pytest.fixture(scope="module")
def outlier_cnn(digits_dir, tmp_path_factory):
    """A 6-conv digits CNN with two output channels of conv1 scaled 200x (conv2's weights divided back)."""
    from helpers import deep_digits_cnn, with_activation_outliers

    path = tmp_path_factory.mktemp("outlier") / "outlier.keras"
    with_activation_outliers(deep_digits_cnn(digits_dir), "conv1", "conv2").save(path)
    return path


def test_auto_ranks_by_logit_kl_ends_where_equalize_leaves_nothing_and_agrees_better(outlier_cnn, digits_dir, tmp_path):
    import keras
    from helpers import labelled_images

    from edgekit.runtime import PreprocessSpec

    files = {m: edgekit.convert(outlier_cnn, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{m}.tflite",
                                calibration=edgekit.CalibrationSpec(method=m)) for m in ("auto", "minmax")}
    r = files["auto"].metadata["calibration"]["range_setting"]
    assert set(r["candidates"]) | set(r["skipped"]) == {"minmax", "percentile", "mse", "ema", "extremes", "bias",
                                                          "equalize", "aeq"}
    # the equalised model's min/max file agrees within the floor: nothing started after it is scored (bias,
    # next in start order, may be running beside it), nor weight rounding
    assert {"minmax", "equalize"} <= set(r["candidates"]) and r["skipped"]
    why = nothing_to_win(r["candidates"]["equalize"], "kl", "equalize")
    assert set(r["skipped"].values()) == {why} and why.startswith("equalize")
    assert r["escalation"] == {"effort": "standard", "ran": False, "why": why}
    assert all(c["seconds"] > 0 for c in r["candidates"].values())  # what each candidate cost
    # conv1's two 200x channels: equalisation moves them back by about that much, and the model is scored
    assert r["equalization"]["candidate"] and r["equalization"]["largest_factor"] > 100
    assert any("/conv1_" in p for p in r["equalization"]["producers"])  # TFLite op names
    for s in r["candidates"].values():  # min/max and MSE agreed 86.5 % on a machine with AVX-512 (its seed's
        assert 0.8 <= s["agreement"] <= 1.0 and s["loss"] >= 0  # training differs)
    plain = r["candidates"]["minmax"]
    assert plain["agreement"] < 1.0
    # the equalised model's logits are far closer to float's (measured: 38.2 dB against min/max's 15.0)
    assert r["candidates"]["equalize"]["snr_db"] >= plain["snr_db"] + 10
    # each scored candidate compared once, in the registry's order, with the winner before it; equalize is
    # shown better at the family's level and kept
    decided = {d["candidate"]: d for d in r["decisions"]}
    assert list(decided) == [m for m in r["candidates"] if m != "minmax"]
    assert decided["equalize"]["kept"] and r["chosen"] == "equalize"
    assert decided["equalize"]["p"] <= decided["equalize"]["alpha"] == r["test"]["alpha"]
    x, _ = labelled_images(digits_dir / "test", PreprocessSpec(8, 8, 1))
    reference = keras.saving.load_model(outlier_cnn).predict(x, verbose=0).argmax(1)
    agree = {m: float(np.mean(Model(f.path).predict(x).argmax(1) == reference)) for m, f in files.items()}
    print(agree, r["chosen"], {m: c["loss"] for m, c in r["candidates"].items()})
    assert agree["auto"] >= agree["minmax"] + 0.02  # measured: 100 % against 95 %


def test_the_logits_view_is_the_softmax_input(by_method, digits_dir):
    """Scoring on logits: the view's first output is what the model's SOFTMAX takes, so softmax of it
    gives the model's own output (to within the int8 output's step); a model without a SOFTMAX has none."""
    import tensorflow as tf

    from edgekit.converters.int8.ranges import logits_view

    tflite = by_method["minmax"].path.read_bytes()
    images = _test_images(digits_dir)[:50]
    both = Model(logits_view(tflite)).predict(images)  # the logits first, the probabilities after
    logits = both[next(iter(both))]
    probabilities = Model(tflite).predict(images)
    assert logits.min() < 0 and np.abs(logits).max() > 2  # not probabilities
    e = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(1, keepdims=True), probabilities, atol=2.5 / 256)
    dense = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    assert logits_view(tf.lite.TFLiteConverter.from_keras_model(dense).convert()) is None


def test_minmax_is_the_plain_converters_model(by_method, digits_keras, digits_dir):
    """--calib-method minmax (and auto when nothing measures better) gives what a plain TFLiteConverter
    int8 conversion gives, output for output."""
    import tensorflow as tf

    model = tf.keras.models.load_model(digits_keras)
    train = ImageFolder.scan(digits_dir / "train").sample(200, 0)  # the 200 samples edgekit drew (seed 0)
    x = np.stack([read_image(f) for f in train.files])[..., None].astype(np.float32)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s[None]] for s in x)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    plain = Model(converter.convert())
    images = _test_images(digits_dir)
    ours = Model(by_method["minmax"].path).predict(images)
    assert by_method["minmax"].metadata["calibration"]["range_setting"]["chosen"] == "minmax"
    np.testing.assert_array_equal(ours, plain.predict(images))
    if by_method["auto"].metadata["calibration"]["range_setting"]["chosen"] == "minmax":
        np.testing.assert_array_equal(Model(by_method["auto"].path).predict(images), ours)


def _logits(tflite: bytes, images: np.ndarray) -> np.ndarray:
    from edgekit.converters.int8.ranges import logits_view

    out = Model(logits_view(tflite)).predict(images)  # the logits first, the probabilities second
    logits = next(iter(out.values()))
    assert logits.min() < 0  # not the probabilities
    return logits


def test_bias_correction_moves_only_biases_and_centres_the_int8_logits_on_the_float_ones(by_method, digits_keras,
                                                                                       digits_dir):
    """--calib-method bias: the converter's int8 file with other int32 biases (the same ops, int8 kernels and
    scales), whose logits' mean error on the test images, per class, is a fraction of min/max's (measured on
    the digits CNN: 0.0098 against 0.054, the rms error 0.088 against 0.109)."""
    import tensorflow as tf
    from ai_edge_litert import schema_py_generated as s

    plain, corrected = by_method["minmax"].path.read_bytes(), by_method["bias"].path.read_bytes()
    graphs = [s.ModelT.InitFromObj(s.Model.GetRootAs(b, 0)) for b in (plain, corrected)]
    changed = []
    for a, b in zip(graphs[0].subgraphs[0].tensors, graphs[1].subgraphs[0].tensors, strict=True):
        assert a.name == b.name and a.type == b.type and list(a.shape) == list(b.shape)
        qa, qb = a.quantization, b.quantization
        data = [np.asarray(g.buffers[t.buffer].data) for g, t in zip(graphs, (a, b))]
        if data[0].size and not np.array_equal(*data):
            changed.append(a.name.decode())
            assert a.type == s.TensorType.INT32  # a bias
        elif qa is not None and qa.scale is not None:
            np.testing.assert_array_equal(qa.scale, qb.scale)
    assert len(changed) >= 3  # the two convolutions' and the dense layer's
    r = by_method["bias"].metadata["calibration"]["range_setting"]
    assert r["chosen"] == "bias" and list(r["candidates"]) == ["bias"]
    images = _test_images(digits_dir)
    reference = _logits(tf.lite.TFLiteConverter.from_keras_model(tf.keras.models.load_model(digits_keras)).convert(),
                        images)
    error = {m: np.abs((_logits(by_method[m].path.read_bytes(), images) - reference).mean(axis=0)).mean()
             for m in ("minmax", "bias")}
    print(error)
    assert error["bias"] <= 0.5 * error["minmax"]


def test_a_bias_correction_or_equalisation_that_fails_is_skipped_by_auto_and_one_line_when_asked_for(
        outlier_cnn, digits_dir, tmp_path, monkeypatch):
    """A graph the correction did not foresee (here: made to raise inside it), or an equalisation whose float
    model does not compute what the float model does (here: no error tolerated), costs auto one candidate
    each, with the reason in the metadata, never the conversion; asked for, each is one line (exit 3)."""
    from edgekit.converters.int8 import bias_correction
    from edgekit.converters.int8 import equalization as equalize

    def broken(*_args, **_kw):
        raise ValueError("cannot reshape array of size 7 into shape (3)")

    monkeypatch.setattr(bias_correction, "corrected", broken)
    monkeypatch.setattr(equalize, "TOLERANCE", -1.0)
    auto = edgekit.convert(outlier_cnn, mode="int8", calib=digits_dir / "train", output=tmp_path / "a.tflite")
    r = auto.metadata["calibration"]["range_setting"]
    assert "bias" not in r["candidates"] and "cannot reshape" in r["skipped"]["bias"]
    assert "equalize" not in r["candidates"] and "changed this model's outputs" in r["skipped"]["equalize"]
    assert r["chosen"] not in ("bias", "equalize")
    for method, why in (("bias", "bias correction failed on this model: cannot reshape"),
                        ("equalize", "cross-layer equalisation changed this model's outputs")):
        with pytest.raises(edgekit.ConversionError, match=why):
            edgekit.convert(outlier_cnn, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{method}.tflite",
                            calibration=edgekit.CalibrationSpec(method=method))
        assert not (tmp_path / f"{method}.tflite").exists()


@pytest.mark.parametrize("method", ["minmax", "percentile", "bias"])
def test_the_file_is_quantized_from_the_basis_the_budget_autopilot_gets(method, outlier_cnn, digits_dir):
    """`choose` hands the accuracy-budget autopilot the calibrated model its file was made from (chosen ranges
    written in, biases corrected), so the autopilot's mixes keep what was chosen: quantized as it is, it is
    the file, byte for byte."""
    import tensorflow as tf

    from edgekit.converters.int8 import ranges
    from edgekit.converters.int8.choose import choose
    from edgekit.converters.stages.outputs import first_output as _first_output

    folder = ImageFolder.scan(digits_dir / "train")
    x = np.stack([read_image(f) for f in folder.files[:200]])[..., None].astype(np.float32)
    converter = tf.lite.TFLiteConverter.from_keras_model(tf.keras.models.load_model(outlier_cnn))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s[None]] for s in x[:100])
    choice = choose(ranges.calibrated_model(converter), "float32", method, [[s[None]] for s in x[:100]],
                           _first_output, extra=[[s[None]] for s in x[100:]])
    assert choice.entry["chosen"] == method and choice.basis is not None
    assert ranges.quantize(choice.basis, "float32") == choice.tflite


@pytest.mark.parametrize("method", ["percentile", "mse"])
def test_percentile_and_mse_only_narrow_ranges(by_method, method, digits_keras, digits_dir, tmp_path):
    """On the converter's own samples (no more for ranking), percentile and MSE only ever clip its ranges."""
    spec = edgekit.CalibrationSpec(method=method, ranking_samples=200)
    same = edgekit.convert(digits_keras, mode="int8", calib=digits_dir / "train", output=tmp_path / "same.tflite",
                           calibration=spec)
    wide = _activation_scales(by_method["minmax"].path)
    narrow = _activation_scales(same.path)
    common = set(wide) & set(narrow)
    assert len(common) >= 4
    assert all(narrow[n] <= wide[n] * (1 + 1e-6) for n in common)
    assert any(narrow[n] < wide[n] * 0.999 for n in common)  # it did clip something
    r = by_method[method].metadata["calibration"]["range_setting"]
    assert r["chosen"] == method and list(r["candidates"]) == [method] and r["extra_samples"] == 200
    # no sample past the calibration ones: scored two-fold on halves of those
    s = same.metadata["calibration"]["range_setting"]
    assert s["scoring"] == "two_fold" and s["scored_on"] == 200 and s["candidates"][method]["loss"] >= 0


def test_too_few_samples_keep_minmax_and_say_why(digits_keras, digits_dir, tmp_path):
    spec = edgekit.CalibrationSpec(samples=30, ranking_samples=30)
    result = edgekit.convert(digits_keras, mode="int8", calib=digits_dir / "train", calibration=spec,
                             output=tmp_path / "few.tflite")
    r = result.metadata["calibration"]["range_setting"]
    assert r["chosen"] == "minmax" and r["scored_on"] == 0 and "too few" in r["note"]


def test_a_conclusive_candidate_that_leaves_nothing_to_win_ends_the_scoring_unless_every_one_is_asked_for():
    """A variant's min/max (equalize) that agrees within the floor ends auto's scoring as min/max's own score
    does: the candidates not started are skipped and said so, after the scored ones; one running counts;
    `every` (`--calib-effort thorough`) scores them all."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from edgekit.converters.int8.evidence import Evidence, Rounds
    from edgekit.converters.int8.scoring import _score_batches

    class Stub:
        def __init__(self, order: int, conclusive: bool = False):
            self.start_order, self.conclusive, self.costly = order, conclusive, False

    candidates = {"minmax": Stub(4), "percentile": Stub(2), "mse": Stub(3), "bias": Stub(1),
                  "equalize": Stub(0, conclusive=True)}
    scores = {"minmax": 0.05, "percentile": 0.04, "mse": 0.03, "bias": 0.045, "equalize": 0.0001}
    for every in (False, True):
        started, lines, equalized, running = [], [], threading.Event(), threading.Event()

        class Pool(ThreadPoolExecutor):
            def submit(self, fn, /, *args, **kwargs):  # equalize's future done, then bias may end
                future = super().submit(fn, *args, **kwargs)
                if args == ("equalize",):
                    future.add_done_callback(lambda _f: equalized.set())
                return future

        def score_one(m: str) -> dict:
            started.append(m)
            if m == "bias":  # running when equalize's score arrives
                running.set()
                assert equalized.wait(60)
            elif m == "equalize":
                assert running.wait(60)
            losses = scores[m] * np.linspace(0.5, 1.5, 100)  # equalize's lower on every sample
            evidence.add(m, None, losses, np.ones(100, bool))
            return {"agreement": 1.0 if m == "equalize" else 0.9, "snr_db": 30.0, "loss": scores[m]}

        entry: dict = {"requested": "auto", "candidates": {}, "loss": "kl"}
        evidence = Evidence(Rounds([None] * 100), lambda *_: np.zeros(0), b"", "kl", classes=True, logits=True)
        evidence.plan(len(candidates))
        with Pool(max_workers=2) as pool:
            _score_batches(entry, candidates, score_one, pool, lines.append, "", evidence, every)
        if every:
            assert set(entry["candidates"]) == set(candidates) and "skipped" not in entry
            continue
        assert started[0] == "minmax" and set(started[1:]) == {"equalize", "bias"}  # start orders 0 and 1
        assert list(entry["candidates"]) == ["minmax", "bias", "equalize"]
        why = UNBEATABLE.replace("min/max", "equalize", 1)
        assert entry["skipped"] == {"percentile": why, "mse": why}
        said = [str(line) for line in lines]
        assert [line.split(":")[0] for line in said] == [f"calibration method {m}" for m in
                                                         ("minmax", "bias", "equalize", "percentile", "mse")]
        assert "percentile: not scored (equalize left nothing to win)" in said[3]


def test_calib_method_needs_post_training_int8(digits_keras, digits_dir):
    result = run_cli("convert", digits_keras, "--float16", "--calib-method", "mse")
    assert result.returncode == 2 and "--calib-method: sets int8 post-training ranges" in result.error_lines[-1]
    result = run_cli("convert", digits_keras, "--int8", "--calib", digits_dir / "train", "--calib-method", "octav")
    assert result.returncode == 2


def test_aeq_writes_an_int8_file_that_agrees_with_float(by_method, digits_keras, digits_dir):
    """--calib-method aeq: ai-edge-quantizer quantizes the float .tflite; every op but the edges is int8,
    the file is no bigger than the converter's, and it agrees with the Keras model on the test digits."""
    import keras

    from edgekit.runtime.inspect import analyze

    result = by_method["aeq"]
    validate(result.metadata, "edgekit.metadata/1")
    r = result.metadata["calibration"]["range_setting"]
    assert r["chosen"] == "aeq" and list(r["candidates"]) == ["aeq"] and r["candidates"]["aeq"]["agreement"] >= 0.97
    info = analyze(result.path.read_bytes(), gpu=False)
    assert {o["op"] for o in info["float_ops"]} <= {"QUANTIZE", "DEQUANTIZE"}
    assert [t["dtype"] for t in info["inputs"] + info["outputs"]] == ["float32", "float32"]
    # its ops carry the versions their int8 types need (the quantizer alone writes version 1 everywhere)
    plain = analyze(by_method["minmax"].path.read_bytes(), gpu=False)["op_versions"]
    assert info["op_versions"]["CONV_2D"] == plain["CONV_2D"] == [3]
    assert info["op_versions"]["FULLY_CONNECTED"] == plain["FULLY_CONNECTED"]
    assert result.size_bytes <= 1.02 * by_method["minmax"].size_bytes
    images = _test_images(digits_dir)
    reference = keras.models.load_model(digits_keras).predict(images, verbose=0).argmax(1)
    agreement = float(np.mean(Model(result.path).predict(images).argmax(1) == reference))
    assert agreement >= 0.97, agreement


def test_aeq_needs_float_io(digits_keras, digits_dir, tmp_path):
    """ai-edge-quantizer writes float32 I/O: asked for, that is a usage error (no file); under auto it is
    left out and the metadata says why."""
    out = tmp_path / "x.tflite"
    result = run_cli("convert", digits_keras, "--int8", "--io", "uint8", "--calib", digits_dir / "train",
                     "--calib-method", "aeq", "-o", out)
    assert result.returncode == 2 and len(result.error_lines) == 1 and "float32" in result.error_lines[0]
    assert not out.exists()
    auto = edgekit.convert(digits_keras, mode="int8", io="int8", calib=digits_dir / "train", output=out)
    r = auto.metadata["calibration"]["range_setting"]
    assert "not int8" in r["skipped"]["aeq"]  # why aeq was left out, whatever the others measured
    cheap = (set(r["candidates"]) | set(r["skipped"])) - {"gptq"}  # weight rounding may follow them
    assert cheap == {"minmax", "percentile", "mse", "ema", "extremes", "bias", "aeq"}
    validate(auto.metadata, "edgekit.metadata/1")


def test_aeq_op_versions_come_from_tflites_export_with_the_same_outputs(digits_keras, tmp_path, monkeypatch):
    """converters/int8/aeq_quantizer.py sends the quantizer's file (every op at version 1) through TFLite's export for
    the versions; the model must compute exactly what it computed before."""
    from edgekit.converters.int8 import aeq_quantizer as aeq
    from edgekit.runtime.inspect import analyze

    float_model = edgekit.convert(digits_keras, mode="float32", output=tmp_path / "f.tflite").path.read_bytes()
    x = np.random.default_rng(0).uniform(0, 16, (60, 1, 8, 8, 1)).astype(np.float32)
    versioned = aeq.quantize(float_model, [[s] for s in x])
    monkeypatch.setattr(aeq, "_versioned", lambda raw, probe: raw)
    raw = aeq.quantize(float_model, [[s] for s in x])
    assert set(analyze(raw, gpu=False)["op_versions"]["CONV_2D"]) == {1}
    assert analyze(versioned, gpu=False)["op_versions"]["CONV_2D"] == [3]
    a, b = Model(raw), Model(versioned)
    for sample in x:
        np.testing.assert_array_equal(a.invoke_raw([sample])[0], b.invoke_raw([sample])[0])


def test_aeq_file_whose_export_folds_constant_ops_is_kept_when_outputs_are_identical(tmp_path, monkeypatch):
    """A ViT block's reshapes leave SHAPE / GATHER chains on constants that TFLite's export folds: the op
    count changes, the outputs do not, and the file is used (it was refused before, on every ViT)."""
    import keras
    from keras import layers

    from edgekit.converters.int8 import aeq_quantizer as aeq
    from edgekit.runtime.schema import schema_module

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 1))
    x = layers.Reshape((16, 16))(layers.Conv2D(16, 4, strides=4)(inp))
    x = x + layers.Embedding(16, 16)(keras.ops.arange(16)[None])
    x = x + layers.MultiHeadAttention(2, 8)(x, x)
    model = keras.Model(inp, layers.Dense(4, activation="softmax")(layers.GlobalAveragePooling1D()(x)))
    # the batch kept open (-1): at batch 1 TFLite's converter folds the SHAPE chains itself
    float_model = edgekit.convert(model, mode="float32", output=tmp_path / "vit.tflite",
                                  input_shape=(-1, 16, 16, 1)).path.read_bytes()
    samples = [[s] for s in np.random.default_rng(0).uniform(0, 1, (40, 1, 16, 16, 1)).astype(np.float32)]
    versioned = aeq.quantize(float_model, samples)
    monkeypatch.setattr(aeq, "_versioned", lambda raw, probe: raw)
    raw = aeq.quantize(float_model, samples)
    ops = lambda m: schema_module().Model.GetRootAs(m, 0).Subgraphs(0).OperatorsLength()  # noqa: E731
    assert ops(versioned) < ops(raw)
    a, b = Model(raw), Model(versioned)
    for sample in samples[:10]:
        np.testing.assert_array_equal(a.invoke_raw(sample)[0], b.invoke_raw(sample)[0])


def test_aeq_draws_no_progress_bar_on_a_model_of_many_ops(tmp_path, capfd):
    """litert-quantizer's calibrator draws a tqdm bar on stderr for 100 op steps or more and has no switch;
    edgekit's convert output must stay its own lines."""
    import keras

    from edgekit.converters.int8 import aeq_quantizer as aeq
    from edgekit.runtime.schema import schema_module

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(8, activation="relu") for _ in range(110)])
    float_model = edgekit.convert(model, mode="float32", output=tmp_path / "deep.tflite").path.read_bytes()
    assert schema_module().Model.GetRootAs(float_model, 0).Subgraphs(0).OperatorsLength() >= 100
    capfd.readouterr()
    aeq.quantize(float_model, [[s] for s in np.random.default_rng(0).normal(size=(8, 1, 8)).astype(np.float32)])
    assert "Calibration" not in capfd.readouterr().err


def test_the_ranges_not_collected_are_those_tflites_int8_quantizer_does_not_use():
    """ranges.RANGE_NOT_USED: an output of each such op may carry any range, the int8 file is byte-identical
    (a fixed scale, or the input's), so `collect` skips them; a CONCATENATION's or a CONV_2D's range changes
    the file. Guards a TensorFlow upgrade that starts using one of them."""
    import keras
    import tensorflow as tf
    from keras import layers, ops

    from edgekit.converters.int8 import ranges
    from edgekit.runtime.inspect import operators

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    b = layers.AveragePooling2D(2)(layers.Conv2D(8, 3, padding="same")(inp))
    x = layers.Concatenate()([layers.Conv2D(8, 3, padding="same", activation="tanh")(b),
                              layers.Conv2D(8, 1, activation="sigmoid")(b), layers.Conv2D(8, 1)(b)])
    x = layers.MaxPooling2D(2)(layers.Cropping2D(1)(layers.ZeroPadding2D(1)(x)))
    x = ops.squeeze(layers.Conv3D(6, 1)(ops.expand_dims(x, 1)), 1)
    x = layers.Conv2D(8, 1)(ops.take(x, np.array([0, 2, 5]), axis=3))
    x = layers.Permute((3, 1, 2))(ops.slice(x, (0, 1, 1, 0), (1, 2, 2, 8)))
    model = keras.Model(inp, layers.Dense(4, activation="softmax")(layers.Dense(8)(layers.Flatten()(x))))
    samples = [[s] for s in np.random.default_rng(0).normal(size=(32, 1, 16, 16, 3)).astype(np.float32)]
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(samples)
    calibrated = ranges.calibrated_model(converter)
    recorded = ranges.ranged_tensors(calibrated)
    by_op: dict[str, list[int]] = {}
    for _, name, op in operators(calibrated)[2]:
        by_op.setdefault(name, []).extend(t for t in op.outputs if t in recorded)
    assert set(by_op) >= ranges.RANGE_NOT_USED  # every one of them is in the model
    base = ranges.quantize(calibrated, "float32")
    for name, tensors in by_op.items():
        halved = {t: (0.5 * recorded[t][0], 0.5 * recorded[t][1]) for t in tensors}
        moved = ranges.quantize(calibrated, "float32", halved)
        assert (moved == base) == (name in ranges.RANGE_NOT_USED), name
    assert set(ranges.settable_tensors(calibrated)) == {
        t for name, ts in by_op.items() if name not in ranges.RANGE_NOT_USED for t in ts}


def test_bias_correction_measures_on_the_int8_file_with_its_biases_written_in(digits_keras, digits_dir):
    """The corrected biases are written into the min/max file as int32 (round(bias / the file's scale)) while
    they are measured and scored; TFLite's quantizer on the corrected float model (the file written) gives the
    same file up to one step on a few int32 biases."""
    import tensorflow as tf
    from ai_edge_litert import schema_py_generated as s

    from edgekit.converters.int8 import bias_correction, ranges

    folder = ImageFolder.scan(digits_dir / "train")
    samples = [[read_image(f)[None, ..., None].astype(np.float32)] for f in folder.files[:64]]
    converter = tf.lite.TFLiteConverter.from_keras_model(tf.keras.models.load_model(digits_keras))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: iter(samples)
    calibrated = ranges.calibrated_model(converter)
    plain = ranges.quantize(calibrated, "float32")
    correction = bias_correction.corrected(calibrated, samples, lambda m: ranges.quantize(m, "float32"), first=plain)
    quantized = ranges.quantize(bias_correction.with_biases(calibrated, correction.biases), "float32")
    models = [s.ModelT.InitFromObj(s.Model.GetRootAs(b, 0)) for b in (plain, correction.tflite, quantized)]
    moved = 0
    for p, w, q in zip(*(m.subgraphs[0].tensors for m in models), strict=True):
        data = [np.asarray(m.buffers[t.buffer].data) for m, t in zip(models, (p, w, q))]
        if p.type != s.TensorType.INT32 or not data[0].size:
            assert all(np.array_equal(data[0], d) for d in data[1:]), p.name  # weights, ranges: the plain file's
            continue
        written, requantized = (np.frombuffer(d.tobytes(), np.int32).astype(np.int64) for d in data[1:])
        assert np.abs(written - requantized).max() <= 1
        moved += not np.array_equal(written, np.frombuffer(data[0].tobytes(), np.int32))
    assert moved >= 3  # the two convolutions' and the dense layer's biases


def test_auto_scores_the_models_first_output_where_the_graph_lists_another_first(digits_dir, tmp_path):
    """A face model listing its score first and its box second (as MTCNN's ONet does) whose TFLite graph lists
    the box first (the order its layers were made in): auto scores the model's first output, found by its
    signature name, on its logits with the KL its class scores take, not the box."""
    import keras

    from edgekit.runtime import ImageFolder
    from edgekit.runtime.backend import get_backend

    folder = ImageFolder.scan(digits_dir / "train")
    x = np.stack([read_image(f) for f in folder.files])[..., None].astype(np.float32)
    even = np.asarray([int(folder.classes[i]) % 2 for i in folder.labels])
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 1))
    h = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(keras.layers.Rescaling(1 / 255.0)(inp)))
    box = keras.layers.Dense(4, name="box")(h)  # made first
    score = keras.layers.Dense(2, activation="softmax", name="score")(h)
    model = keras.Model(inp, [score, box])
    model.compile("adam", ["sparse_categorical_crossentropy", "mse"])
    model.fit(x, [even, x[:, :2, :2, 0].reshape(len(x), 4) / 255.0], epochs=3, verbose=0)
    model.save(tmp_path / "face.keras")
    result = edgekit.convert(tmp_path / "face.keras", mode="int8", calib=digits_dir / "train",
                             output=tmp_path / "face.tflite")
    runner = get_backend().runner(model_content=result.path.read_bytes(), num_threads=None)
    first = runner.output_details()[0]["index"]
    assert runner.signature_details()[1]["box"]["index"] == first  # the premise: the graph lists the box first
    r = result.metadata["calibration"]["range_setting"]
    assert r["scored_output"] == "logits" and r["loss"] == "kl", r
    assert Model(result.path).outputs[0].name == "score"
