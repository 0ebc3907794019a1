#!/usr/bin/env python3
"""The oldest interpreters edgekit's runtime supports, tested, and what a Raspberry Pi resolves.

- Two fresh venvs without TensorFlow run the runtime tests and `edgekit bench` (models built beforehand by
  tests/build_models.py with the main venv): ai-edge-litert pinned to 1.4.0 (the last release with
  glibc 2.17 aarch64 wheels), and the [tflite] extra (tflite-runtime 2.14 with numpy<2, the only
  interpreter for 32-bit ARM) with ai-edge-litert removed, as on an armv7l Pi.
- `pip download --only-binary=:all:` resolves the wheel's runtime dependencies for 64-bit Raspberry Pi
  OS bookworm (CPython 3.11, glibc 2.36) and trixie (CPython 3.13, glibc 2.41), and for a glibc 2.17
  aarch64 system (the manylinux2014 floor); the wheel's markers leave LiteRT out on armv7l, where
  tflite-runtime 2.14 has a CPython 3.11 wheel.

Called by .ci/package_smoke.py with the wheel it built; standard library only.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

from package_smoke import ROOT, check, sh, step, venv

RUNTIME_TESTS = ("tests/test_runtime.py", "tests/test_sources.py", "tests/test_camera_file.py", "tests/test_pi_app.py",
                 "tests/test_run_cli.py", "tests/test_run_batch.py", "tests/test_run_sigint.py")
# simulates numpy 2 beside tflite-runtime 2.14: not what the numpy 1 venv has
NUMPY2_ONLY = "tests/test_runtime.py::test_tflite_runtime_2_14_under_numpy_2_is_detected_and_explained"


def _glibc(arch: str, newest: int) -> list[str]:
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(17, newest + 1)]
    return [arg for tag in tags for arg in ("--platform", tag)]


PI_TARGETS = (
    # (what, CPython, platform args, the ai-edge-litert wheel it must get)
    ("64-bit Raspberry Pi OS bookworm (CPython 3.11, glibc 2.36)", "3.11", _glibc("aarch64", 36), r"ai_edge_litert-2\."),
    ("64-bit Raspberry Pi OS trixie (CPython 3.13, glibc 2.41)", "3.13", _glibc("aarch64", 41), r"ai_edge_litert-2\."),
    ("aarch64 with glibc 2.17 (manylinux2014, CPython 3.11)", "3.11",
     ["--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_17_aarch64"], r"ai_edge_litert-1\.4\.0-"),
)


def runtime_tests(python: str, wheel: Path, scratch: Path, env: dict) -> None:
    models = scratch / "floor-models"
    step("build the runtime tests' models with the main venv (tests/build_models.py)")
    sh(python, ROOT / "tests" / "build_models.py", models, env=env)
    src = scratch / "floor-src"  # the tests without the source tree's edgekit/, so the wheel is what runs
    src.mkdir()
    for name in ("tests", "calibration_data"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, src / name)
    floors = (
        ("litert-1.4.0", [str(wheel), "ai-edge-litert==1.4.0"], None, "ai_edge_litert 1.4.0", []),
        ("tflite-runtime-2.14", [f"{wheel}[tflite]"], "ai-edge-litert", "tflite_runtime 2.14.0",
         ["--deselect", NUMPY2_ONLY]),
    )
    for name, requirements, remove, backend, extra in floors:
        bin_ = venv(scratch / f"venv-{name}", *requirements, "pytest", "jsonschema")
        if remove:
            sh(bin_ / "python", "-m", "pip", "uninstall", "--quiet", "--yes", remove)
        got = sh(bin_ / "python", "-c", "from edgekit.runtime import get_backend; b = get_backend(); "
                 "print(b.name, b.version)", cwd=scratch, env=env).stdout.strip()
        check(got == backend, f"{name}: the runtime picked {got}, not {backend}")
        out = sh(bin_ / "pytest", "-q", *RUNTIME_TESTS, *extra, cwd=src, timeout=900,
                 env={**env, "EDGEKIT_TEST_MODELS": str(models), "EDGEKIT_EXPECT_BACKEND": backend}).stdout
        summary = out.strip().splitlines()[-1]
        passed = re.search(r"(\d+) passed", summary)
        check(passed is not None and int(passed.group(1)) >= 40 and "failed" not in summary, f"{name}: {summary}")
        step(f"{name} venv ({backend}): runtime tests {summary}")
        bench = sh(bin_ / "edgekit", "bench", models / "digits.int8.float32.tflite",
                   models / "digits.float32.float32.tflite", "--data", src / "calibration_data" / "digits" / "test",
                   "--runs", "5", "--json", "-", cwd=scratch, env=env).stdout
        top1 = [m["accuracy"]["top1"] for m in json.loads(bench)["models"]]
        check(all(t >= 0.9 for t in top1), f"{name}: bench top-1 {top1}")
        step(f"{name} venv ({backend}): edgekit bench, top-1 {top1}")


def pi_resolution(python: str, wheel: Path, scratch: Path) -> None:
    for what, version, platforms, expect in PI_TARGETS:
        dest = scratch / f"pi-{version}-{len(platforms)}"
        abi = "cp" + version.replace(".", "")
        sh(python, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--implementation", "cp", "--abi", abi,
           "--python-version", version, *platforms, "--dest", dest, wheel, timeout=900)
        got = sorted(p.name for p in dest.iterdir())
        litert = [n for n in got if re.match(expect, n)]
        check(bool(litert), f"{what}: resolved {got}, no wheel matching {expect}")
        step(f"resolves for {what}: {litert[0]}, " + ", ".join(n.split("-")[0] + "-" + n.split("-")[1]
                                                             for n in got if n.split("-")[0] in ("numpy", "opencv_python_headless")))
    dest = scratch / "pi-armv7l"
    sh(python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
       "--abi", "cp311", "--python-version", "3.11", *_glibc("armv7l", 36), "--dest", dest, "tflite-runtime==2.14.0")
    requires = [ln for ln in zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}"
                                                         ".dist-info/METADATA").decode().splitlines()
                if ln.startswith("Requires-Dist: ai-edge-litert")]
    check(len(requires) == 1 and "platform_machine != \"armv7l\"" in requires[0].replace("'", '"'),
          f"the wheel's LiteRT requirement is not left out on armv7l: {requires}")
    step(f"32-bit Raspberry Pi OS (armv7l, CPython 3.11): LiteRT left out ({requires[0]}), "
         f"{next(dest.iterdir()).name} for the [tflite] extra")


def run(python: str, wheel: Path, scratch: Path, env: dict) -> None:
    pi_resolution(python, wheel, scratch)
    runtime_tests(python, wheel, scratch, env)
