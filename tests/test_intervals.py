"""Paired intervals and budget verdicts (edgekit/intervals.py): known answers from RULINGS 49 and published
values, the path without scipy, and budgets met, missed and unresolved. Counts only: milliseconds."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from edgekit import intervals
from edgekit.intervals import compare, compare_counts, judge_budget

# the MobileNetV2: float 98.32 % on 297 validation images (292 right, 5 wrong)
N = 297


def flips(lost: int, gained: int = 0, neither: int = 5) -> intervals.PairedComparison:
    """`lost` images the float model got right and int8 wrong (and `gained` the other way) in 297."""
    return compare_counts(N, both=N - neither - lost - gained, lost=lost, gained=gained)


@pytest.mark.parametrize("neither", [0, 5, 150])
def test_two_discordant_pairs_in_297_give_an_interval_containing_0(neither):
    c = flips(2, neither=neither)
    low, high = c.change_interval
    assert low < c.change_points < 0 < high
    assert c.change_points == pytest.approx(-100 * 2 / 297)
    assert c.verdict == "not distinguishable from 0 at n=297"


@pytest.mark.parametrize("neither", [0, 5, 150])
def test_thirty_discordant_pairs_all_one_way_give_an_interval_excluding_0(neither):
    c = flips(30, neither=neither)
    low, high = c.change_interval
    assert low < c.change_points < high < 0
    assert c.verdict == f"loses {-high:.1f}-{-low:.1f} points at n=297"


def test_a_gain_reads_as_one():
    c = flips(2, gained=14)
    assert c.change_interval[0] > 0 and c.verdict.startswith("gains ") and c.verdict.endswith(" points at n=297")


def test_change_interval_matches_newcombes_square_and_add_published_value():
    # Cavo et al. 2012 in Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables", ch. 8:
    # [[59, 6], [16, 80]] -> estimate -0.0621, 95 % CI -0.1186 to -0.0046 (first row minus first column)
    c = compare_counts(161, both=59, lost=6, gained=16)
    assert c.change_points == pytest.approx(6.21, abs=0.005)
    assert c.change_interval == pytest.approx((0.46, 11.86), abs=0.005)


@pytest.mark.parametrize("k, n, low, high", [(81, 263, 0.2527, 0.3676), (15, 148, 0.0578, 0.1617),
                                             (0, 20, 0.0, 0.1684), (1, 29, 0.0009, 0.1776)])
def test_agreement_interval_is_clopper_pearsons_published_value(k, n, low, high):
    # Newcombe 1998, "Two-sided confidence intervals for the single proportion", table I (exact method)
    c = compare_counts(n, agreed=k)
    assert c.agreement == k / n
    assert c.agreement_interval == pytest.approx((low, high), abs=0.00005)
    assert c.change_points is None and c.change_interval is None


def test_per_sample_booleans_give_the_counts_comparison():
    rng = np.random.default_rng(0)
    ref = rng.random(N) < 0.98
    cand = ref.copy()
    cand[np.flatnonzero(ref)[:3]] = False
    agree = rng.random(N) < 0.99
    got = compare(reference_correct=ref, candidate_correct=cand, agree=agree)
    assert got == compare_counts(N, both=int(ref.sum()) - 3, lost=3, gained=0, agreed=int(agree.sum()))
    assert compare(agree=agree).agreement == agree.mean()


def test_mismatched_or_missing_inputs_are_refused():
    with pytest.raises(ValueError, match="one length"):
        compare(reference_correct=[True] * 3, candidate_correct=[True] * 4)
    with pytest.raises(ValueError, match="both reference_correct and candidate_correct"):
        compare(reference_correct=[True])
    with pytest.raises(ValueError, match="do not fit"):
        compare_counts(10, both=8, lost=2, gained=1)
    with pytest.raises(ValueError, match="needed"):
        compare_counts(10, both=8)


def test_to_dict_is_json_ready():
    d = flips(2).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["n"] == N and d["lost"] == 2 and d["gained"] == 0 and d["confidence"] == 0.95
    assert len(d["change_interval"]) == 2 and d["hint"] is None
    assert judge_budget(flips(30), 1.0).to_dict()["status"] == "missed"


def test_budget_met_when_the_intervals_loss_end_is_within_it():
    v = judge_budget(flips(2), 3.0)
    assert (v.status, v.judged_on, v.samples_to_resolve, v.missed, v.within) == ("met", "interval", None, False, True)
    assert v.loss_interval[1] <= 3.0 and v.message.startswith("within the 3-point budget")


def test_budget_missed_when_the_whole_interval_is_over_it():
    v = judge_budget(flips(30), 1.0)
    assert (v.status, v.judged_on, v.samples_to_resolve, v.missed, v.within) == ("missed", "interval", None, True, False)
    assert v.loss_interval[0] > 1.0


def test_unresolved_budget_is_chosen_on_the_point_estimate_with_the_samples_that_would_resolve_it():
    # 2 images lost in 297 (0.67 points) against a 1-point budget: the interval straddles it
    v = judge_budget(flips(2), 1.0)
    assert (v.status, v.judged_on, v.missed, v.within_on_point, v.within) == ("unresolved", "point", False, True, True)
    low, high = v.loss_interval
    assert low < v.loss_points <= 1.0 < high
    assert v.samples_to_resolve == pytest.approx(N * ((high - v.loss_points) / (1.0 - v.loss_points)) ** 2, abs=1)
    assert v.samples_to_resolve == 9151  # said in two figures
    assert "the data cannot resolve the 1-point budget" in v.message and "about 9,200 samples" in v.message


def test_straddled_budget_over_on_the_point_estimate_is_unresolved_not_missed():
    v = judge_budget(flips(2), 0.2)  # the issue's `--max-drop 0.2`: a loss of zero images in 297
    assert (v.status, v.judged_on, v.missed, v.within_on_point, v.within) == ("unresolved", "point", False, False, False)
    assert v.loss_interval[0] < 0.2 < v.loss_points and v.samples_to_resolve == 3007
    assert "over it on the point estimate, a loss of 0.67 points; about 3,000 samples" in v.message


@pytest.mark.parametrize("budget", [0.2, 0.5, 1.0, 2.0])
def test_the_samples_to_resolve_do_resolve_it_at_the_rates_observed(budget):
    v = judge_budget(flips(2), budget)
    scale = v.samples_to_resolve / N
    bigger = compare_counts(v.samples_to_resolve, both=round(290 * scale), lost=round(2 * scale), gained=0)
    assert judge_budget(bigger, budget).judged_on == "interval"


def test_a_loss_equal_to_the_budget_cannot_be_resolved():
    c = flips(0)
    v = judge_budget(c, 0.0)
    assert (v.status, v.samples_to_resolve) == ("unresolved", None) and "no sample count" in v.message


def test_without_scipy_the_point_estimate_and_n_remain_with_a_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    assert not intervals.scipy_available()
    c = compare_counts(N, both=290, lost=2, gained=0, agreed=295)
    assert (c.n, c.lost, c.change_interval, c.agreement_interval) == (N, 2, None, None)
    assert c.change_points == pytest.approx(-0.673, abs=0.001) and c.agreement == 295 / N
    assert c.verdict == "loses 0.67 points at n=297 (no interval)"
    assert "apt install python3-scipy" in c.hint and "\n" not in c.hint
    v = judge_budget(c, 0.2)
    assert (v.status, v.judged_on, v.loss_interval) == ("missed", "point", None)
    assert "apt install python3-scipy" in v.message
    assert judge_budget(c, 1.0).status == "met"


def test_importing_the_module_does_not_import_scipy():
    tree = ast.parse(Path(intervals.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("scipy", "statsmodels")], names


def test_the_docs_example_prints_what_its_comments_say():
    (code,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "intervals.md").read_text(), re.S)
    expected: list[str] = []
    for line in code.splitlines():
        if line.startswith("print("):  # what it prints: its own comment, or the comment lines below it
            expected.append(line.split("  # ", 1)[1] if "  # " in line else "")
        elif line.startswith("# "):
            expected[-1] = f"{expected[-1]} {line[2:]}".lstrip()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/intervals.md", "exec"), {})
    assert out.getvalue().splitlines() == expected
