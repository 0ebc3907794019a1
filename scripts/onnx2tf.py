#!/usr/bin/env python3
"""onnx2tf in a venv of its own, and an ONNX model turned into a TensorFlow SavedModel with it, offline.

Usage::

    python3.11 scripts/onnx2tf.py venv DIR [--force]
    DIR/bin/python scripts/onnx2tf.py convert MODEL.onnx OUT [--ois NAME:1,3,H,W ...] [-- ONNX2TF ARGS]

onnx2tf (1.29.24, the newest for Python 3.11) pins tensorflow 2.19.0, numpy 1.26.4 and onnxruntime exactly, so
it cannot share edgekit's environment. `venv` builds DIR from scripts/onnx2tf-requirements.txt (binary wheels
only; idempotent: a DIR whose onnx2tf imports at the pinned versions is left as it is). `convert` runs in
that venv: `onnx2tf -i MODEL -o OUT -osd -b 1` in a private working folder that holds the 20 calibration
images onnx2tf would otherwise download (made here: synthetic RGB images, float32 in [0, 1]), with the
venv's bin first on PATH (onnx2tf calls `onnxsim`) and any proxy pointed at a closed port, so nothing is
fetched. onnx2tf overwrites its input file (`onnxsim IN IN`): it is given a copy. Names TensorFlow refuses as
scopes (PaddlePaddle's exports name nodes `Conv@0`) are rewritten in that copy. OUT gets the SavedModel (its
`serving_default` signature checked in a child process), onnx2tf's float32/float16 .tflite files and its
log. Any failure is one line on stderr ("onnx2tf.py: error: ...") and exit 1; OUT is left as it was.
The tests find the venv's interpreter in EDGEKIT_ONNX2TF_PYTHON (docs/testing.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONNX2TF_VERSION = "1.29.24"
REQUIREMENTS = Path(__file__).with_name("onnx2tf-requirements.txt")
CALIBRATION = "calibration_image_sample_data_20x128x128x3_float32.npy"  # what onnx2tf reads instead of fetching
CHECK = ("import onnx2tf, onnx, onnxsim, onnxruntime, onnx_graphsurgeon, tensorflow as tf, numpy as np; "
         f"assert onnx2tf.__version__ == {ONNX2TF_VERSION!r}, onnx2tf.__version__; "
         "assert (tf.__version__, np.__version__) == ('2.19.0', '1.26.4'); print('ok')")
SCOPE = re.compile(r"[A-Za-z0-9_.\\/>-]*")  # what TensorFlow takes as a name scope
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Failed(RuntimeError):
    """One line for the user."""


def _env(bindir: str | None = None) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PYTHONNOUSERSITE="1", CUDA_VISIBLE_DEVICES="-1")
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    if bindir is not None:  # onnx2tf calls onnxsim; nothing may be fetched
        closed = "http://127.0.0.1:9"
        env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=os.path.dirname(bindir),
                   HTTP_PROXY=closed, HTTPS_PROXY=closed, http_proxy=closed, https_proxy=closed, NO_PROXY="",
                   no_proxy="")
    return env


def _works(folder: Path) -> bool:
    python = folder / "bin" / "python"
    if not (python.is_file() and (folder / "bin" / "onnx2tf").is_file()):
        return False
    done = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, env=_env())
    return done.returncode == 0 and done.stdout.strip().endswith("ok")


def make_venv(folder: Path, force: bool = False) -> str:
    """The venv at `folder` with onnx2tf and its pins; what was done, in a line."""
    if not force and _works(folder):
        return f"{folder} has onnx2tf {ONNX2TF_VERSION} already: nothing to do"
    if sys.version_info[:2] != (3, 11):
        raise Failed(f"the pinned set was verified on Python 3.11 only; this is {sys.version.split()[0]}")
    started = time.perf_counter()
    python = folder / "bin" / "python"
    if not python.is_file():
        if folder.exists() and any(folder.iterdir()):
            raise Failed(f"{folder} exists, is not empty and is not a venv: remove it or choose another folder")
        made = subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True, text=True)
        if made.returncode:
            raise Failed(f"python -m venv failed: {(made.stderr or made.stdout).strip().splitlines()[-1:]}")
    log = folder / "onnx2tf-pip.log"
    with log.open("w") as out:
        done = subprocess.run([str(python), "-m", "pip", "install", "--only-binary", ":all:", "-r",
                               str(REQUIREMENTS)], stdout=out, stderr=subprocess.STDOUT, env=_env())
    if done.returncode:
        errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("ERROR")]
        raise Failed(f"pip install failed ({(errors or ['see the log'])[-1]}); log: {log}")
    if not _works(folder):
        raise Failed(f"installed, but onnx2tf {ONNX2TF_VERSION} does not import at its pinned versions; log: {log}")
    return f"built {folder} with onnx2tf {ONNX2TF_VERSION} in {time.perf_counter() - started:.0f} s"


def _calibration(path: Path, n: int = 20, size: int = 128, seed: int = 0) -> None:
    """20 synthetic RGB images, NHWC float32 in [0, 1] (gradients, shapes, text-like strokes on paper,
    textures): what onnx2tf checks its conversion on, made here instead of downloaded."""
    import numpy as np

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    out = np.empty((n, size, size, 3), np.float32)
    for i in range(n):
        c0, c1 = rng.random(3, dtype=np.float32), rng.random(3, dtype=np.float32)
        a = rng.random() * 2 * np.pi
        t = np.cos(a) * xx + np.sin(a) * yy
        img = c0 + (c1 - c0) * ((t - t.min()) / (np.ptp(t) + 1e-6))[..., None]
        if i % 4 == 1:  # shapes
            for _ in range(int(rng.integers(3, 8))):
                cy, cx = rng.random(2) * size
                ry, rx = rng.random(2) * size / 4 + 4
                img[((yy * size - cy) / ry) ** 2 + ((xx * size - cx) / rx) ** 2 < 1] = rng.random(3)
        elif i % 4 == 2:  # strokes of ink on paper
            img[:] = 0.85 + 0.15 * rng.random(3)
            for row in range(6, size - 12, int(rng.integers(12, 20))):
                h, x = int(rng.integers(5, 10)), int(rng.integers(2, 12))
                while x < size - 8:
                    w = int(rng.integers(2, 9))
                    if rng.random() < 0.8:
                        img[row:row + h, x:x + w] = rng.random(3) * 0.3
                    x += w + int(rng.integers(1, 4))
        elif i % 4 == 3:  # texture
            f = int(rng.integers(2, 12))
            img = img * (0.6 + 0.4 * np.sin(2 * np.pi * f * (xx + yy * rng.random())))[..., None]
        out[i] = np.clip(img + rng.normal(0, 0.02, img.shape), 0.0, 1.0)
    np.save(path, out)


def _scoped_copy(source: Path, copy: Path) -> int:
    """`source` copied to `copy` with every node and tensor name TensorFlow refuses as a scope rewritten (bad
    characters to `_`, kept unique); how many names changed."""
    import onnx

    model = onnx.load(str(source))

    def graphs(g):
        yield g
        for node in g.node:
            for at in node.attribute:
                if at.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(at.g)
                elif at.type == onnx.AttributeProto.GRAPHS:
                    for sub in at.graphs:
                        yield from graphs(sub)

    every = list(graphs(model.graph))
    used = {name for g in every for node in g.node for name in (node.name, *node.input, *node.output)}
    used |= {t.name for g in every for t in g.initializer}
    renamed: dict[str, str] = {}

    def fixed(name: str) -> str:
        if name in renamed or SCOPE.fullmatch(name):
            return renamed.get(name, name)
        base = new = re.sub(r"[^A-Za-z0-9_.\\/>-]", "_", name)
        k = 0
        while new in used:
            k += 1
            new = f"{base}_{k}"
        used.add(new)
        renamed[name] = new
        return new

    for g in every:
        for node in g.node:
            node.name = fixed(node.name)
            node.input[:] = [fixed(t) for t in node.input]
            node.output[:] = [fixed(t) for t in node.output]
        for values in (g.input, g.output, g.value_info, g.initializer):
            for v in values:
                v.name = fixed(v.name)
    if renamed:
        onnx.save(model, str(copy))
    else:
        shutil.copyfile(source, copy)
    return len(renamed)


_SIGNATURE = r"""
import json, sys
import tensorflow as tf
try:
    model = tf.saved_model.load(sys.argv[1])
except Exception as exc:
    sys.exit("the SavedModel does not load: %s: %s" % (type(exc).__name__, " ".join(str(exc).split())[:300]))
if "serving_default" not in model.signatures:
    sys.exit("no serving_default signature (it has %s)" % list(model.signatures))
f = model.signatures["serving_default"]
print(json.dumps({"inputs": {k: [v.shape.as_list(), v.dtype.name] for k, v in f.structured_input_signature[1].items()},
                  "outputs": {k: [v.shape.as_list(), v.dtype.name] for k, v in f.structured_outputs.items()}}))
"""


def convert(source: Path, out: Path, ois: list[str], extra: list[str], timeout: float = 3600) -> dict:
    """`source` (ONNX) as a SavedModel in `out` (replaced only once the new one checks out)."""
    import onnx

    bindir = os.path.dirname(os.path.abspath(sys.executable))
    for tool in ("onnx2tf", "onnxsim"):
        if not os.path.isfile(os.path.join(bindir, tool)):
            raise Failed(f"{tool} is not in {bindir}: run `convert` with the onnx2tf venv's bin/python "
                         "(scripts/onnx2tf.py venv DIR)")
    if not source.is_file():
        raise Failed(f"{source}: no such file")
    if out.exists() and any(out.iterdir()) and not (out / "saved_model.pb").is_file():
        raise Failed(f"{out} exists and is not a SavedModel folder: it is not replaced")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".onnx2tf-", dir=out.parent))
    try:
        _calibration(work / CALIBRATION)
        (work / "src").mkdir()
        copy = work / "src" / source.name
        try:
            renamed = _scoped_copy(source, copy)
            graph = onnx.load(str(source), load_external_data=False).graph
        except Exception as exc:  # noqa: BLE001 - any reader error is one line
            raise Failed(f"{source} does not read as ONNX: {type(exc).__name__}: {exc}") from None
        names = {i.name for i in graph.input} - {t.name for t in graph.initializer}
        for spec in ois:
            if spec.split(":", 1)[0] not in names:
                raise Failed(f"--ois {spec!r}: the model's inputs are {sorted(names)}")
        made = work / "saved_model"
        command = [os.path.join(bindir, "onnx2tf"), "-i", str(copy), "-o", str(made), "-osd", "-b", "1",
                   *(["-ois", *ois] if ois else []), *extra]
        log = work / "onnx2tf.log"
        started = time.perf_counter()
        with log.open("w") as stream:
            try:
                done = subprocess.run(command, cwd=work, env=_env(bindir), stdout=stream, stderr=subprocess.STDOUT,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                raise Failed(f"onnx2tf took over {timeout:.0f} s") from None
        seconds = time.perf_counter() - started
        if done.returncode or not (made / "saved_model.pb").is_file():
            kept = out.with_name(out.name + ".onnx2tf-failed.log")
            shutil.copyfile(log, kept)
            raise Failed(f"onnx2tf {'exit ' + str(done.returncode) if done.returncode else 'wrote no SavedModel'}: "
                         f"{_last_error(log.read_text(errors='replace'))} (log: {kept})")
        checked = subprocess.run([sys.executable, "-c", _SIGNATURE, str(made)], capture_output=True, text=True,
                                 env=_env(bindir), timeout=600)
        if checked.returncode:
            raise Failed((checked.stderr.strip().splitlines() or [f"exit {checked.returncode}"])[-1])
        shutil.copyfile(log, made / "onnx2tf.log")
        if out.exists():
            shutil.rmtree(out)
        os.replace(made, out)
        return {"out": str(out), "seconds": round(seconds, 1), "renamed": renamed,
                **json.loads(checked.stdout.strip().splitlines()[-1])}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _last_error(text: str) -> str:
    lines = [ANSI.sub("", line).strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "Error" in line or "error:" in line]
    return (errors or lines or ["no output"])[-1][:400]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    parser = argparse.ArgumentParser(prog="onnx2tf.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    venv = sub.add_parser("venv", help="build the onnx2tf venv")
    venv.add_argument("folder", type=Path)
    venv.add_argument("--force", action="store_true", help="install again into a working venv")
    conv = sub.add_parser("convert", help="ONNX -> SavedModel (run with the venv's python)")
    conv.add_argument("onnx", type=Path)
    conv.add_argument("out", type=Path)
    conv.add_argument("--ois", nargs="+", default=[], metavar="NAME:D0,D1,...", help="onnx2tf -ois: fixed input shapes")
    conv.add_argument("--timeout", type=float, default=3600)
    options = parser.parse_args(args)
    try:
        if options.command == "venv":
            print(make_venv(options.folder.absolute(), options.force))
        else:
            info = convert(options.onnx.absolute(), options.out.absolute(), options.ois, extra, options.timeout)
            print(f"onnx2tf.py: {info['out']} in {info['seconds']} s ({info['renamed']} names rewritten); "
                  f"inputs {info['inputs']}; outputs {info['outputs']}")
    except Failed as exc:
        print(f"onnx2tf.py: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
