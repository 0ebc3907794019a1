"""The HTML reports of `sweep` and `tune` as people see them: rendered by a real headless browser (Chromium from
Debian: the system tier), screenshot taken, and the screenshot checked: the page is not blank, the embedded
plot drew its front (the red of its stars and line), and there is text on it. Whether labels overlap is checked
in the default tier from the figures' own text extents (tests/test_autopilot.py, tests/test_tune.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

import edgekit

pytestmark = pytest.mark.system

RED = np.array([40, 39, 214])  # matplotlib's tab:red (BGR): the front's stars and dashed line


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("Chromium is not installed (apt-get install chromium): the system tier renders the reports in it")


def _screenshot(page: Path, out: Path) -> np.ndarray:
    proc = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1200,2400", f"--screenshot={out}", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, cwd=out.parent)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
    image = cv2.imread(str(out))
    assert image is not None and image.shape[:2] == (2400, 1200)
    return image


def _check(image: np.ndarray) -> None:
    drawn = (image < 245).any(axis=2).mean()
    assert 0.03 < drawn < 0.6, f"{100 * drawn:.1f} % of the page drawn: blank, or not a page"
    red = (np.abs(image.astype(int) - RED).sum(axis=2) < 60).sum()
    assert red > 30, f"{red} pixels of the front's red: the plot did not render"
    text = (image.max(axis=2) < 90).sum()
    assert text > 5000, f"{text} dark pixels: no readable text"


def test_the_sweep_report_renders_in_chromium(swept, tmp_path):
    out, _ = swept
    _check(_screenshot(out / "report.html", tmp_path / "sweep.png"))


def test_the_tune_report_renders_in_chromium(digits_keras, digits_dir, tmp_path):
    edgekit.tune(digits_keras, calib=digits_dir / "train", eval_data=digits_dir / "test", out=tmp_path / "tuned",
                 trials=4, runs=10)
    _check(_screenshot(tmp_path / "tuned" / "report.html", tmp_path / "tune.png"))
