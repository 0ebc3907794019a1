"""edgekit sweep's Pareto marks and recommendation (README "edgekit sweep") on hand-made rows:
pure functions, no models."""

from __future__ import annotations

import pytest

from edgekit.sweeper import pareto, recommend


def row(variant, size, p50, top1, drop):
    return {"variant": variant, "size_bytes": size, "p50_ms": p50, "top1": top1, "drop_points": drop}


ROWS = [
    row("float32", 400_000, 0.050, 0.9972, 0.0),
    row("float16", 200_000, 0.052, 0.9972, 0.0),
    row("dynamic", 110_000, 0.020, 0.9944, 0.28),
    row("int8", 113_000, 0.030, 0.9861, 1.11),
    row("int16x8", 250_000, 0.090, 0.9972, 0.0),
]


# -- Pareto ----------------------------------------------------------------------------------------
def test_a_row_beaten_on_size_latency_and_accuracy_at_once_is_not_pareto():
    rows = [row("good", 100, 1.0, 0.90, 0.0), row("worse", 200, 2.0, 0.80, 10.0)]
    assert pareto(rows) == [True, False]


def test_a_row_better_on_any_one_axis_stays_pareto():
    rows = [row("small", 100, 2.0, 0.80, 0.0), row("fast", 200, 1.0, 0.80, 0.0), row("exact", 300, 3.0, 0.99, 0.0),
            row("dominated", 300, 3.0, 0.80, 0.0)]
    assert pareto(rows) == [True, True, True, False]


def test_equal_on_two_axes_and_worse_on_one_is_dominated():
    rows = [row("a", 100, 1.0, 0.90, 0.0), row("b", 100, 1.0, 0.89, 1.0)]
    assert pareto(rows) == [True, False]


def test_identical_rows_do_not_knock_each_other_out():
    rows = [row("a", 100, 1.0, 0.90, 0.0), row("b", 100, 1.0, 0.90, 0.0)]
    assert pareto(rows) == [True, True]


def test_a_row_without_accuracy_counts_as_the_least_accurate():
    rows = [row("measured", 100, 1.0, 0.10, 0.0), row("unmeasured", 100, 1.0, None, None)]
    assert pareto(rows) == [True, False]
    rows = [row("measured", 100, 1.0, 0.10, 0.0), row("unmeasured", 90, 1.0, None, None)]
    assert pareto(rows) == [True, True]  # still the smallest


def test_the_demo_like_table():
    # float32 is beaten by float16 (smaller, same top-1) only on size and loses on latency: Pareto.
    # int16x8 is slower and larger than float16 at the same top-1: dominated. int8 is larger and slower
    # than dynamic with a lower top-1: dominated.
    assert pareto(ROWS) == [True, True, True, False, False]


# -- recommendation --------------------------------------------------------------------------------
def test_cpu_picks_the_fastest_within_the_budget():
    rec = recommend(ROWS, "cpu", 1.0)
    assert rec["variant"] == "dynamic"
    assert rec["reason"].startswith("the fastest within 1 points on the CPU") and "0.0200 ms" in rec["reason"]


def test_cpu_never_picks_a_faster_variant_outside_the_budget():
    rows = [row("int8", 100, 0.010, 0.90, 3.0), row("float32", 400, 0.050, 0.93, 0.0),
            row("float16", 200, 0.040, 0.93, 0.0)]
    assert recommend(rows, "cpu", 1.0)["variant"] == "float16"
    assert recommend(rows, "cpu", 3.0)["variant"] == "int8"  # the budget is inclusive


def test_cpu_prefers_the_smaller_when_two_are_within_5_percent_in_p50():
    rows = [row("fast-big", 400, 1.000, 0.9, 0.0), row("near-small", 100, 1.049, 0.9, 0.0),
            row("slow-smaller", 50, 1.060, 0.9, 0.0)]
    assert recommend(rows, "cpu", 1.0)["variant"] == "near-small"


def test_cpu_keeps_the_fastest_when_the_smaller_is_more_than_5_percent_slower():
    rows = [row("fast-big", 400, 1.000, 0.9, 0.0), row("slow-small", 100, 1.051, 0.9, 0.0)]
    assert recommend(rows, "cpu", 1.0)["variant"] == "fast-big"


def test_gpu_recommends_float16():
    rec = recommend(ROWS, "gpu", 1.0)
    assert rec["variant"] == "float16" and "float16" in rec["reason"]


def test_gpu_falls_back_to_float32_then_to_the_fastest_within_the_budget():
    no_f16 = [r for r in ROWS if r["variant"] != "float16"]
    assert recommend(no_f16, "gpu", 1.0)["variant"] == "float32"
    ints = [r for r in ROWS if not r["variant"].startswith("float")]
    rec = recommend(ints, "gpu", 1.0)
    assert rec["variant"] == "dynamic" and rec["reason"].startswith("no float variant is within 1 points")


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_nothing_within_the_budget_recommends_the_one_that_loses_least(target):
    rows = [row("int8", 100, 0.01, 0.50, 40.0), row("dynamic", 110, 0.02, 0.70, 20.0),
            row("broken", 90, 0.005, None, None)]
    rec = recommend(rows, target, 1.0)
    assert rec == {"variant": "dynamic", "reason": "no variant is within 1 points; this one loses least"}


def test_rows_without_an_accuracy_are_never_recommended_over_measured_ones():
    rows = [row("unmeasured", 10, 0.001, None, None), row("float32", 400, 0.05, 0.99, 0.0)]
    assert recommend(rows, "cpu", 1.0)["variant"] == "float32"
    assert recommend(rows, "gpu", 1.0)["variant"] == "float32"
