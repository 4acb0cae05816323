"""Errors the sink raises on purpose, each naming the problem and the fix.

They derive from :class:`outbox.errors.OutboxError`, so ``outbox sink`` reports
them as one ``outbox: error: ...`` line with exit code 1 instead of a Python or
Java stack trace.
"""

from __future__ import annotations

from outbox.errors import OutboxError


class SinkError(OutboxError):
    """The sink cannot run, or stopped; the message says why."""


class SparkJarsError(SinkError):
    """Spark's Kafka source could not be resolved or is not on the classpath."""


class KafkaSourceError(SinkError):
    """The brokers do not answer, or a topic to read does not exist."""


class OutputPathError(SinkError):
    """The table path cannot be written."""


class CheckpointError(SinkError):
    """The checkpoint cannot be used: unwritable, unreadable or corrupt."""
