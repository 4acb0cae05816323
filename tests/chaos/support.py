"""What the suite's short chaos runs share: the command, and every default fault turned off."""

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
