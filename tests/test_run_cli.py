"""`edgekit run` end to end: folders, videos, detection, JSON lines, saved frames and bad input."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from conftest import make_video
from edgekit.cli import main
from helpers import run_cli


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_run_on_a_folder_prints_one_json_line_per_image_and_a_summary(converted, digits_dir):
    result = invoke("run", converted("int8"), "--source", digits_dir / "test" / "5", "--json", "--top-k", "2")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    frames, summary = lines[:-1], lines[-1]["summary"]
    assert len(frames) == 37 and summary["frames"] == 37 and summary["task"] == "classify"
    assert all(len(f["results"]) == 2 for f in frames)
    assert sum(f["results"][0]["label"] == "5" for f in frames) >= 35
    assert summary["fps"] > 0 and summary["source"]["errors"] == 0


def test_run_saves_annotated_frames_and_respects_max_frames(tmp_path, converted, digits_dir):
    out = tmp_path / "annotated"
    result = invoke("run", converted("int8"), "--source", digits_dir / "test" / "2", "--max-frames", "4",
                    "--save-dir", out)
    assert result.exit_code == 0, result.stderr
    saved = sorted(out.glob("*.jpg"))
    assert len(saved) == 4
    import cv2

    assert min(cv2.imread(str(saved[0])).shape[:2]) >= 256
    again = invoke("run", converted("int8"), "--source", digits_dir / "test" / "2", "--max-frames", "4",
                   "--save-dir", out)
    assert again.exit_code == 7  # existing frames are not replaced without --force


def test_run_detects_on_a_video(tmp_path, detector_tflite):
    frames = []
    for i in range(6):
        f = np.zeros((96, 96, 3), np.uint8)
        f[:24, :24, 1] = 255  # green top-left cell
        frames.append(f)
    video = make_video(tmp_path / "green.avi", frames)
    result = invoke("run", detector_tflite, "--source", video, "--json")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[-1]["summary"]["task"] == "detect" and lines[-1]["summary"]["frames"] == 6
    best = lines[0]["results"][0]
    assert best["index"] == 1 and best["score"] > 0.8
    np.testing.assert_allclose(best["box"], [0, 0, 24, 24], atol=2)


def test_unreadable_image_is_reported_the_rest_run_and_the_exit_code_says_so(tmp_path, converted, digits_dir):
    for p in sorted((digits_dir / "test" / "0").glob("*.png"))[:3]:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "zz_broken.png").write_bytes(b"garbage")
    result = run_cli("run", converted("int8"), "--source", tmp_path)
    assert result.returncode == 6
    assert len(result.stdout.strip().splitlines()) == 3
    assert result.finished and "zz_broken.png" in result.stderr and "Traceback" not in result.stderr


def test_run_on_a_non_model_and_a_missing_source(tmp_path, converted):
    bad = tmp_path / "m.tflite"
    bad.write_text("hello")
    result = run_cli("run", bad, "--source", tmp_path)
    assert result.returncode == 3 and len(result.error_lines) == 1
    result = run_cli("run", converted("int8"), "--source", tmp_path / "missing.jpg")
    assert result.returncode == 6 and "no such file, folder or camera" in result.error_lines[-1]


def test_run_never_imports_tensorflow(converted, digits_dir):
    result = run_cli("run", converted("int8"), "--source", digits_dir / "test" / "9", "--max-frames", "3",
                     block_tf=True)
    assert result.returncode == 0, result.stderr
    assert result.imports == [] and result.modules == [], result.import_sites  # not even tried


def test_a_camera_that_never_opens_ends_with_exit_code_8(converted):
    result = run_cli("run", converted("int8"), "--source", "/dev/video-edgekit-test", timeout=60)
    assert result.returncode == 8
    assert result.error_lines[-1].startswith("edgekit: error:") and "could not be opened" in result.error_lines[-1]


def test_show_without_a_gui_build_or_display_says_what_to_install(converted, digits_dir):
    result = run_cli("run", converted("int8"), "--source", digits_dir / "test" / "1", "--show")
    assert result.returncode == 9
    assert result.finished and "opencv-python" in result.error_lines[-1] and "Traceback" not in result.stderr


def test_a_motion_jpeg_video_decodes_scaled_down_unless_frames_are_drawn_or_asked_for(tmp_path, converted, digits_dir):
    """Digits filmed at 320x240: the 8x8 model needs only 1/8 of each frame. Scaled down or whole, the run
    gives the same labels; --full-frames and --save-dir decode whole frames."""
    import cv2

    paths = sorted((digits_dir / "test").glob("*/*.png"))[::6][:40]
    frames = [cv2.resize(cv2.imread(str(p)), (320, 240), interpolation=cv2.INTER_NEAREST) for p in paths]
    video = make_video(tmp_path / "digits.avi", [cv2.cvtColor(f, cv2.COLOR_BGR2RGB) for f in frames])
    runs = {}
    for name, extra in (("scaled", []), ("full", ["--full-frames"]), ("drawn", ["--save-dir", tmp_path / "out"])):
        result = invoke("run", converted("int8"), "--source", video, "--json", *extra)
        assert result.exit_code == 0, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        runs[name] = ([f["results"][0]["label"] for f in lines[:-1]], lines[-1]["summary"]["source"]["decoded"])
    truth = [p.parent.name for p in paths]
    assert runs["scaled"][1] == "40x30 of 320x240 (JPEG at 1/8)"
    assert runs["full"][1] is None and runs["drawn"][1] is None and runs["full"][0] == runs["drawn"][0]
    agree = sum(a == b for a, b in zip(runs["scaled"][0], runs["full"][0]))
    right = [sum(a == t for a, t in zip(runs[k][0], truth)) for k in ("scaled", "full")]
    print(f"scaled vs whole: {agree}/40 labels agree; right {right[0]}/40 scaled, {right[1]}/40 whole")
    assert len(runs["scaled"][0]) == 40 and agree >= 38 and right[0] >= right[1] - 1 and right[1] >= 36, (agree, right)
