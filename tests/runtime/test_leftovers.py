"""The suite's leftovers check (``make test`` runs inside it): real processes and files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
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
    assert run_contained([sys.executable, "-c", LEAKY], exit_grace=1.0) == 1
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


JVM_LIKE = textwrap.dedent(
    """
    import os, pathlib
    around = pathlib.Path(os.environ["TMPDIR"]).parent
    (around / "blockmgr-left-by-a-test").mkdir()
    (around / "libsnappyjava-left-by-a-test.so").write_bytes(b"")
    """
)


def test_a_jvm_temp_file_left_beside_the_runs_directory_fails_the_run(capfd) -> None:
    """A JVM ignores TMPDIR: what it unpacks into the directory around the run counts too."""
    assert run_contained([sys.executable, "-c", JVM_LIKE]) == 1
    err = capfd.readouterr().err
    assert "left outside it, by a JVM" in err
    assert "blockmgr-left-by-a-test" in err and "libsnappyjava-left-by-a-test.so" in err
    around = Path(tempfile.gettempdir())
    shutil.rmtree(around / "blockmgr-left-by-a-test")
    (around / "libsnappyjava-left-by-a-test.so").unlink()


ENDS_A_MOMENT_LATER = textwrap.dedent(
    """
    import os, subprocess, tempfile
    work = tempfile.mkdtemp(prefix="spark-")
    subprocess.Popen(
        ["sh", "-c", f"sleep 2; rm -r {work}"], cwd=work, start_new_session=True
    )
    """
)


def test_a_process_that_ends_on_its_own_a_moment_after_the_run_is_not_a_leftover(
    capfd,
) -> None:
    """A Spark driver's JVM exits after the Python that started it, then cleans up."""
    assert run_contained([sys.executable, "-c", ENDS_A_MOMENT_LATER]) == 0
    assert "left things behind" not in capfd.readouterr().err
