"""The sweep's rules on its rows: which row dominates which (another row matches its top-1 within
the 95 % interval while smaller and no slower), the Pareto marks that follow, each row's budget judged on its
interval, and the recommendation per target. Pure functions on dict rows and per-sample correctness."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from numpy.typing import ArrayLike

from edgekit.intervals import BudgetVerdict, PairedComparison, judge_budget, matches, no_slower

Row = dict[str, Any]
Correct = Sequence[ArrayLike | None]  # per row: whether it classified each evaluation sample right, or None


def accuracy_match(b_correct: ArrayLike | None, a_correct: ArrayLike | None) -> str | None:
    """Words for B's top-1 against A's on the same samples where B matches it: the paired change is not
    distinguishable from 0, or a gain ("accuracy not distinguishable (n=360)"); None where B loses. A row
    without accuracy is matched by any row and matches none that has one. Without scipy: the point estimate."""
    if a_correct is None:
        return "accuracy not measured" if b_correct is None else "the other has no accuracy figure"
    if b_correct is None:
        return None
    c = matches(b_correct, a_correct)
    if c is None:
        return None
    assert c.change_points is not None  # labelled: both arrays given (for the type checker)
    if c.change_interval is None:
        return f"accuracy {'equal' if c.change_points == 0 else 'higher'} on the point estimate (n={c.n}; no interval)"
    return f"accuracy not distinguishable (n={c.n})" if c.change_interval[0] <= 0 else f"accuracy {c.verdict}"


def dominates(b: Row, a: Row, b_correct: ArrayLike | None, a_correct: ArrayLike | None) -> str | None:
    """Why row `b` dominates row `a` -- smaller, p50 at most 5 % above, top-1 matched within the interval --
    in words ("dynamic: 3.1x smaller than float32, no slower, accuracy not distinguishable (n=360)"); None
    where it does not."""
    if not (b["size_bytes"] < a["size_bytes"] and no_slower(b["p50_ms"], a["p50_ms"])):
        return None
    accuracy = accuracy_match(b_correct, a_correct)
    if accuracy is None:
        return None
    speed = a["p50_ms"] / b["p50_ms"] if b["p50_ms"] > 0 else float("inf")
    pace = _times(speed, "faster") if speed >= 1.1 else "no slower"
    return f"{b['variant']}: {_times(a['size_bytes'] / b['size_bytes'], 'smaller')} than {a['variant']}, {pace}, {accuracy}"


def _times(ratio: float, word: str) -> str:
    """3.6 -> '3.6x smaller'; 1.04 -> '4 % smaller' (a ratio near 1 reads better as a share)."""
    return f"{ratio:.1f}x {word}" if ratio >= 1.1 else f"{100 * (1 - 1 / ratio):.0f} % {word}"


def dominated_by(rows: Sequence[Row], correct: Correct,
                 among: Sequence[int] | None = None) -> list[dict[str, str] | None]:
    """Per row, the row that dominates it, {"variant", "reason"} (the smallest such), or None; only the rows
    whose index is in `among` (default: all) are tried as the dominating one."""
    order = sorted(range(len(rows)) if among is None else among,
                   key=lambda j: (rows[j]["size_bytes"], rows[j]["p50_ms"]))
    found: list[dict[str, str] | None] = []
    for i, a in enumerate(rows):
        hit = None
        for j in order:
            why = None if j == i else dominates(rows[j], a, correct[j], correct[i])
            if why is not None:
                hit = {"variant": rows[j]["variant"], "reason": why}
                break
        found.append(hit)
    return found


def pareto(rows: Sequence[Row], correct: Correct) -> list[bool]:
    """Rows that no other row dominates (`dominates`)."""
    return [d is None for d in dominated_by(rows, correct)]


def paired(d: dict[str, Any]) -> PairedComparison:
    """A PairedComparison back from its `to_dict()` (the bench report's `accuracy.comparison`)."""
    def pair(v: Sequence[float] | None) -> tuple[float, float] | None:
        return None if v is None else (float(v[0]), float(v[1]))

    return PairedComparison(n=d["n"], change_points=d["change_points"], change_interval=pair(d["change_interval"]),
                            lost=d["lost"], gained=d["gained"], agreement=d["agreement"],
                            agreement_interval=pair(d["agreement_interval"]), verdict=d["verdict"], hint=d["hint"])


def budget_of(row: Row, max_drop: float) -> BudgetVerdict | None:
    """The row's loss against the float model judged against `max_drop` on its interval; None without a
    labelled comparison."""
    c = row.get("comparison")
    return None if not c or c.get("change_points") is None else judge_budget(paired(c), max_drop)


def within_budget(row: Row, max_drop: float) -> bool:
    """Met, or unresolved and within on the point estimate (what the data cannot resolve is not
    missed); a row without a comparison on its point drop."""
    b = budget_of(row, max_drop)
    if b is not None:
        return b.within
    return row["drop_points"] is not None and row["drop_points"] <= max_drop


def runs_on(row: Row, target: str) -> bool:
    """Whether `target` runs the row's file as it is: an int8-only accelerator (npu) needs every op int8."""
    return target != "npu" or (row.get("mode") == "int8" and not row.get("float_ops"))


def recommend(rows: Sequence[Row], target: str, max_drop: float, correct: Correct) -> dict[str, Any]:
    """cpu: the fastest row within the budget that no other row within it dominates (the smaller one where
    p50 is within 5 %); npu: the same among the all-int8 rows; gpu: float16 (the GPU delegate computes in
    float16 and runs integer models dequantized), else float32, else as cpu. Says what the pick beat (the
    rows it dominates) and why faster rows were passed over."""
    pool = [i for i, r in enumerate(rows) if runs_on(r, target)]
    if not pool:  # no int8 file was built for the npu: the CPU's pick, said so
        rec = recommend(rows, "cpu", max_drop, correct)
        return {**rec, "reason": f"no all-int8 variant was built for the npu; for the CPU: {rec['reason']}"}
    within = [i for i in pool if within_budget(rows[i], max_drop)]
    if not within:
        return _least_loss(rows, pool, target, max_drop)
    if target == "gpu":
        for mode in ("float16", "float32"):
            for i in within:
                if rows[i]["variant"] == mode:
                    why = f"the GPU delegate computes in float16; {mode} is within the {max_drop:g}-point budget"
                    return _said(rows, correct, i, why, max_drop, [])
    blockers = dominated_by(rows, correct, among=within)
    free = [i for i in within if blockers[i] is None]
    fastest = min(rows[i]["p50_ms"] for i in free)
    pick = min((i for i in free if no_slower(rows[i]["p50_ms"], fastest)),
               key=lambda i: (rows[i]["size_bytes"], rows[i]["p50_ms"]))
    r = rows[pick]
    where = {"cpu": "on the CPU", "npu": "among the all-int8 files (the npu runs int8 only)",
             "gpu": "(no float variant is within it)"}[target]
    undominated = " that no other row dominates" if any(
        blockers[i] is not None and rows[i]["p50_ms"] < r["p50_ms"] for i in within) else ""
    why = (f"the fastest within the {max_drop:g}-point budget {where}{undominated} (p50 {r['p50_ms']:.4f} ms, "
           f"{r['size_bytes']:,} B)")
    return _said(rows, correct, pick, why, max_drop, _passed_over(rows, pick, pool, within, blockers, max_drop))


def _said(rows: Sequence[Row], correct: Correct, pick: int, why: str, max_drop: float,
          passed_over: list[str]) -> dict[str, Any]:
    """The recommendation: the pick, why (with its budget's words where the data cannot resolve it), the rows
    it dominates and the faster rows passed over."""
    budget = budget_of(rows[pick], max_drop)
    if budget is not None and budget.status == "unresolved":
        why += f"; {budget.message}"
    beats = [w for j, r in enumerate(rows) if j != pick
             for w in [dominates(rows[pick], r, correct[pick], correct[j])] if w is not None]
    return {"variant": rows[pick]["variant"], "reason": why, "beats": beats, "passed_over": passed_over}


def _passed_over(rows: Sequence[Row], pick: int, pool: list[int], within: list[int],
                 blockers: list[dict[str, str] | None], max_drop: float) -> list[str]:
    """Why each row faster than the pick was not recommended (`blockers`: what dominates each row)."""
    words = []
    for i in sorted(pool, key=lambda i: rows[i]["p50_ms"]):
        r = rows[i]
        if i == pick or r["p50_ms"] >= rows[pick]["p50_ms"]:
            continue
        ratio = rows[pick]["p50_ms"] / r["p50_ms"]
        faster = f"{r['variant']} is {'as fast (within 1 %)' if ratio < 1.01 else _times(ratio, 'faster')}"
        budget, blocker = budget_of(r, max_drop), blockers[i]
        if i not in within:
            words.append(f"{faster}, but " + (budget.message if budget is not None else
                                              f"its drop is not within the {max_drop:g}-point budget"))
        elif blocker is not None and blocker["variant"] == rows[pick]["variant"]:
            words.append(f"{faster}, but {blocker['variant']} dominates it")
        elif blocker is not None:
            words.append(f"{faster}, but is dominated ({blocker['reason']})")
        else:
            words.append(f"{r['variant']} is faster by less than 5 %, but {rows[pick]['variant']} is smaller")
    return words


def _least_loss(rows: Sequence[Row], pool: list[int], target: str, max_drop: float) -> dict[str, Any]:
    """Nothing the target runs is within the budget: the row that loses least, said so."""
    best = min(pool, key=lambda i: rows[i]["drop_points"] if rows[i]["drop_points"] is not None else float("inf"))
    which = "all-int8 variant" if target == "npu" else "variant"
    budget = budget_of(rows[best], max_drop)
    words = f"no {which} is within the {max_drop:g}-point budget; this one loses least"
    return {"variant": rows[best]["variant"], "reason": words + (f" ({budget.message})" if budget else ""),
            "beats": [], "passed_over": []}


def change_cells(row: dict[str, Any]) -> list[str]:
    """The row's top-1 change against the float model as table cells: its 95 % interval ("-0.9 to +0.9")
    and the verdict's words without the n ("not distinguishable", "loses 0.7-3.1")."""
    c = row.get("comparison") or {}
    if c.get("change_points") is None:
        return ["-", "-"]
    low_high = c.get("change_interval")
    interval = "-" if low_high is None else f"{low_high[0]:+.1f} to {low_high[1]:+.1f}"
    words = c["verdict"].replace(f" at n={c['n']}", "").replace(" from 0", "").replace(" points", "")
    return [interval, words]
