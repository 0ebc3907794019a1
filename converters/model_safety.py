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
from pathlib import Path
from typing import Any, Iterator

from edgekit.errors import ModelFormatError, UnsafeModelError

MAX_MEMBERS = 10_000
MAX_CONFIG_BYTES = 64 * 1024**2
MAX_TOTAL_BYTES = 16 * 1024**3
MAX_RATIO = 200  # uncompressed / compressed, per member: more is a zip bomb
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


def check_config(config: Any, where: str, *, trust: bool = False) -> None:
    """Raise UnsafeModelError for Lambda layers and foreign modules in a Keras config."""
    lambdas, foreign = [], []
    for at, obj in _objects(config):
        name = (obj.get("config") or {}).get("name") if isinstance(obj.get("config"), dict) else None
        if obj.get("class_name") == "Lambda":
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
        hint = "" if any(f.split(".")[0] in NEVER for f in foreign) else "; pass --trust-model if you wrote it"
        raise UnsafeModelError(
            f"{where}: the model config names objects outside Keras ({', '.join(sorted(set(foreign))[:5])}){hint}"
        )


def read_archive_config(path: Path) -> dict[str, Any]:
    """config.json of a .keras zip, with caps on member count, sizes and compression ratios."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
            if len(members) > MAX_MEMBERS:
                raise UnsafeModelError(f"{path}: the archive holds {len(members)} files; refusing")
            if sum(m.file_size for m in members) > MAX_TOTAL_BYTES:
                raise UnsafeModelError(f"{path}: the archive unpacks to more than {MAX_TOTAL_BYTES >> 30} GiB; refusing")
            for m in members:
                if m.compress_size and m.file_size / m.compress_size > MAX_RATIO and m.file_size > 1 << 20:
                    raise UnsafeModelError(f"{path}: {m.filename} is compressed {m.file_size // m.compress_size}:1, "
                                           "a zip bomb; refusing")
            info = next((m for m in members if m.filename == "config.json"), None)
            if info is None:
                raise ModelFormatError(f"{path}: a zip file, but not a Keras .keras archive (no config.json)")
            if info.file_size > MAX_CONFIG_BYTES:
                raise UnsafeModelError(f"{path}: config.json is {info.file_size} bytes; refusing")
            raw = zf.read(info)
    except zipfile.BadZipFile as exc:
        raise ModelFormatError(f"{path}: not a readable .keras archive ({exc})") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ModelFormatError(f"{path}: config.json in the archive is not valid JSON") from None


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
