"""One sample reader (runtime/samples.py) behind `calib`, bench's `data`, `training.data` and
`budget.eval_data`: every format is accepted or refused the same way by all four, the only difference
being that fine-tuning and evaluation data need labels. No TensorFlow: the entry points are the readers
the pipeline and the bench harness call."""

from __future__ import annotations

import numpy as np
import pytest
from edgekit.converters.calibration import labelled_data, load_for_inputs
from edgekit.converters.loading import TensorSpec
from edgekit.runtime.model import Model
from edgekit.runtime.preprocess import PreprocessSpec
from tflite_build import Tensor, one_op

from edgekit.errors import EdgekitError
from edgekit.harness import open_data

SPEC = PreprocessSpec(8, 8, 1)
IMAGE = TensorSpec("image", (None, 8, 8, 1))
rng = np.random.default_rng(0)
RAW = (rng.random((24, 8, 8, 1)) * 255).astype(np.uint8)
LABELS = np.arange(24) % 3


def _formats(tmp):
    """{name: (path, labelled)}: what a user may hand over as samples, good and bad."""
    def npz(name, **arrays):
        np.savez(tmp / name, **arrays)
        return tmp / name

    def npy(name, array):
        np.save(tmp / name, array)
        return tmp / name

    folder = tmp / "folder"
    flat = tmp / "flat"
    import cv2

    for i, (img, label) in enumerate(zip(RAW, LABELS)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / str(label) / f"{i}.png"), img)
        flat.mkdir(exist_ok=True)
        cv2.imwrite(str(flat / f"{i}.png"), img)
    nan = RAW.astype(np.float32) / 255
    nan[3, 0, 0, 0] = np.nan
    (tmp / "notes.txt").write_text("hello")
    return {
        "class folders": (folder, True), "a folder without classes": (flat, False),
        ".npy of uint8 images": (npy("raw.npy", RAW), False),
        ".npy of float input": (npy("float.npy", RAW.astype(np.float32) / 255), False),
        ".npz x + y": (npz("x.npz", x=RAW.astype(np.float32) / 255, y=LABELS), True),
        ".npz images + y": (npz("images.npz", images=RAW, y=LABELS), True),
        ".npz inputs": (npz("inputs.npz", inputs=RAW), False),
        ".npz by input name + y": (npz("named.npz", image=RAW, y=LABELS), True),
        ".npz of (N, H, W) images": (npz("hw.npz", x=RAW[..., 0], y=LABELS), True),
        "bad: .npz of y only": (npz("y.npz", y=LABELS), None),
        "bad: .npz of two unnamed arrays": (npz("two.npz", a=RAW, b=RAW), None),
        "bad: NaN": (npy("nan.npy", nan), None),
        "bad: the wrong size": (npy("big.npy", np.zeros((4, 9, 9, 1), np.float32)), None),
        "bad: labels that are not class indices": (npz("neg.npz", x=RAW, y=-LABELS - 1), None),
        "bad: not found": (tmp / "missing.npz", None),
        "bad: a text file": (tmp / "notes.txt", None),
    }


def _outcome(read) -> str:
    try:
        n = read()
        return f"ok {n}"
    except EdgekitError:
        return "refused"


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("samples")
    path = tmp / "image.tflite"
    path.write_bytes(one_op("RELU", [Tensor((1, 8, 8, 1))], [Tensor((1, 8, 8, 1))]))
    model = Model(path)
    return _formats(tmp), {
        "calib": lambda p: len(load_for_inputs({None: p}, (IMAGE,), {"image": SPEC}, samples=None)),
        "data": lambda p: len(open_data(p).for_model(model)[2]),
        "training.data": lambda p: len(labelled_data(p, (IMAGE,), {"image": SPEC}, param="training.data")),
        "budget.eval_data": lambda p: len(labelled_data(p, (IMAGE,), {"image": SPEC}, param="budget.eval_data")),
    }


def test_every_format_is_read_by_the_same_rules_everywhere(readers):
    formats, entry_points = readers
    table = {name: {point: _outcome(lambda: read(path)) for point, read in entry_points.items()}
             for name, (path, _) in formats.items()}
    for name, (path, labelled) in formats.items():
        row = table[name]
        if labelled is None:
            assert set(row.values()) == {"refused"}, (name, row)
            continue
        assert row["calib"] == row["data"] == "ok 24", (name, row)
        want = "ok 24" if labelled else "refused"  # fine-tuning and evaluation need labels
        assert row["training.data"] == row["budget.eval_data"] == want, (name, row)


def test_refusals_name_the_parameter_and_the_file(readers, tmp_path):
    formats, _ = readers
    path = formats["bad: .npz of two unnamed arrays"][0]
    with pytest.raises(EdgekitError) as err:
        load_for_inputs({None: path}, (IMAGE,), {"image": SPEC})
    assert str(err.value).startswith(f"calib: {path} holds ['a', 'b']: name the samples 'image' or 'x'")
    with pytest.raises(EdgekitError, match=r"^training.data: .*needs labelled samples of at least two classes"):
        labelled_data(formats[".npy of uint8 images"][0], (IMAGE,), {"image": SPEC}, param="training.data")


def test_integer_inputs_keep_their_type_and_float_ids_are_refused(tmp_path):
    tokens = TensorSpec("tokens", (None, 6), "int32")
    np.savez(tmp_path / "ids.npz", x=rng.integers(0, 50, (12, 6)), y=np.arange(12) % 2)
    calib = load_for_inputs({None: tmp_path / "ids.npz"}, (tokens,), {"tokens": None}, samples=None)
    assert calib.x.dtype == np.int32 and calib.x.shape == (12, 6)
    np.save(tmp_path / "float_ids.npy", rng.random((12, 6)))
    with pytest.raises(EdgekitError, match="holds float64 values; the input 'tokens' takes int32"):
        load_for_inputs({None: tmp_path / "float_ids.npy"}, (tokens,), {"tokens": None})


def test_a_seeded_shuffle_keeps_samples_and_labels_together(readers):
    formats, _ = readers
    calib = load_for_inputs({None: formats[".npz images + y"][0]}, (IMAGE,), {"image": SPEC}, samples=10, seed=3)
    again = load_for_inputs({None: formats[".npz images + y"][0]}, (IMAGE,), {"image": SPEC}, samples=10, seed=3)
    np.testing.assert_array_equal(calib.x, again.x)
    for x, label in zip(calib.x, calib.labels):
        original = int(np.argmax([np.array_equal(x, r.astype(np.float32)) for r in RAW]))
        assert LABELS[original] == label


def test_several_inputs_from_a_folder_and_an_array_stay_paired_under_one_shuffle(tmp_path):
    """Sample i of the image folder goes with row i of the vector file, whatever the seed: one permutation
    for every source (the folder's files in their sorted order, as the reader lists them)."""
    import cv2
    from edgekit.runtime.datasets import ImageFolder

    folder = tmp_path / "images"
    folder.mkdir()
    for i, img in enumerate(RAW):
        cv2.imwrite(str(folder / f"{i:02d}.png"), img)
    order = [int(p.stem) for p in ImageFolder.scan(folder).files]
    np.save(tmp_path / "vec.npy", np.asarray(order, np.float32)[:, None].repeat(4, axis=1))
    vector = TensorSpec("vector", (None, 4))
    sources = {"image": folder, "vector": tmp_path / "vec.npy"}
    for seed in (0, 5):
        calib = load_for_inputs(sources, (IMAGE, vector), {"image": SPEC, "vector": None}, samples=10, seed=seed)
        assert len(calib) == 10
        for img, vec in zip(calib.x, calib.others[0]):
            assert np.array_equal(img, RAW[int(vec[0])].astype(np.float32))
    np.save(tmp_path / "short.npy", np.zeros((23, 4), np.float32))
    unpaired = {"image": folder, "vector": tmp_path / "short.npy"}
    calib = load_for_inputs(unpaired, (IMAGE, vector), {"image": SPEC, "vector": None}, samples=None)
    assert len(calib) == len(calib.others[0]) == 23  # ranges only: each drawn on its own, and said
    assert calib.notes == ("`calib`: the inputs' samples do not pair up (image has 24, vector has 23): each "
                           "input's are drawn on their own, as many as the fewest",)
    np.savez(tmp_path / "labelled.npz", x=RAW[:23], y=LABELS[:23])
    with pytest.raises(EdgekitError, match="must pair up, one per input: image has 23, vector has 24"):
        labelled_data({"image": tmp_path / "labelled.npz", "vector": tmp_path / "vec.npy"}, (IMAGE, vector),
                      {"image": SPEC, "vector": None}, param="training.data")


def test_held_out_samples_are_the_ones_the_calibration_shuffle_did_not_draw(tmp_path, digits_dir):
    """Verification data (`SampleData.held_out`): the same seeded shuffle continued past the calibration
    samples, so never one of them; from a folder and from arrays, cut to the count asked."""
    from edgekit.runtime.samples import SampleData

    values = np.arange(500, dtype=np.float32)[:, None]
    data = SampleData.of_arrays({"x": values}, None, "values")
    drawn = set(data.shuffled(200, 3).arrays["x"][:, 0].tolist())
    held = data.held_out(200, 3, 250).arrays["x"][:, 0].tolist()
    assert len(held) == 250 and not drawn & set(held) and len(drawn | set(held)) == 450
    assert len(data.held_out(None, 3, 10)) == 0 and len(data.held_out(500, 3, 10)) == 0
    folder = SampleData.open(digits_dir / "train")
    drawn_files = set(folder.shuffled(200, 0).folder.files)
    held_files = folder.held_out(200, 0, 200).folder.files
    assert len(held_files) == 200 and not drawn_files & set(held_files)
