"""A private OpenSSH server on 127.0.0.1 for the `--on HOST` tests: a throw-away host key and client key
in a temporary folder, started and stopped by the test session, never listening beyond loopback."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


class LoopbackSSHD:
    """`with LoopbackSSHD(folder) as d:` then `d.env` (EDGEKIT_SSH_COMMAND pointing at `d.config`) reaches
    the aliases `d.aliases` (this machine), `dead` (a closed port) and `nokey` (a key the server refuses)."""

    def __init__(self, folder: Path, aliases=("devA", "devB")):
        self.folder = folder
        self.aliases = aliases
        self.port = free_port()
        self.config = folder / "ssh_config"
        self.proc: subprocess.Popen | None = None

    def _write(self) -> None:
        f = self.folder
        _keygen(f / "host_key")
        _keygen(f / "client_key")
        _keygen(f / "stranger_key")
        (f / "authorized_keys").write_text((f / "client_key.pub").read_text())
        (f / "sshd_config").write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {f / 'host_key'}", f"PidFile {f / 'sshd.pid'}",
            f"AuthorizedKeysFile {f / 'authorized_keys'}", "StrictModes no", "UsePAM no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "MaxStartups 100",
            "MaxSessions 100", "LogLevel ERROR", ""]))
        common = ["  HostName 127.0.0.1", f"  User {getpass.getuser()}", "  IdentitiesOnly yes",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR"]
        lines = []
        for alias in self.aliases:
            lines += [f"Host {alias}", f"  Port {self.port}", f"  IdentityFile {f / 'client_key'}", *common]
        lines += ["Host dead", f"  Port {free_port()}", f"  IdentityFile {f / 'client_key'}", *common]
        lines += ["Host nokey", f"  Port {self.port}", f"  IdentityFile {f / 'stranger_key'}", *common]
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "EDGEKIT_SSH_COMMAND": f"ssh -F {self.config}"}

    def __enter__(self) -> "LoopbackSSHD":
        self._write()
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.folder / "sshd.log", "wb"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"sshd did not start: {(self.folder / 'sshd.log').read_text()[-500:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
