"""`edgekit bench`: the JSON contract, accuracy against labels and the float model, no TensorFlow needed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgekit.cli import main
from helpers import run_cli

LATENCY_KEYS = {"init", "first", "p50", "p90", "p99", "mean", "std"}


def test_json_report_follows_the_documented_contract(tmp_path, converted, digits_keras, digits_dir):
    paths = [converted("float32"), converted("int8")]
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", *map(str, paths), "--runs", "30", "--warmup", "3",
                                       "--threads", "1", "--data", str(digits_dir / "test"),
                                       "--reference", str(digits_keras), "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["schema"] == "edgekit.bench/1"
    ref = report["reference"]
    assert ref["device"].endswith("CPU:0") and ref["top1"] >= 0.95
    for entry, path in zip(report["models"], paths):
        assert entry["path"] == str(path) and entry["size_bytes"] == path.stat().st_size
        assert entry["threads"] == 1 and entry["backend"] == "ai_edge_litert"
        lat = entry["latency_ms"]
        assert LATENCY_KEYS <= set(lat) and 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
        acc = entry["accuracy"]
        assert acc["samples"] == 360
        assert acc["top1_delta_points"] == pytest.approx(100 * (acc["top1"] - ref["top1"]))
        assert 0.98 <= acc["agreement"] <= 1.0
    f32, i8 = report["models"]
    assert f32["accuracy"]["top1_delta_points"] == 0.0 and f32["accuracy"]["snr_db"] > 60
    assert i8["accuracy"]["top1_delta_points"] >= -1.0
    assert "digits.float32.float32.tflite" in result.output and "Δ pts" in result.output


def test_bench_runs_without_tensorflow_and_reports_label_accuracy(tmp_path, converted, digits_dir):
    out = tmp_path / "b.json"
    result = run_cli("bench", converted("int8"), "--runs", "20", "--data", digits_dir / "test",
                     "--json", out, block_tf=True)
    assert result.returncode == 0, result.stderr
    assert result.imports == [] and result.modules == [], result.import_sites  # not even tried
    entry = json.loads(out.read_text())["models"][0]
    assert entry["mode"] == "int8" and entry["accuracy"]["top1"] >= 0.95
    assert "top1_delta_points" not in entry["accuracy"]


def test_bench_runs_beside_tflite_runtime_without_litert_schema_module(tmp_path, converted, digits_dir):
    """tflite-runtime ships no flatbuffer schema module (32-bit Raspberry Pi OS has only it): bench reads
    what it reports without one (CI's armhf run once failed here, exit 3, on a sparse-weights count)."""
    out = tmp_path / "b.json"
    result = run_cli("bench", converted("int8"), converted("float32"), "--runs", "5", "--data", digits_dir / "test",
                     "--json", out, block_tf=True, block=("ai_edge_litert.schema_py_generated",))
    assert result.returncode == 0, result.stderr
    assert "ai_edge_litert.schema_py_generated" not in result.stderr
    models = json.loads(out.read_text())["models"]
    assert [m["accuracy"]["top1"] >= 0.95 for m in models] == [True, True]
    assert [m["sparse_weights"] for m in models] == [None, None]


def test_baseline_is_benched_first_and_every_model_gets_its_speed_up(tmp_path, converted):
    """`--baseline FILE` (a dense file beside a pruned one): benched first in the same run, each model's p50
    against it as `speedup`, a column in the table; with --on it is refused in one line."""
    from edgekit.contracts import validate

    out = tmp_path / "b.json"
    result = run_cli("bench", converted("int8"), converted("float32"), "--baseline", converted("float32"),
                     "--runs", "30", "--json", out, block_tf=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    validate(report, "edgekit.bench/1")
    assert report["baseline"] == str(converted("float32"))
    assert [m["path"] for m in report["models"]] == [str(converted("float32")), str(converted("int8"))]
    base, other = report["models"]
    assert base["speedup"] == 1.0
    assert other["speedup"] == pytest.approx(base["latency_ms"]["p50"] / other["latency_ms"]["p50"], rel=0.01)
    assert "speed-up" in result.stdout and f"{other['speedup']:.2f}x" in result.stdout
    refused = run_cli("bench", converted("int8"), "--baseline", converted("float32"), "--on", "pi@localhost")
    assert refused.returncode == 2 and "--baseline" in refused.stderr and "Traceback" not in refused.stderr


def test_reference_without_tensorflow_is_a_clear_error(converted, digits_dir, digits_keras):
    result = run_cli("bench", converted("int8"), "--data", digits_dir / "test", "--reference", digits_keras,
                     block_tf=True)
    assert result.returncode == 9
    assert len(result.error_lines) == 1 and "edgekit[convert]" in result.error_lines[0]


def test_existing_json_report_is_not_replaced_without_force(tmp_path, converted):
    out = tmp_path / "b.json"
    out.write_text("{}")
    result = CliRunner().invoke(main, ["bench", str(converted("float16")), "--runs", "5", "--json", str(out)])
    assert result.exit_code == 7 and out.read_text() == "{}"


def test_json_to_stdout_is_pure_json(converted):
    result = CliRunner().invoke(main, ["bench", str(converted("dynamic")), "--runs", "5", "--json", "-"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["models"][0]["mode"] == "dynamic"


def _eval_copy(tmp_path, digits_dir, classes=("0", "1", "2")):
    """A small labelled folder from the digits test split, plus one file that is not an image."""
    import shutil

    root = tmp_path / "eval"
    for c in classes:
        shutil.copytree(digits_dir / "test" / c, root / c)
    (root / "1" / "broken.png").write_bytes(b"not a png at all")
    return root


def test_an_unreadable_eval_image_is_skipped_and_reported(tmp_path, converted, digits_dir):
    data = _eval_copy(tmp_path, digits_dir)
    r = run_cli("bench", converted("int8"), "--data", data, "--runs", "5", "--json", "-", block_tf=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    good = sum(1 for p in data.rglob("*.png")) - 1
    assert report["data"]["samples"] == good and report["data"]["skipped_count"] == 1
    assert "broken.png" in report["data"]["skipped"][0]["file"]
    assert "skipped 1 unreadable --data image" in r.stderr
    assert report["models"][0]["accuracy"]["samples"] == good


def test_strict_makes_an_unreadable_eval_image_an_error(tmp_path, converted, digits_dir):
    data = _eval_copy(tmp_path, digits_dir)
    r = run_cli("bench", converted("int8"), "--data", data, "--runs", "5", "--strict", block_tf=True)
    assert r.returncode == 6 and "broken.png" in r.stderr and "(--strict)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_images_beside_the_class_folders_count_as_samples_but_not_as_the_last_class(tmp_path, converted, digits_dir):
    """Images lying in --data itself have no class (-1). They used to be scored as the last class (-1
    indexes the end of the class list); top-1 and the per-class figures are over the labelled images."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(digits_dir / "test", data)
    for i, path in enumerate(sorted((data / "3").glob("*.png"))[:10]):  # threes, lying loose
        shutil.copy(path, data / f"loose{i}.png")
    base = run_cli("bench", converted("int8"), "--data", digits_dir / "test", "--runs", "3", "--json", "-",
                   block_tf=True)
    r = run_cli("bench", converted("int8"), "--data", data, "--runs", "3", "--json", "-", block_tf=True)
    assert base.returncode == 0 and r.returncode == 0, r.stderr
    before, after = (json.loads(x.stdout)["models"][0]["accuracy"] for x in (base, r))
    assert after["samples"] == before["samples"] + 10
    assert after["top1"] == before["top1"] and after["per_class_top1"] == before["per_class_top1"]
