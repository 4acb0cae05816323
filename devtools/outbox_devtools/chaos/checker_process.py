"""One checker replica of the chaos run: ``outbox checker``, with a pause the controller arms.

``python -m outbox_devtools.chaos.checker_process`` runs the checker as ``outbox
checker`` does. Once the file named by ``OUTBOX_CHAOS_ARM_FILE`` exists, the next
round chunk that puts halves back pauses after its copies are stored and before its
check requests are written, inside its Kafka transaction, printing ``MID-CHUNK``,
so the controller can SIGKILL the replica with the transaction open: its copies
sit on the half partition past the last stable offset until the restarted replica
fences the transaction or the coordinator aborts it.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from outbox.protocol import CheckRequest, OutgoingRecord
from outbox_checker import round_writer

ARM_FILE_VARIABLE = "OUTBOX_CHAOS_ARM_FILE"
MID_CHUNK = "MID-CHUNK"
PAUSE_SECONDS = 5.0
"""Long enough for the controller (a 0.2 s tick) to read the marker and kill."""


class PausingCheckRequest(CheckRequest):
    """A check request that, armed, announces the open chunk and pauses before it is built."""

    def to_record(self, *args: Any, **kwargs: Any) -> OutgoingRecord:
        arm = os.environ.get(ARM_FILE_VARIABLE)
        if arm and Path(arm).exists():
            Path(arm).unlink(missing_ok=True)
            print(MID_CHUNK, flush=True)
            time.sleep(PAUSE_SECONDS)
        return super().to_record(*args, **kwargs)


def main() -> None:
    round_writer.CheckRequest = PausingCheckRequest  # type: ignore[misc]
    (script,) = entry_points(group="console_scripts", name="outbox")
    sys.argv = ["outbox", "checker"]
    script.load()()


if __name__ == "__main__":
    main()
