"""The house's layers only point down (ARCHITECTURE.md): a base (errors, atomic files, metrics, intervals, the
version, progress lines, option declarations) imports nothing else of edgekit; runtime/ imports only the base; converters/ the base and
runtime/; the front (CLI, API, harness, reports) anything. Every import counts, function-level ones
included, and no two modules may import each other through any chain (a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

FOLDERS = {"edgekit": "edgekit", "converters": "edgekit.converters", "runtime": "edgekit.runtime"}
BASE = {"edgekit._version", "edgekit.declare", "edgekit.errors", "edgekit.files", "edgekit.intervals",
        "edgekit.metrics", "edgekit.progress"}
ALLOWED = {"base": {"base"}, "runtime": {"base", "runtime"}, "converters": {"base", "runtime", "converters"},
           "front": {"base", "runtime", "converters", "front"}}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def layer(module: str) -> str:
    if module in BASE:
        return "base"
    for package, name in (("edgekit.runtime", "runtime"), ("edgekit.converters", "converters")):
        if module == package or module.startswith(package + "."):
            return name
    return "front"


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """edgekit modules that `path` imports anywhere in its body; `from pkg import name` counts the
    submodule when `name` is one, else the package itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "edgekit"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "edgekit":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def test_every_import_points_down_or_sideways():
    wrong = [f"{m} ({layer(m)}) imports {t} ({layer(t)})" for m, targets in graph().items() for t in sorted(targets)
             if layer(t) not in ALLOWED[layer(m)]]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    g = graph()
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(g[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The walk is not vacuous: it finds the edges that exist, function-level ones included."""
    g = graph()
    assert "edgekit.errors" in g["edgekit.runtime.model"]
    assert "edgekit.runtime.timing" in g["edgekit.converters.autopilot"]  # imported inside a function
    assert layer("edgekit.cli") == "front" and "front" not in ALLOWED["runtime"]
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from edgekit.harness import bench\n")
    assert imports(bad, modules()) == {"edgekit.harness"}
