"""What machine a benchmark ran on: identity (host, CPU, OS, Python) and the state that spoils latency
figures (CPU governor, temperature, throttling), read from /proc and /sys without extra packages. Every
field is None where this machine does not expose it."""

from __future__ import annotations

import glob
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

_THROTTLE_COUNTS = "/sys/devices/system/cpu/cpu*/thermal_throttle/*_throttle_count"  # x86 (Intel)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return None


def cpu_model() -> str | None:
    """The CPU's name: x86 'model name', ARM 'Model' (Raspberry Pi) or the device tree's model."""
    text = _read("/proc/cpuinfo") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "model", "hardware", "cpu model", "processor"):
        if key in fields and not fields[key].isdigit():
            return fields[key]
    tree = _read("/proc/device-tree/model")
    return tree.rstrip("\x00") if tree else platform.processor() or None


def os_name() -> str:
    release = _read("/etc/os-release") or ""
    for line in release.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return f"{platform.system()} {platform.release()}"


def identity() -> dict[str, Any]:
    """Who ran it: constant for the machine."""
    return {
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "os": os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def temperature_c() -> float | None:
    """The hottest thermal zone, in °C."""
    temps = []
    for zone in glob.glob("/sys/class/thermal/thermal_zone*/temp"):
        value = _read(zone)
        if value and value.lstrip("-").isdigit():
            temps.append(int(value) / 1000.0)
    return max(temps) if temps else None


def _pi_throttled() -> int | None:
    """The Raspberry Pi firmware's throttle bits (`vcgencmd get_throttled`), None elsewhere."""
    if shutil.which("vcgencmd") is None:
        return None
    try:
        out = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=5).stdout
        return int(out.strip().split("=", 1)[1], 16)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _throttle_count() -> int | None:
    counts = [int(v) for v in (_read(p) for p in glob.glob(_THROTTLE_COUNTS)) if v and v.isdigit()]
    return sum(counts) if counts else None


def state() -> dict[str, Any]:
    """What may change during a run: read before and after it, then `during(before, after)`."""
    return {
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "temperature_c": temperature_c(),
        "pi_throttled": _pi_throttled(),
        "throttle_count": _throttle_count(),
    }


def during(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The device object of a result: whether throttling was seen between two `state()` readings.
    `throttled` is None when this machine has no way to tell (no firmware flags, no throttle counters)."""
    throttled = None
    if after["pi_throttled"] is not None:
        # bit 2: throttled now, bit 1: frequency capped now; the sticky bits (16+) say "since boot"
        now = bool(after["pi_throttled"] & 0b110) or bool((before["pi_throttled"] or 0) & 0b110)
        throttled = now
    if after["throttle_count"] is not None and before["throttle_count"] is not None:
        throttled = bool(throttled) or after["throttle_count"] > before["throttle_count"]
    temps = [t for t in (before["temperature_c"], after["temperature_c"]) if t is not None]
    return {
        **identity(),
        "governor": after["governor"],
        "temperature_c": round(max(temps), 1) if temps else None,
        "throttled": throttled,
    }
