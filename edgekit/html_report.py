"""The sweep's HTML report: one self-contained file (plots embedded as PNG), readable offline.

Plots are drawn on matplotlib Figures with their own Agg canvas (no display, no pyplot, no global backend):
accuracy against latency with the Pareto front, size per variant, and the per-class top-1 change of every
variant against the float model.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from edgekit.errors import MissingDependencyError


def _figure_factory():
    """matplotlib's object-oriented API: a Figure drawn on its own Agg canvas. No pyplot, no
    `matplotlib.use`: the process's backend and figure manager stay the application's."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependencyError("the HTML report draws its plots with matplotlib: pip install matplotlib") from None

    def figure(figsize: tuple[float, float]):
        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    return figure


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(summary: dict[str, Any]) -> dict[str, str]:
    """{title: base64 PNG} for the three plots."""
    figure = _figure_factory()
    rows = [r for r in summary["rows"] if r["top1"] is not None]
    out = {"Accuracy vs latency": _png(accuracy_figure(rows, figure)[0])}

    fig, ax = figure((7, 4))
    names = [r["variant"] for r in summary["rows"]]
    sizes = [r["size_bytes"] / 1024 for r in summary["rows"]]
    ax.bar(names, sizes, color=["tab:red" if r["pareto"] else "tab:gray" for r in summary["rows"]])
    for i, v in enumerate(sizes):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("size (KiB)")
    ax.set_title("Size per variant")
    ax.tick_params(axis="x", rotation=30)
    out["Size per variant"] = _png(fig)

    reference: dict[str, float] = {}
    for m in summary["bench"]["models"]:
        reference = (m.get("accuracy") or {}).get("reference_per_class_top1") or reference
    classes = sorted(reference)
    fig, ax = figure((8, 4))
    width = 0.8 / max(1, len(rows))
    for k, r in enumerate(rows):
        per = r.get("per_class_top1") or {}
        deltas = [100 * (per.get(c, 0.0) - reference[c]) for c in classes]
        ax.bar([i + k * width for i in range(len(classes))], deltas, width=width, label=r["variant"])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks([i + width * (len(rows) - 1) / 2 for i in range(len(classes))], classes)
    ax.set_xlabel("class")
    ax.set_ylabel("top-1 change vs float (points)")
    ax.set_title("Per-class accuracy change")
    ax.legend(fontsize=7, ncol=4)
    out["Per-class accuracy change"] = _png(fig)
    return out


def accuracy_figure(rows: list[dict[str, Any]], figure=None, *, title: str = "Accuracy vs latency",
                    front_labels_only: bool = False):
    """Top-1 against p50 with the Pareto front, each point (each front point with `front_labels_only`)
    labelled with its variant where no other label is (`_place_labels`): (figure, axes)."""
    fig, ax = (figure or _figure_factory())((7, 4.5))
    for r in rows:  # the front above the rest: a dominated point at the same spot (a retried trial) hides none
        ax.scatter(r["p50_ms"], 100 * r["top1"], s=70, marker="*" if r["pareto"] else "o",
                   color="tab:red" if r["pareto"] else "tab:blue", zorder=4 if r["pareto"] else 3)
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["p50_ms"])
    if len(front) > 1:
        ax.plot([r["p50_ms"] for r in front], [100 * r["top1"] for r in front], color="tab:red", lw=1,
                ls="--", label="Pareto front")
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.margins(x=0.08, y=0.15)  # room for the labels of the points at the edges
    ax.set_xlabel("p50 latency (ms, log scale)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _place_labels(fig, ax, [(r["variant"], r["p50_ms"], 100 * r["top1"]) for r in rows
                            if r["pareto"] or not front_labels_only])
    return fig, ax


# where a label may sit against its point, in offset points (x, y, horizontal alignment), nearest first
LABEL_SPOTS = [(5 * side, dy, "left" if side > 0 else "right") for dy in (4, -12, 14, -22, 24, -32) for side in (1, -1)]
LABEL_GAP = 2.0  # pixels kept clear around a label: two labels end to end read as one


def _place_labels(fig, ax, points: list[tuple[str, float, float]]) -> None:
    """Each (label, x, y) at the first of `LABEL_SPOTS` where its box overlaps no label placed before it, the
    legend, nor leaves the axes; where none is free, the spot that overlaps least. Variants of one accuracy
    and nearly one latency (float32 and float16 of a small model) printed on top of each other at one spot."""
    renderer = fig.canvas.get_renderer()
    ax.autoscale_view()
    legend = ax.get_legend()
    taken = [legend.get_window_extent(renderer)] if legend is not None else []
    inside = ax.get_window_extent(renderer)
    for label, x, y in sorted(points, key=lambda p: (p[1], -p[2])):
        text = ax.annotate(label, (x, y), textcoords="offset points", xytext=LABEL_SPOTS[0][:2], fontsize=8,
                           ha=LABEL_SPOTS[0][2])
        best = None
        for dx, dy, ha in LABEL_SPOTS:
            text.set_position((dx, dy))
            text.set_horizontalalignment(ha)
            box = text.get_window_extent(renderer).padded(LABEL_GAP)
            cost = sum(_overlap(box, other) for other in taken) + _outside(box, inside)
            if best is None or cost < best[0]:
                best = (cost, dx, dy, ha, box)
            if cost == 0:
                break
        assert best is not None
        _, dx, dy, ha, box = best
        text.set_position((dx, dy))
        text.set_horizontalalignment(ha)
        if (dx, dy, ha) != LABEL_SPOTS[0]:  # away from where a label is expected: a thin line to its point
            ax.annotate("", (x, y), xytext=(dx, dy + 3), textcoords="offset points",
                        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "gray", "shrinkA": 0, "shrinkB": 4})
        taken.append(box)


def _overlap(a, b) -> float:
    """The area two display boxes share (0 where they only touch)."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _outside(box, inside) -> float:
    """The area of `box` outside `inside`."""
    return box.width * box.height - _overlap(box, inside)


READING = html.escape(
    "How to read it: each row ran on the same samples as the float model; the change is its top-1 minus the "
    "float model's, in points, with a 95 % interval (the true change very likely lies inside). \"not "
    "distinguishable\" means the interval contains 0: the data cannot tell the change from noise, whatever "
    "its point estimate; \"loses\" or \"gains\" means the whole interval lies on that side. The budget "
    "(--max-drop) is judged on the interval: met when all of it is within, missed when all of it is over, "
    "unresolved when it straddles the budget -- not a failure: the point estimate decides, and the "
    "recommendation says how many samples would resolve it. A row is dominated (not Pareto) when another row "
    "matches its top-1 within the interval of their own paired comparison while being smaller and no slower "
    "(p50 at most 5 % above). edgekit's docs/intervals.md has the methods (Newcombe's interval for the paired "
    "change, Clopper-Pearson for the agreement).")


def sweep_html(summary: dict[str, Any]) -> str:
    """The whole page: the recommendation and why, the table with each row's interval, verdict and budget,
    how to read them, and the plots."""
    from edgekit.sweep_rules import change_cells

    esc = html.escape
    s = summary["settings"]
    rec = summary["recommendation"]
    head = ["variant", "size (bytes)", "gzip (bytes)", "p50 (ms)", "top-1 (%)", "drop (points)",
            "change, 95 % interval (points)", "verdict", "budget", "Pareto"]
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in (
            r["variant"], f"{r['size_bytes']:,}", f"{r['gzip_bytes']:,}", f"{r['p50_ms']:.4f}",
            "-" if r["top1"] is None else f"{100 * r['top1']:.2f}",
            "-" if r["drop_points"] is None else f"{r['drop_points']:+.2f}", *change_cells(r),
            (r.get("budget") or {}).get("status", "-"), "yes" if r["pareto"] else "")) + "</tr>"
        for r in summary["rows"])
    why = "".join(f"<li>{esc(w)}</li>" for w in [*rec.get("beats", ()),
                                                  *(f"passed over: {w}" for w in rec.get("passed_over", ()))])
    dominated = "".join(f"<li>{esc(r['variant'])} is dominated: {esc(r['dominated_by']['reason'])}</li>"
                        for r in summary["rows"] if r.get("dominated_by"))
    failed = "".join(f"<li>{esc(f['variant'])}: {esc(f['error'])}</li>" for f in summary["failed"])
    images = "".join(f'<figure><img alt="{esc(title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{esc(title)}</figcaption></figure>" for title, data in plots(summary).items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>edgekit sweep: {esc(str(s['model']))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:right}}td:first-child{{text-align:left}}
figure{{margin:1.5em 0}}img{{max-width:100%}}</style></head><body>
<h1>edgekit sweep</h1>
<p>Model <code>{esc(str(s['model']))}</code>, evaluated on <code>{esc(str(s['eval_data']))}</code>
({summary['bench']['data']['samples']} images), target {esc(s['target'])}, budget {s['max_drop']:g} points.</p>
<p><strong>Recommended: {esc(rec['variant'])}</strong> ({esc(rec['reason'])})</p>
{f'<ul>{why}</ul>' if why else ''}
<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>
<p>{READING}</p>
{f'<ul>{dominated}</ul>' if dominated else ''}
{f'<ul>{failed}</ul>' if failed else ''}
{images}
</body></html>
"""


def tune_plots(summary: dict[str, Any]) -> dict[str, str]:
    """{title: base64 PNG}: top-1 against p50 on each device, every finished trial, the front labelled."""
    figure = _figure_factory()
    trials = [*summary["front"], *summary["dominated"]]
    out = {}
    for device in summary["devices"]:
        rows = [{"variant": r["variant"], "p50_ms": r["p50_ms"][device], "top1": r["top1"], "pareto": r["pareto"]}
                for r in trials]
        title = f"Accuracy vs latency on {device}"
        out[title] = _png(accuracy_figure(rows, figure, title=title, front_labels_only=True)[0])
    return out


def tune_html(summary: dict[str, Any]) -> str:
    """`edgekit tune`'s page: the file chosen per device and budget, the front with each trial's settings,
    interval and p50 per device, the dominated trials and why, and the plots."""
    esc = html.escape
    devices = summary["devices"]
    head = ["trial", "settings", "size (bytes)", "top-1 (%)", "change (points)", "95 % interval", "verdict",
            *(f"p50 {d} (ms)" for d in devices)]

    def cells(r: dict[str, Any]) -> list[str]:
        low, high = r["change_interval"] or (None, None)
        return [str(r["trial"]), r["description"] or "", f"{r['size_bytes']:,}", f"{100 * r['top1']:.2f}",
                f"{-r['drop_points']:+.2f}", "-" if low is None else f"{low:+.2f} to {high:+.2f}",
                r["verdict"] or "-", *(f"{r['p50_ms'][d]:.4f}" for d in devices)]

    table = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells(r)) + "</tr>" for r in summary["front"])
    from edgekit.tune_front import budgets_words, chosen_groups, failed_words

    chosen = "".join(f"<li>{esc(device)}, {budgets_words(picks)}: <strong>trial {trial}</strong> "
                     f"({esc(picks[0]['description'] or '')}): {esc(picks[0]['reason'])}; "
                     f"<code>{esc(picks[0]['file'])}</code></li>"
                     for (device, trial), picks in chosen_groups(summary).items())
    dominated = "".join(f"<li>trial {r['trial']} ({esc(r['description'] or '')}) is dominated: "
                        f"{esc(r['dominated_by']['reason'])}</li>" for r in summary["dominated"])
    images = "".join(f'<figure><img alt="{esc(title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{esc(title)}</figcaption></figure>" for title, data in tune_plots(summary).items())
    ref, counts = summary["reference"], summary["trials"]
    s = summary["settings"]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>edgekit tune: {esc(summary['study'])}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:right}}td:nth-child(2){{text-align:left}}
figure{{margin:1.5em 0}}img{{max-width:100%}}</style></head><body>
<h1>edgekit tune: {esc(summary['study'])}</h1>
<p>Model <code>{esc(str(s['model']))}</code> (top-1 {100 * (ref['top1'] or 0):.2f} % on {ref['n']} samples of
<code>{esc(str(s['eval_data']))}</code>); devices {esc(', '.join(devices))}; {counts.get('complete', 0)} finished
trials ({failed_words(counts)}) in <code>{esc(summary['storage'])}</code>.</p>
<h2>Chosen</h2><ul>{chosen}</ul>
<h2>Front</h2>
<table><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr>{table}</table>
<p>{READING}</p>
{f'<h2>Dominated</h2><ul>{dominated}</ul>' if dominated else ''}
{images}
</body></html>
"""
