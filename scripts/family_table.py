#!/usr/bin/env python3
"""Every model family through edgekit next to the plain converter: the README family table (issue 28).

One model per family is built and trained here (tests/families.py: LSTM, GRU, bidirectional LSTM, unrolled
LSTM, ViT, int32 tokens, a two-head 1-D conv, U-Nets at an open size, a log-mel SavedModel). Each goes through
`edgekit convert` in each mode, in a fresh process, and through the plain `tf.lite.TFLiteConverter` on the same
calibration samples, also in a child (TensorFlow's calibrator can crash natively). Both files are measured on
the family's held-out samples against the source model: top-1 agreement (per element for a mask), SNR of the
outputs in dB, max error over the output range; and `edgekit bench --data` and `run`-style `Model.predict` are
run on edgekit's file.

  python scripts/family_table.py                         # every family, every mode: Markdown on stdout
  python scripts/family_table.py --families lstm,vit --modes int8 --json rows.json --workdir /tmp/fam

Exit 1 when a cell misses issue 28's acceptance: edgekit exits 0 within tolerance of the plain converter
(float16 max error <= 1e-2 of the output range, int8/int16x8 agreement >= plain's - 0.5 point and SNR >=
plain's - 1 dB), or refuses in one line where the plain file does not work either; never a crash or exit 70.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from _rows import record  # noqa: E402
from families import BUILDERS, TARGET_KEYS, Family  # noqa: E402

MODES = {
    "float16": ["--float16"],
    "dynamic": ["--dynamic"],
    "int8": ["--int8", "--calib", "{calib}"],
    "int16x8": ["--int16x8", "--calib", "{calib}"],
}
# fine-tuning on what each model was trained on, scored on the held-out samples (`compression` metadata)
FINETUNE = ["--train-data", "{train}", "--val-data", "{test}", "--epochs", "3", "--json"]
TRAINING = {
    "ptq": [],
    "prune": ["--prune", "0.5", *FINETUNE],
    "qat": ["--qat", *FINETUNE],
    "prune+qat": ["--prune", "0.5", "--qat", *FINETUNE],
}

PLAIN = r'''
import sys, numpy as np, tensorflow as tf
model, mode, calib, out = sys.argv[1:5]
if model.endswith(".keras"):
    import keras
    m = keras.models.load_model(model)
    conv = tf.lite.TFLiteConverter.from_keras_model(m)
else:
    conv = tf.lite.TFLiteConverter.from_saved_model(model)
if mode != "float32":
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
if mode == "float16":
    conv.target_spec.supported_types = [tf.float16]
if mode in ("int8", "int16x8"):
    data = np.load(calib)
    keys = [k for k in data.files if k not in TARGET_KEYS]
    def rep():
        for i in range(min(200, len(data[keys[0]]))):
            yield [data[k][i:i + 1] for k in keys]
    conv.representative_dataset = rep
    if mode == "int16x8":
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
open(out, "wb").write(conv.convert())
'''

REFERENCE = r'''
import sys, numpy as np
model, data, out = sys.argv[1:4]
d = np.load(data)
keys = [k for k in d.files if k not in TARGET_KEYS]
n = len(d[keys[0]])
if model.endswith(".keras"):
    import keras
    m = keras.models.load_model(model)
    ys = m.predict([d[k] for k in keys] if len(keys) > 1 else d[keys[0]], verbose=0, batch_size=1)
    ys = ys if isinstance(ys, list) else [ys]
else:
    import tensorflow as tf
    f = tf.saved_model.load(model).signatures["serving_default"]
    outs = [f(**{k: tf.constant(d[k][i:i + 1]) for k in keys}) for i in range(n)]
    ys = [np.concatenate([o[name].numpy() for o in outs]) for name in sorted(outs[0])]
np.savez(out, *[np.asarray(y) for y in ys])
'''


def _child(code: str, *args, timeout: float = 900) -> tuple[int, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    code = f"TARGET_KEYS = {TARGET_KEYS!r}\n{code}"  # the arrays of a family's .npz that are not inputs
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "WARNING" not in line[:12]]
    return proc.returncode, (lines[-1] if lines else "")


def tflite_outputs(path: Path, data: Path) -> list[np.ndarray]:
    """The file's outputs on each held-out sample at batch 1 (an open size is set to the sample's own), in
    the order of the source model's outputs (matched by name where the names say, else by shape)."""
    from ai_edge_litert.interpreter import Interpreter

    d = np.load(data)
    keys = [k for k in d.files if k not in TARGET_KEYS]
    interp = Interpreter(model_path=str(path), num_threads=2)
    ins = interp.get_input_details()
    for i, k in zip(ins, keys):
        if tuple(i["shape_signature"]) != (1, *d[k].shape[1:]):
            interp.resize_tensor_input(i["index"], (1, *d[k].shape[1:]))
    interp.allocate_tensors()
    ins, outs = interp.get_input_details(), interp.get_output_details()
    rows = []
    for n in range(len(d[keys[0]])):
        for i, k in zip(ins, keys):
            x = d[k][n:n + 1]
            if i["dtype"] != x.dtype and np.issubdtype(i["dtype"], np.integer) and i["quantization"][0]:
                s, z = i["quantization"]
                x = np.clip(np.round(x / s + z), np.iinfo(i["dtype"]).min, np.iinfo(i["dtype"]).max)
            interp.set_tensor(i["index"], x.astype(i["dtype"]))
        interp.invoke()
        got = []
        for o in outs:
            y = interp.get_tensor(o["index"]).astype(np.float32)
            if o["quantization"][0]:
                y = (y - o["quantization"][1]) * o["quantization"][0]
            got.append(y)
        rows.append(got)
    return [np.concatenate([r[j] for r in rows]) for j in range(len(outs))]


def compare(ref: list[np.ndarray], got: list[np.ndarray], dense: bool) -> dict:
    """Agreement (top-1, or per element for a mask), SNR dB and max error / output range, over all outputs
    (each source output paired with the file's output of its shape, in order)."""
    pool = list(got)
    agree, snr, err = [], [], []
    for r in ref:
        g = next((p for p in pool if p.shape == r.shape), None)
        if g is None:
            return {"error": f"no output of shape {r.shape} in {[p.shape for p in got]}"}
        del pool[next(i for i, p in enumerate(pool) if p is g)]
        if dense:
            agree.append(float(np.mean((r > 0.5) == (g > 0.5))))
        elif r.shape[-1] > 1:
            agree.append(float(np.mean(r.argmax(-1) == g.argmax(-1))))
        noise = float(np.sum((r - g) ** 2))
        snr.append(99.0 if noise == 0 else 10 * np.log10(float(np.sum(r ** 2)) / noise))
        span = float(r.max() - r.min()) or 1.0
        err.append(float(np.max(np.abs(r - g))) / span)
    finite = all(np.isfinite(g).all() for g in got)
    return {"agree": round(100 * min(agree), 2) if agree else None, "snr": round(min(snr), 1),
            "max_err": round(max(err), 5), "finite": finite}


def run_cell(fam: Family, mode: str, training: str, work: Path, ref: list[np.ndarray]) -> dict:
    args = [a.format(calib=fam.calib, train=fam.train, test=fam.test) for a in MODES[mode] + TRAINING[training]]
    out = work / f"{fam.name}.{mode}.{training}.tflite"
    cmd = [sys.executable, "-m", "edgekit", "convert", str(fam.model), *args, "-o", str(out), "--force"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    row = {"family": fam.name, "mode": mode, "training": training, "exit": proc.returncode,
           "seconds": round(time.perf_counter() - started)}
    lines = [line for line in proc.stderr.splitlines() if line.startswith("edgekit: ") or "Error" in line]
    if proc.returncode != 0:
        row["error"] = (lines or proc.stderr.splitlines() or ["(nothing printed)"])[-1][:300]
        return row
    row.update(compare(ref, tflite_outputs(out, fam.test), fam.dense))
    if training != "ptq":  # held-out score of the float model and of the file (top-1, or per pixel for a mask)
        accuracy = json.loads(proc.stdout)["compression"]["accuracy"]
        row["top1"] = {k: round(100 * accuracy[k], 2) for k in ("float", "final") if k in accuracy}
    row.update(_commands(out, fam))
    return row


def _commands(out: Path, fam: Family) -> dict:
    """inspect, bench --data (--reference for a Keras model) and `run --source` on the held-out samples of the
    file, and Model.predict on one of them."""
    ref = ["--reference", str(fam.model)] if fam.model.suffix == ".keras" else []
    proc = subprocess.run([sys.executable, "-m", "edgekit", "bench", str(out), "--data", str(fam.test),
                           "--runs", "5", "--warmup", "1", *ref], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    result = {"bench": proc.returncode}
    if proc.returncode:
        result["bench_error"] = (proc.stderr.strip().splitlines() or ["(nothing printed)"])[-1][:300]
    for name, argv in (("inspect", ["inspect", str(out)]),
                       ("run", ["run", str(out), "--source", str(fam.test), "--max-frames", "20", "--json"])):
        proc = subprocess.run([sys.executable, "-m", "edgekit", *argv], capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        result[name] = proc.returncode
        if proc.returncode:
            result[f"{name}_error"] = (proc.stderr.strip().splitlines() or ["(nothing printed)"])[-1][:300]
    code = ("import sys, numpy as np\nfrom edgekit.runtime import Model\n"
            "m = Model(sys.argv[1]); d = np.load(sys.argv[2]); names = [t.name for t in m.inputs]\n"
            "k = [n for n in names if n in d.files] or ['x']\n"
            "out = m.predict(d[k[0]][:1]) if len(names) == 1 else m.predict({n: d[n][:1] for n in names})\n"
            "print('ok')\n")
    rc, err = _child(code, out, fam.test, timeout=300)
    result["predict"] = rc
    if rc:
        result["predict_error"] = err[:300]
    return result


def plain_cell(fam: Family, mode: str, work: Path, ref: list[np.ndarray]) -> dict:
    out = work / f"{fam.name}.{mode}.plain.tflite"
    rc, err = _child(PLAIN, fam.model, mode, fam.calib, out)
    if rc != 0:
        return {"exit": rc, "error": err[:300]}
    try:
        return {"exit": 0, **compare(ref, tflite_outputs(out, fam.test), fam.dense)}
    except Exception as e:  # the plain file may not run at all
        return {"exit": 0, "error": f"does not run: {str(e).splitlines()[0][:200]}", "runs": False}


def check(row: dict) -> list[str]:
    """What a cell misses of issue 28's acceptance."""
    plain = row.get("plain") or {}
    plain_works = plain.get("exit") == 0 and "error" not in plain and plain.get("finite", True)
    if row["exit"] < 0 or row["exit"] == 70:
        return [f"exit {row['exit']}: {row.get('error')}"]
    if row["exit"] != 0:  # fine-tuning has no plain twin: a one-line refusal naming the fix is its answer there
        return [f"refused where the plain converter works: {row.get('error')}"] \
            if plain_works and row["training"] == "ptq" else []
    problems = [f"{k} exit {row[k]}: {row.get(k + '_error')}" for k in ("inspect", "bench", "run", "predict")
                if row.get(k)]
    if row["mode"] == "float16" and row.get("max_err", 0) > 1e-2:
        problems.append(f"float16 max error {row['max_err']} of the output range")
    top1 = row.get("top1") or {}
    if "final" in top1 and top1["final"] < top1["float"] - 2:
        problems.append(f"fine-tuned held-out score {top1['final']} % < float's {top1['float']} % - 2")
    if plain_works and row["mode"] in ("int8", "int16x8", "dynamic") and row["training"] == "ptq":
        if row.get("agree") is not None and plain.get("agree") is not None and row["agree"] < plain["agree"] - 0.5:
            problems.append(f"agreement {row['agree']} < plain's {plain['agree']} - 0.5")
        if row.get("snr") is not None and row["snr"] < plain["snr"] - 1:
            problems.append(f"SNR {row['snr']} dB < plain's {plain['snr']} - 1")
    return problems


def markdown(rows: list[dict], modes: list[str], trainings: list[str]) -> str:
    cols = [(m, t) for t in trainings for m in modes]
    head = "| family | " + " | ".join(m if t == "ptq" else f"{m} {t}" for m, t in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for fam in dict.fromkeys(r["family"] for r in rows):
        cells = []
        for m, t in cols:
            r = next((r for r in rows if r["family"] == fam and r["mode"] == m and r["training"] == t), None)
            cells.append("" if r is None else _cell(r))
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r: dict) -> str:
    if r["exit"] != 0:
        return f"refused (exit {r['exit']})" if not r["problems"] else f"**exit {r['exit']}**"
    plain = r.get("plain") or {}
    ours = f"{r['agree']:.1f} %" if r.get("agree") is not None else f"{r['snr']:.0f} dB"
    if plain.get("exit") == 0 and "error" not in plain:
        theirs = f"{plain['agree']:.1f} %" if plain.get("agree") is not None else f"{plain.get('snr', 0):.0f} dB"
    else:
        theirs = f"plain {'crash' if plain.get('exit', 0) < 0 else 'fails'}"
    mark = " **!**" if r["problems"] else ""
    if r["training"] != "ptq":  # against labels: what fine-tuning kept of float's held-out score
        top1 = r.get("top1") or {}
        ours = f"{top1['float']:.1f} -> {top1['final']:.1f} %" if "final" in top1 else ours
        return f"{ours}{mark}"
    return f"{ours} / {theirs}{mark}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(BUILDERS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--training", default="ptq", help=f"comma-separated of {', '.join(TRAINING)}")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--workdir", type=Path, help="keep models and .tflite files here")
    args = parser.parse_args()
    families, modes, trainings = args.families.split(","), args.modes.split(","), args.training.split(",")
    unknown = [f for f in families if f not in BUILDERS] + [m for m in modes if m not in MODES] + \
        [t for t in trainings if t not in TRAINING]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="edgekit-families-"))
    rows, failed = [], 0
    for name in families:
        fam = _built(name, work)
        ref_file = work / f"{name}.reference.npz"
        if not ref_file.exists():
            rc, err = _child(REFERENCE, fam.model, fam.test, ref_file)
            if rc:
                raise SystemExit(f"{name}: the source model does not run: {err}")
        ref = list(np.load(ref_file).values())
        for mode in modes:
            plain = plain_cell(fam, mode, work, ref)
            for training in trainings:
                row = run_cell(fam, mode, training, work, ref)
                row["plain"] = plain
                failed += record(rows, row, check, args.json)
    print(markdown(rows, modes, trainings))
    print(f"\nedgekit / plain converter, on held-out samples; {os.cpu_count()} CPU cores")
    return 1 if failed else 0


def _built(name: str, work: Path) -> Family:
    """The family's model, built once per work folder (in a child: each keeps its own Keras session)."""
    stamp = work / f"{name}.family.json"
    if not stamp.exists():
        code = ("import sys, json, dataclasses\nsys.path.insert(0, sys.argv[3])\nfrom families import build\n"
                "from pathlib import Path\nf = build(sys.argv[1], Path(sys.argv[2]))\n"
                "d = dataclasses.asdict(f)\n"
                "print(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in d.items()}))")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        proc = subprocess.run([sys.executable, "-c", code, name, str(work), str(ROOT / "tests")],
                              capture_output=True, text=True, env=env, check=True)
        stamp.write_text(proc.stdout.strip().splitlines()[-1])
    d = json.loads(stamp.read_text())
    return Family(**{k: Path(v) if k in ("model", "calib", "test", "train") and v else v for k, v in d.items()})


if __name__ == "__main__":
    sys.exit(main())
