"""``outbox checker --resolve-from-db``: resolved from the SQL log, with no producer running."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox.protocol import OpRecord, RealRecord, Resolution
from outbox.sql import create_engine, upgrade
from tests.checker.support import (
    SkewedClock,
    check_requests,
    ensure_check_topic,
    pending_half,
    running_checker,
    wait_for,
    write,
)
from tests.fixtures.postgres import fresh_database
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def database(request) -> Iterator[str]:
    """A database of the test's own: the default log table and ``orders`` in it.

    On PostgreSQL a fresh database on the shared server, so the default table
    names used here never meet other tests' tables.
    """
    with contextlib.ExitStack() as stack:
        url = request.getfixturevalue(request.param)
        if request.param == "postgres_url":
            url = stack.enter_context(fresh_database(url))
        upgrade(url)
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)"))
        engine.dispose()
        yield url


def ops(topics: OutboxTopics) -> list[OpRecord]:
    return [OpRecord.from_record(r) for r in topics.read(topics.names.op)]


def real(topics: OutboxTopics) -> list[RealRecord]:
    return [RealRecord.from_record(r) for r in topics.read(topics.real_topic)]


def test_producer_killed_after_db_commit_is_published_once_by_the_checker(
    outbox_topics: OutboxTopics, database: str
):
    process = subprocess.Popen(
        [
            sys.executable, "-m", "outbox_devtools.demo_crash", outbox_topics.bootstrap,
            outbox_topics.names.prefix, outbox_topics.real_topic, database, "7",
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("DB_COMMITTED "), line
        transaction_id = line.split()[1]
    finally:
        process.kill()
        process.wait(30)
    assert real(outbox_topics) == []  # the producer never ended it

    clock = SkewedClock(30)
    with running_checker(outbox_topics, clock, relay=True, resolve_from_db=database) as checker:
        for _ in range(3):
            checker.run_round()
            clock.skew += 60
        wait_for(lambda: len(real(outbox_topics)) == 1, what="the relay")
        time.sleep(1)  # a second publication would show by now
    (event,) = real(outbox_topics)
    assert (event.transaction_id, event.value) == (transaction_id, b'{"order": 7}')
    (op,) = ops(outbox_topics)
    assert (op.transaction_id, op.resolution) == (transaction_id, Resolution.COMMIT)
    engine = create_engine(database)
    with sessionmaker(engine)() as session:
        assert session.execute(sa.text("SELECT id FROM orders")).scalars().all() == [7]
    engine.dispose()


def test_no_row_after_the_grace_period_is_rolled_back(outbox_topics: OutboxTopics, database: str):
    write(
        outbox_topics,
        pending_half(outbox_topics, "never-committed").to_record(outbox_topics.names, 0),
    )
    with running_checker(outbox_topics, SkewedClock(120), resolve_from_db=database) as checker:
        report = checker.run_round()
    assert report.checks_sent == 0
    assert [(o.transaction_id, o.resolution) for o in ops(outbox_topics)] == [
        ("never-committed", Resolution.ROLLBACK)
    ]
    assert real(outbox_topics) == []


def test_young_without_row_falls_back_to_asking_producers(
    outbox_topics: OutboxTopics, database: str
):
    ensure_check_topic(outbox_topics)
    fresh = pending_half(outbox_topics, "in-flight", age_seconds=0)
    write(outbox_topics, fresh.to_record(outbox_topics.names, 0))
    # 10 s old to the checker: due for a check, but well inside the 60 s grace.
    with running_checker(outbox_topics, SkewedClock(10), resolve_from_db=database) as checker:
        assert checker.run_round().checks_sent == 1
    assert [r.half.transaction_id for r in check_requests(outbox_topics)] == ["in-flight"]
    assert ops(outbox_topics) == []


def test_database_down_falls_back_to_asking_producers(outbox_topics: OutboxTopics):
    ensure_check_topic(outbox_topics)
    write(outbox_topics, pending_half(outbox_topics, "db-down").to_record(outbox_topics.names, 0))
    unreachable = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    with running_checker(outbox_topics, SkewedClock(600), resolve_from_db=unreachable) as checker:
        assert checker.run_round().checks_sent == 1
    assert ops(outbox_topics) == []
