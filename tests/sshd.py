"""A private SSH server on 127.0.0.1 for the `--on HOST` tests: OpenSSH's sshd where it is installed, else
asyncssh's server standing in for it (tests/ssh_standin.py, a session run as sshd runs one); a throw-away
host key and client key in a temporary folder, started and stopped by the test session, never listening
beyond loopback. `server_kind()` says which (pytest's header prints it)."""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

STANDIN = Path(__file__).with_name("ssh_standin.py")


def openssh_sshd() -> str | None:
    """OpenSSH's sshd where it is installed and can run (CI's stand-in step mounts /dev/null over it)."""
    for path in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def server_kind(login_shell: str | None = None) -> str:
    """Which server LoopbackSSHD(login_shell=...) runs, in words."""
    sshd = None if login_shell else openssh_sshd()
    if sshd:
        return f"OpenSSH's sshd ({sshd})"
    shell = login_shell or pwd.getpwuid(os.getuid()).pw_shell
    try:
        standin = f"asyncssh {version('asyncssh')}"
    except PackageNotFoundError:  # a runtime-only venv (.ci/arm.py): its tests need no SSH server
        return "no sshd and no asyncssh (pip install -e '.[dev]' for the --on tests)"
    return f"{standin} standing in for sshd (tests/ssh_standin.py), login shell {shell}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


class LoopbackSSHD:
    """`with LoopbackSSHD(folder) as d:` then `d.env` (EDGEKIT_SSH_COMMAND pointing at `d.config`) reaches
    the aliases `d.aliases` (this machine), `dead` (a closed port) and `nokey` (a key the server refuses).
    OpenSSH's sshd where it is installed; asyncssh's stand-in where not, or where a test sets `login_shell`
    (the shell every session runs in: sshd takes the passwd entry's)."""

    def __init__(self, folder: Path, aliases=("devA", "devB"), login_shell: str | None = None):
        self.folder = folder
        self.aliases = aliases
        self.login_shell = login_shell
        self.sshd = None if login_shell else openssh_sshd()
        self.kind = server_kind(login_shell)
        self.port = 0
        self.config = folder / "ssh_config"
        self.proc: subprocess.Popen | None = None
        self._closed: socket.socket | None = None  # the `dead` port: bound, never listening, so refused

    def __repr__(self) -> str:
        return f"<LoopbackSSHD 127.0.0.1:{self.port}: {self.kind}>"

    def _keys(self) -> None:
        f = self.folder
        _keygen(f / "host_key")
        _keygen(f / "client_key")
        _keygen(f / "stranger_key")
        (f / "authorized_keys").write_text((f / "client_key.pub").read_text())

    def _sshd_config(self) -> None:
        f = self.folder
        (f / "sshd_config").write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {f / 'host_key'}", f"PidFile {f / 'sshd.pid'}",
            f"AuthorizedKeysFile {f / 'authorized_keys'}", "StrictModes no", "UsePAM no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "MaxStartups 100",
            "MaxSessions 100", "LogLevel ERROR", ""]))

    def _client_config(self) -> None:
        f = self.folder
        self._closed = socket.socket()
        self._closed.bind(("127.0.0.1", 0))
        common = ["  HostName 127.0.0.1", f"  User {getpass.getuser()}", "  IdentitiesOnly yes",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR"]
        lines = []
        for alias in self.aliases:
            lines += [f"Host {alias}", f"  Port {self.port}", f"  IdentityFile {f / 'client_key'}", *common]
        lines += ["Host dead", f"  Port {self._closed.getsockname()[1]}", f"  IdentityFile {f / 'client_key'}", *common]
        lines += ["Host nokey", f"  Port {self.port}", f"  IdentityFile {f / 'stranger_key'}", *common]
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "EDGEKIT_SSH_COMMAND": f"ssh -F {self.config}"}

    def _wait_for(self, ready) -> bool:
        """True once `ready()`; False when the server exited first or 10 s passed."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if ready():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def _start_openssh(self) -> None:
        """sshd on a free port; another, should a pytest-xdist worker's server take it first (sshd writes
        its PidFile once it listens: a port that answers may be the other worker's)."""
        pid_file = self.folder / "sshd.pid"
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        for _ in range(5):
            self.port = free_port()
            self._sshd_config()
            pid_file.unlink(missing_ok=True)
            self.proc = subprocess.Popen([self.sshd, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                                         stdout=subprocess.DEVNULL, stderr=open(self.folder / "sshd.log", "wb"))
            if self._wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip() == str(self.proc.pid)):
                return
            self.__exit__()
        raise RuntimeError(f"sshd did not start: {(self.folder / 'sshd.log').read_text()[-500:]}")

    def _start_standin(self) -> None:
        """tests/ssh_standin.py on a port it binds itself (written to a file)."""
        f = self.folder
        port_file = f / "port"
        shell = ["--login-shell", self.login_shell] if self.login_shell else []
        self.proc = subprocess.Popen([sys.executable, str(STANDIN), "--host-key", str(f / "host_key"),
                                      "--authorized-keys", str(f / "authorized_keys"), "--port-file", str(port_file),
                                      *shell], stdout=subprocess.DEVNULL, stderr=open(f / "sshd.log", "wb"))
        if not self._wait_for(port_file.is_file):
            self.__exit__()
            raise RuntimeError(f"the SSH stand-in did not start: {(f / 'sshd.log').read_text()[-500:]}")
        self.port = int(port_file.read_text())

    def __enter__(self) -> "LoopbackSSHD":
        self._keys()
        if self.sshd:
            self._start_openssh()
        else:
            self._start_standin()
        self._client_config()
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        if self._closed is not None:
            self._closed.close()


if __name__ == "__main__":  # .ci/run: which server the tests start here (--standin: fail unless the stand-in)
    print(server_kind())
    if "--standin" in sys.argv[1:] and openssh_sshd() is not None:
        sys.exit(f"{openssh_sshd()} is still there: the tests would not run the stand-in")
