"""edgekit sweep's dominance, Pareto marks, budgets and recommendation (README "edgekit sweep", RULINGS 49) on
hand-made rows with per-sample correctness: pure functions, no models."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.intervals import compare
from edgekit.sweep_rules import accuracy_match, dominated_by, dominates, pareto, recommend, within_budget

N = 360


def hits(wrong: int = 0, start: int = 0, n: int = N) -> np.ndarray:
    """Right on every sample but `wrong` of them from `start`."""
    right = np.ones(n, bool)
    right[start:start + wrong] = False
    return right


FLOAT = hits(1, start=359)  # the float model: 359 of 360 right


def row(variant, size, p50, correct, mode=None, float_ops=0):
    """A row as the sweep makes it, with its comparison against FLOAT; (row, correct)."""
    if correct is None:
        return {"variant": variant, "size_bytes": size, "p50_ms": p50, "top1": None, "drop_points": None,
                "comparison": None, "mode": mode or variant, "float_ops": float_ops}, None
    c = compare(reference_correct=FLOAT, candidate_correct=correct).to_dict()
    return {"variant": variant, "size_bytes": size, "p50_ms": p50, "top1": float(np.mean(correct)),
            "drop_points": 0.0 - c["change_points"], "comparison": c, "mode": mode or variant,
            "float_ops": float_ops}, correct


def table(*made):
    return [r for r, _ in made], [c for _, c in made]


def recommend_for(made, target, max_drop):
    rows, correct = table(*made)
    return recommend(rows, target, max_drop, correct)


# -- matching within the interval (RULINGS 49's known answers) ---------------------------------------
def test_two_discordant_pairs_in_297_match_and_thirty_one_way_do_not():
    a = np.ones(297, bool)
    assert accuracy_match(hits(2, n=297), a) == "accuracy not distinguishable (n=297)"
    assert accuracy_match(hits(30, n=297), a) is None  # loses 6.9-14.1 points: the interval excludes 0


def test_a_significant_gain_matches_and_says_so():
    assert accuracy_match(np.ones(297, bool), hits(30, n=297)).startswith("accuracy gains 6.9-14.1 points at n=297")


# -- dominance ---------------------------------------------------------------------------------------
def test_smaller_no_slower_and_matching_within_the_interval_dominates_with_its_reasons():
    (f32, c32), (dyn, cdyn) = row("float32", 400_000, 0.050, FLOAT), row("dynamic", 110_000, 0.050, hits(1))
    assert dominates(dyn, f32, cdyn, c32) == \
        "dynamic: 3.6x smaller than float32, no slower, accuracy not distinguishable (n=360)"
    assert dominates(f32, dyn, c32, cdyn) is None  # larger never dominates


def test_a_point_loss_the_interval_cannot_tell_from_noise_still_dominates():
    # dynamic's point top-1 is below float32's (2 samples), which the old point rule let float32 keep
    rows, correct = table(row("float32", 400_000, 0.050, FLOAT), row("dynamic", 110_000, 0.020, hits(2)))
    assert rows[1]["top1"] < rows[0]["top1"]
    assert pareto(rows, correct) == [False, True]
    assert dominated_by(rows, correct)[0]["reason"].startswith("dynamic: 3.6x smaller than float32, 2.5x faster")


def test_a_smaller_faster_row_that_loses_beyond_the_interval_does_not_dominate():
    rows, correct = table(row("float32", 400_000, 0.050, FLOAT), row("int8", 100_000, 0.010, hits(30)))
    assert pareto(rows, correct) == [True, True]


def test_no_slower_means_a_p50_at_most_5_percent_above():
    a = row("big", 400, 1.000, FLOAT)
    assert dominates(*[row("small", 100, 1.050, FLOAT)[0]], a[0], FLOAT, FLOAT) is not None
    assert dominates(row("small", 100, 1.051, FLOAT)[0], a[0], FLOAT, FLOAT) is None


def test_the_same_size_never_dominates_so_identical_rows_do_not_knock_each_other_out():
    rows, correct = table(row("a", 100, 1.0, FLOAT), row("b", 100, 1.0, FLOAT), row("c", 100, 0.5, hits(2)))
    assert pareto(rows, correct) == [True, True, True]


def test_a_row_without_accuracy_is_dominated_by_a_smaller_measured_one_and_dominates_no_measured_one():
    rows, correct = table(row("measured", 100, 1.0, FLOAT), row("unmeasured", 200, 1.0, None))
    assert pareto(rows, correct) == [True, False]
    rows, correct = table(row("measured", 100, 1.0, FLOAT), row("unmeasured", 90, 1.0, None))
    assert pareto(rows, correct) == [True, True]  # still the smallest


def test_the_demo_like_table():
    rows, correct = table(
        row("float32", 400_000, 0.050, FLOAT), row("float16", 200_000, 0.052, FLOAT),
        row("dynamic", 110_000, 0.020, hits(2)), row("int8", 113_000, 0.030, hits(5)),
        row("int16x8", 250_000, 0.090, FLOAT))
    # dynamic is smaller and faster than all and within the interval of each: every other row but the
    # slightly larger int8 (dynamic is 3 % smaller: smaller is smaller) falls to it
    marks = dominated_by(rows, correct)
    assert [m["variant"] if m else None for m in marks] == ["dynamic", "dynamic", None, "dynamic", "dynamic"]
    assert marks[3]["reason"] == "dynamic: 3 % smaller than int8, 1.5x faster, accuracy not distinguishable (n=360)"


# -- budgets on the interval ---------------------------------------------------------------------------
def test_a_budget_the_data_cannot_resolve_is_within_when_the_point_estimate_is():
    r, _ = row("int8", 100, 1.0, hits(2))  # loses 0.28 points, interval about -0.8 to 1.6
    assert within_budget(r, 0.5)  # unresolved, within on the point estimate
    assert not within_budget(r, 0.2)  # unresolved, over on the point estimate
    assert within_budget(r, 2.0)  # met on the interval
    assert not within_budget(row("int8", 100, 1.0, hits(30))[0], 2.0)  # missed: loses 6.6-11.5 points


# -- recommendation ------------------------------------------------------------------------------------
def test_cpu_picks_the_fastest_within_the_budget_and_names_what_it_beat():
    rows, correct = table(row("float32", 400_000, 0.050, FLOAT), row("dynamic", 110_000, 0.020, hits(1)),
                          row("int8", 100_000, 0.010, hits(30)))
    rec = recommend(rows, "cpu", 2.0, correct)
    assert rec["variant"] == "dynamic"
    assert rec["reason"] == "the fastest within the 2-point budget on the CPU (p50 0.0200 ms, 110,000 B)"
    assert rec["beats"] == ["dynamic: 3.6x smaller than float32, 2.5x faster, accuracy not distinguishable (n=360)"]
    assert len(rec["passed_over"]) == 1
    assert rec["passed_over"][0].startswith("int8 is 2.0x faster, but over the 2-point budget: the loss is ")


def test_the_recommendation_is_never_a_row_another_row_within_the_budget_dominates():
    # the old rule took `near-small` (the smaller of the two within 5 % of the fastest); but `smallest` is
    # smaller still, within 5 % of near-small's p50 and matches it, as near-small matches fast-big
    rows, correct = table(row("fast-big", 400, 1.000, FLOAT), row("near-small", 300, 1.040, FLOAT),
                          row("smallest", 100, 1.080, hits(1)))
    assert [d and d["variant"] for d in dominated_by(rows, correct)] == ["near-small", "smallest", None]
    rec = recommend(rows, "cpu", 2.0, correct)
    assert rec["variant"] == "smallest"
    assert rec["reason"] == ("the fastest within the 2-point budget on the CPU that no other row dominates "
                             "(p50 1.0800 ms, 100 B)")
    assert rec["passed_over"] == [
        "fast-big is 7 % faster, but is dominated (near-small: 1.3x smaller than fast-big, no slower, accuracy "
        "not distinguishable (n=360))",
        "near-small is 4 % faster, but smallest dominates it"]
    assert rec["beats"] == ["smallest: 3.0x smaller than near-small, no slower, accuracy not distinguishable (n=360)"]


def test_cpu_prefers_the_smaller_when_two_are_within_5_percent_in_p50():
    rows, correct = table(row("fast-big", 400, 1.000, FLOAT), row("near-small", 100, 1.049, hits(30)))
    rec = recommend(rows, "cpu", 20.0, correct)
    assert rec["variant"] == "near-small"
    assert rec["passed_over"] == ["fast-big is faster by less than 5 %, but near-small is smaller"]
    rows, correct = table(row("fast-big", 400, 1.000, FLOAT), row("slow-small", 100, 1.051, hits(30)))
    assert recommend(rows, "cpu", 20.0, correct)["variant"] == "fast-big"


def test_an_unresolved_budget_chooses_on_the_point_estimate_and_says_how_many_samples_resolve_it():
    rows, correct = table(row("float32", 400, 0.05, FLOAT), row("int8", 100, 0.01, hits(2)))
    rec = recommend(rows, "cpu", 0.5, correct)
    assert rec["variant"] == "int8"
    assert "the data cannot resolve the 0.5-point budget" in rec["reason"]
    assert "samples at the rates observed would resolve it" in rec["reason"]
    assert recommend(rows, "cpu", 0.2, correct)["variant"] == "float32"  # over it on the point estimate


def test_gpu_recommends_float16_then_float32_then_the_fastest_within_the_budget():
    made = [row("float32", 400, 0.050, FLOAT), row("float16", 200, 0.052, FLOAT),
            row("dynamic", 110, 0.020, hits(2)), row("int8", 113, 0.030, hits(5))]
    rec = recommend_for(made, "gpu", 1.0)
    assert rec["variant"] == "float16" and "float16" in rec["reason"]
    assert recommend_for([m for m in made if m[0]["variant"] != "float16"], "gpu", 1.0)["variant"] == "float32"
    rec = recommend_for(made[2:], "gpu", 1.0)
    assert rec["variant"] == "dynamic" and "(no float variant is within it)" in rec["reason"]


def test_npu_takes_only_the_all_int8_rows():
    made = [row("float32", 400, 0.050, FLOAT), row("dynamic", 110, 0.020, hits(1)),
            row("int8", 113, 0.030, hits(2)), row("int8-auto", 105, 0.025, hits(1), mode="int8", float_ops=2)]
    assert recommend_for(made, "cpu", 1.0)["variant"] == "dynamic"
    rec = recommend_for(made, "npu", 1.0)
    assert rec["variant"] == "int8" and "the npu runs int8 only" in rec["reason"]
    rec = recommend_for(made[:2], "npu", 1.0)
    assert rec["variant"] == "dynamic" and rec["reason"].startswith("no all-int8 variant was built for the npu")


@pytest.mark.parametrize("target", ["cpu", "gpu", "npu"])
def test_nothing_within_the_budget_recommends_the_one_that_loses_least(target):
    rows, correct = table(row("int8", 100, 0.01, hits(150), mode="int8"), row("dynamic", 110, 0.02, hits(60)),
                          row("broken", 90, 0.005, None, mode="int8"))
    rec = recommend(rows, target, 1.0, correct)
    want = "int8" if target == "npu" else "dynamic"
    assert rec["variant"] == want
    assert f"is within the 1-point budget; this one loses least (over the 1-point budget: " in rec["reason"]


def test_rows_without_an_accuracy_are_never_recommended_over_measured_ones():
    rows, correct = table(row("unmeasured", 10, 0.001, None), row("float32", 400, 0.05, FLOAT))
    assert recommend(rows, "cpu", 1.0, correct)["variant"] == "float32"
    assert recommend(rows, "gpu", 1.0, correct)["variant"] == "float32"
