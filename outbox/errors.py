"""Errors the outbox raises to its callers, one type per thing that can go wrong.

Each message names the problem and, where there is one, the fix.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base of every error the outbox raises on purpose."""


class ConfigurationError(OutboxError, ValueError):
    """A setting is missing or invalid."""


class KafkaUnavailableError(OutboxError):
    """The Kafka cluster did not answer in time."""


class TopicAdminError(OutboxError):
    """Creating or checking the outbox topics failed."""


class TopicMismatchError(TopicAdminError):
    """Existing topics disagree with what the outbox needs (e.g. partition counts)."""
