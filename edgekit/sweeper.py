"""`edgekit sweep`: every mode of one model, measured in one run by the bench harness, with the
Pareto-optimal rows marked and a recommendation for the target."""

from __future__ import annotations

import dataclasses
import gzip
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.recipe import BudgetSpec, ConvertRecipe, PruningSpec, TrainingSpec
from edgekit.declare import option, required
from edgekit.errors import EdgekitError, UsageError
from edgekit.progress import Step
from edgekit.runtime.delegates import TARGETS as ALL_TARGETS

SWEEP_SCHEMA = "edgekit.sweep/1"
TARGETS = tuple(t for t in ALL_TARGETS if t in ("cpu", "gpu"))  # the targets `recommend` has a rule for


@dataclass(frozen=True)
class SweepSettings:
    """What `edgekit sweep` takes, each option declared once (the CLI's flags are made from them)."""

    model: Path
    calib: Path = required("Calibration data: an image folder or a .npy/.npz file (as convert's --calib).",
                           kind=Path)
    eval_data: Path = required("Labelled data: image class folders, or a .npz with labels (y).", kind=Path)
    target: str = option("cpu", "What the recommendation is for.", choices=TARGETS)
    max_drop: float = option(1.0, "Accuracy budget (top-1 points) of the autopilot variant and the "
                             "recommendation.", kind=float)
    train_data: Path | None = option(None, "Add QAT and pruned + QAT int8 variants.", kind=Path)
    out: Path | None = option(None, "Write models/, sweep.json and report.html here.", kind=Path)
    force: bool = option(False, "Replace existing files in --out.", kind=bool)
    threads: int | None = option(None, "Interpreter threads for the latency runs [all cores].", kind=int)
    runs: int = option(100, "Timed invokes per model.", kind=int)
    seed: int = 0
    isolated: bool = False  # each variant converts in a child process (converters/isolated.py)

    def __post_init__(self) -> None:
        from edgekit.runtime.samples import SampleData
        from edgekit.runtime.timing import resolve_threads

        object.__setattr__(self, "threads", resolve_threads(self.threads))
        if self.target not in TARGETS:
            raise UsageError(f"must be one of {', '.join(TARGETS)}, got {self.target!r}", param="target")
        if not self.max_drop >= 0:
            raise UsageError(f"must be >= 0, got {self.max_drop:g}", param="max_drop")
        for name in ("calib", "eval_data"):  # read as convert reads them: a folder, or a .npy/.npz (headers checked)
            SampleData.check(getattr(self, name), error=UsageError, param=name)


def variants(s: SweepSettings) -> list[tuple[str, dict[str, Any]]]:
    """(name, ConvertRecipe keywords) for every variant the sweep builds."""
    base = {"calib": s.calib, "seed": s.seed}
    found: list[tuple[str, dict[str, Any]]] = [
        ("float32", {"mode": "float32"}),
        ("float16", {"mode": "float16"}),
        ("dynamic", {"mode": "dynamic"}),
        ("int8", {"mode": "int8", **base}),
        ("int16x8", {"mode": "int16x8", **base}),
        ("int8-auto", {"mode": "int8", "budget": BudgetSpec(max_drop=s.max_drop, eval_data=s.eval_data), **base}),
    ]
    if s.train_data is not None:
        train = {"mode": "int8", "training": TrainingSpec(data=s.train_data, val_data=s.eval_data, qat=True), **base}
        tune = {**train, "training": TrainingSpec(data=s.train_data, val_data=s.eval_data)}
        found += [("int8-qat", train), ("int8-prune50-qat", {**train, "pruning": PruningSpec(0.5)}),
                  # whole channels removed: the pruned variant that runs faster, not only gzips smaller
                  ("int8-channels50", {**tune, "pruning": PruningSpec(0.5, structure="channels")})]
    return found


def pareto(rows: list[dict[str, Any]]) -> list[bool]:
    """Rows no other row beats on size, p50 latency and top-1 at once (all at least as good, one better)."""
    def key(r):
        return r["size_bytes"], r["p50_ms"], -(r["top1"] if r["top1"] is not None else -1.0)

    marks = []
    for r in rows:
        a = key(r)
        dominated = any(all(x <= y for x, y in zip(key(o), a)) and key(o) != a for o in rows if o is not r)
        marks.append(not dominated)
    return marks


def recommend(rows: list[dict[str, Any]], target: str, max_drop: float) -> dict[str, Any]:
    """cpu: the fastest row within the budget (a smaller one when p50 is within 5 %); gpu: float16 (the GPU
    delegate computes in float16 and runs integer models dequantized), else the best float row."""
    within = [r for r in rows if r["drop_points"] is not None and r["drop_points"] <= max_drop]
    if not within:
        best = min(rows, key=lambda r: r["drop_points"] if r["drop_points"] is not None else float("inf"))
        return {"variant": best["variant"], "reason": f"no variant is within {max_drop:g} points; this one loses least"}
    if target == "gpu":
        for mode in ("float16", "float32"):
            for r in within:
                if r["variant"] == mode:
                    return {"variant": mode, "reason": "the GPU delegate computes in float16; "
                            f"{mode} is within {max_drop:g} points"}
        return {"variant": min(within, key=lambda r: r["p50_ms"])["variant"],
                "reason": f"no float variant is within {max_drop:g} points; this is the fastest that is"}
    fastest = min(r["p50_ms"] for r in within)
    near = [r for r in within if r["p50_ms"] <= 1.05 * fastest]
    pick = min(near, key=lambda r: (r["size_bytes"], r["p50_ms"]))
    return {"variant": pick["variant"], "reason": f"the fastest within {max_drop:g} points on the CPU "
            f"(p50 {pick['p50_ms']:.4f} ms, {pick['size_bytes']:,} B)"}


def _build(s: SweepSettings, todo: list, model_dir: Path, progress: Callable[[str], None] | None) -> tuple:
    """Each variant converted (in a child process where it can be): (built (name, path), failed, meta)."""
    from edgekit.converters.isolated import convert_isolated, picklable
    from edgekit.converters.pipeline import convert

    say = progress or (lambda _msg: None)
    built, failed, meta = [], [], {}
    stem = s.model.name.rsplit(".", 1)[0] if s.model.suffix in (".keras", ".h5") else s.model.name
    for k, (name, kw) in enumerate(todo):
        say(Step(f"building {name} [{k + 1}/{len(todo) + 1}]", stage="sweep", done=k, total=len(todo) + 1))
        recipe = ConvertRecipe(model=s.model, output=model_dir / f"{stem}.{name}.tflite", force=s.force, **kw)
        t0 = time.perf_counter()
        try:  # the conversion's own lines (epochs, calibration, trials) go to `progress` too
            result = (convert_isolated(recipe, progress=progress) if s.isolated and picklable(recipe)
                      else convert(recipe, progress=progress))
        except EdgekitError as exc:
            failed.append({"variant": name, "error": str(exc)})
            continue
        built.append((name, result.path))
        meta[name] = {"convert_seconds": round(time.perf_counter() - t0, 2),
                      "autopilot": result.metadata.get("autopilot"),
                      "compression": result.metadata.get("compression")}
    return built, failed, meta


def _row(name: str, path: Path | None, m: dict[str, Any], gz: int, meta: dict[str, Any]) -> dict[str, Any]:
    """One variant's row of the sweep table, from its bench entry."""
    acc = m["accuracy"] or {}
    return {
        "variant": name, "file": None if path is None else str(path), "mode": m["mode"],
        "size_bytes": m["size_bytes"], "gzip_bytes": gz,
        "p50_ms": m["latency_ms"]["p50"], "top1": acc.get("top1"),
        "drop_points": None if acc.get("top1_delta_points") is None else 0.0 - acc["top1_delta_points"],
        "per_class_top1": acc.get("per_class_top1"), "convert_seconds": meta["convert_seconds"],
        "float_ops": len((meta["autopilot"] or {}).get("float_ops") or []),
    }


def sweep(s: SweepSettings, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build every variant, bench them together against the float model, and write the reports."""
    from edgekit.files import atomic_write_text, check_writable
    from edgekit.harness import BenchSettings, bench

    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    outputs = []
    if s.out is not None:
        outputs = [s.out / "sweep.json", s.out / "report.html"]
        s.out.mkdir(parents=True, exist_ok=True)
        for path in outputs:
            check_writable(path, s.force)
    with tempfile.TemporaryDirectory(prefix="edgekit-sweep-") as tmp:
        model_dir = s.out / "models" if s.out is not None else Path(tmp)
        model_dir.mkdir(parents=True, exist_ok=True)
        todo = variants(s)
        built, failed, meta = _build(s, todo, model_dir, progress)
        if not built:
            raise EdgekitError("no variant could be built: " + "; ".join(f["error"] for f in failed))
        say(Step(f"benchmarking {len(built)} models [{len(todo) + 1}/{len(todo) + 1}]", stage="sweep",
                 done=len(todo), total=len(todo) + 1))
        report = bench([p for _, p in built], BenchSettings(threads=s.threads, runs=s.runs),
                       data=s.eval_data, reference=s.model)
        gzipped = [len(gzip.compress(path.read_bytes())) for _, path in built]  # before a temp dir goes
    rows = [_row(name, path if s.out is not None else None, m, gz, meta[name])
            for (name, path), m, gz in zip(built, report["models"], gzipped)]
    for r, mark in zip(rows, pareto(rows)):
        r["pareto"] = mark
    summary = {
        "schema": SWEEP_SCHEMA,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(s).items()},
        "reference": report["reference"],
        "rows": rows,
        "failed": failed,
        "recommendation": recommend(rows, s.target, s.max_drop),
        "bench": report,
        "variants": meta,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if s.out is not None:
        import json

        from edgekit.html_report import sweep_html

        atomic_write_text(outputs[0], json.dumps(summary, indent=2), force=s.force)
        atomic_write_text(outputs[1], sweep_html(summary), force=s.force)
    return summary


def sweep_table(summary: dict[str, Any]) -> str:
    from edgekit.report import _size

    cols = ["variant", "size", "gzip", "p50 ms", "top1 %", "drop pts", "pareto"]
    rows = [[r["variant"], _size(r["size_bytes"]), _size(r["gzip_bytes"]), f"{r['p50_ms']:.4f}",
             "-" if r["top1"] is None else f"{100 * r['top1']:.2f}",
             "-" if r["drop_points"] is None else f"{r['drop_points']:+.2f}", "*" if r["pareto"] else ""]
            for r in summary["rows"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    ref = summary["reference"] or {}
    out = [f"float model {summary['settings']['model']}: top-1 {100 * ref.get('top1', 0):.2f}% on "
           f"{summary['settings']['eval_data']}", line(cols), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    for f in summary["failed"]:
        out.append(f"{f['variant']}: failed: {f['error']}")
    rec = summary["recommendation"]
    out.append(f"* Pareto-optimal (size, latency, accuracy). Recommended for {summary['settings']['target']}: "
               f"{rec['variant']} ({rec['reason']})")
    return "\n".join(out)
