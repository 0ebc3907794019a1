"""The README's main job: `edgekit demo` trains, converts four ways and benches on held-out digits.

Run in-process through click's runner (TensorFlow is already loaded by the suite); CI also runs the real
command from an installed wheel in an empty folder (.ci/package_smoke.py)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgekit.cli import main


def test_demo_runs_end_to_end_on_the_bundled_digits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the digits come from the package, not the working folder
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--out", str(out), "--runs", "50"])
    assert result.exit_code == 0, result.output
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
    epochs = [line for line in result.stderr.splitlines() if line.startswith("train: epoch ")]
    assert [e.split(",")[0] for e in epochs] == [f"train: epoch {i}/20" for i in range(1, 21)], result.stderr
    assert epochs[0].endswith(" left") and epochs[-1].endswith(", 0 s left"), epochs  # the time left, to stderr
    assert "train: epoch" not in result.stdout

    again = CliRunner().invoke(main, ["demo", "--out", str(out)])
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert again.exit_code == 7 and "--force" in lines[-1]
