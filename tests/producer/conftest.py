"""Fixtures for producer tests: fresh outbox topics and a real topic per test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import AdminClient

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.protocol import RawRecord, TopicNames
from outbox.reading import read_topic
from tests.fixtures.relay import running_relay

HALF_PARTITIONS = 3


@dataclass
class OutboxTopics:
    """The topics one test owns, and ways to read them back."""

    bootstrap: str
    names: TopicNames
    real_topic: str

    @property
    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def settings(self, **overrides: object) -> ProducerSettings:
        return ProducerSettings(
            bootstrap_servers=self.bootstrap, topic_prefix=self.names.prefix, **overrides
        )

    def read(self, topic: str, isolation: str = "read_committed") -> list[RawRecord]:
        return read_topic(self.client_config, topic, isolation=isolation, timeout=60)


@pytest.fixture
def outbox_topics(
    kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str
) -> OutboxTopics:
    names = TopicNames(unique_prefix)
    real_topic = f"{unique_prefix}-events"
    ensure_topics(kafka_admin, [*plan_topics(names, HALF_PARTITIONS), TopicSpec(real_topic, 2, 1)])
    return OutboxTopics(kafka_bootstrap, names, real_topic)


@pytest.fixture
def relay(outbox_topics: OutboxTopics) -> Iterator[None]:
    """The checker's relay for the test's topics: commits reach the real topic."""
    with running_relay(outbox_topics.client_config, outbox_topics.names):
        yield


class ScriptedListener:
    """Answers each local transaction with the state passed as ``arg``.

    ``arg`` may also be an exception to raise, or a callable to run. Check
    answers come from ``check_answer`` and every checked message is recorded.
    """

    def __init__(self, check_answer: object = LocalTransactionState.COMMIT_MESSAGE) -> None:
        self.check_answer = check_answer
        self.checked: list[Message] = []
        self.executed: list[Message] = []
        self.check_called = threading.Event()

    def execute_local_transaction(self, message: Message, arg: object) -> object:
        self.executed.append(message)
        if isinstance(arg, BaseException):
            raise arg
        if callable(arg):
            return arg(message)
        return arg

    def check_local_transaction(self, message: Message) -> object:
        self.checked.append(message)
        self.check_called.set()
        if isinstance(self.check_answer, BaseException):
            raise self.check_answer
        if callable(self.check_answer):
            return self.check_answer(message)
        return self.check_answer


@pytest.fixture
def listener() -> ScriptedListener:
    return ScriptedListener()


@pytest.fixture
def producer(
    outbox_topics: OutboxTopics, listener: ScriptedListener
) -> Iterator[TransactionProducer]:
    with TransactionProducer("orders", listener, outbox_topics.settings()) as started:
        yield started
