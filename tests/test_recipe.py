"""ConvertRecipe rejects bad combinations before TensorFlow is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.errors import UsageError
from edgekit.converters.recipe import ConvertRecipe


def test_default_output_sits_beside_the_model_and_names_the_mode():
    assert ConvertRecipe(model="a/b/net.keras", mode="float16").output_path == Path("a/b/net.float16.tflite")
    assert ConvertRecipe(model="a/saved", mode="dynamic").output_path == Path("a/saved.dynamic.tflite")


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "int4"}, "unknown mode"),
    ({"mode": "int8"}, "needs calibration data"),
    ({"mode": "int16x8"}, "needs calibration data"),
    ({"mode": "float16", "io": "int8"}, "not available with float16"),
    ({"mode": "int8", "io": "int16", "calib": "d"}, "not available with int8"),
    ({"mode": "int8", "calib": "d", "calib_samples": 0}, "at least 1"),
    ({"std": (0.0,)}, "must not be 0"),
])
def test_bad_combinations_are_refused(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ConvertRecipe(model="m.keras", **kwargs)


def test_from_dict_rejects_unknown_keys_and_round_trips():
    recipe = ConvertRecipe(model="m.keras", mode="int8", io="uint8", calib="data", calib_samples=50)
    assert ConvertRecipe.from_dict(recipe.to_dict()) == recipe
    with pytest.raises(UsageError, match="unknown recipe keys: calib_sample"):
        ConvertRecipe.from_dict({"model": "m.keras", "calib_sample": 3})
