"""One checker replica of the chaos run: ``outbox checker``, with pauses the controller arms.

``python -m outbox_devtools.chaos.checker_process`` runs the checker as ``outbox
checker`` does. Once the file named by ``OUTBOX_CHAOS_ARM_FILE`` exists, the next
round chunk that puts halves back pauses after its copies are stored and before its
check requests are written, inside its Kafka transaction, printing ``MID-CHUNK``,
so the controller can SIGKILL the replica with the transaction open: its copies
sit on the half partition past the last stable offset until the restarted replica
fences the transaction or the coordinator aborts it.

Once the file named by ``OUTBOX_CHAOS_DRAIN_ARM_FILE`` exists, the next chunk that
drains parked sends pauses after its halves are stored and before their COMMIT ops
are written, printing ``MID-DRAIN``, so the controller can freeze the replica past
its session with the drain's transaction open: a zombie drain when it resumes.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from outbox.protocol import CheckRequest, OpRecord, OutgoingRecord
from outbox_checker import round_writer

ARM_FILE_VARIABLE = "OUTBOX_CHAOS_ARM_FILE"
MID_CHUNK = "MID-CHUNK"
DRAIN_ARM_FILE_VARIABLE = "OUTBOX_CHAOS_DRAIN_ARM_FILE"
MID_DRAIN = "MID-DRAIN"
PAUSE_SECONDS = 5.0
"""Long enough for the controller (a 0.2 s tick) to read the marker and strike."""


def pause_if_armed(variable: str, marker: str) -> None:
    """Once the file ``variable`` names exists: remove it, print ``marker``, pause."""
    arm = os.environ.get(variable)
    if arm and Path(arm).exists():
        Path(arm).unlink(missing_ok=True)
        print(marker, flush=True)
        time.sleep(PAUSE_SECONDS)


class PausingCheckRequest(CheckRequest):
    """A check request that, armed, announces the open chunk and pauses before it is built."""

    def to_record(self, *args: Any, **kwargs: Any) -> OutgoingRecord:
        pause_if_armed(ARM_FILE_VARIABLE, MID_CHUNK)
        return super().to_record(*args, **kwargs)


class PausingOpRecord(OpRecord):
    """The round writer's ops are the drained halves' COMMITs: armed, the first of a
    drain's announces its open transaction (halves stored) and pauses before it is built."""

    def to_record(self, *args: Any, **kwargs: Any) -> OutgoingRecord:
        pause_if_armed(DRAIN_ARM_FILE_VARIABLE, MID_DRAIN)
        return super().to_record(*args, **kwargs)


def main() -> None:
    round_writer.CheckRequest = PausingCheckRequest  # type: ignore[misc]
    round_writer.OpRecord = PausingOpRecord  # type: ignore[misc]
    (script,) = entry_points(group="console_scripts", name="outbox")
    sys.argv = ["outbox", "checker"]
    script.load()()


if __name__ == "__main__":
    main()
