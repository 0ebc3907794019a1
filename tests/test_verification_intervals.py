"""Convert's verification gives each output's top-1 agreement its n, 95 % interval and verdict (issue 49):
compare_per_output on hand-made outputs, no model."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.converters.verify import compare_per_output


def scores(classes: np.ndarray, k: int = 10) -> np.ndarray:
    out = np.full((len(classes), k), 0.01, np.float32)
    out[np.arange(len(classes)), classes] = 0.91
    return out


def test_every_output_with_an_agreement_gets_its_interval_and_the_numbers_stay_as_they_were():
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 10, 200)
    flipped = truth.copy()
    flipped[:5] = (flipped[:5] + 1) % 10  # 5 of 200 disagree: 97.5 %
    reference = {"probs": scores(truth), "box": rng.random((200, 4)).astype(np.float32) - 0.5}
    candidate = {"probs": scores(flipped), "box": reference["box"] + 0.01}
    stats, _ = compare_per_output(reference, candidate, "test")
    probs, box = stats["probs"], stats["box"]
    assert probs["samples"] == 200 and probs["top1_agreement"] == 0.975
    # Clopper-Pearson for 195 of 200, from the beta quantiles: beta.ppf(0.025, 195, 6), beta.ppf(0.975, 196, 5)
    assert probs["top1_agreement_interval"] == pytest.approx([0.942626, 0.991834], abs=1e-6)
    assert probs["verdict"] == "agrees on 97.5 % (95 % interval 94.3-99.2 %) at n=200"
    assert box["role"] == "values" and box["top1_agreement"] is None
    assert box["top1_agreement_interval"] is None and box["verdict"] is None


def test_a_mask_agrees_per_element_and_says_why_it_has_no_interval():
    rng = np.random.default_rng(1)
    mask = rng.random((12, 8, 8, 3)).astype(np.float32)
    stats, _ = compare_per_output({"seg": mask}, {"seg": mask + 0.001}, "test")
    seg = stats["seg"]
    assert seg["role"] == "mask" and seg["top1_agreement"] == 1.0
    assert seg["top1_agreement_interval"] is None
    assert seg["verdict"] == ("agrees on 100.0 % of the elements of 12 samples (no interval: the elements of one "
                              "sample are not independent)")
