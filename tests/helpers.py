"""Test helpers: run the CLI in a fresh interpreter, watching (and optionally blocking) TensorFlow imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

WATCHED = ("tensorflow", "keras", "tf_keras", "tensorflow_model_optimization")

# A meta-path finder that sees every lookup of a TensorFlow-family name before the real finders do. It
# tells an import (the `import` statement, importlib.import_module: importlib's _find_and_load is on the
# stack) from a probe (importlib.util.find_spec, as `edgekit doctor` does), records both, and with
# block=True makes the name unimportable, as on a device without TensorFlow.
WATCH = """
import sys, importlib.abc, json
_WATCHED = {watched!r}
_BLOCK = {block!r}
_BLOCK_NAMES = {names!r}
_imports, _probes = {{}}, []
class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in _BLOCK_NAMES:
            raise ImportError(f'No module named {{name!r}} (blocked by the test)')
        top = name.split('.')[0]
        if top not in _WATCHED:
            return None
        frame, importing, site = sys._getframe(1), False, None
        while frame is not None:
            code = frame.f_code
            if code.co_name == '_find_and_load_unlocked':
                importing = True
            elif site is None and not code.co_filename.startswith('<frozen'):
                site = f'{{code.co_filename}}:{{frame.f_lineno}}'
            frame = frame.f_back
        if importing:
            _imports.setdefault(top, f'{{name}} from {{site}}')
        elif top not in _probes:
            _probes.append(top)
        if _BLOCK:
            raise ImportError(f'No module named {{name!r}} (blocked by the test)')
        return None
sys.meta_path.insert(0, _Watch())
"""

RUN_CLI = """
from edgekit.cli import main
try:
    main(sys.argv[1:], prog_name='edgekit')
finally:
    with open({report!r}, 'w') as _fh:
        json.dump({{'modules': sorted(m for m in _WATCHED if m in sys.modules), 'imports': _imports,
                   'probes': sorted(_probes)}}, _fh)
"""


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str  # the child's whole stderr
    # None when the child died before reporting (killed, crashed, os._exit): nothing is known then
    modules: list[str] | None  # TensorFlow-family modules loaded when the command ended
    imports: list[str] | None  # TensorFlow-family names something tried to import (blocked or not)
    probes: list[str] | None = None  # names only looked up with importlib.util.find_spec
    import_sites: dict[str, str] = field(default_factory=dict)  # name -> "module from file:line" of the first try

    @property
    def finished(self) -> bool:
        """The CLI's main() returned or raised in the child (it was not killed before it could report)."""
        return self.modules is not None

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_cli(*args: str, block_tf: bool = False, block: tuple[str, ...] = (), cwd=None, timeout: float = 600,
            env: dict | None = None) -> CliResult:
    """`edgekit ARGS` in a subprocess (environment `env`, default this one's); reports which TensorFlow-family
    modules it tried to import and which it loaded. With block_tf=True those imports fail, as on a device
    without TensorFlow; the modules named in `block` fail too (e.g. LiteRT's schema module, which
    tflite-runtime does not have)."""
    fd, report = tempfile.mkstemp(prefix="edgekit-cli-", suffix=".json")
    os.close(fd)
    code = "import sys, json\n" + WATCH.format(watched=WATCHED, block=block_tf, names=tuple(block)) + RUN_CLI.format(report=report)
    env = dict(os.environ if env is None else env, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("EDGEKIT_DEBUG", None)
    try:
        proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, env=env, timeout=timeout)
        with open(report) as fh:
            text = fh.read()
    finally:
        os.unlink(report)
    if not text:
        return CliResult(proc.returncode, proc.stdout, proc.stderr, None, None)
    seen = json.loads(text)
    return CliResult(proc.returncode, proc.stdout, proc.stderr, seen["modules"], sorted(seen["imports"]),
                     seen["probes"], seen["imports"])


def labelled_images(folder, spec):
    """(float32 images prepared as `spec` says, integer labels) of an image class folder."""
    import numpy as np

    from edgekit.runtime import ImageFolder, load_and_prepare

    f = ImageFolder.scan(folder)
    x = np.stack([load_and_prepare(p, spec) for p in f.files]).astype(np.float32)
    return x, np.asarray([int(f.classes[i]) for i in f.labels])


RUN_MANY = """
import contextlib, io, json, re, sys
from edgekit.cli import main
results = []
for argv in json.load(open(sys.argv[1])):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv, prog_name='edgekit')
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    results.append([code, out.getvalue(), err.getvalue()])
peak = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024
print(json.dumps({"results": results, "peak_mb": peak}))
"""


@dataclass
class ManyResult:
    runs: list[CliResult]
    peak_mb: int  # the child's peak resident memory over all the runs (VmHWM: not the parent's, as ru_maxrss is)


def run_cli_many(argvs: list[list[str]], *, cwd=None, timeout: float = 600, env: dict | None = None) -> ManyResult:
    """Several `edgekit ARGS` one after the other in one fresh interpreter (one import of edgekit, and of
    TensorFlow when a command needs it): for tests that try many files the same way."""
    fd, spec = tempfile.mkstemp(prefix="edgekit-many-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump([[str(a) for a in argv] for argv in argvs], fh)
    try:
        proc = subprocess.run([sys.executable, "-c", RUN_MANY, spec], capture_output=True, text=True, cwd=cwd,
                              env=dict(os.environ if env is None else env, TF_CPP_MIN_LOG_LEVEL="3"), timeout=timeout)
    finally:
        os.unlink(spec)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith('{"results"')), None)
    assert line is not None, f"the child died (exit {proc.returncode}): {proc.stderr[-1500:]}"
    got = json.loads(line)
    return ManyResult([CliResult(code, out, err, None, None) for code, out, err in got["results"]], got["peak_mb"])


def shared_library(folder: Path, name: str, source: str) -> Path:
    """lib{name}.so in `folder`, compiled from C `source` with the machine's compiler (a real library for
    the tests of what edgekit loads, and when)."""
    import shutil

    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler builds the test's shared library"
    (folder / f"{name}.c").write_text(source)
    out = folder / f"lib{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(folder / f"{name}.c")], check=True)
    return out


def deep_digits_cnn(digits_dir: Path):
    """A 6-conv digits CNN (11 quantizable ops once converted)."""
    import keras
    from keras import layers

    from edgekit.converters.training import dataset, load_image_folder
    from edgekit.runtime.preprocess import PreprocessSpec

    x, y, _ = load_image_folder(digits_dir / "train", PreprocessSpec(height=8, width=8, channels=1))
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = layers.Rescaling(1 / 255)(inputs)
    for k, width in enumerate((16, 16, 32)):
        h = layers.Conv2D(width, 3, padding="same", activation="relu", name=f"conv{k}")(h)
    h = layers.MaxPooling2D()(h)
    for k, width in enumerate((32, 64, 64)):
        h = layers.Conv2D(width, 3, padding="same", activation="relu", name=f"conv{k + 3}")(h)
    h = layers.GlobalAveragePooling2D()(h)
    h = layers.Dense(64, activation="relu", name="fc")(h)
    model = keras.Model(inputs, layers.Dense(10, activation="softmax", name="probs")(h))
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    model.fit(dataset(x, y, batch_size=32, seed=0), epochs=15, verbose=0, shuffle=False)
    return model


def with_activation_outliers(model, layer: str, consumer: str, factor: float = 200.0, channels: int = 2):
    """Scale `channels` output channels of `layer` (a ReLU conv) by `factor` and divide the matching
    input weights of `consumer`: the float function is unchanged, but one per-tensor int8 range must now
    span a few huge values, and the other channels of that tensor round to almost nothing."""
    a, b = model.get_layer(layer), model.get_layer(consumer)
    wa, ba = a.get_weights()
    wb, bb = b.get_weights()
    wa[..., :channels] *= factor
    ba[:channels] *= factor
    wb[:, :, :channels, :] /= factor
    a.set_weights([wa, ba])
    b.set_weights([wb, bb])
    return model


def noisy_digits(digits_dir: Path, out: Path, sigma: float = 48.0, seed: int = 0) -> Path:
    """The bundled digits made hard (seeded): each 8x8 digit upscaled to 32x32, shifted by up to 3 pixels,
    its contrast scaled by 0.5-1 and Gaussian noise of `sigma` grey levels added, one image per digit in the
    same train/test split and class folders. Models trained on them end with small margins (an
    EfficientNetB0 64x64: 74 % top-1 on the test folder), as models of hard datasets do, where the clean
    digits' 97-99 % leave int8 nothing to lose."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    for f in [f for split in ("train", "test") for f in sorted(digits_dir.glob(f"{split}/*/*.png"))]:
        image = cv2.resize(cv2.imread(str(f), cv2.IMREAD_UNCHANGED).astype(np.float32), (32, 32),
                           interpolation=cv2.INTER_LINEAR)
        dx, dy = rng.integers(-3, 4, 2)
        image = cv2.warpAffine(image, np.float32([[1, 0, dx], [0, 1, dy]]), (32, 32))
        image = image * rng.uniform(0.5, 1.0) + rng.normal(0.0, sigma, image.shape)
        target = out / f.relative_to(digits_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(target), np.clip(image, 0, 255).astype(np.uint8))
    return out


def augmented_digits(digits_dir: Path, out: Path, copies: int = 7, seed: int = 1, noisy: bool = False) -> Path:
    """`copies` new images of each test digit (seeded), in the test folder's class folders as
    `<digit's file>_<k>.png`: the 8x8 digit turned by up to 6 degrees, scaled by 0.95-1.05 and shifted by up
    to a third of a pixel (bilinear); with `noisy`, instead made as `noisy_digits` makes it, with new draws (a new
    shift, contrast and noise each). 360 digits x 7 = 2,520 images: enough that a top-1 loss of a point is
    resolved, counted by digit (`clusters_of`), not by image, where the copies of one digit err alike."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    for f in sorted(digits_dir.glob("test/*/*.png")):
        original = cv2.imread(str(f), cv2.IMREAD_UNCHANGED).astype(np.float32)
        for k in range(copies):
            if noisy:
                image = cv2.resize(original, (32, 32), interpolation=cv2.INTER_LINEAR)
                dx, dy = rng.integers(-3, 4, 2)
                image = cv2.warpAffine(image, np.float32([[1, 0, dx], [0, 1, dy]]), (32, 32))
                image = image * rng.uniform(0.5, 1.0) + rng.normal(0.0, 48.0, image.shape)
            else:
                turn = cv2.getRotationMatrix2D((3.5, 3.5), rng.uniform(-6, 6), rng.uniform(0.95, 1.05))
                turn[:, 2] += rng.uniform(-0.35, 0.35, 2)
                image = cv2.warpAffine(original, turn, (8, 8), flags=cv2.INTER_LINEAR)
            target = out / f.parent.name / f"{f.stem}_{k}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(target), np.clip(np.rint(image), 0, 255).astype(np.uint8))
    return out


def clusters_of(folder: Path) -> list[str]:
    """The digit each image of an `augmented_digits` folder was made from, in `labelled_images`' order."""
    from edgekit.runtime import ImageFolder

    return [Path(f).stem.rsplit("_", 1)[0] for f in ImageFolder.scan(folder).files]


def paired_points(reference, candidate, clusters=None) -> tuple[float, tuple[float, float]]:
    """The candidate's mean per-sample score minus the reference's (successes, IoUs: per sample, the same
    samples), in points, with its 95 % interval from scipy's bootstrap (BCa, 9,999 resamples); with
    `clusters`, the samples made from one original count as one draw (the paired mean of its copies)."""
    import numpy as np
    from scipy.stats import bootstrap

    diff = np.asarray(candidate, np.float64) - np.asarray(reference, np.float64)
    if clusters is not None:
        _, index = np.unique(np.asarray(clusters), return_inverse=True)
        diff = np.bincount(index, weights=diff) / np.bincount(index)
    point = 100.0 * float(np.mean(diff))
    if np.all(diff == diff[0]):
        return point, (point, point)
    found = bootstrap((diff,), np.mean, confidence_level=0.95, n_resamples=9999, method="BCa", random_state=0)
    low, high = found.confidence_interval
    return point, (100.0 * float(low), 100.0 * float(high))
