"""What is inside a .tflite: I/O, ops and their versions, dtypes of ops and weights, quantization
granularity, sparsity, custom and flex ops, metadata, and GPU delegate compatibility (from TFLite's
own analyzer). Pure Python over the flatbuffer schema that LiteRT ships; no TensorFlow."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import ModelFormatError, one_line
from edgekit.runtime.metadata import check_identifier
from edgekit.runtime.schema import enum_names, schema_module

INSPECT_SCHEMA = "edgekit.inspect/1"
MAX_MODEL_BYTES = 4 * 1024**3
_NUMPY = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64, "INT8": np.int8, "UINT8": np.uint8,
    "INT16": np.int16, "UINT16": np.uint16, "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64,
    "UINT64": np.uint64, "BOOL": np.bool_,
}
_FAMILY = {"INT8": "int8", "UINT8": "int8", "INT4": "int4", "INT16": "int16", "FLOAT16": "float16",
           "BFLOAT16": "float16", "FLOAT32": "float32"}


def _op_name(code, builtin_names: dict[int, str]) -> tuple[str, bool]:
    """(name, is_custom) of an OperatorCode: the builtin code is the larger of its two fields."""
    builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
    name = builtin_names.get(builtin, f"BUILTIN_{builtin}")
    if name == "CUSTOM":
        custom = code.CustomCode()
        return (custom.decode("utf-8", "replace") if custom else "CUSTOM"), True
    return name, False


def operators(buf: bytes, subgraph: int = 0) -> tuple[Any, Any, list[tuple[int, str, Any]]]:
    """(model, subgraph, [(index, op name, op)]) of one subgraph: the walk that the readers of op graphs
    (runtime.sparsity, the converters' autopilot) share."""
    schema = schema_module()
    model = schema.Model.GetRootAs(buf, 0)
    names = enum_names(schema.BuiltinOperator)
    sub = model.Subgraphs(subgraph)
    ops = []
    for o in range(sub.OperatorsLength()):
        op = sub.Operators(o)
        ops.append((o, _op_name(model.OperatorCodes(op.OpcodeIndex()), names)[0], op))
    return model, sub, ops


def _buffer_bytes(model, buf: bytes, index: int) -> memoryview | None:
    if index <= 0 or index >= model.BuffersLength():
        return None
    b = model.Buffers(index)
    if b.DataLength():
        arr = b.DataAsNumpy()
        return memoryview(arr.tobytes()) if not isinstance(arr, int) else None
    offset, size = b.Offset(), b.Size()
    if offset > 1 and size:
        if offset + size > len(buf):
            raise ModelFormatError(f"buffer {index} points past the end of the file")
        return memoryview(buf)[offset : offset + size]
    return None


def _quantization(tensor) -> dict[str, Any] | None:
    q = tensor.Quantization()
    if q is None or q.ScaleLength() == 0:
        return None
    scales = q.ScaleAsNumpy()
    zps = q.ZeroPointAsNumpy() if q.ZeroPointLength() else np.zeros(1, np.int64)
    return {"scales": len(scales), "per_channel": len(scales) > 1, "axis": q.QuantizedDimension(),
            "scale": float(scales[0]), "zero_point": int(zps[0]), "zero_points": zps}


def analyze(buf: bytes, *, path: str | None = None, gpu: bool = True) -> dict[str, Any]:
    """The full inspection report (JSON-serialisable), schema edgekit.inspect/1."""
    check_identifier(buf, path or "model")
    try:
        report = _analyze(buf, path)
    except ModelFormatError:
        raise
    except Exception as exc:  # the generated accessors raise anything on corrupt input
        raise ModelFormatError(f"{path or 'model'}: flatbuffer is corrupt ({type(exc).__name__}: {one_line(exc)})") from None
    if gpu:
        report["gpu"] = gpu_compatibility(buf, report, path)
    return report


def _analyze(buf: bytes, path: str | None) -> dict[str, Any]:
    from edgekit.runtime.metadata import read_edgekit_metadata, read_metadata_entries

    schema = schema_module()
    model = schema.Model.GetRootAs(buf, 0)
    builtin_names = enum_names(schema.BuiltinOperator)
    type_names = enum_names(schema.TensorType)
    codes = [_op_name(model.OperatorCodes(i), builtin_names) + (model.OperatorCodes(i).Version(),)
             for i in range(model.OperatorCodesLength())]
    if model.SubgraphsLength() < 1:
        raise ModelFormatError(f"{path or 'model'}: has no subgraph")

    histogram: Counter[str] = Counter()
    versions: dict[str, set[int]] = {}
    op_family: Counter[str] = Counter()
    float_ops: list[dict[str, Any]] = []
    weight_bytes: Counter[str] = Counter()
    granularity: Counter[str] = Counter()
    zeros = total = 0
    sparse_tensors = 0
    weights: list[dict[str, Any]] = []
    quantized_model = False
    io: dict[str, list] = {"inputs": [], "outputs": []}
    op_list: list[dict[str, Any]] = []

    for s in range(model.SubgraphsLength()):
        sub = model.Subgraphs(s)
        tensors = [sub.Tensors(t) for t in range(sub.TensorsLength())]
        tensor_type = [type_names.get(t.Type(), str(t.Type())) for t in tensors]
        constant: dict[int, memoryview] = {}
        for t_index, t in enumerate(tensors):
            data = _buffer_bytes(model, buf, t.Buffer())
            if data is None or not len(data):
                continue
            constant[t_index] = data
            dtype_name = tensor_type[t_index]
            weight_bytes[_FAMILY.get(dtype_name, dtype_name.lower())] += len(data)
            q = _quantization(t)
            if q is not None and dtype_name in ("INT8", "UINT8", "INT16", "INT4"):
                quantized_model = True
                granularity["per_channel" if q["per_channel"] else "per_tensor"] += 1
            if t.Sparsity() is not None:
                sparse_tensors += 1
            np_type = _NUMPY.get(dtype_name)
            is_kernel = t.ShapeLength() >= 2  # sparsity is about kernels, not biases or shapes
            if np_type is not None and is_kernel and len(data) % np.dtype(np_type).itemsize == 0:
                values = np.frombuffer(data, np_type)
                zero = 0
                if q is not None and np.issubdtype(np_type, np.integer):
                    zp = q["zero_points"]
                    zero = int(zp[0]) if len(np.unique(zp)) == 1 else None
                if zero is not None:
                    nz = int(np.count_nonzero(values == zero))
                    zeros += nz
                    total += values.size
                    weights.append({"tensor": (t.Name() or b"").decode("utf-8", "replace"), "dtype": dtype_name,
                                    "bytes": len(data), "sparsity": round(nz / values.size, 4)})
        if s == 0:
            for key, count, get in (("inputs", sub.InputsLength(), sub.Inputs),
                                    ("outputs", sub.OutputsLength(), sub.Outputs)):
                for i in range(count):
                    t = tensors[get(i)]
                    q = _quantization(t)
                    io[key].append({
                        "name": (t.Name() or b"").decode("utf-8", "replace"),
                        "dtype": tensor_type[get(i)].lower(),
                        "shape": t.ShapeAsNumpy().tolist() if t.ShapeLength() else [],
                        "scale": q["scale"] if q else 0.0,
                        "zero_point": q["zero_point"] if q else 0,
                    })
        for o in range(sub.OperatorsLength()):
            op = sub.Operators(o)
            name, custom, version = codes[op.OpcodeIndex()]
            histogram[name] += 1
            versions.setdefault(name, set()).add(version)
            outs = [op.Outputs(i) for i in range(op.OutputsLength())]
            ins = [op.Inputs(i) for i in range(op.InputsLength())]
            out_type = tensor_type[outs[0]] if outs and 0 <= outs[0] < len(tensors) else "NONE"
            family = _FAMILY.get(out_type, out_type.lower())
            op_family[family] += 1
            if s == 0:
                op_list.append({"index": o, "op": name, "version": version, "custom": custom, "dtype": family,
                                "weight_bytes": sum(len(constant[i]) for i in ins if i in constant)})
            if family == "float32" and name not in ("DEQUANTIZE", "QUANTIZE"):
                float_ops.append({"subgraph": s, "index": o, "op": name,
                                  "output": (tensors[outs[0]].Name() or b"").decode("utf-8", "replace")})

    n_ops = sum(histogram.values())
    all_weight = sum(weight_bytes.values())
    custom_ops = sorted(n for n, c, _ in codes if c)
    entries = read_metadata_entries(buf)
    edgekit = read_edgekit_metadata(buf)
    return {
        "schema": INSPECT_SCHEMA,
        "path": path,
        "size_bytes": len(buf),
        "schema_version": model.Version(),
        "subgraphs": model.SubgraphsLength(),
        "inputs": io["inputs"],
        "outputs": io["outputs"],
        "ops": {"count": n_ops, "histogram": dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))},
        "op_versions": {name: sorted(v) for name, v in sorted(versions.items())},
        "op_dtype_share": {k: round(v / n_ops, 4) for k, v in sorted(op_family.items())} if n_ops else {},
        "weight_bytes": dict(sorted(weight_bytes.items())),
        "weight_share": {k: round(v / all_weight, 4) for k, v in sorted(weight_bytes.items())} if all_weight else {},
        "float_ops": float_ops if quantized_model else [],
        "quantization": {"quantized": quantized_model, "per_channel": granularity["per_channel"],
                         "per_tensor": granularity["per_tensor"]},
        "sparsity": {"zero_fraction": round(zeros / total, 4) if total else 0.0, "weights_counted": total,
                     "sparse_format_tensors": sparse_tensors,
                     "tensors": sorted(weights, key=lambda w: -w["bytes"])[:20]},
        "custom_ops": [n for n in custom_ops if not n.startswith("Flex")],
        "flex_ops": [n for n in custom_ops if n.startswith("Flex")],
        "metadata": {"entries": sorted(entries), "edgekit": edgekit,
                     "min_runtime_version": entries.get("min_runtime_version", b"").rstrip(b"\0").decode("ascii", "replace") or None},
        "op_list": op_list,
    }


def gpu_compatibility(buf: bytes, report: dict[str, Any], path: str | None) -> dict[str, Any]:
    """Ops the GPU delegate would leave on the CPU (TFLite's gpu_compatibility.cc rules plus the
    delegate's own checks, ported in gpu_compat.py), and the share of ops and weight bytes it takes.
    The analyzer in the pip wheels reports every model as compatible, so it is not used."""
    from edgekit.runtime.gpu_compat import check_model, summary

    results = check_model(buf)
    weights = {o["index"]: o["weight_bytes"] for o in report["op_list"]}
    s = summary(results, weights)
    return {"checked": True, "rules": "TFLite gpu_compatibility.cc + GPU delegate checks (runtime/gpu_compat.py)",
            **s}


def inspect_file(path: str | Path, *, gpu: bool = True) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ModelFormatError(f"{path}: is a folder, not a .tflite file")
    try:
        size = path.stat().st_size
        if size > MAX_MODEL_BYTES:
            raise ModelFormatError(f"{path}: {size} bytes is larger than any TFLite flatbuffer can be")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: no such file") from None
    except OSError as exc:
        raise ModelFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return analyze(data, path=str(path), gpu=gpu)
