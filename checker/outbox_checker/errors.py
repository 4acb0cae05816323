"""The checker's own errors, in one place; each derives from the outbox's error root.

``retriable`` says whether the same call may succeed if tried again (as confluent-kafka's
``KafkaError.retriable()``): a call stuck on a slow or lost broker may; a fence says another
party owns the work now, and trying again as this one cannot.
"""

from __future__ import annotations

from outbox.errors import KafkaUnavailableError, OutboxError


class FencedError(OutboxError):
    """Another replica owns the partition now; this round's chunk was not written."""


class StuckError(OutboxError):
    """The call did not return by its deadline; it goes on in its abandoned thread."""

    retriable = True


class ResumeFencedError(OutboxError):
    """Another ``outbox discard resume`` started meanwhile and took over."""


class ShortHalfRead(KafkaUnavailableError):
    """Reading a half partition ended before offsets its readable end lies beyond: a
    replica answered from an older log. Retriable (the relay reads its batch again).
    """

    retriable = True

    def __init__(self, partition: int, offsets: list[int]) -> None:
        shown = ", ".join(str(offset) for offset in offsets[:5])
        more = f" and {len(offsets) - 5} more" if len(offsets) > 5 else ""
        super().__init__(
            f"reading half partition {partition} ended before offset {shown}{more}, below "
            "its readable end (a replica answering from an older log); the batch is read again"
        )
        self.partition = partition
        self.offsets = offsets
