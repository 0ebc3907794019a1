"""A conversion in a child process, so that a native crash inside TensorFlow (its calibrator segfaults on
some sequence ops, MLIR aborts on some graphs) ends the child, not the caller: the caller gets one
ConversionError naming the signal and the step the conversion had reached, and nothing is written (the
file is written atomically, last).

The child is a fresh interpreter (multiprocessing's spawn: nothing of the caller's TensorFlow state is
shared); it runs converters/pipeline.convert on the same recipe and sends back each progress line (a counted
`edgekit.progress.Step` whole, with its count and time left), then the result or the error. Errors cross as
their class, arguments and attributes, so the caller sees the typed error the pipeline raised.
"""

from __future__ import annotations

import importlib
import multiprocessing
import signal
import sys
from collections.abc import Callable
from typing import Any

from edgekit.converters.recipe import ConvertRecipe
from edgekit.converters.results import ConvertResult
from edgekit.errors import ConversionError, EdgekitError
from edgekit.progress import Step


def convert_isolated(recipe: ConvertRecipe, *, progress: Callable[[str], Any] | None = None) -> ConvertResult:
    """pipeline.convert(recipe) run in a child process; a native crash there is a ConversionError (exit 5).
    What `pipeline.preflight` refuses is refused here, before the child starts (it takes seconds)."""
    with IsolatedConverter() as converter:
        return converter.convert(recipe, progress=progress)


class IsolatedConverter:
    """Conversions one after another in one child process, so that TensorFlow is imported once for many of
    them (`tune`'s trials, `sweep`'s variants): `with IsolatedConverter() as c: c.convert(recipe)`. A native
    crash ends that conversion with a ConversionError and the next one starts a fresh child; so does every
    `MAX_JOBS`-th (what TensorFlow keeps between conversions stays bounded)."""

    MAX_JOBS = 16

    def __init__(self) -> None:
        self._child: Any = None
        self._jobs: Any = None
        self._results: Any = None
        self._done = 0

    def __enter__(self) -> IsolatedConverter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        jobs_out, self._jobs = ctx.Pipe(duplex=False)
        self._results, results_in = ctx.Pipe(duplex=False)
        self._child = ctx.Process(target=_child, args=(jobs_out, results_in), name="edgekit-convert", daemon=True)
        self._child.start()
        jobs_out.close()
        results_in.close()
        self._done = 0

    def convert(self, recipe: ConvertRecipe, *, progress: Callable[[str], Any] | None = None) -> ConvertResult:
        from edgekit.converters.pipeline import preflight

        out = preflight(recipe)  # once: the child's pipeline.convert is told so
        if self._child is None or not self._child.is_alive() or self._done >= self.MAX_JOBS:
            self.close()
            self._start()
        self._done += 1
        self._jobs.send((recipe, out))
        step = "starting"
        error: BaseException | None = None
        try:
            while True:
                try:
                    kind, value = self._results.recv()
                except EOFError:
                    break
                if kind == "say":
                    step = value
                    if progress is not None:
                        progress(value)
                elif kind == "result":
                    return value
                elif kind == "error":  # raised below: the child is well, and waits for the next job
                    error = _rebuilt(value)
                    break
        except BaseException:  # Ctrl-C, or an error of the caller's progress callback: the child goes too
            self._child.terminate()
            raise
        if error is not None:
            raise error from None
        self._child.join()
        exitcode = self._child.exitcode
        self.close()
        raise ConversionError(f"TensorFlow {_death(exitcode)} while {_step(step)}; nothing was written. This "
                              "is a crash inside TensorFlow's converter, not a refusal by edgekit: try "
                              "`mode=float16` or `mode=dynamic` (no calibration), or `input_shape` for a model "
                              "with open sizes")

    def close(self) -> None:
        """The child told to stop, and waited for (terminated where it does not)."""
        if self._child is None:
            return
        try:
            if self._child.is_alive():
                self._jobs.send(None)
                self._child.join(timeout=30)
            if self._child.is_alive():
                self._child.terminate()
                self._child.join()
        except (OSError, ValueError):  # a pipe the child closed by dying
            self._child.join()
        finally:
            for end in (self._jobs, self._results):
                end.close()
            self._child = None


def _child(jobs, results) -> None:
    """Runs in the child: one conversion per job until told to stop (None) or the pipe closes. Every progress
    line is sent (the caller names the last one in a crash). A job's `out`: the output path the caller's
    preflight gave (it is not run again)."""
    from edgekit.converters.pipeline import convert

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides on Ctrl-C, and terminates us
    while True:
        try:
            job = jobs.recv()
        except EOFError:
            break
        if job is None:
            break
        recipe, out = job
        try:
            result = convert(recipe, progress=lambda msg: results.send(
                ("say", msg if isinstance(msg, Step) else str(msg))), preflighted=out)
            results.send(("result", result))
        except EdgekitError as exc:
            results.send(("error", _portable(exc)))
        except BaseException as exc:  # noqa: BLE001 - an internal error: the caller shows it as one, with where
            import traceback

            if sys.version_info >= (3, 11):  # Python 3.10 has no notes (add_note would raise AttributeError here)
                exc.add_note("raised in the conversion's child process:\n" + "".join(traceback.format_exception(exc)))
            results.send(("error", _portable(exc)))
    results.close()


def _portable(exc: BaseException) -> tuple[str, str, tuple, dict]:
    """An exception as (module, class, args, attributes): rebuilt without calling its __init__, whose
    signature may differ from its args (UnsupportedOpsError(message, ops))."""
    attrs = {k: v for k, v in vars(exc).items() if picklable(v)}  # __notes__ included
    args = tuple(a if picklable(a) else str(a) for a in exc.args)
    return type(exc).__module__, type(exc).__qualname__, args, attrs


def picklable(value) -> bool:
    """Can `value` cross to the child (files and arrays, not a tf.data pipeline, a generator or a model)?"""
    import pickle

    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - anything pickle refuses
        return False
    return True


def _rebuilt(portable: tuple[str, str, tuple, dict]) -> BaseException:
    module, name, args, attrs = portable
    try:
        cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(name)
    except Exception:  # noqa: BLE001 - a class this process cannot import: an internal error
        return RuntimeError(f"{module}.{name}: {args[0] if args else ''}")
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"crashed ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"crashed (signal {-exitcode})"
    return f"stopped without an answer (exit status {exitcode})"


def _step(said: str) -> str:
    return said[:1].lower() + said[1:] if said else "starting"
