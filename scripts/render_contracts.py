#!/usr/bin/env python3
"""Render edgekit's JSON contracts (edgekit/schemas/*.schema.json) and its exit codes (edgekit/errors.py)
into the README and the docs.

Usage::

    python scripts/render_contracts.py [--check]

Each contract has a block in one of README.md and docs/*.md between ``<!-- contract:edgekit.bench/1 -->``
and ``<!-- /contract:edgekit.bench/1 -->``, and the exit codes one between ``<!-- exit-codes -->`` and
``<!-- /exit-codes -->`` wherever they are shown; the script rewrites what lies between the markers as a
table generated from the source, and leaves the rest of each file alone. ``--check`` writes nothing and
exits 1, naming each stale or missing block.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgekit.contracts import SCHEMAS, load_schema  # noqa: E402
from edgekit.errors import EXIT_CODES  # noqa: E402

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

TITLES = {load_schema(name)["$id"]: name for name in SCHEMAS}


def _code(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def type_label(schema: dict[str, Any]) -> str:
    """A short human type: `"edgekit.bench/1"`, integer, number or null, array of object, {string: number}."""
    if "$ref" in schema:
        base, _, fragment = schema["$ref"].partition("#")
        name = TITLES[base]
        return f"as `{fragment.rsplit('/', 1)[-1]}` in {name}" if fragment else f"an {name} report"
    if "const" in schema:
        return _code(schema["const"])
    if "enum" in schema:
        return " or ".join(_code(v) for v in schema["enum"])
    types = schema.get("type", "any")
    parts = []
    for kind in [types] if isinstance(types, str) else types:
        if kind == "array":
            parts.append("array of " + type_label(schema.get("items", {})))
        elif kind == "object" and isinstance(schema.get("additionalProperties"), dict) and "properties" not in schema:
            parts.append("{string: " + type_label(schema["additionalProperties"]) + "}")
        else:
            parts.append(kind)
    return " or ".join(parts)


def rows(schema: dict[str, Any], prefix: str = "") -> list[tuple[str, str, str]]:
    """(key path, type, description) of every documented key, depth first."""
    out = []
    required = set(schema.get("required", ()))
    for key, sub in schema.get("properties", {}).items():
        path = prefix + key
        label = type_label(sub) + ("" if key in required else ", optional")
        out.append((path, label, sub.get("description", "")))
        out += _children(sub, path)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in schema and "description" in extra:
        out.append((prefix + "*", type_label(extra) + ", optional", extra["description"]))
    return out


def _children(sub: dict[str, Any], path: str) -> list[tuple[str, str, str]]:
    if "$ref" in sub:
        return []
    if "properties" in sub:
        return rows(sub, path + ".")
    items = sub.get("items")
    if isinstance(items, dict) and "properties" in items:
        return rows(items, path + "[].")
    values = sub.get("additionalProperties")
    if isinstance(values, dict) and "properties" in values:
        return rows(values, path + ".*.")
    return []


def render(name: str) -> str:
    """The README block of one contract (what goes between its markers)."""
    schema = load_schema(name)
    lines = [f"From `edgekit/schemas/{SCHEMAS[name]}` (`scripts/render_contracts.py` writes this table). A key "
             "marked optional may be absent, every other one is always there; `a[].b` is key `b` of each item "
             "of `a`, `a.*.b` of each value of `a`.",
             "", "| key | type | description |", "| --- | --- | --- |"]
    for path, label, description in rows(schema):
        cells = (f"`{path}`", label, description)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def render_exit_codes() -> str:
    lines = ["| code | meaning |", "| --- | --- |"]
    lines += [f"| {code} | {meaning.replace('|', chr(92) + '|')} |" for code, meaning in EXIT_CODES]
    return "\n".join(lines)


def _block(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(rf"(<!-- contract:{n} -->\n)(.*?)(<!-- /contract:{n} -->)", re.S)


EXIT_BLOCK = re.compile(r"(<!-- exit-codes -->\n)(.*?)(<!-- /exit-codes -->)", re.S)


def update(texts: dict[Path, str]) -> tuple[dict[Path, str], list[str], list[str]]:
    """(every document with its blocks regenerated, the blocks that changed, contracts shown nowhere)."""
    stale, seen = [], set()
    out = dict(texts)
    jobs = [(name, _block(name), "\n" + render(name) + "\n\n") for name in SCHEMAS]
    jobs.append(("exit codes", EXIT_BLOCK, render_exit_codes() + "\n"))
    for path, text in texts.items():
        for name, pattern, body in jobs:
            for match in reversed(list(pattern.finditer(text))):
                seen.add(name)
                if match.group(2) != body:
                    stale.append(f"{name} in {path.parent.name}/{path.name}")
                    text = text[: match.start(2)] + body + text[match.end(2):]
        out[path] = text
    missing = [name for name, _, _ in jobs if name not in seen]
    return out, stale, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="Write nothing; exit 1 when a block is stale.")
    p.add_argument("--root", type=Path, default=None, help="Render a copy of the documents in this folder.")
    args = p.parse_args(argv)
    documents = DOCUMENTS if args.root is None else \
        [args.root / "README.md", *sorted((args.root / "docs").glob("*.md"))]
    texts = {path: path.read_text(encoding="utf-8") for path in documents if path.exists()}
    new, stale, missing = update(texts)
    for name in missing:
        print(f"no block shows {name}: add its markers to README.md or a page in docs/", file=sys.stderr)
    if args.check or missing:
        for name in stale:
            print(f"the {name} block is stale; run python scripts/render_contracts.py", file=sys.stderr)
        return 1 if stale or missing else 0
    for path, text in new.items():
        if text != texts[path]:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"rewrote {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
