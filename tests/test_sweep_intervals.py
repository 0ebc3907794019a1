"""The sweep's rows carry their paired comparison with the float model and their budget judged on its
interval, the Pareto marks follow dominance within the interval, and the recommendation is not dominated
(issue 49). On the session's one digits sweep (the `swept` fixture): no conversion of its own."""

from __future__ import annotations

import pytest

from edgekit.sweeper import sweep_table


def test_every_row_carries_its_comparison_and_its_budget_on_the_same_samples(swept):
    _, summary = swept
    n = summary["bench"]["data"]["samples"]
    assert n == 360
    for r in summary["rows"]:
        c, b = r["comparison"], r["budget"]
        assert c["n"] == n and c["confidence"] == 0.95
        low, high = c["change_interval"]
        assert low <= c["change_points"] <= high and high - low < 10  # points, at n=360
        assert c["change_points"] == pytest.approx(-r["drop_points"], abs=1e-4)
        a_low, a_high = c["agreement_interval"]
        assert a_low <= c["agreement"] <= a_high
        assert b["status"] in ("met", "unresolved", "missed") and b["budget_points"] == 1.0
        assert b["loss_interval"] == pytest.approx([-high, -low], abs=1e-4)
        assert (b["samples_to_resolve"] is not None) == (b["status"] == "unresolved")


def test_the_marks_and_the_recommendation_follow_dominance_within_the_interval(swept):
    _, summary = swept
    rows = {r["variant"]: r for r in summary["rows"]}
    for r in rows.values():
        d = r["dominated_by"]
        assert r["pareto"] == (d is None)
        if d is not None:  # the dominating row is smaller and no slower, as its reason says
            other = rows[d["variant"]]
            assert other["size_bytes"] < r["size_bytes"] and other["p50_ms"] <= 1.05 * r["p50_ms"]
            assert d["reason"].startswith(f"{other['variant']}: ") and f" than {r['variant']}, " in d["reason"]
    rec = summary["recommendation"]
    chosen = rows[rec["variant"]]
    assert chosen["budget"]["status"] in ("met", "unresolved") and chosen["budget"]["within_on_point"]
    if chosen["dominated_by"] is not None:  # only by a row over the budget, which cannot be recommended
        b = rows[chosen["dominated_by"]["variant"]]["budget"]
        assert b["status"] == "missed" or (b["status"] == "unresolved" and not b["within_on_point"])
    for words in rec["beats"]:
        assert words.startswith(f"{rec['variant']}: ") and "smaller than" in words


def test_the_table_shows_the_interval_the_verdict_and_the_budget(swept):
    _, summary = swept
    text = sweep_table(summary)
    print("\n" + text)
    head = text.splitlines()[1]
    assert "change 95 % (pts)" in head and "verdict" in head and "budget" in head
    float32 = next(line for line in text.splitlines() if line.startswith("float32 "))
    low, high = next(r for r in summary["rows"] if r["variant"] == "float32")["comparison"]["change_interval"]
    assert f"{low:+.1f} to {high:+.1f}" in float32 and "not distinguishable" in float32
    assert f"Recommended for cpu: {summary['recommendation']['variant']} (" in text
