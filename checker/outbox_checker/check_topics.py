"""The check topics a round writes to: made by the checker when a group has none yet.

A check request goes to the check topic of the half's producer group. A group whose
producers never ran (a half written by a tool, a group renamed) has no check topic,
and the round's transaction would fail on it; the checker makes it, with as many
partitions as the half topic, once per group and process.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from outbox.admin import TopicSpec, ensure_topics
from outbox.errors import KafkaUnavailableError, TopicAdminError
from outbox.protocol import TopicNames


class CheckTopics:
    def __init__(self, admin: AdminClient, topics: TopicNames) -> None:
        self._admin = admin
        self._topics = topics
        self._known: set[str] = set()

    def ensure(self, groups: set[str]) -> None:
        """Make the check topics of ``groups`` this process has not yet seen made."""
        missing = groups - self._known
        if not missing:
            return
        half = self._topics.half
        try:
            partitions = len(self._admin.list_topics(half, timeout=30).topics[half].partitions)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"partitions of {half}: {exc}") from None
        specs = [TopicSpec(self._topics.check(g), max(1, partitions)) for g in sorted(missing)]
        try:
            ensure_topics(self._admin, specs)
        except TopicAdminError as exc:
            raise KafkaUnavailableError(f"cannot create check topics: {exc}") from None
        self._known |= missing
