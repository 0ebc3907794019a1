"""float16 keeps in float32 the constants float16 cannot hold (converters/fp16_weights.py), and the NaN checks say
what they ran on.

The model is the issue's shape: a SavedModel taking a waveform, STFT -> power -> mel -> `log(mel + 1e-10)` -> two
dense layers. TFLite's converter folds the 1e-10 into the mel product's bias, which float16 rounds to 0: its
float16 file outputs NaN on silence (log(0) = -inf, times weights of both signs). edgekit's file is finite there
and within RULINGS' float16 tolerance (max |difference| <= 1e-3 x max(1, max |float output|)) of the SavedModel.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgekit.converters.fp16_weights import float16_loses
from edgekit.errors import ConversionError

RATE, CLIP = 16000, 1024
TOLERANCE = 1e-3  # RULINGS 47: float16 "within 1e-3", relative to max(1, max |float output|)


def _build(folder, epsilon: float):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    mel = tf.signal.linear_to_mel_weight_matrix(32, 129, RATE, 60.0, 7600.0)

    class LogMel(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1 = tf.Variable(rng.normal(0, 0.05, (7 * 32, 32)).astype(np.float32))
            self.b1 = tf.Variable(rng.normal(0, 0.1, 32).astype(np.float32))
            self.w2 = tf.Variable(rng.normal(0, 0.2, (32, 10)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec((1, CLIP), tf.float32, name="audio")])
        def __call__(self, audio):
            spec = tf.signal.stft(audio, frame_length=256, frame_step=128, fft_length=256)
            power = tf.math.real(spec) ** 2 + tf.math.imag(spec) ** 2
            logmel = tf.math.log(tf.matmul(power, mel) + epsilon)
            hidden = tf.nn.relu(tf.reshape(logmel, (1, -1)) @ self.w1 + self.b1)
            return {"scores": hidden @ self.w2}

    module = LogMel()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.__call__})
    return folder


@pytest.fixture(scope="module")
def log_mel(tmp_path_factory):
    """The SavedModel with `log(mel + 1e-10)`."""
    return _build(tmp_path_factory.mktemp("f16") / "logmel", 1e-10)


def _signals() -> dict[str, np.ndarray]:
    """Silence, white and pink noise from loud to quiet, and a voiced, speech-like sound (19 harmonics of 150 Hz,
    amplitude-modulated at 4 Hz) over noise 10, 20 and 30 dB below it; one clip each."""
    rng = np.random.default_rng(1)
    t = np.arange(CLIP) / RATE
    spectrum = np.fft.rfft(rng.normal(size=CLIP))
    spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
    pink = np.fft.irfft(spectrum, CLIP)
    voiced = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 20)) * 0.1 * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    clips = {"silence": np.zeros(CLIP)}
    clips |= {f"white noise {level:g}": rng.normal(0, level, CLIP) for level in (0.3, 0.03, 0.003, 0.0003)}
    clips |= {f"pink noise {level:g}": level * pink / pink.std() for level in (0.3, 0.01)}
    clips |= {f"voiced, noise {snr} dB below": voiced + rng.normal(0, voiced.std() * 10 ** (-snr / 20), CLIP)
              for snr in (10, 20, 30)}
    return {name: clip[None].astype(np.float32) for name, clip in clips.items()}


def _saved_model_outputs(folder, clips):
    import tensorflow as tf

    serve = tf.saved_model.load(str(folder)).signatures["serving_default"]
    return {name: serve(audio=tf.constant(x))["scores"].numpy() for name, x in clips.items()}


def _tflite_outputs(tflite: bytes, clips):
    from edgekit.runtime import Model

    model = Model(tflite, delegate="cpu", probe=False)
    return {name: np.asarray(model.predict(x)) for name, x in clips.items()}


def _plain_float16(folder) -> bytes:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(folder))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([loaded.signatures["serving_default"]], loaded)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


def _float16_constants(tflite: bytes) -> tuple[int, int]:
    """(float16 constants holding data, DEQUANTIZE ops) of the main graph."""
    from edgekit.runtime.flatbuffer import ModelView

    view = ModelView(tflite)
    graph = view.first_subgraph()
    stored = sum(t.type_name == "FLOAT16" and view.buffer_bytes(t.buffer) is not None for t in graph.tensors)
    return stored, sum(view.op_name(op) == "DEQUANTIZE" for op in graph.operators)


def test_float16_of_a_log_mel_front_end_is_finite_on_silence_and_within_tolerance_on_signals(log_mel, tmp_path):
    import edgekit

    result = edgekit.convert(log_mel, mode="float16", output=tmp_path / "logmel.tflite")
    kept = [w for w in result.changes if w.startswith("kept 1 constant(s) in float32")]
    assert len(kept) == 1 and re.search(r": \S+ \(32 values, largest \|value\| 1e-10\)$", kept[0]), result.changes
    clips = _signals()
    reference = _saved_model_outputs(log_mel, clips)
    ours = _tflite_outputs(result.path.read_bytes(), clips)
    assert np.all(np.isfinite(ours["silence"]))
    for name, ref in reference.items():
        worst, allowed = np.abs(ours[name] - ref).max(), TOLERANCE * max(1.0, np.abs(ref).max())
        assert worst <= allowed, f"{name}: max |difference| {worst:.3g} > {allowed:.3g}"
    # the plain converter's float16 file, on the same clips: NaN on silence (its 1e-10 is 0), the same elsewhere
    plain = _tflite_outputs(_plain_float16(log_mel), clips)
    assert np.all(np.isnan(plain["silence"]))
    assert all(np.all(np.isfinite(out)) for name, out in plain.items() if name != "silence")


def test_only_the_constant_float16_cannot_hold_stays_float32(log_mel, tmp_path):
    """Every other constant is float16 as in the plain converter's file (one FLOAT16 tensor fewer: the folded
    1e-10 bias, 32 values), and the file stays about half the float32 one (both with edgekit's metadata)."""
    import edgekit

    ours = edgekit.convert(log_mel, mode="float16", output=tmp_path / "f16.tflite").path.read_bytes()
    plain = _plain_float16(log_mel)
    constants, dequantizes = _float16_constants(plain)
    assert constants == dequantizes == 6
    assert _float16_constants(ours) == (5, 5)
    float32 = edgekit.convert(log_mel, mode="float32", output=tmp_path / "f32.tflite").path.read_bytes()
    assert len(ours) < 0.6 * len(float32)


def test_a_file_whose_constants_float16_holds_is_left_as_tflite_wrote_it(tmp_path):
    """With `log(mel + 1e-3)` nothing is lost: no second conversion is asked for and the file is unchanged."""
    from edgekit.converters.fp16_weights import keep_float32_constants

    plain = _plain_float16(_build(tmp_path / "eps1e-3", 1e-3))

    def float32() -> bytes:
        raise AssertionError("a float32 conversion was asked for a file with nothing to restore")

    assert keep_float32_constants(plain, float32) == (plain, [])


def test_a_layer_norm_with_berts_epsilon_is_finite_on_a_constant_row(tmp_path):
    """A second family: LayerNormalization with BERT's epsilon, 1e-12, which float16 rounds to 0. A row whose
    values are all equal (padding, a silent frame) has variance 0: rsqrt(0 + 0) is infinity and the plain
    converter's float16 file outputs NaN there; edgekit's keeps the epsilon and matches Keras."""
    import keras
    import tensorflow as tf

    import edgekit

    inp = keras.Input((16, 32))
    seeded = {"kernel_initializer": keras.initializers.GlorotUniform(seed=0)}
    hidden = keras.layers.Dense(32, activation="gelu", **seeded)(keras.layers.LayerNormalization(epsilon=1e-12)(inp))
    model = keras.Model(inp, keras.layers.Dense(8, **seeded)(hidden))
    model.save(tmp_path / "ln.keras")
    x = np.zeros((1, 16, 32), np.float32)
    x[0, 3] = np.linspace(-1, 1, 32)  # one row that varies, fifteen that do not
    result = edgekit.convert(tmp_path / "ln.keras", mode="float16", output=tmp_path / "ln.tflite")
    assert any(w.startswith("kept 1 constant(s) in float32") and w.endswith(" = 1e-12") for w in result.changes)
    reference = np.asarray(model(x))
    ours = np.asarray(_tflite_outputs(result.path.read_bytes(), {"x": x})["x"])
    assert np.abs(ours - reference).max() <= TOLERANCE * max(1.0, np.abs(reference).max())
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations, converter.target_spec.supported_types = [tf.lite.Optimize.DEFAULT], [tf.float16]
    plain = np.asarray(_tflite_outputs(converter.convert(), {"x": x})["x"])
    assert np.isnan(plain[0]).any(axis=-1).sum() == 15  # every constant row


@pytest.mark.parametrize("values, lost", [
    ([1e-10], True),  # underflows to 0
    ([1e-10] * 32, True),  # the folded bias: every value 0 in float16
    ([1e-6, 2e-6], True),  # subnormal in float16: a few % off
    ([1e5], True), ([-70000.0, 1.0], True),  # past 65504: infinity
    ([0.5, 1e-10, -0.25], False),  # a weight with a tiny entry: its error is tiny against the weight's scale
    ([0.0, 0.0], False), ([np.inf, -np.inf, 1.0], False), ([np.nan], False),  # float16 holds these as they are
    ([65504.0, 1e-4, 0.333], False),  # float16's largest and a normal small number
])
def test_float16_loses_known_answers(values, lost):
    assert float16_loses(np.asarray(values, np.float32)) is lost


def test_the_nan_check_says_what_it_ran_on(log_mel):
    """Without calibration data the probe is one zero input (a silent clip): the refusal says so, not
    "calibration samples". The plain converter's float16 file is the converted model that outputs NaN there."""
    from edgekit.converters.loading import load_model
    from edgekit.converters.stages.verify import _probe_finite
    from edgekit.converters.verify import check_not_collapsed
    from edgekit.runtime import Model

    source = load_model(log_mel)
    plain = Model(_plain_float16(log_mel), delegate="cpu", probe=False)
    with pytest.raises(ConversionError, match=r"outputs NaN or infinity on edgekit's probe input \(audio: zeros; "
                                              r"no calibration data was given\), the float model does not"):
        _probe_finite(source, plain, source.inputs)
    ref = np.ones((3, 2))
    with pytest.raises(ConversionError, match="outputs NaN or infinity on 3 held-out sample"):
        check_not_collapsed(ref, np.full((3, 2), np.nan), "m", probed="3 held-out sample(s)")
    with pytest.raises(ConversionError, match=r"on 3 calibration sample\(s\), the float model does not"):
        check_not_collapsed(ref, np.full((3, 2), np.nan), "m")
