"""The two programs `edgekit bench --on` runs on a device with `PYTHON -c`. They use only the standard
library (Python 3.8+), since the device's Python may have no edgekit at all; `edgekit.remote` sends them.

PROBE (argv: stage folder, then sha256 keys): one JSON line: the device's Python, its edgekit version (null
when it has none), which keys are already staged (files verified by sha256, folders by their marker) and the
`features` its edgekit has beyond edgekit.remote's MIN_DEVICE_EDGEKIT, found by the module that brings each
(TFLITE_REFERENCE: a float .tflite as bench's `--reference`, edgekit.reference).

RUN (argv: one JSON spec; stdin: a tar of the items not staged, each member named by its key): makes a
private temporary folder, puts every item there (received, or hard-linked from the stage), runs
`PYTHON -m edgekit ARGS` in it with `{item:N}` replaced by item N's path, passes its stdout, stderr and
exit status through, and removes the folder. With "keep", received items are moved into the stage first,
so the next run copies nothing. The benchmark runs in a process group of its own, stopped whole (SIGTERM,
then SIGKILL after "grace" seconds) when it passes its "timeout" (exit 124), when RUN gets SIGTERM or SIGHUP
(unless started ignoring them, as under nohup), or when the ssh session that started it ends (the workstation gave up, or died): sshd then closes the
session's pipes, which RUN sees on its stdout whatever shell or wrapper stands between them. The device
never keeps a benchmark running, even one that ignores SIGHUP and SIGTERM.
"""

TFLITE_REFERENCE = "tflite_reference"  # PROBE names it: keep the two spellings equal

PROBE = r"""
import hashlib, importlib.util, json, os, platform, sys
stage = os.path.expanduser(sys.argv[1])
def version():
    try:
        from edgekit._version import __version__
        return __version__
    except Exception:
        pass
    try:
        from importlib.metadata import version as v
        return v("edgekit")
    except Exception:
        return None
def staged(key):
    path = os.path.join(stage, key)
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, ".edgekit-complete"))
    if not os.path.isfile(path):
        return False
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest() == key
def features():
    found = []
    for name, module in (("tflite_reference", "edgekit.reference"),):
        try:
            if importlib.util.find_spec(module) is not None:
                found.append(name)
        except Exception:
            pass
    return found
print(json.dumps({"python": platform.python_version(), "executable": sys.executable, "edgekit": version(),
                  "machine": platform.machine(), "present": [k for k in sys.argv[2:] if staged(k)],
                  "features": features()}))
"""

RUN = r"""
import hashlib, json, os, select, shutil, signal, subprocess, sys, tarfile, tempfile, time
spec = json.loads(sys.argv[1])
until = time.monotonic() + spec["timeout"]  # from the start: receiving the files counts too
stage = os.path.expanduser(spec["stage"])
tmp = tempfile.mkdtemp(prefix="edgekit-bench-")
def fail(message, code=2):
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        sys.stderr.write("edgekit: error: " + message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the session is gone: nobody to tell
        pass
    sys.exit(code)
def receive(incoming):
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                fail("refused tar member " + repr(member.name))
            target = os.path.join(incoming, *parts)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
def link_tree(src, dst):
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
def place(item, incoming, dst):
    key = item["key"]
    got = os.path.join(incoming, key)
    if os.path.exists(got):
        if item["kind"] == "file" and sha256(got) != key:
            fail("the copy of " + item["name"] + " arrived damaged (sha256 differs); run again")
        if spec["keep"]:
            os.makedirs(stage, exist_ok=True)
            if item["kind"] == "dir":
                open(os.path.join(got, ".edgekit-complete"), "w").close()
            if not os.path.exists(os.path.join(stage, key)):
                os.replace(got, os.path.join(stage, key))
                got = os.path.join(stage, key)
    else:
        got = os.path.join(stage, key)
        if not os.path.exists(got):
            fail(item["name"] + " vanished from " + stage + " during the run; run again")
    if item["kind"] == "dir":
        link_tree(got, dst)
        return
    try:
        os.link(got, dst)
    except OSError:
        shutil.copyfile(got, dst)
def ended(signum, frame):
    raise SystemExit(128 + signum)
for number in (signal.SIGHUP, signal.SIGTERM):
    if signal.getsignal(number) is not signal.SIG_IGN:  # what was started ignoring them (nohup) still does
        signal.signal(number, ended)
parent = os.getppid()
def session_ended():
    # sshd closed the session's pipes (the workstation gave up, or died): our stdout's reader is gone
    if os.getppid() != parent:
        return True
    watch = select.poll()
    watch.register(sys.stdout.fileno(), 0)  # no events asked: only POLLERR (a pipe) or POLLHUP (a socket)
    return bool(watch.poll(0))
def exited(child):
    if not hasattr(os, "waitid"):  # macOS: reaped, then
        return child.poll() is not None
    try:
        return os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True
def stop(child):
    # the benchmark's whole group: SIGTERM, then SIGKILL after the grace period for what ignored it; the
    # leader is reaped last, so the group's id cannot be reused in between
    for number in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, number)
        except OSError:
            pass
        grace_ends = time.monotonic() + spec["grace"]
        while number == signal.SIGTERM and not exited(child) and time.monotonic() < grace_ends:
            time.sleep(0.05)
    child.wait()
def wait_for(child):
    while True:
        try:
            return child.communicate(timeout=0.5)
        except subprocess.TimeoutExpired:
            if session_ended():
                stop(child)
                fail("the ssh session ended; the device stopped the benchmark", 129)
            if time.monotonic() > until:
                stop(child)
                fail("timed out (--timeout %g s); the device stopped the benchmark" % spec["limit"], 124)
child = None
try:
    incoming = os.path.join(tmp, "incoming")
    receive(incoming)
    paths = []
    for i, item in enumerate(spec["items"]):
        os.makedirs(os.path.join(tmp, str(i)))
        dst = os.path.join(tmp, str(i), item["name"])
        place(item, incoming, dst)
        paths.append(dst)
    args = []
    for a in spec["args"]:
        args.append(paths[int(a[6:-1])] if a.startswith("{item:") else a)
    child = subprocess.Popen([sys.executable, "-m", "edgekit"] + args, cwd=tmp, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    out, err = wait_for(child)
    code = child.returncode
    shutil.rmtree(tmp, ignore_errors=True)  # before writing: a session that ended makes the writes fail
    try:
        sys.stdout.buffer.write(out)
        sys.stderr.buffer.write(err)
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        code = 141
except SystemExit:
    raise
except BaseException as exc:
    fail("on the device: %s: %s" % (type(exc).__name__, exc), 70)
finally:
    if child is not None and child.poll() is None:  # SIGTERM or SIGHUP, or a failure: the benchmark goes too
        stop(child)
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(code)
"""
