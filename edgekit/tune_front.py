"""The study's finished trials as `pareto.json` (schema edgekit.tune/1): each trial's file, settings and
objectives per device; the front under the sweep's dominance, with several devices: another trial is smaller,
no slower on every device, and matches its top-1 within their paired interval; and the file chosen per device
and budget (the fastest on that device within the budget, judged on the interval). Pure functions on plain
data (Optuna's FrozenTrial read through `user_attrs`, `number`, `params`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.intervals import no_slower
from edgekit.sweep_rules import accuracy_match, budget_of, within_budget

TUNE_SCHEMA = "edgekit.tune/1"
BUDGETS = (0.5, 1.0, 2.0)  # the choice is also given for these budgets, beside the user's


def entry_of(trial: Any, devices: Sequence[str]) -> dict[str, Any]:
    """One finished trial as pareto.json lists it."""
    a = trial.user_attrs
    row = {"trial": trial.number, "variant": f"trial {trial.number}", "file": a["file"], "worker": a.get("worker"),
           "settings": dict(trial.params), "description": a.get("settings"), "mode": a.get("mode"),
           "size_bytes": a["size_bytes"], "top1": a["top1"], "drop_points": a["drop_points"],
           "change_interval": a.get("change_interval"), "n": a["n"], "comparison": a.get("comparison"),
           "p50_ms": {d: a["p50_ms"][d] for d in devices}, "timed_on": a.get("timed_on"), "float_ops": a.get("float_ops", 0),
           "convert_seconds": a.get("convert_seconds")}
    row["verdict"] = (row["comparison"] or {}).get("verdict")
    return row


def correct_of(trial: Any) -> np.ndarray:
    """The trial's per-sample correctness, as the trial stored it (packed bits, hex)."""
    a = trial.user_attrs
    return np.unpackbits(np.frombuffer(bytes.fromhex(a["correct"]), dtype=np.uint8))[: a["n"]].astype(bool)


def dominates(b: dict[str, Any], a: dict[str, Any], b_correct: np.ndarray, a_correct: np.ndarray,
              devices: Sequence[str]) -> str | None:
    """Why trial `b` dominates trial `a` (smaller, no slower on every device, accuracy matched), or None."""
    if not b["size_bytes"] < a["size_bytes"]:
        return None
    if not all(no_slower(b["p50_ms"][d], a["p50_ms"][d]) for d in devices):
        return None
    accuracy = accuracy_match(b_correct, a_correct)
    if accuracy is None:
        return None
    return (f"trial {b['trial']} ({b['description']}): {a['size_bytes'] / b['size_bytes']:.2f}x smaller, no slower "
            f"on {', '.join(devices)}, {accuracy}")


def front(rows: list[dict[str, Any]], correct: list[np.ndarray], devices: Sequence[str]) -> list[dict | None]:
    """Per row, the smallest row that dominates it ({"trial", "reason"}), or None (on the front). Rows with the
    same settings (a retried trial) count once: the later ones are dominated by the first."""
    order = sorted(range(len(rows)), key=lambda j: (rows[j]["size_bytes"], rows[j]["trial"]))
    first: dict[str, int] = {}
    found: list[dict | None] = []
    for i, a in enumerate(rows):
        key = repr(sorted(a["settings"].items()))
        if first.setdefault(key, a["trial"]) != a["trial"]:
            found.append({"trial": first[key], "reason": f"the same settings as trial {first[key]}",
                          "same_settings": True})
            continue
        hit = None
        for j in order:
            why = None if j == i else dominates(rows[j], a, correct[j], correct[i], devices)
            if why is not None:
                hit = {"trial": rows[j]["trial"], "reason": why}
                break
        found.append(hit)
    return found


def choose(rows: list[dict[str, Any]], correct: list[np.ndarray], device: str, max_drop: float,
           devices: Sequence[str]) -> dict[str, Any] | None:
    """The file for `device` within `max_drop` (judged on the interval), as sweep recommends one: among the
    trials within the budget that no other trial within it dominates, the fastest on that device (a p50
    within 5 % of the fastest counts as as fast, and the smaller of those wins). A trial dominated only by
    one outside the budget is eligible: a smaller file that loses more does not save it. Where none is
    within, the one that loses least. A retried or resampled trial (`dominated_by.same_settings`) counts once."""
    pool = [i for i, r in enumerate(rows) if not (r.get("dominated_by") or {}).get("same_settings")]
    if not pool:
        return None
    within = [i for i in pool if within_budget(rows[i], max_drop)]
    if within:
        best = [i for i in within if not any(j != i and dominates(rows[j], rows[i], correct[j], correct[i], devices)
                                             for j in within)]
        fastest = min(rows[i]["p50_ms"][device] for i in best)
        pick = min((rows[i] for i in best if no_slower(rows[i]["p50_ms"][device], fastest)),
                   key=lambda r: r["size_bytes"])
        reason = (f"the fastest on {device} within the {max_drop:g}-point budget that no other file within it "
                  f"dominates ({pick['p50_ms'][device]:.3f} ms, {pick['size_bytes']:,} bytes)")
    else:
        pick = min((rows[i] for i in pool), key=lambda r: (r["drop_points"], r["p50_ms"][device]))
        reason = f"no file is within the {max_drop:g}-point budget: the one that loses least ({pick['drop_points']:+.2f})"
    verdict = budget_of(pick, max_drop)
    return {"device": device, "max_drop": max_drop, "trial": pick["trial"], "file": pick["file"],
            "description": pick["description"], "reason": reason,
            "budget": None if verdict is None else verdict.to_dict()}


def summary_of(s: Any, complete: Sequence[Any], counts: dict[str, int], *, storage: str,
               seconds: float) -> dict[str, Any]:
    """The pareto.json document from the study's finished trials (`s`: the TuneSettings of this run)."""
    from edgekit._version import __version__
    from edgekit.tune_store import redacted

    devices = list(s.devices)
    usable = [t for t in complete if "correct" in t.user_attrs]
    rows = [entry_of(t, devices) for t in usable]
    correct = [correct_of(t) for t in usable]
    blockers = front(rows, correct, devices)
    for r, b in zip(rows, blockers):
        r["dominated_by"], r["pareto"] = b, b is None
    on_front = [r for r in rows if r["pareto"]]
    budgets = sorted({s.max_drop, *BUDGETS})
    settings = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(s).items() if k not in ("isolated", "grace")}
    reference = (rows[0]["top1"] + rows[0]["drop_points"] / 100) if rows else None
    return {
        "schema": TUNE_SCHEMA, "edgekit": __version__, "study": s.study_name, "storage": redacted(storage),
        "settings": {**settings, "storage": redacted(storage)}, "devices": devices,
        "reference": {"top1": reference, "n": rows[0]["n"] if rows else None},
        "trials": counts, "front": on_front, "dominated": [r for r in rows if not r["pareto"]],
        "chosen": [c for d in devices for b in budgets if (c := choose(rows, correct, d, b, devices)) is not None],
        "seconds": seconds,
    }


def failed_words(counts: dict[str, int]) -> str:
    """"2 could not be built, 1 failed": pruned trials are those whose settings did not convert."""
    return f"{counts.get('pruned', 0)} could not be built, {counts.get('fail', 0)} failed"


def chosen_groups(summary: dict[str, Any]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The choices by (device, trial): one line each, "budgets 0.5, 1, 2" where the budgets agree."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for c in summary["chosen"]:
        groups.setdefault((c["device"], c["trial"]), []).append(c)
    return groups


def budgets_words(picks: list[dict[str, Any]]) -> str:
    """"budget 1 point", "budgets 0.5, 1, 2 points"."""
    values = ", ".join(f"{c['max_drop']:g}" for c in picks)
    return f"budget{'s' if len(picks) > 1 else ''} {values} point{'' if values == '1' else 's'}"


def tune_table(summary: dict[str, Any]) -> str:
    """The front for people: one line per trial on it, then the file chosen per device and budget."""
    devices = summary["devices"]
    cols = ["trial", "settings", "size", "top1 %", "change", "95 % interval", *(f"p50 {d}" for d in devices)]
    lines = []
    for r in summary["front"]:
        low, high = r["change_interval"] or (None, None)
        lines.append([str(r["trial"]), r["description"] or "", f"{r['size_bytes'] / 1024:.1f} KiB",
                      f"{100 * r['top1']:.2f}", f"{-r['drop_points']:+.2f}",
                      "-" if low is None else f"{low:+.2f} to {high:+.2f}",
                      *(f"{r['p50_ms'][d]:.4f} ms" for d in devices)])
    widths = [max(len(c), *(len(row[i]) for row in lines)) if lines else len(c) for i, c in enumerate(cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    ref, counts = summary["reference"], summary["trials"]
    out = [f"study {summary['study']}: {counts.get('complete', 0)} finished trials ({failed_words(counts)}); "
           f"float model top-1 {100 * (ref['top1'] or 0):.2f} % (n={ref['n']}); front of {len(summary['front'])}:",
           line(cols), line(["-" * w for w in widths]), *(line(r) for r in lines)]
    for (device, trial), picks in chosen_groups(summary).items():
        out.append(f"chosen for {device}, {budgets_words(picks)}: trial {trial} "
                   f"({picks[0]['description']}): {picks[0]['reason']}: {picks[0]['file']}")
    return "\n".join(out)
