"""The suite's leftovers check (``make test`` runs inside it): real processes and files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from outbox_devtools.leftovers import run_contained

LEAKY = textwrap.dedent(
    """
    import os, subprocess, tempfile
    work = tempfile.mkdtemp(prefix="outbox-kafka-")
    open(os.path.join(work, "server.log"), "w").close()
    subprocess.Popen(["sleep", "300"], cwd=work, start_new_session=True)
    print(work)
    """
)


def test_a_run_that_leaves_a_process_and_a_directory_fails_and_is_cleaned_up(capfd) -> None:
    assert run_contained([sys.executable, "-c", LEAKY]) == 1
    out, err = capfd.readouterr()
    work = Path(out.strip())
    assert "the run left things behind" in err
    assert "process" in err and "sleep 300" in err
    assert f"left in place: {work.name}" in err
    assert not work.exists() and not work.parent.exists()
    running = subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True)
    leaked = [pid for pid in running.stdout.split() if _cwd(pid).startswith(str(work.parent))]
    assert not leaked


def test_a_clean_run_keeps_its_own_exit_status(capfd) -> None:
    tidy = "import tempfile, shutil; shutil.rmtree(tempfile.mkdtemp()); raise SystemExit(3)"
    assert run_contained([sys.executable, "-c", tidy]) == 3
    assert "left things behind" not in capfd.readouterr().err
    assert run_contained([sys.executable, "-c", "pass"]) == 0


def _cwd(pid: str) -> str:
    try:
        return str(Path(f"/proc/{pid}/cwd").readlink())
    except OSError:
        return ""
