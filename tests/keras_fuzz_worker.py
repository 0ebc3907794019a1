"""Fuzz worker for .keras archives, run as a child by tests/test_fuzz.py: mutates a real archive (zip bytes,
config values, the weights member, the member list), loads each mutation with edgekit's loader and runs
one prediction. Prints the mutation number before each try, `ESCAPE ...` for any exception that is not an
EdgekitError, and DONE. Address space is capped so that a runaway allocation is an error, not a dead host."""

from __future__ import annotations

import io
import json
import random
import resource
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np

from edgekit.errors import EdgekitError

VALUES = [None, -1, 0, 1, 10**12, 2**31, "x", [], {}, 3.5, True, [10**9, 10**9], "relu"]


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate member names are one of the mutations
        for name, payload in members:
            z.writestr(name, payload)
    return buf.getvalue()


def mutate(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(7)
    if kind == 0:  # truncated archive
        return data[: rng.randrange(4, len(data))]
    if kind == 1:  # bit flips anywhere in the zip
        b = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    members = _members(data)
    config = json.loads(members["config.json"])
    layers = config["config"]["layers"]
    if kind == 2:  # one config value replaced
        layer = rng.choice(layers)
        key = rng.choice(sorted(layer["config"]))
        layer["config"][key] = rng.choice(VALUES)
    elif kind == 3:  # a class or module swapped
        layer = rng.choice(layers)
        if rng.random() < 0.5:
            layer["class_name"] = rng.choice(["Lambda", "Dense", "Conv2D", "NoSuchLayer", "Functional"])
        else:
            layer["module"] = rng.choice(["os", "builtins", "keras.layers", "subprocess", "numpy"])
    elif kind == 4:  # the weights damaged
        name = next(n for n in members if n.endswith(".h5"))
        w = bytearray(members[name])
        if rng.random() < 0.5:
            w = w[: rng.randrange(1, len(w))]
        else:
            for _ in range(rng.randrange(1, 20)):
                i = rng.randrange(len(w))
                w[i] = rng.randrange(256)
        members[name] = bytes(w)
    elif kind == 5:  # a member dropped or doubled
        name = rng.choice(sorted(members))
        if rng.random() < 0.5:
            del members[name]
        else:
            return _zip(list(members.items()) + [(name, members[name][::-1])])
    else:  # config text cut
        text = members["config.json"]
        i = rng.randrange(len(text))
        members["config.json"] = text[:i] + text[i + rng.randrange(1, 40):]
        return _zip(list(members.items()))
    members["config.json"] = json.dumps(config).encode()
    return _zip(list(members.items()))


def main(start: int, end: int, path: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
    from edgekit.converters.loading import load_model

    seed = Path(path).read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(start, end):
            target = Path(tmp) / f"m{n}.keras"
            target.write_bytes(mutate(seed, random.Random(n)))
            print(n, flush=True)
            try:
                source = load_model(target)
                source.predict(np.zeros((1,) + tuple(source.input_shape[1:]), np.float32))
            except EdgekitError:
                pass
            except Exception as exc:  # noqa: BLE001 - the point is to see what escapes
                print(f"ESCAPE {n} {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            target.unlink()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
