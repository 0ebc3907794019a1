"""Progress on long steps (edgekit/progress.py, edgekit/cli_progress.py): on stderr, never stdout; a plain
line per epoch with a time left when stderr is no terminal; bars that leave nothing behind on a terminal;
nothing with --quiet; and a short convert summary by default (details with -v)."""

from __future__ import annotations

import io
import json
import pickle
import re

import numpy as np
import pytest

from edgekit.cli_progress import Progress
from edgekit.progress import Countdown, Step, seconds
from helpers import run_cli

EPOCH = re.compile(r"^  prune: epoch (\d+)/2, loss [0-9.e+-]+, (\d+) s left$")
EPOCH_ANYWHERE = re.compile(r"prune: epoch \d+/2")  # an epoch line, wherever it would be


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(text: str) -> list[str]:
    """What a terminal shows once `text` is written: each line as its last carriage return left it."""
    return [line.split("\r")[-1] for line in text.split("\n")]


# -- the library's lines --------------------------------------------------------------------------------
def test_a_step_is_the_line_itself_and_crosses_a_pickle_whole():
    step = Step("prune: epoch 1/3, 4 s left", stage="prune epochs", done=1, total=3, seconds_left=4.2)
    assert isinstance(step, str) and step == "prune: epoch 1/3, 4 s left"
    back = pickle.loads(pickle.dumps(step))
    assert isinstance(back, Step) and back == step
    assert (back.stage, back.done, back.total, back.seconds_left) == ("prune epochs", 1, 3, 4.2)


def test_the_time_left_leaves_the_first_step_out_once_a_second_is_done(monkeypatch):
    """The first epoch also builds and traces the model: after two, the rate is that of the second."""
    clock = iter([0.0, 10.0, 12.0])
    monkeypatch.setattr("edgekit.progress.time.perf_counter", lambda: next(clock))
    countdown = Countdown(5)
    assert countdown.left(1) == pytest.approx(40.0)  # 4 left at the 10 s the first took
    assert countdown.left(2) == pytest.approx(6.0)  # 3 left at the 2 s the second took


@pytest.mark.parametrize("value, said", [(0.4, "0 s"), (42, "42 s"), (185, "3 min 5 s"), (3720, "1 h 2 min")])
def test_seconds_read_as_people_say_them(value, said):
    assert seconds(value) == said


# -- rendering -------------------------------------------------------------------------------------------
def test_without_a_terminal_each_counted_step_is_a_line_and_stage_lines_need_verbose():
    out = io.StringIO()
    with Progress(stream=out) as progress:
        progress("loading model.keras")
        progress(Step("prune: epoch 1/2, 3 s left", stage="prune epochs", done=1, total=2, seconds_left=3.0))
    assert out.getvalue() == "  prune: epoch 1/2, 3 s left\n"
    out = io.StringIO()
    with Progress(stream=out, verbose=True) as progress:
        progress("loading model.keras")
    assert out.getvalue() == "  loading model.keras\n"
    out = io.StringIO()
    with Progress(stream=out, quiet=True) as progress:
        progress(Step("prune: epoch 1/2", stage="prune epochs", done=1, total=2))
        assert progress.counter("bench m.tflite", 100) is None
    assert out.getvalue() == ""


def test_on_a_terminal_a_bar_counts_epochs_with_the_time_left_and_is_gone_at_the_end():
    out = _Terminal()
    with Progress(stream=out) as progress:
        progress("loading model.keras")
        progress(Step("prune: fine-tuning", stage="prune epochs", done=0, total=2))
        progress(Step("prune: epoch 1/2", stage="prune epochs", done=1, total=2, seconds_left=7.0))
        progress.write("edgekit: warning: a line that stays")
        drawn = out.getvalue()
    assert "loading model.keras" in drawn and re.search(r"prune epochs \|.*\| 1/2 \[.*7 s left\]", drawn)
    shown = [line.strip() for line in _screen(out.getvalue())]
    assert shown == ["edgekit: warning: a line that stays", ""]  # the bar was cleared, the warning kept


def test_a_benchmark_without_a_terminal_says_a_run_that_took_long(monkeypatch):
    out = io.StringIO()
    progress = Progress(stream=out)
    tick = progress.counter("bench m.tflite", 100)
    tick(100)
    assert out.getvalue() == ""  # under two seconds: no line
    monkeypatch.setattr("edgekit.cli_progress.LONG", 0.0)
    tick = progress.counter("bench m.tflite", 100)
    tick(50)
    tick(50)
    assert re.fullmatch(r"  bench m\.tflite: 100/100 in \d+ s\n", out.getvalue())



def test_a_benchmark_of_runs_no_multiple_of_its_step_still_counts_to_the_end(converted, monkeypatch):
    """time_invokes ticks every n // 50 runs: 1234 runs in steps of 24 ended at 1224, and the line that
    closes a benchmark (or its bar) never came. A real interpreter's invokes."""
    from edgekit.runtime import Model
    from edgekit.runtime.timing import time_invokes

    ticks: list[int] = []
    runner = Model(converted("float32")).runner
    runner.set(runner.input_details()[0]["index"], np.zeros(runner.input_details()[0]["shape"], np.float32))
    assert len(time_invokes(runner, 1234, ticks.append)) == 1234
    assert sum(ticks) == 1234 and ticks[:-1] == [24] * 51 and ticks[-1] == 10
    out = io.StringIO()
    monkeypatch.setattr("edgekit.cli_progress.LONG", 0.0)
    tick = Progress(stream=out).counter("bench m.tflite", 1234)
    for n in ticks:
        tick(n)
    assert re.fullmatch(r"  bench m\.tflite: 1234/1234 in \d+ s\n", out.getvalue())

# -- the command -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fine_tune(digits_keras, digits_dir, tmp_path_factory):
    """`edgekit convert --prune 0.5 --epochs 2` with stderr a pipe, as --json and as plain --quiet (two
    fine-tunes of about 16 s each: the plain run's stderr is the --json run's, its stdout the quiet one's)."""
    out = tmp_path_factory.mktemp("progress")
    args = [digits_keras, "--int8", "--prune", "0.5", "--epochs", "2", "--train-data", digits_dir / "train",
            "--calib", digits_dir / "train", "--force"]
    return {name: run_cli("convert", *args, *extra, "-o", out / f"{name}.tflite")
            for name, extra in (("json", ["--json"]), ("quiet", ["--quiet"]))}


def test_a_fine_tune_without_a_terminal_says_each_epoch_with_the_time_left(fine_tune):
    r = fine_tune["json"]
    assert r.returncode == 0, r.stderr
    epochs = [EPOCH.match(line) for line in r.stderr.splitlines() if EPOCH.match(line)]
    assert [int(m.group(1)) for m in epochs] == [1, 2], r.stderr
    assert int(epochs[-1].group(2)) == 0 and int(epochs[0].group(2)) >= 0
    quiet = fine_tune["quiet"].stdout
    assert not EPOCH_ANYWHERE.search(r.stdout + quiet) and quiet.startswith("wrote ")  # progress: stderr's only


def test_json_stays_json_while_the_progress_goes_to_stderr(fine_tune):
    r = fine_tune["json"]
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["compression"]["prune"]["sparsity"] == 0.5
    assert sum(bool(EPOCH.match(line)) for line in r.stderr.splitlines()) == 2


def test_quiet_says_no_progress(fine_tune):
    r = fine_tune["quiet"]
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("wrote ")


def test_the_default_summary_is_short_and_verbose_has_the_details(digits_keras, digits_dir, tmp_path):
    """The int8 range choice was a 450-character line and the MediaPipe grayscale warning came with every
    conversion of a grayscale model: now one short line each, the rest with -v, and the grayscale note
    only there (it asks nothing of someone who does not use MediaPipe)."""
    out = tmp_path / "d.tflite"
    args = ["convert", digits_keras, "--int8", "--calib", digits_dir / "train", "-o", out, "--force"]
    short, verbose = run_cli(*args), run_cli(*args, "-v")
    assert short.returncode == 0 and verbose.returncode == 0, short.stderr + verbose.stderr
    lines = short.stdout.replace(str(out), "OUT").splitlines()
    assert 3 <= len(lines) <= 4 and max(map(len, lines)) <= 100, short.stdout
    assert lines[0].startswith("wrote OUT (int8") and lines[2].startswith("int8 ranges: ")
    assert all(len(line) <= 100 for line in short.stderr.splitlines()), short.stderr
    assert "MediaPipe" not in short.stderr + short.stdout and "warning" not in short.stderr
    assert "note: input 'image' is grayscale: MediaPipe" in verbose.stdout
    assert "max abs error" in verbose.stdout and "cross-layer equalisation" in verbose.stdout
    assert "  loading " in verbose.stderr and "  converting to int8" in verbose.stderr


def test_the_api_callback_gets_each_epoch_as_a_counted_line_and_keras_prints_nothing(digits_keras, digits_dir,
                                                                                       tmp_path, capfd):
    """`progress=` still receives strings; an epoch's is a Step with its count and time left. Keras's own
    per-epoch lines (fit's verbose, on stdout) are not the progress: stdout stays empty."""
    import edgekit

    said: list[str] = []
    edgekit.convert(digits_keras, mode="float32", output=tmp_path / "p.tflite", pruning=edgekit.PruningSpec(0.5),
                    training=edgekit.TrainingSpec(data=digits_dir / "train", epochs=2), progress=said.append)
    epochs = [s for s in said if isinstance(s, Step) and s.stage == "prune epochs" and s.done > 0]
    assert [(s.done, s.total) for s in epochs] == [(1, 2), (2, 2)] and all(s.seconds_left >= 0 for s in epochs)
    assert all(isinstance(s, str) for s in said) and any(s.startswith("loading ") for s in said)
    assert capfd.readouterr().out == ""
