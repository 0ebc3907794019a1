"""Every code block of the README and the docs is checked against the code it shows: each `edgekit` command
line parses with the real CLI (usage synopses: every flag they name exists), each Python block compiles and
calls `edgekit` functions and specs with parameters they take. The blocks that run as written have tests of
their own (the Pi app: test_pi_app.py, the Python API: test_api.py, the quick start: test_demo.py)."""

from __future__ import annotations

import ast
import inspect
import re
import shlex
from pathlib import Path

import click
import pytest

import edgekit
from edgekit.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(kind: str) -> list[tuple[str, str]]:
    """(where, code) of every fenced block of this language."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) == kind:
                line = text[: match.start()].count("\n") + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", match.group(2)))
    return found


def command_lines(code: str) -> list[str]:
    """The `edgekit ...` commands of a shell block, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines: list[str] = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("edgekit "):
            lines.append(line)
        elif lines and line.startswith("["):  # a usage synopsis runs on over several lines
            lines[-1] += " " + line
    return lines


def _command(name: str) -> click.Command:
    command = cli.commands.get(name)
    assert command is not None, f"no edgekit {name}"
    return command


def _options(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for p in command.params:
        names.update(p.opts)
        names.update(getattr(p, "secondary_opts", ()))
    return names


def test_the_documents_have_code_to_check():
    assert len(blocks("bash")) > 20 and len(blocks("python")) >= 4


@pytest.mark.parametrize("where, code", blocks("bash"), ids=lambda v: v if ":" in v and "\n" not in v else "")
def test_every_edgekit_command_in_the_docs_is_one_the_cli_takes(where, code):
    for line in command_lines(code):
        words = line.split()
        command = _command(words[1])
        if "[" in line or "|" in line or "..." in line:  # a usage synopsis: every flag it names exists
            flags = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", line.replace("--[no-]", "--")))
            unknown = {f for f in flags if f not in _options(command)
                       and f.replace("--", "--no-", 1) not in _options(command)}
            assert not unknown, f"{where}: edgekit {words[1]} has no {', '.join(sorted(unknown))}"
            continue
        args = shlex.split(line)[2:]
        try:
            command.make_context(f"edgekit {words[1]}", args, resilient_parsing=False)
        except click.exceptions.Exit:
            pass
        except click.UsageError as exc:
            pytest.fail(f"{where}: `{line}`: {exc.format_message()}")


def _calls(tree: ast.AST):
    """(name, keyword names) of every call to edgekit.NAME(...) in a block."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "edgekit":
            yield node.func.attr, [k.arg for k in node.keywords if k.arg is not None]


@pytest.mark.parametrize("where, code", blocks("python"), ids=lambda v: v if ":" in v and "\n" not in v else "")
def test_every_python_block_compiles_and_calls_edgekit_with_parameters_it_takes(where, code):
    tree = compile(code, where, "exec", ast.PyCF_ONLY_AST)
    for name, keywords in _calls(tree):
        target = getattr(edgekit, name, None)
        assert target is not None, f"{where}: edgekit.{name} does not exist"
        params = inspect.signature(target).parameters
        unknown = [k for k in keywords if k not in params]
        assert not unknown, f"{where}: edgekit.{name} takes no {', '.join(unknown)}"
