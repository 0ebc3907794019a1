"""Shared fixtures: the bundled digits data and a digits CNN trained once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "calibration_data" / "digits"
PHOTOS = ROOT / "calibration_data" / "photos"


@pytest.fixture(scope="session")
def digits_dir() -> Path:
    return DIGITS


@pytest.fixture(scope="session")
def photos_dir() -> Path:
    return PHOTOS


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="session")
def digits_keras(work) -> Path:
    """The demo's digits CNN, trained with a fixed seed and saved as a Keras 3 .keras file."""
    from edgekit.converters.training import train_digits

    model, _ = train_digits(DIGITS / "train", epochs=20, seed=0)
    path = work / "digits.keras"
    model.save(path)
    return path


@pytest.fixture(scope="session")
def converted(work, digits_keras):
    """Convert the digits model in a given mode once per session: converted("int8") -> Path."""
    from edgekit.converters.pipeline import convert
    from edgekit.recipe import ConvertRecipe

    cache: dict[tuple, Path] = {}

    def get(mode: str, io: str = "float32") -> Path:
        key = (mode, io)
        if key not in cache:
            out = work / f"digits.{mode}.{io}.tflite"
            convert(ConvertRecipe(model=digits_keras, mode=mode, io=io, calib=DIGITS / "train", output=out))
            cache[key] = out
        return cache[key]

    return get
