"""The evidence int8 `auto` decides on (converters/int8/evidence.py): a candidate replaces the winner so far
only where a paired test of per-sample losses finds it better at the family's level; a few samples of top-1
agreement decide nothing; close comparisons draw more samples in rounds, and only where they could resolve;
the family of comparisons holds its error at 5 %. Outputs are made here sample by sample, so each case is
exactly what it says."""

from __future__ import annotations

import numpy as np

from edgekit.converters.int8.evidence import FAMILY_ALPHA, MARGIN, Evidence, Rounds
from edgekit.intervals import agrees_less, lower_losses
from edgekit.metrics import per_sample_losses

CLASSES = 10


def _logits(n: int, seed: int) -> np.ndarray:
    """n samples of float-model logits, confident and varied: a clear top class each."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 0.7, (n, CLASSES))
    z[np.arange(n), rng.integers(0, CLASSES, n)] += 5.0
    return z


def _evidence(outputs: dict[bytes, np.ndarray], first: int, total: int | None = None, looks: list | None = None,
              comparisons: int = 1) -> Evidence:
    """Evidence over samples 0..total-1 (the first `first` held out at once, the rest read in rounds), each
    "file" a key of `outputs` whose rows are its outputs on those samples; `looks` records each read."""
    total = total or first

    def evaluate(file: bytes, samples: list) -> np.ndarray:
        return outputs[file][np.asarray(samples, int)]

    def more(start: int, count: int) -> list:
        if looks is not None:
            looks.append((start, count))
        return list(range(first + start, min(total, first + start + count)))

    rounds = Rounds(list(range(first)), more if total > first else None, total - first, total)
    evidence = Evidence(rounds, evaluate, b"float", "kl", classes=True, logits=True)
    evidence.plan(comparisons)
    return evidence


def _add(evidence: Evidence, name: str, file: bytes, outputs: dict[bytes, np.ndarray]) -> None:
    first = evidence.rounds.first
    evidence.add(name, file, *evidence.measure(outputs[b"float"][first], outputs[file][first]))


def test_a_candidate_that_agrees_on_two_more_samples_of_200_is_not_kept():
    """The face-expression shape: min/max's file disagrees with the float model on 11 or more of 200 samples;
    the candidate on two fewer, while its softmax is a little further from the float model's on the
    rest. Agreement never breaks a tie, and the paired test does not find it better: the simpler file stays."""
    rng = np.random.default_rng(1)
    ref = _logits(200, 0)
    plain = ref + rng.normal(0, 0.15, ref.shape)
    flipped = rng.choice(200, 11, replace=False)
    for i in flipped:  # min/max's top-1 moves to the second class on 11 samples
        plain[i, np.argsort(ref[i])[-2]] = ref[i].max() + 0.5
    candidate = plain + rng.normal(0, 0.1, ref.shape)
    candidate[flipped[:2]] = ref[flipped[:2]] + rng.normal(0, 0.15, (2, CLASSES))  # two won back
    outputs = {b"float": ref, b"minmax": plain, b"extremes": candidate}
    agree = {k.decode(): int(np.sum(v.argmax(1) == ref.argmax(1))) for k, v in outputs.items()}
    assert agree["extremes"] == agree["minmax"] + 2 and agree["minmax"] <= 189
    evidence = _evidence(outputs, 200, comparisons=8)
    for name in ("minmax", "extremes"):
        _add(evidence, name, name.encode(), outputs)
    decided = evidence.compare("minmax", "extremes")
    assert not decided.kept and decided.test.n == 200 and decided.looks == 1
    # its mean KL is lower, carried by the two samples won back; on the other 198 its losses are the higher,
    # and a test of the ranks says so
    assert decided.test.candidate_mean < decided.test.reference_mean and decided.test.p > 0.5
    assert decided.test.mean_lower and "a few samples carry the mean: the simpler file stays" in decided.why
    # the same two samples are no evidence on their own either: an exact McNemar test of the agreement
    p = agrees_less(outputs[b"minmax"].argmax(1) == ref.argmax(1), candidate.argmax(1) == ref.argmax(1))
    assert p is not None and p > 0.2


def test_a_candidate_better_at_95_percent_is_kept_and_its_record_says_so():
    """Logits pulled toward the float model's on every sample: the Wilcoxon test finds its losses lower (by
    more than the margin, a tenth) far under the level of eight comparisons; the record carries n, means, p,
    the level, the margin and the looks."""
    rng = np.random.default_rng(2)
    ref = _logits(200, 3)
    plain = ref + rng.normal(0, 0.5, ref.shape)
    better = ref + 0.6 * (plain - ref)
    outputs = {b"float": ref, b"minmax": plain, b"bias": better}
    evidence = _evidence(outputs, 200, comparisons=8)
    for name in ("minmax", "bias"):
        _add(evidence, name, name.encode(), outputs)
    decided = evidence.compare("minmax", "bias")
    assert decided.kept and decided.looks == 1
    record = decided.to_dict()
    assert record["n"] == 200 and record["alpha"] == FAMILY_ALPHA / 8 and record["p"] < 1e-10
    assert record["margin"] == MARGIN == 0.1
    assert record["candidate_mean"] < 0.5 * record["reference_mean"] and record["kept"]
    assert "bias against minmax: mean kl" in decided.line("kl") and decided.line("kl").endswith(decided.why)


def test_a_close_comparison_draws_more_samples_in_rounds_until_it_resolves():
    """A candidate better by a little more than the margin: 200 samples cannot resolve it at the level of four
    comparisons, so rounds of more are read (each doubling the count), and it is kept once they do."""
    rng = np.random.default_rng(4)
    n = 1600
    ref = _logits(n, 5)
    plain = ref + rng.normal(0, 0.45, ref.shape)
    candidate = ref + rng.normal(0, 0.39, ref.shape)  # errors of its own, a quarter smaller in KL
    outputs = {b"float": ref, b"minmax": plain, b"percentile": candidate, b"mse": plain + 0.01}
    reads: list = []
    evidence = _evidence(outputs, 200, n, reads, comparisons=4)
    assert evidence.rounds.sizes == [200, 200, 400, 800] and evidence.rounds.looks == 4
    for name in ("minmax", "percentile", "mse"):
        _add(evidence, name, name.encode(), outputs)
    first = lower_losses(evidence.losses("minmax"), evidence.losses("percentile"), evidence.alpha, MARGIN)
    assert not first.better and first.leaning  # 200 do not resolve it
    decided = evidence.compare("minmax", "percentile", live=["mse"])
    assert decided.kept and decided.looks >= 2 and decided.test.n > 200, decided
    assert reads[0] == (0, 200) and len(reads) == decided.looks - 1  # one read a round
    # the candidate still to be compared was measured on each round read meanwhile: no read again
    assert len(evidence.losses("mse")) == decided.test.n
    again = evidence.compare("percentile", "mse")
    assert not again.kept and len(reads) == decided.looks - 1


def test_no_round_is_drawn_where_the_candidate_does_not_lean_better_or_could_not_resolve():
    ref = _logits(1600, 5)
    plain = ref + np.random.default_rng(40).normal(0, 0.45, ref.shape)
    worse = ref + np.random.default_rng(41).normal(0, 0.47, ref.shape)
    faint = ref + np.random.default_rng(41).normal(0, 0.438, ref.shape)  # past the margin by too little to show
    outputs = {b"float": ref, b"minmax": plain, b"worse": worse, b"faint": faint}
    for name, why in (("worse", "not lower"), ("faint", "would resolve it")):
        reads: list = []
        evidence = _evidence(outputs, 200, 1600, reads, comparisons=4)
        for m in ("minmax", name):
            _add(evidence, m, m.encode(), outputs)
        decided = evidence.compare("minmax", name)
        assert not decided.kept and decided.looks == 1 and not reads and why in decided.why, decided


def test_the_family_of_comparisons_replaces_a_file_by_one_no_better_in_under_5_percent_of_conversions():
    """Under the null (every candidate's file as good as min/max's: the same error distribution), eight
    comparisons a conversion with rounds up to 800 samples: in 400 simulated conversions, some candidate is
    kept in under 5 % of them (Bonferroni's bound is conservative: measured far under it)."""
    rng = np.random.default_rng(8)
    kept, conversions = 0, 400
    ref = _logits(800, 9)
    base = {b"float": ref}
    for _ in range(conversions):
        outputs = {**base, **{f"c{k}".encode(): ref + rng.normal(0, 0.4, ref.shape) for k in range(9)}}
        evidence = _evidence(outputs, 200, 800, comparisons=8)
        names = [f"c{k}" for k in range(9)]
        for name in names:
            _add(evidence, name, name.encode(), outputs)
        winner, any_kept = names[0], False
        for i, name in enumerate(names[1:]):
            decided = evidence.compare(winner, name, live=names[i + 2:])
            if decided.kept:
                winner, any_kept = name, True
        kept += any_kept
    assert evidence.alpha == FAMILY_ALPHA / 8 / 3  # three looks: 200, 400, 800
    assert kept / conversions < FAMILY_ALPHA, kept


def test_per_sample_losses_are_zero_for_the_same_output_and_grow_with_its_error():
    rng = np.random.default_rng(10)
    ref = rng.normal(size=(50, 16))
    for kind in ("kl", "mse", "cosine", "iou"):
        a = ref if kind != "iou" else 1 / (1 + np.exp(-ref))
        assert np.all(per_sample_losses(a, a, kind) == 0)
        near, far = a + 0.05 * rng.normal(size=a.shape), a + 0.5 * rng.normal(size=a.shape)
        assert np.mean(per_sample_losses(a, far, kind)) > np.mean(per_sample_losses(a, near, kind)) >= 0, kind
    empty = np.zeros((3, 8))
    assert np.all(per_sample_losses(empty, empty + 0.1, "iou") == 0)  # nothing over the threshold in either


def test_no_round_is_drawn_past_the_time_auto_allows():
    """The close comparison of the rounds test, with a deadline its next round would pass (each sample taking
    a second on each model): no sample is read, and the line says why."""
    import time

    rng = np.random.default_rng(4)
    ref = _logits(1600, 5)
    outputs = {b"float": ref, b"minmax": ref + rng.normal(0, 0.45, ref.shape),
               b"percentile": ref + rng.normal(0, 0.39, ref.shape)}
    reads: list = []
    evidence = _evidence(outputs, 200, 1600, reads, comparisons=4)
    for name in ("minmax", "percentile"):
        _add(evidence, name, name.encode(), outputs)
    evidence.per_sample, evidence.deadline = 1.0, time.perf_counter() + 60
    decided = evidence.compare("minmax", "percentile")
    assert not decided.kept and not reads and "past the time it allows" in decided.why, decided
    evidence.deadline = None
    assert evidence.compare("minmax", "percentile").kept and reads


def _sleepy(calls: list, seconds: float):
    """A model's outputs taking `seconds` a sample: what `score_all`'s evaluate gives, with its time."""
    import time

    def evaluate(_model: bytes, samples: list) -> np.ndarray:
        calls.append(len(samples))
        time.sleep(seconds * len(samples))
        return np.zeros((len(samples), 3), np.float32)

    return evaluate


def test_ranking_is_not_started_where_the_float_models_first_samples_say_it_cannot_end_in_time():
    """The float model at 4 ms a sample on 200 held-out samples foretells over 2 s for the rest of it, min/max
    and one more candidate: with 1 s left, ranking is not started and only its first samples ran; with 60 s,
    all 200, and the runs that follow the choice (500: 2 s at least) come off the deadline."""
    import re
    import time

    from edgekit.converters.int8.scoring import FIRST, Late, _reference

    calls: list[int] = []
    found, _ = _reference(b"float", list(range(200)), _sleepy(calls, 0.004), time.perf_counter() + 1, after=0)
    assert isinstance(found, Late) and calls == [FIRST], (found, calls)
    assert re.search(r"would take about \d+ s more, past the time auto allows", found.why), found.why
    calls.clear()
    now = time.perf_counter()
    found, deadline = _reference(b"float", list(range(200)), _sleepy(calls, 0.004), now + 60, after=500)
    assert not isinstance(found, Late) and found.shape == (200, 3) and calls == [FIRST, 200 - FIRST]
    assert deadline - now <= 58
    found, deadline = _reference(b"float", list(range(200)), _sleepy(calls, 0.004), now + 60, after=15000)
    assert isinstance(found, Late)  # 60 s of runs after the choice leave nothing
    assert _reference(b"float", list(range(200)), _sleepy(calls, 0.0), None, after=2500)[1] is None


def test_a_candidate_that_would_end_past_the_deadline_is_not_started():
    """The scheduler asks `fits` before each start: the first fits, the others would end late and never run."""
    from concurrent.futures import ThreadPoolExecutor

    from edgekit.converters.int8.scoring import Late, _scores

    started: list[str] = []
    late = Late("about 16 s more would take auto past the time it allows")
    answers = iter([None, late, late])
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = _scores(lambda m: started.append(m) or {"seconds": 16.0}, ("percentile", "mse", "ema"), pool,
                          lambda _m: 0, fits=lambda: next(answers))
    assert started == ["percentile"] and results["mse"] is late and results["ema"] is late, results
