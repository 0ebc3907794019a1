"""`edgekit doctor`: what this machine can run, and the known-bad combinations with their fixes.
Reads package versions from their metadata: importing TensorFlow is not needed to report it."""

from __future__ import annotations

import glob
import importlib.metadata as md
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from edgekit.runtime.backend import install_advice
from edgekit.runtime.delegates import DELEGATE_LIBRARIES, ENV_LIBRARY, find_library, try_load

DOCTOR_SCHEMA = "edgekit.doctor/1"
PACKAGES = ("numpy", "ai-edge-litert", "tflite-runtime", "tensorflow", "tf-keras", "keras",
            "tensorflow-model-optimization", "opencv-python", "opencv-python-headless", "picamera2")



def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _major(version: str | None) -> int | None:
    try:
        return int(version.split(".")[0]) if version else None
    except ValueError:
        return None


def gpus() -> list[str]:
    """Accelerators visible to the OS (without importing TensorFlow)."""
    found = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            found += [line.strip() for line in out.splitlines() if line.startswith("GPU")]
        except (OSError, subprocess.SubprocessError):
            pass
    found += sorted(glob.glob("/dev/dri/renderD*")) + sorted(glob.glob("/dev/mali*")) + sorted(glob.glob("/dev/apex_*"))
    return found


def delegates() -> list[dict[str, Any]]:
    """Each known delegate library: whether LiteRT can load it here. Only libraries the loader can
    find are loaded (loading runs their native initialisers)."""
    extra = [p for p in os.environ.get("EDGEKIT_DELEGATES", "").split(os.pathsep) if p]
    candidates = [(kind, os.environ[var]) for kind, var in ENV_LIBRARY.items() if os.environ.get(var)]
    candidates += [(kind, lib) for kind, libs in DELEGATE_LIBRARIES.items() for lib in libs]
    candidates += [("custom", lib) for lib in extra]
    try:
        from ai_edge_litert.interpreter import load_delegate
    except ImportError:
        return [{"kind": k, "library": lib, "loadable": False, "reason": "ai-edge-litert not installed"}
                for k, lib in candidates]
    results = []
    for kind, lib in candidates:
        where = find_library(lib)
        if where is None:
            results.append({"kind": kind, "library": lib, "loadable": False, "reason": "not found"})
            continue
        delegate, reason = try_load(load_delegate, where)
        results.append({"kind": kind, "library": where, "loadable": delegate is not None, "reason": reason})
    return results


def problems(versions: dict[str, str | None], machine: str) -> list[dict[str, str]]:
    """Known-bad combinations found here, each with its fix."""
    found = []
    numpy_major = _major(versions.get("numpy"))
    tflite_rt = versions.get("tflite-runtime")
    if tflite_rt and numpy_major and numpy_major >= 2 and tflite_rt.startswith("2.") and int(tflite_rt.split(".")[1]) <= 14:
        found.append({"problem": f"tflite-runtime {tflite_rt} was built for numpy 1 and crashes with numpy {versions['numpy']}",
                      "fix": "pip uninstall tflite-runtime && pip install ai-edge-litert (or pin numpy<2)"})
    if versions.get("tensorflow-model-optimization") and _major(versions.get("keras")) == 3 and not versions.get("tf-keras"):
        found.append({"problem": "tensorflow-model-optimization needs Keras 2 (tf_keras); only Keras 3 is installed",
                      "fix": "pip install tf-keras (edgekit bridges Keras 3 models to it)"})
    if not any(versions.get(p) for p in ("ai-edge-litert", "tflite-runtime", "tensorflow")):
        on_arm32 = f" (LiteRT has no wheels for 32-bit ARM, {machine})" if machine in ("armv7l", "armv6l", "armhf") else ""
        found.append({"problem": f"no TFLite interpreter is installed{on_arm32}", "fix": install_advice(machine)})
    if versions.get("opencv-python") and versions.get("opencv-python-headless"):
        found.append({"problem": "opencv-python and opencv-python-headless are both installed; they overwrite each other",
                      "fix": "keep one: pip uninstall opencv-python-headless (for --show) or opencv-python"})
    return found


def _delegate_problems(report: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A library the user named (EDGEKIT_GPU_DELEGATE, EDGEKIT_NPU_DELEGATE, ...) that does not load is a
    problem: the runtime would fall back to the CPU. Known names that are simply absent are not."""
    custom = [p for p in os.environ.get("EDGEKIT_DELEGATES", "").split(os.pathsep) if p]
    found = []
    for d in report:
        var = "EDGEKIT_DELEGATES" if d["kind"] == "custom" else ENV_LIBRARY.get(d["kind"])
        named = d["library"] in custom if d["kind"] == "custom" else os.environ.get(var or "") == d["library"]
        if named and not d["loadable"]:
            found.append({"problem": f"{var}={d['library']} cannot be loaded ({d['reason']}); models fall back "
                                     "to the next accelerator",
                          "fix": f"point {var} at the delegate's shared library, or unset it"})
    return found


def diagnose() -> dict[str, Any]:
    from edgekit._version import __version__

    versions = {name: _version(name) for name in PACKAGES}
    machine = platform.machine()
    backends = []
    for module, package in (("ai_edge_litert", "ai-edge-litert"), ("tflite_runtime", "tflite-runtime"),
                            ("tensorflow", "tensorflow")):
        backends.append({"module": module, "version": versions.get(package),
                         "importable": importlib.util.find_spec(module) is not None})
    from edgekit.runtime.backend import get_backend

    try:
        active = get_backend()
        active_info: dict[str, str | None] = {"name": active.name, "version": active.version}
    except Exception as exc:  # reported, not raised: doctor must always answer  # noqa: BLE001
        active_info = {"name": None, "error": str(exc).splitlines()[0]}
    found = problems(versions, machine)
    if active_info["name"] is None and not any("no TFLite interpreter" in p["problem"] for p in found):
        found.append({"problem": f"no TFLite interpreter can be imported ({active_info['error']})",
                      "fix": "pip install --force-reinstall ai-edge-litert"})
    found += _delegate_problems(delegate_report := delegates())
    return {
        "schema": DOCTOR_SCHEMA,
        "edgekit": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.release()} {machine}",
        "packages": versions,
        "backends": backends,
        "active_backend": active_info,
        "gpus": gpus(),
        "delegates": delegate_report,
        "problems": found,
        "ok": not found,
    }


def doctor_text(d: dict[str, Any]) -> str:
    out = [f"edgekit {d['edgekit']} on Python {d['python']}, {d['platform']}"]
    out += [f"  {name:32} {version or '-'}" for name, version in d["packages"].items()]
    active = d["active_backend"]
    out.append(f"interpreter: {active.get('name') or 'none'} {active.get('version') or active.get('error', '')}")
    out.append(f"GPUs/accelerator devices: {', '.join(d['gpus']) or 'none visible'}")
    loadable = [x["library"] for x in d["delegates"] if x["loadable"]]
    out.append(f"loadable delegates: {', '.join(loadable) or 'none'} (checked {len(d['delegates'])})")
    if d["problems"]:
        out.append("problems:")
        out += [f"  - {p['problem']}\n    fix: {p['fix']}" for p in d["problems"]]
    else:
        out.append("no known problems")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(doctor_text(diagnose()), file=sys.stdout)
