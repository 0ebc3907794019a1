"""The two programs `edgekit bench --on` runs on a device with `PYTHON -c`. They use only the standard
library (Python 3.8+), since the device's Python may have no edgekit at all; `edgekit.remote` sends them.

PROBE (argv: stage folder, then sha256 keys): one JSON line: the device's Python, its edgekit version (null
when it has none) and which keys are already staged (files verified by sha256, folders by their marker).

RUN (argv: one JSON spec; stdin: a tar of the items not staged, each member named by its key): makes a
private temporary folder, puts every item there (received, or hard-linked from the stage), runs
`PYTHON -m edgekit ARGS` in it with `{item:N}` replaced by item N's path, passes its stdout, stderr and
exit status through, and removes the folder. With "keep", received items are moved into the stage first,
so the next run copies nothing. The benchmark runs in a process group of its own, SIGKILLed whole when it
passes its "timeout" (exit 124) or when the ssh session that started it ends (the workstation gave up, or
died): the device never keeps a benchmark running, even one that ignores SIGHUP and SIGTERM.
"""

PROBE = r"""
import hashlib, json, os, platform, sys
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
print(json.dumps({"python": platform.python_version(), "executable": sys.executable, "edgekit": version(),
                  "machine": platform.machine(), "present": [k for k in sys.argv[2:] if staged(k)]}))
"""

RUN = r"""
import hashlib, json, os, shutil, signal, subprocess, sys, tarfile, tempfile, threading, time
spec = json.loads(sys.argv[1])
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
    parent = os.getppid()
    def watch():  # the ssh session ended (the workstation gave up or died): stop the benchmark's whole group
        while child.poll() is None:
            if os.getppid() != parent:
                os.killpg(child.pid, signal.SIGKILL)
                return
            time.sleep(0.5)
    threading.Thread(target=watch, daemon=True).start()
    try:
        out, err = child.communicate(timeout=spec["timeout"])
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the group: what the benchmark started goes too
        child.wait()
        fail("timed out (--timeout %g s); the device stopped the benchmark" % spec["limit"], 124)
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
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(code)
"""
