"""The shared scenario table (:mod:`tests.producer.scenarios`) on the real producers.

A real broker and the checker's relay: what reaches the real topic is what
the relay published. The in-memory producer runs the same rows in
``tests/testing/test_in_memory.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from outbox import ProducerSettings
from outbox.protocol import OpRecord, RawRecord
from tests.producer import scenarios
from tests.producer.conftest import HALF_PARTITIONS, OutboxTopics, ProducerType, ScriptedListener
from tests.producer.test_check_back import put_back_and_ask, wait_for

pytestmark = pytest.mark.kafka

SETTINGS = set(ProducerSettings.model_fields)


class RealWorld:
    def __init__(self, topics: OutboxTopics, producer_type: ProducerType) -> None:
        self.topics = topics
        self.real_topic = topics.real_topic
        self.names = topics.names
        self._producer_type = producer_type
        self._made: list[Any] = []

    def producer(self, listener: ScriptedListener, **options: Any) -> Any:
        settings = {k: v for k, v in options.items() if k in SETTINGS}
        others = {k: v for k, v in options.items() if k not in SETTINGS}
        producer = self.unstarted(listener, settings, **others)
        return producer.start()

    def unstarted(self, listener: Any, settings: dict[str, Any] | None = None, **others: Any):
        made = self._producer_type(
            "orders", listener, self.topics.settings(**(settings or {})), **others
        )
        self._made.append(made)
        return made

    def ops(self) -> list[OpRecord]:
        return [OpRecord.from_record(r) for r in self.topics.read(self.names.op)]

    def published(self) -> list[RawRecord]:
        wait_for(self._relay_caught_up, timeout=60)
        return self.topics.read(self.real_topic)

    def _relay_caught_up(self) -> bool:
        consumer = Consumer(
            {**self.topics.client_config, "group.id": f"{self.names.prefix}.checker.relay"}
        )
        try:
            partitions = [TopicPartition(self.names.op, p) for p in range(HALF_PARTITIONS)]
            committed = consumer.committed(partitions, timeout=10)
            for position in committed:
                _, high = consumer.get_watermark_offsets(position, timeout=10)
                if high > 0 and position.offset < high:
                    return False
            return True
        finally:
            consumer.close()

    def check_back(self, producer: Any, listener: ScriptedListener) -> None:
        before = len(self.ops())
        put_back_and_ask(self.topics)
        assert listener.check_called.wait(30)
        wait_for(lambda: len(self.ops()) > before)

    def close(self) -> None:
        for producer in self._made:
            producer.shutdown()


@pytest.fixture
def world(outbox_topics, producer_type, relay):
    made = RealWorld(outbox_topics, producer_type)
    yield made
    made.close()


class TestScenarioTable(scenarios.ScenarioTable):
    """The shared rows, on this module's ``world``."""
