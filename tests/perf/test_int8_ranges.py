"""Plain converter int8 vs edgekit's default int8 (--calib-method auto) on models trained here, seeded, on
the bundled digits: the digits CNN, a 6-conv CNN with activation outliers, a MobileNetV2 (alpha 0.35), a
MobileNetV3Small (hard-swish, squeeze-excite), a MobileNetV3Small and a MobileNetV3Large built with their own
preprocessing behind ours, an EfficientNetB0 (swish, squeeze-excite) at 64x64 RGB and a small ViT (LayerNorm,
softmax attention, GELU) at 32x32; and, where the clean digits leave int8 little to lose, an EfficientNetB0, an
EfficientNetV2B0, a MobileNetV3Large and a ConvNeXt-style net (7x7 depthwise, LayerNorm, GELU) trained on the
noisy digits (tests/helpers.noisy_digits: small margins, as on hard datasets); the ViT and the noisy ConvNeXt
with outlier features (`_with_outlier_features`, the float function unchanged). Each file is measured on
2,520 test images (tests/helpers.augmented_digits: 7 new images of each of the 360 test digits), its top-1
drop against float with a 95 % interval from a bootstrap over the 360 digits (the copies of one digit err
alike: counted as one draw, not seven), agreement and SNR, file size, p50 (one thread, interleaved) and
conversion time, measured in one run, with ai-edge-quantizer's own int8 (--calib-method aeq) and the
cross-layer equalised model's (--calib-method equalize) beside them; then `--max-drop` budgets. The bounds:
each row's loss judged met, missed or unresolved at 1.0 point on its interval, an unresolved one no wider
than +-0.5 point; where plain loses >= 1, not missed; at most half plain's disagreement where plain agrees <
95 %; never further from the float model, nor worse in top-1 where plain loses < 0.3, than plain beyond the
interval; size <= 1.05x and p50 <= 1.1x plain int8's; conversion time <= 3x plain's; `--max-drop 0.5` on
the EfficientNetB0s at p50 <= 1.2x the default int8 file's. With EDGEKIT_INT8_BASELINE=DIR (the folder an
earlier run left its files in, `--basetemp`), each default file is also held to that run's file of the
same row: not worse in agreement or top-1 beyond the interval. EDGEKIT_BENCH_MODELS=DIR reuses the trained
models such a folder holds (each trains the same, seeded, on one machine) instead of training them again.
EDGEKIT_BENCH_ONLY=NAME;NAME runs only the rows of those names (and their budgets): each row's bounds
hold, the whole set's (three rows that halve plain's loss) are not judged.
`python -m pytest -m perf -s tests/perf/test_int8_ranges.py` (about 100 minutes on 2 cores, most of it
training)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import edgekit
from edgekit.metrics import compare_outputs
from edgekit.runtime import Model, PreprocessSpec
from tests.helpers import augmented_digits, clusters_of, labelled_images, noisy_digits, paired_points

pytestmark = pytest.mark.perf


def _fit(model, path, digits_dir, epochs, cosine: bool = False):
    """`model` trained on the bundled training digits (Adam 2e-3; with `cosine`, decayed to 0 over the run); the
    trained model EDGEKIT_BENCH_MODELS holds under its name, where it holds one."""
    import keras

    if _reused(path):
        return path

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
    features). At 60x the ViT's plain int8 lost nothing (-1.11); at 200x it loses 5.83."""
    import keras

    if _reused(path):
        return path
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


def _reused(path: Path) -> bool:
    """Whether EDGEKIT_BENCH_MODELS has the model of this name (copied to `path`)."""
    kept = Path(os.environ.get("EDGEKIT_BENCH_MODELS", "/nonexistent")) / Path(path).name
    if kept.is_file():
        shutil.copyfile(kept, path)
    return kept.is_file()


def _outlier(path, digits_dir):
    from tests.helpers import deep_digits_cnn, with_activation_outliers

    if _reused(path):
        return path

    with_activation_outliers(deep_digits_cnn(digits_dir), "conv1", "conv2").save(path)
    return path


def _paired(reference: np.ndarray, candidate: np.ndarray, clusters: list[str]) -> tuple[float, tuple[float, float]]:
    """The candidate's share of per-image successes minus the reference's, in points, with its 95 % interval
    over the digits the images were made from (each digit's copies one draw)."""
    return paired_points(reference, candidate, clusters)


def _verdict(loss: float, interval: tuple[float, float], budget: float = 1.0) -> str:
    """'met', 'missed' or 'unresolved' for a loss (points) and its interval against `budget`."""
    low, high = interval
    return "met" if high <= budget else "missed" if low > budget else "unresolved"


def _row(name, keras_path, digits_dir, tmp_path, test_dir):
    import keras

    reference = keras.models.load_model(keras_path)
    spec = PreprocessSpec(*reference.input_shape[1:])
    x, y = labelled_images(test_dir, spec)
    clusters = clusters_of(test_dir)
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
            print(f"  {method}: float head {({k: v for k, v in rs['float_head'].items() if k not in ('ops', 'score')})}")
        for d in rs.get("decisions", []):
            print(f"  {method}: {d['candidate']} vs {d['against']}: n={d['n']} p={d['p']} (level {d['alpha']:.2g}, "
                  f"{d['looks']} looks, {d['seconds']:.1f} s) {'kept' if d['kept'] else 'not kept'}: {d['why']}")
        if rs.get("verification_check"):
            print(f"  {method}: verification check {rs['verification_check']}")
        out[method] = {"drop": 100 * (float_top1 - float(np.mean(got.argmax(1) == y))), "agree": cmp["top1_agreement"],
                       "snr": cmp["snr_db"], "size": result.size_bytes, "seconds": seconds, "chosen": rs["chosen"],
                       "candidates": rs["candidates"], "scored_on": rs["scored_on"], "path": result.path,
                       "ranked_on": rs.get("ranked_on", rs["scored_on"]),
                       "escalated": bool((rs.get("escalation") or {}).get("ran")), "correct": got.argmax(1) == y,
                       "agrees": got.argmax(1) == ref.argmax(1)}
    # timed twice more, the shortest kept: a ViT's plain conversion took 3.7 to 6.1 s in one session
    for method in ("minmax", "auto", "minmax", "auto"):
        start = time.perf_counter()
        edgekit.convert(keras_path, mode="int8", calib=digits_dir / "train", output=tmp_path / f"{name}.again.tflite",
                        calibration=edgekit.CalibrationSpec(method=method), force=True)
        out[method]["seconds"] = min(out[method]["seconds"], time.perf_counter() - start)
    print(f"\n{name}: float top-1 {100 * float_top1:.2f}% on {len(y)} test images ({len(set(clusters))} digits)")
    print(f"  auto's scores on {out['auto']['scored_on']} held-out calibration-source samples (agreement / logit SNR / "
          "mean loss / seconds): " + ", ".join(f"{m} {100 * c['agreement']:.2f}% / {c['snr_db']:.1f} dB / "
                                               f"{c.get('loss', 0):.4f} / {c['seconds']:.1f} s"
                                               for m, c in out["auto"]["candidates"].items()))
    for method, label in (("minmax", "plain converter"), ("aeq", "ai-edge-quantizer"), ("equalize", "equalised"),
                          ("auto", "edgekit auto")):
        if method not in out:
            continue
        r = out[method]
        print(f"  {label:16} drop {r['drop']:+.2f} pts, agreement {100 * r['agree']:.2f}%, SNR {r['snr']:.1f} dB, "
              f"{r['size']} bytes, {r['seconds']:.1f} s (ranges: {r['chosen']})")
    reference_correct = ref.argmax(1) == y
    for method in ("minmax", "auto"):  # the loss with its 95 % interval, paired on the test images by digit
        _, (low, high) = _paired(reference_correct, out[method]["correct"], clusters)
        out[method]["interval"] = (-high, -low)
    from edgekit.converters.dominance import interleaved_p50

    out["minmax"]["p50"], out["auto"]["p50"] = interleaved_p50([out[m]["path"].read_bytes() for m in ("minmax", "auto")])
    out["float_top1"] = 100 * float_top1
    out["reference_correct"] = reference_correct
    out["clusters"], out["reference_top"] = clusters, ref.argmax(1)
    out["x"], out["y"] = x, y
    return out


def _baseline(name: str, row: dict) -> list[str]:
    """The default file against the earlier run's file of the same row (EDGEKIT_INT8_BASELINE): where it is
    worse in agreement with the float model or in top-1 beyond the interval, why; printed either way."""
    folder = os.environ.get("EDGEKIT_INT8_BASELINE")
    if not folder:
        return []
    kept = next(Path(folder).glob(f"*/{Path(row['auto']['path']).name}"), None)
    if kept is None:
        return [f"{name}: no file {Path(row['auto']['path']).name} under {folder}"]
    before = Model(kept).predict(row["x"]).argmax(1)
    ours = row["auto"]
    missed = []
    for what, mine, theirs in (("agreement", ours["agrees"], before == row["reference_top"]),
                               ("top-1", ours["correct"], before == row["y"])):
        change, (low, high) = _paired(theirs, mine, row["clusters"])
        print(f"  against the baseline's file ({kept.parent.name}): {what} {change:+.2f} pts ({low:+.2f} to {high:+.2f})")
        if high < 0:
            missed.append(f"{name}: {what} {change:+.2f} points against the baseline's file ({low:+.2f} to {high:+.2f})")
    return missed


def test_default_int8_against_the_plain_converter_on_models_trained_here(digits_keras, digits_dir, tmp_path):
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
    # its 7 LayerNorm -> Dense pairs with outlier features: plain int8 collapses (+76.39, agreement 14.17 % on
    # the 360 test digits), auto's equalised file +0.56, 98.89 %
    models["ConvNeXt-style with outlier features, noisy digits"] = lambda: _with_outlier_features(
        tmp_path / "convnexto.keras", tmp_path / "convnextn.keras")
    only = [n for n in os.environ.get("EDGEKIT_BENCH_ONLY", "").split(";") if n]
    unknown = sorted(set(only) - set(models))
    assert not unknown, f"EDGEKIT_BENCH_ONLY names no row {unknown}; the rows: {list(models)}"
    if "ConvNeXt-style with outlier features, noisy digits" in only:  # made from the noisy ConvNeXt's file
        models["ConvNeXt-style 64x64, noisy digits"]()
    if "ViT with outlier features" in only:
        models["ViT 32x32 4x64"]()
    models = {k: v for k, v in models.items() if not only or k in only}
    data = {name: noisy if name.endswith("noisy digits") else digits_dir for name in models}
    tests = {digits_dir: augmented_digits(digits_dir, tmp_path / "test"),
             noisy: augmented_digits(digits_dir, tmp_path / "noisy-test", noisy=True)}
    table, paths, missed, halved, slow, far, slower, wide = [], {}, [], [], [], [], [], []
    for name, build in models.items():
        paths[name] = build()
        r = _row(name.split()[0] + str(len(table)), paths[name], data[name], tmp_path, tests[data[name]])
        plain, ours = r["minmax"], r["auto"]
        print(f"  size ratio {ours['size'] / plain['size']:.4f}, conversion time ratio "
              f"{ours['seconds'] / plain['seconds']:.2f}, p50 ratio {ours['p50'] / plain['p50']:.2f} (one thread, "
              f"interleaved: {ours['p50']:.3f} / {plain['p50']:.3f} ms)")
        table.append((name, r))
        missed += _bounds(name, r, halved, slow, far, slower, wide)
        missed += _baseline(name, r)
    _print_table(table)
    # the EfficientNetB0's int16 budget exercises the int16x8 step and the choice by p50
    for name, points, int16 in (("MobileNetV2 0.35 64x64", 0.2, False), ("MobileNetV2 0.35 64x64", 0.2, True),
                                ("EfficientNetB0 64x64", 0.5, False), ("EfficientNetB0 64x64", 0.5, True),
                                ("ViT with outlier features", 0.5, False),
                                ("EfficientNetB0 64x64, noisy digits", 0.5, False)):
        if name not in paths:
            continue
        ratio = _budget(name, paths[name], points, dict(table)[name], data[name], tmp_path, int16)
        if name.startswith("EfficientNetB0") and ratio > 1.2:  # met at p50 <= 1.2x the int8 file's
            slower.append(f"{name} --max-drop {points}{' int16' if int16 else ''}: p50 {ratio:.2f}x the int8 file's")
    print(f"plain int8 lost >= 1 point and auto at most half of it on: {halved}")
    print(f"default int8 over 3x plain's conversion time (best of three each): {slow}")
    print(f"default int8 over 1.0 point under float where plain lost >= 1 (missed on the interval), or over half "
          f"plain's disagreement where plain agreed < 95 %: {far}")
    print(f"files over their p50 bound: {slower}")
    print(f"rows unresolved at 1.0 point with an interval wider than +-0.5: {wide}")
    assert only or len(halved) >= 3, halved  # at least three such models
    assert not missed, missed
    assert not slow, slow
    assert not far, far
    assert not slower, slower
    assert not wide, wide


def _bounds(name: str, r: dict, halved: list, slow: list, far: list, slower: list, wide: list) -> list[str]:
    """Each row's bounds; what it misses goes into the lists (returned: the ones no list names)."""
    plain, ours, clusters = r["minmax"], r["auto"], r["clusters"]
    missed = []
    # never further from the float model than plain, nor worse in top-1 where plain loses < 0.3, beyond the
    # interval (by digit)
    change, (low, high) = _paired(plain["agrees"], ours["agrees"], clusters)
    if high < 0:
        missed.append(f"{name}: agreement {change:+.2f} points against plain's ({low:+.2f} to {high:+.2f})")
    if ours["size"] > 1.05 * plain["size"]:
        missed.append(f"{name}: {ours['size'] / plain['size']:.4f}x plain's size")
    if plain["drop"] >= 1.0 and ours["drop"] <= plain["drop"] / 2:
        halved.append(name)
    change, (low, high) = _paired(plain["correct"], ours["correct"], clusters)
    if plain["drop"] < 0.3 and high < 0:
        missed.append(f"{name}: top-1 {change:+.2f} points against plain's ({low:+.2f} to {high:+.2f})")
    if ours["seconds"] > 3.0 * plain["seconds"]:
        slow.append(f"{name}: {ours['seconds'] / plain['seconds']:.2f}x" + (" (weight rounding ran)" if ours["escalated"] else ""))
    # the 1.0-point bound on the interval: met, missed, or unresolved (then at most +-0.5 point wide)
    verdict = _verdict(ours["drop"], ours["interval"])
    half = (ours["interval"][1] - ours["interval"][0]) / 2
    print(f"  1.0-point bound: {verdict} (loss {ours['drop']:+.2f}, {ours['interval'][0]:+.2f} to "
          f"{ours['interval'][1]:+.2f}; plain {plain['drop']:+.2f})")
    if verdict == "missed" and plain["drop"] >= 1.0:
        far.append(f"{name}: {ours['drop']:+.2f} (plain {plain['drop']:+.2f}), {ours['interval']}")
    if verdict == "unresolved" and half > 0.5:
        wide.append(f"{name}: {ours['drop']:+.2f} ({ours['interval'][0]:+.2f} to {ours['interval'][1]:+.2f})")
    # where plain agrees with float on under 95 %, at most half its disagreement
    if plain["agree"] < 0.95 and 1 - ours["agree"] > (1 - plain["agree"]) / 2 + 1e-9:
        far.append(f"{name}: agreement {100 * ours['agree']:.2f} % (plain {100 * plain['agree']:.2f} %)")
    if ours["p50"] > 1.1 * plain["p50"]:
        slower.append(f"{name}: p50 {ours['p50'] / plain['p50']:.2f}x plain's")
    return missed


def _print_table(table) -> None:
    print("\n| model | float top-1 | plain converter: drop (95 % interval), agreement, SNR | edgekit auto: ranges, "
          "drop (95 % interval), agreement, SNR, bound at 1.0 | size, p50, time ratio |\n|---|---|---|---|---|")
    for name, r in table:
        p, o = r["minmax"], r["auto"]
        span = lambda v: f" ({v['interval'][0]:+.2f} to {v['interval'][1]:+.2f})"  # noqa: E731
        print(f"| {name} | {r['float_top1']:.2f} % | {p['drop']:+.2f}{span(p)}, {100 * p['agree']:.2f} %, "
              f"{p['snr']:.1f} dB | {o['chosen']}: {o['drop']:+.2f}"
              f"{span(o)}, {100 * o['agree']:.2f} %, {o['snr']:.1f} dB, {_verdict(o['drop'], o['interval'])} | "
              f"{o['size'] / p['size']:.3f}x, {o['p50'] / p['p50']:.2f}x, {o['seconds'] / p['seconds']:.2f}x |")


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
    # every op in float is the float model: a budget it meets is met (the accumulating search)
    assert a["met"] and a["drop"] <= points and a["float_share"] < 1.0
    return p50 / p50_int8
