"""The checker's own errors, in one place; each derives from the outbox's error root.

``retriable`` says whether the same call may succeed if tried again (as confluent-kafka's
``KafkaError.retriable()``): a call stuck on a slow or lost broker may; a fence says another
party owns the work now, and trying again as this one cannot.
"""

from __future__ import annotations

from outbox.errors import OutboxError


class FencedError(OutboxError):
    """Another replica owns the partition now; this round's chunk was not written."""


class StuckError(OutboxError):
    """The call did not return by its deadline; it goes on in its abandoned thread."""

    retriable = True


class ResumeFencedError(OutboxError):
    """Another ``outbox discard resume`` started meanwhile and took over."""
