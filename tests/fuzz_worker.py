"""Fuzz worker, run as a child process by tests/test_fuzz.py: mutates real .tflite files and passes
each mutation through `inspect` and the runtime loader. Prints the mutation number before each try
(so a crash can be located), `ESCAPE ...` for any exception that is not an EdgekitError, and DONE."""

from __future__ import annotations

import random
import sys

import numpy as np

from edgekit.errors import EdgekitError
from edgekit.runtime import Model
from edgekit.runtime.inspect import analyze


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:  # truncation
        return bytes(b[: rng.randrange(8, len(b))])
    if kind == 1:  # bit flips
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 2:  # an oversized dimension, count or an offset past the end
        i = rng.randrange(0, len(b) - 4)
        value = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0, 1 << 20, len(b) + rng.randrange(1000)])
        b[i : i + 4] = value.to_bytes(4, "little")
    elif kind == 3:
        b[rng.randrange(len(b))] = rng.randrange(256)
    else:
        i = rng.randrange(0, len(b) - 8)
        b[i : i + 8] = bytes(rng.randrange(256) for _ in range(8))
    return bytes(b)


def main(start: int, end: int, paths: list[str]) -> None:
    models = [open(p, "rb").read() for p in paths]
    for n in range(start, end):
        data = mutate(models[n % len(models)], random.Random(n))
        print(n, flush=True)
        for step in ("inspect", "model"):
            try:
                if step == "inspect":
                    analyze(data, gpu=True)
                else:
                    model = Model(data, delegate="cpu", num_threads=1)
                    model.invoke_raw([np.zeros(i.shape, i.dtype) for i in model.inputs])
            except EdgekitError:
                pass
            except Exception as exc:  # noqa: BLE001 - the point is to see what escapes
                print(f"ESCAPE {n} {step} {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
