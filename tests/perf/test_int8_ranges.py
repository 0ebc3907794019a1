"""Plain converter int8 vs edgekit's default int8 (--calib-method auto) on models trained here, seeded, on
the bundled digits: the digits CNN, a 6-conv CNN with activation outliers, a MobileNetV2 (alpha 0.35), a
MobileNetV3Small (hard-swish, squeeze-excite), a MobileNetV3Small and a MobileNetV3Large built with their own
preprocessing behind ours, an EfficientNetB0 (swish, squeeze-excite) at 64x64 RGB and a small ViT (LayerNorm,
softmax attention, GELU) at 32x32; and, where the clean digits leave int8 little to lose, an EfficientNetB0, an
EfficientNetV2B0, a MobileNetV3Large and a ConvNeXt-style net (7x7 depthwise, LayerNorm, GELU) trained on the
noisy digits (tests/helpers.noisy_digits: small margins, as on hard datasets); the ViT and the noisy ConvNeXt
with outlier features (`_with_outlier_features`, the float function unchanged): top-1 drop against float on the
360 test images with its 95 % interval, agreement and SNR, file size, p50 (one thread, interleaved) and
conversion time, measured in one run, with ai-edge-quantizer's own int8 (--calib-method aeq) and the cross-layer
equalised model's (--calib-method equalize) beside them; then `--max-drop` budgets. Issue 50's bounds:
within 1.0 point of float where plain loses >= 1 (judged on the paired interval, RULINGS 49), at most half
plain's disagreement where plain agrees < 95 % (RULINGS 50), size <= 1.05x and p50 <= 1.1x plain int8's,
`--max-drop 0.5` on the EfficientNetB0s at p50 <= 1.2x the default int8 file's.
`python -m pytest -m perf -s tests/perf/test_int8_ranges.py` (about 100 minutes on 2 cores, most of it training)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import edgekit
from edgekit.metrics import compare_outputs
from edgekit.runtime import Model, PreprocessSpec
from tests.helpers import labelled_images, noisy_digits

pytestmark = pytest.mark.perf


def _fit(model, path, digits_dir, epochs, cosine: bool = False):
    """`model` trained on the bundled training digits (Adam 2e-3; with `cosine`, decayed to 0 over the run)."""
    import keras

    x, y = labelled_images(digits_dir / "train", PreprocessSpec(*model.input_shape[1:]))
    rate = keras.optimizers.schedules.CosineDecay(2e-3, epochs * -(-len(x) // 32)) if cosine else 2e-3
    model.compile(keras.optimizers.Adam(rate), "sparse_categorical_crossentropy")
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    model.save(path)
    return path


def _application(path, digits_dir, name, epochs, cosine: bool = False, size: int = 64, momentum: float | None = 0.9,
                 **kw):
    """A keras.applications network at `size` x `size` RGB, weights from scratch, BatchNorm momentum 0.9 (the
    default 0.999 has not forgotten its start after 1,000 steps; None keeps it)."""
    import keras

    keras.utils.set_random_seed(0)
    base = getattr(keras.applications, name)(input_shape=(size, size, 3), weights=None, classes=10, **kw)
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization) and momentum is not None:
            layer.momentum = momentum
    inp = keras.Input((size, size, 3))
    scaled = inp if name.startswith("EfficientNet") else keras.layers.Rescaling(1 / 127.5, offset=-1)(inp)
    return _fit(keras.Model(inp, base(scaled)), path, digits_dir, epochs, cosine)


def _mobilenet(path, digits_dir):
    return _application(path, digits_dir, "MobileNetV2", 20, alpha=0.35)


def _vit(path, digits_dir, size=32, patch=4, dim=64, depth=4, heads=4):
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((size, size, 1))
    x = layers.Conv2D(dim, patch, strides=patch)(layers.Rescaling(1 / 255.0)(inp))
    n = (size // patch) ** 2
    x = layers.Reshape((n, dim))(x) + layers.Embedding(n, dim)(keras.ops.arange(n)[None])
    for _ in range(depth):
        h = layers.LayerNormalization()(x)
        x = x + layers.MultiHeadAttention(heads, dim // heads)(h, h)
        h = layers.Dense(2 * dim, activation="gelu")(layers.LayerNormalization()(x))
        x = x + layers.Dense(dim)(h)
    x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(x))
    return _fit(keras.Model(inp, layers.Dense(10, activation="softmax")(x)), path, digits_dir, 30)


def _convnext(path, digits_dir, epochs=15):
    """A small ConvNeXt at 64x64 RGB: patchify stem, blocks of 7x7 depthwise, LayerNorm, an inverted GELU
    MLP and a residual add, three stages (32, 64, 128 channels, two blocks each)."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((64, 64, 3))
    x = layers.LayerNormalization(epsilon=1e-6)(layers.Conv2D(32, 4, strides=4)(layers.Rescaling(1 / 127.5, offset=-1)(inp)))
    for stage, dim in enumerate((32, 64, 128)):
        if stage:
            x = layers.Conv2D(dim, 2, strides=2)(layers.LayerNormalization(epsilon=1e-6)(x))
        for _ in range(2):
            y = layers.LayerNormalization(epsilon=1e-6)(layers.DepthwiseConv2D(7, padding="same")(x))
            x = layers.Add()([x, layers.Dense(dim)(layers.Dense(4 * dim, activation="gelu")(y))])
    x = layers.LayerNormalization(epsilon=1e-6)(layers.GlobalAveragePooling2D()(x))
    return _fit(keras.Model(inp, layers.Dense(10, activation="softmax")(x)), path, digits_dir, epochs)


def _with_outlier_features(path, source, factor: float = 200.0):
    """The model at `source` with two channels of each LayerNorm's output that feeds one Dense alone scaled
    `factor` times and that Dense's input rows divided back: the float function is the same; the few huge
    channels a per-tensor int8 scale must span are what trained transformers grow (LLM.int8's outlier
    features). At 60x the ViT's plain int8 lost nothing (-1.11); at 200x it loses 5.83 (session 54)."""
    import keras

    model = keras.models.load_model(source)
    for layer in model.layers:
        parents = [n.operation for n in layer._inbound_nodes[0].parent_nodes] if layer._inbound_nodes else []
        if isinstance(layer, keras.layers.Dense) and len(parents) == 1 \
                and isinstance(parents[0], keras.layers.LayerNormalization) and len(parents[0]._outbound_nodes) == 1:
            (gamma, beta), (kernel, bias) = parents[0].get_weights(), layer.get_weights()
            for c in (3, 17):
                gamma[c] *= factor
                beta[c] *= factor
                kernel[c, :] /= factor
            parents[0].set_weights([gamma, beta])
            layer.set_weights([kernel, bias])
    model.save(path)
    return path


def _outlier(path, digits_dir):
    from tests.helpers import deep_digits_cnn, with_activation_outliers

    with_activation_outliers(deep_digits_cnn(digits_dir), "conv1", "conv2").save(path)
    return path


def _row(name, keras_path, digits_dir, tmp_path):
    import keras

    reference = keras.models.load_model(keras_path)
    spec = PreprocessSpec(*reference.input_shape[1:])
    x, y = labelled_images(digits_dir / "test", spec)
    ref = reference.predict(x, verbose=0)
    float_top1 = float(np.mean(ref.argmax(1) == y))
    out = {}
    # untimed: a model's first conversion in a process pays a warm-up (the outlier CNN: minmax 1.4 s first,
    # 0.6 s after), which the first method timed would carry alone
    edgekit.convert(keras_path, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{name}.warm.tflite",
                    calibration=edgekit.CalibrationSpec(method="minmax"))
    for method in ("minmax", "aeq", "equalize", "auto"):
        start = time.perf_counter()
        try:
            result = edgekit.convert(keras_path, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{name}.{method}.tflite",
                                     calibration=edgekit.CalibrationSpec(method=method))
        except edgekit.EdgekitError as exc:
            # ai-edge-quantizer's file may be refused (converters/int8/aeq_quantizer.py); equalisation may find nothing to move
            assert method in ("aeq", "equalize"), exc
            print(f"  {method}: {exc}")
            continue
        seconds = time.perf_counter() - start
        got = Model(result.path).predict(x)
        cmp = compare_outputs(ref, got)
        rs = result.metadata["calibration"]["range_setting"]
        if rs.get("escalation"):
            print(f"  {method}: weight rounding {rs['escalation']}")
        if rs.get("float_head"):
            print(f"  {method}: float head {({k: v for k, v in rs['float_head'].items() if k != 'ops'})}")
        out[method] = {"drop": 100 * (float_top1 - float(np.mean(got.argmax(1) == y))), "agree": cmp["top1_agreement"],
                       "snr": cmp["snr_db"], "size": result.size_bytes, "seconds": seconds, "chosen": rs["chosen"],
                       "candidates": rs["candidates"], "scored_on": rs["scored_on"], "path": result.path,
                       "escalated": bool((rs.get("escalation") or {}).get("ran")), "correct": got.argmax(1) == y,
                       "agrees": got.argmax(1) == ref.argmax(1)}
    # timed twice more, the shortest kept: a ViT's plain conversion took 3.7 to 6.1 s in one session
    for method in ("minmax", "auto", "minmax", "auto"):
        start = time.perf_counter()
        edgekit.convert(keras_path, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{name}.again.tflite",
                        calibration=edgekit.CalibrationSpec(method=method), force=True)
        out[method]["seconds"] = min(out[method]["seconds"], time.perf_counter() - start)
    print(f"\n{name}: float top-1 {100 * float_top1:.2f}% on {len(y)} test images")
    print(f"  auto's scores on {out['auto']['scored_on']} held-out calibration-source samples (agreement / logit SNR / "
          "KL / seconds): " + ", ".join(f"{m} {100 * c['agreement']:.2f}% / {c['snr_db']:.1f} dB / "
                                        f"{c.get('kl', 0):.4f} / {c['seconds']:.1f} s"
                                        for m, c in out["auto"]["candidates"].items()))
    for method, label in (("minmax", "plain converter"), ("aeq", "ai-edge-quantizer"), ("equalize", "equalised"),
                          ("auto", "edgekit auto")):
        if method not in out:
            continue
        r = out[method]
        print(f"  {label:16} drop {r['drop']:+.2f} pts, agreement {100 * r['agree']:.2f}%, SNR {r['snr']:.1f} dB, "
              f"{r['size']} bytes, {r['seconds']:.1f} s (ranges: {r['chosen']})")
    from edgekit.intervals import compare

    reference_correct = ref.argmax(1) == y
    for method in ("minmax", "auto"):  # the loss with its 95 % interval, paired on the test images
        c = compare(reference_correct=reference_correct, candidate_correct=out[method]["correct"])
        out[method]["interval"] = tuple(-v for v in reversed(c.change_interval)) if c.change_interval else None
    from edgekit.converters.dominance import interleaved_p50

    out["minmax"]["p50"], out["auto"]["p50"] = interleaved_p50([out[m]["path"].read_bytes() for m in ("minmax", "auto")])
    out["float_top1"] = 100 * float_top1
    out["reference_correct"] = reference_correct
    return out


def test_default_int8_against_the_plain_converter_on_models_trained_here(digits_keras, digits_dir, tmp_path):
    from edgekit.intervals import compare, judge_budget, matches

    models = {"digits CNN": lambda: digits_keras,
              "outlier CNN": lambda: _outlier(tmp_path / "outlier.keras", digits_dir),
              "MobileNetV2 0.35 64x64": lambda: _mobilenet(tmp_path / "mobilenet.keras", digits_dir),
              "MobileNetV3Small 0.75 64x64": lambda: _application(tmp_path / "mnv3.keras", digits_dir,
                                                                  "MobileNetV3Small", 30, alpha=0.75,
                                                                  include_preprocessing=False, dropout_rate=0.0),
              # keras.applications' MobileNetV3 keeps its own Rescaling by default (include_preprocessing=True):
              # behind ours it sees pixels in [-1.008, -0.992], trains as well, and its int8 kernels' rounding
              # moves every channel's mean (converters/int8/bias_correction.py)
              "MobileNetV3Small 0.75 64x64, own preprocessing": lambda: _application(
                  tmp_path / "mnv3pre.keras", digits_dir, "MobileNetV3Small", 30, alpha=0.75, dropout_rate=0.0),
              # BatchNorm momentum 0.9 left it at 31.94 % float top-1, the default 0.999 at 10.00 %; a cosine-decayed
              # rate trains it (98.61 %)
              "MobileNetV3Large 0.75 64x64, own preprocessing": lambda: _application(
                  tmp_path / "mnv3large.keras", digits_dir, "MobileNetV3Large", 20, alpha=0.75, dropout_rate=0.0,
                  cosine=True),
              "EfficientNetB0 64x64": lambda: _application(tmp_path / "effb0.keras", digits_dir, "EfficientNetB0", 20),
              "ViT 32x32 4x64": lambda: _vit(tmp_path / "vit.keras", digits_dir),
              "ViT with outlier features": lambda: _with_outlier_features(tmp_path / "vito.keras", tmp_path / "vit.keras")}
    noisy = noisy_digits(digits_dir, tmp_path / "noisy")
    models["EfficientNetB0 64x64, noisy digits"] = lambda: _application(tmp_path / "effb0n.keras", noisy,
                                                                       "EfficientNetB0", 12)
    models["EfficientNetV2B0 64x64, noisy digits"] = lambda: _application(tmp_path / "effv2n.keras", noisy,
                                                                         "EfficientNetV2B0", 12)
    models["MobileNetV3Large 0.75 64x64, noisy digits"] = lambda: _application(
        tmp_path / "mnv3ln.keras", noisy, "MobileNetV3Large", 15, alpha=0.75, include_preprocessing=False,
        dropout_rate=0.0)
    models["ConvNeXt-style 64x64, noisy digits"] = lambda: _convnext(tmp_path / "convnextn.keras", noisy)
    # its 7 LayerNorm -> Dense pairs with outlier features: plain int8 collapses (session 55: +76.39, agreement
    # 14.17 %), auto's equalised file +0.56, 98.89 %, at 1.14x plain's time (1.65x before auto stopped scoring
    # where equalize left nothing to win)
    models["ConvNeXt-style with outlier features, noisy digits"] = lambda: _with_outlier_features(
        tmp_path / "convnexto.keras", tmp_path / "convnextn.keras")
    data = {name: noisy if name.endswith("noisy digits") else digits_dir for name in models}
    table, paths, missed, halved, slow, far, slower, unresolved = [], {}, [], [], [], [], [], []
    for name, build in models.items():
        paths[name] = build()
        r = _row(name.split()[0] + str(len(table)), paths[name], data[name], tmp_path)  # one file name a row
        plain, ours = r["minmax"], r["auto"]
        print(f"  size ratio {ours['size'] / plain['size']:.4f}, conversion time ratio "
              f"{ours['seconds'] / plain['seconds']:.2f}, p50 ratio {ours['p50'] / plain['p50']:.2f} (one thread, "
              f"interleaved: {ours['p50']:.3f} / {plain['p50']:.3f} ms)")
        table.append((name, r))
        # never further from the float model than plain, nor worse in top-1 where plain loses < 0.3, by more than
        # the 360 images resolve: judged on the paired interval (intervals.matches, RULINGS 49), as budgets are. On
        # the point estimate a ViT's auto (extremes) agreed on 4 test images fewer (97.78 % against 98.89 %), having
        # measured a KL 27 % lower on 200 held-out samples; every row is printed before the bounds are checked
        if matches(ours["agrees"], plain["agrees"]) is None:
            missed.append(f"{name}: agreement {ours['agree']:.4f} against plain's {plain['agree']:.4f}")
        # issue 50's bound; on the 94 KB outlier CNN the metadata of auto's choice (each candidate's scores) is
        # 1.7 % of the file (96,218 bytes against the equalised file's 94,586, the same model)
        if ours["size"] > 1.05 * plain["size"]:
            missed.append(f"{name}: {ours['size'] / plain['size']:.4f}x plain's size")
        if plain["drop"] >= 1.0 and ours["drop"] <= plain["drop"] / 2:
            halved.append(name)
        if plain["drop"] < 0.3 and matches(ours["correct"], plain["correct"]) is None:
            missed.append(f"{name}: drop {ours['drop']:.2f} against plain's {plain['drop']:.2f}")
        if ours["seconds"] > 1.5 * plain["seconds"]:
            slow.append(f"{name}: {ours['seconds'] / plain['seconds']:.2f}x"
                        + (" (weight rounding ran)" if ours["escalated"] else ""))
        # issue 50: within 1.0 point of float wherever plain loses >= 1, judged as every budget is, on the
        # paired interval (RULINGS 49: missed where its lower end is over 1.0; one the 360 images cannot resolve
        # is printed with the images that would, not missed)
        if plain["drop"] >= 1.0 and ours["drop"] > 1.0:
            verdict = judge_budget(compare(reference_correct=r["reference_correct"], candidate_correct=ours["correct"]),
                                   1.0)
            line = f"{name}: {ours['drop']:+.2f} (plain {plain['drop']:+.2f}): {verdict.message}"
            (far if verdict.missed else unresolved).append(line)
        # RULINGS 50: where plain agrees with float on under 95 %, at most half its disagreement
        if plain["agree"] < 0.95 and 1 - ours["agree"] > (1 - plain["agree"]) / 2 + 1e-9:
            far.append(f"{name}: agreement {100 * ours['agree']:.2f} % (plain {100 * plain['agree']:.2f} %)")
        if ours["p50"] > 1.1 * plain["p50"]:
            slower.append(f"{name}: p50 {ours['p50'] / plain['p50']:.2f}x plain's")
    print("\n| model | float top-1 | plain converter: drop (95 % interval), agreement, SNR | edgekit auto: ranges, "
          "drop (95 % interval), agreement, SNR | size, p50, time ratio |\n|---|---|---|---|---|")
    for name, r in table:
        p, o = r["minmax"], r["auto"]
        span = lambda v: f" ({v['interval'][0]:+.2f} to {v['interval'][1]:+.2f})" if v["interval"] else ""  # noqa: E731
        print(f"| {name} | {r['float_top1']:.2f} % | {p['drop']:+.2f}{span(p)}, {100 * p['agree']:.2f} %, "
              f"{p['snr']:.1f} dB | {o['chosen']}: {o['drop']:+.2f}"
              f"{span(o)}, {100 * o['agree']:.2f} %, {o['snr']:.1f} dB | {o['size'] / p['size']:.3f}x, "
              f"{o['p50'] / p['p50']:.2f}x, {o['seconds'] / p['seconds']:.2f}x |")
    # the EfficientNetB0's int16 budget exercises the int16x8 step and the choice by p50 (session 54's run: int16x8,
    # float by sensitivity and float in graph order all met, 6.82, 0.990 and 0.858 ms; the graph order's kept, 19
    # of 239 ops in float, 1.02x the int8 file's p50)
    for name, points, int16 in (("MobileNetV2 0.35 64x64", 0.2, False), ("MobileNetV2 0.35 64x64", 0.2, True),
                                ("EfficientNetB0 64x64", 0.5, False), ("EfficientNetB0 64x64", 0.5, True),
                                ("ViT with outlier features", 0.5, False),
                                ("EfficientNetB0 64x64, noisy digits", 0.5, False)):
        ratio = _budget(name, paths[name], points, dict(table)[name], data[name], tmp_path, int16)
        if name.startswith("EfficientNetB0") and ratio > 1.2:  # issue 50: met at p50 <= 1.2x the int8 file's
            slower.append(f"{name} --max-drop {points}{' int16' if int16 else ''}: p50 {ratio:.2f}x the int8 file's")
    print(f"plain int8 lost >= 1 point and auto at most half of it on: {halved}")
    print(f"default int8 over 1.5x plain's conversion time (best of three each): {slow}")
    print(f"default int8 more than 1.0 point under float where plain lost >= 1, or over half plain's "
          f"disagreement where plain agreed < 95 %: {far}")
    print(f"files over their p50 bound: {slower}")
    print(f"more than 1.0 point under float on the point estimate, not resolved by the test images: {unresolved}")
    assert len(halved) >= 3, halved  # issue 32: at least three such models
    assert not missed, missed
    # issue 50: <= 1.5x where the cheap candidates decided (session 52's run: 1.02-1.38x; session 45's, before
    # candidates were scored two at a time and equalised without a TF conversion: 2.84x, 3.01x), <= 5x where
    # weight rounding ran
    assert all(r["auto"]["seconds"] <= (5.0 if r["auto"]["escalated"] else 1.5) * r["minmax"]["seconds"]
               for _, r in table), slow
    assert not far, far
    assert not slower, slower


def _budget(name, path, points, row, digits_dir, tmp_path, int16: bool) -> float:
    """The autopilot's file for `--max-drop points`, printed; returns its p50 over the default int8 file's."""
    from edgekit.converters.dominance import interleaved_p50

    budget = edgekit.convert(path, mode="int8", calib=digits_dir / "train", output=tmp_path / "budget.tflite",
                             budget=edgekit.BudgetSpec(max_drop=points, eval_data=digits_dir / "test", int16=int16),
                             force=True)
    a = budget.metadata["autopilot"]
    steps = [d["action"] for d in a["decisions"]]
    plain = row["minmax"]
    p50, p50_plain, p50_int8 = interleaved_p50([p.read_bytes() for p in (budget.path, plain["path"], row["auto"]["path"])])
    ratio, choice = p50 / p50_plain, a.get("latency_choice")
    print(f"  {name} --max-drop {points}{' --max-drop-int16' if int16 else ''}: plain int8 {a['plain_int8_drop']:+.2f} "
          f"pts, result {a['drop']:+.2f} pts, met {a['met']}, one image = {a['resolution_points']:.2f} pts, "
          f"{len(a['float_ops'])} of {a['total_ops']} ops in float ({100 * a['float_share']:.1f}%), "
          f"{len(a['int16_ops'])} at int16 ({100 * a['int16_share']:.1f}%), {budget.size_bytes} bytes "
          f"({budget.size_bytes / plain['size']:.2f}x plain int8), p50 {ratio:.2f}x plain int8's "
          f"({p50 / p50_int8:.2f}x the default int8 file's), search {a['seconds']:.0f} s: {len(a['trials'])} trials, "
          f"{steps}" + ("; mixes that met it: " + ", ".join(f"{m['name']} {m['ops']} ops {m['p50_ms']:.3f} ms"
                                                           for m in choice["mixes"])
                        + f": {choice['chosen']} kept, {choice['reason']}" if choice else ""))
    # every op in float is the float model: a budget it meets is met (the accumulating search, issue 32)
    assert a["met"] and a["drop"] <= points and a["float_share"] < 1.0
    return p50 / p50_int8
