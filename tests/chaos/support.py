"""What the suite's short chaos runs share: the command, every default fault turned off, and
how a run's outcome is read."""

import re
import subprocess
import sys

NO_DEFAULT_FAULTS = (
    "--producer-kills=0",
    "--checker-kills=0",
    "--broker-restarts=0",
    "--checker-outages=0",
    "--answering-producer-kills=0",
    "--broker-freezes=0",
    "--checker-freezes=0",
    "--mid-chunk-kills=0",
    "--discard-cycles=0",
    "--drain-freezes=0",
)
"""A run with these flags has only the faults a test turns on (and, on a cluster, its own)."""
NO_CLUSTER_FAULTS = ("--rolling-restarts=0", "--half-leader-kills=0", "--coordinator-kills=0")


def chaos(*arguments: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``outbox chaos ARGUMENTS`` in a process of its own, its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "outbox", "chaos", *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


STDERR_LINES = 40
"""How much of a failed run's stderr a report shows: its traceback and the broker log tail
a failed node start quotes, never so much that it hides the run's own story."""


def failure_report(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed run's assertion shows: its whole story (every fault line and the
    verdict, from stdout) and then the end of its stderr. The two used to be glued and
    cut to their last 5 000 characters, which a failed node start filled with broker log."""
    stderr = result.stderr.strip().splitlines()[-STDERR_LINES:]
    return "\n".join(
        [result.stdout.rstrip(), f"--- stderr, last {STDERR_LINES} lines ---", *stderr]
    )


def clean_verdict(
    result: subprocess.CompletedProcess[str],
    seed: int,
    *,
    raw_duplicates: str = "0",
    tail: str = "",
) -> re.Match[str]:
    """The run's last line, once the run exited 0: nothing lost, no phantom, no duplicate
    in the sink, no half pending, no orphan published. Named groups: ``transactions``,
    ``committed``, ``raw_duplicates`` (as ``raw_duplicates`` allows: ``0`` or a pattern) and
    those of ``tail`` (what follows the stall figures, e.g. the parking counts)."""
    assert result.returncode == 0, failure_report(result)
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        rf"chaos: seed={seed} transactions=(?P<transactions>\d+) committed=(?P<committed>\d+) "
        r"lost=0 phantom=0 duplicates_in_sink=0 "
        rf"raw_duplicates=(?P<raw_duplicates>{raw_duplicates}) pending=0 orphans_published=0 "
        r"publication_stall_s=[\d.]+ writable_stall_s=[\d.]+ owned_stall_s=[\d.]+" + tail,
        last,
    )
    assert found, f"{last}\n{failure_report(result)}"
    return found
