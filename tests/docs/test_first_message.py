"""The README's five-minute path runs as written: a broker, the topics, the checker, a script.

The shell block and ``first_message.py`` are taken from the README itself, so the
text a newcomer copies is the text tested. The broker is the one the block starts
(``outbox dev kafka start``), kept apart from any other by ``OUTBOX_DEV_HOME``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"\[start:five-minutes\](.*?)\[end:five-minutes\]", re.S)

pytestmark = pytest.mark.kafka


def fenced(text: str, language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", text, re.S)
    return block


def test_the_five_minute_path_runs_as_written(tmp_path: Path) -> None:
    (section,) = SECTION.findall((REPO / "README.md").read_text())
    (tmp_path / "first_message.py").write_text(fenced(section, "python"))
    (tmp_path / ".venv").symlink_to(sys.prefix)
    with socket.socket() as probe:  # the checker's probes: 9464 may be another's here
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    env = {
        **os.environ,
        "OUTBOX_DEV_HOME": str(tmp_path / "dev"),
        "OUTBOX_HTTP_ADDRESS": f"127.0.0.1:{free}",
    }
    env.pop("OUTBOX_BOOTSTRAP_SERVERS", None)
    shell = subprocess.Popen(
        ["bash", "-e", "-c", fenced(section, "bash")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(timeout=240)
    finally:
        subprocess.run([f"{sys.prefix}/bin/outbox", "dev", "kafka", "stop"], env=env, check=False)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
    log = (tmp_path / "checker.log").read_text() if (tmp_path / "checker.log").exists() else ""
    assert shell.returncode == 0, f"{output}\n--- checker.log ---\n{log[-3000:]}"
    saved = re.search(r"^saving order 1 in transaction (\S+)$", output, re.M)
    assert saved, output
    assert "local transaction: COMMIT_MESSAGE / COMMITTED" in output
    read_back = re.search(r"^read back: b'order-1' b'\{\"id\": 1\}' b'(\S+)'$", output, re.M)
    assert read_back, output
    assert read_back[1] == saved[1], "the event read back is not the one sent"
