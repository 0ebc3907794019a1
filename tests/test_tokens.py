"""A token model (int32 ids -> Embedding -> pooling -> classes), a family the image tests never built:
int8 from token calibration data agrees with the float model as the plain converter's int8 does, on the
same samples, and ids past the vocabulary are bad calibration data (exit 4), not a failed conversion."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import edgekit
from edgekit.cli import main
from edgekit.runtime import Model

VOCAB, LENGTH = 1000, 20


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A trained 3-class token classifier (the class is which third of the vocabulary most ids come from),
    its calibration and held-out samples."""
    import keras

    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(3)

    def samples(n):
        y = np.arange(n) % 3
        ids = rng.integers(0, VOCAB // 3, (n, LENGTH)) + (y * (VOCAB // 3))[:, None]
        noise = rng.random((n, LENGTH)) < 0.3
        ids[noise] = rng.integers(0, VOCAB, noise.sum())
        return ids.astype(np.int32), y

    inp = keras.Input((LENGTH,), dtype="int32", name="tokens")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 16, name="emb")(inp))
    model = keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="probs")(x))
    model.compile("adam", "sparse_categorical_crossentropy")
    train_x, train_y = samples(600)
    model.fit(train_x, train_y, epochs=8, verbose=0)
    folder = tmp_path_factory.mktemp("tokens")
    model.save(folder / "tokens.keras")
    calib_x, calib_y = samples(200)
    np.savez(folder / "calib.npz", x=calib_x, y=calib_y)
    test_x, test_y = samples(300)
    oov = calib_x.astype(np.int64)
    oov[:, 0] = 5000
    np.save(folder / "oov.npy", oov)
    return folder, model, calib_x, (test_x, test_y)


def test_int8_of_a_token_model_agrees_with_the_float_model_as_the_plain_converter_does(tokens):
    import tensorflow as tf

    folder, keras_model, calib_x, (test_x, test_y) = tokens
    result = edgekit.convert(folder / "tokens.keras", mode="int8", calib=folder / "calib.npz",
                             output=folder / "tokens.int8.tflite")
    ours = Model(result.path)
    assert ours.inputs[0].dtype == np.int32 and result.metadata["preprocessing"] is None
    plain = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    plain.optimizations = [tf.lite.Optimize.DEFAULT]
    plain.representative_dataset = lambda: ([x[None]] for x in calib_x)
    theirs = Model(plain.convert(), probe=False)
    reference = keras_model.predict(test_x, verbose=0).argmax(1)
    agree = {name: float(np.mean(m.predict(test_x).argmax(1) == reference)) for name, m in
             (("edgekit", ours), ("plain", theirs))}
    top1 = float(np.mean(ours.predict(test_x).argmax(1) == test_y))
    print(f"\ntoken model, 300 held-out samples: agreement with the float model {agree}; edgekit top-1 {top1:.3f}")
    assert top1 >= 0.9 and agree["edgekit"] >= agree["plain"] and agree["edgekit"] >= 0.97


def test_token_ids_past_the_vocabulary_are_bad_calibration_data(tokens):
    folder = tokens[0]
    result = CliRunner().invoke(main, ["convert", str(folder / "tokens.keras"), "--int8", "--calib",
                                       str(folder / "oov.npy"), "-o", str(folder / "oov.tflite")])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 4, result.stderr
    assert lines == [f"edgekit: error: --calib: {folder / 'oov.npy'}: token ids go up to 5000, but input 'tokens' "
                     "feeds Embedding 'emb' of 1000 ids (0..999)"]
    assert not (folder / "oov.tflite").exists()
