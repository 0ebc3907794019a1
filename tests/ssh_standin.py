"""An SSH server that stands in for OpenSSH's sshd in the `--on HOST` tests where sshd is not installed
(tests/sshd.py picks it): asyncssh's server in a process of its own on 127.0.0.1, running a session as sshd
does (openssh-portable session.c, serverloop.c) so that the tests see what a device would:

- a process per connection, the parent of the session's shell; it exits when its connection ends;
- the command through the user's login shell (its passwd entry, or --login-shell) as `SHELL -c COMMAND`,
  in a new session (setsid), in $HOME, with sshd's environment only (USER, LOGNAME, HOME, PATH, MAIL,
  SHELL, SSH_CLIENT, SSH_CONNECTION; TZ where sshd has it), nothing of the test process's;
- stdin, stdout and stderr over the channel through pipes; the exit status, or the signal, sent back;
- a dropped connection closes the pipes and nothing else: no signal to the shell or its process group (as
  sshd does for a session without a terminal), so the device's own watch is what stops a benchmark.

    python tests/ssh_standin.py --host-key KEY --authorized-keys FILE --port-file FILE [--login-shell SH]

It listens on a free port the kernel picks (written to --port-file: two pytest-xdist workers never
collide), accepts only the authorized keys, and stops when it is terminated or its parent goes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import signal
import socket
import sys
import warnings

warnings.filterwarnings("ignore")  # asyncssh's import warns of DSA's deprecation; nothing reads this log
import asyncssh  # noqa: E402

# sshd's PATH for a session, as Debian builds it (--with-default-path, --with-superuser-path)
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def log(message: str) -> None:
    print(f"ssh_standin[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def session_env(user: pwd.struct_passwd, shell: str, process: asyncssh.SSHServerProcess) -> dict[str, str]:
    """The environment sshd gives a session (session.c do_setup_env, no PAM, no AcceptEnv)."""
    peer, peer_port = process.get_extra_info("peername")[:2]
    local, local_port = process.get_extra_info("sockname")[:2]
    env = {"USER": user.pw_name, "LOGNAME": user.pw_name, "HOME": user.pw_dir,
           "PATH": ROOT_PATH if user.pw_uid == 0 else USER_PATH, "MAIL": f"/var/mail/{user.pw_name}",
           "SHELL": shell, "SSH_CLIENT": f"{peer} {peer_port} {local_port}",
           "SSH_CONNECTION": f"{peer} {peer_port} {local} {local_port}"}
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    return env


async def start_shell(process: asyncssh.SSHServerProcess, login_shell: str | None) -> asyncio.subprocess.Process:
    """The login shell with the client's command (`sh -c COMMAND`; a login shell `-sh` without one), its
    stdin, stdout and stderr pipes redirected to the channel. stdin goes through asyncio's stream writer:
    asyncssh's own pipe writer can close the pipe with data still queued (CPython 3.11's write pipe
    transport closes once it resumes its protocol while EOF is pending), which cut off the end of a tar."""
    user = pwd.getpwnam(process.get_extra_info("username"))
    shell = login_shell or user.pw_shell or "/bin/sh"
    name = os.path.basename(shell)
    argv = [name, "-c", process.command] if process.command is not None else ["-" + name]
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        child = await asyncio.create_subprocess_exec(
            *argv, executable=shell, stdin=asyncio.subprocess.PIPE, stdout=out_w, stderr=err_w,
            env=session_env(user, shell, process), cwd=user.pw_dir if os.path.isdir(user.pw_dir) else "/",
            start_new_session=True)
    except OSError:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    log(f"session of {user.pw_name}: pid {child.pid}, {shell} -c {(process.command or '')[:120]!r}")
    await process.redirect(stdin=child.stdin, stdout=out_r, stderr=err_r, send_eof=False)  # EOF once both end
    return child


async def session(process: asyncssh.SSHServerProcess, login_shell: str | None) -> None:
    """One session: sshd sends the exit status (or signal) once the shell has exited and its output ended."""
    try:
        child = await start_shell(process, login_shell)
    except (OSError, KeyError) as exc:
        process.stderr.write(f"ssh_standin: cannot run the login shell: {exc}\n".encode())
        process.exit(1)
        return
    code = await child.wait()
    try:
        await process.stdout.drain()  # the pipes' ends: what a background process still writes goes too
        await process.stderr.drain()
        process.stdout.write_eof()
    except (BrokenPipeError, ConnectionError):
        return  # the connection is gone: nobody to tell
    if code < 0:
        process.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
    else:
        process.exit(code)


async def serve(sock: socket.socket, opts: argparse.Namespace) -> None:
    """One connection, as sshd's per-connection process serves it: until the client closes or drops it."""
    try:
        conn = await asyncssh.run_server(
            sock, server_host_keys=[opts.host_key], authorized_client_keys=opts.authorized_keys, encoding=None,
            process_factory=lambda process: session(process, opts.login_shell), agent_forwarding=False,
            x11_forwarding=False, allow_scp=False)  # `scp` runs through the shell, as under sshd
    except (OSError, asyncssh.Error) as exc:
        log(f"connection refused: {exc}")
        return
    await conn.wait_closed()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def listen(port_file: str) -> socket.socket:
    """A socket on 127.0.0.1 at a port the kernel picks, written to `port_file` once it listens."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(1.0)  # the accept loop looks at its parent once a second
    with open(port_file + ".partial", "w") as f:
        f.write(str(listener.getsockname()[1]))
    os.replace(port_file + ".partial", port_file)
    return listener


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-key", required=True)
    parser.add_argument("--authorized-keys", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--login-shell", help="every user's login shell (default: the passwd entry's)")
    opts = parser.parse_args(argv)
    listener = listen(opts.port_file)
    parent = os.getppid()
    while os.getppid() == parent:  # the test process that started it went: so does the server
        _reap()
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:  # the connection's own process, as sshd forks one
            try:
                listener.close()
                sock.setblocking(True)
                asyncio.run(serve(sock, opts))
            finally:
                os._exit(0)
        sock.close()


if __name__ == "__main__":
    main()
