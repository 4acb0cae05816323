"""What a run left behind: run a command in a temporary directory of its own, then look.

``python -m outbox_devtools.leftovers -- pytest ...`` runs the command with ``TMPDIR`` set
to a fresh directory, so every broker's, database's and Spark cluster's directory that
the run makes (``tempfile`` everywhere) lands there, and so do its children's. When the
command ends, whatever is still running from that directory (a process whose command
line or working directory names it) and whatever is still in it (but pytest's own
``tmp_path`` roots, which pytest keeps on purpose) was left behind: each is named, the
processes are killed, the directory is removed, and the exit status is 1 even if the
command passed. A machine whose disk fills fails every later command, so a run that
leaks must fail where the leak is made, not three runs later. A JVM does not read
``TMPDIR``: what one unpacks into the directory around the run's (:data:`JVM_TEMP_NAMES`)
while the run goes fails it too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEPT_ON_PURPOSE = ("pytest-of-",)
"""Entries a run may leave: pytest keeps its last three ``tmp_path`` roots for a reader."""

JVM_TEMP_NAMES = ("blockmgr-*", "spark-*", "artifacts-*", "*.so", "*.so.lck", "librocksdbjni*")
"""What a JVM puts in its ``java.io.tmpdir``, /tmp unless told otherwise (it does not read
``TMPDIR``): Spark's block managers, scratch and artifact directories, and the native
libraries snappy-java, lz4-java, zstd-jni and RocksDB unpack. A run whose JVMs are not
told finds them there, outside its own directory; they count as left behind."""


@dataclasses.dataclass(frozen=True)
class Leftovers:
    processes: list[tuple[int, str]]
    """(pid, command line) of each process still running from the run's directory."""
    entries: list[Path]
    """What is still in the run's directory."""
    outside: list[Path] = dataclasses.field(default_factory=list)
    """JVM temporary files (:data:`JVM_TEMP_NAMES`) new in the directory around the run's,
    since it started: reported, not removed (another run's JVM may be using them)."""

    def __bool__(self) -> bool:
        return bool(self.processes or self.entries or self.outside)


def find_leftovers(root: Path, *, exclude_pids: frozenset[int] = frozenset()) -> Leftovers:
    """The processes running from ``root`` and the entries left in it."""
    needle = str(root)
    processes = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in exclude_pids:
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            command = _cmdline(proc)
            if needle in command or cwd == needle or cwd.startswith(needle + os.sep):
                processes.append((int(proc.name), command or _command_of(proc)))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    entries = sorted(
        entry for entry in root.iterdir() if not entry.name.startswith(KEPT_ON_PURPOSE)
    )
    return Leftovers(sorted(processes), entries)


CMDLINE_WAIT_SECONDS = 1.0
"""How long an empty ``cmdline`` is asked again before the process's name stands in."""


def _command_of(proc: Path) -> str:
    """The command line of a process found with an empty one.

    Empty for a moment after an exec (the kernel closes the close-on-exec descriptors, on
    which ``subprocess.Popen`` returns, before it has put the new arguments in place; a
    loaded machine widens that window) and for a zombie: asked again for a moment, then
    the process's name (``comm``) in brackets.
    """
    deadline = time.monotonic() + CMDLINE_WAIT_SECONDS
    while not (command := _cmdline(proc)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return command or f"[{(proc / 'comm').read_text().strip()}]"


def _cmdline(proc: Path) -> str:
    return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


EXIT_GRACE_SECONDS = 15.0
"""How long a process still running from the run's directory is given to end on its own.
A Spark driver's JVM outlives the Python that started it by a moment: it exits when its
parent's pipe closes, then its shutdown hooks remove its scratch directories."""


def jvm_temp_entries(directory: Path) -> set[Path]:
    """The entries of ``directory`` named like a JVM's temporary files."""
    return {entry for pattern in JVM_TEMP_NAMES for entry in directory.glob(pattern)}


def run_contained(command: list[str], *, exit_grace: float = EXIT_GRACE_SECONDS) -> int:
    """Run ``command`` with a ``TMPDIR`` of its own; its exit status, or 1 if it left
    anything behind (named on standard error, then cleaned up). A process of the run still
    running is given ``exit_grace`` seconds to end on its own first."""
    around = Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="outbox-run-"))
    before = jvm_temp_entries(around)
    try:
        status = subprocess.call(command, env={**os.environ, "TMPDIR": str(root)})
        found = dataclasses.replace(
            _settled_leftovers(root, exit_grace), outside=sorted(jvm_temp_entries(around) - before)
        )
        if found:
            _report(root, found)
            for pid, _ in found.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _wait_until_gone([pid for pid, _ in found.processes])
            return status or 1
        return status
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _settled_leftovers(root: Path, exit_grace: float) -> Leftovers:
    """:func:`find_leftovers` once no process of the run is still ending on its own."""
    deadline = time.monotonic() + exit_grace
    while True:
        found = find_leftovers(root, exclude_pids=frozenset({os.getpid()}))
        if not found.processes or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


KILL_WAIT_SECONDS = 30.0
"""How long killed leftovers are given to exit: a SIGKILL is delivered at once, but the
process runs on until the kernel schedules its exit, longer on a loaded machine."""


def _wait_until_gone(pids: list[int]) -> None:
    """Until every one of ``pids`` has exited (gone, or a zombie no one reaped yet), so that
    nothing the run left still runs once it returns; a pid still running after
    :data:`KILL_WAIT_SECONDS` is named."""
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    running = list(pids)
    while running:
        running = [pid for pid in running if _still_running(pid)]
        if running and time.monotonic() >= deadline:
            print(f"killed but still running: {running}", file=sys.stderr)
            return
        if running:
            time.sleep(0.05)


def _still_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (its stat's state after the command)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _report(root: Path, found: Leftovers) -> None:
    lines = [f"the run left things behind in {root} (cleaned up now):"]
    lines += [f"  process {pid}: {command[:200]}" for pid, command in found.processes]
    lines += [f"  left in place: {entry.name}" for entry in found.entries]
    lines += [f"  left outside it, by a JVM: {entry}" for entry in found.outside]
    if found.outside:
        lines.append(
            "  (those outside are not removed: the check cannot tell a JVM of this run"
            " from another run's on the machine; give it -Djava.io.tmpdir)"
        )
    print("\n".join(lines), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m outbox_devtools.leftovers",
        description="Run a command in a temporary directory of its own and fail if it"
        " leaves a process running or a file there.",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: python -m outbox_devtools.leftovers -- COMMAND")
    return run_contained(command)


if __name__ == "__main__":
    sys.exit(main())
