"""Fixtures for the Spark sink: one SparkSession for the session, topics per test.

Starting a Spark driver costs seconds, so every in-process test shares one
``local[2]`` session (UI off, two shuffle partitions). Tests that need the
command line run it as a subprocess and pay for their own JVM; they are few.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import Row, SparkSession

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import Header, TopicNames
from outbox.reading import read_topic
from spark_sink.session import create_session
from spark_sink.settings import SinkSettings
from tests.fixtures.relay import running_relay

REAL_PARTITIONS = 2
GROUP = "orders"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = create_session(
        "local[2]",
        "outbox-sink-tests",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            # Tests are short: C2 compilation would cost more than it saves.
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        },
        delta=True,
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True)
def _no_query_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test must not leave a streaming query writing into the next one."""
    yield
    if "spark" in request.fixturenames:
        session: SparkSession = request.getfixturevalue("spark")
        for query in session.streams.active:
            query.stop()


class CommitOrRollback:
    """A local transaction answering with the state passed as ``arg``."""

    def execute_local_transaction(self, message: Message, arg: object) -> object:
        return arg

    def check_local_transaction(self, message: Message) -> object:
        return LocalTransactionState.ROLLBACK_MESSAGE


@dataclass
class SinkTopics:
    """One test's outbox topics and real topic, and ways to put records on them."""

    bootstrap: str
    names: TopicNames
    real_topic: str
    sent: dict[str, bytes] = field(default_factory=dict)

    @property
    def client_config(self) -> dict[str, Any]:
        """The library's client configuration: its clients log through ``logging``, so one
        still alive when a broker stops does not print its reconnect failures raw."""
        return kafka_client_config(self.bootstrap)

    @property
    def producer_settings(self) -> ProducerSettings:
        return ProducerSettings(bootstrap_servers=self.bootstrap, topic_prefix=self.names.prefix)

    def send(self, count: int, state: LocalTransactionState, prefix: str = "event") -> list[str]:
        """``count`` transactional sends through the real producer; returns their ids.

        The checker's relay runs meanwhile, as in a deployment, and the call returns
        once every commit is on the real topic.
        """
        ids = []
        with running_relay(self.client_config, self.names):
            with TransactionProducer(GROUP, CommitOrRollback(), self.producer_settings) as sender:
                for i in range(count):
                    value = f"{prefix}-{i}-{uuid.uuid4().hex[:6]}".encode()
                    result = sender.send_message_in_transaction(
                        Message(self.real_topic, value, key=f"k{i}"), arg=state
                    )
                    ids.append(result.transaction_id)
                    if state is LocalTransactionState.COMMIT_MESSAGE:
                        self.sent[result.transaction_id] = value
            deadline = time.monotonic() + 60
            while not set(self.sent) <= self.published():
                assert time.monotonic() < deadline, "the relay did not publish every commit"
                time.sleep(0.2)
        return ids

    def published(self) -> set[str]:
        """Transaction ids on the real topic now."""
        records = read_topic(self.client_config, self.real_topic, timeout=60)
        return {r.header_text(Header.TRANSACTION_ID.value) or "" for r in records}

    def publish(
        self,
        records: list[tuple[bytes, list[tuple[str, bytes]]]],
        *,
        abort: bool = False,
        timestamp_ms: int = 0,
    ) -> None:
        """Records (value, headers) straight onto the real topic in one Kafka transaction.

        ``timestamp_ms`` gives them that Kafka timestamp instead of now's.
        """
        producer = Producer(
            {
                **self.client_config,
                "transactional.id": f"test-{uuid.uuid4().hex}",
                "linger.ms": 0,
            }
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        for value, headers in records:
            producer.produce(
                self.real_topic,
                value=value,
                key=b"direct",
                headers=headers,
                timestamp=timestamp_ms,
            )
        producer.flush(30)
        if abort:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)

    @staticmethod
    def real_headers(transaction_id: str) -> list[tuple[str, bytes]]:
        """The headers a commit puts on a real record."""
        return [
            (Header.TRANSACTION_ID.value, transaction_id.encode()),
            (Header.PRODUCER_GROUP.value, GROUP.encode()),
        ]


@pytest.fixture
def sink_topics(kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str) -> SinkTopics:
    names = TopicNames(unique_prefix)
    real_topic = f"{unique_prefix}-events"
    ensure_topics(kafka_admin, [*plan_topics(names, 2), TopicSpec(real_topic, REAL_PARTITIONS, 1)])
    return SinkTopics(kafka_bootstrap, names, real_topic)


def sink_settings(where: SinkTopics, tmp_path: Path, **overrides: Any) -> SinkSettings:
    """Settings for a test run: small state, a short Kafka check, paths under tmp_path."""
    values: dict[str, Any] = {
        "bootstrap_servers": where.bootstrap,
        "topics": (where.real_topic,),
        "output": str(tmp_path / "table"),
        "checkpoint": str(tmp_path / "checkpoint"),
        "once": True,
        "shuffle_partitions": 2,
        "kafka_timeout_seconds": 10,
        "topic_prefix": where.names.prefix,
        **overrides,
    }
    return SinkSettings(**values)


def read_table(spark: SparkSession, path: Path | str, fmt: str = "parquet") -> list[Row]:
    """The table as Spark sees it (through ``_spark_metadata``: committed batches only)."""
    return spark.read.format(fmt).load(str(path)).collect()
