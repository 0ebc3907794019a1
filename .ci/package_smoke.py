#!/usr/bin/env python3
"""What people install, tried as they would: build the sdist and wheel, check what the wheel holds,
install it into two fresh virtualenvs outside the checkout -- runtime only, and with [convert] -- and
run the README's commands there, from an empty folder; then the install floor (.ci/install_floor.py).

    python .ci/package_smoke.py [--python PYTHON_WITH_BUILD]

Standard library only. Every step prints one line; the first failure stops with its output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edgekit", "edgekit/converters", "edgekit/runtime")
# files whose absence breaks a documented command of an installed edgekit
REQUIRED = (
    "edgekit/__main__.py", "edgekit/cli.py", "edgekit/converters/pipeline.py", "edgekit/runtime/model.py",
    "edgekit/runtime/data/op_versions.json", "edgekit/runtime/data/op_table.json", "edgekit/data/README.md",
    "edgekit/runtime/probe_child.py",
)
DIGITS = {"train": 1437, "test": 360}


class Failed(Exception):
    pass


def step(msg: str) -> None:
    print(f"package: {msg}", flush=True)


def sh(*cmd, cwd: Path | None = None, env: dict | None = None, expect: int = 0, timeout: float = 1800):
    """Run a command; its exit code must be `expect`. Returns the CompletedProcess (text)."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != expect:
        raise Failed(f"{' '.join(map(str, cmd))} exited {proc.returncode} (expected {expect})\n"
                     f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def build(python: str, out: Path) -> Path:
    step("python -m build (sdist, then the wheel built from the sdist)")
    sh(python, "-m", "build", "--outdir", out, ROOT)
    wheels = sorted(out.glob("edgekit-*.whl"))
    check(len(wheels) == 1 and len(list(out.glob("edgekit-*.tar.gz"))) == 1, f"build left {os.listdir(out)}")
    return wheels[0]


def check_wheel(wheel: Path) -> None:
    """Only edgekit, edgekit.converters, edgekit.runtime and their data; the demo's digits all there."""
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = re.compile(r"^edgekit-[^/]+\.dist-info/")
    stray = [n for n in names if not (n.startswith("edgekit/") or dist_info.match(n))]
    check(not stray, f"the wheel holds files outside edgekit/: {stray[:5]}")
    for bad in ("tests/", "scripts/", "calibration_data/", "__pycache__", ".pyc"):
        hits = [n for n in names if bad in n]
        check(not hits, f"the wheel holds {bad!r}: {hits[:3]}")
    for pkg in PACKAGES:
        check(f"{pkg}/__init__.py" in names, f"the wheel lacks {pkg}/__init__.py")
    for req in REQUIRED:
        check(req in names, f"the wheel lacks {req}")
    schemas = [n for n in names if n.startswith("edgekit/schemas/") and n.endswith(".schema.json")]
    check(len(schemas) >= 5, f"the wheel holds {len(schemas)} JSON schemas, expected 5: {schemas}")
    for split, count in DIGITS.items():
        pngs = [n for n in names if n.startswith(f"edgekit/data/digits/{split}/") and n.endswith(".png")]
        check(len(pngs) == count, f"the wheel holds {len(pngs)} digits/{split} images, expected {count}")
    step(f"{wheel.name}: {len(names)} files, {wheel.stat().st_size / 1024:.0f} KiB, only edgekit/ and its data")


def venv(path: Path, *requirements: str) -> Path:
    step(f"fresh venv {path.name}: pip install {' '.join(Path(r).name for r in requirements)}")
    sh(sys.executable, "-m", "venv", "--clear", path)
    sh(path / "bin" / "python", "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    sh(path / "bin" / "python", "-m", "pip", "install", "--quiet", *requirements)
    return path / "bin"


def clean_env() -> dict:
    """No PYTHONPATH or virtualenv of the caller leaks in: the installed package must stand alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def convert_install(bin_: Path, empty: Path, env: dict) -> Path:
    """[convert]: --version both ways, then the README's main job from an empty folder."""
    where = sh(bin_ / "python", "-c", "import edgekit; print(edgekit.__file__)", cwd=empty, env=env).stdout
    check(str(bin_.parent) in where, f"edgekit imported from {where.strip()}, not the venv")
    for cmd in ((bin_ / "edgekit", "--version"), (bin_ / "python", "-m", "edgekit", "--version")):
        out = sh(*cmd, cwd=empty, env=env).stdout
        check(out.strip().startswith("edgekit, version "), f"{cmd}: {out!r}")
    step("edgekit demo in an empty folder (trains, converts four ways, benches)")
    t0 = time.monotonic()
    sh(bin_ / "edgekit", "demo", "--runs", "50", cwd=empty, env=env)
    report = json.loads((empty / "edgekit-demo" / "bench.json").read_text())
    top1 = {m["mode"]: m["accuracy"]["top1"] for m in report["models"]}
    check(report["data"]["samples"] == 360 and min(top1.values()) >= 0.9, f"demo accuracy {top1}")
    step(f"demo: {time.monotonic() - t0:.0f} s, top-1 " + ", ".join(f"{k} {v:.3f}" for k, v in top1.items()))
    return empty / "edgekit-demo"


def runtime_install(bin_: Path, demo: Path, work: Path, env: dict) -> None:
    """The runtime-only install: no TensorFlow at all, and bench, run, inspect, doctor, the Pi app work."""
    py = bin_ / "python"
    probe = sh(py, "-c", "import importlib.util as u; print([m for m in ('tensorflow', 'keras', 'tf_keras') "
               "if u.find_spec(m)])", cwd=work, env=env).stdout.strip()
    check(probe == "[]", f"the runtime-only venv has {probe}")
    sh(py, "-c", "import sys, edgekit.runtime; from edgekit.runtime import Model, Classifier, open_source; "
       "assert not [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')]", cwd=work, env=env)
    test = Path(sh(py, "-c", "from importlib.resources import files; "
                   "print(files('edgekit') / 'data' / 'digits' / 'test')", cwd=work, env=env).stdout.strip())
    check(test.is_dir() and str(bin_.parent) in str(test), f"packaged digits at {test}")
    int8, f32 = demo / "digits.int8.tflite", demo / "digits.float32.tflite"

    sh(bin_ / "edgekit", "bench", int8, f32, "--data", test, "--runs", "50", "--json", work / "bench.json",
       cwd=work, env=env)
    bench = json.loads((work / "bench.json").read_text())
    top1 = [m["accuracy"]["top1"] for m in bench["models"]]
    check(bench["schema"] == "edgekit.bench/1" and len(top1) == 2 and min(top1) >= 0.9, f"bench: {top1}")
    step(f"runtime venv: edgekit bench, top-1 {top1}")

    sh(bin_ / "edgekit", "bench", int8, "--reference", f32, "--data", test, "--runs", "10", "--json",
       work / "audit.json", cwd=work, env=env)  # issue 49: an int8 file audited against its float twin, no TF
    acc = json.loads((work / "audit.json").read_text())["models"][0]["accuracy"]
    cmp = acc["comparison"]
    check(cmp["n"] == 360 and cmp["change_interval"] is not None and not acc["collapse"]["collapsed"],
          f"bench --reference: {cmp}")
    step(f"runtime venv: edgekit bench --reference (a float .tflite): {cmp['verdict']}")

    run = sh(bin_ / "edgekit", "run", int8, "--source", test / "7", "--json", cwd=work, env=env).stdout
    frames = [json.loads(line) for line in run.splitlines() if line.startswith('{"frame"')]
    sevens = sum(f["results"][0]["label"] == "7" for f in frames)
    check(len(frames) == 36 and sevens >= 34, f"edgekit run: {sevens} of {len(frames)} sevens")
    step(f"runtime venv: edgekit run on the packaged 7s: {sevens}/{len(frames)}")

    inspect = json.loads(sh(bin_ / "edgekit", "inspect", int8, "--json", cwd=work, env=env).stdout)
    check(inspect["schema"] == "edgekit.inspect/1" and inspect["quantization"]["quantized"], "inspect --json")
    doctor = json.loads(sh(bin_ / "edgekit", "doctor", "--json", cwd=work, env=env).stdout)
    check(doctor["packages"].get("tensorflow") is None and doctor["active_backend"], f"doctor: {doctor}")
    (work / "m.keras").write_bytes(b"not used: the extra is missing first")
    missing = sh(bin_ / "edgekit", "convert", work / "m.keras", cwd=work, env=env, expect=9).stderr
    check("edgekit[convert]" in missing and "Traceback" not in missing, f"convert without the extra: {missing}")
    step("runtime venv: inspect, doctor, and convert exits 9 naming the extra")
    pi_app(py, int8, test, work, env)


# python MAKE_VIDEO TEST_DIR OUT.avi: a 10-frame Motion-JPEG video, one digit per class, 64x64
MAKE_VIDEO = ("import sys, cv2, numpy as np; from pathlib import Path\n"
              "test = Path(sys.argv[1]); w = cv2.VideoWriter(sys.argv[2], cv2.VideoWriter_fourcc(*'MJPG'), 30, (64, 64))\n"
              "for d in range(10):\n"
              "    img = cv2.imread(str(sorted((test / str(d)).glob('*.png'))[0]), cv2.IMREAD_GRAYSCALE)\n"
              "    w.write(cv2.cvtColor(np.kron(img, np.ones((8, 8), np.uint8)), cv2.COLOR_GRAY2BGR))\n"
              "w.release()\n")


def pi_app_block() -> str:
    """The README's Pi app, as written."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- pi-app -->\s*```python\n(.*?)```\s*<!-- /pi-app -->", text, re.S)
    check(block is not None, "README lost its Pi app block")
    return block.group(1)


def pi_app(py: Path, model: Path, test: Path, work: Path, env: dict) -> None:
    """The README's Pi app block, as written, on a video of one digit per class."""
    (work / "app.py").write_text(pi_app_block())
    sh(py, "-c", MAKE_VIDEO, test, work / "digits.avi", cwd=work, env=env)
    out = sh(py, "app.py", model, work / "digits.avi", cwd=work, env=env).stdout.split("\n")
    labels = [line.split()[1] for line in out if line.strip()]
    right = sum(label == str(d) for d, label in enumerate(labels))
    check(len(labels) == 10 and right >= 9, f"Pi app: {labels}")
    step(f"runtime venv: the README's Pi app on a 10-frame video: {right}/10")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="a Python with the `build` package")
    args = parser.parse_args()
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="edgekit-package."))
    try:
        wheel = build(args.python, scratch / "dist")
        check_wheel(wheel)
        env = clean_env()
        convert_bin = venv(scratch / "venv-convert", f"{wheel}[convert]")
        (scratch / "empty").mkdir()
        demo = convert_install(convert_bin, scratch / "empty", env)
        runtime_bin = venv(scratch / "venv-runtime", str(wheel))
        (scratch / "work").mkdir()
        runtime_install(runtime_bin, demo, scratch / "work", env)
        import install_floor  # .ci/install_floor.py: LiteRT 1.4.0 and tflite-runtime 2.14 venvs, Pi wheels

        install_floor.run(args.python, wheel, scratch, env)
    except (Failed, subprocess.TimeoutExpired) as exc:
        print(f"package: FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    step(f"all checks passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
