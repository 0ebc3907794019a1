"""The row keeping of the table scripts (zoo_table, family_table): each measured row is checked, kept,
printed as it comes (a JSON line on stderr) and, with --json, the rows so far are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable


def record(rows: list[dict], row: dict, check: Callable[[dict], list[str]], json_path: Path | None) -> bool:
    """Keep `row` with its problems (`check(row)`); True when it has any."""
    row["problems"] = check(row)
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1) + "\n")
    return bool(row["problems"])
