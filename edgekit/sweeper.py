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
from edgekit.sweep_rules import budget_of, change_cells, dominated_by, recommend, within_budget

SWEEP_SCHEMA = "edgekit.sweep/1"
TARGETS = tuple(t for t in ALL_TARGETS if t in ("cpu", "gpu", "npu"))  # the targets `recommend` has a rule for


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
        # no val_data: training measures itself on a held-out split of --train-data, never on --eval-data,
        # which the rows are judged on
        train = {"mode": "int8", "training": TrainingSpec(data=s.train_data, qat=True), **base}
        tune = {**train, "training": TrainingSpec(data=s.train_data)}
        found += [("int8-qat", train), ("int8-prune50-qat", {**train, "pruning": PruningSpec(0.5)}),
                  # whole channels removed: the pruned variant that runs faster, not only gzips smaller
                  ("int8-channels50", {**tune, "pruning": PruningSpec(0.5, structure="channels")})]
    return found


def _build(s: SweepSettings, todo: list, model_dir: Path, progress: Callable[[str], None] | None) -> tuple:
    """Each variant converted (in a child process where it can be): (built (name, path), failed, meta)."""
    from edgekit.converters.isolated import IsolatedConverter

    with IsolatedConverter() as converter:  # one child for the variants: TensorFlow imported once there
        return _build_each(s, todo, model_dir, progress, converter)


def _build_each(s: SweepSettings, todo: list, model_dir: Path, progress: Callable[[str], None] | None,
                converter) -> tuple:
    from edgekit.converters.isolated import picklable
    from edgekit.converters.pipeline import convert

    say = progress or (lambda _msg: None)
    built, failed, meta = [], [], {}
    stem = s.model.name.rsplit(".", 1)[0] if s.model.suffix in (".keras", ".h5") else s.model.name
    for k, (name, kw) in enumerate(todo):
        say(Step(f"building {name} [{k + 1}/{len(todo) + 1}]", stage="sweep", done=k, total=len(todo) + 1))
        recipe = ConvertRecipe(model=s.model, output=model_dir / f"{stem}.{name}.tflite", force=s.force, **kw)
        t0 = time.perf_counter()
        try:  # the conversion's own lines (epochs, calibration, trials) go to `progress` too
            result = (converter.convert(recipe, progress=progress) if s.isolated and picklable(recipe)
                      else convert(recipe, progress=progress))
        except EdgekitError as exc:
            failed.append({"variant": name, "error": str(exc)})
            continue
        autopilot = result.metadata.get("autopilot") or {}
        if autopilot.get("int8_file"):  # the autopilot handed back float16/dynamic: the sweep has those rows,
            result.path.unlink()  # its int8-auto row is the int8 mix, written beside
            result.path.with_name(autopilot["int8_file"]).rename(result.path)
        built.append((name, result.path))
        meta[name] = {"convert_seconds": round(time.perf_counter() - t0, 2),
                      "autopilot": result.metadata.get("autopilot"),
                      "compression": result.metadata.get("compression")}
    return built, failed, meta


def _row(name: str, path: Path | None, m: dict[str, Any], gz: int, meta: dict[str, Any],
         max_drop: float) -> dict[str, Any]:
    """One variant's row of the sweep table, from its bench entry: with its paired comparison against the
    float model and the budget judged on it."""
    acc = m["accuracy"] or {}
    row = {
        "variant": name, "file": None if path is None else str(path), "mode": m["mode"],
        "size_bytes": m["size_bytes"], "gzip_bytes": gz,
        "p50_ms": m["latency_ms"]["p50"], "top1": acc.get("top1"),
        "drop_points": None if acc.get("top1_delta_points") is None else 0.0 - acc["top1_delta_points"],
        "per_class_top1": acc.get("per_class_top1"), "convert_seconds": meta["convert_seconds"],
        "float_ops": len((meta["autopilot"] or {}).get("float_ops") or []),
        "comparison": acc.get("comparison"),
    }
    budget = budget_of(row, max_drop)
    row["budget"] = None if budget is None else budget.to_dict()
    return row


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
                       data=s.eval_data, reference=s.model, per_sample=True)
        gzipped = [len(gzip.compress(path.read_bytes())) for _, path in built]  # before a temp dir goes
    correct = [(m["accuracy"] or {}).pop("per_sample_correct", None) for m in report["models"]]
    rows = [_row(name, path if s.out is not None else None, m, gz, meta[name], s.max_drop)
            for (name, path), m, gz in zip(built, report["models"], gzipped)]
    for r, blocker in zip(rows, dominated_by(rows, correct)):
        r["dominated_by"], r["pareto"] = blocker, blocker is None
    summary = {
        "schema": SWEEP_SCHEMA,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(s).items()},
        "reference": report["reference"],
        "rows": rows,
        "failed": failed,
        "recommendation": recommend(rows, s.target, s.max_drop, correct),
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
    """The sweep for people: one line per row with its change against the float model, the change's 95 %
    interval, its verdict and budget, then what dominates which and the recommendation with its reasons."""
    from edgekit.report import _size

    cols = ["variant", "size", "gzip", "p50 ms", "top1 %", "drop pts", "change 95 % (pts)", "verdict", "budget",
            "pareto"]
    rows = [[r["variant"], _size(r["size_bytes"]), _size(r["gzip_bytes"]), f"{r['p50_ms']:.4f}",
             "-" if r["top1"] is None else f"{100 * r['top1']:.2f}",
             "-" if r["drop_points"] is None else f"{r['drop_points']:+.2f}", *change_cells(r),
             "-" if not r.get("budget") else r["budget"]["status"], "*" if r["pareto"] else ""]
            for r in summary["rows"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    left = {0, 7}
    line = lambda cells: "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    ref, s = summary["reference"] or {}, summary["settings"]
    n = next((r["comparison"]["n"] for r in summary["rows"] if r.get("comparison")), None)
    out = [f"float model {s['model']}: top-1 {100 * ref.get('top1', 0):.2f}% on {s['eval_data']}"
           + (f" (n={n}; each row paired with it on the same samples)" if n else ""), line(cols),
           line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    for f in summary["failed"]:
        out.append(f"{f['variant']}: failed: {f['error']}")
    rec = summary["recommendation"]
    out.append(f"* Pareto-optimal: no other row matches its top-1 within the 95 % interval while smaller and no "
               f"slower (p50 within 5 %); the {s['max_drop']:g}-point budget is judged on the interval")
    out.append(f"Recommended for {s['target']}: {rec['variant']} ({rec['reason']})")
    out += [f"  {w}" for w in rec.get("beats") or ()]
    out += [f"  passed over: {w}" for w in rec.get("passed_over") or ()]
    over = {r["variant"] for r in summary["rows"] if not within_budget(r, s["max_drop"])}
    out += [f"  {r['variant']} is dominated: {r['dominated_by']['reason']}"
            + (f" ({r['dominated_by']['variant']} is outside the budget: not recommended)"
               if r["dominated_by"]["variant"] in over else "")
            for r in summary["rows"] if r.get("dominated_by") and r["dominated_by"]["variant"] != rec["variant"]]
    return "\n".join(out)

