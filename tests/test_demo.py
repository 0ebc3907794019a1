"""The README's main job: `edgekit demo` trains, converts four ways and benches on held-out digits."""

from __future__ import annotations

import json

from conftest import ROOT
from helpers import run_cli


def test_demo_runs_end_to_end_on_the_bundled_digits(tmp_path):
    out = tmp_path / "demo"
    result = run_cli("demo", "--out", out, "--runs", "50", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "bench.json").read_text())
    modes = [m["mode"] for m in report["models"]]
    assert modes == ["float32", "float16", "dynamic", "int8"]
    assert report["reference"]["top1"] >= 0.95 and report["data"]["samples"] == 360
    by_mode = {m["mode"]: m for m in report["models"]}
    assert by_mode["float32"]["accuracy"]["top1_delta_points"] == 0.0
    assert by_mode["int8"]["accuracy"]["top1_delta_points"] >= -1.0
    sizes = {mode: m["size_bytes"] for mode, m in by_mode.items()}
    assert sizes["int8"] < 0.4 * sizes["float32"] and sizes["float16"] < 0.6 * sizes["float32"]
    for mode in modes:
        assert f"digits.{mode}.tflite" in result.stdout

    again = run_cli("demo", "--out", out, cwd=ROOT)
    assert again.returncode == 7 and "--force" in again.error_lines[-1]
