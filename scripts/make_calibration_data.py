#!/usr/bin/env python3
"""Regenerate edgekit's bundled calibration data set.

Usage::

    python scripts/make_calibration_data.py [--out calibration_data] [--force]

Writes, under the output folder:

* ``digits/{train,test}/<digit>/<idx>.png`` -- all 1,797 images of
  ``sklearn.datasets.load_digits()`` as 8x8 single-channel uint8 PNGs with
  pixel value ``round(v * 255 / 16)``; ``<idx>`` is the zero-padded index into
  the scikit-learn arrays.  Stratified 80/20 split, ``random_state=0``.
* ``photos/<name>.jpg`` -- colour photos from scikit-image's bundled sample
  data (files shipped inside the scikit-image wheel; nothing is downloaded),
  resized so the longer side is 256 px (``cv2.INTER_AREA``), JPEG quality 90.
* ``README.md`` -- provenance, licences, encoding, split rule, versions.

The output is deterministic: re-running with the same library versions gives
byte-identical files (fixed PNG compression, fixed JPEG settings, no
timestamps).  An existing output folder is only replaced with ``--force``; the
new tree is built in a temporary sibling folder and then swapped in.

Dependencies: numpy, scikit-learn, scikit-image, opencv-python-headless.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import skimage
import skimage.data
import sklearn
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 0
TEST_SIZE = 0.2
PHOTO_LONG_SIDE = 256
JPEG_QUALITY = 90
PNG_COMPRESSION = 9

PNG_PARAMS = [
    cv2.IMWRITE_PNG_COMPRESSION, PNG_COMPRESSION,
    cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_DEFAULT,
]
JPEG_PARAMS = [
    cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY,
    cv2.IMWRITE_JPEG_OPTIMIZE, 0,
    cv2.IMWRITE_JPEG_PROGRESSIVE, 0,
]

# Photos taken from scikit-image's bundled sample data.  ``file`` is the image
# file inside ``skimage/data/`` (checked to exist, so nothing is fetched over
# the network).  ``source`` and ``licence`` quote the docstring of the
# ``skimage.data`` function; ``check`` lists phrases that must appear in that
# docstring (whitespace-normalised) so that a scikit-image upgrade that changes
# the stated provenance is noticed instead of silently mis-documented.
PHOTOS = [
    {
        "name": "astronaut",
        "func": "astronaut",
        "file": "astronaut.png",
        "what": "Eileen Collins, NASA astronaut (portrait)",
        "source": "NASA Great Images database, <https://flic.kr/p/r9qvLn>",
        "licence": "No known copyright restrictions, released into the "
                   "public domain.",
        "check": ["NASA Great Images database", "https://flic.kr/p/r9qvLn",
                  "No known copyright restrictions, released into the "
                  "public domain."],
    },
    {
        "name": "chelsea",
        "func": "chelsea",
        "file": "chelsea.png",
        "what": "Chelsea the cat",
        "source": "photograph by Stefan van der Walt",
        "licence": "No copyright restrictions. CC0 by the photographer "
                   "(Stefan van der Walt).",
        "check": ["No copyright restrictions. CC0 by the photographer "
                  "(Stefan van der Walt)."],
    },
    {
        "name": "coffee",
        "func": "coffee",
        "file": "coffee.png",
        "what": "coffee cup on a wooden table",
        "source": "photograph by Rachel Michetti, courtesy of Pikolo "
                  "Espresso Bar",
        "licence": "No copyright restrictions. CC0 by the photographer "
                   "(Rachel Michetti).",
        "check": ["courtesy of Pikolo Espresso Bar",
                  "No copyright restrictions. CC0 by the photographer "
                  "(Rachel Michetti)."],
    },
    {
        "name": "rocket",
        "func": "rocket",
        "file": "rocket.jpg",
        "what": "launch of DSCOVR on a SpaceX Falcon 9",
        "source": "SpaceX Photos on Flickr, "
                  "<https://www.flickr.com/photos/spacexphotos/16511594820/"
                  "in/photostream/>",
        "licence": "The image was captured by SpaceX and released in the "
                   "public domain.",
        "check": ["The image was captured by SpaceX and",
                  "released in the public domain",
                  "https://www.flickr.com/photos/spacexphotos/16511594820/"],
    },
    {
        "name": "hubble_deep_field",
        "func": "hubble_deep_field",
        "file": "hubble_deep_field.jpg",
        "what": "Hubble eXtreme Deep Field",
        "source": "HubbleSite, <http://hubblesite.org/newscenter/archive/"
                  "releases/2012/37/image/a/>",
        "licence": "The image was captured by NASA and may be freely used "
                   "in the public domain.",
        "check": ["The image was captured by NASA and",
                  "may be freely used in the public domain",
                  "http://hubblesite.org/newscenter/archive/releases/2012/37/"
                  "image/a/"],
    },
    {
        "name": "immunohistochemistry",
        "func": "immunohistochemistry",
        "file": "ihc.png",
        "what": "IHC-stained colonic glands (microscopy)",
        "source": "Center for Microscopy And Molecular Imaging (CMMI)",
        "licence": "No known copyright restrictions.",
        "check": ["Center for Microscopy And Molecular Imaging (CMMI)",
                  "No known copyright restrictions."],
    },
    {
        "name": "retina",
        "func": "retina",
        "file": "retina.jpg",
        "what": "fundus photograph of a normal left eye",
        "source": "Wikimedia Commons, <https://commons.wikimedia.org/wiki/"
                  "File:Fundus_photograph_of_normal_left_eye.jpg> "
                  "(Mikael Häggström)",
        "licence": "This file is made available under the Creative Commons "
                   "CC0 1.0 Universal Public Domain Dedication.",
        "check": ["This file is made available under the Creative Commons "
                  "CC0 1.0 Universal Public Domain Dedication.",
                  "Fundus_photograph_of_normal_left_eye.jpg"],
    },
]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def check_photo_provenance() -> None:
    data_dir = Path(skimage.data.__file__).parent
    for p in PHOTOS:
        if not (data_dir / p["file"]).is_file():
            raise SystemExit(
                f"error: {p['file']} is not bundled in {data_dir}; refusing "
                "to let scikit-image download it")
        doc = _norm(getattr(skimage.data, p["func"]).__doc__ or "")
        for phrase in p["check"]:
            if _norm(phrase) not in doc:
                raise SystemExit(
                    f"error: docstring of skimage.data.{p['func']} no longer "
                    f"contains {phrase!r}; update PHOTOS / README text")


def _imwrite(path: Path, img: np.ndarray, params: list) -> None:
    if not cv2.imwrite(str(path), img, params):
        raise SystemExit(f"error: cv2.imwrite failed for {path}")


def write_digits(root: Path) -> dict:
    digits = load_digits()
    images = digits.images  # (1797, 8, 8) float64, integer values 0..16
    target = digits.target
    if images.shape != (1797, 8, 8):
        raise SystemExit(f"error: unexpected digits shape {images.shape}")
    if images.min() < 0 or images.max() > 16 or np.any(images % 1):
        raise SystemExit("error: digits values are not integers in 0..16")

    # round(v * 255 / 16), half up (only v == 8 hits a .5: 127.5 -> 128).
    pixels = np.floor(images * 255.0 / 16.0 + 0.5).astype(np.uint8)

    idx = np.arange(len(target))
    train_idx, test_idx = train_test_split(
        idx, test_size=TEST_SIZE, stratify=target, random_state=SEED)

    counts = {}
    for split, split_idx in (("train", train_idx), ("test", test_idx)):
        per_class = {d: 0 for d in range(10)}
        for d in range(10):
            (root / "digits" / split / str(d)).mkdir(parents=True)
        for i in sorted(int(i) for i in split_idx):
            d = int(target[i])
            _imwrite(root / "digits" / split / str(d) / f"{i:04d}.png",
                     np.ascontiguousarray(pixels[i]), PNG_PARAMS)
            per_class[d] += 1
        counts[split] = per_class
    return counts


def write_photos(root: Path) -> list:
    out_dir = root / "photos"
    out_dir.mkdir(parents=True)
    written = []
    for p in PHOTOS:
        rgb = np.asarray(getattr(skimage.data, p["func"])())
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise SystemExit(
                f"error: skimage.data.{p['func']} is not RGB uint8: "
                f"{rgb.shape} {rgb.dtype}")
        h, w = rgb.shape[:2]
        scale = PHOTO_LONG_SIDE / max(h, w)
        new_w = max(1, int(round(w * scale)))
        new_h = max(1, int(round(h * scale)))
        bgr = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR)
        small = cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_AREA)
        _imwrite(out_dir / f"{p['name']}.jpg", small, JPEG_PARAMS)
        written.append((p, (h, w), (new_h, new_w)))
    return written


def render_readme(counts: dict, photos: list) -> str:
    n_train = sum(counts["train"].values())
    n_test = sum(counts["test"].values())
    rows = "\n".join(
        f"| {d} | {counts['train'][d]} | {counts['test'][d]} | "
        f"{counts['train'][d] + counts['test'][d]} |" for d in range(10))
    photo_rows = "\n".join(
        f"| `photos/{p['name']}.jpg` | `skimage.data.{p['func']}()` "
        f"(`skimage/data/{p['file']}`) | {p['what']} | "
        f"{orig[1]}x{orig[0]} -> {new[1]}x{new[0]} | {p['source']} | "
        f"\"{p['licence']}\" |"
        for p, orig, new in photos)
    return f"""\
# edgekit calibration data

Small, redistributable image set used for post-training-quantisation
calibration and for tests. **Generated file tree -- do not edit by hand.**
Regenerate it (this README included) with:

```
python scripts/make_calibration_data.py --force
```

The script is deterministic: with the library versions below, re-running it
produces byte-identical files.

Generated with: Python {sys.version_info.major}.{sys.version_info.minor}, \
numpy {np.__version__}, scikit-learn {sklearn.__version__}, \
scikit-image {skimage.__version__}, opencv-python-headless \
(cv2) {cv2.__version__}.

## Layout

```
digits/train/<digit>/<idx>.png   {n_train} images
digits/test/<digit>/<idx>.png    {n_test} images
photos/<name>.jpg                {len(photos)} images
README.md                        this file
```

## `digits/` -- handwritten digits

* **Content:** all {n_train + n_test} images of
  `sklearn.datasets.load_digits()`. Class folder = the digit label `0`..`9`.
  `<idx>` is the zero-padded 4-digit index into the scikit-learn arrays
  (`load_digits().images[idx]`, `load_digits().target[idx]`), e.g. `0042.png`.
* **Encoding:** 8x8, single-channel (grayscale) 8-bit PNG. The original
  values are integers 0..16 (count of "on" pixels in a 4x4 block); the stored
  value is `round(v * 255 / 16)` (0 -> 0, 8 -> 128, 16 -> 255; rounding half
  up, which only matters for v = 8). PNG written by `cv2.imwrite` with
  `IMWRITE_PNG_COMPRESSION={PNG_COMPRESSION}`.
* **Split:** `sklearn.model_selection.train_test_split(indices,
  test_size={TEST_SIZE}, stratify=target, random_state={SEED})`, i.e. a seeded
  stratified split with 20% of each class in `test/` and the rest in `train/`.

| digit | train | test | total |
|---|---|---|---|
{rows}
| **all** | **{n_train}** | **{n_test}** | **{n_train + n_test}** |

**Provenance and licence.** scikit-learn's `load_digits` documentation
(`DESCR`) describes the data as "a copy of the test set of the UCI ML
hand-written digits datasets"
(<https://archive.ics.uci.edu/ml/datasets/Optical+Recognition+of+Handwritten+Digits>),
i.e. the UCI "Optical Recognition of Handwritten Digits" data set (E.
Alpaydin, C. Kaynak, Bogazici University, 1998; file `optdigits.tes`).

* The UCI Machine Learning Repository lists this data set under
  **Creative Commons Attribution 4.0 International (CC BY 4.0)**. Note: this
  licence is *not* stated in the installed scikit-learn package documentation
  (its `DESCR` gives only the source, creator and references); it is taken
  from the UCI repository's data set page, which should be checked if the
  exact terms matter. Attribution: E. Alpaydin and C. Kaynak, "Optical
  Recognition of Handwritten Digits", UCI Machine Learning Repository, 1998.
* scikit-learn itself, which ships the data file
  (`sklearn/datasets/data/digits.csv.gz`), is BSD-3-Clause (from the
  package metadata, `License-Expression: BSD-3-Clause`).

## `photos/` -- natural colour photos

RGB colour photos from scikit-image's bundled sample data (image files shipped
inside the scikit-image wheel in `skimage/data/`; nothing is downloaded --
the script refuses to run if a file is not bundled). Each is resized with
`cv2.resize(..., interpolation=cv2.INTER_AREA)` so that its longer side is
{PHOTO_LONG_SIDE} px (aspect ratio kept, sides rounded to the nearest pixel),
converted RGB -> BGR for OpenCV and written as baseline JPEG with
`IMWRITE_JPEG_QUALITY={JPEG_QUALITY}` (no optimisation, not progressive).

Source and licence text are quoted from the docstring of each
`skimage.data` function in scikit-image {skimage.__version__} (reST link
markup removed; the script checks that these phrases are still present).
`skimage/data/README.txt` itself only says that the wheel ships a subset of
the sample data; it states no licences. scikit-image itself is
BSD-3-Clause.

| file | loaded with | content | size (WxH) | original source | licence (as stated by scikit-image) |
|---|---|---|---|---|---|
{photo_rows}
"""


def build(out: Path) -> dict:
    counts = write_digits(out)
    photos = write_photos(out)
    (out / "README.md").write_bytes(
        render_readme(counts, photos).encode("utf-8"))
    return {"counts": counts, "photos": photos}


def total_bytes(root: Path) -> tuple[int, int]:
    n = size = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            n += 1
            size += os.path.getsize(os.path.join(dirpath, f))
    return n, size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="calibration_data",
                    help="output folder (default: calibration_data)")
    ap.add_argument("--force", action="store_true",
                    help="replace the output folder if it already exists")
    args = ap.parse_args(argv)

    out = Path(args.out).resolve()
    if (out.exists() or out.is_symlink()) and not args.force:
        print(f"error: {out} already exists; pass --force to replace it",
              file=sys.stderr)
        return 1

    check_photo_provenance()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    old = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        result = build(tmp)
        if out.exists() or out.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-",
                                        dir=out.parent))
            os.rename(out, old / "prev")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "prev").exists() and not out.exists():
            os.rename(old / "prev", out)  # put the previous tree back
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

    counts = result["counts"]
    n_files, size = total_bytes(out)
    print(f"wrote {out}: digits train={sum(counts['train'].values())} "
          f"test={sum(counts['test'].values())}, "
          f"photos={len(result['photos'])}, "
          f"files={n_files}, total_bytes={size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
