"""What the library tells a `progress` callback about a counted task (epochs, calibration methods, trials,
variants): a `Step`, which is the line itself as a `str`, so a callback that prints what it gets keeps
working, and which carries where the task is for one that draws a bar (the CLI: edgekit/cli_progress.py)."""

from __future__ import annotations

import time


class Step(str):
    """A progress line of a counted task: `done` of `total` (None: not known ahead) under `stage`, and,
    where it can be estimated, `seconds_left`. It pickles whole: it crosses from a conversion's child."""

    stage: str
    done: int
    total: int | None
    seconds_left: float | None

    def __new__(cls, text: str, *, stage: str, done: int, total: int | None = None,
                seconds_left: float | None = None) -> Step:
        self = super().__new__(cls, text)
        self.stage, self.done, self.total, self.seconds_left = stage, done, total, seconds_left
        return self

    def __reduce__(self):
        return _step, (str(self), self.stage, self.done, self.total, self.seconds_left)


def _step(text: str, stage: str, done: int, total: int | None, seconds_left: float | None) -> Step:
    return Step(text, stage=stage, done=done, total=total, seconds_left=seconds_left)


class Countdown:
    """Seconds left in a task of `total` equal steps, from the time its steps took so far; the first step
    (which also builds and traces what the rest reuse) counts only until a second one is done."""

    def __init__(self, total: int) -> None:
        self.total, self.started = total, time.perf_counter()
        self.first: float | None = None

    def left(self, done: int) -> float:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        rest = self.total - done
        if done <= 1:
            return rest * (now - self.started)
        return rest * (now - self.first) / (done - 1)


def seconds(value: float) -> str:
    """A time left as people read it: 42 s, 3 min 5 s, 1 h 2 min."""
    s = int(round(value))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
