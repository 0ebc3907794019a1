"""The float head (converters/int8/float_ops.py): an overconfident classifier's logits span so much that
int8's one scale ties its top classes; `auto` scores its file with the logits' op and the SOFTMAX in float,
keeps it where it measures better, and the budget autopilot's mixes keep it."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def overconfident(digits_keras, digits_dir):
    """The digits CNN with one class's logit 1000 below the rest (its last Dense's bias: int8's one logits
    scale spans it, as an overconfident model's logits span hundreds), its calibrated TFLite model, 200
    training digits (100 to calibrate, 100 to score on) and 200 test digits."""
    import keras
    import tensorflow as tf

    from edgekit.converters.int8 import ranges
    from edgekit.runtime import ImageFolder, read_image

    model = keras.saving.load_model(digits_keras)
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)][-1]
    kernel, bias = dense.get_weights()
    bias[-1] -= 1000.0  # one class's logit far below the rest: the range int8 spans, the top classes' step
    dense.set_weights([kernel, bias])

    def images(folder, n):
        found = ImageFolder.scan(digits_dir / folder)
        return np.stack([read_image(f) for f in found.files[:n]])[..., None].astype(np.float32)

    x, test = images("train", 200), images("test", 200)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([s[None]] for s in x[:100])
    return ranges.calibrated_model(converter), [[s[None]] for s in x], model.predict(test, verbose=0), test


def _first_output(tflite: bytes, samples: list) -> np.ndarray:
    from edgekit.runtime import Model

    model = Model(tflite, probe=False, num_threads=1)
    return np.concatenate([model.run(*sample)[0] for sample in samples])


def _ops(tflite: bytes) -> list[tuple[str, str]]:
    """(op, its output's type) in graph order."""
    from edgekit.runtime.inspect import operators

    _, sub, walked = operators(tflite)
    return [(kind, sub.tensors[op.outputs[0]].type_name) for _, kind, op in walked]


def _tied(probabilities: np.ndarray) -> int:
    """Samples whose two highest scores are equal: their top-1 is whichever class comes first."""
    top = np.sort(probabilities, axis=1)
    return int(np.sum(top[:, -1] == top[:, -2]))


def test_auto_keeps_an_overconfident_classifiers_logits_and_softmax_in_float(overconfident):
    from edgekit.converters.int8.choose import choose
    from edgekit.converters.int8.float_ops import head_ops
    from edgekit.converters.int8.ranges import quantize

    calibrated, samples, reference, test = overconfident
    lines: list[str] = []
    choice = choose(calibrated, "float32", "auto", samples[:100], _first_output, extra=samples[100:],
                    say=lambda line: lines.append(str(line)), effort="fast")  # the head is scored at every effort
    r = choice.entry
    head = r["float_head"]
    ops, share = head_ops(calibrated)
    assert head["ops"] == list(ops) and len(ops) == 2 and ops[-1] == head["ops"][-1]
    assert head["ran"] and head["kept"] and head["against"] == r["chosen"] and 0 < share < 0.01
    decided = r["decisions"][-1]  # the last comparison: the head against the winner, on the same samples
    assert decided["candidate"] == "float head" and decided["against"] == r["chosen"] and decided["kept"]
    assert decided["p"] <= decided["alpha"] and head["score"]["loss"] < r["candidates"][r["chosen"]]["loss"]
    assert _ops(choice.tflite)[-3:] == [("DEQUANTIZE", "FLOAT32"), ("FULLY_CONNECTED", "FLOAT32"),
                                        ("SOFTMAX", "FLOAT32")]
    assert any(line.startswith("float head (2 ops") and ": kept: " in line for line in lines)
    plain = quantize(calibrated, "float32")
    assert ("FULLY_CONNECTED", "INT8") in _ops(plain)
    # on test digits neither the converter nor auto saw: the converter's int8 ties top classes, the float head none
    floats = reference.argmax(1)
    got = {name: _first_output(f, [[t[None]] for t in test]) for name, f in (("plain", plain), ("ours", choice.tflite))}
    assert _tied(got["plain"]) >= 10 and _tied(got["ours"]) == 0, {k: _tied(v) for k, v in got.items()}
    agree = {name: float(np.mean(v.argmax(1) == floats)) for name, v in got.items()}
    assert agree["ours"] >= 0.99 and agree["plain"] <= agree["ours"] - 0.02, agree
    print(f"ties {_tied(got['plain'])} -> 0; agreement with float {agree}; {r['chosen']} + float head")


def test_the_budget_autopilots_mixes_keep_the_float_head(overconfident):
    from edgekit.converters.autopilot import _search
    from edgekit.converters.int8.float_ops import head_ops

    calibrated, samples, _, _ = overconfident
    ops, _ = head_ops(calibrated)
    search = _search(None, lambda: iter(samples[:100]), lambda _t: (0.0, 1.0), calibrated, keep_float=ops)
    assert _ops(search.build())[-2:] == [("FULLY_CONNECTED", "FLOAT32"), ("SOFTMAX", "FLOAT32")]
    without = _search(None, lambda: iter(samples[:100]), lambda _t: (0.0, 1.0), calibrated)
    assert ("FULLY_CONNECTED", "INT8") in _ops(without.build())


def test_no_float_head_where_no_softmax_reads_a_weighted_ops_logits(overconfident):
    """A model whose output is not a SOFTMAX of a Dense / 1x1 Conv2D's logits has no head to keep float."""
    from edgekit.converters.int8.float_ops import head_ops
    from edgekit.converters.int8.ranges import logits_view

    calibrated, _, _, _ = overconfident
    view = logits_view(calibrated)
    assert view is not None and head_ops(view) == ((), 0.0)  # its first output is the logits themselves
