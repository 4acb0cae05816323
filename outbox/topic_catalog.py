"""What the producer must know about topics before it writes: existence, size limits.

Looked up once per topic and cached, so validation costs a dictionary lookup
on the hot path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from outbox.access import raise_if_configs_refused, raise_if_not_described
from outbox.errors import InvalidMessageError, KafkaUnavailableError

_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


@dataclass(frozen=True)
class TopicFacts:
    name: str
    partitions: int
    max_message_bytes: int


class TopicFactsSource(Protocol):
    """What the producer reads topics' facts from: a :class:`TopicCatalog`, or the
    in-memory broker's (:mod:`outbox.testing`)."""

    def known(self, topic: str) -> TopicFacts | None:
        """Facts of ``topic`` if already at hand: never waits for the cluster."""
        ...

    def get(self, topic: str) -> TopicFacts:
        """Facts of ``topic``; :class:`InvalidMessageError` if it does not exist."""
        ...


class TopicCatalog:
    def __init__(self, admin: AdminClient, timeout: float, principal: str | None = None) -> None:
        self._admin = admin
        self._principal = principal
        self._timeout = timeout
        self._facts: dict[str, TopicFacts] = {}
        self._lock = threading.Lock()

    def known(self, topic: str) -> TopicFacts | None:
        """Facts of ``topic`` if already looked up: never waits for the cluster."""
        return self._facts.get(topic)

    def get(self, topic: str) -> TopicFacts:
        """Facts of ``topic``; :class:`InvalidMessageError` if it does not exist."""
        facts = self._facts.get(topic)
        if facts is None:
            with self._lock:
                facts = self._facts.get(topic) or self._look_up(topic)
                self._facts[topic] = facts
        return facts

    def _look_up(self, topic: str) -> TopicFacts:
        try:
            metadata = self._admin.list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"cannot look up topic {topic!r}: {exc}") from None
        described = metadata.topics.get(topic)
        # Refused, not "does not exist": a relay would discard what the topic takes.
        raise_if_not_described(topic, described, self._principal)
        if described is None or not described.partitions:
            raise InvalidMessageError(
                f"topic {topic!r} does not exist on the cluster; create it first"
            )
        return TopicFacts(topic, len(described.partitions), self._max_message_bytes(topic))

    def _max_message_bytes(self, topic: str) -> int:
        """The topic's limit; the broker default when the configs cannot be read, unless the
        authoriser refused them (a relay would otherwise discard records the topic takes)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            entries = self._admin.describe_configs([resource])[resource].result(self._timeout)
            return int(entries["max.message.bytes"].value)
        except KafkaException as exc:
            raise_if_configs_refused(topic, exc, self._principal)
        except TimeoutError:
            raise KafkaUnavailableError(
                f"cannot read the configs of topic {topic!r}: no answer within {self._timeout:g}s"
            ) from None
        except (KeyError, ValueError):
            pass
        return _DEFAULT_MAX_MESSAGE_BYTES
