"""Read a Keras model's config before Keras does, and refuse what would run code.

A `.keras` file is a zip holding `config.json`; a legacy `.h5` holds the same JSON in its `model_config`
attribute. Keras' own `safe_mode` has been bypassed several times (CVE-2025-1550, CVE-2025-8747,
CVE-2025-9905), so edgekit checks the config itself, without importing Keras: Lambda layers (marshalled
Python bytecode) are always refused, and any object whose module lies outside Keras is refused unless the
user passes `--trust-model`. Modules that reach the operating system are refused even then. edgekit never
calls `enable_unsafe_deserialization`.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgekit.errors import ModelFormatError, UnsafeModelError
from edgekit.runtime.entry_check import json_depth

MAX_MEMBERS = 10_000
MAX_CONFIG_BYTES = 64 * 1024**2
MAX_TOTAL_BYTES = 16 * 1024**3
MAX_RATIO = 200  # uncompressed / compressed, per member: more is a zip bomb
MAX_CONFIG_DEPTH = 256  # nesting of a Keras config (a deep real one: ~30)
KERAS_MODULES = ("keras", "tf_keras", "tensorflow.keras")
NEVER = ("builtins", "os", "posix", "nt", "subprocess", "sys", "importlib", "shutil", "pickle", "marshal",
         "runpy", "code", "codeop", "pty", "socket", "ctypes", "__builtin__", "__main__", "webbrowser")


def _objects(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every serialised object (a dict with a class_name) in a Keras config, with where it sits."""
    if isinstance(node, dict):
        if "class_name" in node:
            yield path, node
        for key, value in node.items():
            yield from _objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _objects(value, f"{path}[{i}]")


def _is_keras(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in KERAS_MODULES)


def _resolves_to(obj: dict[str, Any]) -> set[str]:
    """The class names Keras may resolve this object to: it looks up `module + "." + class_name` in its API
    ("keras" + "layers.Lambda" is keras.layers.Lambda) and `registered_name` in its registry ("pkg>Name"),
    so the last component of each counts."""
    names = set()
    for key in ("class_name", "registered_name"):
        value = obj.get(key)
        if isinstance(value, str):
            names.add(value.split(">")[-1].split(".")[-1].strip())
    return names


def check_config(config: Any, where: str, *, trust: bool = False) -> None:
    """Raise UnsafeModelError for Lambda layers and foreign modules in a Keras config."""
    if json_depth(config, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        raise ModelFormatError(f"{where}: the model config is nested deeper than {MAX_CONFIG_DEPTH} levels")
    lambdas, foreign = [], []
    for at, obj in _objects(config):
        name = (obj.get("config") or {}).get("name") if isinstance(obj.get("config"), dict) else None
        if "Lambda" in _resolves_to(obj):
            lambdas.append(str(name or at))
        module = obj.get("module")
        if isinstance(module, str) and module and not _is_keras(module):
            root = module.split(".")[0]
            if root in NEVER or not trust:
                foreign.append(f"{module}.{obj.get('class_name')}")
        for key in ("config", "registered_name"):  # functions are serialised as {"class_name": "function"}
            value = obj.get(key)
            if obj.get("class_name") == "function" and isinstance(value, str) and value.split(".")[0] in NEVER:
                foreign.append(value)
    if lambdas:
        raise UnsafeModelError(
            f"{where}: the model contains Lambda layer(s) {', '.join(lambdas[:5])} with Python code; edgekit does "
            "not run code from model files (re-save it without Lambda layers)"
        )
    if foreign:
        hint = "" if any(f.split(".")[0] in NEVER for f in foreign) else "; set `trust_model` if you wrote it"
        raise UnsafeModelError(
            f"{where}: the model config names objects outside Keras ({', '.join(sorted(set(foreign))[:5])}){hint}"
        )


def read_archive_config(path: Path) -> dict[str, Any]:
    """config.json of a .keras zip, with caps on member count, sizes and compression ratios."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
            if len(members) > MAX_MEMBERS:
                raise UnsafeModelError(f"{path}: the archive holds {len(members)} files, over the cap of {MAX_MEMBERS:,}; refusing")
            if sum(m.file_size for m in members) > MAX_TOTAL_BYTES:
                raise UnsafeModelError(f"{path}: the archive unpacks to more than {MAX_TOTAL_BYTES >> 30} GiB; refusing")
            for m in members:
                if m.compress_size and m.file_size / m.compress_size > MAX_RATIO and m.file_size > 1 << 20:
                    raise UnsafeModelError(f"{path}: {m.filename} is compressed {m.file_size // m.compress_size}:1, "
                                           f"over the cap of {MAX_RATIO}:1, a zip bomb; refusing")
            names = [m.filename for m in members]
            twice = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) != len(names) else []
            if twice:
                raise UnsafeModelError(f"{path}: the archive holds {twice[0]} more than once (edgekit would check "
                                       "one copy and Keras load another); refusing")
            info = next((m for m in members if m.filename == "config.json"), None)
            if info is None:
                raise ModelFormatError(f"{path}: a zip file, but not a Keras .keras archive (no config.json)")
            if info.file_size > MAX_CONFIG_BYTES:
                raise UnsafeModelError(f"{path}: config.json is {info.file_size} bytes, over the cap of "
                                     f"{MAX_CONFIG_BYTES >> 20} MiB; refusing")
            raw = zf.read(info)
            weight_bytes = sum(m.file_size for m in members if m.filename.endswith(".h5"))
    except zipfile.BadZipFile as exc:
        raise ModelFormatError(f"{path}: not a readable .keras archive ({exc})") from None
    except (OSError, EOFError, ValueError, NotImplementedError) as exc:  # truncated or odd members
        raise ModelFormatError(f"{path}: not a readable .keras archive ({type(exc).__name__}: {exc})") from None
    try:
        config = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ModelFormatError(f"{path}: config.json is nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError):
        raise ModelFormatError(f"{path}: config.json in the archive is not valid JSON") from None
    if json_depth(config, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:  # before anything walks it recursively
        raise ModelFormatError(f"{path}: config.json is nested deeper than {MAX_CONFIG_DEPTH} levels")
    check_declared_size(config, weight_bytes, str(path))
    return config


# parameters a layer will allocate, from its config and the input shape Keras stored in build_config
def _kernel_params(cls: str, cfg: dict[str, Any], last: int) -> int:
    def size(v: Any) -> int:
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0

    if cls == "Dense":
        return last * size(cfg.get("units"))
    if cls == "Embedding":
        return size(cfg.get("input_dim")) * size(cfg.get("output_dim"))
    if cls in ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
               "DepthwiseConv2D", "SeparableConv2D"):
        kernel = cfg.get("kernel_size")
        window = 1
        for k in (kernel if isinstance(kernel, (list, tuple)) else [kernel]):
            window *= size(k)
        if cls == "DepthwiseConv2D":
            return window * last * size(cfg.get("depth_multiplier", 1))
        if cls == "SeparableConv2D":
            return window * last * size(cfg.get("depth_multiplier", 1)) + last * size(cfg.get("filters"))
        return window * last * size(cfg.get("filters")) // max(1, size(cfg.get("groups", 1)) or 1)
    return 0


def check_declared_size(config: Any, weight_bytes: int, where: str) -> None:
    """A config that declares far more weights than the archive stores is malformed, and building it
    would make Keras allocate them all (a Dense of 10^9 units asks for gigabytes before any weight is
    read): refuse it before Keras runs."""
    declared = 0
    for _, obj in _objects(config):
        cfg = obj.get("config")
        build = obj.get("build_config")
        if not isinstance(cfg, dict) or not isinstance(build, dict):
            continue
        shape = build.get("input_shape")
        last = shape[-1] if isinstance(shape, list) and shape and isinstance(shape[-1], int) else 0
        declared += _kernel_params(str(obj.get("class_name")), cfg, last)
    if declared * 4 > 8 * weight_bytes + (64 << 20):
        raise ModelFormatError(
            f"{where}: the config declares about {declared:,} weights but the archive holds {weight_bytes:,} bytes "
            "of them; the file is damaged or crafted"
        )


def read_h5_config(path: Path) -> Any:
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            raw = fh.attrs.get("model_config")
    except OSError as exc:
        raise ModelFormatError(f"{path}: not a readable HDF5 file ({str(exc).splitlines()[0]})") from None
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except RecursionError:
        raise ModelFormatError(f"{path}: the model config is nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        raise ModelFormatError(f"{path}: the model config in the .h5 file is not valid JSON") from None


def check_model_file(path: Path, fmt: str, *, trust: bool = False) -> None:
    """Refuse unsafe .keras / .h5 models before any loader sees them."""
    if fmt == "keras":
        check_config(read_archive_config(path), str(path), trust=trust)
    elif fmt == "h5":
        config = read_h5_config(path)
        if config is not None:
            check_config(config, str(path), trust=trust)
