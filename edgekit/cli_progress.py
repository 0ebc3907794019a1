"""How the `edgekit` command shows the library's progress, on stderr (stdout stays the command's output):
on a terminal, tqdm bars for counted steps (epochs, calibration methods, trials, benchmark runs) and one
status line for the current stage, both gone when the command ends; to a file or a pipe, a plain line per
counted step (stage lines with -v); nothing with --quiet."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from edgekit.progress import Step, seconds

if TYPE_CHECKING:
    from tqdm import tqdm

QUIET_HELP = "No progress on stderr (errors and warnings still show)."
VERBOSE_HELP = "Details: every stage on stderr, and how each result was reached."
LONG = 2.0  # seconds: a benchmark's runs shorter than this draw no bar and write no line
EVERY = 10.0  # seconds between two plain lines of one benchmark's runs


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed stream, CliRunner's
        return False


def _width(stream) -> dict[str, Any]:
    """tqdm's width: the terminal's as it changes, or 80 columns where the terminal has no size (a pty
    opened by a program: tqdm would draw nothing in 0 columns)."""
    try:
        known = os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):
        known = False
    return {"dynamic_ncols": True} if known else {"ncols": 80, "nrows": 24}


class Progress:
    """The `progress` callback handed to the library (`__call__` takes its lines, `counter` is bench's
    `(label, total) -> tick` form), rendered as the module docstring says. Use it as a context manager:
    its bars are cleared before the command prints its results or an error."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet, self.verbose, self.terminal = quiet, verbose, _is_terminal(self.stream)
        self._lock = threading.RLock()
        self._bar: tqdm[Any] | None = None  # the one bar or status line drawn now (terminal only)
        self._stage: str | None = None  # the Step.stage that `_bar` counts (None: a status line)
        self._ticking: threading.Event | None = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __call__(self, line: str) -> None:
        if self.quiet:
            return
        with self._lock:
            if isinstance(line, Step):
                self._step(line)
            else:
                self._status(str(line))

    def close(self) -> None:
        with self._lock:
            self._drop()
            if self._ticking is not None:
                self._ticking.set()

    def write(self, line: str) -> None:
        """A line that stays (a warning, a plain progress line), written above any bar."""
        with self._lock:
            if self.terminal:
                from tqdm import tqdm

                tqdm.write(line, file=self.stream)  # clears the bars drawn on the stream, writes, redraws them
            else:
                click.echo(line, file=self.stream)

    def _status(self, line: str) -> None:
        if self.verbose or not self.terminal:  # a stage line stays with -v, and is left out of a log without
            if self.verbose:
                self._drop()
                self.write(f"  {line}")
            return
        self._drop()
        self._bar = self._tqdm(total=None, desc=line, bar_format="  {desc} [{elapsed}]")

    def _step(self, step: Step) -> None:
        if self.verbose or not self.terminal:
            self.write(f"  {step}")
        if not self.terminal:
            return
        bar = self._bar  # None only with `_stage` None, which no step's stage equals
        if bar is None or self._stage != step.stage or step.total is None:
            self._drop()
            bar = self._bar = self._tqdm(total=step.total, desc=step.stage if step.total else step, bar_format=(
                "  {desc} |{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]" if step.total else "  {desc} [{elapsed}]"))
            self._stage = step.stage
        if step.seconds_left is not None:
            bar.set_postfix_str(f"{seconds(step.seconds_left)} left", refresh=False)
        bar.update(step.done - bar.n)
        if step.total is not None and step.done >= step.total:
            self._drop()

    def _drop(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._stage = None, None

    def _tqdm(self, **kw: Any) -> tqdm[Any]:
        from tqdm import tqdm

        if self._ticking is None:
            self._ticking = threading.Event()
            threading.Thread(target=self._tick, args=(self._ticking,), name="edgekit-progress", daemon=True).start()
        return tqdm(file=self.stream, leave=False, **_width(self.stream), **kw)

    def _tick(self, ticking: threading.Event) -> None:
        """Redraws the bar every second: its clock moves while a long step runs between two lines."""
        while not ticking.wait(1.0):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()

    def counter(self, label: str, total: int) -> Callable[[int], None] | None:
        """bench's progress form: a tick(n) for `total` units of `label` (a bar shown after LONG seconds on
        a terminal; elsewhere a line every EVERY seconds and one at the end if it took LONG or more)."""
        if self.quiet:
            return None
        if self.terminal:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=f"  {label}", unit="run", file=self.stream, leave=False, delay=LONG,
                       **_width(self.stream))

            def tick(n: int) -> None:
                bar.update(n)
                if bar.n >= total:
                    bar.close()

            return tick
        return _Lines(self, label, total).tick


class _Lines:
    """A counted task's plain lines, for a stderr that is no terminal."""

    def __init__(self, progress: Progress, label: str, total: int) -> None:
        self.progress, self.label, self.total = progress, label, total
        self.done, self.started = 0, time.perf_counter()
        self.said = self.started

    def tick(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        took = now - self.started
        if self.done >= self.total:
            if took >= LONG:
                self.progress.write(f"  {self.label}: {self.total}/{self.total} in {seconds(took)}")
        elif now - self.said >= EVERY:
            self.said = now
            left = took / self.done * (self.total - self.done)
            self.progress.write(f"  {self.label}: {self.done}/{self.total}, {seconds(left)} left")
