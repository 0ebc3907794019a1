#!/usr/bin/env python3
"""Build runtime/data/op_versions.json: minimum TFLite runtime per (builtin op, op version).

The op table is *derived*, not hand-written: it is parsed out of the C++ map in
``tflite::FindMinimumRuntimeVersionForOp`` (TFLite's ``runtime_version.cc``), a
verbatim copy of which is read from ``scripts/third_party/runtime_version.cc`` (not committed: another
project's source; fetch the file at the commit recorded in the JSON ``source`` into that path)
together with the repository, path and commit it came from. The TFLite converter
uses the very same map to write the ``min_runtime_version`` metadata entry of the
``.tflite`` files it produces.

The ``runtimes`` part maps runtime *packages* (tensorflow, tflite-runtime,
ai-edge-litert) to the TFLite runtime version to compare against. It cannot be
derived from that file; it is recorded in ``PROBED`` below, which is the output of
the ``probe`` command run against the released wheels, with sources.

Commands (paths are resolved against the repository root):

  python scripts/make_op_versions.py            # regenerate the JSON (offline, stdlib only)
  python scripts/make_op_versions.py --check    # exit 1 if the JSON on disk is stale
  python scripts/make_op_versions.py validate [--runtime PKG==VER=MODULE[:PYTHONPATH][@PYTHON] ...]
                                                # needs tensorflow: convert small Keras models, compare
                                                #   the table with the converter's min_runtime_version
                                                #   metadata and (optionally) with real runtimes
  python scripts/make_op_versions.py probe --runtime LABEL=MODULE[:PYTHONPATH][@PYTHON] ...
                                                # ask runtimes which table entries they can load

``probe`` builds one tiny model per (op, version) entry of the table (an empty
subgraph plus that single operator code) and constructs an interpreter from it:
TFLite's InterpreterBuilder resolves *every* operator code of a model, so an entry
the runtime lacks fails with "Didn't find op for builtin opcode 'X' version 'N'".
Building the probe models needs ``flatbuffers`` and a TFLite schema module with the
object API (``ai_edge_litert.schema_py_generated`` or tensorflow's); each runtime is
loaded in its own subprocess, optionally with another PYTHONPATH (e.g. an older wheel
unpacked with ``pip install --no-deps --target DIR``) and another Python executable.
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
SOURCE = REPO_ROOT / "scripts" / "third_party" / "runtime_version.cc"
OUTPUT = REPO_ROOT / "runtime" / "data" / "op_versions.json"
FORMAT_VERSION = 1

VERBATIM_MARKER = "// BEGIN VERBATIM COPY\n"
HEADER_FIELD_RE = re.compile(r"^//\s+(repo|path|commit|url|licence):\s*(.+?)\s*$", re.M)
ENTRY_RE = re.compile(
    r"\{\{\s*BuiltinOperator_([A-Z0-9_]+)\s*,\s*(\d+)\s*\}\s*,\s*\"(\d+(?:\.\d+)*)\"\s*\}"
)

# --------------------------------------------------------------------------------------
# Runtime packages -> TFLite runtime version.
#
# Not derivable from runtime_version.cc, so curated here -- every entry names its source.
# PROBED is the output of `probe --emit-python` (see the module docstring and
# runtime/data/README.md for the exact command), run against the table at
# PROBED_AGAINST_COMMIT. A release's "runtime_version" (emitted as "tflite" in the JSON) is
# compared with table versions; "unsupported" / "extra_supported" list the table entries on
# which the release deviates from that comparison, so together they reproduce the probe
# exactly for that table.
# Re-run the probe whenever scripts/third_party/runtime_version.cc is replaced.
# --------------------------------------------------------------------------------------
PROBED_AGAINST_COMMIT = "119ae633cc864d7c797a4b259706961f4baf22ed"

PROBED: dict[str, dict] = {
    # label: package-version as probed (PyPI wheel, cp311, manylinux x86_64)
    'ai_edge_litert-1.0.0': {"runtime_version": "2.18.0", "unsupported": {"CAST": [7], "STABLEHLO_AND": [1], "STABLEHLO_CASE": [1], "STABLEHLO_SHIFT_LEFT": [1], "TRANSPOSE": [7]}, "extra_supported": {}},
    'ai_edge_litert-1.0.1': {"runtime_version": "2.18.0", "unsupported": {"CAST": [7], "STABLEHLO_AND": [1], "STABLEHLO_CASE": [1], "STABLEHLO_SHIFT_LEFT": [1], "TRANSPOSE": [7]}, "extra_supported": {}},
    'ai_edge_litert-1.1.0': {"runtime_version": "2.19.0", "unsupported": {"TRANSPOSE": [7]}, "extra_supported": {}},
    'ai_edge_litert-1.1.1': {"runtime_version": "2.19.0", "unsupported": {"TRANSPOSE": [7]}, "extra_supported": {}},
    'ai_edge_litert-1.1.2': {"runtime_version": "2.19.0", "unsupported": {"TRANSPOSE": [7]}, "extra_supported": {}},
    'ai_edge_litert-1.2.0': {"runtime_version": "2.19.0", "unsupported": {}, "extra_supported": {}},
    'ai_edge_litert-1.3.0': {"runtime_version": "2.19.0", "unsupported": {}, "extra_supported": {"DYNAMIC_UPDATE_SLICE": [4]}},
    'ai_edge_litert-1.4.0': {"runtime_version": "2.19.0", "unsupported": {}, "extra_supported": {"DYNAMIC_UPDATE_SLICE": [4]}},
    'ai_edge_litert-2.0.2': {"runtime_version": "2.20.0", "unsupported": {}, "extra_supported": {"SQRT": [2]}},
    'ai_edge_litert-2.0.3': {"runtime_version": "2.20.0", "unsupported": {}, "extra_supported": {"SQRT": [2]}},
    'ai_edge_litert-2.1.0': {"runtime_version": "2.21.0", "unsupported": {"CONCATENATION": [5], "DYNAMIC_UPDATE_SLICE": [5], "EMBEDDING_LOOKUP": [5], "QUANTIZE": [5, 6]}, "extra_supported": {}},
    'ai_edge_litert-2.1.1': {"runtime_version": "2.21.0", "unsupported": {"CONCATENATION": [5], "DYNAMIC_UPDATE_SLICE": [5], "EMBEDDING_LOOKUP": [5], "QUANTIZE": [5, 6]}, "extra_supported": {}},
    'ai_edge_litert-2.1.2': {"runtime_version": "2.21.0", "unsupported": {"QUANTIZE": [5, 6]}, "extra_supported": {}},
    'ai_edge_litert-2.1.3': {"runtime_version": "2.21.0", "unsupported": {}, "extra_supported": {"DEQUANTIZE": [8], "UNPACK": [5]}},
    'ai_edge_litert-2.1.4': {"runtime_version": "2.21.0", "unsupported": {}, "extra_supported": {"DEQUANTIZE": [8], "UNPACK": [5]}},
    'ai_edge_litert-2.1.5': {"runtime_version": "2.21.0", "unsupported": {}, "extra_supported": {"DEQUANTIZE": [8], "UNPACK": [5]}},
    'ai_edge_litert-2.1.6': {"runtime_version": "2.23.0", "unsupported": {}, "extra_supported": {}},
    'ai_edge_litert-2.2.0': {"runtime_version": "2.23.0", "unsupported": {}, "extra_supported": {}},
    'ai_edge_litert-2.3.0': {"runtime_version": "2.23.0", "unsupported": {}, "extra_supported": {}},
    'tflite_runtime-2.14.0': {"runtime_version": "2.14.0", "unsupported": {}, "extra_supported": {}},
    'tensorflow-2.21.0': {"runtime_version": "2.21.0", "unsupported": {"QUANTIZE": [5, 6]}, "extra_supported": {}},
}
# Table entries that no probed runtime can load (no builtin kernel registered anywhere).
PROBED_NOT_LOADABLE = {"STABLEHLO_CBRT": [1]}

# Version string compiled into ai_edge_litert/libpywrap_litert_common.so (TFLITE_VERSION_STRING,
# i.e. TF_VERSION_STRING of the TensorFlow tree LiteRT was built with). Wheels 1.0.0-1.3.0 carry
# none (the symbol is not linked in). Informational only: it does NOT bound what loads
# (2.1.6-2.3.0 say 2.22.0-dev0 but load every 2.23.0 entry).
REPORTED_VERSION_STRINGS = {
    "1.4.0": "2.20.0-dev0+selfbuilt",
    "2.0.2": "2.21.0-dev0+selfbuilt", "2.0.3": "2.21.0-dev0+selfbuilt", "2.1.0": "2.21.0-dev0+selfbuilt",
    "2.1.1": "2.21.0-dev0+selfbuilt", "2.1.2": "2.21.0-dev0+selfbuilt",
    "2.1.3": "2.22.0-dev0+selfbuilt", "2.1.4": "2.22.0-dev0+selfbuilt", "2.1.5": "2.22.0-dev0+selfbuilt",
    "2.1.6": "2.22.0-dev0+selfbuilt", "2.2.0": "2.22.0-dev0+selfbuilt", "2.3.0": "2.22.0-dev0+selfbuilt",
}

_WHEEL_URL = "https://pypi.org/project/{pkg}/{v}/"
_PROBE_SOURCE = (
    "empirical: `scripts/make_op_versions.py probe` against {pkg}=={v} from PyPI (cp311 manylinux x86_64 "
    "wheel): one model per table entry; interpreter construction either succeeds or fails with "
    "\"Didn't find op for builtin opcode\""
)
_STRING_SOURCE = ("`strings -a ai_edge_litert/libpywrap_litert_common.so` of the same wheel "
                  "(TFLITE_VERSION_STRING)")


def _probed_release(label: str) -> dict:
    pkg, v = label.rsplit("-", 1)
    pkg = pkg.replace("_", "-")
    probed = PROBED[label]
    entry = {"tflite": probed["runtime_version"], "unsupported": probed["unsupported"],
             "extra_supported": probed["extra_supported"]}
    entry["sources"] = [_PROBE_SOURCE.format(pkg=pkg, v=v), _WHEEL_URL.format(pkg=pkg, v=v)]
    if pkg == "ai-edge-litert" and v in REPORTED_VERSION_STRINGS:
        entry["reported_version_string"] = REPORTED_VERSION_STRINGS[v]
        entry["sources"].append(_STRING_SOURCE)
    return entry


def build_runtimes() -> tuple[dict, dict]:
    """Return (runtimes, runtime_matching): per-package mappings and the rules for using them."""
    versions: dict[str, dict[str, dict]] = {"tensorflow": {}, "tflite-runtime": {}, "ai-edge-litert": {}}
    for label in PROBED:
        pkg, v = label.rsplit("-", 1)
        versions[pkg.replace("_", "-")][v] = _probed_release(label)
    for pkg in versions:
        versions[pkg] = {v: versions[pkg][v] for v in sorted(versions[pkg], key=version_key)}
    same_version_sources = [
        "tflite::FindMinimumRuntimeVersionForOp: 'associate it with the current runtime version defined "
        "in tensorflow/core/public/version.h' -- table versions are TensorFlow release numbers "
        "(scripts/third_party/runtime_version.cc)",
        "empirical: probed versions below (tflite-runtime 2.14.0 loads exactly the entries <= 2.14.0; "
        "tensorflow 2.21.0 loads every entry <= 2.21.0 except QUANTIZE v5/v6)",
    ]
    runtimes = {
        "tensorflow": {
            "rule": "same_version",
            "description": ("tensorflow==X.Y[.Z] (tf.lite.Interpreter) is TFLite runtime X.Y.Z; X.Y means X.Y.0. "
                            "Versions listed under 'versions' were probed; use their deviations."),
            "sources": same_version_sources,
            "versions": versions["tensorflow"],
        },
        "tflite-runtime": {
            "rule": "same_version",
            "description": ("tflite-runtime==X.Y[.Z] is TFLite runtime X.Y.Z (built from the TensorFlow release "
                            "of the same number); X.Y means X.Y.0. Last PyPI release: 2.14.0."),
            "sources": same_version_sources,
            "versions": versions["tflite-runtime"],
        },
        "ai-edge-litert": {
            "rule": "per_release",
            "description": ("ai-edge-litert version numbers are unrelated to TensorFlow's: use the probed entry "
                            "of the release. X.Y means X.Y.0. A release not listed is unmapped -- say so "
                            "rather than guess. All 19 releases on PyPI up to 2.3.0 are listed."),
            "versions": versions["ai-edge-litert"],
        },
    }
    matching = {
        "rule": (
            "An op (OP, v) of a model resolves on a package version iff (OP, v) is in that version's "
            "extra_supported, or table[OP][v] <= its 'tflite' version and (OP, v) is neither in its "
            "'unsupported' nor in not_loadable_by_any_probed_runtime. Versions compare numerically on the "
            "first three dot-separated integers (tflite::CompareRuntimeVersion); suffixes such as "
            "-dev0/-rc1/+selfbuilt are dropped. An (OP, v) absent from 'ops' is unknown, not unsupported."
        ),
        "probed_against_commit": PROBED_AGAINST_COMMIT,
        "not_loadable_by_any_probed_runtime": PROBED_NOT_LOADABLE,
        "reference_implementation": "scripts/make_op_versions.py: predict_loads()",
    }
    return runtimes, matching


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------
def version_key(v: str) -> tuple[int, int, int]:
    """'2.14.4' -> (2, 14, 4); '2.22.0-dev0+selfbuilt' -> (2, 22, 0); missing parts are 0."""
    core = re.split(r"[-+]", v.strip(), maxsplit=1)[0]
    parts = [int(p) for p in core.split(".") if p.isdigit()][:3]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def _strip_cpp_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse_source(path: Path = SOURCE) -> tuple[dict, list[tuple[str, int, str]]]:
    """Return (source metadata, [(op, op_version, min_runtime_version), ...] in file order)."""
    text = path.read_text(encoding="utf-8")
    if VERBATIM_MARKER not in text:
        raise SystemExit(f"{path}: missing marker line {VERBATIM_MARKER.strip()!r}")
    header, body = text.split(VERBATIM_MARKER, 1)
    meta = dict(HEADER_FIELD_RE.findall(header))
    for field in ("repo", "path", "commit"):
        if field not in meta:
            raise SystemExit(f"{path}: header lacks '// {field}: ...'")
    meta["sha256_of_verbatim_copy"] = hashlib.sha256(body.encode("utf-8")).hexdigest()

    start = body.find("FindMinimumRuntimeVersionForOp(")
    if start < 0:
        raise SystemExit(f"{path}: FindMinimumRuntimeVersionForOp not found")
    end = body.find("});", start)
    if end < 0:
        raise SystemExit(f"{path}: end of op_version_map initializer not found")
    table_src = _strip_cpp_comments(body[start:end])
    entries = [(op, int(ver), rt) for op, ver, rt in ENTRY_RE.findall(table_src)]
    if not entries:
        raise SystemExit(f"{path}: no {{{{BuiltinOperator_X, N}}, \"V\"}} entries found")

    # Sanity: every '{{BuiltinOperator_' inside the map must have been matched.
    n_raw = table_src.count("{{BuiltinOperator_")
    if n_raw != len(entries):
        raise SystemExit(f"{path}: matched {len(entries)} entries but saw {n_raw} '{{{{BuiltinOperator_' tokens")
    return meta, entries


def build_ops_table(entries: list[tuple[str, int, str]]) -> dict[str, dict[str, str]]:
    table: dict[str, dict[int, str]] = {}
    for op, ver, rt in entries:
        slot = table.setdefault(op, {})
        if ver in slot:
            # std::map's initializer_list constructor keeps the first of duplicate keys.
            raise SystemExit(f"duplicate entry for {op} v{ver}: {slot[ver]!r} and {rt!r}")
        slot[ver] = rt
    return {op: {str(v): table[op][v] for v in sorted(table[op])} for op in sorted(table)}


def build_document(meta: dict, entries: list[tuple[str, int, str]]) -> dict:
    ops = build_ops_table(entries)
    runtimes, matching = build_runtimes()
    source = {
        "repo": meta["repo"],
        "path": meta["path"],
        "commit": meta["commit"],
        "url": meta.get("url", f"https://github.com/{meta['repo']}/blob/{meta['commit']}/{meta['path']}"),
        "licence": meta.get("licence", "Apache-2.0"),
        "function": "tflite::FindMinimumRuntimeVersionForOp",
        "local_copy": str(SOURCE.relative_to(REPO_ROOT)),
        "local_copy_sha256": meta["sha256_of_verbatim_copy"],
    }
    return {
        "format_version": FORMAT_VERSION,
        "description": (
            "Minimum TensorFlow Lite runtime version able to run each (builtin op, op version), "
            "and the TFLite runtime version of runtime packages. Ops/versions missing from 'ops' "
            "are unknown to the source table (the converter skips them too)."
        ),
        "source": source,
        "derived_by": "scripts/make_op_versions.py",
        "regenerate": "python scripts/make_op_versions.py",
        "stats": {
            "ops": len(ops),
            "entries": sum(len(v) for v in ops.values()),
            "max_runtime_version": max((rt for _, _, rt in entries), key=version_key),
        },
        "ops": ops,
        "runtimes": runtimes,
        "runtime_matching": matching,
    }


def render(doc: dict) -> str:
    # Key order is fixed by construction (ops alphabetical, op versions numeric), so no sort_keys.
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


# --------------------------------------------------------------------------------------
# Helpers shared by `validate` and `probe`
# --------------------------------------------------------------------------------------
def _schema(prefer_tensorflow: bool = True):
    """Import a TFLite flatbuffer schema module (object API needed only for probe)."""
    errors = []
    names = ["tensorflow.lite.python.schema_py_generated", "ai_edge_litert.schema_py_generated"]
    for name in names if prefer_tensorflow else names[::-1]:
        try:
            return __import__(name, fromlist=["Model"])
        except Exception as exc:  # pragma: no cover - depends on the environment
            errors.append(f"{name}: {exc}")
    raise SystemExit("no TFLite schema module importable:\n  " + "\n  ".join(errors))


def op_names(schema) -> dict[int, str]:
    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


def read_model_ops(buf: bytes, schema) -> tuple[list[tuple[str, int]], list[tuple[str, int]], dict[str, bytes]]:
    """Return (all operator codes, operator codes used by some operator, metadata name->bytes)."""
    names = op_names(schema)
    model = schema.Model.GetRootAsModel(buf, 0)
    codes = []
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        name = names.get(code, f"BUILTIN_{code}")
        if name == "CUSTOM":
            name = "CUSTOM:" + (oc.CustomCode() or b"").decode()
        codes.append((name, oc.Version()))
    used_idx = set()
    for s in range(model.SubgraphsLength()):
        sg = model.Subgraphs(s)
        for j in range(sg.OperatorsLength()):
            used_idx.add(sg.Operators(j).OpcodeIndex())
    used = [codes[i] for i in sorted(used_idx)]
    metadata = {}
    for i in range(model.MetadataLength()):
        md = model.Metadata(i)
        data = model.Buffers(md.Buffer()).DataAsNumpy()
        metadata[md.Name().decode()] = bytes(data) if not isinstance(data, int) else b""
    return codes, used, metadata


def required_version(ops: list[tuple[str, int]], table: dict) -> tuple[str | None, list[tuple[str, int]]]:
    """Max table version over ops (as UpdateMinimumRuntimeVersionForModel), and ops missing from the table."""
    best, missing = None, []
    for name, ver in ops:
        rt = table.get(name, {}).get(str(ver))
        if rt is None:
            missing.append((name, ver))
        elif best is None or version_key(rt) > version_key(best):
            best = rt
    return best, sorted(set(missing))


def predict_loads(ops: list[tuple[str, int]], doc: dict, package: str, version: str) -> tuple[bool | None, list]:
    """Reference use of op_versions.json: would `package==version` load a model with these ops?

    Returns (verdict, blockers): verdict False if some op would fail to resolve, True if all
    resolve, None if the package release is unmapped or some op is unknown to the table.
    """
    pkg = doc["runtimes"][package]
    full = ".".join((version.split(".") + ["0", "0"])[:3])
    rel = pkg["versions"].get(version) or pkg["versions"].get(full)
    if rel is None and pkg["rule"] == "same_version":
        rel = {"tflite": full, "unsupported": {}, "extra_supported": {}}
    if rel is None:
        return None, [f"{package}=={version} is not mapped"]
    rv = version_key(rel["tflite"])
    never = doc["runtime_matching"].get("not_loadable_by_any_probed_runtime", {})
    blockers, unknown = [], []
    for op, ver in sorted(set(ops)):
        if op.startswith("CUSTOM:"):
            unknown.append(f"{op} (custom op)")
            continue
        if ver in rel["extra_supported"].get(op, []):
            continue
        need = doc["ops"].get(op, {}).get(str(ver))
        if need is None:
            unknown.append(f"{op} v{ver} (not in table)")
        elif version_key(need) > rv:
            blockers.append(f"{op} v{ver} (needs {need})")
        elif ver in rel["unsupported"].get(op, []) or ver in never.get(op, []):
            blockers.append(f"{op} v{ver} (table says {need}, but this runtime was observed not to load it)")
    if blockers:
        return False, blockers
    return (None, unknown) if unknown else (True, [])


def _worker(module: str, model_dir: str) -> None:
    """Subprocess body: load every *.tflite in model_dir with `module`, print JSON results."""
    import importlib

    mod = importlib.import_module(module)
    Interpreter = getattr(mod, "Interpreter")
    results = {}
    for fn in sorted(os.listdir(model_dir)):
        if not fn.endswith(".tflite"):
            continue
        try:
            Interpreter(model_path=os.path.join(model_dir, fn))
            results[fn] = None
        except Exception as exc:  # noqa: BLE001 - any failure to build counts
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            results[fn] = lines[0][:300] if lines else type(exc).__name__
    pkg = module.split(".")[0]
    version = getattr(sys.modules.get(pkg), "__version__", None)
    if version is None and pkg == "tensorflow":
        version = importlib.import_module("tensorflow").__version__
    print("@@RESULT@@" + json.dumps({"module": module, "file": getattr(mod, "__file__", None),
                                     "version": version, "results": results}))


def run_worker(module: str, model_dir: Path, pythonpath: str | None, python: str | None = None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    proc = subprocess.run([python or sys.executable, __file__, "_worker", module, str(model_dir)],
                          capture_output=True, text=True, env=env, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    raise SystemExit(f"worker failed (rc={proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


# --------------------------------------------------------------------------------------
# probe
# --------------------------------------------------------------------------------------
def _probe_model(schema, code: int, version: int) -> bytes:
    import flatbuffers

    m = schema.ModelT()
    m.version = 3
    m.description = b"edgekit op-version probe"
    m.buffers = [schema.BufferT()]
    t = schema.TensorT()
    t.shape, t.type, t.buffer, t.name = [1], schema.TensorType.FLOAT32, 0, b"x"
    sg = schema.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators = [t], [0], [0], []
    m.subgraphs = [sg]
    oc = schema.OperatorCodeT()
    oc.builtinCode = code
    oc.deprecatedBuiltinCode = min(code, 127)  # 127 = PLACEHOLDER_FOR_GREATER_OP_CODES
    oc.version = version
    m.operatorCodes = [oc]
    b = flatbuffers.Builder(256)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def summarise_probe(results: dict[tuple[str, int], str | None], table: dict,
                    ignore: set[tuple[str, int]] = frozenset()) -> dict:
    """Fit one TFLite runtime version to a runtime's per-entry load results.

    `ignore` holds entries that no probed runtime could load (no builtin kernel is registered
    for them at all); they say nothing about the version and are listed separately.

    runtime_version V is the table version minimising the number of deviations, i.e. entries
    with min <= V that fail ("unsupported") plus entries with min > V that load
    ("extra_supported"); ties go to the lower V. With both lists the summary reproduces the
    probe exactly for every entry of the table it was run against.
    """
    def mv(k):
        return version_key(table[k[0]][str(k[1])])

    ok = {k for k, err in results.items() if err is None}
    counted_fail = {k for k, err in results.items() if err is not None} - set(ignore)
    best = None
    for v in sorted({rt for t in table.values() for rt in t.values()}, key=version_key):
        unsupported = sorted(k for k in counted_fail if mv(k) <= version_key(v))
        extra = sorted(k for k in ok if mv(k) > version_key(v))
        if best is None or len(unsupported) + len(extra) < best[0]:
            best = (len(unsupported) + len(extra), v, unsupported, extra)
    _, v, unsupported, extra = best
    supported_upto = None  # highest V such that every counted entry with min <= V loads
    for w in sorted({rt for t in table.values() for rt in t.values()}, key=version_key):
        if any(mv(k) <= version_key(w) for k in counted_fail):
            break
        supported_upto = w

    def group(keys):
        out: dict[str, list[int]] = {}
        for op, ver in sorted(keys):
            out.setdefault(op, []).append(ver)
        return out

    fmt = lambda k: f"{k[0]} v{k[1]} (min {table[k[0]][str(k[1])]})"  # noqa: E731
    return {"runtime_version": v, "unsupported": group(unsupported), "extra_supported": group(extra),
            "every_entry_loads_up_to": supported_upto,
            "n_ok": len(ok), "n_fail": len(results) - len(ok),
            "failing": [f"{fmt(k)}: {results[k]}" for k in sorted(counted_fail, key=lambda k: (mv(k), k))],
            "failing_everywhere": group(set(results) & set(ignore))}


def cmd_probe(args) -> int:
    schema = _schema(prefer_tensorflow=False)
    codes = {v: k for k, v in op_names(schema).items()}
    _, entries = parse_source()
    table = build_ops_table(entries)
    runtimes = []
    for spec in args.runtime:
        label, _, rest = spec.partition("=")
        rest, _, python = rest.partition("@")
        module, _, pythonpath = rest.partition(":")
        if not module:
            raise SystemExit(f"bad --runtime {spec!r}; expected LABEL=MODULE[:PYTHONPATH][@PYTHON]")
        runtimes.append((label, module, pythonpath or None, python or None))
    raw = {}
    with tempfile.TemporaryDirectory(prefix="opv-probe-") as tmp:
        index = {}
        for op, ver, _ in entries:
            if op not in codes:
                print(f"warning: schema module has no BuiltinOperator_{op}; skipped", file=sys.stderr)
                continue
            fn = f"{op}__v{ver}.tflite"
            Path(tmp, fn).write_bytes(_probe_model(schema, codes[op], ver))
            index[fn] = (op, ver)
        for label, module, pythonpath, python in runtimes:
            out = run_worker(module, Path(tmp), pythonpath, python)
            raw[label] = (out, {index[fn]: err for fn, err in out["results"].items()})
    everywhere = set.intersection(*({k for k, e in res.items() if e is not None} for _, res in raw.values()))
    report = {}
    for label, (out, res) in raw.items():
        summary = summarise_probe(res, table, everywhere)
        report[label] = {"runtime": {k: out[k] for k in ("module", "file", "version")}, **summary}
        print(f"== {label}: {out['module']} {out['version']} ({out['file']})")
        print(f"   loaded {summary['n_ok']}/{len(res)}; fitted runtime_version {summary['runtime_version']}; "
              f"every entry with min <= {summary['every_entry_loads_up_to']} loads")
        for op, vs in summary["unsupported"].items():
            print(f"   unsupported although min <= {summary['runtime_version']}: "
                  + ", ".join(f"{op} v{x} (min {table[op][str(x)]})" for x in vs))
        for op, vs in summary["extra_supported"].items():
            print(f"   loads although min > {summary['runtime_version']}: "
                  + ", ".join(f"{op} v{x} (min {table[op][str(x)]})" for x in vs))
        for line in summary["failing"] if args.verbose else []:
            print(f"   fails: {line}")
    if everywhere:
        print("failing on every probed runtime: " + ", ".join(f"{op} v{v}" for op, v in sorted(everywhere)))
    if args.emit_python:
        print("# --- data literal for PROBED in scripts/make_op_versions.py ---")
        for label, rep in report.items():
            print(f"    {label!r}: " + json.dumps({k: rep[k] for k in ("runtime_version", "unsupported",
                                                                    "extra_supported")}) + ",")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


# --------------------------------------------------------------------------------------
# validate (needs tensorflow)
# --------------------------------------------------------------------------------------
def _validation_models():
    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    rng = np.random.default_rng(0)

    def cnn():
        inp = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
        y = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6")(x)
        x = keras.layers.Add()([x, y])
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Concatenate()([x, keras.layers.AveragePooling2D(1)(x)])
        x = keras.layers.Conv2D(8, 1)(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        x = keras.layers.Dense(16, activation="tanh")(x)
        x = keras.layers.Dense(10)(x)
        out = keras.layers.Softmax()(x)
        return keras.Model(inp, out, name="cnn"), (1, 32, 32, 3)

    def mlp():
        inp = keras.Input((20,))
        x = keras.layers.Dense(32, activation="sigmoid")(inp)
        x = keras.layers.Reshape((4, 8))(x)
        x = keras.layers.Permute((2, 1))(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(8, activation="leaky_relu")(x)
        x = keras.layers.Multiply()([x, x])
        out = keras.layers.Dense(3)(x)
        return keras.Model(inp, out, name="mlp"), (1, 20)

    def attn():
        inp = keras.Input((16, 64))
        x = keras.layers.LayerNormalization()(inp)
        q = keras.layers.Dense(64)(x)                   # large enough to be weight-quantized
        k = keras.layers.Dense(64)(x)
        a = keras.layers.Softmax()(keras.ops.matmul(q, keras.ops.transpose(k, (0, 2, 1))) / 8.0)
        x = keras.layers.Add()([inp, keras.ops.matmul(a, x)])  # BATCH_MATMUL
        x = keras.layers.Dense(128, activation="gelu")(x)
        out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x))
        return keras.Model(inp, out, name="attn"), (1, 16, 64)

    def misc():
        class M(tf.Module):
            def __init__(self):
                self.w = tf.Variable(rng.standard_normal((16, 16)).astype("float32"))

            @tf.function(input_signature=[tf.TensorSpec((1, 8, 16), tf.float32)])
            def __call__(self, x):
                a = tf.matmul(x, self.w)                       # BATCH_MATMUL / FULLY_CONNECTED
                b = tf.transpose(a, [0, 2, 1])                 # TRANSPOSE
                c = tf.strided_slice(b, [0, 0, 0], [1, 8, 8], [1, 1, 2])  # STRIDED_SLICE
                d = tf.pad(c, [[0, 0], [1, 1], [0, 0]])        # PAD
                e = tf.reduce_mean(d, axis=1, keepdims=True)   # MEAN
                f = tf.concat([d, tf.tile(e, [1, 2, 1])], 1)   # CONCATENATION / TILE
                g = tf.gather(f, [0, 2, 4], axis=1)            # GATHER
                h = tf.nn.relu(g) - tf.math.exp(g * -1.0)      # RELU / EXP / SUB / MUL
                i = tf.reduce_max(h, axis=-1)                  # REDUCE_MAX
                return tf.math.maximum(i, 0.0) + tf.math.minimum(i, 1.0)  # MAXIMUM / MINIMUM / ADD
        m = M()
        return m, (1, 8, 16)

    return [cnn, mlp, attn, misc], rng


def _convert(model_and_shape, mode: str, rng):
    import numpy as np
    import tensorflow as tf

    model, shape = model_and_shape
    if isinstance(model, tf.keras.Model):
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
    else:
        conv = tf.lite.TFLiteConverter.from_concrete_functions([model.__call__.get_concrete_function()], model)

    def rep():
        for _ in range(16):
            yield [rng.standard_normal(shape).astype("float32")]

    if mode == "float32":
        pass
    elif mode == "dynamic_range":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    elif mode == "float16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    elif mode == "int8":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = rep
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    elif mode == "int8_float_io":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = rep
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    elif mode == "int16x8":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = rep
        conv.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    else:
        raise ValueError(mode)
    np.random.seed(0)
    return conv.convert()


def cmd_validate(args) -> int:
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    schema = _schema()
    doc = json.loads(OUTPUT.read_text()) if OUTPUT.exists() and not args.fresh else None
    if doc is None:
        doc = build_document(*parse_source())
    table = doc["ops"]
    makers, rng = _validation_models()
    modes = args.modes.split(",")
    out_dir = Path(args.out_dir) if args.out_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    rows, bad = [], 0
    for make in makers:
        built = make()
        for mode in modes:
            name = f"{make.__name__}_{mode}"
            try:
                buf = _convert(built, mode, rng)
            except Exception as exc:  # noqa: BLE001
                print(f"{name}: conversion failed: {str(exc).splitlines()[0][:200]}")
                continue
            if out_dir:
                (out_dir / f"{name}.tflite").write_bytes(buf)
            codes, used, meta = read_model_ops(buf, schema)
            computed, missing = required_version(used, table)
            computed_all, _ = required_version(codes, table)
            recorded = meta.get("min_runtime_version", b"").rstrip(b"\0").decode("ascii", "replace") or None
            match = computed == recorded
            bad += not match
            rows.append({"model": name, "computed": computed, "computed_all_opcodes": computed_all,
                         "converter_metadata": recorded, "match": match,
                         "ops": sorted(set(used)), "missing_from_table": missing, "_buf": buf})
            print(f"{name:28s} table={computed!s:8s} metadata={recorded!s:8s} "
                  f"{'OK' if match else 'MISMATCH'}  ops={','.join(f'{o}v{v}' for o, v in sorted(set(used)))}"
                  + (f"  missing={missing}" if missing else ""))
    print(f"tensorflow {tf.__version__}: {len(rows)} models, {bad} metadata mismatches")
    if args.runtime:
        # Load the converted models on real runtimes and compare with what the JSON predicts.
        wrong = 0
        with tempfile.TemporaryDirectory(prefix="opv-validate-") as tmp:
            for r in rows:
                Path(tmp, r["model"] + ".tflite").write_bytes(r.pop("_buf"))
            for spec in args.runtime:
                package, _, rest = spec.partition("==")
                version, _, loc = rest.partition("=")
                module, _, loc = loc.partition(":")
                pythonpath, _, python = loc.partition("@")
                out = run_worker(module, Path(tmp), pythonpath or None, python or None)
                for r in rows:
                    err = out["results"][r["model"] + ".tflite"]
                    verdict, why = predict_loads([tuple(o) for o in r["ops"]], doc, package, version)
                    agree = verdict is None or verdict == (err is None)
                    wrong += not agree
                    r.setdefault("runtimes", {})[f"{package}=={version}"] = {
                        "predicted": verdict, "loaded": err is None, "error": err, "why": why}
                    if not agree or args.verbose:
                        print(f"  {package}=={version:7s} {r['model']:22s} predicted={verdict} "
                              f"loaded={err is None} {'' if agree else 'DISAGREE'} {why or ''} {err or ''}")
                n_ok = sum(1 for r in rows if r["runtimes"][f"{package}=={version}"]["loaded"])
                print(f"{package}=={version}: {n_ok} of {len(rows)} models load")
        print(f"runtime cross-check: {wrong} disagreements")
        bad += wrong
    for r in rows:
        r.pop("_buf", None)
    if args.json:
        Path(args.json).write_text(json.dumps({"tensorflow": tf.__version__, "models": rows}, indent=2) + "\n")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    meta, entries = parse_source()
    text = render(build_document(meta, entries))
    if meta["commit"] != PROBED_AGAINST_COMMIT and not args.check:
        print(f"warning: PROBED was fitted against table commit {PROBED_AGAINST_COMMIT[:12]}, the source copy "
              f"is {meta['commit'][:12]}; re-run `probe` and update PROBED", file=sys.stderr)
    ops = json.loads(text)["stats"]
    return write_or_check(OUTPUT, text, check=args.check, script="make_op_versions.py",
                          summary=f"{ops['ops']} ops, {ops['entries']} (op, version) entries "
                                  f"from {meta['repo']}/{meta['path']}@{meta['commit'][:12]}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        _worker(argv[1], argv[2])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the JSON on disk differs from a fresh build")
    sub = p.add_subparsers(dest="cmd")
    v = sub.add_parser("validate", help="convert small Keras models with tensorflow and compare with metadata")
    v.add_argument("--modes", default="float32,dynamic_range,float16,int8,int8_float_io,int16x8")
    v.add_argument("--out-dir", help="keep the converted .tflite files here")
    v.add_argument("--json", help="write results as JSON")
    v.add_argument("--fresh", action="store_true", help="use a table parsed now instead of the JSON on disk")
    v.add_argument("--runtime", action="append", metavar="PACKAGE==VERSION=MODULE[:PYTHONPATH][@PYTHON]",
                   help="also load the converted models with this runtime and compare with the prediction "
                        "from op_versions.json (repeatable), e.g. "
                        "ai-edge-litert==2.3.0=ai_edge_litert.interpreter")
    v.add_argument("-v", "--verbose", action="store_true")
    pr = sub.add_parser("probe", help="ask a runtime which table entries it can load")
    pr.add_argument("--runtime", action="append", required=True, metavar="LABEL=MODULE[:PYTHONPATH][@PYTHON]",
                    help="runtime to probe (repeatable): MODULE has an Interpreter class "
                         "(ai_edge_litert.interpreter, tflite_runtime.interpreter, "
                         "tensorflow.lite.python.interpreter); PYTHONPATH is prepended for its subprocess "
                         "(e.g. a `pip install --no-deps --target` dir); PYTHON is the interpreter to run it "
                         "with (e.g. a venv with numpy<2 for wheels built against numpy 1.x)")
    pr.add_argument("--json", help="write the probe report as JSON")
    pr.add_argument("-v", "--verbose", action="store_true", help="list every failing entry")
    pr.add_argument("--emit-python", action="store_true", help="print the per-runtime data literal used in PROBED")
    args = p.parse_args(argv)
    if args.cmd == "validate":
        return cmd_validate(args)
    if args.cmd == "probe":
        return cmd_probe(args)
    return cmd_generate(args)


if __name__ == "__main__":
    sys.exit(main())
