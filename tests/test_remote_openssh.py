"""System tier (`python -m pytest -q -m system`, after `apt-get install openssh-server`): every `--on HOST`
test of tests/test_remote.py again, against OpenSSH's own sshd, the second server. The default tier runs
them on whichever server is there: asyncssh's stand-in on a fresh machine (tests/ssh_standin.py), which is
how CI runs the default tier (sshd hidden); this tier keeps them true on the server devices really run."""

from __future__ import annotations

import pytest

from sshd import LoopbackSSHD, openssh_sshd
from test_remote import *  # noqa: F401,F403  the same tests, collected again here under the system mark

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """OpenSSH's sshd on 127.0.0.1; a missing one fails the tier (it is what the tier is for)."""
    if openssh_sshd() is None:
        pytest.fail("OpenSSH's sshd is not installed: the system tier needs `apt-get install openssh-server`")
    with LoopbackSSHD(tmp_path_factory.mktemp("openssh")) as server:
        assert server.sshd is not None and server.kind.startswith("OpenSSH's sshd"), server.kind
        yield server
