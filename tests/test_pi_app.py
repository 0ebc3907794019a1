"""The README's Raspberry Pi app, run as written against a video instead of a camera."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np

from conftest import ROOT, make_video
from edgekit.runtime import ImageFolder, read_image


def _readme_app() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- pi-app -->\s*```python\n(.*?)```\s*<!-- /pi-app -->", text, re.S)
    assert block, "README lost its Pi app block"
    return block.group(1)


def test_pi_app_is_at_most_20_lines_and_classifies_a_video_of_digits(tmp_path, converted, digits_dir):
    code = _readme_app()
    assert len(code.strip().splitlines()) <= 20
    folder = ImageFolder.scan(digits_dir / "test")
    picks = [folder.files[i] for i in range(0, len(folder.files), 36)]  # one of each digit, in order
    labels = [folder.classes[folder.labels[i]] for i in range(0, len(folder.files), 36)]
    frames = [np.kron(read_image(p), np.ones((8, 8), np.uint8)) for p in picks]  # 64x64, crisp edges
    video = make_video(tmp_path / "digits.avi", frames, fps=30)
    (tmp_path / "app.py").write_text(code)
    out = subprocess.run([sys.executable, "app.py", str(converted("int8")), str(video)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(frames)
    predicted = [line.split()[1] for line in lines]
    assert sum(p == t for p, t in zip(predicted, labels)) >= len(labels) - 1
