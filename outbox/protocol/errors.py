"""Typed errors of the wire protocol.

Every component decodes records that other processes (or other versions, or a
person with a console producer) wrote. A bad record must become a value the
caller can act on (the checker discards it with reason ``malformed``), never an
unhandled exception that stalls a partition.
"""

from __future__ import annotations

from outbox.errors import OutboxError


class ProtocolError(OutboxError, ValueError):
    """Base of everything the protocol module rejects (also a ``ValueError``: bad input)."""


class InvalidNameError(ProtocolError):
    """A topic prefix, producer group or topic name Kafka would not accept."""


class MalformedRecordError(ProtocolError):
    """A record that does not decode as the kind it was read as.

    ``field`` names the header (or ``key``/``value``) at fault, so logs and the
    discard record say exactly what was wrong.
    """

    def __init__(
        self,
        kind: str,
        field: str,
        problem: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.kind = kind
        self.field = field
        self.problem = problem
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = ""
        if topic is not None:
            where = f" at {topic}[{partition}]@{offset}"
        super().__init__(f"malformed {kind} record{where}: {field}: {problem}")
