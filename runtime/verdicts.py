"""What the preflight and the child-process probe (runtime/probe.py) found about a model's bytes, kept by
sha256 so a file is checked once per runtime: `~/.cache/edgekit/probes/` (or $EDGEKIT_CACHE_DIR, or
$XDG_CACHE_HOME/edgekit). Files edgekit convert wrote are recorded as good when written. A verdict is only
advice about the same bytes on the same runtime and edgekit: any of the three changed, and the file is
checked again. A file's bytes are hashed on every load (about 1 ms a MB): its path, inode or times say
nothing about its bytes (a write through mmap keeps them). EDGEKIT_CACHE_DIR=off keeps nothing (every
load probes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from edgekit._version import __version__

log = logging.getLogger("edgekit.runtime")

CACHE_ENV = "EDGEKIT_CACHE_DIR"
_MAX_VERDICT_BYTES = 64 * 1024


def cache_dir() -> Path | None:
    """Where verdicts are kept, or None when caching is off."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit is not None:
        return None if explicit.strip().lower() in ("", "off", "0", "none") else Path(explicit) / "probes"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgekit" / "probes"


def digest(content: bytes) -> str:
    """The bytes' sha256: what a verdict is about (computed once per load and passed along)."""
    return hashlib.sha256(content).hexdigest()


def key(content: bytes, runtime: str, *, sha256: str | None = None) -> str:
    """The name a verdict is kept under: the bytes' sha256 (`sha256` when the caller has it already), the
    runtime (backend and version) and edgekit's version, whose preflight rules decide what reaches the probe."""
    salt = hashlib.sha256(f"{runtime}|{__version__}".encode()).hexdigest()[:16]
    return f"{sha256 or digest(content)}-{salt}"


def recall(name: str) -> dict[str, Any] | None:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        with open(folder / f"{name}.json", "rb") as fh:
            verdict = json.loads(fh.read(_MAX_VERDICT_BYTES))
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, dict) and isinstance(verdict.get("ok"), bool) else None


def remember(name: str, verdict: dict[str, Any]) -> None:
    """Keep a verdict; a cache that cannot be written costs a probe next time, nothing else."""
    from edgekit.files import atomic_write_text

    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / f"{name}.json", json.dumps(verdict), force=True)
    except Exception as exc:  # an unwritable cache is not the user's problem  # noqa: BLE001
        log.debug("probe verdict not kept in %s: %s", folder, exc)
