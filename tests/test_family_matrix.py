"""The family matrix (issue 28) in the slow tier: scripts/family_table.py builds one trained model per family
and runs each through every mode next to the plain converter, on held-out samples, with bench and
Model.predict on each file; it exits 1 on any cell that misses the acceptance (a crash, exit 70, a refusal
where the plain converter works, worse than plain past the tolerance). About 25 minutes on 2 cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_family_in_every_mode_meets_the_plain_converter(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "family_table.py"), "--json",
                           str(tmp_path / "rows.json"), "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=3600)
    print(proc.stdout)
    rows = json.loads((tmp_path / "rows.json").read_text())
    problems = [f"{r['family']} {r['mode']}: {p}" for r in rows for p in r["problems"]]
    assert proc.returncode == 0 and not problems, "\n".join(problems) or proc.stderr[-2000:]
    assert not [r for r in rows if r["exit"] < 0 or r["exit"] == 70]
