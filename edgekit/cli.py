"""The `edgekit` command. Subcommands import their machinery when invoked, so `--help`,
`--version` and `bench` never pay for TensorFlow."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import click

from edgekit import __version__
from edgekit.api import require_convert_extra
from edgekit.cli_options import cli_name, command_options, convert_options, recipe_arguments, values_of
from edgekit.cli_progress import Progress
from edgekit.errors import (
    BROKEN_PIPE_EXIT,
    EXIT_CODES,
    INTERNAL_ERROR_EXIT,
    INTERRUPTED_EXIT,
    BudgetMissedError,
    EdgekitError,
    RemoteError,
    UsageError,
    one_line,
    render_params,
)


def _handle_errors(fn):
    """EdgekitError -> one line on stderr and its exit code; anything else -> one line, exit 70."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            from edgekit.runtime.quiet import native_output_silenced

            with native_output_silenced(), _warnings_as_lines():  # for the command (library calls never do this)
                return fn(*args, **kwargs)
        except EdgekitError as exc:
            click.echo(f"edgekit: error: {one_line(exc.render(cli_name))}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("edgekit: interrupted", err=True)
            sys.exit(INTERRUPTED_EXIT)
        except BrokenPipeError:  # `edgekit run ... | head`: the reader left, stop quietly like cat does
            try:
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (stdout from now on)
            except OSError:
                pass
            sys.exit(BROKEN_PIPE_EXIT)
        except click.exceptions.Exit:
            raise
        except Exception as exc:  # never a traceback for the user; EDGEKIT_DEBUG=1 shows it
            if os.environ.get("EDGEKIT_DEBUG"):
                raise
            click.echo(f"edgekit: internal error: {type(exc).__name__}: {one_line(exc)} "
                       "(set EDGEKIT_DEBUG=1 for the traceback)", err=True)
            sys.exit(INTERNAL_ERROR_EXIT)

    return wrapper


class _Rendered(logging.Formatter):
    """Log lines with the parameters they name shown as flags."""

    def format(self, record: logging.LogRecord) -> str:
        return render_params(super().format(record), cli_name)


class _AboveBars(logging.StreamHandler):
    """Writes each line above any progress bar drawn on the same stream (tqdm clears and redraws it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's own rule: a handler never raises
            self.handleError(record)


@contextlib.contextmanager
def _warnings_as_lines():
    """The library's logged warnings (logger "edgekit": an ignored metadata record, a delegate that did not
    load) as `edgekit: warning: ...` lines on stderr while the command runs."""

    said: set[str] = set()

    def once(record: logging.LogRecord) -> bool:  # a model loaded twice (bench) warns once
        message = record.getMessage()
        fresh = message not in said
        said.add(message)
        return fresh

    handler = _AboveBars(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_Rendered("edgekit: warning: %(message)s"))
    handler.addFilter(once)
    logger = logging.getLogger("edgekit")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


class _OneLineGroup(click.Group):
    """click's own usage errors (unknown option, missing argument) as one line, like every edgekit error."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (see {exc.ctx.command_path} --help)" if exc.ctx else ""
            click.echo(f"edgekit: error: {one_line(exc.format_message())}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"edgekit: error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("edgekit: interrupted", err=True)
            sys.exit(INTERRUPTED_EXIT)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgekit")
def main() -> None:
    """edgekit: convert Keras models to quantized .tflite, benchmark them, run them on devices."""


main.help = (main.help or "") + "\n\n\b\nExit codes:\n" + "\n".join(  # \b: click keeps these lines as they are
    f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@convert_options
@command_options("convert")
@click.pass_context
@_handle_errors
def convert(ctx, model, as_json, quiet, verbose, **values):
    """Convert a Keras model (.keras, .h5, SavedModel folder) to .tflite; float32 unless a mode is given."""
    from edgekit.api import convert_in_child
    from edgekit.report import convert_summary

    arguments = recipe_arguments(ctx, values)
    with Progress(quiet=quiet, verbose=verbose) as progress:
        result = convert_in_child(model, **arguments, progress=None if quiet else progress)
    for warning in result.warnings:
        click.echo(f"edgekit: warning: {render_params(warning, cli_name)}", err=True)
    result = replace(result, changes=tuple(render_params(c, cli_name) for c in result.changes))
    for change in result.changes if as_json else ():  # stdout is the JSON: what was chosen goes to stderr
        click.echo(f"edgekit: {change}", err=True)
    click.echo(json.dumps(result.metadata, indent=2) if as_json else convert_summary(result, verbose))
    for missed in result.missed:  # written all the same: the exit code is for a script that must not ship it
        click.echo(f"edgekit: error: {render_params(missed, cli_name)}", err=True)
    if result.missed:
        sys.exit(BudgetMissedError.exit_code)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@command_options("sweep")
@_handle_errors
def sweep(model, as_json, quiet, **values):
    """Build float32, float16, dynamic, int8, int16x8 and the autopilot's mixed int8 of MODEL; measure size,
    latency and accuracy of each in one run; mark the Pareto-optimal ones and recommend one."""
    from edgekit.api import sweep_in_child as api_sweep
    from edgekit.sweeper import SweepSettings, sweep_table

    settings = values_of(SweepSettings, values)
    with Progress(quiet=quiet) as progress:
        summary = api_sweep(model, **settings, progress=None if quiet else progress).report
    if as_json:
        click.echo(json.dumps({k: v for k, v in summary.items() if k != "bench"}, indent=2))
    else:
        click.echo(sweep_table(summary))
        out = settings["out"]
        if out is not None:
            click.echo(f"wrote {out / 'sweep.json'} and {out / 'report.html'}")


def _optuna_quiet() -> None:
    """Optuna's line per trial (ours say more, a failed one without a traceback) and its warnings that the
    heartbeat and retry callback `tune` uses are experimental: not the user's business. The CLI's to decide,
    not the library's."""
    import warnings

    from edgekit.tune_store import import_optuna

    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial: our line says why, without a traceback
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@command_options("tune")
@_handle_errors
def tune(model, as_json, quiet, **values):
    """Search mode, calibration, float islands, pruning and QAT of MODEL for the best trade-off of accuracy,
    latency on each device (--on) and size, on an Optuna study that many machines may share; write the front to
    OUT/pareto.json and OUT/report.html and name the file to ship per device and budget."""
    from edgekit.api import tune_in_child
    from edgekit.tune_front import tune_table
    from edgekit.tuner import TuneSettings

    settings = values_of(TuneSettings, values)
    _optuna_quiet()
    with Progress(quiet=quiet) as progress:
        summary = tune_in_child(model, **settings, progress=None if quiet else progress).report
    click.echo(json.dumps(summary, indent=2) if as_json else tune_table(summary))
    if not as_json:
        click.echo(f"wrote {settings['out'] / 'pareto.json'} and {settings['out'] / 'report.html'}")


@main.command()
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=Path))
@command_options("bench")
@_handle_errors
def bench(models, json_path, force, quiet, **values):
    """Latency, size, memory and accuracy of .tflite models, against a float model when given."""
    from edgekit.api import bench as api_bench
    from edgekit.api import bench_on
    from edgekit.files import atomic_write_text, check_writable
    from edgekit.params import BenchParams, RemoteParams
    from edgekit.report import bench_table

    local, remote = values_of(BenchParams, values), values_of(RemoteParams, values)
    if json_path is not None and str(json_path) != "-":
        check_writable(json_path, force)
    hosts = remote.pop("hosts")
    remote_only = [cli_name(name) for name in ("remote_data", "keep_remote") if remote[name]]
    if remote_only and not hosts:
        raise UsageError(f"{', '.join(remote_only)} needs --on HOST")
    if hosts and local["baseline"] is not None:
        raise UsageError("--baseline compares latency measured here; with --on, bench the baseline beside the "
                         "model and compare the p50 columns")
    if hosts:
        del local["baseline"]
        result = bench_on(hosts, list(models), **local, **remote)
    else:
        with Progress(quiet=quiet) as progress:
            result = api_bench(list(models), **local, progress=progress.counter)
    report = result.report
    _device_warnings(report)
    skipped = (report.get("data") or {}).get("skipped_count")
    if skipped:
        click.echo(f"edgekit: warning: skipped {skipped} unreadable --data image(s) (--strict makes this an error); "
                   f"first: {report['data']['skipped'][0]['reason']}", err=True)
    if not report["models"]:  # --on and no host answered: nothing to report but the failures
        pass
    elif json_path is not None and str(json_path) == "-":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(bench_table(report))
        if json_path is not None:
            atomic_write_text(json_path, json.dumps(report, indent=2) + "\n", force=force)
            click.echo(f"wrote {json_path}")
    for failed in result.failed_hosts:
        click.echo(f"edgekit: error: {failed['host']}: {render_params(failed['error'], cli_name)}", err=True)
    if result.failed_hosts:
        sys.exit(RemoteError.exit_code)


def _device_warnings(report) -> None:
    """A throttled device gives low figures: say so, per host."""
    for row in report["models"]:
        if (row.get("device") or {}).get("throttled"):
            where = row.get("host") or row["device"]["hostname"]
            click.echo(f"edgekit: warning: {where} throttled while measuring {Path(row['path']).name}: its "
                       "latency is not representative (cool it, or check its power supply)", err=True)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@command_options("run")
@_handle_errors
def run(model, as_json, **values):
    """Run a .tflite on a camera, video, image, folder, glob or .npy/.npz samples, with per-frame results and FPS."""
    from edgekit.params import OPEN_MODEL, RunParams
    from edgekit.run import open_model, run_stream
    from edgekit.runtime.sources import open_source

    params = values_of(RunParams, values)
    m = open_model(model, **{k: params.pop(k) for k in OPEN_MODEL})  # its warnings: _warnings_as_lines

    def on_error(path, exc):
        click.echo(f"edgekit: warning: {one_line(exc.render(cli_name) if isinstance(exc, EdgekitError) else exc)}",
                   err=True)

    def on_result(frame, results, ms):
        if as_json:
            line = json.dumps({"frame": frame.index, "name": frame.name, "ms": round(ms, 4),
                               "results": [r.to_dict() for r in results]})
        else:
            line = f"{frame.name}  {', '.join(r.to_text() for r in results) or '-'}  ({ms:.2f} ms)"
        click.echo(line)

    src = open_source(params.pop("source"), on_error=on_error)
    with _ctrl_c_between_frames() as stop:
        summary = run_stream(m, src, **params, on_result=on_result, stop=stop)
    d = summary.to_dict()
    if d["batch_check"] and not d["batch_check"]["ok"]:
        c = d["batch_check"]
        click.echo(f"edgekit: warning: {params['batch']} images per invoke did not give the single invokes' answers "
                   f"(largest difference {c['max_difference']:.3g}, allowed {c['tolerance']:.3g}): ran them one by "
                   "one", err=True)
    if as_json:
        click.echo(json.dumps({"summary": d}))
    else:
        click.echo(_run_summary_line(d), err=True)
    if summary.interrupted:
        click.echo("edgekit: interrupted", err=True)
        sys.exit(INTERRUPTED_EXIT)
    summary.check()


@contextlib.contextmanager
def _ctrl_c_between_frames():
    """The first Ctrl-C of a run ends it after the frame in hand, whose line is then written whole, so the
    summary counts exactly the lines printed; a second one stops at once."""
    asked: list[bool] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield lambda: False
        return

    def on_sigint(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(True)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: bool(asked)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_summary_line(d: dict) -> str:
    """`edgekit run`'s text summary: FPS, invoke and whole-path times, glass-to-result age, what bounded it."""
    s = d["source"]
    per = f" per frame ({d['batch']} frames per invoke)" if d["batch"] > 1 else ""
    line = (f"{d['frames']} frames in {d['seconds']:.2f} s ({d['fps']} FPS), inference p50 "
            f"{d['latency_ms']['p50']:.2f} ms{per}, per frame p50 {d['per_frame_ms']['p50']:.2f} ms")
    if d["age_ms"]:
        line += f", glass-to-result p50 {d['age_ms']['p50']:.1f} ms p99 {d['age_ms']['p99']:.1f} ms"
    if d["bound"]:
        rates = ", ".join(f"{k} {v:.0f}" for k, v in d["rates"].items() if v)
        line += f"; {d['bound']} ({rates} FPS)"
    if s.get("decoded"):
        line += f"; decoded {s['decoded']}" + (f" on {d['decoders']} threads" if d["decoders"] > 1 else "")
    return line + f"; dropped {s['dropped']}, reconnects {s['reconnects']}, unreadable {s['errors']}"


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@command_options("inspect")
@_handle_errors
def inspect(model, as_json, **values):
    """What is inside a .tflite, and whether it will run on a GPU and on a given runtime."""
    from edgekit.api import inspect as api_inspect
    from edgekit.params import InspectParams
    from edgekit.report import inspect_text

    result = api_inspect(model, **values_of(InspectParams, values))
    click.echo(json.dumps(result.report, indent=2) if as_json else inspect_text(result.report, cli_name))
    result.check_runtimes()


@main.command()
@command_options("doctor")
@_handle_errors
def doctor(as_json, hosts, remote_python, connect_timeout):
    """Python, numpy, interpreters, TensorFlow, GPUs, delegates, and known-bad combinations with fixes."""
    from edgekit.runtime.doctor import diagnose, doctor_text

    if not hosts:
        d = diagnose()
        click.echo(json.dumps(d, indent=2) if as_json else doctor_text(d))
        return
    from edgekit.remote import Session, doctor_on

    results = doctor_on(list(hosts), Session(remote_python=remote_python, connect_timeout=connect_timeout,
                                             timeout=120.0))
    ok = [r.report for r in results if r.report is not None]  # a host's report, or its error: never both
    click.echo(json.dumps(ok, indent=2) if as_json else "\n\n".join(f"== {d['host']}\n{doctor_text(d)}" for d in ok))
    for r in results:
        if r.error is not None:
            click.echo(f"edgekit: error: {r.host.spec}: {render_params(r.error, cli_name)}", err=True)
    if len(ok) < len(results):
        sys.exit(RemoteError.exit_code)


@main.command()
@command_options("demo")
@_handle_errors
def demo(quiet, **values):
    """Train a small CNN on the bundled digits, convert it four ways, bench all against it."""
    require_convert_extra()
    from edgekit.demo import run_demo
    from edgekit.params import DemoParams

    run_demo(**values_of(DemoParams, values),
             say=(lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True)), show=click.echo)


if __name__ == "__main__":  # pragma: no cover
    main()
