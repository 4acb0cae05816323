"""Child-process plumbing shared by the local Kafka broker and PostgreSQL.

Both runtimes are real server processes started from the test session, the demo
or the CLI. The rules that keep a machine clean live here once: free loopback
ports, children that die with the process that started them (so an interrupted
or killed pytest never leaves a JVM behind), and a stop that asks politely
before it kills.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from outbox.maven import cache_dir

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when its parent goes away."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _start_detached() -> None:
    """Runs in the child before exec: own session, so Ctrl-C of the CLI spares it."""
    os.setsid()


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    detached: bool = False,
    user: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server process with stdout and stderr appended to ``log_path``.

    Attached children (the default) get SIGKILL from the kernel when the
    starting process dies, however it dies. ``detached`` is for
    ``outbox dev ... start``, whose server must outlive the command.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            user=user,
            preexec_fn=_start_detached if detached else die_with_parent,
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError, OSError):
        # Reap it if it is our own zombie child.
        finished, _ = os.waitpid(pid, os.WNOHANG)
        if finished == pid:
            return False
    return True


def stop_pid(pid: int, grace_seconds: float = 20.0) -> None:
    """SIGTERM, wait up to ``grace_seconds``, then SIGKILL. Quiet if already gone."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not wait_until(lambda: not pid_alive(pid), grace_seconds):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 10.0)


def kill_pid(pid: int) -> None:
    """SIGKILL, for crash tests: no shutdown hooks run."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10.0)


def wait_until(condition: Callable[[], bool], timeout_seconds: float, step: float = 0.1) -> bool:
    """Poll ``condition`` until it holds or the time is up; says which."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


def run_dump(argv: Sequence[str], error: type[Exception], what: str) -> None:
    """Run a database's dump tool (``pg_dump``, ``mariadb-dump``) to its end; ``error``
    naming ``what`` with the tool's own words if it failed."""
    result = subprocess.run(
        list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise error(f"{what} failed: {result.stderr.strip()}")


def log_tail(log_path: Path, lines: int = 40) -> str:
    """The end of a server log, for error messages that explain a failed start."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {log_path})"
    return "\n".join(text.splitlines()[-lines:])


def state_dir() -> Path:
    """Where ``outbox dev ... start`` records what it started: ``$OUTBOX_DEV_HOME``."""
    explicit = os.environ.get("OUTBOX_DEV_HOME")
    if explicit:
        return Path(explicit).expanduser()
    return cache_dir() / "dev"
