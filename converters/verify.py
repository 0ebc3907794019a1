"""Compare the converted model with the float model on the same preprocessed samples."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.errors import ConversionError
from edgekit.metrics import compare_outputs, looks_like_scores, output_role

__all__ = ["check_not_collapsed", "compare_outputs", "compare_per_output", "looks_like_scores", "match_outputs"]


def _int8_step(ref: np.ndarray) -> float:
    """One int8 step of an output with the float model's values `ref` (samples x values): 1/256 for
    probabilities (TFLite fixes a softmax output's scale), else its range, zero included, over 255."""
    if ref.min() >= 0 and ref.max() <= 1 and np.allclose(ref.sum(axis=1), 1.0, atol=1e-3):
        return 1.0 / 256
    return float(max(ref.max(), 0.0) - min(ref.min(), 0.0)) / 255


def check_not_collapsed(reference: np.ndarray, candidate: np.ndarray, what: str,
                        int8: bool = False, *, probed: str | None = None) -> str | None:
    """A converted model that outputs NaN, or the same thing for every input while the float model
    does not, is broken: raise instead of writing it. Unless the output is int8 (`int8`) and the float
    model's own variation is below one step of it (an untrained net whose scores barely move): then the
    constant output is all 8 bits can say, and a note says so (returned). `probed` says what the models ran
    on ("200 held-out samples", "a zero input"; default: the calibration samples), as every message does."""
    cand = np.asarray(candidate, np.float64).reshape(len(candidate), -1)
    ref = np.asarray(reference, np.float64).reshape(len(reference), -1)
    probed = probed or f"{len(cand)} calibration sample(s)"
    if not np.all(np.isfinite(cand)):
        if not np.all(np.isfinite(ref)):
            raise ConversionError(f"{what}: the float model itself outputs NaN or infinity on {probed}, "
                                  "and so does the converted one")
        raise ConversionError(f"{what}: the converted model outputs NaN or infinity on {probed}, the float model "
                              "does not")
    spread = float(np.ptp(ref, axis=0).max()) if len(ref) >= 2 else 0.0
    if len(cand) < 2 or spread == 0 or np.ptp(cand, axis=0).max() > 0:
        return None
    step = _int8_step(ref)
    if int8 and spread < step:
        return (f"{what}: the converted model gives the same output on each of {probed}, but the float "
                f"model's varies by at most {spread:.2g}, less than one step of the converted output ({step:.2g})")
    raise ConversionError(f"{what}: the converted model's output is the same on each of {probed} (collapsed)")


def match_outputs(reference: dict[str, np.ndarray], candidate, what: str) -> dict[str, np.ndarray]:
    """The converted model's outputs under the float model's names: by name (the .tflite signature keeps
    them), or by position for a single output. Never by shape."""
    if not isinstance(candidate, dict):
        candidate = {"output_0": candidate}
    if set(candidate) == set(reference):
        return {name: candidate[name] for name in reference}
    if len(candidate) == len(reference) == 1:
        return {next(iter(reference)): next(iter(candidate.values()))}
    raise ConversionError(f"{what}: cannot match the converted outputs {sorted(candidate)} to the model's "
                          f"outputs {list(reference)} by name")


def comparable(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> tuple[list[str], list[str]]:
    """(the outputs the float model computes at the converted shape, a note per one it does not): a TF graph
    that only names an op for the converter (the TF Object Detection API's TFLite_Detection_PostProcess, an
    empty function) gives placeholders there, so the .tflite's output cannot be checked against it. The
    .tflite's own values are still checked for NaN."""
    names, others = [], []
    for name, ref in reference.items():
        cand = np.asarray(candidate[name])
        if tuple(np.shape(ref)[1:]) == tuple(cand.shape[1:]) and len(ref) == len(cand):
            names.append(name)
            continue
        if not np.all(np.isfinite(cand.astype(np.float64))):
            raise ConversionError(f"the converted output {name} holds NaN or infinity")
        others.append(f"{name} {tuple(cand.shape[1:])}")
    notes = [f"the float model does not compute the output(s) {', '.join(others)} at their converted shape (an "
             "op its graph only names, such as the detection post-processing): not compared"] if others else []
    return names, notes


def agreement_interval(reference: np.ndarray, candidate: np.ndarray, role: str,
                       agreement: float | None) -> dict[str, Any]:
    """The top-1 agreement's 95 % (Clopper-Pearson) interval and verdict (edgekit/intervals.py), per sample
    for class scores. A mask agrees per element, and the elements of one sample are not independent draws:
    no interval there, which its verdict says. Both null where there is no agreement."""
    from edgekit.intervals import compare

    n = len(reference)
    if agreement is None:
        return {"top1_agreement_interval": None, "verdict": None}
    if role == "mask":
        return {"top1_agreement_interval": None, "verdict": f"agrees on {100 * agreement:.1f} % of the elements "
                f"of {n} samples (no interval: the elements of one sample are not independent)"}
    ref = np.asarray(reference).reshape(n, -1).argmax(axis=1)
    same = ref == np.asarray(candidate).reshape(n, -1).argmax(axis=1)
    paired = compare(agree=same).to_dict()
    return {"top1_agreement_interval": paired["agreement_interval"], "verdict": paired["verdict"]}


def compare_per_output(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                       what: str, int8: bool = False, *, probed: str | None = None) -> tuple[dict[str, dict], list[str]]:
    """Error statistics per output the float model computes (top-1 agreement only where its output looks
    like class scores), after the NaN/collapse check of each (on `probed`: what the samples are); and a note
    per output the float model itself barely varies on (a converted copy cannot be judged on those), or does
    not compute (`comparable`)."""
    names, notes = comparable(reference, candidate)
    stats = {}
    for name in names:
        ref, cand = reference[name], candidate[name]
        collapsed = check_not_collapsed(ref, cand, f"{what} (output {name})", int8, probed=probed)
        entry: dict[str, Any] = compare_outputs(ref, cand)
        entry["role"] = output_role(ref)
        if entry["role"] == "values":
            entry["top1_agreement"] = None
        entry.update(agreement_interval(ref, cand, entry["role"], entry["top1_agreement"]))
        spread = float(np.ptp(np.asarray(ref, np.float64).reshape(len(ref), -1), axis=0).max()) if len(ref) > 1 else None
        if spread is not None and spread < 1e-5:
            notes.append(f"the float model's output {name} varies by at most {spread:.1g} over the "
                         f"{probed or 'calibration samples'}: its conversion error says little")
        elif collapsed:
            notes.append(collapsed)
        stats[name] = entry
    return stats, notes
