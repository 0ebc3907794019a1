#!/usr/bin/env python3
"""The runtime where the Raspberry Pi runs it: Debian bookworm arm64 and armhf userlands (the bases of 64-bit
and 32-bit Raspberry Pi OS), built with debootstrap and run under qemu-user-static with the Pi's own cores.

    python .ci/arm.py roots [--reuse]      # build the roots (CI starts this early, in the background)
    python .ci/arm.py test                 # install, test and compare there; prints one line per check

Per platform (arm64 on Cortex-A72 = Pi 4 and Cortex-A76 = Pi 5, armhf on Cortex-A7 = Pi 2): the wheel is
installed with the README's own commands (`<!-- install:ARCH -->` blocks, `--only-binary=:all:` so nothing
compiles), then the runtime tests run on models built here, every model's outputs on the bundled digits are
compared with x86's (int8 within one quantization step, float within 1e-5), bench and run are compared with x86's, the README's
Pi app runs on a video, `doctor` runs, and `bench --on` drives the arm64 root over an sshd started inside it.

Facts this relies on (measured; see issue 26): qemu 7.2 shows the guest the host's x86 /proc/cpuinfo, on
which XNNPACK's cpuinfo crashes, so an ARM cpuinfo is bind-mounted over it; qemu's default `max` CPU makes
int8 models answer one class for everything, so QEMU_CPU is always pinned (also for sshd's sessions);
PyPI is reached through this network's TLS proxy, so the roots get the host's CA bundle for pip.

Needs root (chroot, mount, binfmt_misc). Standard library only. Roots live in $EDGEKIT_ARM_ROOTS
(default /var/tmp/edgekit-arm) and are rebuilt on every run unless --reuse is given.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from install_floor import NUMPY2_ONLY, RUNTIME_TESTS  # noqa: E402
from package_smoke import MAKE_VIDEO, ROOT, Failed, check, pi_app_block, sh  # noqa: E402

WORK = Path(os.environ.get("EDGEKIT_ARM_ROOTS", "/var/tmp/edgekit-arm"))
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_IN_ROOT = "/etc/ssl/certs/host-ca.crt"
VENV = "/root/edgekit"  # ~/edgekit of the README's commands (HOME=/root in the roots)
FLOAT_TOLERANCE = 1e-5


def step(msg: str) -> None:
    print(f"arm: {msg}", flush=True)


def _cpuinfo(processor: str, features: str, arch: int, variant: str, part: str, revision: int,
             tail: str = "") -> str:
    cores = os.cpu_count() or 1  # as many as /sys (the host's, bind-mounted) lists
    one = (f"{processor}BogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
           f"CPU architecture: {arch}\nCPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: {revision}\n\n")
    return "".join(f"processor\t: {i}\n" + one for i in range(cores)) + tail


@dataclass(frozen=True)
class Cpu:
    name: str  # QEMU_CPU
    board: str
    cpuinfo: str


@dataclass(frozen=True)
class Arch:
    name: str  # Debian's architecture
    machine: str  # what platform.machine() says there
    cpus: tuple[Cpu, ...]
    extra_packages: tuple[str, ...] = ()  # beyond the README's apt line: what the checks need
    backend: str = "ai_edge_litert"


ARCHES = (
    Arch("arm64", "aarch64", (
        Cpu("cortex-a72", "Pi 4", _cpuinfo("", "fp asimd evtstrm crc32 cpuid", 8, "0x0", "0xd08", 3)),
        Cpu("cortex-a76", "Pi 5", _cpuinfo("", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp "
                                            "cpuid asimdrdm lrcpc dcpop asimddp", 8, "0x4", "0xd0b", 1)),
    ), extra_packages=("openssh-server",)),
    Arch("armhf", "armv7l", (
        Cpu("cortex-a7", "Pi 2", _cpuinfo("model name\t: ARMv7 Processor rev 5 (v7l)\n",
                                          "half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 "
                                          "lpae evtstrm", 7, "0x0", "0xc07", 5,
                                          "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 2 Model B Rev 1.1\n")),
    ), backend="tflite_runtime 2.14.0"),
)


# -- the README's install commands -----------------------------------------------------------------------
def readme_install(arch: str) -> tuple[list[str], list[str]]:
    """(apt packages, shell lines) of the README's `<!-- install:ARCH -->` block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- install:{arch} -->\s*```bash\n(.*?)```\s*<!-- /install:{arch} -->", text, re.S)
    check(block is not None, f"README lost its install:{arch} block")
    apt, lines = [], []
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("sudo apt install"):
            apt += [w for w in line.split()[3:] if not w.startswith("-")]
        elif line:
            lines.append(line)
    return apt, lines


def with_wheel(line: str, wheel: str) -> str:
    """A README line with `pip install edgekit[...]` pointing at the wheel built here, binaries only."""
    pattern = r"pip install (['\"]?)edgekit(\[[^\]]*\])?\1"
    check(re.search(pattern, line) is not None or "pip install" not in line, f"cannot place the wheel in {line!r}")
    return re.sub(pattern, lambda m: f"pip install --only-binary=:all: {m.group(1)}{wheel}{m.group(2) or ''}"
                                     f"{m.group(1)}", line)


# -- host setup and roots --------------------------------------------------------------------------------
def prepare_host() -> None:
    """qemu-user-static, debootstrap and binfmt_misc with the qemu handlers enabled."""
    missing = [p for p, exe in (("qemu-user-static", "qemu-aarch64-static"), ("debootstrap", "debootstrap"),
                                ("binfmt-support", "update-binfmts")) if not shutil.which(exe)
               and not Path(f"/usr/sbin/{exe}").exists()]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, capture_output=True).returncode:
            sh("apt-get", "update", "-qq", env=env)
            sh("apt-get", "install", "-y", "-qq", *missing, env=env)
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "register").exists():
        sh("mount", "-t", "binfmt_misc", "binfmt_misc", binfmt)
    for handler in ("qemu-aarch64", "qemu-arm"):
        if not (binfmt / handler).exists():
            sh("/usr/sbin/update-binfmts", "--enable", handler)
        state = (binfmt / handler).read_text()
        check(state.startswith("enabled") and re.search(r"flags: \w*F", state) is not None,
              f"binfmt {handler} is not enabled with the F flag: {state}")


def root_of(arch: Arch) -> Path:
    return WORK / arch.name


def build_roots(reuse: bool) -> None:
    """Both roots at once (debootstrap spends its time downloading and in dpkg under qemu)."""
    prepare_host()
    WORK.mkdir(parents=True, exist_ok=True)
    procs = {}
    for arch in ARCHES:
        root = root_of(arch)
        if reuse and (root / ".edgekit-root-complete").exists():
            step(f"{arch.name} root: reused ({root})")
            continue
        remove_root(root)
        apt, _ = readme_install(arch.name)
        packages = sorted(set(BASE_PACKAGES) | set(apt) | set(arch.extra_packages))
        log = open(WORK / f"{arch.name}.debootstrap.log", "wb")
        procs[arch.name] = (subprocess.Popen(
            ["debootstrap", f"--arch={arch.name}", "--variant=minbase", f"--include={','.join(packages)}", SUITE,
             str(root), MIRROR], stdout=log, stderr=subprocess.STDOUT), time.monotonic(), root, log)
    for name, (proc, t0, root, log) in procs.items():
        try:
            code = proc.wait(timeout=max(1.0, 3600 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for other, *_ in procs.values():
                other.kill()
            raise
        finally:
            log.close()
        check(code == 0, f"debootstrap {name} exited {code}: "
                         f"{(WORK / f'{name}.debootstrap.log').read_text(errors='replace')[-2000:]}")
        (root / ".edgekit-root-complete").write_text(SUITE)
        step(f"{name} root: debootstrap {SUITE} in {time.monotonic() - t0:.0f} s")


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or under `root`, from /proc/mounts (its octal escapes, such as \\040 for a space,
    decoded)."""
    if not Path("/proc/mounts").exists():
        return []
    prefix = str(root.resolve()).rstrip("/")
    points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1])
              for line in Path("/proc/mounts").read_text().splitlines() if len(line.split()) > 1]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def unmount_all(root: Path) -> None:
    """Every mount under `root`, deepest first (lazily: a process still inside lets go later); Failed when
    one stays, so nothing deletes through a bind mount into the host's /dev or /sys."""
    for point in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = _mounts_under(root)
    check(not left, f"still mounted under {root}: {left[:3]}")


def remove_root(root: Path) -> None:
    """The root's folder, after its mounts are gone, never crossing into another file system."""
    unmount_all(root)
    if root.exists():
        sh("rm", "-rf", "--one-file-system", root)


@contextmanager
def mounted(root: Path, cpu: Cpu):
    """/proc, /sys and /dev inside the root, with the CPU's cpuinfo over /proc/cpuinfo."""
    unmount_all(root)
    info = WORK / f"cpuinfo-{cpu.name}"
    info.write_text(cpu.cpuinfo)
    try:
        for sub in ("proc", "sys", "dev"):
            (root / sub).mkdir(exist_ok=True)
        sh("mount", "-t", "proc", "proc", root / "proc")
        sh("mount", "--bind", "/sys", root / "sys")
        sh("mount", "--bind", "/dev", root / "dev")
        sh("mount", "--bind", info, root / "proc" / "cpuinfo")
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / CA_IN_ROOT.lstrip("/"))
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        yield
    finally:
        unmount_all(root)


def root_env(cpu: Cpu, **extra: str) -> dict[str, str]:
    return {"PATH": ROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "QEMU_CPU": cpu.name, "PIP_CERT": CA_IN_ROOT,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "180", **extra}


def in_root(root: Path, cpu: Cpu, command: str, *, expect: int | None = 0, timeout: float = 1800,
            **env: str) -> subprocess.CompletedProcess:
    """`sh -c COMMAND` inside the root on that CPU; with `expect` None, any exit status is returned."""
    done = subprocess.run(["chroot", str(root), "/bin/sh", "-c", command], env=root_env(cpu, **env),
                          capture_output=True, text=True, timeout=timeout)
    if expect is not None and done.returncode != expect:
        raise Failed(f"[{root.name} {cpu.name}] {command} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                     f"\n--- stderr\n{done.stderr[-3000:]}")
    return done


# -- what is installed and compared ----------------------------------------------------------------------
@dataclass
class Host:
    """What the x86 side built and measured, the reference for every platform."""
    python: str
    scratch: Path
    wheel: Path
    models: Path
    outputs: dict[str, dict]  # interpreter ("ai_edge_litert", "tflite_runtime 2.14.0") -> x86's outputs with it
    bench: dict
    run_labels: list[str]


def host_reference(python: str, scratch: Path) -> Host:
    """The wheel, the test models and x86's answers: outputs with LiteRT (the main venv) and with
    tflite-runtime 2.14 (a venv as on armv7l), bench and run with LiteRT."""
    dist = scratch / "dist"
    sh(python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist, ROOT)
    wheel = next(dist.glob("edgekit-*.whl"))
    models = scratch / "models"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    sh(python, ROOT / "tests" / "build_models.py", models, env=env)
    (models / "digits.keras").unlink()
    test = ROOT / "calibration_data" / "digits" / "test"
    tfl = scratch / "venv-tflite"
    sh(sys.executable, "-m", "venv", tfl)
    sh(tfl / "bin" / "python", "-m", "pip", "install", "--quiet", f"{wheel}[tflite]")
    sh(tfl / "bin" / "python", "-m", "pip", "uninstall", "--quiet", "--yes", "ai-edge-litert")
    outputs = {}
    for backend, py in (("ai_edge_litert", python), ("tflite_runtime 2.14.0", tfl / "bin" / "python")):
        sh(py, ROOT / ".ci" / "arm_outputs.py", models, test, scratch / "x86.npz", env=env)
        outputs[backend] = _load(scratch / "x86.npz")
    bench = json.loads(sh(python, "-m", "edgekit", "bench", *bench_models(models), "--data", test, "--runs", "20",
                          "--threads", "1", "--json", "-", env=env).stdout)
    run = sh(python, "-m", "edgekit", "run", models / "digits.int8.float32.tflite", "--source", test, "--json",
             env=env).stdout
    step(f"x86 reference: {wheel.name}, {len(list(models.glob('*.tflite')))} models, outputs on 360 digits with "
         f"{' and '.join(outputs)}; between those two on x86: {_interpreters_differ(outputs)}")
    return Host(python, scratch, wheel, models, outputs, bench, _labels(run))


def _interpreters_differ(outputs: dict[str, dict]) -> str:
    """How far LiteRT's and tflite-runtime 2.14's outputs are apart on x86 (a version difference, not ARM's)."""
    import numpy as np

    a, b = outputs.values()
    worst: dict[str, float] = {}
    for key in (k for k in a if "@" not in k and k in b):
        info = str(a[key.split("/")[0] + "/@mode"])
        worst[info] = max(worst.get(info, 0.0), float(np.abs(a[key].astype(float) - b[key].astype(float)).max()))
    return ", ".join(f"{mode} models up to {d:.3g}" for mode, d in sorted(worst.items())) + " (raw output units)"


def bench_models(models: Path) -> list[Path]:
    return [models / "digits.int8.float32.tflite", models / "digits.float32.float32.tflite"]


def _load(path: Path) -> dict:
    import numpy as np  # the main venv's, on the host only

    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _labels(run_stdout: str) -> list[str]:
    return [json.loads(ln)["results"][0]["label"] for ln in run_stdout.splitlines() if ln.startswith('{"frame"')]


def _step(values) -> float:
    """The quantization step of an int8 model's outputs (1 for integer outputs; the smallest gap between two
    distinct dequantized values for float ones)."""
    import numpy as np

    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.integer):
        return 1.0
    gaps = np.diff(np.unique(values))
    return float(gaps.min()) if gaps.size else 0.0


def compare_outputs(host: dict, arm: dict, unloadable: dict[str, bool]) -> tuple[bool, str]:
    """int8 models: within one quantization step (XNNPACK requantizes with other rounding on ARM's NEON than
    on x86, so a value on a rounding boundary lands one step apart: seen on the digits model trained in a fresh
    venv on 2026-12-02, one step (1 raw unit, 0.0039 dequantized), with 360/360 labels identical); others: within
    FLOAT_TOLERANCE; a model this interpreter cannot load
    is fine only where edgekit's runtime gate (`unloadable`: model -> gate says it fails) predicted it.
    (ok, one line)."""
    import numpy as np

    refused = {k.split("/")[0]: str(v) for k, v in arm.items() if k.endswith("/@error")}
    wrong = [m for m in refused if not unloadable.get(m)] + [m for m, no in unloadable.items() if no and m not in refused]
    host = {k: v for k, v in host.items() if k.split("/")[0] not in refused}
    check(sorted(host) == sorted(k for k in arm if not k.endswith("/@error")),
          f"other outputs: {sorted(set(host) ^ set(arm))[:4]}")
    worst, differing = 0.0, []
    for key in sorted(k for k in host if not k.endswith("/@mode")):
        model = key.split("/")[0]
        a, b = host[key].astype(np.float64), arm[key].astype(np.float64)
        diff = float(np.abs(a - b).max()) if a.size else 0.0
        exact = str(host[f"{model}/@mode"]) == "int8"
        if (exact and diff > _step(host[key]) * (1 + 1e-6)) or (not exact and diff > FLOAT_TOLERANCE):
            differing.append(f"{key} by {diff:.3g}")
        if not exact:
            worst = max(worst, diff)
    models = len({k.split("/")[0] for k in host})
    line = (f"outputs of {models} models on 360 digits: int8 within one step of x86's with this interpreter, float within {worst:.2g} "
            f"(tolerance {FLOAT_TOLERANCE:g})" if not differing else f"outputs differ from x86: {'; '.join(differing[:4])}")
    for model, why in sorted(refused.items()):
        verdict = "as the runtime gate predicts" if model not in wrong else "the runtime gate said it loads"
        line += f"; {model} not loadable ({why.split(': ', 1)[-1][:90]}): {verdict}"
    missed = [m for m in wrong if m not in refused]
    if missed:
        line += f"; the runtime gate says {', '.join(missed)} fail(s) here, but they loaded"
    return not differing and not wrong, line


def gate_verdicts(python: str, models: Path, runtime: str) -> dict[str, bool]:
    """model file -> whether `edgekit inspect --runtime RUNTIME` says that runtime fails to load it."""
    if not runtime.startswith("tflite_runtime"):
        return {}
    spec = "tflite-runtime==" + runtime.split()[1]
    verdicts = {}
    for path in sorted(models.glob("*.tflite")):
        done = subprocess.run([python, "-m", "edgekit", "inspect", str(path), "--runtime", spec, "--json"],
                              capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        check(done.returncode in (0, 5), f"inspect --runtime {spec} {path.name}: exit {done.returncode} {done.stderr}")
        report = json.loads(done.stdout)
        verdicts[path.name] = not all(c["ok"] for c in report["runtime_checks"])
        check(verdicts[path.name] == (done.returncode == 5), f"inspect's exit {done.returncode} and its report differ")
    return verdicts


# -- one platform --------------------------------------------------------------------------------------
def install(root: Path, arch: Arch, cpu: Cpu, host: Host) -> str:
    """The README's commands with the wheel built here; then pytest and jsonschema for the tests."""
    apt, lines = readme_install(arch.name)
    in_root(root, cpu, "dpkg -s " + " ".join(apt) + " >/dev/null")  # what the README's apt line installs
    shutil.copy(host.wheel, root / "tmp" / host.wheel.name)
    shutil.rmtree(root / VENV.lstrip("/"), ignore_errors=True)
    t0 = time.monotonic()
    for line in lines:
        in_root(root, cpu, with_wheel(line, f"/tmp/{host.wheel.name}"))
    in_root(root, cpu, f"{VENV}/bin/pip install --quiet --only-binary=:all: pytest jsonschema")
    got = in_root(root, cpu, f"{VENV}/bin/python -c 'from edgekit.runtime import get_backend; b = get_backend(); "
                             "print(b.name, b.version)'").stdout.strip()
    check(got.startswith(arch.backend), f"{arch.name}: the runtime picked {got}, not {arch.backend}")
    src = root / "work" / "src"
    shutil.rmtree(root / "work", ignore_errors=True)
    src.mkdir(parents=True)
    for name in ("tests", "calibration_data"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md", "pyproject.toml", ".ci/arm_outputs.py"):
        shutil.copy(ROOT / name, src / Path(name).name)
    shutil.copytree(host.models, root / "work" / "models")
    return f"installed with the README's commands in {time.monotonic() - t0:.0f} s, backend {got}"


def runtime_tests(root: Path, arch: Arch, cpu: Cpu) -> tuple[bool, str]:
    deselect = f"--deselect {NUMPY2_ONLY}" if arch.backend.startswith("tflite_runtime") else ""
    done = in_root(root, cpu, f"cd /work/src && {VENV}/bin/python -m pytest -q -p no:cacheprovider "
                              f"{' '.join(RUNTIME_TESTS)} {deselect}", expect=None, timeout=2400,
                   EDGEKIT_TEST_MODELS="/work/models", EDGEKIT_EXPECT_BACKEND=arch.backend)
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else f"no output (exit {done.returncode})"
    failed = [ln for ln in lines if ln.startswith("FAILED")]
    ok = done.returncode == 0 and "passed" in summary and "failed" not in summary
    return ok, f"runtime tests: {summary.strip('= ')}" + ("" if ok else "\n    " + "\n    ".join(failed[:10]))


def compare_commands(root: Path, arch: Arch, cpu: Cpu, host: Host) -> list[tuple[bool, str]]:
    """Outputs, bench accuracy, run labels and doctor against x86's."""
    checks = []
    in_root(root, cpu, f"cd /work/src && {VENV}/bin/python arm_outputs.py /work/models "
                       "calibration_data/digits/test /work/arm.npz", timeout=1800)
    checks.append(compare_outputs(host.outputs[arch.backend], _load(root / "work" / "arm.npz"),
                                  gate_verdicts(host.python, host.models, arch.backend)))
    models = " ".join(f"/work/models/{p.name}" for p in bench_models(host.models))
    bench = json.loads(in_root(root, cpu, f"cd /work/src && {VENV}/bin/edgekit bench {models} --data "
                                          "calibration_data/digits/test --runs 20 --threads 1 --json -").stdout)
    here = [m["accuracy"]["top1"] for m in bench["models"]]
    there = [m["accuracy"]["top1"] for m in host.bench["models"]]
    checks.append((here == there, f"bench: top-1 {', '.join(f'{t:.4f}' for t in here)} (x86 "
                                  f"{', '.join(f'{t:.4f}' for t in there)}), p50 "
                                  f"{', '.join(format(m['latency_ms']['p50'], '.2f') for m in bench['models'])} ms "
                                  "under emulation"))
    run = in_root(root, cpu, f"cd /work/src && {VENV}/bin/edgekit run /work/models/digits.int8.float32.tflite "
                             "--source calibration_data/digits/test --json").stdout
    labels = _labels(run)
    same = sum(a == b for a, b in zip(labels, host.run_labels))
    checks.append((labels == host.run_labels, f"run: {same}/{len(host.run_labels)} labels identical to x86"))
    doctor = json.loads(in_root(root, cpu, f"{VENV}/bin/edgekit doctor --json").stdout)
    active = doctor.get("active_backend") or {}
    checks.append((bool(active), f"doctor: {active.get('name')} {active.get('version')}, "
                                 f"{len(doctor.get('delegates', []))} delegate libraries checked"))
    return checks


def pi_app(root: Path, cpu: Cpu) -> tuple[bool, str]:
    """The README's Pi app block on a 10-frame video of one digit per class, made and read inside the root."""
    (root / "work" / "app.py").write_text(pi_app_block())
    (root / "work" / "make_video.py").write_text(MAKE_VIDEO)
    in_root(root, cpu, f"cd /work && {VENV}/bin/python make_video.py src/calibration_data/digits/test digits.avi")
    out = in_root(root, cpu, f"cd /work && {VENV}/bin/python app.py models/digits.int8.float32.tflite digits.avi")
    labels = [line.split()[1] for line in out.stdout.splitlines() if line.strip()]
    right = sum(label == str(d) for d, label in enumerate(labels))
    return len(labels) == 10 and right >= 9, f"the README's Pi app on a 10-frame video: {right}/10"


# -- bench --on against the arm64 root -----------------------------------------------------------------
@contextmanager
def sshd_in(root: Path, cpu: Cpu, folder: Path):
    """OpenSSH's sshd inside the root on 127.0.0.1, with the CPU pinned for its sessions (SetEnv): yields
    the ssh config naming it `pi-arm64`."""
    etc = root / "etc" / "ssh"
    for name in ("host", "client"):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", folder / f"{name}_key")
    shutil.copy(folder / "host_key", etc / "edgekit_host_key")
    os.chmod(etc / "edgekit_host_key", 0o600)
    shutil.copy(folder / "client_key.pub", etc / "edgekit_authorized_keys")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (etc / "edgekit_sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", "HostKey /etc/ssh/edgekit_host_key",
        "AuthorizedKeysFile /etc/ssh/edgekit_authorized_keys", "StrictModes no", "UsePAM no",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        f"SetEnv QEMU_CPU={cpu.name}", "LogLevel ERROR", ""]))
    (root / "run" / "sshd").mkdir(parents=True, exist_ok=True)
    log = open(folder / "sshd.log", "wb")
    proc = subprocess.Popen(["chroot", str(root), "/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/edgekit_sshd_config"],
                            env=root_env(cpu), stdout=subprocess.DEVNULL, stderr=log)
    (folder / "ssh_config").write_text("\n".join([
        "Host pi-arm64", "  HostName 127.0.0.1", f"  Port {port}", "  User root", f"  IdentityFile {folder / 'client_key'}",
        "  IdentitiesOnly yes", "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR", ""]))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                check(proc.poll() is None and time.monotonic() < deadline,
                      f"sshd in the root did not start: {(folder / 'sshd.log').read_text(errors='replace')[-800:]}")
                time.sleep(0.2)
        yield folder / "ssh_config"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def bench_on(root: Path, cpu: Cpu, host: Host) -> tuple[bool, str]:
    folder = Path(tempfile.mkdtemp(prefix="edgekit-arm-ssh."))
    try:
        with sshd_in(root, cpu, folder) as config:
            env = {**os.environ, "EDGEKIT_SSH_COMMAND": f"ssh -F {config}", "TF_CPP_MIN_LOG_LEVEL": "3"}
            done = sh(host.python, "-m", "edgekit", "bench", *bench_models(host.models), "--on", "pi-arm64",
                      "--remote-python", f"{VENV}/bin/python", "--data", ROOT / "calibration_data" / "digits" / "test",
                      "--runs", "20", "--threads", "1", "--timeout", "900", "--json", "-", env=env, timeout=1200)
        report = json.loads(done.stdout)
        rows = report["models"]
        device = rows[0]["device"]
        top1 = [m["accuracy"]["top1"] for m in rows]
        local = [m["accuracy"]["top1"] for m in host.bench["models"]]
        ok = device.get("machine") == "aarch64" and top1 == local and all(m.get("host") == "pi-arm64" for m in rows)
        return ok, (f"bench --on root@pi-arm64 over the root's sshd: device {device.get('machine')}, "
                    f"{device.get('os')}, Python {device.get('python')}; top-1 {top1} (local x86 {local})")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- the whole step ----------------------------------------------------------------------------------------
def test_all(python: str, only: str | None = None) -> bool:
    build_roots(reuse=True)  # built by `roots` earlier in this run, or now
    scratch = Path(tempfile.mkdtemp(prefix="edgekit-arm."))
    results: list[tuple[str, bool, str]] = []
    try:
        host = host_reference(python, scratch)
        for arch in ARCHES:
            if only and arch.name != only:
                continue
            root = root_of(arch)
            with mounted(root, arch.cpus[0]):
                step(f"{arch.name}: {install(root, arch, arch.cpus[0], host)}")
            for cpu in arch.cpus:
                where = f"{arch.name} {cpu.name} ({cpu.board})"
                with mounted(root, cpu):
                    t0 = time.monotonic()
                    checks = [runtime_tests(root, arch, cpu), *compare_commands(root, arch, cpu, host), pi_app(root, cpu)]
                    if arch.name == "arm64" and cpu is arch.cpus[0]:
                        checks.append(bench_on(root, cpu, host))
                for ok, line in checks:
                    results.append((where, ok, line))
                    step(f"{where}: {'ok' if ok else 'FAILED'}: {line}")
                step(f"{where}: {time.monotonic() - t0:.0f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    bad = [r for r in results if not r[1]]
    step(f"{len(results) - len(bad)} of {len(results)} checks passed on "
         + ", ".join(f"{a.name} {c.name}" for a in ARCHES for c in a.cpus))
    return not bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["roots", "test"])
    parser.add_argument("--reuse", action="store_true", help="roots: keep those an earlier run built (development)")
    parser.add_argument("--only", choices=[a.name for a in ARCHES], help="test: one architecture (development)")
    parser.add_argument("--python", default=sys.executable, help="the main venv's Python (TensorFlow, build)")
    args = parser.parse_args()
    check_root = os.geteuid() == 0 or getpass.getuser() == "root"
    t0 = time.monotonic()
    try:
        check(check_root, "the ARM step needs root (chroot, mount, binfmt_misc)")
        if args.what == "roots":
            build_roots(args.reuse)
            return 0
        ok = test_all(args.python, args.only)
    except (Failed, subprocess.TimeoutExpired) as exc:
        print(f"arm: FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    step(f"{'all checks passed' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
