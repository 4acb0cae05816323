"""What the command-line tests share: ``outbox`` run as a user runs it, in its own process."""

from __future__ import annotations

import os
import subprocess
import sys


def outbox(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m outbox ARGS`` with no ``OUTBOX_*`` variable but ``env`` and no dev broker."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "OUTBOX_DEV_HOME": "/nonexistent-outbox-dev", "COLUMNS": "300", **env},
    )
