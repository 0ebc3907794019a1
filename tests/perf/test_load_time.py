"""What the untrusted-file contract costs a clean model's load: `python -m pytest -m perf -s
tests/perf/test_load_time.py`. Loads are interleaved, medians of 30, ratios printed from one run."""

from __future__ import annotations

import statistics
import time

import pytest

from edgekit.runtime import graph_rules, op_rules, preflight, probe
from edgekit.runtime.flatbuffer import ModelView
from edgekit.runtime.model import Model

pytestmark = pytest.mark.perf


def _mobilenet(tmp_path):
    """A MobileNetV2 (alpha 0.35, 96x96, untrained) as the plain converter writes it: 155 operators."""
    import tensorflow as tf

    keras = tf.keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10)
    path = tmp_path / "mobilenet_v2.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(keras).convert())
    return path


def _time(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@pytest.mark.parametrize("which", ["digits int8", "MobileNetV2 float32"])
def test_the_checks_and_the_verdict_lookup_cost_little_beside_the_load(which, converted, tmp_path, monkeypatch):
    """A: Model(path) as it loads now, the second time (its verdict found by the bytes' sha256: no rule run
    again); B: the load as it was before this release (its rules switched off, no probe, the
    earlier preflight run in full). Interleaved, 30 rounds."""
    path = converted("int8") if which == "digits int8" else _mobilenet(tmp_path)
    content = path.read_bytes()
    Model(path)  # the verdict is kept (convert's own file already has one)
    view = ModelView(content)
    backend = Model(path, probe=False).backend
    parsed = ModelView(content)
    preflight.validate(parsed)

    def before() -> None:
        with monkeypatch.context() as m:
            for module, name in RULES:
                m.setattr(module, name, lambda *a, **k: None)
            Model(path, probe=False)

    steps = {
        "A: load now": lambda: Model(path),
        "B: load before": before,
        "the new rules on a parsed model": lambda: _new_rules(parsed),
        "verdict lookup (sha256 + read)": lambda: probe.verdicts.recall(
            probe.verdict_name(content, f"{backend.name} {backend.version}")),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(30):
        for name, fn in steps.items():
            times[name].append(_time(fn))
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratio = ms["A: load now"] / ms["B: load before"]
    print(f"\n{which} ({len(content) / 1024:.0f} KiB, {sum(len(s.operators) for s in view.subgraphs)} ops): "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items()) + f"; A / B = {ratio:.3f}")
    assert ratio <= 1.0  # measured 0.66 (digits) and 0.50 (MobileNetV2); 1.16-1.38 when every load ran the rules too


RULES = [(graph_rules, "check_signatures"), (graph_rules, "check_strings"), (graph_rules, "check_memory"),
         (graph_rules, "check_calls"), (op_rules, "check_operands"), (op_rules, "check_quantization"),
         (op_rules, "check_option_ranges")]


def _new_rules(view: ModelView) -> None:
    """The checks the third round of the untrusted-file contract added, alone."""
    graph_rules.check_signatures(view, "m")
    for sub in view.subgraphs:
        for op in sub.operators:
            op_rules.check_operands(view, op, "m")
            op_rules.check_quantization(view, op, sub.tensors, "m")
            op_rules.check_option_ranges(op, "m")
        graph_rules.check_strings(view, sub, "m")
        graph_rules.check_memory(view, sub, "m")
    graph_rules.check_calls(view, "m")
