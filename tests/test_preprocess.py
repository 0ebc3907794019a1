"""The one preprocessing path: channel conversion, resize modes, normalisation, validation."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgekit.errors import InputShapeError, UsageError
from edgekit.runtime.preprocess import PreprocessSpec, decode_image, prepare, read_image, to_rgb_or_gray


def test_stretch_resizes_to_model_size_and_keeps_raw_pixels_by_default(photos_dir):
    img = read_image(photos_dir / "astronaut.jpg")
    x = prepare(img, PreprocessSpec(64, 48, 3))
    assert x.shape == (64, 48, 3) and x.dtype == np.float32
    assert 0 <= x.min() and x.max() <= 255 and x.max() > 200


def test_mean_std_gives_minus_one_to_one(photos_dir):
    img = read_image(photos_dir / "coffee.jpg")
    x = prepare(img, PreprocessSpec(32, 32, 3, mean=(127.5,), std=(127.5,)))
    assert -1.0 <= x.min() < -0.5 and 0.5 < x.max() <= 1.0


def test_per_channel_mean_is_applied_per_channel():
    img = np.full((4, 4, 3), 100, np.uint8)
    x = prepare(img, PreprocessSpec(4, 4, 3, mean=(10, 20, 30), std=(1, 2, 5)))
    np.testing.assert_allclose(x[0, 0], [90, 40, 14])


def test_letterbox_keeps_aspect_and_pads_with_black():
    img = np.full((10, 40, 3), 200, np.uint8)  # wide
    x = prepare(img, PreprocessSpec(40, 40, 3, resize="letterbox"))
    assert x.shape == (40, 40, 3)
    assert x[0, 20].max() == 0 and x[-1, 20].max() == 0  # padded rows top and bottom
    assert x[20, 20].min() == 200 and x[20, 0].min() == 200  # content spans the full width


def test_crop_keeps_aspect_and_cuts_the_long_side():
    img = np.zeros((10, 40), np.uint8)
    img[:, 15:25] = 255  # a bright centre band
    x = prepare(img, PreprocessSpec(10, 10, 1, resize="crop"))
    assert x.shape == (10, 10, 1)
    assert x[:, 3:7].min() == 255  # the centre survives, the dark sides were cut


def test_gray_image_becomes_three_channels_and_rgb_becomes_gray():
    gray = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    rgb = prepare(gray, PreprocessSpec(4, 4, 3))
    np.testing.assert_array_equal(rgb[..., 0], rgb[..., 2])
    color = np.zeros((4, 4, 3), np.uint8)
    color[..., 0] = 255  # pure red in RGB order
    g = prepare(color, PreprocessSpec(4, 4, 1))
    assert g.shape == (4, 4, 1) and g[0, 0, 0] == pytest.approx(76, abs=1)  # 0.299 * 255


def test_bgra_frames_are_converted_to_rgb_explicitly():
    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[..., 0] = 255  # blue in BGR order
    rgb = to_rgb_or_gray(bgra, order="BGR")
    assert rgb.shape == (2, 2, 3) and rgb[0, 0].tolist() == [0, 0, 255]


def test_digits_pngs_decode_to_the_scikit_learn_pixels(digits_dir):
    """Independent truth: calibration_data/README.md stores load_digits().images[idx] (0..16) as
    round(v * 255 / 16), half up, in digits/<split>/<label>/<idx>.png."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    paths = sorted(digits_dir.glob("*/*/*.png"))
    assert len(paths) == 1797
    for path in paths:
        idx = int(path.stem)
        assert digits.target[idx] == int(path.parent.name), path
        expected = np.floor(digits.images[idx] * 255 / 16 + 0.5).astype(np.uint8)
        img = read_image(path)
        assert img.shape == (8, 8) and img.dtype == np.uint8, path
        np.testing.assert_array_equal(img, expected, err_msg=str(path))
        np.testing.assert_array_equal(decode_image(path.read_bytes(), path.name), expected, err_msg=str(path))


def test_pillow_written_pngs_read_back_pixel_for_pixel_in_rgb_order(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)  # not square, not symmetric
    rgb[0, 0] = (255, 0, 0)  # red top-left, in RGB order
    Image.fromarray(rgb, "RGB").save(tmp_path / "rgb.png")
    gray = rng.integers(0, 256, size=(6, 3), dtype=np.uint8)
    Image.fromarray(gray, "L").save(tmp_path / "gray.png")
    rgba = np.dstack([rgb, rng.integers(0, 256, size=(5, 7), dtype=np.uint8)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    np.testing.assert_array_equal(read_image(tmp_path / "rgb.png"), rgb)
    assert read_image(tmp_path / "rgb.png")[0, 0].tolist() == [255, 0, 0]
    np.testing.assert_array_equal(read_image(tmp_path / "gray.png"), gray)
    np.testing.assert_array_equal(read_image(tmp_path / "rgba.png"), rgb)  # alpha dropped, colour kept
    np.testing.assert_array_equal(decode_image((tmp_path / "rgb.png").read_bytes(), "rgb.png"), rgb)


def test_corrupt_png_bytes_are_a_one_line_error(digits_dir):
    path = next((digits_dir / "train" / "3").glob("*.png"))
    with pytest.raises(InputShapeError, match="not a readable image"):
        decode_image(path.read_bytes()[:20], "truncated.png")


def test_missing_image_is_a_one_line_error(tmp_path):
    with pytest.raises(InputShapeError, match="cannot read image"):
        read_image(tmp_path / "nope.png")


@pytest.mark.parametrize("kwargs, error", [
    ({"channels": 4}, InputShapeError),
    ({"resize": "squash"}, UsageError),
    ({"std": (0.0,)}, UsageError),
    ({"mean": (1.0, 2.0)}, UsageError),
    ({"mean": (float("nan"),)}, UsageError),
])
def test_bad_specs_are_rejected_on_construction(kwargs, error):
    args = {"height": 8, "width": 8, "channels": 3} | kwargs
    with pytest.raises(error):
        PreprocessSpec(**args)


def test_spec_round_trips_through_its_metadata_dict():
    spec = PreprocessSpec(224, 160, 3, resize="letterbox", mean=(127.5,), std=(127.5,))
    assert PreprocessSpec.from_dict(spec.to_dict()) == spec


def test_exif_orientation_is_applied_and_16_bit_is_scaled(tmp_path):
    from PIL import Image

    img = np.zeros((20, 40, 3), np.uint8)
    img[:, :20] = 255  # left half white
    im = Image.fromarray(img)
    exif = im.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    im.save(tmp_path / "rotated.jpg", exif=exif)
    shown = read_image(tmp_path / "rotated.jpg")
    assert shown.shape == (40, 20, 3)  # as a viewer shows it
    assert shown[:15].mean() > 200 and shown[25:].mean() < 50  # the white half is now on top
    cv2.imwrite(str(tmp_path / "deep.png"), np.full((4, 4), 65535, np.uint16))
    deep = read_image(tmp_path / "deep.png")
    assert deep.dtype == np.uint8 and deep.max() == 255
