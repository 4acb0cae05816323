"""The size limits a record meets on its way out: its topic's and the client's own.

The broker refuses a batch over the topic's ``max.message.bytes``; librdkafka
refuses, before sending, a record over its ``message.max.bytes`` (1 000 000 by
default, below the broker's 1 048 588) and reports it as the broker's
``MSG_SIZE_TOO_LARGE``. Checking both up front lets an error name the limit
that applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outbox.errors import InvalidMessageError, MessageTooLargeError
from outbox.protocol import HalfRecord, OutgoingRecord, TopicNames
from outbox.protocol.sizes import record_size, records_a_half_becomes
from outbox.topic_catalog import TopicFactsSource

LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``."""
CHECKER_MESSAGE_MAX_BYTES = 100 * 1024 * 1024
"""The checker's producers' ``message.max.bytes``: above any sane topic limit, so the topics'
limits are the ones that apply to the copies, check requests and real records they write."""
GROWTH_BYTES = 4096
"""More than any derived record adds to its half (headers, a discard's detail), or a put-back
copy or check request to the stored half it is made of."""


def client_message_max_bytes(client_config: Mapping[str, Any]) -> int:
    """The ``message.max.bytes`` a librdkafka client built from ``client_config`` enforces."""
    return int(client_config.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))


class SizeLimits:
    """Whether a record fits where it is going, and if not, which limit it breaks."""

    def __init__(self, catalog: TopicFactsSource, client_config: Mapping[str, Any]) -> None:
        self._catalog = catalog
        self.client_bytes = client_message_max_bytes(client_config)
        self._topic_bytes: dict[str, int | None] = {}
        self._smallest: dict[tuple[str, str], int] = {}
        """The smallest limit a half's records meet, per (real topic, producer group)."""
        self._smallest_of: dict[tuple[str, ...], int] = {}
        """The smallest limit of records to these topics (:meth:`smallest`)."""

    def topic_bytes(self, topic: str) -> int | None:
        """The topic's ``max.message.bytes``; None for a topic that does not exist.

        Remembered, absence too: a deployment without a discard topic would
        otherwise pay a metadata request on every send.
        """
        if topic not in self._topic_bytes:
            try:
                self._topic_bytes[topic] = self._catalog.get(topic).max_message_bytes
            except InvalidMessageError:
                self._topic_bytes[topic] = None
        return self._topic_bytes[topic]

    def known_topic_bytes(self, topic: str) -> int | None:
        """The topic's ``max.message.bytes`` if looked up already; None otherwise. Never waits."""
        if topic in self._topic_bytes:
            return self._topic_bytes[topic]
        facts = self._catalog.known(topic)
        return None if facts is None else facts.max_message_bytes

    def knows_half(self, half: HalfRecord) -> bool:
        """Whether :meth:`fitting_half_record` can check ``half`` without waiting."""
        return (half.real_topic, half.producer_group) in self._smallest

    def problem(
        self,
        what: str,
        record: OutgoingRecord,
        *,
        by_this_client: bool = True,
        known_only: bool = False,
    ) -> str | None:
        """Why ``record`` (described as ``what``) cannot be written; None when it can.

        ``by_this_client=False`` for a record another client will write: the
        checker's producers, whose own limit is above any topic's. ``known_only``:
        only the limits known without asking the cluster.
        """
        size = record_size(record)
        if by_this_client and size > self.client_bytes:
            return (
                f"its {what} would be about {size} bytes, over the client's message.max.bytes"
                f" of {self.client_bytes} (a Kafka client property)"
            )
        topic_limit = (self.known_topic_bytes if known_only else self.topic_bytes)(record.topic)
        if topic_limit is not None and size > topic_limit:
            return (
                f"its {what} would be about {size} bytes, over the max.message.bytes of"
                f" {topic_limit} of topic {record.topic!r}"
            )
        return None

    def smallest(self, topics: tuple[str, ...]) -> int:
        """The smallest limit a record written by this client to any of ``topics`` meets."""
        smallest = self._smallest_of.get(topics)
        if smallest is None:
            limits = [self.client_bytes, *filter(None, map(self.topic_bytes, topics))]
            smallest = self._smallest_of[topics] = min(limits)
        return smallest

    @staticmethod
    def topics_used(half: HalfRecord, topics: TopicNames) -> tuple[str, ...]:
        """The topics whose limits :meth:`fitting_half_record` looks up for ``half``."""
        return (topics.half, half.real_topic, topics.check(half.producer_group), topics.discard)

    def fitting_half_record(
        self, half: HalfRecord, topics: TopicNames, half_partition: int
    ) -> OutgoingRecord:
        """The half's record; refused, naming why, if any record it becomes would not fit."""
        half_record = half.to_record(topics, half_partition)
        key = (half.real_topic, half.producer_group)
        smallest = self._smallest.get(key)
        if smallest is None:
            topics_used = self.topics_used(half, topics)
            limits = [self.client_bytes, *filter(None, map(self.topic_bytes, topics_used))]
            smallest = self._smallest[key] = min(limits)
        if record_size(half_record) + GROWTH_BYTES <= smallest:
            return half_record  # the usual case: far from every limit
        self._refuse_if_too_large(half, topics, half_partition, known_only=False)
        return half_record

    def parked_half_record(
        self, half: HalfRecord, topics: TopicNames, half_partition: int
    ) -> OutgoingRecord:
        """The half's record for a send that parks before Kafka told its topics' limits.

        Refused only over a limit known without Kafka: the client's own, and those of
        topics looked up before. The relay checks the real record against its topic when
        it publishes it, and discards it with the reason if it does not fit, as it does
        any committed event it cannot write.
        """
        self._refuse_if_too_large(half, topics, half_partition, known_only=True)
        return half.to_record(topics, half_partition)

    def _refuse_if_too_large(
        self, half: HalfRecord, topics: TopicNames, half_partition: int, *, known_only: bool
    ) -> None:
        problems = (
            self.problem(what, record, by_this_client=what == "half record", known_only=known_only)
            for what, record in records_a_half_becomes(half, topics, half_partition)
        )
        problem = next(filter(None, problems), None)
        if problem is not None:
            raise MessageTooLargeError(f"message is too large: {problem}")
