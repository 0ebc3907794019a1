#!/usr/bin/env python3
"""Pruning and QAT across the keras.applications zoo: the README table (issue 12).

Each architecture is built with weights=None (weights cannot be downloaded here) at SIZE x SIZE x 3 with 10
classes and saved as .keras; then `edgekit convert` runs on it in a fresh process per mode:

  ptq        --int8 --calib TRAIN
  prune      --prune 0.5 --int8 --train-data TRAIN --epochs E
  qat        --qat --int8 --train-data TRAIN --epochs E
  prune+qat  --prune 0.5 --qat --int8 --train-data TRAIN --epochs E
  channels   --prune 0.5 --prune-structure channels --int8 --train-data TRAIN --epochs E (issue 30)

TRAIN is IMAGES images of the bundled digits (upscaled by the converter's resize, 20 per class at 200) and
--val-data is 100 other digits. Each row is measured on the written .tflite: the zero share of the
conv/dense kernels, the ops that are not int8 against the layers the report says were kept in float, the top-1
change (final - float, on the val digits; an untrained net trained one epoch is near chance, so this column
says only that nothing broke), and the wall time.

  python scripts/zoo_table.py                       # every family, every mode: a Markdown table on stdout
  python scripts/zoo_table.py --archs MobileNetV3Small,DenseNet121 --modes prune+qat --size 64
  python scripts/zoo_table.py --json zoo.json       # rows as JSON too

Exit 1 when a row fails an acceptance check of issue 12 (exit 0, >= 40 % zeros after pruning, every op
int8 except DEQUANTIZE/QUANTIZE and the ops of layers kept in float).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from _rows import record  # noqa: E402

DIGITS = ROOT / "calibration_data" / "digits"
ARCHS = ("MobileNet", "MobileNetV2", "MobileNetV3Small", "MobileNetV3Large", "EfficientNetB0", "EfficientNetV2B0",
         "ResNet50", "ResNet50V2", "DenseNet121", "InceptionV3", "Xception", "NASNetMobile", "ConvNeXtTiny")
MODES = {
    "ptq": ["--int8", "--calib", "{train}"],
    "prune": ["--prune", "0.5", "--int8", "--train-data", "{train}", "--epochs", "{epochs}"],
    "qat": ["--qat", "--int8", "--train-data", "{train}", "--epochs", "{epochs}"],
    "prune+qat": ["--prune", "0.5", "--qat", "--int8", "--train-data", "{train}", "--epochs", "{epochs}"],
    "channels": ["--prune", "0.5", "--prune-structure", "channels", "--int8", "--train-data", "{train}", "--epochs",
                 "{epochs}"],
}
MIN_ZEROS = 0.40


def subset(source: Path, dest: Path, per_class: int, skip: int = 0) -> Path:
    """`per_class` images of each class folder of `source`, copied into `dest`."""
    for cls in sorted(p for p in source.iterdir() if p.is_dir()):
        files = sorted(cls.iterdir())[skip: skip + per_class]
        (dest / cls.name).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(f, dest / cls.name / f.name)
    return dest


def build(arch: str, size: int, path: Path) -> None:
    """Build and save one architecture (in a child process: each keeps its own Keras session)."""
    code = (
        "import keras, sys\n"
        "keras.utils.set_random_seed(0)\n"
        f"m = getattr(keras.applications, {arch!r})(weights=None, input_shape=({size}, {size}, 3), classes=10)\n"
        f"m.save({str(path)!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def measure(tflite: Path, report: dict) -> dict:
    """Zero share of the conv/dense kernels and the ops that are not int8, read from the written file."""
    from edgekit.runtime.inspect import analyze
    from edgekit.runtime.sparsity import kernel_sparsity

    data = tflite.read_bytes()
    kernels = kernel_sparsity(data)
    total = sum(_size(k["shape"]) for k in kernels)
    zeros = sum(_size(k["shape"]) * k["sparsity"] for k in kernels)
    info = analyze(data, gpu=False)
    compression = report.get("compression") or {}
    qat = compression.get("qat") or {}
    kept, in_file = qat.get("kept_float") or {}, qat.get("float_in_file") or {}
    float_ops = [o["op"] for o in info["float_ops"]]
    accuracy = compression.get("accuracy") or {}
    change = None
    if "final" in accuracy and "float" in accuracy:
        change = round(100 * (accuracy["final"] - accuracy["float"]), 1)
    channels = (compression.get("prune") or {}).get("channels")
    return {"zeros": round(zeros / total, 3) if total else 0.0, "ops": info["ops"]["count"],
            "macs_ratio": round(channels["macs"][1] / channels["macs"][0], 3) if channels else None,
            "channels_left": sorted(set(channels["left"].values())) if channels else None,
            "float_ops": len(float_ops), "float_op_types": sorted(set(float_ops)), "kept_float": len(kept),
            "float_layers": len(in_file), "float_layer_classes": sorted(set(in_file.values())),
            "unexplained": qat.get("other_float_ops", 0), "top1_change": change,
            "size_kb": round(len(data) / 1024)}


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def run_one(arch: str, mode: str, model: Path, train: Path, val: Path, epochs: int, out: Path) -> dict:
    args = [a.format(train=train, epochs=epochs) for a in MODES[mode]]
    cmd = [sys.executable, "-m", "edgekit", "convert", str(model), *args, "--val-data", str(val), "-o", str(out),
           "--force", "--json"]
    if mode == "ptq":
        cmd[cmd.index("--val-data"): cmd.index("--val-data") + 2] = []  # PTQ trains nothing: no accuracy stages
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row = {"arch": arch, "mode": mode, "exit": proc.returncode, "seconds": round(time.perf_counter() - started)}
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        row["error"] = lines[-1] if lines else "(no message)"
        return row
    row.update(measure(out, json.loads(proc.stdout)))
    row["warnings"] = [line.removeprefix("edgekit: warning: ") for line in proc.stderr.splitlines()
                       if line.startswith("edgekit: warning: ")]
    return row


def check(row: dict) -> list[str]:
    """What a row misses of issue 12's acceptance."""
    if row["exit"] != 0:
        return [f"exit {row['exit']}: {row.get('error')}"]
    problems = []
    if "prune" in row["mode"] and row["zeros"] < MIN_ZEROS:
        problems.append(f"only {row['zeros']:.0%} zeros in conv/dense kernels")
    if row["mode"] in ("ptq", "prune", "channels") and row["float_ops"]:
        problems.append(f"{row['float_ops']} float ops ({', '.join(row['float_op_types'])})")
    if "qat" in row["mode"] and row["unexplained"]:
        problems.append(f"{row['unexplained']} float ops outside the layers kept in float")
    return problems


def markdown(rows: list[dict], modes: list[str]) -> str:
    head = "| architecture | " + " | ".join(modes) + " |"
    lines = [head, "|---" * (len(modes) + 1) + "|"]
    for arch in dict.fromkeys(r["arch"] for r in rows):
        cells = []
        for mode in modes:
            r = next((r for r in rows if r["arch"] == arch and r["mode"] == mode), None)
            cells.append("" if r is None else _cell(r))
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r: dict) -> str:
    if r["exit"] != 0:
        return f"exit {r['exit']}"
    parts = ["ok"]
    if "prune" in r["mode"]:
        parts.append(f"{r['zeros']:.0%} zeros")
    if "qat" in r["mode"]:
        parts.append(f"{r['float_layers']} float layers" if r["float_layers"] else "all int8")
    if r.get("macs_ratio") is not None:
        parts.append(f"{r['macs_ratio']:.2f}x multiply-adds")
    if r.get("top1_change") is not None:
        parts.append(f"{r['top1_change']:+.1f} pt")
    parts.append(f"{r['seconds']} s")
    return ", ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--images", type=int, default=200, help="training images (a multiple of 10)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--workdir", type=Path, help="keep models and .tflite files here")
    args = parser.parse_args()
    archs, modes = args.archs.split(","), args.modes.split(",")
    unknown = [a for a in archs if a not in ARCHS] + [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="edgekit-zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    train = subset(DIGITS / "train", work / "train", args.images // 10)
    val = subset(DIGITS / "test", work / "val", 10)
    rows, failed = [], 0
    try:
        for arch in archs:
            model = work / f"{arch}.keras"
            if not model.exists():
                build(arch, args.size, model)
            for mode in modes:
                row = run_one(arch, mode, model, train, val, args.epochs, work / f"{arch}.{mode}.tflite")
                failed += record(rows, row, check, args.json)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(markdown(rows, modes))
    print(f"\n{args.size}x{args.size}x3, 10 classes, weights=None, {args.images} training images, "
          f"{args.epochs} epoch(s); {os.cpu_count()} CPU cores")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
