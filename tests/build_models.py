#!/usr/bin/env python3
"""Build the models the runtime tests use, for a venv without TensorFlow (CI's LiteRT 1.4.0 and
tflite-runtime 2.14 floors): `python tests/build_models.py OUT`, then run the tests there with
EDGEKIT_TEST_MODELS=OUT (tests/conftest.py serves `converted` and `detector_tflite` from it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import DIGIT_MODELS, DIGITS, convert_digits  # noqa: E402
from detection_model import build_tiny_detector  # noqa: E402


def main(out: Path) -> None:
    from edgekit.converters.demo_model import train_digits

    out.mkdir(parents=True, exist_ok=True)
    model, _ = train_digits(DIGITS / "train", epochs=20, seed=0)
    keras_path = out / "digits.keras"
    model.save(keras_path)
    for mode, io in DIGIT_MODELS:
        print(convert_digits(keras_path, out, mode, io).name, flush=True)
    print(build_tiny_detector(out / "detector.tflite", input_size=64).name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
