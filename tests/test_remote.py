"""`edgekit bench --on` and `doctor --on` against a real SSH server on 127.0.0.1 (tests/sshd.py: OpenSSH's
sshd, or asyncssh's server standing in for it where sshd is not installed): two host aliases at once, a dead
port, a refused key, a device Python without edgekit, the copy cache, sessions that end, devices whose
login shell is dash, device programs that ignore SIGHUP and SIGTERM, and audits against a float .tflite
`--reference` on the device."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import run_cli
from sshd import LoopbackSSHD
from test_bench_reference_tflite import last_layer_rewritten

from edgekit import __version__
from edgekit.contracts import validate
from edgekit.harness import bench
from edgekit.remote import STAGE, item_for, parse_host
from edgekit.runtime import device
from edgekit.runtime.timing import BenchSettings

EDGEKIT = [sys.executable, "-m", "edgekit"]
ON_DEVICE = ["--remote-python", sys.executable]  # the "device" is this machine, its edgekit this venv's


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    with LoopbackSSHD(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def dash_sshd(tmp_path_factory):
    """A device whose login shell is dash (Debian's and Ubuntu's sh): the stand-in, whatever is installed,
    since sshd takes the shell from the passwd entry."""
    dash = shutil.which("dash")
    if dash is None:
        pytest.fail("dash is not installed (apt install dash): these tests run a device whose login shell is dash")
    with LoopbackSSHD(tmp_path_factory.mktemp("dash_sshd"), login_shell=dash) as server:
        yield server


def _edgekit(sshd, *args, timeout=120):
    return subprocess.run([*EDGEKIT, *args], env=sshd.env, capture_output=True, text=True, timeout=timeout)


def _leftovers() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "edgekit-bench-*")))


def _still_there(folders: set[str], within: float = 30.0) -> set[str]:
    """Those of `folders` still there after `within` seconds. A device's temporary copy goes as its bench
    ends; under pytest -n 2 another test's device may hold one at the same time (the suite once failed on a
    folder that was there before this test and gone after it), which goes when that test's bench does."""
    deadline = time.monotonic() + within
    while (left := folders & _leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_two_hosts_at_once_with_device_identity_and_accuracy(sshd, converted, digits_dir, tmp_path):
    model = converted("int8")
    before = _leftovers()
    out = tmp_path / "remote.json"
    r = _edgekit(sshd, "bench", str(model), "--on", "devA", "--on", "devB", *ON_DEVICE, "--runs", "30",
                 "--data", str(digits_dir / "test"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    validate(report, "edgekit.bench/1")
    assert [row["host"] for row in report["models"]] == ["devA", "devB"]
    assert [h["host"] for h in report["hosts"]] == ["devA", "devB"] and all(h["ok"] for h in report["hosts"])
    for row in report["models"]:
        assert row["path"] == str(model)  # the workstation's path, not the device's temporary copy
        assert row["latency_ms"]["p50"] > 0
        assert row["device"]["hostname"] == socket.gethostname()
        assert row["device"]["machine"] and row["device"]["cores"] == os.cpu_count()
        assert row["accuracy"]["samples"] == 360 and row["accuracy"]["top1"] > 0.9
    assert report["data"]["path"] == str(digits_dir / "test")
    table = [ln for ln in r.stdout.splitlines() if ln.startswith(model.name)]
    assert [ln.split()[1] for ln in table] == ["devA", "devB"]
    assert sum("devA: " in ln for ln in r.stdout.splitlines()) == 1  # the device line
    assert not _still_there(_leftovers() - before)  # the device's temporary folders are gone


def test_accuracy_on_the_device_equals_a_local_bench(sshd, converted, digits_dir):
    model = converted("int8")
    local = json.loads(subprocess.run([*EDGEKIT, "bench", str(model), "--data", str(digits_dir / "test"), "--runs", "5",
                                       "--json", "-"], capture_output=True, text=True, check=True).stdout)
    remote = json.loads(_edgekit(sshd, "bench", str(model), "--on", "devA", *ON_DEVICE, "--runs", "5",
                                 "--data", str(digits_dir / "test"), "--json", "-").stdout)
    assert remote["models"][0]["accuracy"]["top1"] == local["models"][0]["accuracy"]["top1"]
    assert remote["models"][0]["accuracy"]["per_class_top1"] == local["models"][0]["accuracy"]["per_class_top1"]


def test_dead_port_is_one_line_and_the_other_host_is_kept(sshd, converted, tmp_path):
    out = tmp_path / "partial.json"
    start = time.monotonic()
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "dead", "--on", "devA", *ON_DEVICE, "--runs", "10",
                 "--json", str(out))
    assert time.monotonic() - start <= 30
    assert r.returncode == 10
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("edgekit: error:")]
    assert errors == ["edgekit: error: dead: connection refused: is sshd running on the device, on that port?"]
    assert "Traceback" not in r.stderr
    report = json.loads(out.read_text())
    validate(report, "edgekit.bench/1")
    assert [row["host"] for row in report["models"]] == ["devA"]
    assert [(h["host"], h["ok"]) for h in report["hosts"]] == [("dead", False), ("devA", True)]


def test_refused_key_and_missing_edgekit_say_what_to_do(sshd, converted, tmp_path):
    model = str(converted("int8"))
    r = _edgekit(sshd, "bench", model, "--on", "nokey", *ON_DEVICE)
    assert r.returncode == 10 and "nokey: authentication failed: install your key" in r.stderr
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")  # a device Python without edgekit
    r = _edgekit(sshd, "bench", model, "--on", "devA", "--remote-python", bare)
    assert r.returncode == 10
    assert f"devA: no edgekit for {bare}" in r.stderr and "pip install edgekit" in r.stderr
    assert r.stdout == ""  # no host answered: no table
    r = _edgekit(sshd, "bench", model, "--on", "devA", "--remote-python", "/nonexistent/python3")
    assert r.returncode == 10 and "/nonexistent/python3 is not on the device" in r.stderr


def test_keep_remote_copies_once_then_reuses(sshd, converted, digits_dir, tmp_path):
    """The model and its .tflite `--reference` alike (files no other test here counts the copies of), compared
    on one digit per class already on the device."""
    model, ref = converted("float16"), converted("dynamic")
    stage = Path(os.path.expanduser(STAGE))
    keys = [item_for(model).key, item_for(ref).key]
    for digit in range(10):
        (tmp_path / str(digit)).mkdir()
        shutil.copy(sorted((digits_dir / "test" / str(digit)).glob("*.png"))[0], tmp_path / str(digit))
    args = [str(model), "--on", "devA", *ON_DEVICE, "--runs", "5", "--reference", str(ref),
            "--remote-data", str(tmp_path), "--json", "-"]
    try:
        first = json.loads(_edgekit(sshd, "bench", *args, "--keep-remote").stdout)
        size = model.stat().st_size + ref.stat().st_size
        assert first["hosts"][0]["copied_bytes"] == size and first["hosts"][0]["reused"] == 0
        assert all((stage / key).is_file() for key in keys)
        second = json.loads(_edgekit(sshd, "bench", *args).stdout)
        assert second["hosts"][0]["copied_bytes"] == 0 and second["hosts"][0]["reused"] == 2
        assert second["models"][0]["latency_ms"]["p50"] > 0
        assert second["models"][0]["accuracy"]["comparison"]["n"] == 10
    finally:
        for key in keys:
            (stage / key).unlink(missing_ok=True)


def test_doctor_on_a_device(sshd):
    r = _edgekit(sshd, "doctor", "--on", "devA", *ON_DEVICE, "--json")
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)
    assert [d["host"] for d in reports] == ["devA"]
    validate({k: v for k, v in reports[0].items() if k != "host"}, "edgekit.doctor/1")
    r = _edgekit(sshd, "doctor", "--on", "devA", "--on", "dead", *ON_DEVICE)
    assert r.returncode == 10 and r.stdout.startswith("== devA\nedgekit ")
    assert "dead: connection refused" in r.stderr


def test_a_remote_python_under_the_device_users_home_is_found_by_tilde(sshd, tmp_path):
    """docs/bench.md passes `--remote-python '~/edgekit/bin/python'` (the Pi's venv): the ~ is the device
    user's home there (it was quoted into a literal ~ and was 'not on the device'). The wrapper lives in
    this user's home for the test's length."""
    home = Path(os.path.expanduser("~"))
    venv = home / f".edgekit-test-tilde-{os.getpid()}"
    try:
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        (venv / "bin" / "python").chmod(0o755)
        r = _edgekit(sshd, "doctor", "--on", "devA", "--remote-python", f"~/{venv.name}/bin/python")
        assert r.returncode == 0, r.stderr
        r = _edgekit(sshd, "doctor", "--on", "devA", "--remote-python", f"~/{venv.name}/bin/nope")
        assert r.returncode == 10 and f"~/{venv.name}/bin/nope is not on the device" in r.stderr
    finally:
        shutil.rmtree(venv, ignore_errors=True)


@pytest.mark.parametrize("spec, target, port", [
    ("pi", "pi", None), ("pi@raspberrypi.local", "pi@raspberrypi.local", None), ("pi@10.0.0.7:2222", "pi@10.0.0.7", 2222),
    ("[::1]:2200", "::1", 2200), ("root@[fe80::1]", "root@fe80::1", None)])
def test_host_specs(spec, target, port):
    host = parse_host(spec)
    assert (host.target, host.port) == (target, port)


@pytest.mark.parametrize("args, message", [
    (["--on", "pi:99999"], "port 99999 is not in 1..65535"),
    (["--on", "a b"], "give [user@]host[:port]"),
    (["--on", "pi", "--on", "pi"], "each host once"),
    (["--on", "pi", "--reference", "m.tflite"], "--reference: needs --data or --remote-data"),
    (["--on", "pi", "--reference", "m.tflite", "--remote-data", "/d"], "--reference: m.tflite: no such file"),
    (["--remote-data", "/data"], "--remote-data needs --on HOST"),
])
def test_bad_remote_options_are_usage_errors(converted, args, message):
    r = subprocess.run([*EDGEKIT, "bench", str(converted("int8")), *args], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_throttling_is_read_from_the_firmware_flags_and_counters():
    calm = {"governor": "ondemand", "temperature_c": 51.0, "pi_throttled": 0x0, "throttle_count": None}
    hot = {**calm, "pi_throttled": 0x50004, "temperature_c": 82.5}  # throttled now, and since boot
    assert device.during(calm, calm)["throttled"] is False
    assert device.during(calm, hot)["throttled"] is True and device.during(calm, hot)["temperature_c"] == 82.5
    x86 = {"governor": None, "temperature_c": None, "pi_throttled": None, "throttle_count": 3}
    assert device.during(x86, {**x86, "throttle_count": 5})["throttled"] is True
    assert device.during(x86, x86)["throttled"] is False
    blind = {"governor": None, "temperature_c": None, "pi_throttled": None, "throttle_count": None}
    assert device.during(blind, blind)["throttled"] is None


def test_overall_timeout_stops_the_device_too(sshd, converted):
    start = time.monotonic()
    r = _edgekit(sshd, "bench", str(converted("float32")), "--on", "devA", *ON_DEVICE, "--runs", "100000000",
                 "--timeout", "4")
    assert time.monotonic() - start < 15
    assert r.returncode == 10 and "Traceback" not in r.stderr
    assert "devA: " in r.stderr and "timed out" in r.stderr, r.stderr
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", "edgekit bench .*--runs 100000000"], capture_output=True, text=True).stdout
    assert left.strip() == "", "the device kept benchmarking after the timeout"


def test_remote_data_already_on_the_device_is_not_copied(sshd, converted, digits_dir):
    model = converted("int8")
    r = _edgekit(sshd, "bench", str(model), "--on", "devA", *ON_DEVICE, "--runs", "5",
                 "--remote-data", str(digits_dir / "test"), "--json", "-")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["hosts"][0]["copied_bytes"] == model.stat().st_size  # the model only
    assert report["data"]["path"] == str(digits_dir / "test") and report["models"][0]["accuracy"]["samples"] == 360
    r = _edgekit(sshd, "bench", str(model), "--on", "devA", *ON_DEVICE, "--remote-data", "/nonexistent/data")
    assert r.returncode == 10 and \
        "devA: the device's edgekit failed (exit 6): --data: /nonexistent/data: no such file or folder" in r.stderr


def _fake_python(tmp_path, name: str, body: str) -> str:
    """A program passed as --remote-python that answers like a hostile or broken device would."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _still_running(marker: str, within: float = 6.0) -> str:
    """The processes matching `marker` still there after `within` seconds (the device's grace period between
    SIGTERM and SIGKILL included)."""
    deadline = time.monotonic() + within
    while True:
        left = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.strip()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _started_on_device(marker: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout:
        time.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout, "the device never started"


def test_a_probe_that_never_answers_and_ignores_signals_is_not_left_running(sshd, converted, tmp_path):
    hang = _fake_python(tmp_path, "hang-python-7f3a", "trap '' HUP TERM INT\nwhile :; do sleep 0.2; done")
    start = time.monotonic()
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--remote-python", hang, "--timeout", "4")
    assert time.monotonic() - start < 20
    assert r.returncode == 10 and "timed out" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _still_running("hang-python-7f3a") == "", "the device kept the probe running"


def test_after_timeout_a_benchmark_that_ignores_hup_and_term_is_killed_on_the_device(sshd, converted, tmp_path):
    """The device's Python, and so the benchmark it starts, ignore SIGHUP and SIGTERM (started under
    `trap '' HUP TERM`): at --timeout the device sends the benchmark's group SIGTERM, then SIGKILL."""
    stubborn = _fake_python(tmp_path, "stubborn-python", f"trap '' HUP TERM\nexec {sys.executable} \"$@\"")
    on_device = r"edgekit bench \S*edgekit-bench-\S* .*--runs 100000003"
    start = time.monotonic()
    r = _edgekit(sshd, "bench", str(converted("float32")), "--on", "devA", "--remote-python", stubborn,
                 "--runs", "100000003", "--timeout", "8")
    assert time.monotonic() - start < 20
    assert r.returncode == 10 and "timed out" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _still_running(on_device) == "", "the device kept benchmarking"


def test_after_timeout_a_device_python_that_hangs_ignoring_hup_and_term_is_killed(sshd, converted, tmp_path):
    """A device Python that answers the probe, then hangs in the run ignoring SIGHUP and SIGTERM: nothing of
    edgekit's runs there to stop it, so the device's `timeout` does (SIGTERM, then SIGKILL)."""
    hung = _fake_python(tmp_path, "hung-run-python-9d2b", "case \"$2\" in *tarfile*) trap '' HUP TERM INT; "
                        f"while :; do sleep 0.2; done;; esac\nexec {sys.executable} \"$@\"")
    start = time.monotonic()
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--remote-python", hung, "--timeout", "5")
    assert time.monotonic() - start < 20
    assert r.returncode == 10 and "timed out" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _still_running("hung-run-python-9d2b") == "", "the device kept the run's Python running"


@pytest.mark.parametrize("server, runs", [("sshd", 100000001), ("dash_sshd", 100000002)])
def test_a_benchmark_whose_session_ends_is_stopped_on_the_device(server, runs, request, converted):
    """The workstation's ssh is killed mid-run (not a timeout edgekit chose): the device notices its session
    ended and stops the benchmark's whole process group. Also where the login shell is dash, which keeps
    waiting for a lone `-c` command (the shell outlives the session, so its child's parent never changes)."""
    sshd = request.getfixturevalue(server)
    earlier = _leftovers()
    proc = subprocess.Popen([*EDGEKIT, "bench", str(converted("float32")), "--on", "devA", *ON_DEVICE,
                             "--runs", str(runs)], env=sshd.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    on_device = rf"edgekit bench \S*edgekit-bench-\S* .*--runs {runs}"  # the device's copy, not ours
    _started_on_device(on_device)
    time.sleep(1)
    before = _leftovers()
    os.killpg(proc.pid, 9)  # edgekit and its ssh client, as a closed laptop would
    proc.wait()
    assert _still_running(on_device) == "", f"the device kept benchmarking ({sshd.kind})"
    assert before - earlier and not _still_there(before - earlier), "the device kept its copy of the model"


def test_a_killed_ssh_client_is_a_dropped_connection_and_the_device_stops(sshd, converted):
    """Only the workstation's ssh dies (the OOM killer, a user's kill): edgekit says the connection dropped,
    not that the device's edgekit failed (exit -9), and the device stops the benchmark."""
    proc = subprocess.Popen([*EDGEKIT, "bench", str(converted("float32")), "--on", "devA", *ON_DEVICE,
                             "--runs", "100000004"], env=sshd.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    on_device = r"edgekit bench \S*edgekit-bench-\S* .*--runs 100000004"
    _started_on_device(on_device)
    ssh = subprocess.run(["pgrep", "-P", str(proc.pid), "-x", "ssh"], capture_output=True, text=True).stdout.split()
    assert len(ssh) == 1, ssh
    os.kill(int(ssh[0]), signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 10 and out == "", err
    assert err.strip() == "edgekit: error: devA: the connection dropped: ssh was killed by SIGKILL on this machine; " \
                          "run again"
    assert _still_running(on_device) == "", "the device kept benchmarking"


@pytest.mark.parametrize("server", ["sshd", "dash_sshd"])
def test_a_session_runs_as_sshd_runs_it(server, request):
    """Whichever server runs (OpenSSH's sshd, or the stand-in): the command through the login shell with -c,
    in $HOME, with sshd's environment and nothing of the client's; the exit status comes back."""
    sshd = request.getfixturevalue(server)
    user = pwd.getpwuid(os.getuid())
    shell = sshd.login_shell or user.pw_shell
    r = subprocess.run(["ssh", "-F", str(sshd.config), "devA", 'echo "$0"; pwd; env; exit 7'], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "EDGEKIT_TEST_CLIENT_ONLY": "1"})
    assert r.returncode == 7, (sshd.kind, r.stderr)
    zero, cwd, *lines = r.stdout.splitlines()
    env = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    assert (zero, cwd) == (os.path.basename(shell), user.pw_dir), sshd.kind
    assert {k: env.get(k) for k in ("HOME", "USER", "LOGNAME", "SHELL", "MAIL")} == {
        "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "SHELL": shell,
        "MAIL": f"/var/mail/{user.pw_name}"}, sshd.kind
    assert env["SSH_CONNECTION"].split()[2:] == ["127.0.0.1", str(sshd.port)], sshd.kind
    assert not {"EDGEKIT_TEST_CLIENT_ONLY", "PYTEST_CURRENT_TEST", "EDGEKIT_CACHE_DIR", "VIRTUAL_ENV"} & set(env)


def test_a_device_that_floods_stdout_is_stopped_in_bounded_memory(sshd, converted, tmp_path):
    flood = _fake_python(tmp_path, "flood-python", "exec yes 'x'")
    code = ("import sys, re\nfrom edgekit.cli import main\ntry:\n    main(sys.argv[1:], prog_name='edgekit')\n"
            "except SystemExit as e:\n    print('EXIT', e.code)\n"
            "print('PEAK', int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024)")
    r = subprocess.run([sys.executable, "-c", code, "bench", str(converted("int8")), "--on", "devA",
                        "--remote-python", flood, "--timeout", "60"], env=sshd.env, capture_output=True, text=True,
                       timeout=120)
    assert "EXIT 10" in r.stdout and "more than 64 MiB on stdout" in r.stderr, (r.stdout, r.stderr[-500:])
    assert int(r.stdout.split("PEAK")[-1]) < 512


def test_a_device_error_of_200_mb_with_escape_codes_is_one_short_printable_line(sshd, converted, tmp_path):
    noisy = _fake_python(tmp_path, "noisy-python",
                         "head -c 200000000 /dev/zero | tr '\\0' 'e' >&2\nprintf '\\033[31mred\\033]0;title\\007 "
                         "\\033[2J boom\\n' >&2\nexit 3")
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--remote-python", noisy)
    assert r.returncode == 10
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0]) < 500, lines[:3]
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "boom" in lines[0], lines[0]


@pytest.mark.parametrize("answer", ["[1, 2]", '{"python": 3}', '{"python": "3.11", "edgekit": "9.9.9", '
                                                                   '"machine": "x", "present": "all"}', "42"])
def test_a_probe_answer_that_is_not_edgekits_is_one_line_per_host(sshd, converted, tmp_path, answer):
    liar = _fake_python(tmp_path, "liar-python", f"echo '{answer}'")
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--on", "devB", "--remote-python", liar)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 10 and len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert all("probe" in ln for ln in lines), lines


def test_a_bench_report_that_breaks_its_contract_is_refused(sshd, converted, tmp_path):
    """A device 'edgekit' that answers the probe right, then prints a report of the wrong shape."""
    real = sys.executable
    liar = _fake_python(tmp_path, "report-python",
                        f'case "$1" in -c) case "$2" in *tarfile*) cat >/dev/null; '
                        f"echo '{{\"schema\": \"edgekit.bench/1\", \"models\": 5}}'; exit 0;; esac;; esac\n"
                        f'exec {real} "$@"')
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--remote-python", liar)
    assert r.returncode == 10 and "breaks edgekit.bench/1" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_device_answering_with_json_nested_past_the_parsers_limit_is_one_line(sshd, converted, tmp_path):
    deep = _fake_python(tmp_path, "deep-python", "head -c 3000000 /dev/zero | tr '\\0' '['; echo")
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--remote-python", deep)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 10 and len(lines) == 1 and "probe" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_an_audit_on_the_device_equals_the_local_one_and_flags_a_collapsed_file(sshd, converted, digits_dir, tmp_path):
    """`--reference float.tflite --on HOST`: the float twin is copied like a model and run by the device's
    runtime (no TensorFlow imported here either); each row's comparison (counts and interval) is the local
    bench's, and a collapsed int8 file (its class logits zeroed) is flagged in the merged report and its table."""
    int8, ref, test = converted("int8"), converted("float32"), digits_dir / "test"
    zeroed = tmp_path / "digits.int8.zeroed.tflite"
    zeroed.write_bytes(last_layer_rewritten(int8.read_bytes(), "zeroed"))
    local = bench([int8, zeroed], BenchSettings(threads=1, runs=3, warmup=1), data=test, reference=ref)
    out = tmp_path / "audit.json"
    r = run_cli("bench", int8, zeroed, "--on", "devA", *ON_DEVICE, "--threads", "1", "--runs", "3", "--warmup", "1",
                "--data", test, "--reference", ref, "--json", out, block_tf=True, env=sshd.env, timeout=120)
    assert r.returncode == 0 and r.imports == [], (r.stderr, r.import_sites)
    report = json.loads(out.read_text())
    validate(report, "edgekit.bench/1")
    assert report["reference"] == local["reference"] and report["reference"]["path"] == str(ref)  # not the copy's
    host = report["hosts"][0]
    assert host["reference"] == local["reference"]
    assert host["copied_bytes"] == sum(item_for(p).size for p in (int8, zeroed, ref, test)) and host["reused"] == 0
    for here, there in zip(local["models"], report["models"], strict=True):
        assert there["accuracy"]["comparison"] == here["accuracy"]["comparison"]
        assert there["accuracy"]["collapse"] == here["accuracy"]["collapse"]
    good, bad = (row["accuracy"] for row in report["models"])
    assert good["comparison"]["n"] == 360 and good["collapse"]["collapsed"] is False
    assert bad["collapse"]["collapsed"] is True and bad["comparison"]["change_interval"][1] < 0
    low, high = good["comparison"]["change_interval"]
    assert f"reference: {ref} (tflite, run on each device): top1 " in r.stdout
    assert f"{int8.name} on devA: against the reference, top-1 {good['comparison']['change_points']:+.2f} points " \
           f"(95 % interval {low:+.2f} to {high:+.2f}): {good['comparison']['verdict']}" in r.stdout
    assert f"{zeroed.name} on devA: collapsed: the same outputs for all 360 samples" in r.stdout


def test_a_keras_reference_on_a_device_is_refused_before_anything_connects(converted, digits_keras, digits_dir,
                                                                            tmp_path):
    """Read by its bytes: a Keras model named .tflite is refused too, with the command that makes its float
    .tflite; the ssh command is never run."""
    connected = tmp_path / "connected"
    env = {**os.environ, "EDGEKIT_SSH_COMMAND": f"sh -c 'touch {connected}; exit 255' sh"}
    disguised = tmp_path / "digits.tflite"
    shutil.copyfile(digits_keras, disguised)
    for keras in (digits_keras, disguised):
        r = subprocess.run([*EDGEKIT, "bench", str(converted("int8")), "--on", "devA", "--reference", str(keras),
                            "--data", str(digits_dir / "test")], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        stem = keras.name.rsplit(".", 1)[0] if keras == digits_keras else keras.name
        assert r.stderr == (f"edgekit: error: --reference: {keras} is a Keras model, which needs TensorFlow; with --on "
                            f"the device runs the reference: convert it to a float .tflite: edgekit convert {keras}, "
                            f"then pass {keras.parent / (stem + '.float32.tflite')}\n")
    assert not connected.exists()


def _blocking(folder: Path, module: str) -> str:
    """A folder whose sitecustomize.py makes `module` unimportable (PYTHONPATH=folder), as where it is absent."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\nclass _Absent:\n    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r} or name.startswith({module + '.'!r}):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _Absent())\n")
    return str(folder)


def test_a_device_too_old_for_the_reference_fails_alone_and_one_without_scipy_gives_n_and_the_hint(
        sshd, converted, digits_dir, tmp_path):
    """Two devices: the first to answer has an edgekit from before the .tflite reference (no edgekit.reference),
    the other no scipy (armv7l without python3-scipy). The first is one line with its fix (exit 10), the
    second's rows are kept: the delta with its n and the hint, no interval."""
    old, no_scipy = _blocking(tmp_path / "old", "edgekit.reference"), _blocking(tmp_path / "no_scipy", "scipy")
    fleet = _fake_python(tmp_path, "fleet-python", f"if mkdir {tmp_path / 'first'} 2>/dev/null; then "
                         f"export PYTHONPATH={old}; else export PYTHONPATH={no_scipy}; fi\nexec {sys.executable} \"$@\"")
    out = tmp_path / "fleet.json"
    r = _edgekit(sshd, "bench", str(converted("int8")), "--on", "devA", "--on", "devB", "--remote-python", fleet,
                 "--threads", "1", "--runs", "3", "--warmup", "1", "--data", str(digits_dir / "test"),
                 "--reference", str(converted("float32")), "--json", str(out))
    assert r.returncode == 10 and "Traceback" not in r.stderr, r.stderr
    report = json.loads(out.read_text())
    validate(report, "edgekit.bench/1")
    failed = [h for h in report["hosts"] if not h["ok"]]
    assert len(failed) == 1 and failed[0]["reference"] is None
    assert r.stderr == (f"edgekit: error: {failed[0]['host']}: edgekit {__version__} on the device cannot take a float .tflite "
                        f"as --reference (a newer edgekit can): run `{fleet} -m pip install -U edgekit` there\n")
    (row,) = report["models"]
    cmp = row["accuracy"]["comparison"]
    assert row["host"] != failed[0]["host"] and cmp["n"] == 360 and cmp["change_interval"] is None
    assert cmp["hint"].startswith("no 95 % intervals: they need scipy") and cmp["change_points"] == pytest.approx(row["accuracy"]["top1_delta_points"], abs=1e-4)
    assert f"on {row['host']}: against the reference, {cmp['verdict']}; {cmp['hint']}" in r.stdout
