"""``park_when_unavailable``: sends go on while Kafka is away; the checker publishes them once.

On a real broker and a real database (SQLite and PostgreSQL, sync and asyncio).
A send parks when its half is not acknowledged within ``park_after_seconds``:
here a deadline far below a broker's answer (every send parks, and its half is
stored a moment later: the race of a late acknowledgement, every time), and a
broker frozen or stopped while orders keep coming.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox import EndStatus, Message, ProducerSettings, SendStatus, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.errors import ConfigurationError, InvalidMessageError
from outbox.protocol import HalfRecord, OpRecord, RealRecord, Resolution, TopicNames
from outbox.sql.log import transaction_log_table
from outbox_checker.service import Checker
from tests.checker.support import SkewedClock, running_checker, wait_for
from tests.checker.test_status import outbox
from tests.producer.conftest import OutboxTopics
from tests.sql.conftest import GROUP, Database, database_on

pytestmark = pytest.mark.kafka

INSTANT = 1e-6
"""A deadline no broker meets: every send parks, and its own half is stored just after."""


def parking(topics: OutboxTopics, park_after_seconds: float = INSTANT) -> Any:
    return topics.settings(park_when_unavailable=True, park_after_seconds=park_after_seconds)


def orders(count: int, failing: int) -> list[tuple[Message, dict[str, Any]]]:
    """``count`` orders, the last ``failing`` of which roll back (the business raises)."""
    sends = []
    for number in range(count):
        order: dict[str, Any] = {"id": f"o-{number}"}
        if number >= count - failing:
            order["fail"] = ValueError("card declined")
        sends.append((Message("placeholder", b"{}", key=order["id"]), order))
    return sends


def to(topic: str, sends: list[tuple[Message, dict[str, Any]]]) -> list[tuple[Message, Any]]:
    return [(Message(topic, m.value, key=m.key), order) for m, order in sends]


def published(topics: OutboxTopics) -> list[RealRecord]:
    return [RealRecord.from_record(r) for r in topics.read(topics.real_topic)]


def halves_of(topics: OutboxTopics) -> list[HalfRecord]:
    return [HalfRecord.from_record(r) for r in topics.read(topics.names.half)]


def ops_of(topics: OutboxTopics) -> list[OpRecord]:
    return [OpRecord.from_record(r) for r in topics.read(topics.names.op)]


def parked_rows(database: Database) -> dict[str, tuple[bool, int | None]]:
    """transaction id -> (still parked, half offset) of every committed row."""
    table = transaction_log_table(database.target.table, database.target.schema)
    with database.engine.connect() as connection:
        rows = connection.execute(
            sa.select(table.c.transaction_id, table.c.parked_half, table.c.half_offset).where(
                ~table.c.rolled_back
            )
        ).all()
    return {row.transaction_id: (row.parked_half is not None, row.half_offset) for row in rows}


def checker_for(database: Database, topics: OutboxTopics, clock: SkewedClock) -> Any:
    return running_checker(
        topics,
        clock,
        relay=True,
        resolve_from_db=database.url,
        db_table=database.target.table,
    )


def publish_parked(checker: Checker, clock: SkewedClock, topics: OutboxTopics, expected: int):
    """A round (the sends' own late halves are checked), the drain, a round again."""
    checker.run_round()
    drained = sum(report.drained for report in checker.drain_parked())
    clock.skew += 60
    checker.run_round()
    wait_for(lambda: len(published(topics)) >= expected, what="the parked sends published")
    time.sleep(1.5)  # a second publication would show by now
    return drained


def test_every_send_parks_and_each_committed_one_is_published_once(
    database: Database, outbox_topics: OutboxTopics
):
    sends = to(outbox_topics.real_topic, orders(6, failing=2))
    with database.producer(database.listener(), parking(outbox_topics)) as producer:
        results = [producer.send_message_in_transaction(m, order) for m, order in sends]
    assert {r.send_status for r in results} == {SendStatus.PARKED}
    assert [r.end_status for r in results] == [EndStatus.PARKED] * 4 + [EndStatus.ROLLED_BACK] * 2
    assert {r.half_offset for r in results} == {None}
    committed = {r.transaction_id for r in results[:4]}
    assert set(database.order_rows().values()) == committed
    assert {txid: parked for txid, (parked, _) in parked_rows(database).items()} == dict.fromkeys(
        committed, True
    )
    # The race: every send's own half reached Kafka after the send had given up on it.
    late = {h.transaction_id for h in halves_of(outbox_topics) if h.parked_ms is None}
    assert late == {r.transaction_id for r in results}

    clock = SkewedClock(120)  # the late halves are due, and past the grace period
    with checker_for(database, outbox_topics, clock) as checker:
        assert publish_parked(checker, clock, outbox_topics, expected=4) == 4
        assert sum(report.drained for report in checker.drain_parked()) == 0  # nothing left

    events = published(outbox_topics)
    assert Counter(e.transaction_id for e in events) == dict.fromkeys(committed, 1)
    assert {e.key for e in events} == {b"o-0", b"o-1", b"o-2", b"o-3"}
    rows = parked_rows(database)
    assert {txid: parked for txid, (parked, _) in rows.items()} == dict.fromkeys(committed, False)
    # Each committed row names the half the checker wrote; the sends' own halves were
    # answered ROLLBACK (their rows were parked, or named the checker's half).
    drained = {h.transaction_id: h for h in halves_of(outbox_topics) if h.parked_ms is not None}
    assert set(drained) == committed
    decided = {(op.transaction_id, op.resolution) for op in ops_of(outbox_topics)}
    assert {(txid, Resolution.ROLLBACK) for txid in late} <= decided
    assert {(txid, Resolution.COMMIT) for txid in committed} <= decided


@pytest.fixture
def sync_database(database_url: str) -> Iterator[Database]:
    yield from database_on(database_url, "sync")


def test_the_callers_transaction_parks_too(sync_database: Database, outbox_topics: OutboxTopics):
    database = sync_database
    with TransactionProducer(GROUP, database.listener(), parking(outbox_topics)) as producer:
        first, second = (Message(outbox_topics.real_topic, b"{}", key=k) for k in ("o-1", "o-2"))
        with (
            producer.transaction(first) as txn,
            Session(database.engine) as session,
            session.begin(),
        ):
            database.insert_order(session, txn.message, {"id": "o-1"})
            txn.join(session)
        with producer.transaction(second) as gone, Session(database.engine) as session:
            session.begin()
            database.insert_order(session, gone.message, {"id": "o-2"})
            gone.join(session)
            session.rollback()
    assert txn.result is not None and gone.result is not None
    assert (txn.result.send_status, txn.result.end_status) == (SendStatus.PARKED, EndStatus.PARKED)
    assert gone.result.end_status is EndStatus.ROLLED_BACK
    clock = SkewedClock(120)
    with checker_for(database, outbox_topics, clock) as checker:
        publish_parked(checker, clock, outbox_topics, expected=1)
    assert [e.transaction_id for e in published(outbox_topics)] == [txn.result.transaction_id]


@pytest.fixture
def async_database(database_url: str) -> Iterator[Database]:
    yield from database_on(database_url, "async")


def test_the_callers_transaction_parks_too_with_asyncio(
    async_database: Database, outbox_topics: OutboxTopics
):
    database = async_database
    engine, loop = database.async_parts()
    producer = database.producer(database.listener(), parking(outbox_topics))
    producer.start()

    async def send(order_id: str, *, commit: bool) -> Any:
        message = Message(outbox_topics.real_topic, b"{}", key=order_id)
        async with (
            producer.producer.transaction(message) as txn,
            AsyncSession(engine) as session,
        ):
            await session.begin()
            row = {"id": order_id, "transaction_id": txn.message.transaction_id}
            await session.execute(sa.insert(database.orders).values(**row))
            await txn.join(session)
            await (session.commit() if commit else session.rollback())
        return txn.result

    try:
        kept, gone = loop.run(send("o-1", commit=True)), loop.run(send("o-2", commit=False))
    finally:
        producer.shutdown()
    assert (kept.send_status, kept.end_status) == (SendStatus.PARKED, EndStatus.PARKED)
    assert gone.end_status is EndStatus.ROLLED_BACK
    assert database.order_rows() == {"o-1": kept.transaction_id}
    clock = SkewedClock(120)
    with checker_for(database, outbox_topics, clock) as checker:
        publish_parked(checker, clock, outbox_topics, expected=1)
    assert [e.transaction_id for e in published(outbox_topics)] == [kept.transaction_id]


def test_the_parked_events_of_a_key_are_published_in_their_order(
    sync_database: Database, outbox_topics: OutboxTopics
):
    database = sync_database
    sends = [
        (Message(outbox_topics.real_topic, b"%d" % n, key="customer-7"), {"id": f"o-{n}"})
        for n in range(5)
    ]
    with database.producer(database.listener(), parking(outbox_topics)) as producer:
        results = [producer.send_message_in_transaction(m, o) for m, o in sends]
    assert {r.send_status for r in results} == {SendStatus.PARKED}
    clock = SkewedClock(120)
    with checker_for(database, outbox_topics, clock) as checker:
        publish_parked(checker, clock, outbox_topics, expected=5)
    assert [e.value for e in published(outbox_topics)] == [b"0", b"1", b"2", b"3", b"4"]


def test_a_drain_interrupted_after_kafkas_commit_is_confirmed_not_written_again(
    sync_database: Database, outbox_topics: OutboxTopics
):
    """The state a crash between the drain's Kafka commit and its row update leaves: the
    half and its COMMIT op in Kafka, the row still parked with its claim. A drain that
    only looked at the row would write (and publish) the event a second time. A row
    claimed by a drain whose Kafka transaction never committed is written once."""
    database = sync_database
    listener = database.listener()
    table = transaction_log_table(database.target.table)
    with database.producer(listener, parking(outbox_topics)) as producer:
        (first,) = [
            producer.send_message_in_transaction(m, o) for m, o in one("o-1", outbox_topics)
        ]
        interrupted = first.transaction_id
        with database.engine.connect() as connection:
            (parked_half,) = connection.execute(
                sa.select(table.c.parked_half).where(table.c.transaction_id == interrupted)
            ).one()
        clock = SkewedClock(120)
        with checker_for(database, outbox_topics, clock) as checker:
            assert sum(report.drained for report in checker.drain_parked()) == 1
            (second,) = [
                producer.send_message_in_transaction(m, o) for m, o in one("o-2", outbox_topics)
            ]
            claimed_only = second.transaction_id
            with database.engine.begin() as connection:
                # Back to what a crash before the row's update leaves (its claim from before
                # the write), and the other row claimed by a drain that wrote nothing.
                connection.execute(
                    table.update()
                    .where(table.c.transaction_id == interrupted)
                    .values(parked_half=parked_half, half_offset=None, drain_from_offset=0)
                )
                connection.execute(
                    table.update()
                    .where(table.c.transaction_id == claimed_only)
                    .values(drain_from_offset=0)
                )
            reports = checker.drain_parked()
            assert (sum(r.drained for r in reports), sum(r.recovered for r in reports)) == (1, 1)
            wait_for(lambda: len(published(outbox_topics)) >= 2, what="both published")
            time.sleep(1.5)
    events = published(outbox_topics)
    assert Counter(e.transaction_id for e in events) == {interrupted: 1, claimed_only: 1}
    drained = [h.transaction_id for h in halves_of(outbox_topics) if h.parked_ms is not None]
    assert sorted(drained) == sorted([interrupted, claimed_only])
    assert {txid: parked for txid, (parked, _) in parked_rows(database).items()} == {
        interrupted: False,
        claimed_only: False,
    }


def one(order_id: str, topics: OutboxTopics) -> list[tuple[Message, dict[str, Any]]]:
    return [(Message(topics.real_topic, b"{}", key=order_id), {"id": order_id})]


@pytest.mark.postgres
@pytest.mark.parametrize(("fault", "kind"), [("frozen", "sync"), ("stopped", "async")])
def test_orders_are_taken_while_the_only_broker_is_away(
    own_kafka_broker, postgres_url: str, fault: str, kind: str
):
    """The broker frozen (SIGSTOP) or stopped while orders keep coming: each send parks
    after its 0.5 s instead of waiting its send timeout (600 s here), and once the broker
    is back every committed order is published exactly once, no rolled-back one."""
    names = TopicNames(f"park{fault}")
    topics = OutboxTopics(own_kafka_broker.bootstrap_servers, names, f"park{fault}-events")
    ensure_topics(
        AdminClient(topics.client_config),
        [*plan_topics(names, 3, 1, (GROUP,)), TopicSpec(topics.real_topic, 1, 1)],
    )
    databases = database_on(postgres_url, kind)
    database = next(databases)
    try:
        sends = to(topics.real_topic, orders(5, failing=1))
        settings = topics.settings(
            park_when_unavailable=True, park_after_seconds=0.5, send_timeout_seconds=600
        )
        producer = database.producer(database.listener(), settings).start()
        try:
            producer.send_message_in_transaction(Message(topics.real_topic, b"{}"), {"id": "warm"})
            away = own_kafka_broker.frozen() if fault == "frozen" else _stopped(own_kafka_broker)
            with away:
                took, results = [], []
                for message, order in sends:
                    started = time.monotonic()
                    results.append(producer.send_message_in_transaction(message, order))
                    took.append(time.monotonic() - started)
        finally:
            producer.shutdown()
        assert {r.send_status for r in results} == {SendStatus.PARKED}, results
        assert max(took) < 300, took  # parked, not the send timeout waited out
        committed = {r.transaction_id for r in results[:4]}
        clock = SkewedClock(120)
        with checker_for(database, topics, clock) as checker:
            publish_parked(checker, clock, topics, expected=5)  # and the warm-up send
        counts = Counter(e.transaction_id for e in published(topics))
        assert {txid: n for txid, n in counts.items() if txid in committed} == dict.fromkeys(
            committed, 1
        )
        assert sum(counts.values()) == 5
    finally:
        databases.close()


class _stopped:
    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def __enter__(self) -> None:
        self._broker.stop()

    def __exit__(self, *exc_info: object) -> None:
        self._broker.start()


def test_parking_needs_a_sql_listener():
    class Plain:
        def execute_local_transaction(self, message, arg):
            return None

        def check_local_transaction(self, message):
            return None

    settings = ProducerSettings(bootstrap_servers="localhost:9092", park_when_unavailable=True)
    with pytest.raises(ConfigurationError, match=r"park_when_unavailable .* SqlTransaction"):
        TransactionProducer(GROUP, Plain(), settings)


def test_a_caller_may_not_set_the_parked_half(database: Database, outbox_topics: OutboxTopics):
    with (
        database.producer(database.listener(), parking(outbox_topics)) as producer,
        pytest.raises(InvalidMessageError, match="parked_half is set by the producer"),
    ):
        producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"{}", parked_half=b"{}"), {"id": "o-1"}
        )


def test_status_shows_the_sends_parked_in_the_log(
    sync_database: Database, outbox_topics: OutboxTopics
):
    database = sync_database
    sends = to(outbox_topics.real_topic, orders(3, failing=1))
    with database.producer(database.listener(), parking(outbox_topics)) as producer:
        results = [producer.send_message_in_transaction(m, order) for m, order in sends]
    where = [
        "--bootstrap-servers", outbox_topics.bootstrap, "--topic-prefix",
        outbox_topics.names.prefix, "--db", database.url, "--db-table", database.target.table,
    ]  # fmt: skip
    as_json = outbox("status", *where, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    parked = json.loads(as_json.stdout)["parked"]
    partitions = Counter(str(r.half_partition) for r in results[:2])
    assert (parked["rows"], parked["partitions"]) == (2, dict(partitions))
    assert parked["oldest_age_seconds"] >= 0
    as_table = outbox("status", *where)
    assert as_table.returncode == 0, as_table.stderr
    assert "parked in the transaction log: 2 send(s) waiting to be published" in as_table.stdout
    clock = SkewedClock(120)
    with checker_for(database, outbox_topics, clock) as checker:
        checker.drain_parked()
    drained = outbox("status", *where)
    assert "parked in the transaction log: none" in drained.stdout, drained.stdout


@pytest.mark.parametrize("seconds", [0, -1, "soon"])
def test_a_park_deadline_that_is_not_a_positive_duration_is_refused(seconds: object):
    with pytest.raises(ValueError, match="park_after_seconds"):
        ProducerSettings(bootstrap_servers="localhost:9092", park_after_seconds=seconds)


def test_status_names_an_unreachable_or_unmigrated_log(
    sync_database: Database, outbox_topics: OutboxTopics
):
    where = ["--bootstrap-servers", outbox_topics.bootstrap, "--prefix", outbox_topics.names.prefix]
    unreachable = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    down = outbox("status", *where, "--db", unreachable)
    assert down.returncode == 1
    assert "cannot reach the database" in down.stderr, down.stderr
    missing = outbox("status", *where, "--db", sync_database.url, "--db-table", "no_such_log")
    assert missing.returncode == 1
    assert "does not exist" in missing.stderr and "outbox db upgrade" in missing.stderr
