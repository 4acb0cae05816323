"""A checker replica frozen in the middle of a parked drain, on real processes and a real broker.

Two replicas share the half partitions; parked sends (``park_when_unavailable``) wait in
the transaction log. The owner of their partition is frozen (SIGSTOP) as soon as its
drain has written its first half, for longer than its group session and shorter than
its Kafka transaction timeout: the other replica takes the partition over while the
frozen one's Kafka transaction is still open, and the frozen one, once resumed, goes on
to commit it. Each parked send must reach its real topic once all the same.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from outbox import Message, SendStatus
from outbox.protocol import HalfRecord, RawRecord
from outbox.sql import LogTarget, downgrade, upgrade
from outbox.sql.log import transaction_log_table
from outbox_checker.kafka_reader import end_offsets
from tests.checker.support import ensure_check_topic, wait_for
from tests.checker.test_checker_processes import CheckerProcess
from tests.producer.conftest import OutboxTopics
from tests.sql.conftest import Database, database_on, unique_name
from tests.sql.test_parked import INSTANT, parking, published

pytestmark = pytest.mark.kafka

PARKED = 60
VALUE_BYTES = 400_000
"""Large parked events: the drain's one Kafka transaction takes long enough to be caught open."""
FROZEN_SECONDS = 14.0
"""Longer than the replicas' 6 s group session, shorter than their transaction timeout."""
KEY = "one-customer"
"""Every order of one key: the parked rows share a half partition."""


@pytest.fixture
def sync_database(sqlite_url: str) -> Iterator[Database]:
    yield from database_on(sqlite_url, "sync")


def replica(topics: OutboxTopics, database: Database, instance: str) -> CheckerProcess:
    return CheckerProcess(
        topics,
        instance,
        OUTBOX_RESOLVE_FROM_DB=database.url,
        OUTBOX_DB_TABLE=database.target.table,
        OUTBOX_DRAIN_INTERVAL_SECONDS="0.5",
        OUTBOX_KAFKA_TRANSACTION_TIMEOUT_MS="60000",
    )


def parked_elsewhere(database: Database, topics: OutboxTopics) -> tuple[LogTarget, set[str]]:
    """``PARKED`` committed orders parked in a log table no replica reads (yet)."""
    staging = LogTarget(unique_name("staging"))
    upgrade(database.engine, target=staging)
    value = b"x" * VALUE_BYTES
    with database.producer(
        database.listener(table=staging.table), parking(topics, INSTANT)
    ) as producer:
        results = [
            producer.send_message_in_transaction(
                Message(topics.real_topic, value, key=KEY), {"id": f"o-{number}"}
            )
            for number in range(PARKED)
        ]
    assert {r.send_status for r in results} == {SendStatus.PARKED}
    return staging, {r.transaction_id for r in results}


def move_rows(database: Database, staging: LogTarget) -> None:
    """Every parked row into the replicas' log at once, in one database transaction."""
    source = transaction_log_table(staging.table)
    target = transaction_log_table(database.target.table)
    with database.engine.begin() as connection:
        connection.execute(target.insert().from_select(source.c.keys(), sa.select(source)))


def first_parked_half(consumer: Consumer, deadline: float) -> RawRecord:
    while time.monotonic() < deadline:
        message = consumer.poll(0.01)
        if message is None or message.error() is not None:
            continue
        record = RawRecord.from_kafka(message)
        if HalfRecord.from_record(record).parked_ms is not None:
            return record
    raise AssertionError("no replica drained the parked rows")


def sync_every_append(admin: AdminClient, topic: str) -> None:
    """The broker syncs ``topic`` to disk after every append (``flush.messages=1``), so the
    drain's one transaction of many large halves stays open long enough to be caught."""
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("flush.messages", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def transaction_open(admin: AdminClient, topic: str, partition: int) -> bool:
    stable = end_offsets(admin, topic, [partition], IsolationLevel.READ_COMMITTED, 10)
    stored = end_offsets(admin, topic, [partition], IsolationLevel.READ_UNCOMMITTED, 10)
    return stable[partition] < stored[partition]


@pytest.mark.timeout(600)
def test_a_replica_frozen_mid_drain_publishes_nothing_twice(
    outbox_topics: OutboxTopics, sync_database: Database
) -> None:
    database = sync_database
    ensure_check_topic(outbox_topics)
    staging, committed = parked_elsewhere(database, outbox_topics)
    partition = _partition_of(database, staging)
    a = replica(outbox_topics, database, "replica-a")
    b = replica(outbox_topics, database, "replica-b")
    replicas = [a, b]
    admin = AdminClient(outbox_topics.client_config)
    sync_every_append(admin, outbox_topics.names.half)
    watcher = Consumer(
        {
            **outbox_topics.client_config,
            "group.id": unique_name("watcher"),
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    try:
        wait_for(
            lambda: (
                a.owned()
                and b.owned()
                and a.owned() | b.owned() == {0, 1, 2}
                and not a.owned() & b.owned()
            ),
            120,
            "both replicas to share the half partitions",
        )
        (owner,) = [r for r in replicas if partition in r.owned()]
        _, end = watcher.get_watermark_offsets(
            TopicPartition(outbox_topics.names.half, partition), 10
        )
        watcher.assign([TopicPartition(outbox_topics.names.half, partition, end)])
        move_rows(database, staging)
        first_parked_half(watcher, time.monotonic() + 120)
        os.kill(owner.process.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # what the broker had of the owner's requests is answered now
            assert transaction_open(admin, outbox_topics.names.half, partition), (
                "the owner's drain committed before it was frozen: nothing mid-drain to show"
            )
            time.sleep(FROZEN_SECONDS - 1.0)
        finally:
            os.kill(owner.process.pid, signal.SIGCONT)
        wait_for(lambda: not _still_parked(database), 180, "every parked row drained")
        wait_for(
            lambda: committed <= {e.transaction_id for e in published(outbox_topics)},
            180,
            "every parked send published",
        )
        time.sleep(3.0)  # a second publication would show by now
        events = Counter(e.transaction_id for e in published(outbox_topics))
        twice = sorted(txid for txid, count in events.items() if count > 1)
        assert not twice, f"{len(twice)} of {PARKED} parked sends published more than once"
        assert events == dict.fromkeys(committed, 1)
    finally:
        watcher.close()
        for process in replicas:
            if process.process.poll() is None:
                os.kill(process.process.pid, signal.SIGCONT)
                process.kill()
        downgrade(database.engine, "base", target=staging)


def _partition_of(database: Database, staging: LogTarget) -> int:
    table = transaction_log_table(staging.table)
    with database.engine.connect() as connection:
        (partition,) = connection.execute(sa.select(table.c.half_partition).distinct()).one()
    return int(partition)


def _still_parked(database: Database) -> list[Any]:
    table = transaction_log_table(database.target.table)
    with database.engine.connect() as connection:
        return list(
            connection.execute(
                sa.select(table.c.transaction_id).where(table.c.parked_half.is_not(None))
            )
        )
