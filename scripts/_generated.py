"""What the generators in scripts/ share: write a generated file, or check the one on disk is current."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_or_check(output: Path, text: str, *, check: bool, script: str, summary: str) -> int:
    """With `check`: 0 when `output` holds `text`, else 1 and how to renew it. Otherwise write it and print
    `summary` after "wrote PATH: "."""
    shown = output.relative_to(REPO_ROOT)
    if check:
        if (output.read_text() if output.exists() else "") != text:
            print(f"{shown} is stale; run: python scripts/{script}", file=sys.stderr)
            return 1
        print(f"{shown} is up to date")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    print(f"wrote {shown}: {summary}")
    return 0
