"""Every ``outbox`` error reaches the user whole, whatever the terminal's width.

A user in an 80-column terminal, a narrow pane or a CI log must read the whole
message: the path that is missing, the value that was refused, the variable to
set. The command runs as a user runs it, in its own process: on a real terminal
(a pseudo-terminal) 80 and 40 columns wide, and with no terminal at all (pipes).
No COLUMNS variable is set, as in an ordinary shell.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

LONG = "a-deliberately-long-name-that-no-40-column-terminal-can-hold-on-one-line"


def run_outbox(args: list[str], columns: int | None) -> tuple[int, str]:
    """Exit code and everything the command wrote, on a terminal ``columns`` wide
    (``None``: stdout and stderr are pipes)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH")}
    command = [sys.executable, "-m", "outbox", *args]
    if columns is None:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120
        )
        return done.returncode, done.stdout + done.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen(
        command, env=env, stdin=follower, stdout=follower, stderr=follower, start_new_session=True
    )
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError as exc:  # EIO: the command closed the terminal
            if exc.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    code = process.wait(120)
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def error_paths(tmp_path: Path) -> list[tuple[list[str], int, list[str]]]:
    """(arguments, exit code, fragments the output must hold unbroken) per error path."""
    missing = tmp_path / LONG / "NOPE.md"
    return [
        # A click usage error (a flag's file check) must name the whole path.
        (["config-reference", "--write", str(missing)], 2, [str(missing), "does not exist"]),
        # A flag value the settings refuse names its flag and its variable.
        (
            ["checker", "--check-interval-seconds", LONG],
            2,
            ["'--check-interval-seconds'", "'OUTBOX_CHECK_INTERVAL_SECONDS'"],
        ),
        # The outbox's own configuration errors name the value and the fix.
        (
            ["db", "upgrade", "--url", f"foo://somewhere/{LONG}"],
            1,
            [f"outbox: error: unsupported database URL scheme 'foo' in foo://somewhere/{LONG}"],
        ),
        (
            ["topics", "create", "--bootstrap", "127.0.0.1:1", "-X", LONG],
            1,
            [f"outbox: error: --kafka-property: Kafka property '{LONG}' is not KEY=VALUE"],
        ),
    ]


@pytest.mark.parametrize("columns", [80, 40, None], ids=["80-columns", "40-columns", "no-terminal"])
def test_every_error_is_printed_whole(tmp_path: Path, columns: int | None) -> None:
    for args, exit_code, fragments in error_paths(tmp_path):
        code, output = run_outbox(args, columns)
        assert code == exit_code, output
        for fragment in fragments:
            assert fragment in output, f"{args}: {fragment!r} is not whole in:\n{output}"
        assert "…" not in output, output


@pytest.mark.parametrize("command", [["checker"], ["sink"], ["db", "upgrade"], ["chaos"]])
def test_help_names_every_flag_and_variable_whole_on_an_80_column_terminal(
    command: list[str],
) -> None:
    """An option's name cut short (``--security-proto…``, ``OUTBOX_SSL_CA_FI…``) cannot be
    typed: a help screen is read on an ordinary terminal, and must hold each name whole."""
    code, output = run_outbox([*command, "--help"], 80)
    assert code == 0, output
    assert "…" not in output, output
