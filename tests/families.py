"""One small model per family a user brings (issue 28), trained here in seconds on data the packages ship,
with its calibration and held-out samples as .npz files `edgekit` reads (`calib`, `bench --data`).

    build(name, folder) -> Family

Families: rolled LSTM and GRU with Keras's open batch, a bidirectional LSTM, the LSTM unrolled, a GRU inside a
nested Sequential, a small ViT
(MultiHeadAttention + LayerNormalization), an Embedding classifier on int32 tokens, a 1-D conv with two heads,
U-Nets at an open size (UpSampling2D, Conv2DTranspose) and a tf.Module SavedModel with a log-mel front end that
is NaN on silence. Sequences and images come from scikit-learn's digits (8 rows of 8 pixels), signals and
audio are seeded sines: every family learns something, so agreement and SNR mean something.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB, LENGTH = 1000, 20
TARGET_KEYS = ("y", "mask", "band", "amplitude")  # the arrays of the .npz files that are targets, not inputs
RATE, CLIP = 4000, 1024
SEED = 7


@dataclass(frozen=True)
class Family:
    name: str
    model: Path              # .keras file or SavedModel folder
    calib: Path              # .npz: the samples edgekit calibrates on
    test: Path               # .npz: held-out samples (x keyed by input name or `x`, `y` labels where any)
    train: Path | None = None  # .npz: what the model was trained on, with targets by output name (fine-tuning)
    dense: bool = False      # per-element outputs (a mask), not classes
    input_shape: str | None = None   # what --input-shape a user gives an open-size model


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def _split(x, y, folder: Path, name: str, n_calib: int = 200, n_test: int = 300):
    """Train on the rest (kept as `<name>.train.npz`); the first `n_calib` samples calibrate, the next `n_test`
    are held out."""
    np.savez(folder / f"{name}.calib.npz", x=x[:n_calib], y=y[:n_calib])
    np.savez(folder / f"{name}.test.npz", x=x[n_calib:n_calib + n_test], y=y[n_calib:n_calib + n_test])
    np.savez(folder / f"{name}.train.npz", x=x[n_calib + n_test:], y=y[n_calib + n_test:])
    return (x[n_calib + n_test:], y[n_calib + n_test:]), folder / f"{name}.calib.npz", folder / f"{name}.test.npz"


def _fit(model, x, y, epochs: int, loss="sparse_categorical_crossentropy"):
    model.compile("adam", loss)
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    return model


def _sequence(name: str, folder: Path, layer: str, *, unroll=False, bidirectional=False) -> Family:
    """digits as 8 steps of 8 pixels -> recurrence -> 10 classes."""
    import keras

    x, y = _digits()
    (tx, ty), calib, test = _split(x, y, folder, name)
    inp = keras.Input((8, 8), name="steps")
    cell = getattr(keras.layers, layer)(32, unroll=unroll, name=layer.lower())
    h = keras.layers.Bidirectional(cell, name="bi") if bidirectional else cell
    out = keras.layers.Dense(10, activation="softmax", name="probs")(h(inp))
    path = folder / f"{name}.keras"
    _fit(keras.Model(inp, out), tx, ty, 25).save(path)
    return Family(name, path, calib, test)


def _nested(name: str, folder: Path) -> Family:
    """digits as 8 steps -> a Sequential encoder holding a GRU, nested in a functional model -> 10 classes."""
    import keras

    x, y = _digits()
    (tx, ty), calib, test = _split(x, y, folder, name)
    encoder = keras.Sequential([keras.Input((8, 8)), keras.layers.GRU(24, name="gru")], name="encoder")
    inp = keras.Input((8, 8), name="steps")
    path = folder / f"{name}.keras"
    _fit(keras.Model(inp, keras.layers.Dense(10, activation="softmax", name="probs")(encoder(inp))), tx, ty,
         15).save(path)
    return Family(name, path, calib, test)


def _vit(name: str, folder: Path) -> Family:
    """A small vision transformer on 8x8 digits: 2x2 patches, two attention blocks."""
    import keras

    x, y = _digits()
    (tx, ty), calib, test = _split(x[..., None], y, folder, name)
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Reshape((16, 32))(keras.layers.Conv2D(32, 2, strides=2, name="patches")(inp))
    h = h + keras.layers.Embedding(16, 32, name="position")(keras.ops.arange(16))
    for i in range(2):
        a = keras.layers.LayerNormalization(name=f"ln{i}a")(h)
        h = h + keras.layers.MultiHeadAttention(4, 8, name=f"mha{i}")(a, a)
        a = keras.layers.LayerNormalization(name=f"ln{i}b")(h)
        h = h + keras.layers.Dense(32, name=f"mlp{i}b")(keras.layers.Dense(64, activation="gelu", name=f"mlp{i}a")(a))
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.LayerNormalization(name="ln")(h))
    out = keras.layers.Dense(10, activation="softmax", name="probs")(h)
    path = folder / f"{name}.keras"
    _fit(keras.Model(inp, out), tx, ty, 30).save(path)
    return Family(name, path, calib, test)


def _tokens(name: str, folder: Path) -> Family:
    """int32 ids -> Embedding -> pooling -> 3 classes (which third of the vocabulary most ids come from)."""
    import keras

    rng = np.random.default_rng(SEED)
    n = 1100
    y = np.arange(n) % 3
    ids = rng.integers(0, VOCAB // 3, (n, LENGTH)) + (y * (VOCAB // 3))[:, None]
    noise = rng.random((n, LENGTH)) < 0.3
    ids[noise] = rng.integers(0, VOCAB, noise.sum())
    (tx, ty), calib, test = _split(ids.astype(np.int32), y, folder, name)
    inp = keras.Input((LENGTH,), dtype="int32", name="tokens")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 16, name="emb")(inp))
    path = folder / f"{name}.keras"
    _fit(keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="probs")(h)), tx, ty, 8).save(path)
    return Family(name, path, calib, test)


def _signals(n: int, rng):
    """1-D signals: the class is the sine's frequency band, the second head its amplitude."""
    y = np.arange(n) % 4
    amp = rng.uniform(0.5, 2.0, n).astype(np.float32)
    t = np.arange(128, dtype=np.float32) / 128
    freq = (2 + 3 * y + rng.uniform(0, 1.5, n))[:, None]
    x = amp[:, None] * np.sin(2 * np.pi * freq * t + rng.uniform(0, 6.3, (n, 1))) + rng.normal(0, 0.2, (n, 128))
    return x[..., None].astype(np.float32), y, amp


def _conv1d(name: str, folder: Path) -> Family:
    """A 1-D conv with two heads: classes (softmax) and amplitude (linear)."""
    import keras

    x, y, amp = _signals(1100, np.random.default_rng(SEED))
    for part, rows in (("calib", slice(0, 200)), ("test", slice(200, 500)), ("train", slice(500, None))):
        # y: the classes bench scores; by output name: the fine-tuning targets of each head
        np.savez(folder / f"{name}.{part}.npz", x=x[rows], y=y[rows], band=y[rows], amplitude=amp[rows])
    inp = keras.Input((128, 1), name="signal")
    h = keras.layers.Conv1D(16, 7, activation="relu", name="c1")(inp)
    h = keras.layers.MaxPooling1D(2)(h)
    h = keras.layers.Conv1D(32, 5, activation="relu", name="c2")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    model = keras.Model(inp, [keras.layers.Dense(4, activation="softmax", name="band")(h),
                              keras.layers.Dense(1, name="amplitude")(h)])
    model.compile("adam", ["sparse_categorical_crossentropy", "mse"])
    model.fit(x[500:], [y[500:], amp[500:]], epochs=20, batch_size=32, verbose=0)
    path = folder / f"{name}.keras"
    model.save(path)
    return Family(name, path, folder / f"{name}.calib.npz", folder / f"{name}.test.npz")


def _unet(name: str, folder: Path, up: str) -> Family:
    """Segmentation at an open size (None, None, 1): the mask of a digit's ink, on digits upscaled to 32x32."""
    import cv2
    import keras

    x, _ = _digits()
    big = np.stack([cv2.resize(im, (32, 32), interpolation=cv2.INTER_LINEAR) for im in x])[..., None]
    mask = (big > 0.4).astype(np.float32)
    tx, ty = big[500:], mask[500:]  # the masks are kept as `mask`, not as `y` (edgekit reads y as classes)
    calib, test = folder / f"{name}.calib.npz", folder / f"{name}.test.npz"
    np.savez(calib, x=big[:200], mask=mask[:200])
    np.savez(test, x=big[200:500], mask=mask[200:500])
    np.savez(folder / f"{name}.train.npz", x=tx, mask=ty)  # `mask`: the output's name, its fine-tuning targets
    inp = keras.Input((None, None, 1), name="image")
    c1 = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="c1")(inp)
    c2 = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="c2")(c1)
    if up == "transpose":
        u = keras.layers.Conv2DTranspose(8, 2, strides=2, padding="same", name="up")(c2)
    else:
        u = keras.layers.Conv2D(8, 1, name="up_c")(keras.layers.UpSampling2D(2, name="up")(c2))
    h = keras.layers.Concatenate()([u, c1])
    out = keras.layers.Conv2D(1, 3, padding="same", activation="sigmoid", name="mask")(h)
    path = folder / f"{name}.keras"
    _fit(keras.Model(inp, out), tx, ty, 6, loss="binary_crossentropy").save(path)
    return Family(name, path, calib, test, dense=True, input_shape="1,32,32,1")


def _audio(name: str, folder: Path) -> Family:
    """A tf.Module SavedModel: waveform -> STFT -> log-mel (log of zero on silence: NaN/-inf) -> dense -> 4 classes.
    Trained by plain gradient steps on its variables."""
    import tensorflow as tf

    rng = np.random.default_rng(SEED)
    n = 700
    y = np.arange(n) % 4
    t = np.arange(CLIP, dtype=np.float32) / RATE
    freq = (300 + 400 * y + rng.uniform(0, 150, n))[:, None]
    wave = (0.5 * np.sin(2 * np.pi * freq * t) + rng.normal(0, 0.05, (n, CLIP))).astype(np.float32)
    np.savez(folder / f"{name}.calib.npz", waveform=wave[:200], y=y[:200])
    np.savez(folder / f"{name}.test.npz", waveform=wave[200:400], y=y[200:400])
    np.savez(folder / f"{name}.train.npz", waveform=wave[400:], y=y[400:])
    mel = tf.signal.linear_to_mel_weight_matrix(16, 129, RATE, 50.0, 1900.0)

    class Audio(tf.Module):
        def __init__(self):
            super().__init__()
            g = tf.random.Generator.from_seed(SEED)
            self.w = tf.Variable(g.normal((16, 4)) * 0.1)
            self.b = tf.Variable(tf.zeros(4))

        @tf.function(input_signature=[tf.TensorSpec((1, CLIP), tf.float32, name="waveform")])
        def __call__(self, waveform):
            return {"scores": tf.nn.softmax(self.logits(waveform))}

        def logits(self, waveform):
            spec = tf.abs(tf.signal.stft(waveform, 256, 128))
            logmel = tf.math.log(tf.matmul(spec * spec, mel))   # -inf on silence, as real front ends without an epsilon
            return tf.matmul(tf.reduce_mean(logmel, axis=1), self.w) + self.b

    module = Audio()
    opt = tf.keras.optimizers.Adam(0.05) if hasattr(tf, "keras") else None
    x_train, y_train = tf.constant(wave[400:]), tf.constant(y[400:])
    for _ in range(150):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                y_train, module.logits(x_train), from_logits=True))
        grads = tape.gradient(loss, [module.w, module.b])
        opt.apply_gradients(zip(grads, [module.w, module.b]))
    path = folder / name
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
    return Family(name, path, folder / f"{name}.calib.npz", folder / f"{name}.test.npz")


BUILDERS = {
    "lstm": lambda f: _sequence("lstm", f, "LSTM"),
    "gru": lambda f: _sequence("gru", f, "GRU"),
    "bilstm": lambda f: _sequence("bilstm", f, "LSTM", bidirectional=True),
    "lstm_unrolled": lambda f: _sequence("lstm_unrolled", f, "LSTM", unroll=True),
    "gru_nested": lambda f: _nested("gru_nested", f),
    "vit": lambda f: _vit("vit", f),
    "tokens": lambda f: _tokens("tokens", f),
    "conv1d": lambda f: _conv1d("conv1d", f),
    "unet_upsampling": lambda f: _unet("unet_upsampling", f, "upsampling"),
    "unet_transpose": lambda f: _unet("unet_transpose", f, "transpose"),
    "audio": lambda f: _audio("audio", f),
}


def build(name: str, folder: Path) -> Family:
    import dataclasses

    import keras

    keras.utils.set_random_seed(SEED)
    folder.mkdir(parents=True, exist_ok=True)
    fam = BUILDERS[name](Path(folder))
    return dataclasses.replace(fam, train=Path(folder) / f"{name}.train.npz")
