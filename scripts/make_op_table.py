#!/usr/bin/env python3
"""Build runtime/data/op_table.json: per builtin operator, which inputs may be omitted (-1) and how many
inputs/outputs the LiteRT kernel accepts.

The table is *derived*, not hand-written. It is parsed out of LiteRT's own kernel sources: the builtin
registrations in ``tflite/core/kernels/register.cc`` (``AddBuiltin(BuiltinOperator_X, Register_Y())``)
and, for each ``Register_Y``, the kernel file that defines it. From the functions named in the
``TfLiteRegistration`` (init/free/prepare/invoke) the script follows the calls they make into functions
of the same file, of the kernel headers it includes and of the ``.cc`` files implementing those headers
(constructors of ``OpContext``-style structs included), and collects:

* the operand-count checks on ``NumInputs(node)`` / ``node->inputs->size`` (and the outputs
  likewise) made with ``TF_LITE_ENSURE*`` or by an ``if`` chain whose branch returns ``kTfLiteError``.
  Only checks every invocation passes through (top level of a function reached through top-level calls)
  narrow the count; checks on conditional paths are listed as evidence and otherwise ignored;
* every read of an input position: ``GetOptionalInputTensor`` or an explicit comparison with
  ``kTfLiteOptionalTensor`` / ``-1`` (*optional*), ``GetInput`` whose result is tested against null
  and the kernel carries on (*nullchecked*), ``GetInputSafe`` or a null test that ends in an error
  (-1 is refused with an error: *safe*), and ``GetInput`` / ``GetVariableInput`` whose result is
  used without a null test (-1 becomes a null pointer: *unchecked*). ``optional_inputs`` is the union
  of the optional and nullchecked positions.

Constant names (``kBiasTensor``) resolve through ``constexpr``/``const`` ints and enums of the file and
of the kernel headers it includes (``lstm_shared.h``). Ambiguity is resolved towards more optional
positions and wider counts, and the entry gets ``"uncertain": true`` with reasons. A verbatim copy of
the kernel sources (and of ``schema.fbs``, for the list of ops) is read from
``scripts/third_party/litert_kernels/`` (not committed: another project's source). Its ``SOURCE`` file
names the repo and commit; ``import`` fills the folder from a git checkout or mirror of LiteRT.

Commands (paths are resolved against the repository root):

  python scripts/make_op_table.py import --git-dir DIR [--commit C]  # copy the kernel sources here
  python scripts/make_op_table.py [--src DIR]            # regenerate the JSON (offline, stdlib only)
  python scripts/make_op_table.py --check                # exit 1 if the JSON on disk is stale
  python scripts/make_op_table.py probe [--repeat 5] [--json OUT] [--emit-python] [-v]
                                                         # empirical check against ai_edge_litert

``probe`` needs ``flatbuffers`` and ``ai_edge_litert``. For a sample of ops (``probe_cases()``) it
builds one-operator float32 / int8 models with one input index set to -1 (and with one input too few
or too many) and loads, allocates and invokes each in a child process, with the builtin kernels only
(``BUILTIN_WITHOUT_DEFAULT_DELEGATES``) and with the default resolver (XNNPACK delegate applied),
recording crash (signal), Python error or ok, and compares that with the table. ``--emit-python``
prints the ``PROBED*`` literals below, which the JSON carries as its empirical part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _generated import write_or_check

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIR = REPO_ROOT / "scripts" / "third_party" / "litert_kernels"
OUTPUT = REPO_ROOT / "runtime" / "data" / "op_table.json"
FORMAT_VERSION = 1
REGISTER_CC = "tflite/core/kernels/register.cc"
SCHEMA_FBS = "tflite/converter/schema/schema.fbs"
KERNEL_DIR = "tflite/kernels"
MAX_COUNT = 64  # operand counts are evaluated on 0..MAX_COUNT; allowed MAX_COUNT means "no upper bound"

SOURCE_FIELD_RE = re.compile(r"^(repo|commit|url|licence|committed):\s*(.+?)\s*$", re.M)

# --------------------------------------------------------------------------------------
# Empirical results: the output of `probe --repeat 5 --emit-python` (see runtime/data/README.md), run
# with the table at PROBED_SUMMARY["against_commit"]. Not derivable from the sources; copied into the JSON
# as top-level "probe" and per-op "observed". Per op and dtype, per resolver (no_delegate: the builtin
# kernels only; xnnpack: the default resolver, which applies the XNNPACK delegate), the variants that
# loaded+ran ("ok"), raised ("error") or killed the process ("crash", with runs crashed/runs made):
# "-1@P" = input P set to -1, "inputs=N" = the operator given N inputs (last dropped / repeated).
# Re-run the probe whenever the kernel sources are replaced.
# --------------------------------------------------------------------------------------
PROBE_COMMAND = "python scripts/make_op_table.py probe --repeat 5 --emit-python"
PROBED_SUMMARY = {"runtime": "ai-edge-litert 2.3.0", "against_commit": "f67457790c9c2ab67347d6fe53270e8d3df20868", "repeat": 5, "cases": 34, "models": 203, "baselines_ok": {"nodelegate": 34, "xnnpack": 34}, "required_positions": {"nodelegate": {"cases": 77, "crash": 12, "error": 65, "ok": 0, "timeout": 0}, "xnnpack": {"cases": 77, "crash": 44, "error": 33, "ok": 0, "timeout": 0}}, "optional_positions": {"nodelegate": {"cases": 24, "ok": 12, "error": 10, "crash": 2}, "xnnpack": {"cases": 24, "ok": 12, "error": 10, "crash": 2}}, "kernel_crash_vs_error_predicted": "74 of 77 refused required positions, without delegate", "input_count_variants": {"nodelegate": {"cases": 68, "table_refused": 56, "table_refused_and_refused": 56, "table_accepted": 8, "table_accepted_and_loaded": 6}, "xnnpack": {"cases": 68, "table_refused": 56, "table_refused_and_refused": 54, "table_accepted": 8, "table_accepted_and_loaded": 6}}}
PROBED = {
    'ADD': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (3/5)", "-1@1 (3/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'ATAN2': {"f32": {"no_delegate": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'BATCH_MATMUL': {"f32": {"no_delegate": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)", "inputs=1 (4/5)"], "ok": ["inputs=3"]}}},
    'CONCATENATION': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1"], "ok": ["inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (4/5)", "-1@1 (4/5)"], "ok": ["inputs=1", "inputs=3"]}}, "i8": {"no_delegate": {"error": ["-1@0", "-1@1"], "ok": ["inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (4/5)", "-1@1 (4/5)"], "ok": ["inputs=1", "inputs=3"]}}},
    'CONV_2D': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "inputs=2", "inputs=4"]}, "xnnpack": {"error": ["-1@0", "-1@2", "inputs=2", "inputs=4"], "crash": ["-1@1 (4/5)"]}}, "i8": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "inputs=2", "inputs=4"]}, "xnnpack": {"error": ["-1@0", "-1@2", "inputs=2", "inputs=4"], "crash": ["-1@1 (4/5)"]}}},
    'CONV_3D': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=4"], "ok": ["-1@2", "inputs=2"]}, "xnnpack": {"error": ["-1@0", "-1@1", "inputs=4"], "ok": ["-1@2", "inputs=2"]}}},
    'DEPTHWISE_CONV_2D': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "inputs=4"], "crash": ["inputs=2 (5/5)"]}, "xnnpack": {"error": ["-1@0", "-1@2", "inputs=4"], "crash": ["-1@1 (5/5)", "inputs=2 (5/5)"]}}, "i8": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "inputs=4"], "crash": ["inputs=2 (5/5)"]}, "xnnpack": {"error": ["-1@0", "-1@2", "inputs=4"], "crash": ["-1@1 (4/5)", "inputs=2 (5/5)"]}}},
    'DEQUANTIZE': {"i8": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (4/5)"], "error": ["inputs=0", "inputs=2"]}}},
    'DIV': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (3/5)", "-1@1 (3/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'EXP': {"f32": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (3/5)"], "error": ["inputs=0", "inputs=2"]}}},
    'FULLY_CONNECTED': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=4"], "ok": ["-1@2", "inputs=2"]}, "xnnpack": {"error": ["-1@0", "inputs=4"], "crash": ["-1@1 (3/5)"], "ok": ["-1@2", "inputs=2"]}}, "i8": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=4"], "ok": ["-1@2", "inputs=2"]}, "xnnpack": {"error": ["-1@0", "inputs=4"], "crash": ["-1@1 (4/5)"], "ok": ["-1@2", "inputs=2"]}}},
    'LOGISTIC': {"f32": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (4/5)"], "error": ["inputs=0", "inputs=2"]}}, "i8": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (5/5)"], "error": ["inputs=0", "inputs=2"]}}},
    'MAXIMUM': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'PADV2': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=4"], "ok": ["-1@2", "inputs=2"]}, "xnnpack": {"error": ["-1@0", "-1@1", "inputs=4"], "ok": ["-1@2", "inputs=2"]}}},
    'QUANTIZE': {"f32": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (4/5)"], "error": ["inputs=0", "inputs=2"]}}},
    'RESHAPE': {"f32": {"no_delegate": {"error": ["-1@0", "inputs=3"], "crash": ["-1@1 (5/5)"], "ok": ["inputs=1"]}, "xnnpack": {"crash": ["-1@0 (1/5)", "-1@1 (5/5)"], "ok": ["inputs=1"], "error": ["inputs=3"]}}},
    'SOFTMAX': {"f32": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"error": ["-1@0", "inputs=0", "inputs=2"]}}, "i8": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"error": ["-1@0", "inputs=0", "inputs=2"]}}},
    'SQUARED_DIFFERENCE': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (3/5)", "-1@1 (3/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'STRIDED_SLICE': {"f32": {"no_delegate": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)", "-1@2 (5/5)", "-1@3 (5/5)"], "error": ["inputs=3", "inputs=5"]}, "xnnpack": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)", "-1@2 (5/5)", "-1@3 (5/5)", "inputs=3 (4/5)"], "ok": ["inputs=5"]}}},
    'SUB': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (3/5)", "-1@1 (3/5)"], "error": ["inputs=1", "inputs=3"]}}, "i8": {"no_delegate": {"error": ["-1@0", "-1@1", "inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (3/5)", "-1@1 (3/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'SVDF': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "-1@4", "inputs=4", "inputs=6"], "ok": ["-1@3"]}, "xnnpack": {"error": ["-1@0", "-1@1", "-1@2", "-1@4", "inputs=4", "inputs=6"], "ok": ["-1@3"]}}},
    'TANH': {"f32": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (3/5)"], "error": ["inputs=0", "inputs=2"]}}, "i8": {"no_delegate": {"error": ["-1@0", "inputs=0", "inputs=2"]}, "xnnpack": {"crash": ["-1@0 (3/5)"], "error": ["inputs=0", "inputs=2"]}}},
    'TRANSPOSE': {"f32": {"no_delegate": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}}, "i8": {"no_delegate": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (5/5)", "-1@1 (5/5)"], "error": ["inputs=1", "inputs=3"]}}},
    'TRANSPOSE_CONV': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "inputs=5"], "ok": ["-1@3", "inputs=3"]}, "xnnpack": {"crash": ["-1@0 (1/5)", "-1@1 (4/5)"], "error": ["-1@2", "inputs=5"], "ok": ["-1@3", "inputs=3"]}}},
    'UNIDIRECTIONAL_SEQUENCE_LSTM': {"f32": {"no_delegate": {"error": ["-1@0", "-1@1", "-1@2", "-1@3", "-1@4", "-1@5", "-1@6", "-1@7", "-1@8", "-1@9", "-1@10", "-1@11", "-1@13", "-1@14", "-1@15", "-1@16", "-1@18", "-1@19", "-1@20", "-1@22", "-1@23", "-1@1,5,9,12", "inputs=23", "inputs=25"], "crash": ["-1@12 (5/5)"], "ok": ["-1@17", "-1@21", "-1@9,10,11", "-1@16,17", "-1@20,21,22,23", "-1@1,5,9,12,20"]}, "xnnpack": {"error": ["-1@0", "-1@1", "-1@2", "-1@3", "-1@4", "-1@5", "-1@6", "-1@7", "-1@8", "-1@9", "-1@10", "-1@11", "-1@13", "-1@14", "-1@15", "-1@16", "-1@18", "-1@19", "-1@20", "-1@22", "-1@23", "-1@1,5,9,12", "inputs=23", "inputs=25"], "crash": ["-1@12 (5/5)"], "ok": ["-1@17", "-1@21", "-1@9,10,11", "-1@16,17", "-1@20,21,22,23", "-1@1,5,9,12,20"]}}},
}


# --------------------------------------------------------------------------------------
# import: copy the kernel sources out of a git checkout or bare mirror
# --------------------------------------------------------------------------------------


def cmd_import(args) -> int:
    git = ["git", "--git-dir", args.git_dir]
    commit = subprocess.run(git + ["rev-parse", args.commit], capture_output=True, text=True,
                            check=True).stdout.strip()
    names = subprocess.run(git + ["ls-tree", "--name-only", commit, KERNEL_DIR + "/"], capture_output=True,
                           text=True, check=True).stdout.split()
    wanted = [n for n in names if n.endswith((".cc", ".h")) and not n.endswith("_test.cc")
              and not n.endswith("_test.h")] + [REGISTER_CC, SCHEMA_FBS]
    dest = Path(args.dest) if args.dest else SOURCE_DIR
    dest.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        blob = subprocess.run(git + ["show", f"{commit}:{name}"], capture_output=True, check=True).stdout
        out = dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(blob)
    date = subprocess.run(git + ["show", "-s", "--format=%cI", commit], capture_output=True, text=True,
                          check=True).stdout.strip()
    (dest / "SOURCE").write_text(
        f"repo: {args.repo}\ncommit: {commit}\ncommitted: {date}\n"
        f"url: https://github.com/{args.repo}/tree/{commit}/{KERNEL_DIR}\n"
        "licence: Apache-2.0 (the upstream licence headers are kept in the copied files)\n"
        f"files: {len(wanted)} files copied verbatim from {KERNEL_DIR}/ (no tests), {REGISTER_CC} and "
        f"{SCHEMA_FBS}\n")
    print(f"copied {len(wanted)} files of {args.repo}@{commit[:12]} into {dest}")
    return 0


# --------------------------------------------------------------------------------------
# A small C++ reader: comments/strings blanked (positions kept), namespaces, functions, constants
# --------------------------------------------------------------------------------------
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "catch", "else", "do", "case", "new",
             "delete", "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "decltype",
             "alignof", "defined", "static_assert", "typeid", "noexcept"}
_COUNT_IN = re.compile(r"(?:\b(?:tflite|::)?(?:::)?NumInputs\s*\(\s*&?\s*\w+\s*\)|"
                       r"\b\w+\s*(?:->|\.)\s*inputs\s*->\s*size\b)")
_COUNT_OUT = re.compile(r"(?:\b(?:tflite|::)?(?:::)?NumOutputs\s*\(\s*&?\s*\w+\s*\)|"
                        r"\b\w+\s*(?:->|\.)\s*outputs\s*->\s*size\b)")


def clean_source(text: str) -> str:
    """Blank comments, string/char literal contents and preprocessor lines; keep every offset."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i  # preprocessor directive, possibly continued with backslashes
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("//", j):
                    while j < n and text[j] != "\n":
                        j += 1
                    break
                if text.startswith("/*", j):
                    e = text.find("*/", j + 2)
                    j = n if e < 0 else e + 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 2, j - 1)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def macro_definitions(text: str) -> dict[str, tuple[list[str], str]]:
    """Function-like #define macros of a file (raw text): name -> (params, body)."""
    macros = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", text, re.M):
        body = m.group(3).replace("\\\n", "\n")
        macros[m.group(1)] = ([p.strip() for p in m.group(2).split(",") if p.strip()], body)
    return macros


def match_close(text: str, i: int, open_c: str = "{", close_c: str = "}") -> int:
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_c:
            depth += 1
        elif text[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def split_args(s: str) -> list[str]:
    """Split a call's argument text at top-level commas (parentheses/brackets/braces aware)."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return [a.strip() for a in out]


class Func:
    def __init__(self, name, ns, params, start, end, file, line, in_class, text):
        self.name, self.ns, self.params = name, ns, params
        self.start, self.end = start, end  # body: text[start] == "{", text[end] == "}"
        self.file, self.line, self.in_class, self.text = file, line, in_class, text
        self.body_start = start
        args = split_args(params)
        if args in ([], ["void"]):
            self.arity = (0, 0)
        else:
            self.arity = (sum(1 for a in args if "=" not in a), len(args))

    @property
    def body(self) -> str:
        """The body from its '{'; a constructor's initializer list is included (its ':' becomes the '{'),
        so that offset k in the body is offset body_start + k in the file."""
        if self.body_start == self.start:
            return self.text[self.start:self.end + 1]
        return "{" + self.text[self.body_start + 1:self.start] + " " + self.text[self.start + 1:self.end + 1]

    def __repr__(self):
        return f"{'::'.join(self.ns + [self.name])}@{self.file}:{self.line}"


class SourceFile:
    """One kernel file, cleaned and indexed."""

    def __init__(self, rel: str, raw: str):
        self.rel, self.raw = rel, raw
        self.text = clean_source(raw)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", raw)]
        self.funcs: list[Func] = []
        self.consts: list[tuple[str, list[str], int]] = []  # (name, ns, value)
        self.includes = re.findall(r'^\s*#\s*include\s+"([^"]+)"', raw, re.M)
        self.macros = macro_definitions(raw)
        self._scan(self.text, 0, len(self.text), [], False)
        self._expand_function_macros()

    def line_of(self, pos: int) -> int:
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def _scan(self, text, start, end, ns, in_class, file_text=None, line_override=None):
        file_text = text if file_text is None else file_text
        i, seg = start, start
        while i < end:
            c = text[i]
            if c in ";}":
                self._constants(text[seg:i + 1], ns)
                seg = i + 1
            elif c == "{":
                header = text[seg:i]
                close = match_close(text, i)
                h = " ".join(header.split())
                m = re.search(r"\bnamespace\s*([\w:]*)\s*$", h)
                if m:
                    self._scan(text, i + 1, close, ns + (m.group(1).split("::") if m.group(1) else ["(anon)"]),
                               False, file_text, line_override)
                elif re.search(r'\bextern\s*"\s*"\s*$', h):
                    self._scan(text, i + 1, close, ns, False, file_text, line_override)
                elif re.search(r"\benum\b", h):
                    self._enum(text[i + 1:close], ns)
                elif re.search(r"\b(class|struct|union)\s+(\w+)[^()=]*$", h):
                    name = re.search(r"\b(class|struct|union)\s+(\w+)", h).group(2)
                    self._scan(text, i + 1, close, ns + [name], True, file_text, line_override)
                else:
                    f = self._function_header(h)
                    if f is not None:
                        name, params, qual = f
                        line = line_override if line_override is not None else self.line_of(i)
                        func = Func(name, list(ns) + qual, params, i, close, self.rel, line,
                                    in_class or bool(qual), file_text)
                        ctor = re.search(r"\)\s*(:)\s*\w[^;{}]*$", text[seg:i])
                        if ctor:  # constructor initializer list: analysed as part of the body
                            func.body_start = seg + ctor.start(1)
                        self.funcs.append(func)
                i = close + 1
                seg = i
                continue
            i += 1

    @staticmethod
    def _function_header(h: str):
        h = h.strip()
        if not h.endswith(")") and not re.search(r"\)\s*(const|override|final|noexcept|mutable|\s)*"
                                                   r"(->\s*[\w:<>*&\s]+)?$", h):
            return None
        if re.search(r"\)\s*:\s*\w", h):  # constructor initializer list: name is the one before ':'
            h = h[:re.search(r"\)\s*:\s*\w", h).start() + 1]
        close = h.rfind(")")
        depth = 0
        for k in range(close, -1, -1):
            if h[k] == ")":
                depth += 1
            elif h[k] == "(":
                depth -= 1
                if depth == 0:
                    break
        else:
            return None
        before = h[:k].rstrip()
        if re.search(r"=\s*(\[.*)?$", before) or before.endswith("]"):
            return None  # initializer or lambda
        if before.endswith(">"):  # explicit specialization Name<...>(
            d = 0
            for q in range(len(before) - 1, -1, -1):
                d += {">": 1, "<": -1}.get(before[q], 0)
                if d == 0:
                    before = before[:q].rstrip()
                    break
        m = re.search(r"((?:\w+\s*::\s*)*)(~?\w+)$", before)
        if not m or m.group(2) in _KEYWORDS or "=" in before.split("(")[0][-3:]:
            return None
        qual = [q for q in re.split(r"\s*::\s*", m.group(1)) if q]
        return m.group(2), h[k + 1:close], qual

    def _constants(self, stmt: str, ns):
        for m in re.finditer(r"\b(?:static\s+)?(?:constexpr|const)\s+(?:static\s+)?(?:unsigned\s+)?"
                             r"(?:int|int32_t|int64_t|size_t|std::size_t|uint32_t|short|long|auto)\s+(\w+)\s*"
                             r"(?:=\s*|\{\s*)(-?\d+)\s*[;}]", stmt):
            self.consts.append((m.group(1), list(ns), int(m.group(2))))

    def _enum(self, body: str, ns):
        value = -1
        for item in split_args(body):
            m = re.match(r"(\w+)\s*(?:=\s*(.+))?$", item.strip())
            if not m:
                continue
            if m.group(2) is not None:
                v = eval_int(m.group(2), lambda name: self._enum_lookup(name, ns))
                if v is None:
                    break
                value = v
            else:
                value += 1
            self.consts.append((m.group(1), list(ns), value))

    def _enum_lookup(self, name, ns):
        for n, _, v in reversed(self.consts):
            if n == name:
                return v
        return None

    def _expand_function_macros(self):
        """Functions defined by a function-like macro (e.g. GENERIC_PREPARE(PrepareSin, ...))."""
        for mname, (params, body) in self.macros.items():
            if "TfLiteNode" not in body or "{" not in body:
                continue
            for m in re.finditer(r"\b" + mname + r"\s*\(", self.text):
                if self._inside_function(m.start()):
                    continue
                close = match_close(self.text, m.end() - 1, "(", ")")
                args = split_args(self.raw[m.end():close])
                if len(args) != len(params):
                    continue
                expanded = body
                for p, a in zip(params, args):
                    expanded = re.sub(r"(?<!#)\b" + re.escape(p) + r"\b", a, expanded)
                expanded = clean_source(expanded.replace("##", ""))
                ns = self.namespace_at(m.start())
                self._scan(expanded, 0, len(expanded), ns, False, expanded, self.line_of(m.start()))

    def _inside_function(self, pos):
        return any(f.start <= pos <= f.end and f.text is self.text for f in self.funcs)

    def namespace_at(self, pos: int) -> list[str]:
        """Namespace path at an offset (from the namespace blocks of the cleaned text)."""
        ns, stack = [], []
        for m in re.finditer(r"\bnamespace\s*([\w:]*)\s*\{|[{}]", self.text[:pos]):
            if m.group(0).startswith("namespace"):
                stack.append(m.group(1).split("::") if m.group(1) else ["(anon)"])
            elif m.group(0) == "{":
                stack.append(None)
            elif stack:
                stack.pop()
        for s in stack:
            if s:
                ns.extend(s)
        return ns


def eval_int(expr: str, lookup) -> int | None:
    """Evaluate a small integer expression with named constants; None if it cannot."""
    expr = expr.strip()
    names = set(re.findall(r"[A-Za-z_][\w:]*", expr))
    env = {}
    for name in names:
        v = lookup(name)
        if v is None:
            return None
        key = "_c" + str(len(env))
        env[key] = v
        expr = re.sub(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])", key, expr)
    if not re.fullmatch(r"[\s\d_c+\-*/()%]*", expr):
        return None
    try:
        v = eval(expr.replace("/", "//"), {"__builtins__": {}}, env)  # noqa: S307 - digits/operators only
    except Exception:
        return None
    return v if isinstance(v, int) else None


# --------------------------------------------------------------------------------------
# The kernel corpus: registrations, call graph, facts per function
# --------------------------------------------------------------------------------------
class Corpus:
    def __init__(self, src_dir: Path):
        self.src_dir = src_dir
        self.files: dict[str, SourceFile] = {}
        for path in sorted((src_dir / KERNEL_DIR).glob("*")):
            if path.suffix in (".cc", ".h"):
                rel = path.relative_to(src_dir).as_posix()
                self.files[rel] = SourceFile(rel, path.read_text(encoding="utf-8"))
        self.register = (src_dir / REGISTER_CC).read_text(encoding="utf-8")
        self.by_name: dict[str, list[Func]] = {}
        for sf in self.files.values():
            for f in sf.funcs:
                self.by_name.setdefault(f.name, []).append(f)
        self.used_files: set[str] = {REGISTER_CC}
        self._tu: dict[str, set[str]] = {}
        self.const_files: set[str] = set()

    def registrations(self) -> list[tuple[str, str]]:
        text = clean_source(self.register)
        body = text[text.find("BuiltinOpResolver::BuiltinOpResolver()"):]
        body = body[:match_close(body, body.find("{")) + 1]
        pairs = re.findall(r"AddBuiltin\(\s*BuiltinOperator_(\w+)\s*,\s*(?:[\w:]*::)?(Register_\w+)\s*\(\s*\)", body)
        n_calls = len(re.findall(r"\bAddBuiltin\s*\(", body))
        if n_calls != len(pairs):
            raise SystemExit(f"{REGISTER_CC}: parsed {len(pairs)} of {n_calls} AddBuiltin calls")
        return pairs

    def register_function(self, name: str) -> Func | None:
        """The definition of Register_X in namespace ...::builtin (not ::custom)."""
        cands = [f for f in self.by_name.get(name, []) if "builtin" in f.ns and "custom" not in f.ns]
        if len(cands) > 1:
            raise SystemExit(f"{name}: defined {len(cands)} times: {cands}")
        return cands[0] if cands else None

    def translation_unit(self, rel: str) -> set[str]:
        """Files whose functions a call in `rel` may reach: the file, the kernel headers it includes and
        the .cc files implementing those headers (never kernel_util, whose accessors are what we classify)."""
        if rel not in self._tu:
            out = {rel}
            for h in self.headers_of(self.files[rel]):
                out.add(h.rel)
                impl = h.rel[:-2] + ".cc"
                if impl in self.files and impl != rel:
                    out.add(impl)
                    out.update(x.rel for x in self.headers_of(self.files[impl]))
            self._tu[rel] = {f for f in out if not f.rsplit("/", 1)[-1].startswith("kernel_util.")}
        return self._tu[rel]

    # ---- constants -------------------------------------------------------------------
    def headers_of(self, sf: SourceFile) -> list[SourceFile]:
        out = []
        for inc in sf.includes:
            if inc.startswith(KERNEL_DIR + "/") and inc in self.files and inc.count("/") == 2:
                out.append(self.files[inc])
        return out

    def resolve_const(self, name: str, sf: SourceFile, ns: list[str]) -> tuple[int | None, str | None]:
        """Value of a named constant visible from namespace ns of file sf: (value, where) or (None, why)."""
        parts = [p for p in name.split("::") if p]
        base, qual = parts[-1], parts[:-1]
        cands = []
        for f in [sf] + self.headers_of(sf):
            for n, cns, v in f.consts:
                if n != base:
                    continue
                named = [p for p in cns if p != "(anon)"]
                if qual and named[-len(qual):] != qual:
                    continue
                cands.append((cns, v, f.rel))
        if not cands:
            return None, f"unknown constant {name}"
        values = {v for _, v, _ in cands}
        if len(values) == 1:
            self.const_files.add(cands[0][2])
            return values.pop(), cands[0][2]
        # several values: take the innermost namespace enclosing the use
        best = [c for c in cands if ns[:len(c[0])] == c[0]]
        if best:
            best.sort(key=lambda c: len(c[0]), reverse=True)
            if len(best) == 1 or len(best[0][0]) > len(best[1][0]):
                self.const_files.add(best[0][2])
                return best[0][1], best[0][2]
        return None, f"ambiguous constant {name}: {sorted(values)}"

    # ---- call graph --------------------------------------------------------------------
    def candidates(self, caller: Func, qual: str, name: str, nargs: int | None, member: bool) -> list[Func]:
        defs = [f for f in self.by_name.get(name, []) if f.file in self.translation_unit(caller.file)]
        if member:
            defs = [f for f in defs if f.in_class]
        q = [p for p in qual.split("::") if p]
        if q:
            defs = [f for f in defs if [p for p in f.ns if p != "(anon)"][-len(q):] == q] or \
                [f for f in defs if q[-1] in f.ns]
        else:
            visible = [f for f in defs if caller.ns[:len(f.ns)] == f.ns]
            defs = visible or defs
        if nargs is not None:
            fit = [f for f in defs if f.arity[0] <= nargs <= f.arity[1]]
            defs = fit or defs
        return defs

    def references(self, func: Func):
        """Functions of the corpus referenced in func's body: (Func list, unconditional?)."""
        body = func.body
        depth_at = _depths(body)
        for m in re.finditer(r"(\.|->)?\s*\b((?:\w+::)*)(\w+)\b", body):
            member, qual, name = m.group(1), m.group(2), m.group(3)
            if name not in self.by_name:
                continue
            after = body[m.end():]
            nargs = None
            ta = re.match(r"\s*<", after)
            k = m.end()
            if ta:  # template arguments
                close = match_close(body, k + ta.end() - 1, "<", ">")
                k = close + 1
            pm = re.match(r"\s*\(", body[k:])
            if not pm and not member:  # `Type var(args)` / `Type var{args}`: a constructor call
                cm = re.match(r"\s*[&*]?\s*\w+\s*([({])", body[k:])
                if cm and any(f.in_class and f.ns and f.ns[-1] == name for f in self.by_name[name]):
                    opener = cm.group(1)
                    close = match_close(body, k + cm.end() - 1, opener, {"(": ")", "{": "}"}[opener])
                    nargs = len(split_args(body[k + cm.end():close]))
                    cands = self.candidates(func, qual, name, nargs, False)
                    if cands:
                        yield cands, depth_at[m.start(3)] == 1, m.start(3)
                    continue
            if pm:
                close = match_close(body, k + pm.end() - 1, "(", ")")
                nargs = len(split_args(body[k + pm.end():close]))
            if not pm and not re.match(r"\s*[,;)}]", body[k:]):
                continue  # neither a call nor a function pointer
            cands = self.candidates(func, qual, name, nargs, bool(member))
            if not cands:
                continue
            pos = m.start(3)
            yield cands, depth_at[pos] == 1, pos


def _depths(body: str) -> list[int]:
    out, d = [], 0
    for ch in body:
        if ch == "{":
            d += 1
            out.append(d)
            continue
        out.append(d)
        if ch == "}":
            d -= 1
    return out


# ---- facts inside one function -----------------------------------------------------------
_CHECK_RE = re.compile(r"\bTF_LITE_ENSURE(_EQ|_NEQ|_MSG|_GE|_GT|_LE|_LT)?\s*\(")
_ERR_RE = re.compile(r"\breturn\s+(?:kTfLiteError|absl::\w+Error|TfLiteStatus::kTfLiteError)\b")
_READ_RE = re.compile(r"\b(?:tflite::|::tflite::)?(GetInputSafe|GetOptionalInputTensor|GetInput|GetVariableInput|"
                      r"GetMutableInput|GetMutableInputSafe)\s*\(")
_DCHECK_RE = re.compile(r"\b(?:TFLITE_DCHECK|DCHECK|TFLITE_CHECK|CHECK|TFLITE_DCHECK_NE|DCHECK_NE|TFLITE_CHECK_NE)"
                        r"\s*\([^;]*\)\s*;")
_DATA_RE = re.compile(r"\b\w+\s*->\s*inputs\s*->\s*data\s*\[")


def _local_assignments(body: str) -> dict[str, str]:
    """name -> initializer text for simple local scalar variables (bool/int/auto)."""
    out = {}
    for m in re.finditer(r"\b(?:const\s+)?(?:bool|int|auto|size_t|int32_t|int64_t)\s+(\w+)\s*=\s*([^;{}]+);", body):
        name = m.group(1)
        if re.search(r"\bfor\s*\(\s*(?:const\s+)?$", body[:m.start()]):
            continue  # a loop variable
        if re.search(r"(?:\+\+|--)\s*" + name + r"\b|\b" + name + r"\s*(?:\+\+|--|[-+*/|&]?=(?!=))",
                     body[:m.start()] + body[m.end():]):
            continue  # assigned again: not a constant
        out.setdefault(name, m.group(2))
    return out


def _substitute_locals(expr: str, body_locals: dict[str, str]) -> str:
    """Replace local variables computed from the operand counts (has_bias = NumInputs(node) == 3)."""
    e = expr
    for _ in range(4):
        changed = False
        for name, init in body_locals.items():
            pat = r"(?<![\w.>])" + name + r"\b(?!\s*\()"
            if re.search(pat, e) and (_COUNT_IN.search(init) or _COUNT_OUT.search(init)
                                      or any(re.search(r"(?<![\w.>])" + n + r"\b", init) for n in body_locals
                                             if n != name and _mentions_counts(body_locals[n], {}))):
                e = re.sub(pat, lambda _m: "(" + init + ")", e)
                changed = True
        if not changed:
            break
    return e


def _mentions_counts(expr: str, body_locals: dict[str, str]) -> bool:
    e = _substitute_locals(expr, body_locals) if body_locals else expr
    return bool(_COUNT_IN.search(e) or _COUNT_OUT.search(e))


def _count_expr(expr: str, body_locals: dict[str, str], resolve) -> tuple[str | None, str | None]:
    """Rewrite a C condition about operand counts into Python over N (inputs) and M (outputs).

    Returns (python_expr, None) or (None, reason)."""
    e = _substitute_locals(expr, body_locals)
    e = _COUNT_IN.sub(" N ", e)
    e = _COUNT_OUT.sub(" M ", e)
    e = re.sub(r"\bstatic_cast\s*<[^>]*>", "", e)
    e = re.sub(r"\btrue\b", " True ", e)
    e = re.sub(r"\bfalse\b", " False ", e)
    e = e.replace("&&", " and ").replace("||", " or ")
    e = re.sub(r"!(?!=)", " not ", e)
    names = [n for n in re.findall(r"[A-Za-z_][\w:]*(?:\s*(?:->|\.)\s*\w+)*", e)
             if n not in ("N", "M", "and", "or", "not", "True", "False")]
    for name in names:
        v, why = resolve(name)
        if v is None:
            return None, why
        e = re.sub(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])", str(v), e)
    if not re.fullmatch(r"[\sNM\d()+\-*/<>=!%]*(?:(?:and|or|not|True|False)[\sNM\d()+\-*/<>=!%]*)*", e):
        return None, f"cannot evaluate {expr.strip()!r}"
    return e, None


def _allowed(py: str, var: str) -> set[int] | None:
    other = {"N": "M", "M": "N"}[var]
    if re.search(r"\b" + other + r"\b", py):
        return None
    out = set()
    for n in range(MAX_COUNT + 1):
        try:
            if eval(py, {"__builtins__": {}}, {var: n}):  # noqa: S307 - produced by _count_expr
                out.add(n)
        except Exception:
            return None
    return out


def _if_chains(body: str):
    """Top-level if / else if / else chains of a function body: [(start, [(cond|None, branch_text)])]."""
    chains = []
    i = 0
    depth_at = _depths(body)
    for m in re.finditer(r"\bif\s*\(", body):
        if m.start() < i or depth_at[m.start()] != 1:
            continue
        if re.search(r"\belse\s*$", body[:m.start()]):
            continue
        branches, k = [], m.start()
        while True:
            im = re.match(r"if\s*\(", body[k:])
            cond = None
            if im:
                close = match_close(body, k + im.end() - 1, "(", ")")
                cond = body[k + im.end():close]
                k = close + 1
            bm = re.match(r"\s*\{", body[k:])
            if bm:
                bclose = match_close(body, k + bm.end() - 1)
                branch = body[k + bm.end():bclose]
                k = bclose + 1
            else:
                semi = body.find(";", k)
                branch = body[k:semi + 1]
                k = semi + 1
            branches.append((cond, branch))
            em = re.match(r"\s*else\b\s*", body[k:])
            if not em or cond is None:
                break
            k += em.end()
        i = k
        chains.append((m.start(), branches))
    return chains


def _top_level(text: str, pos: int) -> bool:
    return _depths(text)[pos] == 0 if pos < len(text) else False


class Facts:
    def __init__(self):
        self.checks: list[dict] = []  # {"kind": "in"/"out", "allowed": set|None, "uncond": bool, "text", "where"}
        self.reads: list[dict] = []   # {"pos": int|None, "how": optional|nullchecked|safe|unchecked, "where"}


def function_facts(corpus: Corpus, func: Func) -> Facts:
    sf = corpus.files[func.file]
    body = func.body
    locals_ = _local_assignments(body)
    depth_at = _depths(body)
    facts = Facts()

    def where(pos):
        line = sf.line_of(func.body_start + pos) if func.text is sf.text else func.line
        return f"{func.file.rsplit('/', 1)[-1]}:{line}"

    def resolve(name):
        name = re.sub(r"\s+", "", name)
        if "->" in name or "." in name:
            return None, f"depends on {name}"
        if name in locals_:
            v = eval_int(locals_[name], lambda n: corpus.resolve_const(n, sf, func.ns)[0])
            if v is not None:
                return v, None
            return None, f"depends on {name} = {' '.join(locals_[name].split())}"
        v, why = corpus.resolve_const(name, sf, func.ns)
        return (v, None) if v is not None else (None, why)

    def add_check(cond: str, pos: int, text: str, negate: bool = False):
        if not _mentions_counts(cond, locals_):
            return
        expanded = _substitute_locals(cond, locals_)
        mentions_in, mentions_out = bool(_COUNT_IN.search(expanded)), bool(_COUNT_OUT.search(expanded))
        py, why = _count_expr(cond, locals_, resolve)
        if py is not None and negate:
            py = f"not ({py})"
        uncond = depth_at[pos] == 1
        for kind, var in (("in", "N"), ("out", "M")):
            if py is not None and not re.search(r"\b" + var + r"\b", py):
                continue
            allowed = _allowed(py, var) if py is not None else None
            if py is not None and allowed is None:
                why = f"mixes input and output counts: {' '.join(cond.split())}"
            if py is None and not (kind == "in" and (mentions_in or not mentions_out)
                                   or kind == "out" and mentions_out):
                continue
            facts.checks.append({"kind": kind, "allowed": allowed, "uncond": uncond,
                                 "text": " ".join(text.split()), "where": where(pos), "why": why})

    for m in _CHECK_RE.finditer(body):
        close = match_close(body, m.end() - 1, "(", ")")
        args = split_args(body[m.end():close])
        kind = m.group(1) or ""
        if len(args) < 2:
            continue
        if kind in ("", "_MSG"):
            cond = args[1]
        elif len(args) >= 3:
            op = {"_EQ": "==", "_NEQ": "!=", "_GE": ">=", "_GT": ">", "_LE": "<=", "_LT": "<"}[kind]
            cond = f"({args[1]}) {op} ({args[2]})"
        else:
            continue
        add_check(cond, m.start(), body[m.start():close + 1])

    for start, branches in _if_chains(body):
        conds = [c for c, _ in branches if c is not None]
        if not any(_mentions_counts(c, locals_) for c in conds):
            continue
        # N (or M) is refused when the branch it takes returns an error at its top level
        failing = []
        for idx, (cond, branch) in enumerate(branches):
            err = _ERR_RE.search(branch)
            if err and _top_level(branch, err.start()):
                prior = [f"not ({c})" for c, _ in branches[:idx]]
                here = [f"({cond})"] if cond is not None else []
                failing.append(" and ".join(prior + here) or "true")
        if failing:
            text = body[start:start + 160]
            add_check(" or ".join(f"({f})" for f in failing), start,
                      text.split("{")[0].strip() + " ... return kTfLiteError", negate=True)

    # ---- input reads ----------------------------------------------------------------
    for m in _READ_RE.finditer(body):
        fn = m.group(1)
        close = match_close(body, m.end() - 1, "(", ")")
        args = split_args(body[m.end():close])
        if len(args) < 3:
            continue
        idx_expr = args[2]
        pos_v, _ = resolve_index(idx_expr, resolve)
        member_var = None
        if fn in ("GetInputSafe", "GetMutableInputSafe"):
            how = "safe"
        elif fn == "GetOptionalInputTensor":
            how = "optional"
        else:
            var = _assigned_var(body, m.start())
            how = (_null_test(body, var, m.end()) if var else None) or "unchecked"
            if how == "unchecked" and var and func.in_class:
                member_var = var  # a constructor filling a field: its users may test the field
        facts.reads.append({"pos": pos_v, "expr": " ".join(idx_expr.split()), "how": how, "fn": fn,
                            "where": where(m.start()), "uncond": depth_at[m.start()] == 1
                            and not _guarded(body, m.start()), "member": member_var})
    for m in _DATA_RE.finditer(body):
        close = match_close(body, m.end() - 1, "[", "]")
        idx_expr = body[m.end():close]
        pos_v, _ = resolve_index(idx_expr, resolve)
        tail = body[close + 1:close + 60]
        var = _assigned_var(body, m.start())
        compared = re.match(r"\s*(==|!=|<|>=)\s*(kTfLiteOptionalTensor|-\s*1\b|0\b)", tail)
        if not compared and var:
            compared = re.search(r"\b" + var + r"\s*(==|!=|<|>=)\s*(kTfLiteOptionalTensor|-\s*1\b)", body[close:])
        how = "optional" if compared else "unchecked"
        facts.reads.append({"pos": pos_v, "expr": " ".join(idx_expr.split()), "how": how,
                            "fn": "node->inputs->data[]", "where": where(m.start()),
                            "uncond": depth_at[m.start()] == 1 and not _guarded(body, m.start())})
    return facts


def _guarded(body: str, pos: int) -> bool:
    """True when the statement holding pos evaluates it only under a condition (if/?:/&&/||)."""
    stmt_start = max(body.rfind(";", 0, pos), body.rfind("{", 0, pos), body.rfind("}", 0, pos)) + 1
    stmt = body[stmt_start:pos]
    return bool(re.search(r"\bif\s*\(|\?|&&|\|\||\bcase\b|\belse\b|\bwhile\s*\(|\bfor\s*\(", stmt))


def resolve_index(expr: str, resolve):
    expr = " ".join(expr.split())
    v = eval_int(expr, lambda n: resolve(n)[0])
    return v, None if v is not None else f"index {expr}"


def _assigned_var(body: str, pos: int) -> str | None:
    """Name of the variable a read at pos is assigned to (`T* x = GetInput(...)` or `x = cond ? GetInput : ..`)."""
    stmt_start = max(body.rfind(";", 0, pos), body.rfind("{", 0, pos), body.rfind("}", 0, pos)) + 1
    stmt = body[stmt_start:pos]
    m = re.search(r"(\w+)\s*=[^=]*$", stmt)
    if m and "==" not in stmt[m.end(1):]:
        return m.group(1)
    return None


def _null_test(body: str, var: str, after: int, member: bool = False) -> str | None:
    """How the first null test of `var` after offset `after` treats null: "safe" when it is an error
    (inside TF_LITE_ENSURE*, or an `if` whose branch returns kTfLiteError), "nullchecked" when the kernel
    carries on without the tensor, None when `var` is never tested. member: look for `x.var` / `x->var`
    (a field set by a constructor and tested by its user)."""
    v = (r"(?:\.|->)\s*" if member else r"\b") + re.escape(var) + r"\b"
    pats = [rf"{v}\s*[!=]=\s*(?:nullptr|NULL)\b", rf"\b(?:nullptr|NULL)\s*[!=]=\s*[\w.>-]*{v}",
            rf"\bif\s*\(\s*!?\s*[\w.>-]*{v}\s*\)", rf"!\s*[\w.>-]*{v}(?!\s*(->|\.|\[|\())", rf"{v}\s*\?",
            rf"{v}\s*&&", rf"&&\s*!?\s*[\w.>-]*{v}\s*[)&|]", rf"\|\|\s*!?\s*[\w.>-]*{v}\s*[)&|]",
            rf"{v}\s*\|\|"]
    body = _DCHECK_RE.sub(lambda m: " " * len(m.group(0)), body)  # debug-only checks test nothing in release
    hits = [m.start() for p in pats for m in re.finditer(p, body[after:])]
    if not hits:
        return None
    pos = after + min(hits)
    for m in _CHECK_RE.finditer(body, 0, pos):
        if match_close(body, m.end() - 1, "(", ")") > pos:
            return "safe"
    for m in re.finditer(r"\bif\s*\(", body[:pos]):
        close = match_close(body, m.end() - 1, "(", ")")
        if close < pos:
            continue
        bm = re.match(r"\s*\{", body[close + 1:])
        if bm:
            branch = body[close + 1 + bm.end():match_close(body, close + bm.end())]
        else:
            branch = body[close + 1:body.find(";", close) + 1]
        err = _ERR_RE.search(branch)
        if err and _top_level(branch, err.start()):
            return "safe"
    return "nullchecked"


# --------------------------------------------------------------------------------------
# Per-op aggregation
# --------------------------------------------------------------------------------------
def analyse_op(corpus: Corpus, reg_name: str) -> dict:
    entry: dict = {"kernel": reg_name}
    reasons: list[str] = []
    reg = corpus.register_function(reg_name)
    if reg is None:
        return {"kernel": reg_name, "files": [], "uncertain": True,
                "uncertain_reasons": [f"definition of {reg_name} not found"]}
    # registration functions: follow Register_* calls (every #if branch: union)
    regs, todo = [], [reg]
    while todo:
        r = todo.pop()
        if r in regs:
            continue
        regs.append(r)
        for m in re.finditer(r"\b(Register_\w+)\s*\(\s*\)", r.body):
            sub = corpus.register_function(m.group(1))
            if sub is not None and sub is not r:
                todo.append(sub)
    roots: list[Func] = []
    ambiguous_roots = False
    for r in regs:
        for cands, _, _ in corpus.references(r):
            cands = [c for c in cands if not c.name.startswith("Register_")]
            if not cands:
                continue
            if len(cands) > 1 and len({(c.name, tuple(c.ns)) for c in cands}) > 1:
                ambiguous_roots = True
            roots.extend(c for c in cands if c not in roots)
    if not roots:
        reasons.append("no prepare/invoke function found in the registration")
    if len(regs) > 1:
        entry["variants"] = [r.name for r in regs]
    # walk the call graph; a function is 'unconditional' when every step reaching it was at top level
    uncond: dict[int, bool] = {}
    order: list[Func] = []
    todo2 = [(f, True) for f in roots]
    while todo2:
        f, u = todo2.pop(0)
        key = id(f)
        if key in uncond:
            if u and not uncond[key]:
                uncond[key] = True
                todo2.extend((c, True) for cands, _ in _calls(corpus, f, only_uncond=True) for c in cands)
            continue
        uncond[key] = u
        order.append(f)
        for cands, at_top in _calls(corpus, f):
            single = len(cands) == 1
            for c in cands:
                todo2.append((c, u and at_top and single))
    files = {r.file for r in regs}
    corpus.const_files = set()

    allowed = {"in": None, "out": None}
    evidence = []
    reads: dict[str, set] = {"optional": set(), "nullchecked": set(), "safe": set(), "unchecked": set()}
    read_where: dict[tuple[str, int], list[str]] = {}
    dynamic = []
    conditional: dict[str, list[str]] = {"in": [], "out": []}
    safe_uncond: set[int] = set()
    all_facts = [(f, function_facts(corpus, f)) for f in order]
    for f, facts in all_facts:  # fields filled by a constructor with GetInput: does a user test them?
        for r in facts.reads:
            if r.get("member"):
                tests = [_null_test(g.body, r["member"], 0, member=True) for g, _ in all_facts if g is not f]
                tests = [t for t in tests if t]
                if tests:
                    r["how"] = "safe" if "safe" in tests else "nullchecked"
                    r["fn"] += f" (field {r['member']} tested by its user)"
    for f, facts in all_facts:
        for c in facts.checks:
            if c["allowed"] is None:
                reasons.append(f"{c['kind']}put-count check not evaluated ({c['why']}): {c['where']} {c['text']}")
                continue
            files.add(f.file)
            if not (uncond[id(f)] and c["uncond"]):
                evidence.append(f"conditional, ignored: {c['where']} {c['text']}")
                conditional[c["kind"]].append(f"{c['where']} {c['text']}")
                continue
            allowed[c["kind"]] = c["allowed"] if allowed[c["kind"]] is None else allowed[c["kind"]] & c["allowed"]
            evidence.append(f"{c['where']} {c['text']}")
        for r in facts.reads:
            files.add(f.file)
            if r["pos"] is None:
                dynamic.append(r)
                continue
            reads[r["how"]].add(r["pos"])
            read_where.setdefault((r["how"], r["pos"]), []).append(f"{r['where']} {r['fn']}({r['expr']})")
            if r["how"] == "safe" and uncond[id(f)] and r["uncond"]:
                safe_uncond.add(r["pos"])
    for kind, key in (("in", "inputs"), ("out", "outputs")):
        a = allowed[kind]
        if a is None:
            entry[key] = None
        elif not a:
            entry[key] = []
            reasons.append(f"{key}: the checks admit no count at all")
        else:
            lo, hi = min(a), max(a)
            entry[key] = [lo, None if hi == MAX_COUNT else hi]
            if hi != MAX_COUNT and len(a) != hi - lo + 1:
                entry[key + "_allowed"] = sorted(a)
    optional = sorted(reads["optional"] | reads["nullchecked"])
    entry["optional_inputs"] = optional
    entry["reads"] = {k: sorted(v) for k, v in reads.items() if v}
    notes = []
    for p in sorted(set(optional) & reads["safe"]):
        how = "optional" if p in reads["optional"] else "nullchecked"
        text = (f"input {p} is read as {how} ({'; '.join(read_where[(how, p)][:2])}) and elsewhere in a way that "
                f"refuses -1 with an error ({'; '.join(read_where[('safe', p)][:2])})")
        if p in safe_uncond:
            reasons.append(text + ", on a path every invocation takes")
        else:
            notes.append(text + ", on a conditional path")
    risky = {p: read_where[("unchecked", p)] for p in optional if p in reads["unchecked"]}
    if risky:
        entry["optional_but_also_read_unchecked"] = {str(p): sorted(set(w))[:3] for p, w in sorted(risky.items())}
        reasons.append("optional input(s) " + ", ".join(map(str, sorted(risky))) + " also read with GetInput and "
                       "no null test in the same function on some path (the null test may be in a callee, or the "
                       "position is optional only together with others): see optional_but_also_read_unchecked")
    if notes:
        entry["notes"] = notes
    if dynamic:
        opt_dyn = [r for r in dynamic if r["how"] in ("optional", "nullchecked")]
        if opt_dyn:
            entry["optional_inputs_at_computed_positions"] = True
            reasons.append("optional inputs at computed positions: " + "; ".join(
                sorted({f"{r['where']} {r['fn']}[{r['expr']}]" for r in opt_dyn})[:4]))
        entry["reads_at_computed_positions"] = sorted({f"{r['where']} {r['fn']}({r['expr']}) {r['how']}"
                                                       for r in dynamic})[:6]
    if ambiguous_roots:
        reasons.append("the registration names functions that resolve to several definitions; union taken")
    for kind, key in (("in", "inputs"), ("out", "outputs")):
        if entry[key] is not None or any(f"{kind}put-count" in r for r in reasons):
            continue
        if conditional[kind]:
            reasons.append(f"{key}: count checks only on conditional paths (kernel variants), none applies to "
                           f"every invocation: " + "; ".join(conditional[kind][:4]))
        else:
            entry[key + "_note"] = f"no {key[:-1]}-count check in the kernel"
    files |= corpus.const_files
    entry["files"] = sorted(files)
    corpus.used_files.update(files)
    entry["evidence"] = sorted(set(evidence)) + [
        f"optional {p}: {w}" for p in optional
        for w in sorted(set(read_where.get(("optional", p), []) + read_where.get(("nullchecked", p), [])))[:3]]
    if reasons:
        entry["uncertain"] = True
        entry["uncertain_reasons"] = sorted(set(reasons))
    return entry


def _calls(corpus: Corpus, f: Func, only_uncond: bool = False):
    out = []
    for cands, at_top, _ in corpus.references(f):
        cands = [c for c in cands if c is not f and not c.name.startswith("Register_")]
        if not cands or (only_uncond and not (at_top and len(cands) == 1)):
            continue
        out.append((cands, at_top))
    return out


# --------------------------------------------------------------------------------------
# Document
# --------------------------------------------------------------------------------------
def read_source_meta(src_dir: Path) -> dict:
    path = src_dir / "SOURCE"
    if not path.exists():
        raise SystemExit(f"{path} missing: run `python scripts/make_op_table.py import --git-dir ...` first")
    meta = dict(SOURCE_FIELD_RE.findall(path.read_text()))
    for field in ("repo", "commit"):
        if field not in meta:
            raise SystemExit(f"{path}: lacks '{field}: ...'")
    return meta


def schema_op_names(src_dir: Path) -> dict[str, int]:
    """BuiltinOperator names and codes from the schema.fbs copied with the kernels (same commit)."""
    text = clean_source((src_dir / SCHEMA_FBS).read_text(encoding="utf-8"))
    m = re.search(r"\benum\s+BuiltinOperator\s*:\s*\w+\s*\{([^}]*)\}", text)
    if not m:
        raise SystemExit(f"{SCHEMA_FBS}: enum BuiltinOperator not found")
    ops = {name: int(code) for name, code in re.findall(r"(\w+)\s*=\s*(-?\d+)", m.group(1))}
    if len(ops) != len([x for x in m.group(1).split(",") if x.strip()]):
        raise SystemExit(f"{SCHEMA_FBS}: could not read every BuiltinOperator value")
    try:  # cross-check with the installed runtime's schema module (informational only)
        from ai_edge_litert import schema_py_generated as schema
        installed = {k: v for k, v in vars(schema.BuiltinOperator).items()
                     if not k.startswith("_") and isinstance(v, int)}
        if installed != ops:
            print("warning: ai_edge_litert.schema_py_generated.BuiltinOperator differs from "
                  f"{SCHEMA_FBS}: only installed {sorted(set(installed) - set(ops))}, only in the copy "
                  f"{sorted(set(ops) - set(installed))}", file=sys.stderr)
    except ImportError:
        pass
    return ops


def build_document(src_dir: Path) -> dict:
    meta = read_source_meta(src_dir)
    corpus = Corpus(src_dir)
    pairs = corpus.registrations()
    registered = {}
    for op, reg in pairs:
        if op in registered:
            raise SystemExit(f"{op} registered twice in {REGISTER_CC}")
        registered[op] = reg
    names = schema_op_names(src_dir)
    ops = {}
    for op in sorted(names):
        if op not in registered:
            ops[op] = {"kernel": None, "inputs": None, "outputs": None, "optional_inputs": None,
                       "note": "no builtin kernel registered in BuiltinOpResolver"}
            continue
        ops[op] = analyse_op(corpus, registered[op])
        if op in PROBED:
            ops[op]["observed"] = PROBED[op]
    unknown = sorted(set(registered) - set(names))
    with_kernel = [o for o, e in ops.items() if e["kernel"]]
    files = []
    for rel in sorted(corpus.used_files | {SCHEMA_FBS}):
        data = (src_dir / rel).read_bytes()
        files.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest()})
    repo, commit = meta["repo"], meta["commit"]
    return {
        "format_version": FORMAT_VERSION,
        "description": (
            "Per TFLite builtin operator, as LiteRT's CPU kernel handles it: the input positions it accepts "
            "as -1 (omitted/optional tensor), and the input/output counts its Prepare enforces. Any other "
            "input position holding -1 reaches a kernel that does not expect it: GetInputSafe refuses it "
            "with an error, GetInput hands back a null pointer (SIGSEGV on use)."),
        "fields": {
            "kernel": "the Register_* function BuiltinOpResolver uses for the op; null: no builtin kernel",
            "inputs": "[min, max] input count the kernel accepts (max null: no upper bound); null: not checked",
            "inputs_allowed": "present when the accepted counts are not a contiguous range",
            "outputs": "[min, max] output count, as 'inputs'",
            "optional_inputs": ("input positions the kernel accepts as -1: read with GetOptionalInputTensor, "
                                "compared with kTfLiteOptionalTensor, or read with GetInput and tested for null"),
            "reads": ("input positions by how the kernel reads them: optional (GetOptionalInputTensor / "
                      "kTfLiteOptionalTensor test), nullchecked (GetInput + null test), safe (GetInputSafe: "
                      "-1 is an error), unchecked (GetInput without a null test: -1 is a null pointer)"),
            "optional_inputs_at_computed_positions": ("true when the kernel tests kTfLiteOptionalTensor at "
                                                      "positions computed at run time (control flow ops)"),
            "files": "kernel source files the entry was derived from (paths in the source repo)",
            "evidence": "file:line of each count check used and of each optional read",
            "optional_but_also_read_unchecked": ("optional positions that some path still reads with GetInput "
                                                 "and no null test in that function: -1 there may crash"),
            "observed": "probe results for the op (see 'probe'); empirical, not derived from the sources",
            "uncertain": "true where the parse was ambiguous; 'uncertain_reasons' says why. "
                         "Ambiguity is resolved towards more optional positions and wider counts.",
        },
        "source": {
            "repo": repo,
            "commit": commit,
            "committed": meta.get("committed"),
            "url": f"https://github.com/{repo}/tree/{commit}/{KERNEL_DIR}",
            "licence": meta.get("licence", "Apache-2.0"),
            "registrations": REGISTER_CC,
            "schema": SCHEMA_FBS,
            "local_copy": str(src_dir.relative_to(REPO_ROOT)) if src_dir.is_relative_to(REPO_ROOT) else str(src_dir),
            "files": files,
        },
        "derived_by": "scripts/make_op_table.py",
        "regenerate": "python scripts/make_op_table.py",
        "stats": {
            "ops": len(ops),
            "with_kernel": len(with_kernel),
            "with_optional_inputs": sum(1 for o in with_kernel if ops[o]["optional_inputs"]),
            "with_input_count_check": sum(1 for o in with_kernel if ops[o]["inputs"] is not None),
            "with_output_count_check": sum(1 for o in with_kernel if ops[o]["outputs"] is not None),
            "uncertain": sum(1 for o in with_kernel if ops[o].get("uncertain")),
            "registered_but_not_in_schema": unknown,
        },
        "schema": f"enum BuiltinOperator of {SCHEMA_FBS} at the same commit",
        "probe": dict(PROBED_SUMMARY, command=PROBE_COMMAND, description=(
            "Empirical check of the table: one-operator models with one input set to -1 (or a wrong input "
            "count), each loaded, allocated and invoked in a child process, without delegate and with the "
            "default XNNPACK delegate. Per-op results are under ops[OP].observed.")),
        "ops": ops,
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=True) + "\n"


def cmd_generate(args) -> int:
    src = Path(args.src) if args.src else SOURCE_DIR
    text = render(build_document(src))
    commit = json.loads(text)["source"]["commit"]
    if commit != PROBED_SUMMARY["against_commit"]:
        print(f"warning: the probe results were recorded against {PROBED_SUMMARY['against_commit'][:12]}, the "
              f"sources are {commit[:12]}; re-run `probe` and update PROBED", file=sys.stderr)
    st = json.loads(text)["stats"]
    return write_or_check(OUTPUT, text, check=args.check, script="make_op_table.py",
                          summary=f"{st['ops']} ops, {st['with_kernel']} with a kernel, "
                                  f"{st['with_optional_inputs']} with optional inputs, {st['uncertain']} uncertain")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        return _worker(argv[1], argv[2])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the JSON on disk differs from a fresh build")
    p.add_argument("--src", help=f"kernel source folder (default {SOURCE_DIR.relative_to(REPO_ROOT)})")
    sub = p.add_subparsers(dest="cmd")
    im = sub.add_parser("import", help="copy the kernel sources out of a LiteRT git checkout/mirror")
    im.add_argument("--git-dir", required=True)
    im.add_argument("--commit", default="HEAD")
    im.add_argument("--repo", default="google-ai-edge/LiteRT")
    im.add_argument("--dest")
    pr = sub.add_parser("probe", help="load one-operator models with a -1 input in child processes")
    pr.add_argument("--json", help="write the probe results as JSON")
    pr.add_argument("--ops", help="comma-separated ops (default: the built-in sample)")
    pr.add_argument("--timeout", type=float, default=60.0)
    pr.add_argument("--repeat", type=int, default=3, help="runs per model and mode (some crashes are not "
                    "deterministic: an out-of-bounds read of tensors[-1]); the worst outcome counts")
    pr.add_argument("-v", "--verbose", action="store_true")
    pr.add_argument("--emit-python", action="store_true", help="print the PROBED literals for this script")
    pr.add_argument("--from-json", help="do not run: summarise an earlier `probe --json` report")
    args = p.parse_args(argv)
    if args.cmd == "import":
        return cmd_import(args)
    if args.cmd == "probe":
        return cmd_probe(args)
    return cmd_generate(args)


# --------------------------------------------------------------------------------------
# probe: one-operator models with one input index set to -1, run in child processes
# --------------------------------------------------------------------------------------
F32, I8, I32 = "FLOAT32", "INT8", "INT32"


def _t(shape, dtype=F32, data=None, q=None, var=False, name=None):
    """Tensor spec: data None = graph input (fed at invoke), else constant; q = (scales, zero_points[, dim])."""
    return {"shape": list(shape), "dtype": dtype, "data": data, "q": q, "var": var, "name": name}


def _vals(n, lo=-1.0, hi=1.0):
    return [lo + (hi - lo) * ((i * 7919) % 101) / 100.0 for i in range(n)]


def _n(shape):
    out = 1
    for d in shape:
        out *= d
    return out


def _const(shape, dtype=F32, q=None):
    n = _n(shape)
    if dtype == F32:
        data = _vals(n)
    elif dtype == I8:
        data = [int(v * 100) for v in _vals(n)]
    else:
        data = [int(v * 100) for v in _vals(n)]
    return _t(shape, dtype, data, q)


def _lstm_inputs(n_in=3, n_cell=2, n_out=2, batch=1, time=2):
    w_in = lambda: _const([n_cell, n_in])  # noqa: E731
    w_rec = lambda: _const([n_cell, n_out])  # noqa: E731
    vec = lambda: _const([n_cell])  # noqa: E731
    return ([_t([batch, time, n_in])] + [w_in() for _ in range(4)] + [w_rec() for _ in range(4)]
            + [vec() for _ in range(3)] + [vec() for _ in range(4)]
            + [_const([n_out, n_cell]), _const([n_out])]
            + [_t([batch, n_out], var=True), _t([batch, n_cell], var=True)] + [vec() for _ in range(4)])


def probe_cases():
    """(label, op, inputs, outputs, options_name, options dict, omission sets) for the sample."""
    q = lambda s, z=0: ([s], [z])  # noqa: E731
    cases = []

    def case(label, op, inputs, outputs, opt=None, kw=None, extra_omissions=()):
        cases.append({"label": label, "op": op, "inputs": inputs, "outputs": outputs, "opt": opt,
                      "kw": kw or {}, "omissions": [(p,) for p in range(len(inputs))] + list(extra_omissions)})

    conv_kw = {"padding": 1, "strideW": 1, "strideH": 1, "dilationWFactor": 1, "dilationHFactor": 1}
    case("CONV_2D/f32", "CONV_2D", [_t([1, 5, 5, 2]), _const([3, 3, 3, 2]), _const([3])], [_t([1, 3, 3, 3])],
         "Conv2DOptions", conv_kw)
    case("CONV_2D/i8", "CONV_2D", [_t([1, 5, 5, 2], I8, q=q(0.05)),
                                   _const([3, 3, 3, 2], I8, q=([0.01, 0.02, 0.03], [0, 0, 0], 0)),
                                   _const([3], I32, q=([0.0005, 0.001, 0.0015], [0, 0, 0], 0))],
         [_t([1, 3, 3, 3], I8, q=q(0.1))], "Conv2DOptions", conv_kw)
    dw_kw = dict(conv_kw, depthMultiplier=1)
    case("DEPTHWISE_CONV_2D/f32", "DEPTHWISE_CONV_2D", [_t([1, 5, 5, 2]), _const([1, 3, 3, 2]), _const([2])],
         [_t([1, 3, 3, 2])], "DepthwiseConv2DOptions", dw_kw)
    case("DEPTHWISE_CONV_2D/i8", "DEPTHWISE_CONV_2D",
         [_t([1, 5, 5, 2], I8, q=q(0.05)), _const([1, 3, 3, 2], I8, q=([0.01, 0.02], [0, 0], 3)),
          _const([2], I32, q=([0.0005, 0.001], [0, 0], 0))],
         [_t([1, 3, 3, 2], I8, q=q(0.1))], "DepthwiseConv2DOptions", dw_kw)
    case("FULLY_CONNECTED/f32", "FULLY_CONNECTED", [_t([1, 4]), _const([3, 4]), _const([3])], [_t([1, 3])],
         "FullyConnectedOptions")
    case("FULLY_CONNECTED/i8", "FULLY_CONNECTED",
         [_t([1, 4], I8, q=q(0.05)), _const([3, 4], I8, q=q(0.01)), _const([3], I32, q=q(0.0005))],
         [_t([1, 3], I8, q=q(0.1))], "FullyConnectedOptions")
    case("TRANSPOSE_CONV/f32", "TRANSPOSE_CONV",
         [_t([4], I32, [1, 5, 5, 3]), _const([3, 3, 3, 2]), _t([1, 3, 3, 2]), _const([3])], [_t([1, 5, 5, 3])],
         "TransposeConvOptions", {"padding": 1, "strideW": 1, "strideH": 1})
    case("CONV_3D/f32", "CONV_3D", [_t([1, 3, 3, 3, 2]), _const([2, 2, 2, 2, 3]), _const([3])],
         [_t([1, 2, 2, 2, 3])], "Conv3DOptions",
         {"padding": 1, "strideD": 1, "strideW": 1, "strideH": 1, "dilationDFactor": 1, "dilationWFactor": 1,
          "dilationHFactor": 1})
    case("UNIDIRECTIONAL_SEQUENCE_LSTM/f32", "UNIDIRECTIONAL_SEQUENCE_LSTM", _lstm_inputs(), [_t([1, 2, 2])],
         "UnidirectionalSequenceLSTMOptions", {"fusedActivationFunction": 4, "timeMajor": False},
         extra_omissions=[(1, 5, 9, 12), (9, 10, 11), (16, 17), (20, 21, 22, 23), (1, 5, 9, 12, 20)])
    case("CONCATENATION/f32", "CONCATENATION", [_t([1, 2]), _t([1, 3])], [_t([1, 5])], "ConcatenationOptions",
         {"axis": 1})
    case("CONCATENATION/i8", "CONCATENATION", [_t([1, 2], I8, q=q(0.1)), _t([1, 3], I8, q=q(0.1))],
         [_t([1, 5], I8, q=q(0.1))], "ConcatenationOptions", {"axis": 1})
    case("DEQUANTIZE/i8", "DEQUANTIZE", [_t([1, 4], I8, q=q(0.1))], [_t([1, 4])], "DequantizeOptions")
    case("QUANTIZE/f32", "QUANTIZE", [_t([1, 4])], [_t([1, 4], I8, q=q(0.1))], "QuantizeOptions")
    for op in ("LOGISTIC", "TANH"):
        case(f"{op}/f32", op, [_t([1, 4])], [_t([1, 4])])
        out_q = q(1 / 256, -128) if op == "LOGISTIC" else q(1 / 128, 0)
        case(f"{op}/i8", op, [_t([1, 4], I8, q=q(0.1))], [_t([1, 4], I8, q=out_q)])
    case("SOFTMAX/f32", "SOFTMAX", [_t([1, 4])], [_t([1, 4])], "SoftmaxOptions", {"beta": 1.0})
    case("SOFTMAX/i8", "SOFTMAX", [_t([1, 4], I8, q=q(0.1))], [_t([1, 4], I8, q=q(1 / 256, -128))],
         "SoftmaxOptions", {"beta": 1.0})
    for op, opt in (("MAXIMUM", "MaximumMinimumOptions"), ("SQUARED_DIFFERENCE", "SquaredDifferenceOptions"),
                    ("DIV", "DivOptions"), ("SUB", "SubOptions"), ("ADD", "AddOptions")):
        case(f"{op}/f32", op, [_t([1, 4]), _t([1, 4])], [_t([1, 4])], opt)
    case("SUB/i8", "SUB", [_t([1, 4], I8, q=q(0.1)), _t([1, 4], I8, q=q(0.1))], [_t([1, 4], I8, q=q(0.2))],
         "SubOptions")
    case("STRIDED_SLICE/f32", "STRIDED_SLICE",
         [_t([2, 4]), _t([2], I32, [0, 1]), _t([2], I32, [2, 3]), _t([2], I32, [1, 1])], [_t([2, 2])],
         "StridedSliceOptions")
    case("BATCH_MATMUL/f32", "BATCH_MATMUL", [_t([1, 2, 3]), _t([1, 3, 2])], [_t([1, 2, 2])],
         "BatchMatMulOptions")
    case("TRANSPOSE/f32", "TRANSPOSE", [_t([2, 3]), _t([2], I32, [1, 0])], [_t([3, 2])], "TransposeOptions")
    case("TRANSPOSE/i8", "TRANSPOSE", [_t([2, 3], I8, q=q(0.1)), _t([2], I32, [1, 0])],
         [_t([3, 2], I8, q=q(0.1))], "TransposeOptions")
    case("EXP/f32", "EXP", [_t([1, 4])], [_t([1, 4])], "ExpOptions")
    case("ATAN2/f32", "ATAN2", [_t([1, 4]), _t([1, 4])], [_t([1, 4])])
    case("RESHAPE/f32", "RESHAPE", [_t([2, 3]), _t([2], I32, [3, 2])], [_t([3, 2])], "ReshapeOptions",
         {"newShape": [3, 2]})
    case("PADV2/f32", "PADV2", [_t([2, 3]), _t([2, 2], I32, [1, 1, 0, 0]), _t([1], F32, [0.5])], [_t([4, 3])],
         "PadV2Options")
    case("SVDF/f32", "SVDF", [_t([1, 3]), _const([4, 3]), _const([4, 2]), _const([4]), _t([1, 8], var=True)],
         [_t([1, 4])], "SVDFOptions", {"rank": 1})
    return cases


def build_model(schema, case: dict, omit: tuple[int, ...] = (), n_inputs: int | None = None) -> bytes:
    import flatbuffers

    codes = {k: v for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    m = schema.ModelT()
    m.version = 3
    m.description = b"edgekit op-table probe"
    m.buffers = [schema.BufferT()]
    tensors, graph_inputs = [], []

    def add(spec, name):
        t = schema.TensorT()
        t.shape, t.type, t.name = spec["shape"], getattr(schema.TensorType, spec["dtype"]), name.encode()
        t.buffer = 0
        if spec["q"]:
            qp = schema.QuantizationParametersT()
            qp.scale, qp.zeroPoint = list(spec["q"][0]), list(spec["q"][1])
            if len(spec["q"]) > 2:
                qp.quantizedDimension = spec["q"][2]
            t.quantization = qp
        if spec["var"]:
            t.isVariable = True
        elif spec["data"] is not None:
            import struct
            fmt = {"FLOAT32": "f", "INT8": "b", "INT32": "i"}[spec["dtype"]]
            b = schema.BufferT()
            b.data = list(struct.pack("<%d%s" % (len(spec["data"]), fmt), *spec["data"]))
            m.buffers.append(b)
            t.buffer = len(m.buffers) - 1
        else:
            graph_inputs.append(len(tensors))
        tensors.append(t)
        return len(tensors) - 1

    specs = list(case["inputs"])
    if n_inputs is not None:  # fewer inputs (drop the last ones) or more (repeat the last one)
        specs = specs[:n_inputs] + [specs[-1]] * max(0, n_inputs - len(specs))
    ins = [add(spec, f"in{i}") for i, spec in enumerate(specs)]
    outs = [add(spec, f"out{i}") for i, spec in enumerate(case["outputs"])]
    op = schema.OperatorT()
    op.opcodeIndex = 0
    op.inputs = [-1 if i in omit else t for i, t in enumerate(ins)]
    op.outputs = outs
    if case["opt"]:
        opts = getattr(schema, case["opt"] + "T")()
        for k, v in case["kw"].items():
            setattr(opts, k, v)
        op.builtinOptionsType = getattr(schema.BuiltinOptions, case["opt"])
        op.builtinOptions = opts
    sg = schema.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators = tensors, graph_inputs, outs, [op]
    m.subgraphs = [sg]
    oc = schema.OperatorCodeT()
    code = codes[case["op"]]
    oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), 1
    m.operatorCodes = [oc]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _worker(model_path: str, mode: str) -> int:
    """Child process: load, allocate, feed and invoke one model; print the stage reached."""
    import numpy as np
    from ai_edge_litert import interpreter as tfl

    def stage(name):
        print("@@STAGE@@" + name, flush=True)

    resolver = {"xnnpack": tfl.OpResolverType.AUTO,
                "nodelegate": tfl.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}[mode]
    try:
        stage("load")
        it = tfl.Interpreter(model_path=model_path, experimental_op_resolver_type=resolver, num_threads=1)
        stage("allocate")
        it.allocate_tensors()
        stage("feed")
        for d in it.get_input_details():
            dt = np.dtype(d["dtype"])
            x = (np.linspace(-1, 1, int(np.prod(d["shape"]))).reshape(d["shape"]) * (100 if dt.kind == "i" else 1))
            it.set_tensor(d["index"], x.astype(dt))
        stage("invoke")
        it.invoke()
        for d in it.get_output_details():
            it.get_tensor(d["index"])
        stage("done")
        print("@@RESULT@@" + json.dumps({"outcome": "ok"}), flush=True)
    except Exception as exc:  # noqa: BLE001 - any Python-level failure counts as an error
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        print("@@RESULT@@" + json.dumps({"outcome": "error", "error": lines[0][:240] if lines else
                                         type(exc).__name__}), flush=True)
    return 0


def run_case(path: Path, mode: str, timeout: float) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONFAULTHANDLER="")
    try:
        proc = subprocess.run([sys.executable, __file__, "_worker", str(path), mode], capture_output=True,
                              text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"outcome": "timeout"}
    stages = [ln[len("@@STAGE@@"):] for ln in proc.stdout.splitlines() if ln.startswith("@@STAGE@@")]
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            res = json.loads(line[len("@@RESULT@@"):])
            res["stage"] = stages[-1] if stages else None
            return res
    if proc.returncode < 0:
        import signal
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = str(-proc.returncode)
        return {"outcome": "crash", "signal": sig, "stage": stages[-1] if stages else None}
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or [""]
    return {"outcome": "crash" if proc.returncode else "error", "returncode": proc.returncode,
            "stage": stages[-1] if stages else None, "error": tail[0][:240]}


def cmd_probe(args) -> int:
    if args.from_json:
        report = json.loads(Path(args.from_json).read_text())
        print(json.dumps(report["summary"], indent=1))
        if args.emit_python:
            print(probed_literal(report))
        return 0
    from ai_edge_litert import schema_py_generated as schema
    import ai_edge_litert

    doc = json.loads(OUTPUT.read_text())
    table = doc["ops"]
    cases = probe_cases()
    if args.ops:
        keep = set(args.ops.split(","))
        cases = [c for c in cases if c["op"] in keep or c["label"] in keep]
    modes = ["nodelegate", "xnnpack"]
    results = []
    with tempfile.TemporaryDirectory(prefix="optable-probe-") as tmp:
        for c in cases:
            entry = table[c["op"]]
            opt = set(entry.get("optional_inputs") or [])
            reads = entry.get("reads", {})
            n = len(c["inputs"])
            variants = [("omit", ())] + [("omit", o) for o in c["omissions"]]
            variants += [("count", k) for k in (n - 1, n + 1) if k >= 0]
            for kind, arg in variants:
                row = {"case": c["label"], "op": c["op"]}
                if kind == "omit":
                    row["omit"] = list(arg)
                    buf = build_model(schema, c, arg)
                    tag = "_".join(map(str, arg)) or "none"
                else:
                    row["n_inputs"] = arg
                    buf = build_model(schema, c, (), arg)
                    tag = f"n{arg}"
                    rng = entry.get("inputs")
                    allowed = entry.get("inputs_allowed")
                    if rng is None:
                        row["table"] = "unchecked"
                    else:
                        ok = arg in allowed if allowed else rng[0] <= arg and (rng[1] is None or arg <= rng[1])
                        row["table"] = "accepted" if ok else "refused"
                if kind == "omit" and arg:
                    row["table"] = "optional" if set(arg) <= opt else "required"
                    if row["table"] == "required":
                        # a position also read with GetInputSafe (or an error on null) is refused first
                        req = [p for p in arg if p not in opt]
                        unchecked = any(p in reads.get("unchecked", []) and p not in reads.get("safe", [])
                                        for p in req)
                        row["predicted_kernel"] = "crash" if unchecked else "error"
                for mode in modes:
                    runs = []
                    for k in range(args.repeat):
                        # a different path length per run: the heap layout differs, and so does what an
                        # out-of-bounds read of tensors[-1] finds (such crashes are not deterministic)
                        path = Path(tmp, f"{c['label'].replace('/', '_')}__{tag}{'_' * (17 * k)}.tflite")
                        path.write_bytes(buf)
                        runs.append(run_case(path, mode, args.timeout))
                        path.unlink()
                    outcomes = [r["outcome"] for r in runs]
                    worst = next(r for o in ("crash", "timeout", "error", "ok") for r in runs if r["outcome"] == o)
                    row[mode] = dict(worst, runs=len(runs), crashes=outcomes.count("crash"),
                                     distinct=sorted(set(outcomes)))
                results.append(row)
                if args.verbose:
                    what = f"omit={row['omit']!s:18s}" if "omit" in row else f"inputs={row['n_inputs']:<16d}"
                    print(f"{row['case']:34s} {what} table={row.get('table', '-'):9s} "
                          + "  ".join(f"{m}={_fmt(row[m])}" for m in modes), flush=True)
    summary = summarise_probe_results(results, modes)
    report = {"ai_edge_litert": ai_edge_litert.__version__, "table_commit": doc["source"]["commit"],
              "repeat": args.repeat, "summary": summary, "results": results}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.emit_python:
        print(probed_literal(report))
    return 0


def probed_literal(report: dict) -> str:
    """The PROBED* literals of this script, from a probe report (`probe --json`)."""
    per_op: dict = {}
    for r in report["results"]:
        if "omit" in r and not r["omit"]:
            continue
        key = f"-1@{','.join(map(str, r['omit']))}" if "omit" in r else f"inputs={r['n_inputs']}"
        dtype = r["case"].split("/", 1)[1]
        for mode, label in (("nodelegate", "no_delegate"), ("xnnpack", "xnnpack")):
            res = r[mode]
            item = key
            if res["outcome"] == "crash" and res.get("runs", 1) > 1:
                item += f" ({res['crashes']}/{res['runs']})"
            slot = per_op.setdefault(r["op"], {}).setdefault(dtype, {}).setdefault(label, {})
            slot.setdefault(res["outcome"], []).append(item)
    s = report["summary"]
    summary = {
        "runtime": f"ai-edge-litert {report['ai_edge_litert']}", "against_commit": report["table_commit"],
        "repeat": report.get("repeat", 1), "cases": len({r["case"] for r in report["results"]}),
        "models": s["models"], "baselines_ok": s["baselines_ok"],
        "required_positions": {m: s[m]["required"] for m in ("nodelegate", "xnnpack")},
        "optional_positions": {m: s[m]["optional"] for m in ("nodelegate", "xnnpack")},
        "kernel_crash_vs_error_predicted": (
            f"{s['nodelegate']['crash_vs_error_prediction']['agree']} of "
            f"{s['nodelegate']['required']['crash'] + s['nodelegate']['required']['error']}"
            " refused required positions, without delegate"),
        "input_count_variants": {m: {k: v for k, v in s["input_count_variants"][m].items()
                                     if isinstance(v, int)} for m in ("nodelegate", "xnnpack")},
    }
    lines = ["PROBED_SUMMARY = " + json.dumps(summary), "PROBED = {"]
    for op in sorted(per_op):
        lines.append(f"    {op!r}: " + json.dumps(per_op[op]) + ",")
    lines.append("}")
    return "\n".join(lines)


def _fmt(r: dict) -> str:
    if r["outcome"] == "crash":
        n = f" {r['crashes']}/{r['runs']}" if r.get("runs", 1) > 1 else ""
        return f"CRASH({r.get('signal') or r.get('returncode')}@{r.get('stage')}{n})"
    if r["outcome"] == "error":
        return f"error@{r.get('stage')}"
    return r["outcome"]


def summarise_probe_results(results: list[dict], modes: list[str]) -> dict:
    s: dict = {"models": len(results), "runs": len(results) * len(modes)}
    counts = [r for r in results if "n_inputs" in r]
    results = [r for r in results if "omit" in r]
    base = [r for r in results if not r["omit"]]
    s["baselines_ok"] = {m: sum(r[m]["outcome"] == "ok" for r in base) for m in modes}
    s["baselines"] = len(base)
    s["baselines_not_ok"] = [f"{r['case']} {m}: {_fmt(r[m])} {r[m].get('error', '')}" for r in base for m in modes
                             if r[m]["outcome"] != "ok"]
    var = [r for r in results if r["omit"]]
    s["variants"] = len(var)
    for m in modes:
        d: dict = {}
        req = [r for r in var if r["table"] == "required"]
        opt = [r for r in var if r["table"] == "optional"]
        d["required"] = {"cases": len(req), "crash": sum(r[m]["outcome"] == "crash" for r in req),
                         "error": sum(r[m]["outcome"] == "error" for r in req),
                         "ok": sum(r[m]["outcome"] == "ok" for r in req),
                         "timeout": sum(r[m]["outcome"] == "timeout" for r in req)}
        d["required_but_loaded"] = [f"{r['case']} omit={r['omit']}" for r in req if r[m]["outcome"] == "ok"]
        d["optional"] = {"cases": len(opt), "ok": sum(r[m]["outcome"] == "ok" for r in opt),
                         "error": sum(r[m]["outcome"] == "error" for r in opt),
                         "crash": sum(r[m]["outcome"] == "crash" for r in opt)}
        d["optional_but_crashed"] = [f"{r['case']} omit={r['omit']}: {_fmt(r[m])}" for r in opt
                                     if r[m]["outcome"] == "crash"]
        d["optional_but_error"] = [f"{r['case']} omit={r['omit']}: {r[m].get('error', '')}" for r in opt
                                   if r[m]["outcome"] == "error"]
        pred = [r for r in req if r[m]["outcome"] in ("crash", "error")]
        d["crash_vs_error_prediction"] = {
            "agree": sum(r["predicted_kernel"] == r[m]["outcome"] for r in pred),
            "predicted_error_but_crashed": [f"{r['case']} omit={r['omit']}: {_fmt(r[m])}" for r in pred
                                            if r["predicted_kernel"] == "error" and r[m]["outcome"] == "crash"],
            "predicted_crash_but_error": [f"{r['case']} omit={r['omit']}: {r[m].get('error', '')}" for r in pred
                                          if r["predicted_kernel"] == "crash" and r[m]["outcome"] == "error"]}
        s[m] = d
    s["input_count_variants"] = {
        m: {"cases": len(counts),
            "table_refused": sum(r["table"] == "refused" for r in counts),
            "table_refused_and_refused": sum(r["table"] == "refused" and r[m]["outcome"] != "ok" for r in counts),
            "table_refused_but_loaded": [f"{r['case']} inputs={r['n_inputs']}" for r in counts
                                         if r["table"] == "refused" and r[m]["outcome"] == "ok"],
            "table_accepted": sum(r["table"] == "accepted" for r in counts),
            "table_accepted_and_loaded": sum(r["table"] == "accepted" and r[m]["outcome"] == "ok" for r in counts),
            "table_accepted_but_not_loaded": [f"{r['case']} inputs={r['n_inputs']}: {_fmt(r[m])} "
                                              f"{r[m].get('error', '')}" for r in counts
                                              if r["table"] == "accepted" and r[m]["outcome"] != "ok"],
            "crashes": [f"{r['case']} inputs={r['n_inputs']}: {_fmt(r[m])}" for r in counts
                        if r[m]["outcome"] == "crash"]}
        for m in modes}
    s["crash_only_with_xnnpack"] = [f"{r['case']} omit={r['omit']}: {_fmt(r['xnnpack'])}" for r in var
                                    if r["xnnpack"]["outcome"] == "crash" and r["nodelegate"]["outcome"] != "crash"]
    return s


if __name__ == "__main__":
    sys.exit(main())
