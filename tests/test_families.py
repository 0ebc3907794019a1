"""Model families the image tests never built (issue 28), one small trained model each (tests/families.py),
each compared with the float model on held-out samples and, where it makes a file, with the plain
`tf.lite.TFLiteConverter` on the same calibration samples. The whole matrix (every family x mode x training
x command) is scripts/family_table.py, run by tests/test_family_matrix.py in the slow tier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from families import build
from helpers import run_cli

import edgekit
from edgekit.runtime import Model

from edgekit.errors import InputShapeError

PLAIN_INT8 = r'''
import sys, numpy as np, keras, tensorflow as tf
m = keras.models.load_model(sys.argv[1])
x = np.load(sys.argv[2])["x"]
inp = keras.Input(batch_shape=(1, *m.input_shape[1:]))
fixed = keras.Model(inp, m(inp))
c = tf.lite.TFLiteConverter.from_keras_model(fixed)
c.optimizations = [tf.lite.Optimize.DEFAULT]
c.representative_dataset = lambda: ([s[None]] for s in x[:50])
c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
c.convert()
print("converted")
'''


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    return lambda name: _built(name, folder)


_BUILT: dict[tuple[str, Path], object] = {}


def _built(name: str, folder: Path):
    if (name, folder) not in _BUILT:
        _BUILT[name, folder] = build(name, folder)
    return _BUILT[name, folder]


def _held_out(fam):
    data = np.load(fam.test)
    key = next(k for k in data.files if k != "y")
    return data[key], data["y"]


def _float_outputs(fam, x):
    import keras

    return keras.models.load_model(fam.model).predict(x, verbose=0, batch_size=64)


def _agreement(model: Model, x: np.ndarray, reference: np.ndarray) -> float:
    got = np.concatenate([model.predict(x[i:i + 1]) for i in range(len(x))])
    return float(np.mean(got.argmax(-1) == reference.argmax(-1)))


@pytest.mark.slow
def test_the_plain_converter_crashes_on_a_rolled_lstm_at_int8(families, tmp_path):
    """The premise: TFLite's calibrator segfaults on the fused LSTM op a rolled LSTM becomes at batch 1."""
    fam = families("lstm")
    proc = subprocess.run([sys.executable, "-c", PLAIN_INT8, str(fam.model), str(fam.calib)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-500:])


@pytest.mark.parametrize("name", ["lstm", *(pytest.param(n, marks=pytest.mark.slow)
                                             for n in ("gru", "bilstm", "gru_nested"))])
def test_recurrences_with_an_open_batch_convert_and_quantize(families, tmp_path, name):
    """Keras's open batch is set to 1 (the plain converter fails on TensorList ops there), and int8 unrolls the
    recurrence over its 8 steps (the plain converter crashes): agreement with the float model on 300
    held-out samples, as the unrolled model's plain int8 reaches (98.0 % for the LSTM)."""
    fam = families(name)
    x, y = _held_out(fam)
    reference = _float_outputs(fam, x)
    said = []
    f16 = edgekit.convert(fam.model, mode="float16", output=tmp_path / "f16.tflite", progress=said.append)
    int8 = edgekit.convert(fam.model, mode="int8", calib=fam.calib, output=tmp_path / "int8.tflite",
                           progress=said.append)
    assert any("converting at batch 1" in s for s in said) and any("unrolled the recurrent layer" in s for s in said)
    agree = {m: _agreement(Model(r.path), x, reference) for m, r in (("float16", f16), ("int8", int8))}
    top1 = float(np.mean(reference.argmax(-1) == y))
    print(f"\n{name}: float top-1 {top1:.3f}; agreement on 300 held-out {agree}")
    assert top1 >= 0.8 and agree["float16"] >= 0.99 and agree["int8"] >= 0.97  # the nested GRU: 0.83
    assert Model(int8.path).inputs[0].shape == (1, 8, 8)


@pytest.mark.slow
def test_an_open_number_of_steps_is_refused_for_int8_naming_input_shape(tmp_path):
    import keras

    inp = keras.Input((None, 8), name="steps")
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.LSTM(4, name="rnn")(inp)))
    model.save(tmp_path / "open.keras")
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).standard_normal((20, 8, 8)).astype(np.float32))
    result = run_cli("convert", str(tmp_path / "open.keras"), "--int8", "--calib", str(tmp_path / "calib.npy"),
                     "-o", str(tmp_path / "open.tflite"))
    assert result.returncode == 5 and len(result.error_lines) == 1, result.stderr
    assert "rnn" in result.stderr and "--input-shape 1,STEPS,FEATURES" in result.stderr
    assert not (tmp_path / "open.tflite").exists()
    fixed = run_cli("convert", str(tmp_path / "open.keras"), "--int8", "--calib", str(tmp_path / "calib.npy"),
                    "--input-shape", "1,8,8", "-o", str(tmp_path / "fixed.tflite"))
    assert fixed.returncode == 0, fixed.stderr


@pytest.mark.slow
def test_int16x8_of_an_unrolled_lstm_runs_where_the_plain_file_does(families, tmp_path):
    """int16x8 gives the LSTM's zero state a scale of 0, which the preflight refused in convert, bench and
    run while LiteRT runs the file: the same agreement as the plain converter's file."""
    import tensorflow as tf

    fam = families("lstm_unrolled")
    x, _ = _held_out(fam)
    reference = _float_outputs(fam, x)
    ours = edgekit.convert(fam.model, mode="int16x8", calib=fam.calib, output=tmp_path / "ours.tflite")
    import keras

    plain = tf.lite.TFLiteConverter.from_keras_model(keras.models.load_model(fam.model))
    plain.optimizations = [tf.lite.Optimize.DEFAULT]
    plain.representative_dataset = lambda: ([s[None]] for s in np.load(fam.calib)["x"])
    plain.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    (tmp_path / "plain.tflite").write_bytes(plain.convert())
    agree = {name: _agreement(Model(path), x, reference) for name, path in
             (("edgekit", ours.path), ("plain", tmp_path / "plain.tflite"))}
    print(f"\nunrolled LSTM int16x8, 300 held-out: {agree}")
    assert agree["edgekit"] >= agree["plain"] - 0.005 and agree["edgekit"] >= 0.97
    bench = run_cli("bench", str(tmp_path / "plain.tflite"), "--runs", "3", "--warmup", "1")
    assert bench.returncode == 0, bench.stderr


def test_a_native_crash_in_the_conversion_is_one_line_and_writes_nothing(families, tmp_path):
    """edgekit convert runs TensorFlow in a child process: the child dying of SIGSEGV mid-conversion (as TF's
    calibrator does on the fused LSTM) is exit 5 and one line naming the signal and the step; no file."""
    fam = families("gru")
    out = tmp_path / "crash.tflite"
    cmd = [sys.executable, "-m", "edgekit", "convert", str(fam.model), "--int8", "--calib", str(fam.calib),
           "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    child = _wait_for_child(proc.pid)
    time.sleep(4)  # TensorFlow imported, the model loading or converting
    os.kill(child, signal.SIGSEGV)
    stdout, stderr = proc.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("Running Calibration")]
    assert proc.returncode == 5, stderr
    assert len(lines) == 1 and "TensorFlow crashed (SIGSEGV) while" in lines[0], stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_native_crash_in_one_sweep_variant_is_that_variants_failure(digits_keras, digits_dir, tmp_path):
    """edgekit sweep converts each variant in a child process too: the first one dying of SIGSEGV is listed
    as failed, with the signal, and the sweep measures the others."""
    import json

    cmd = [sys.executable, "-m", "edgekit", "sweep", str(digits_keras), "--calib", str(digits_dir / "train"),
           "--eval-data", str(digits_dir / "test"), "--runs", "5", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    child = _wait_for_child(proc.pid)
    time.sleep(2)
    os.kill(child, signal.SIGSEGV)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    report = json.loads(stdout)
    failed = report["failed"]
    assert len(failed) == 1 and "TensorFlow crashed (SIGSEGV)" in failed[0]["error"], failed
    assert len(report["rows"]) >= 4, [r["variant"] for r in report["rows"]]


def _wait_for_child(pid: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        for c in children:
            try:
                if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                    return int(c)
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError("no conversion child appeared")


def test_a_probe_the_float_model_cannot_answer_is_not_a_refusal(families, tmp_path):
    """A log-mel front end is -inf on the silent probe input, which refused a good float16 file ("outputs NaN"):
    the float model's own answer is checked first, and the file is checked on seeded noise instead. Dynamic
    range quantization zeroes mel bands (the plain converter's file too: NaN on every real clip), which the
    verification on real clips refuses; int8 from calibration clips verifies at >= 40 dB."""
    fam = families("audio")
    result = run_cli("convert", str(fam.model), "--float16", "-o", str(tmp_path / "a.tflite"))
    assert result.returncode == 0, result.stderr
    dynamic = run_cli("convert", str(fam.model), "--dynamic", "--calib", str(fam.calib),
                      "-o", str(tmp_path / "d.tflite"))
    assert dynamic.returncode == 5 and len(dynamic.error_lines) == 1 and "NaN" in dynamic.stderr, dynamic.stderr
    calibrated = edgekit.convert(fam.model, mode="int8", calib=fam.calib, output=tmp_path / "a8.tflite")
    assert calibrated.verification["snr_db"] >= 40


def test_a_mask_is_agreed_on_per_pixel_in_bench_and_verification(families, tmp_path):
    """A segmentation mask agrees per pixel (it was the one hottest pixel: 19 % for a 99 % mask), and the
    output's role is stored as a mask. The U-Net is open-size: its int8 ranges were collected at size 1
    (exit 70, conv.cc "input->dims->data[1] > 0"); they run at the calibration samples' size, and the file
    stays open."""
    fam = families("unet_transpose")
    result = edgekit.convert(fam.model, mode="int8", calib=fam.calib, output=tmp_path / "u8.tflite")
    assert Model(result.path).inputs[0].shape_signature[1:] == (-1, -1, 1)
    assert result.metadata["outputs"][0]["role"] == "mask"
    assert result.verification["top1_agreement"] >= 0.97
    bench = run_cli("bench", str(result.path), "--reference", str(fam.model), "--data", str(fam.test), "--json",
                    str(tmp_path / "b.json"), "--runs", "3", "--warmup", "1")
    assert bench.returncode == 0, bench.stderr
    import json

    accuracy = json.loads((tmp_path / "b.json").read_text())["models"][0]["accuracy"]
    print(f"\nU-Net int8 on 300 held-out: agreement {accuracy['agreement']}, SNR {accuracy['snr_db']} dB")
    assert accuracy["agreement"] >= 0.97


@pytest.mark.slow
def test_int16x8_of_a_token_model_is_refused_saying_why(families, tmp_path):
    fam = families("tokens")
    result = run_cli("convert", str(fam.model), "--int16x8", "--calib", str(fam.calib),
                     "-o", str(tmp_path / "t.tflite"))
    assert result.returncode == 5 and len(result.error_lines) == 1, result.stderr
    assert "integer input 'tokens'" in result.stderr and "--int8" in result.stderr


@pytest.fixture(scope="module")
def proposal_net(tmp_path_factory):
    """A face-proposal-style net at an open size (MTCNN's P-Net shape: three valid convolutions and a pool, a
    class map and a box map), converted to float16 without `input_shape`."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((None, None, 3), name="image")
    h = keras.layers.MaxPooling2D(2)(keras.layers.Conv2D(10, 3, activation="relu")(inp))
    h = keras.layers.Conv2D(32, 3, activation="relu")(keras.layers.Conv2D(16, 3, activation="relu")(h))
    model = keras.Model(inp, [keras.layers.Conv2D(2, 1, activation="softmax", name="prob")(h),
                              keras.layers.Conv2D(4, 1, name="box")(h)])
    folder = tmp_path_factory.mktemp("pnet")
    model.save(folder / "pnet.keras")
    np.save(folder / "x.npy", np.random.default_rng(0).random((4, 40, 40, 3)).astype(np.float32))
    result = run_cli("convert", str(folder / "pnet.keras"), "--float16", "-o", str(folder / "pnet.tflite"))
    assert result.returncode == 0, result.stderr  # it was: XNNPack delegate failed to reshape runtime
    return folder, model


def test_an_open_size_net_that_cannot_run_at_size_1_loads_and_runs_at_real_sizes(proposal_net):
    folder, keras_model = proposal_net
    model = Model(folder / "pnet.tflite")
    assert model.unsized
    for size in (48, 96):
        x = np.random.default_rng(size).random((2, size, size, 3)).astype(np.float32)
        got, want = model.predict(x), keras_model.predict(x, verbose=0)
        assert np.max(np.abs(got["prob"] - want[0])) < 1e-2 and got["box"].shape == want[1].shape
    with pytest.raises(InputShapeError, match="open size"):
        model.predict(np.zeros((1, 1, 1, 3), np.float32))


def test_bench_times_an_open_size_at_the_data_size_and_says_so(proposal_net, tmp_path):
    folder, _ = proposal_net
    result = run_cli("bench", str(folder / "pnet.tflite"), "--data", str(folder / "x.npy"), "--runs", "3",
                     "--warmup", "1")
    assert result.returncode == 0, result.stderr
    assert "pnet.tflite: open input size, timed at [1, 40, 40, 3]" in result.stdout
    bare = run_cli("bench", str(folder / "pnet.tflite"), "--runs", "3")
    assert bare.returncode == 6 and len(bare.error_lines) == 1 and "pass --data" in bare.stderr, bare.stderr


def test_an_open_size_model_that_does_not_convert_open_converts_at_the_calibration_size(families, tmp_path):
    """UpSampling2D at an open size fails in the converter (the plain one too); with calibration samples
    edgekit converts at their size and warns that the file takes that size only."""
    fam = families("unet_upsampling")
    result = run_cli("convert", str(fam.model), "--int8", "--calib", str(fam.calib), "-o", str(tmp_path / "u.tflite"))
    assert result.returncode == 0, result.stderr
    assert "converted at the calibration samples' size, image=[1, 32, 32, 1]" in result.stdout
    x = np.load(fam.test)["x"]
    reference = _float_outputs(fam, x)
    got = Model(tmp_path / "u.tflite").predict(x)
    assert float(np.mean((got > 0.5) == (reference > 0.5))) >= 0.97


def test_prune_and_qat_of_an_attention_model(tmp_path):
    """MultiHeadAttention through the tf_keras bridge (it was exit 70, KeyError 'query_shape'): QAT keeps it
    float and says so; pruning prunes its query, key, value and output projections."""
    import keras
    from sklearn.datasets import load_digits

    keras.utils.set_random_seed(0)
    d = load_digits()
    x, y = (d.images / 16.0).astype(np.float32)[..., None], d.target
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Reshape((16, 32))(keras.layers.Conv2D(32, 2, strides=2, name="patches")(inp))
    a = keras.layers.LayerNormalization(name="ln0")(h)
    h = keras.layers.Add()([h, keras.layers.MultiHeadAttention(4, 8, name="mha0")(a, a)])
    h = keras.layers.Flatten()(keras.layers.Dense(16, activation="gelu", name="mlp")(h))  # keeps positions
    model = keras.Model(inp, keras.layers.Dense(10, activation="softmax", name="probs")(h))
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[500:], y[500:], epochs=30, verbose=0)
    model.save(tmp_path / "attn.keras")
    np.savez(tmp_path / "train.npz", x=x[500:900], y=y[500:900])
    np.savez(tmp_path / "val.npz", x=x[200:500], y=y[200:500])
    common = ["--int8", "--train-data", str(tmp_path / "train.npz"), "--val-data", str(tmp_path / "val.npz"),
              "--epochs", "1", "--json"]
    qat = run_cli("convert", str(tmp_path / "attn.keras"), "--qat", *common, "-o", str(tmp_path / "q.tflite"))
    assert qat.returncode == 0, qat.stderr
    report = __import__("json").loads(qat.stdout)["compression"]
    assert report["qat"]["kept_float"].get("mha0") == "MultiHeadAttention"
    accuracy = report["accuracy"]
    print(f"\nattention model QAT int8: top-1 float {accuracy['float']:.3f} -> final {accuracy['final']:.3f}")
    assert accuracy["float"] >= 0.8 and accuracy["final"] >= accuracy["float"] - 0.02
    pruned = run_cli("convert", str(tmp_path / "attn.keras"), "--prune", "0.5", *common,
                     "-o", str(tmp_path / "p.tflite"))
    assert pruned.returncode == 0, pruned.stderr
    report = __import__("json").loads(pruned.stdout)["compression"]
    mha = [k for k in report["kernels"] if k["layer"] == "mha0"]
    assert "mha0" in report["prune"]["layers"] and len(mha) == 4  # query, key, value and output projections
    assert all(abs(k["sparsity"] - 0.5) < 0.01 for k in mha), mha


def test_verification_runs_on_samples_not_used_for_calibration(families, tmp_path):
    """A calibration source with more samples than are drawn verifies on the next ones of the same seeded
    shuffle, and says so in the metadata; one with no more verifies on the calibration samples, and says so."""
    fam = families("tokens")
    x, y = _held_out(fam)
    np.savez(tmp_path / "many.npz", x=np.concatenate([np.load(fam.calib)["x"], x]))
    many = edgekit.convert(fam.model, mode="int8", calib=tmp_path / "many.npz", output=tmp_path / "m.tflite")
    few = edgekit.convert(fam.model, mode="int8", calib=fam.calib, output=tmp_path / "f.tflite")
    assert (many.verification["data"], many.verification["samples"]) == ("held-out", 200)
    assert (few.verification["data"], few.verification["samples"]) == ("calibration", 200)


@pytest.mark.slow
def test_qat_of_a_rolled_lstm(families, tmp_path):
    """QAT of a rolled LSTM: the tf_keras twin runs it unrolled over its 8 steps (the fused sequence op could
    not carry QAT's fake quantization: "We cannot duplicate the value since it's not constant"), kept float
    with its output quantized; held-out top-1 stays within a point of float's."""
    import json

    fam = families("lstm")
    result = run_cli("convert", str(fam.model), "--qat", "--int8", "--train-data", str(fam.calib), "--val-data",
                     str(fam.test), "--epochs", "1", "--json", "-o", str(tmp_path / "q.tflite"))
    assert result.returncode == 0, result.stderr
    compression = json.loads(result.stdout)["compression"]
    accuracy = compression["accuracy"]
    assert compression["qat"]["kept_float"].get("lstm") == "LSTM"
    assert accuracy["final"] >= accuracy["float"] - 0.01, accuracy


def test_qat_of_a_token_model_keeps_the_embedding_float(families, tmp_path):
    """tfmot put a QuantizeLayer on the int32 ids (exit 70, TypeError in AllValuesQuantize): a layer fed an
    integer tensor stays float and is listed; the rest trains quantized at float's held-out top-1."""
    import json

    fam = families("tokens")
    result = run_cli("convert", str(fam.model), "--qat", "--int8", "--train-data", str(fam.calib), "--val-data",
                     str(fam.test), "--epochs", "1", "--json", "-o", str(tmp_path / "q.tflite"))
    assert result.returncode == 0, result.stderr
    compression = json.loads(result.stdout)["compression"]
    assert compression["qat"]["kept_float"].get("emb") == "Embedding"
    assert compression["accuracy"]["final"] >= compression["accuracy"]["float"] - 0.01


@pytest.mark.slow
def test_a_model_the_bridge_cannot_rebuild_is_refused_in_one_line(families, tmp_path):
    """The ViT adds a (16, 32) position table to (None, 16, 32) patches with keras.ops (exit 70, then exit 3:
    tf_keras's Add does not broadcast a constant): it is rebuilt as a frozen constant and trains. A keras.ops
    call with no tf_keras twin (a sort) is one line naming it (exit 3)."""
    import keras

    fam = families("vit")
    result = run_cli("convert", str(fam.model), "--qat", "--int8", "--train-data", str(fam.calib), "--epochs", "1",
                     "-o", str(tmp_path / "v.tflite"))
    assert result.returncode == 0, result.stderr
    inp = keras.Input((8,), name="x")
    out = keras.layers.Dense(3, name="head")(keras.ops.sort(keras.layers.Dense(8, name="d")(inp)))
    keras.Model(inp, out).save(tmp_path / "sorted.keras")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32),
             y=np.arange(40) % 3)
    refused = run_cli("convert", str(tmp_path / "sorted.keras"), "--qat", "--int8", "--train-data",
                      str(tmp_path / "d.npz"), "--epochs", "1", "-o", str(tmp_path / "s.tflite"))
    assert refused.returncode == 3 and len(refused.error_lines) == 1 and "'sort'" in refused.stderr, refused.stderr


def _pruned_and_trained(fam, out: Path) -> dict:
    """`--int8 --prune 0.5 --qat`, 3 epochs on the family's calibration samples, scored on its held-out ones:
    the file's `compression` report."""
    import json

    result = run_cli("convert", str(fam.model), "--int8", "--calib", str(fam.calib), "--prune", "0.5", "--qat",
                     "--train-data", str(fam.calib), "--val-data", str(fam.test), "--epochs", "3", "--json",
                     "-o", str(out))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["compression"]


def test_fine_tuning_two_heads_trains_each_towards_its_own_targets(families, tmp_path):
    """The 1-D conv's two heads (classes and a value) fine-tune from one .npz keyed by output name (it was
    refused: one input, one output and class labels only): cross-entropy on `band`, squared error on
    `amplitude`, each scored on held-out data before and after, the classes by top-1 in `accuracy`."""

    fam = families("conv1d")
    c = _pruned_and_trained(fam, tmp_path / "c.tflite")
    assert c["metrics"] == {"band": "top-1", "amplitude": "mse"}
    scores = c["scores"]
    print(f"\ntwo heads, prune 0.5 + QAT int8: band top-1 {scores['float']['band']:.3f} -> "
          f"{scores['final']['band']:.3f}, amplitude mse {scores['float']['amplitude']:.4f} -> "
          f"{scores['final']['amplitude']:.4f}")
    assert c["accuracy"]["final"] == scores["final"]["band"] >= scores["float"]["band"] - 0.01
    assert scores["final"]["amplitude"] <= 0.1  # amplitudes span 0.5..2: a head that learnt nothing is ~0.19
    assert c["prune"]["achieved"] >= 0.45
    data = np.load(fam.calib)
    np.savez(tmp_path / "only_y.npz", x=data["x"], y=data["y"])
    missing = run_cli("convert", str(fam.model), "--int8", "--calib", str(fam.calib), "--prune", "0.5",
                      "--train-data", str(tmp_path / "only_y.npz"), "-o", str(tmp_path / "m.tflite"))
    assert missing.returncode == 4 and len(missing.error_lines) == 1, missing.stderr
    assert "band, amplitude" in missing.stderr and not (tmp_path / "m.tflite").exists()


@pytest.mark.slow
def test_channel_pruning_distils_each_head_of_a_two_head_model(families, tmp_path):
    """`--distill 1` with channel pruning: the 1-D conv's two heads fine-tune towards the original model's
    outputs, the tempered class scores of `band` and the values of `amplitude`. (Amplitude mse after 3 epochs:
    0.039 on the labels alone, 0.053 distilled; band stays at 1.000 either way.)"""
    import json

    fam = families("conv1d")
    result = run_cli("convert", str(fam.model), "--int8", "--calib", str(fam.calib), "--prune", "0.5",
                     "--prune-structure", "channels", "--distill", "1", "--train-data", str(fam.calib),
                     "--val-data", str(fam.test),
                     "--epochs", "3", "--json", "-o", str(tmp_path / "c.tflite"))
    assert result.returncode == 0, result.stderr
    c = json.loads(result.stdout)["compression"]
    scores = c["scores"]
    print(f"\ntwo heads, channels 0.5 distilled, int8: band top-1 {scores['float']['band']:.3f} -> "
          f"{scores['final']['band']:.3f}, amplitude mse {scores['float']['amplitude']:.4f} -> "
          f"{scores['final']['amplitude']:.4f}; multiply-adds {c['prune']['channels']['macs']}")
    assert c["distill"] == {"outputs": {"band": 1.0, "amplitude": 1.0}, "temperature": 4.0}
    assert c["prune"]["channels"]["macs"][1] < 0.5 * c["prune"]["channels"]["macs"][0]
    assert scores["final"]["band"] >= scores["float"]["band"] - 0.02
    assert scores["final"]["amplitude"] <= 0.1


@pytest.mark.slow
def test_pruning_a_segmentation_net_distils_its_masks(families, tmp_path):
    """`--distill 0.5` with unstructured pruning: the U-Net's pruned model learns the original's tempered
    per-pixel mask logits beside the masks (binary targets)."""
    import json

    fam = families("unet_transpose")
    result = run_cli("convert", str(fam.model), "--int8", "--calib", str(fam.calib), "--prune", "0.5",
                     "--distill", "0.5", "--train-data", str(fam.calib), "--val-data", str(fam.test),
                     "--epochs", "3", "--json", "-o", str(tmp_path / "u.tflite"))
    assert result.returncode == 0, result.stderr
    c = json.loads(result.stdout)["compression"]
    print(f"\nU-Net prune 0.5 distilled (0.5), int8: pixel accuracy {c['accuracy']['float']:.4f} -> "
          f"{c['accuracy']['final']:.4f}")
    assert c["distill"] == {"outputs": {"mask": 0.5}, "temperature": 4.0} and c["prune"]["achieved"] >= 0.45
    assert c["accuracy"]["final"] >= c["accuracy"]["float"] - 0.02


@pytest.mark.slow
def test_fine_tuning_a_segmentation_net_on_masks_at_an_open_size(families, tmp_path):
    """The open-size U-Net prunes and trains quantized towards its masks (binary cross-entropy, agreement per
    pixel): masks were refused as labels, and the QAT file, written at size 1 where its skip join cannot
    run, was refused by the probe; it is probed at 64x64."""

    fam = families("unet_transpose")
    c = _pruned_and_trained(fam, tmp_path / "u.tflite")
    assert c["metrics"] == {"mask": "accuracy"}
    print(f"\nU-Net prune 0.5 + QAT int8: pixel accuracy {c['accuracy']['float']:.4f} -> {c['accuracy']['final']:.4f}")
    assert c["accuracy"]["float"] >= 0.97 and c["accuracy"]["final"] >= c["accuracy"]["float"] - 0.02
    model = Model(tmp_path / "u.tflite")
    x = np.load(fam.test)["x"][:4]
    assert model.predict(x).shape == (4, 32, 32, 1)
    assert model.predict(np.zeros((2, 48, 40, 1), np.float32)).shape == (2, 48, 40, 1)  # still open


@pytest.mark.slow
def test_pruning_reaches_embedding_tables(families, tmp_path):
    """tfmot prunes Embedding, LSTM and GRU weights; edgekit refused them. The token model's table is pruned
    unstructured (its TFLite gather has no kernel axis), a structured pattern is refused naming the layer."""
    import json

    fam = families("tokens")
    result = run_cli("convert", str(fam.model), "--dynamic", "--prune", "0.5", "--train-data", str(fam.calib),
                     "--val-data", str(fam.test), "--epochs", "2", "--json", "-o", str(tmp_path / "t.tflite"))
    assert result.returncode == 0, result.stderr
    c = json.loads(result.stdout)["compression"]
    assert "emb" in c["prune"]["layers"]
    assert c["accuracy"]["final"] >= c["accuracy"]["float"] - 0.01, c["accuracy"]
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(tmp_path / "t.tflite"))
    tables = [interp.get_tensor(d["index"]) for d in interp.get_tensor_details() if tuple(d["shape"]) == (1000, 16)]
    assert tables and float(np.mean(tables[0] == 0)) >= 0.45
    structured = run_cli("convert", str(fam.model), "--dynamic", "--prune", "0.5", "--prune-structure", "2:4",
                         "--train-data", str(fam.calib), "--epochs", "1", "-o", str(tmp_path / "s.tflite"))
    assert structured.returncode == 3 and "'emb'" in structured.stderr and len(structured.error_lines) == 1


@pytest.mark.slow
def test_pruning_a_recurrence(families, tmp_path):
    """An LSTM's gate matrices pruned 50 % (unstructured, as tfmot does), fine-tuned 3 epochs on its training
    split, converted to int8 over its unrolled steps, within three points of float's held-out top-1 (the
    family table measured 89.7 -> 87.7 %; on the 200 calibration samples alone it falls 10 points)."""
    import json

    fam = families("lstm")
    result = run_cli("convert", str(fam.model), "--int8", "--calib", str(fam.calib), "--prune", "0.5",
                     "--train-data", str(fam.train), "--val-data", str(fam.test), "--epochs", "3", "--json",
                     "-o", str(tmp_path / "l.tflite"))
    assert result.returncode == 0, result.stderr
    c = json.loads(result.stdout)["compression"]
    print(f"\nLSTM prune 0.5 int8: top-1 {c['accuracy']['float']:.3f} -> {c['accuracy']['final']:.3f}")
    assert "lstm" in c["prune"]["layers"]
    assert c["accuracy"]["final"] >= c["accuracy"]["float"] - 0.03, c["accuracy"]


def test_run_takes_array_samples_of_any_family(families, tmp_path):
    """`edgekit run --source data.npz` runs each sample of a .npy/.npz through the model (it read only images
    and video): the two-head signal net gives both outputs, the token model its classes from int32 ids,
    each as Model.predict says; there is nothing to draw (one line, exit 2)."""
    import json

    conv, tokens = families("conv1d"), families("tokens")
    for fam in (conv, tokens):
        r = run_cli("convert", str(fam.model), "--float16", "-o", str(tmp_path / f"{fam.name}.tflite"))
        assert r.returncode == 0, r.stderr
    ran = run_cli("run", str(tmp_path / "conv1d.tflite"), "--source", str(conv.test), "--max-frames", "5", "--json")
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    assert lines[-1]["summary"]["frames"] == 5 and lines[-1]["summary"]["task"] == "raw"
    got = Model(tmp_path / "conv1d.tflite").predict(np.load(conv.test)["x"][:5])
    for line in lines[:5]:
        by_name = {r["name"]: r for r in line["results"]}
        assert by_name["amplitude"]["values"] == pytest.approx(got["amplitude"][line["frame"]].tolist(), abs=1e-5)
        assert np.argmax(by_name["band"]["values"]) == np.argmax(got["band"][line["frame"]])
    ran = run_cli("run", str(tmp_path / "tokens.tflite"), "--source", str(tokens.test), "--json")
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    assert lines[-1]["summary"]["task"] == "classify" and lines[-1]["summary"]["frames"] == 300
    ids, labels = np.load(tokens.test)["x"], np.load(tokens.test)["y"]
    best = Model(tmp_path / "tokens.tflite").predict(ids).argmax(-1)
    assert [line["results"][0]["index"] for line in lines[:-1]] == best.tolist()
    assert np.mean(best == labels) >= 0.9
    drawn = run_cli("run", str(tmp_path / "tokens.tflite"), "--source", str(tokens.test), "--save-dir",
                    str(tmp_path / "out"))
    assert drawn.returncode == 2 and len(drawn.error_lines) == 1 and not (tmp_path / "out").exists()


def test_fine_tuning_a_model_with_two_inputs(tmp_path):
    """An image and a side vector, one .npz keyed by input name with `y`: pruned and trained quantized (it was
    refused: one input only), each input's QAT range started from its own samples, held-out top-1 kept."""
    import json

    import keras
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.images / 16.0).astype(np.float32)[..., None], d.target
    side = np.eye(4, dtype=np.float32)[y % 4] + np.random.default_rng(0).normal(0, 0.1, (len(y), 4)).astype(np.float32)
    keras.utils.set_random_seed(0)
    image, meta = keras.Input((8, 8, 1), name="image"), keras.Input((4,), name="meta")
    h = keras.layers.Flatten()(keras.layers.Conv2D(8, 3, activation="relu", name="c")(image))
    h = keras.layers.Concatenate()([h, keras.layers.Dense(8, activation="relu", name="m")(meta)])
    model = keras.Model([image, meta], keras.layers.Dense(10, activation="softmax", name="probs")(h))
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit([x[500:], side[500:]], y[500:], epochs=10, verbose=0)
    model.save(tmp_path / "two.keras")
    np.savez(tmp_path / "train.npz", image=x[500:], meta=side[500:], y=y[500:])
    np.savez(tmp_path / "val.npz", image=x[200:500], meta=side[200:500], y=y[200:500])
    np.savez(tmp_path / "calib.npz", image=x[:200], meta=side[:200])
    result = run_cli("convert", str(tmp_path / "two.keras"), "--int8", "--calib", str(tmp_path / "calib.npz"),
                     "--prune", "0.5", "--qat", "--train-data", str(tmp_path / "train.npz"), "--val-data",
                     str(tmp_path / "val.npz"), "--epochs", "2", "--json", "-o", str(tmp_path / "two.tflite"))
    assert result.returncode == 0, result.stderr
    c = json.loads(result.stdout)["compression"]
    assert c["accuracy"]["float"] >= 0.9 and c["accuracy"]["final"] >= c["accuracy"]["float"] - 0.01, c["accuracy"]
    assert set(c["prune"]["layers"]) == {"c", "m", "probs"}
    assert c["qat"]["activation_ranges"] >= 2  # at least the two inputs' ranges
