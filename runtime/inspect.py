"""What is inside a .tflite: I/O, ops and their versions, dtypes of ops and weights, quantization
granularity, sparsity, custom and flex ops, metadata, and GPU delegate compatibility (from TFLite's
own analyzer). Pure Python over the flatbuffer schema that LiteRT ships; no TensorFlow."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.runtime.flatbuffer import (
    NUMPY_TYPES,
    ModelView,
    OperatorView,
    SubgraphView,
    TensorView,
    corrupt_as_format_error,
    read_model_file,
)
from edgekit.runtime.metadata import read_edgekit_metadata, read_metadata_entries

INSPECT_SCHEMA = "edgekit.inspect/1"
_FAMILY = {"INT8": "int8", "UINT8": "int8", "INT4": "int4", "INT16": "int16", "FLOAT16": "float16",
           "BFLOAT16": "float16", "FLOAT32": "float32"}


def operators(model: bytes | ModelView, subgraph: int = 0) -> tuple[ModelView, SubgraphView,
                                                                    list[tuple[int, str, OperatorView]]]:
    """(view, subgraph, [(index, op name, op)]) of one subgraph: the walk that the readers of op graphs
    (runtime.sparsity, the converters' autopilot) share."""
    view = ModelView.of(model)
    sub = view.subgraphs[subgraph]
    return view, sub, [(op.index, view.op_name(op), op) for op in sub.operators]


def _quantization(tensor: TensorView) -> dict[str, Any] | None:
    q = tensor.quantization
    if q is None or len(q.scales) == 0:
        return None
    zps = q.zero_points if len(q.zero_points) else np.zeros(1, np.int64)
    return {"scales": len(q.scales), "per_channel": len(q.scales) > 1, "axis": q.axis,
            "scale": float(q.scales[0]), "zero_point": int(zps[0]), "zero_points": zps}


def analyze(model: bytes | ModelView, *, path: str | None = None, gpu: bool = True) -> dict[str, Any]:
    """The full inspection report (JSON-serialisable), schema edgekit.inspect/1. `model` is the file's
    bytes or a parsed ModelView; the file is parsed once for every part of the report."""
    view = ModelView.of(model, path or "model")
    with corrupt_as_format_error(path or "model"):
        report = _analyze(view, path)
    if gpu:
        report["gpu"] = gpu_compatibility(view, report, path)
    return report


def _type_name(tensor: TensorView) -> str:
    return tensor.type_name or str(tensor.type)


@dataclass
class _Weights:
    """What the constant tensors of every subgraph add up to."""

    bytes: Counter[str] = field(default_factory=Counter)
    granularity: Counter[str] = field(default_factory=Counter)
    zeros: int = 0
    total: int = 0
    sparse_tensors: int = 0
    tensors: list[dict[str, Any]] = field(default_factory=list)
    quantized: bool = False

    def add(self, t: TensorView, data: memoryview) -> None:
        dtype_name = _type_name(t)
        self.bytes[_FAMILY.get(dtype_name, dtype_name.lower())] += len(data)
        q = _quantization(t)
        if q is not None and dtype_name in ("INT8", "UINT8", "INT16", "INT4"):
            self.quantized = True
            self.granularity["per_channel" if q["per_channel"] else "per_tensor"] += 1
        if t.sparse:
            self.sparse_tensors += 1
        np_type = NUMPY_TYPES.get(dtype_name)
        is_kernel = len(t.shape) >= 2  # sparsity is about kernels, not biases or shapes
        if np_type is None or not is_kernel or len(data) % np.dtype(np_type).itemsize:
            return
        values = np.frombuffer(data, np_type)
        zero: int | None = 0
        if q is not None and np.issubdtype(np_type, np.integer):
            zp = q["zero_points"]
            zero = int(zp[0]) if len(np.unique(zp)) == 1 else None
        if zero is not None:
            nz = int(np.count_nonzero(values == zero))
            self.zeros += nz
            self.total += values.size
            self.tensors.append({"tensor": t.name, "dtype": dtype_name, "bytes": len(data),
                                 "sparsity": round(nz / values.size, 4)})


@dataclass
class _Ops:
    """What the operators of every subgraph add up to."""

    histogram: Counter[str] = field(default_factory=Counter)
    versions: dict[str, set[int]] = field(default_factory=dict)
    family: Counter[str] = field(default_factory=Counter)
    float_ops: list[dict[str, Any]] = field(default_factory=list)
    op_list: list[dict[str, Any]] = field(default_factory=list)

    def add(self, view: ModelView, sub: SubgraphView, op: OperatorView, constant: dict[int, memoryview]) -> None:
        code = view.op_codes[op.opcode_index]
        name, version, tensors, outs = code.display, code.version, sub.tensors, op.outputs
        self.histogram[name] += 1
        self.versions.setdefault(name, set()).add(version)
        out_type = _type_name(tensors[outs[0]]) if outs and 0 <= outs[0] < len(tensors) else "NONE"
        family = _FAMILY.get(out_type, out_type.lower())
        self.family[family] += 1
        if sub.index == 0:
            self.op_list.append({"index": op.index, "op": name, "version": version, "custom": code.is_custom,
                                 "dtype": family,
                                 "weight_bytes": sum(len(constant[i]) for i in op.inputs if i in constant)})
        if family == "float32" and name not in ("DEQUANTIZE", "QUANTIZE"):
            self.float_ops.append({"subgraph": sub.index, "index": op.index, "op": name,
                                   "output": tensors[outs[0]].name})


def _io(sub: SubgraphView) -> dict[str, list]:
    io: dict[str, list] = {"inputs": [], "outputs": []}
    for key, indices in (("inputs", sub.inputs), ("outputs", sub.outputs)):
        for i in indices:
            t = sub.tensors[i]
            q = _quantization(t)
            io[key].append({"name": t.name, "dtype": _type_name(t).lower(), "shape": list(t.shape),
                            "scale": q["scale"] if q else 0.0, "zero_point": q["zero_point"] if q else 0})
    return io


def _analyze(view: ModelView, path: str | None) -> dict[str, Any]:
    view.first_subgraph()
    weights, ops = _Weights(), _Ops()
    for sub in view.subgraphs:
        constant: dict[int, memoryview] = {}
        for t in sub.tensors:
            data = view.buffer_bytes(t.buffer)
            if data is not None and len(data):
                constant[t.index] = data
                weights.add(t, data)
        for op in sub.operators:
            ops.add(view, sub, op, constant)
    return _report(view, path, weights, ops, _io(view.subgraphs[0]))


def _report(view: ModelView, path: str | None, weights: _Weights, ops: _Ops, io: dict[str, list]) -> dict[str, Any]:
    n_ops = sum(ops.histogram.values())
    all_weight = sum(weights.bytes.values())
    custom_ops = sorted(c.display for c in view.op_codes if c.is_custom)
    entries = read_metadata_entries(view)
    return {
        "schema": INSPECT_SCHEMA,
        "path": path,
        "size_bytes": len(view.data),
        "schema_version": view.version,
        "subgraphs": len(view.subgraphs),
        "inputs": io["inputs"],
        "outputs": io["outputs"],
        "ops": {"count": n_ops, "histogram": dict(sorted(ops.histogram.items(), key=lambda kv: (-kv[1], kv[0])))},
        "op_versions": {name: sorted(v) for name, v in sorted(ops.versions.items())},
        "op_dtype_share": {k: round(v / n_ops, 4) for k, v in sorted(ops.family.items())} if n_ops else {},
        "weight_bytes": dict(sorted(weights.bytes.items())),
        "weight_share": {k: round(v / all_weight, 4) for k, v in sorted(weights.bytes.items())} if all_weight else {},
        "float_ops": ops.float_ops if weights.quantized else [],
        "quantization": {"quantized": weights.quantized, "per_channel": weights.granularity["per_channel"],
                         "per_tensor": weights.granularity["per_tensor"]},
        "sparsity": {"zero_fraction": round(weights.zeros / weights.total, 4) if weights.total else 0.0,
                     "weights_counted": weights.total, "sparse_format_tensors": weights.sparse_tensors,
                     "tensors": sorted(weights.tensors, key=lambda w: -w["bytes"])[:20]},
        "custom_ops": [n for n in custom_ops if not n.startswith("Flex")],
        "flex_ops": [n for n in custom_ops if n.startswith("Flex")],
        "metadata": {"entries": sorted(entries), "edgekit": read_edgekit_metadata(view),
                     "tflite": standard_summary(view),
                     "min_runtime_version": entries.get("min_runtime_version", b"").rstrip(b"\0").decode("ascii", "replace") or None},
        "op_list": ops.op_list,
    }


def standard_summary(view: ModelView) -> dict[str, Any] | None:
    """What the standard TFLite Metadata says (MediaPipe's, Android Studio's, TF Support's reading): per input
    its content and normalisation, per output its content and associated files with their line counts."""
    from edgekit.runtime.metadata import read_tflite_metadata, standard_tensors
    from edgekit.runtime.tflite_metadata import associated_files

    meta, warnings = read_tflite_metadata(view)
    if meta is None:
        return {"error": warnings[0]} if warnings else None
    inputs, outputs = standard_tensors(meta, "input"), standard_tensors(meta, "output")
    names = {f.get("name") for t in outputs for f in t.get("associated_files") or []}
    files = associated_files(view.data, {n for n in names if n})

    def tensor(t: dict[str, Any]) -> dict[str, Any]:
        props = dict((t.get("content") or {}).get("content_properties") or {})
        out: dict[str, Any] = {"name": t.get("name"), "content": props.pop("$type", None), **props}
        for unit in t.get("process_units") or []:
            options = dict(unit.get("options") or {})
            if options.pop("$type", None) == "NormalizationOptions":
                out["normalization"] = options
        if t.get("associated_files"):
            out["files"] = [{"name": f.get("name"), "type": f.get("type"),
                             "lines": len(files[f["name"]].splitlines()) if f.get("name") in files else None}
                            for f in t["associated_files"]]
        return out

    return {"name": meta.get("name"), "version": meta.get("version"), "author": meta.get("author"),
            "license": meta.get("license"), "min_parser_version": meta.get("min_parser_version"),
            "inputs": [tensor(t) for t in inputs], "outputs": [tensor(t) for t in outputs]}


def gpu_compatibility(model: bytes | ModelView, report: dict[str, Any], path: str | None) -> dict[str, Any]:
    """Ops the GPU delegate would leave on the CPU (TFLite's gpu_compatibility.cc rules plus the
    delegate's own checks, ported in runtime/gpu_compat/), the share of ops and weight bytes it takes, and
    the open input dimension that causes some of them, when one does (runtime/open_dims.py).
    The analyzer in the pip wheels reports every model as compatible, so it is not used."""
    from edgekit.runtime.gpu_compat import check_model, summary
    from edgekit.runtime.open_dims import open_dimension

    results = check_model(model)
    weights = {o["index"]: o["weight_bytes"] for o in report["op_list"]}
    s = summary(results, weights)
    with corrupt_as_format_error(path or "model"):
        cause = open_dimension(model, s["fallback_ops"]) if s["fallback_ops"] else None
    return {"checked": True, "rules": "TFLite gpu_compatibility.cc + GPU delegate checks (runtime/gpu_compat/)",
            **s, **({"open_dimension": cause} if cause is not None else {})}


def fallback_line(said: str, gpu: dict[str, Any]) -> str:
    """`said` ("4 op(s) fall back to the CPU") with the ops named and, where an open dimension causes them
    (`gpu["open_dimension"]`), why and what removes them."""
    cause = gpu.get("open_dimension")
    if cause and cause["all"]:
        return f"{said}: {cause['cause']}"
    names = ", ".join(dict.fromkeys(o["op"] for o in gpu["fallback_ops"]))
    return f"{said}: {names}" + (f"; of those, {cause['cause']}" if cause else "")


def target_verdict(report: dict[str, Any], target: str) -> dict[str, Any]:
    """What the report means for one accelerator (`target`, the names `convert` takes): a line each on the ops
    it would leave on the CPU and why (an open dimension, runtime/open_dims.py), and on the file's delegate
    hints where they would not try it."""
    from edgekit.runtime.delegates import NNAPI_DEPRECATED

    notes: list[str] = []
    gpu = report.get("gpu") or {}
    if target in ("gpu", "nnapi") and gpu.get("checked"):
        fallback = gpu["fallback_ops"]
        total = report["ops"]["count"]
        notes.append(fallback_line(f"{len(fallback)} of {total} op(s) fall back to the CPU", gpu) if fallback
                     else f"the GPU delegate takes all {total} op(s)")
    if target == "nnapi":
        notes.append(NNAPI_DEPRECATED)
    if target == "npu":
        notes.append("edgekit has no op rules for vendor NPU delegates: bench the model on the device to see what "
                     "its delegate takes")
    hints = [d.get("accelerator") for d in ((report["metadata"].get("edgekit") or {}).get("delegates") or [])]
    if hints and target != "cpu" and target not in hints:
        notes.append(f"the file's delegate hints ({' -> '.join(map(str, hints))}) do not name {target}: convert "
                     f"with `target={target}` to record it")
    return {"name": target, "notes": notes}


def inspect_file(path: str | os.PathLike[str], *, gpu: bool = True) -> dict[str, Any]:
    path = Path(path)
    return analyze(read_model_file(path), path=str(path), gpu=gpu)
