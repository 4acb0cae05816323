"""Parking while the only broker is frozen (SIGSTOP): sends that once could not park.

A retried transaction id whose first attempt the checker rolled back, and a first send
to a topic the producer has not used yet: each parks as any other send does, and the
checker publishes it exactly once when Kafka is back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox import EndStatus, LocalTransactionState, Message, SendStatus, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.errors import MessageTooLargeError
from outbox.protocol import DiscardReason, RealRecord, TopicNames
from outbox.sql.log import transaction_log_table
from outbox_checker.discard import read_discards
from tests.checker.support import SkewedClock, wait_for
from tests.checker.test_status import outbox
from tests.fixtures.kafka import set_topic_config
from tests.producer.conftest import OutboxTopics
from tests.sql.conftest import GROUP, Database, database_on
from tests.sql.test_parked import checker_for, parking, publish_parked, published

pytestmark = pytest.mark.kafka


class EndLost:
    """A service that died after writing its half: the local transaction never ran."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        raise AssertionError("a dead service answers nothing")  # pragma: no cover


def own_topics(broker: Any, name: str, *more: str) -> OutboxTopics:
    """The outbox topics of prefix ``name``, its real topic, and the ``more`` real topics."""
    names = TopicNames(name)
    topics = OutboxTopics(broker.bootstrap_servers, names, f"{name}-events")
    real = [TopicSpec(topic, 1, 1) for topic in (topics.real_topic, *more)]
    ensure_topics(AdminClient(topics.client_config), [*plan_topics(names, 3, 1, (GROUP,)), *real])
    return topics


@pytest.fixture(params=[("sqlite_url", "sync"), ("postgres_url", "async")], ids=str)
def away_database(request: pytest.FixtureRequest) -> Iterator[Database]:
    url_fixture, kind = request.param
    if url_fixture == "postgres_url":
        request.applymarker(pytest.mark.postgres)
    yield from database_on(request.getfixturevalue(url_fixture), kind)


def rolled_back_ids(database: Database) -> set[str]:
    table = transaction_log_table(database.target.table, database.target.schema)
    with database.engine.connect() as connection:
        rows = connection.execute(sa.select(table.c.transaction_id).where(table.c.rolled_back))
        return {row.transaction_id for row in rows}


def test_a_retried_id_parks_over_its_rolled_back_attempt_and_is_published_once(
    own_kafka_broker: Any, away_database: Database
):
    """Attempt 1 of each id wrote its half and died; the checker answered ROLLBACK for it.
    With the broker frozen, attempt 2 (sent, and joined to the caller's session) parks,
    takes the id over, and is published once; attempt 1 never."""
    database = away_database
    topics = own_topics(own_kafka_broker, "parkretry")
    retried = {"send": "order-send", "joined": "order-joined"}
    with TransactionProducer(GROUP, EndLost(), topics.settings()) as dead:
        for txid in retried.values():
            first = dead.send_message_in_transaction(
                Message(topics.real_topic, b"attempt-1", key=txid, transaction_id=txid), None
            )
            assert first.end_status is EndStatus.LEFT_UNKNOWN
    clock = SkewedClock(120)  # attempt 1 is due, and past the grace period
    with checker_for(database, topics, clock) as checker:
        checker.run_round()
        wait_for(
            lambda: rolled_back_ids(database) == set(retried.values()),
            what="the check-backs' ROLLBACK of attempt 1",
        )

    producer = database.producer(database.listener(), parking(topics, 0.5)).start()
    try:
        warm = producer.send_message_in_transaction(
            Message(topics.real_topic, b"warm"), {"id": "warm"}
        )
        with own_kafka_broker.frozen():
            sent = producer.send_message_in_transaction(
                Message(topics.real_topic, b"attempt-2", transaction_id=retried["send"]),
                {"id": "o-send"},
            )
            joined = _joined(database, producer, topics, retried["joined"])
    finally:
        producer.shutdown()
    for result in (sent, joined):
        assert result.local_transaction_error is None, result.local_transaction_error
        assert (result.send_status, result.end_status) == (SendStatus.PARKED, EndStatus.PARKED)
    assert database.order_rows() == {
        "warm": warm.transaction_id,
        "o-send": retried["send"],
        "o-joined": retried["joined"],
    }

    with checker_for(database, topics, clock) as checker:
        publish_parked(checker, clock, topics, expected=3)
    events = published(topics)
    assert Counter(e.transaction_id for e in events) == {
        warm.transaction_id: 1,
        retried["send"]: 1,
        retried["joined"]: 1,
    }
    assert b"attempt-1" not in {e.value for e in events}


def _joined(database: Database, producer: Any, topics: OutboxTopics, txid: str) -> Any:
    """Attempt 2 of ``txid`` in the caller's own session (``producer.transaction``)."""
    message = Message(topics.real_topic, b"attempt-2", transaction_id=txid)
    if database.kind == "sync":
        with (
            producer.transaction(message) as txn,
            Session(database.engine) as session,
            session.begin(),
        ):
            database.insert_order(session, txn.message, {"id": "o-joined"})
            txn.join(session)
        return txn.result
    engine, loop = database.async_parts()

    async def send() -> Any:
        async with producer.producer.transaction(message) as txn, AsyncSession(engine) as session:
            await session.begin()
            row = {"id": "o-joined", "transaction_id": txn.message.transaction_id}
            await session.execute(sa.insert(database.orders).values(**row))
            await txn.join(session)
            await session.commit()
        return txn.result

    return loop.run(send())


def test_the_first_send_to_a_topic_parks_and_is_checked_when_published(
    own_kafka_broker: Any, sqlite_url: str
):
    """With the broker frozen, sends to topics the producer has not sent to yet park as
    sends to a known one do: the event to a topic that exists is published once; the one
    over its topic's limit, and the one to a topic that does not exist, are discarded by
    the relay as unpublishable, with the reason, as any committed event it cannot write.
    Only what the producer can tell without Kafka (its client's own limit) is refused."""
    databases = database_on(sqlite_url, "sync")
    database = next(databases)
    fresh, small = "parknew-fresh", "parknew-small"
    topics = own_topics(own_kafka_broker, "parknew", fresh, small)
    set_topic_config(AdminClient(topics.client_config), small, "max.message.bytes", "2000")
    producer = database.producer(database.listener(), parking(topics, 0.5)).start()
    try:
        warm = producer.send_message_in_transaction(
            Message(topics.real_topic, b"warm"), {"id": "warm"}
        )
        with own_kafka_broker.frozen():
            sends = {
                "fresh": Message(fresh, b"{}"),
                "small": Message(small, b"x" * 5000),
                "missing": Message("parknew-no-such-topic", b"{}"),
            }
            results = {
                name: producer.send_message_in_transaction(message, {"id": name})
                for name, message in sends.items()
            }
            with pytest.raises(MessageTooLargeError, match=r"message\.max\.bytes"):
                producer.send_message_in_transaction(
                    Message(fresh, b"x" * 1_100_000), {"id": "huge"}
                )
    finally:
        producer.shutdown()
    try:
        for result in results.values():
            assert (result.send_status, result.end_status) == (
                SendStatus.PARKED,
                EndStatus.PARKED,
            ), result
        assert set(database.order_rows()) == {"warm", "fresh", "small", "missing"}

        clock = SkewedClock(120)
        with checker_for(database, topics, clock) as checker:
            publish_parked(checker, clock, topics, expected=1)  # the warm-up's
            wait_for(
                lambda: (
                    len(read_discards(topics.client_config, topics.names)) >= 2
                    and bool(topics.read(fresh))
                ),
                what="the parked sends published or discarded",
            )
        assert [e.transaction_id for e in published(topics)] == [warm.transaction_id]
        assert [RealRecord.from_record(r).transaction_id for r in topics.read(fresh)] == [
            results["fresh"].transaction_id
        ]
        assert topics.read(small) == []
        discarded = {
            d.half.transaction_id: d.record
            for d in read_discards(topics.client_config, topics.names)
            if d.half is not None and d.record is not None
        }
        assert set(discarded) == {
            results["small"].transaction_id,
            results["missing"].transaction_id,
        }
        assert {d.reason for d in discarded.values()} == {DiscardReason.UNPUBLISHABLE}
        assert "max.message.bytes" in (discarded[results["small"].transaction_id].detail or "")
        assert "does not exist" in (discarded[results["missing"].transaction_id].detail or "")
    finally:
        databases.close()


def test_status_shows_the_parked_sends_and_says_kafka_did_not_answer(
    own_kafka_broker: Any, sqlite_url: str
):
    """``outbox status --db`` while the broker is frozen: the parked line, then one error
    line saying Kafka did not answer, and exit code 1 (as any error the outbox raises)."""
    databases = database_on(sqlite_url, "sync")
    database = next(databases)
    try:
        topics = own_topics(own_kafka_broker, "parkstatus")
        producer = database.producer(database.listener(), parking(topics, 0.5)).start()
        where = [
            "--bootstrap-servers", topics.bootstrap, "--topic-prefix", topics.names.prefix,
            "--db", database.url, "--db-table", database.target.table,
        ]  # fmt: skip
        try:
            with own_kafka_broker.frozen():
                parked = producer.send_message_in_transaction(
                    Message(topics.real_topic, b"{}"), {"id": "o-1"}
                )
                assert parked.send_status is SendStatus.PARKED
                shown = outbox("status", *where)
        finally:
            producer.shutdown()
    finally:
        databases.close()
    assert shown.returncode == 1, (shown.stdout, shown.stderr)
    assert "parked in the transaction log: 1 send(s) waiting to be published" in shown.stdout
    errors = [line for line in shown.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, shown.stderr
    assert errors[0].startswith("outbox: error: ")
    assert "Kafka" in errors[0] and "did not answer" in errors[0], errors[0]
