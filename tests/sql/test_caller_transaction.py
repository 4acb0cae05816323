# ruff: noqa: SIM117 - the nesting a service writes: the outbox block, then its session
"""``producer.transaction(...)`` with the caller's own session, on a real broker and database.

The decision follows the database, never the ``with`` block: what each way of
ending the session's transaction writes on the op topic, and what the relay
publishes. Sync on PostgreSQL (on SQLite: the in-memory producer's test); the
asyncio form on both through the async drivers; the kill between the commit and
the decision, and a COMMIT whose connection is lost, on PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox import EndStatus, LocalTransactionState, Message, TransactionProducer
from outbox.caller_transaction import CallerTransactionError
from outbox.protocol import RealRecord, Resolution
from outbox.sql.errors import JoinError
from tests.producer.conftest import ScriptedListener
from tests.producer.test_check_back import ops_of, put_back_and_ask, wait_for
from tests.sql.conftest import (
    GROUP,
    Database,
    OutboxTopics,
    backend_killed_at_commit,
)

pytestmark = pytest.mark.kafka
postgres = pytest.mark.postgres

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
REPO_ROOT = Path(__file__).parents[2]


class Boom(Exception):
    pass


def events(topics: OutboxTopics) -> list[RealRecord]:
    return [RealRecord.from_record(r) for r in topics.read(topics.real_topic)]


def order(database: Database, txn, order_id: str = "o-1") -> sa.Insert:
    return sa.insert(database.orders).values(id=order_id, transaction_id=txn.transaction_id)


def message(topics: OutboxTopics) -> Message:
    return Message(topics.real_topic, b'{"id": "o-1"}', key="o-1")


def decided(topics: OutboxTopics, txn) -> list[Resolution]:
    return [op.resolution for op in ops_of(topics) if op.transaction_id == txn.transaction_id]


def committed_and_published(database: Database, topics: OutboxTopics, txn) -> None:
    assert txn.result.local_transaction_state is COMMIT
    assert txn.result.end_status is EndStatus.COMMITTED
    assert decided(topics, txn) == [Resolution.COMMIT]
    assert database.order_rows() == {"o-1": txn.transaction_id}
    assert set(database.log_rows()) == {txn.transaction_id}
    wait_for(lambda: len(events(topics)) == 1)
    assert [e.transaction_id for e in events(topics)] == [txn.transaction_id]


def rolled_back(database: Database, topics: OutboxTopics, txn) -> None:
    assert txn.result.local_transaction_state is ROLLBACK
    assert txn.result.end_status is EndStatus.ROLLED_BACK
    assert decided(topics, txn) == [Resolution.ROLLBACK]
    assert database.order_rows() == {}
    assert database.log_rows() == {}


@pytest.fixture
def sync_database(postgres_url: str):
    """PostgreSQL, the production database (SQLite: tests/testing and the asyncio tests here)."""
    from tests.sql.conftest import database_on

    yield from database_on(postgres_url, "sync")


@pytest.fixture
def producer(sync_database: Database, outbox_topics: OutboxTopics):
    with TransactionProducer(GROUP, sync_database.listener(), outbox_topics.settings()) as started:
        yield started


@postgres
def test_commit_of_the_callers_session_commits(sync_database, outbox_topics, relay, producer):
    with producer.transaction(message(outbox_topics)) as txn:
        assert txn.message.half_offset is not None  # the half is written on entry
        with Session(sync_database.engine) as session, session.begin():
            session.execute(order(sync_database, txn))
            txn.join(session)
    committed_and_published(sync_database, outbox_topics, txn)


@postgres
def test_an_error_after_the_commit_still_commits(sync_database, outbox_topics, relay, producer):
    with pytest.raises(Boom):
        with producer.transaction(message(outbox_topics)) as txn:
            with Session(sync_database.engine) as session, session.begin():
                session.execute(order(sync_database, txn))
                txn.join(session)
            raise Boom("the response could not be rendered")
    committed_and_published(sync_database, outbox_topics, txn)


@postgres
def test_a_session_rolled_back_rolls_back(sync_database, outbox_topics, producer):
    with pytest.raises(Boom):
        with producer.transaction(message(outbox_topics)) as txn:
            with Session(sync_database.engine) as session, session.begin():
                session.execute(order(sync_database, txn))
                txn.join(session)
                raise Boom("card declined")
    rolled_back(sync_database, outbox_topics, txn)


@postgres
def test_a_rollback_without_an_error_rolls_back(sync_database, outbox_topics, producer):
    with producer.transaction(message(outbox_topics)) as txn:
        with Session(sync_database.engine) as session:
            session.execute(order(sync_database, txn))
            txn.join(session)
            session.rollback()
    rolled_back(sync_database, outbox_topics, txn)


@postgres
def test_a_flush_failing_at_commit_rolls_back(sync_database, outbox_topics, producer):
    """A duplicate key found by the commit's flush: no COMMIT was sent, so ROLLBACK, not unknown."""
    with Session(sync_database.engine) as session, session.begin():
        session.execute(sa.insert(sync_database.orders).values(id="o-1", transaction_id="old"))
    Order = _mapped_orders(sync_database)
    with pytest.raises(sa.exc.IntegrityError):
        with producer.transaction(message(outbox_topics)) as txn:
            with Session(sync_database.engine) as session, session.begin():
                txn.join(session)
                session.add(Order(id="o-1", transaction_id=txn.transaction_id))
    assert txn.result.local_transaction_state is ROLLBACK
    assert decided(outbox_topics, txn) == [Resolution.ROLLBACK]
    assert sync_database.log_rows() == {}


@postgres
def test_a_savepoint_rolled_back_does_not_decide(sync_database, outbox_topics, producer):
    with producer.transaction(message(outbox_topics)) as txn:
        with Session(sync_database.engine) as session, session.begin():
            session.execute(order(sync_database, txn))
            txn.join(session)
            savepoint = session.begin_nested()
            session.execute(order(sync_database, txn, "o-2"))
            savepoint.rollback()
    assert txn.result.local_transaction_state is COMMIT
    assert sync_database.order_rows() == {"o-1": txn.transaction_id}
    assert decided(outbox_topics, txn) == [Resolution.COMMIT]


@postgres
def test_a_block_that_never_joins_rolls_back(sync_database, outbox_topics, producer):
    with producer.transaction(message(outbox_topics)) as txn:
        pass
    assert txn.result.end_status is EndStatus.ROLLED_BACK
    assert decided(outbox_topics, txn) == [Resolution.ROLLBACK]


@postgres
def test_a_session_still_open_is_left_to_the_check_back_from_the_same_log(
    sync_database, outbox_topics, relay, producer
):
    """Committed after the block: nothing decided, then the check-back finds the row."""
    session = Session(sync_database.engine)
    with producer.transaction(message(outbox_topics)) as txn:
        session.execute(order(sync_database, txn))
        txn.join(session)
    assert txn.result.end_status is EndStatus.LEFT_UNKNOWN
    session.commit()
    session.close()
    put_back_and_ask(outbox_topics)
    wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    assert decided(outbox_topics, txn) == [Resolution.COMMIT]
    wait_for(lambda: len(events(outbox_topics)) == 1)


@postgres
def test_bad_use_is_refused_in_one_line(sync_database, outbox_topics, producer):
    txn = producer.transaction(message(outbox_topics))
    with pytest.raises(CallerTransactionError, match=r"inside the `with producer\.transaction"):
        txn.join(Session(sync_database.engine))
    with pytest.raises(CallerTransactionError, match="enter the with block"):
        _ = txn.message
    with pytest.raises(Boom):
        with txn:
            with pytest.raises(
                JoinError, match="takes a SQLAlchemy Session or scoped_session, got str"
            ):
                txn.join("session")
            with pytest.raises(CallerTransactionError, match="called already"):
                txn.join(Session(sync_database.engine))
            raise Boom
    assert txn.result.end_status is EndStatus.ROLLED_BACK
    with pytest.raises(CallerTransactionError, match="inside the `with"):
        txn.join(Session(sync_database.engine))
    with pytest.raises(CallerTransactionError, match="entered already"):
        with txn:
            pass
    with producer.transaction(message(outbox_topics)) as nested:
        with Session(sync_database.engine) as session, session.begin():
            session.begin_nested()
            with pytest.raises(JoinError, match="savepoint"):
                nested.join(session)
    assert decided(outbox_topics, nested) == [Resolution.ROLLBACK]
    # Bad messages: refused on entry, nothing written, as send_message_in_transaction.
    with pytest.raises(Exception, match="internal outbox topic"):
        with producer.transaction(Message(outbox_topics.names.half, b"v")):
            pytest.fail("the block must not run")


def test_join_needs_a_listener_of_the_log(outbox_topics):
    with TransactionProducer(GROUP, ScriptedListener(), outbox_topics.settings()) as producer:
        with producer.transaction(message(outbox_topics)) as txn:
            with pytest.raises(CallerTransactionError, match="SqlTransactionListener"):
                txn.join(object())
    assert txn.result.end_status is EndStatus.ROLLED_BACK


def _mapped_orders(database: Database):
    from sqlalchemy.orm import registry

    class Order:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    registry().map_imperatively(Order, database.orders)
    return Order


# ------------------------------------------------------------------ asyncio


@pytest.fixture
def async_database(database_url: str):
    from tests.sql.conftest import database_on

    yield from database_on(database_url, "async")


@pytest.mark.parametrize("after", ["error after commit", "rollback"])
def test_async_with_an_async_session(async_database: Database, outbox_topics, relay, after):
    engine, loop = async_database.async_parts()
    producer = async_database.producer(async_database.listener(), outbox_topics.settings())
    producer.start()

    async def send():
        async with producer.producer.transaction(message(outbox_topics)) as txn:
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(order(async_database, txn))
                await txn.join(session)
                if after == "rollback":
                    raise Boom
            if after == "error after commit":
                raise Boom

    try:
        if after == "commit":
            loop.run(send())
        else:
            with pytest.raises(Boom):
                loop.run(send())
        txn = _last_transaction(outbox_topics)
    finally:
        producer.shutdown()
    if after == "rollback":
        assert txn == Resolution.ROLLBACK
        assert async_database.order_rows() == async_database.log_rows() == {}
    else:
        assert txn == Resolution.COMMIT
        (transaction_id,) = async_database.log_rows()
        wait_for(lambda: [e.transaction_id for e in events(outbox_topics)] == [transaction_id])


def _last_transaction(topics: OutboxTopics) -> Resolution:
    (op,) = ops_of(topics)
    return op.resolution


def test_async_join_refuses_a_sync_session(async_database: Database, outbox_topics):
    _, loop = async_database.async_parts()
    producer = async_database.producer(async_database.listener(), outbox_topics.settings())
    producer.start()

    async def send():
        async with producer.producer.transaction(message(outbox_topics)) as txn:
            with pytest.raises(JoinError, match="takes a SQLAlchemy AsyncSession"):
                await txn.join(Session(async_database.engine))
        return txn

    try:
        txn = loop.run(send())
    finally:
        producer.shutdown()
    assert txn.result.end_status is EndStatus.ROLLED_BACK


# ------------------------------------------------------------------ crash


@pytest.fixture
def pg_sync_database(postgres_url: str):
    from tests.sql.conftest import database_on

    yield from database_on(postgres_url, "sync")


@pytest.mark.postgres
def test_kill_between_the_commit_and_the_decision_is_resolved_from_the_log(
    postgres_url: str, pg_sync_database: Database, outbox_topics: OutboxTopics, relay
):
    database = pg_sync_database
    child = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("caller_crash.py")),
            outbox_topics.bootstrap,
            outbox_topics.names.prefix,
            outbox_topics.real_topic,
            postgres_url,
            database.target.table,
            database.orders.name,
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    (transaction_id,) = [
        line.split()[1] for line in child.stdout.splitlines() if line.startswith("COMMITTED")
    ]
    # The database committed; the process died before its decision.
    assert database.order_rows() == {"o-1": transaction_id}
    assert ops_of(outbox_topics) == []
    # Another producer of the group answers the check-back from the same log.
    with TransactionProducer(GROUP, database.listener(), outbox_topics.settings()):
        put_back_and_ask(outbox_topics)
        wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    ((op),) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (transaction_id, Resolution.COMMIT)
    wait_for(lambda: len(events(outbox_topics)) == 1)
    time.sleep(1)  # a second publication would show up by now
    assert [e.transaction_id for e in events(outbox_topics)] == [transaction_id]


@pytest.mark.postgres
def test_a_commit_whose_connection_is_lost_is_decided_by_what_the_server_recorded(
    pg_sync_database: Database, outbox_topics: OutboxTopics
):
    """COMMIT sent, connection gone: the client cannot tell, the server can. Here its
    backend died before committing, so PostgreSQL records the transaction aborted: the
    block's end reads that and rolls back (session events alone could only say UNKNOW).
    The check-back, asked all the same, finds no row: UNKNOW while young, then ROLLBACK."""
    database = pg_sync_database
    clock = [time.time()]
    listener = database.listener(grace_seconds=30, clock=lambda: clock[0])
    with TransactionProducer(GROUP, listener, outbox_topics.settings()) as producer:
        with backend_killed_at_commit(database.engine, database.url) as terminated:
            with pytest.raises(sa.exc.OperationalError):
                with producer.transaction(message(outbox_topics)) as txn:
                    with Session(database.engine) as session, session.begin():
                        session.execute(order(database, txn))
                        txn.join(session)
        assert terminated, "the backend was not terminated before COMMIT"
        assert txn.result.end_status is EndStatus.ROLLED_BACK
        assert decided(outbox_topics, txn) == [Resolution.ROLLBACK]
        assert database.log_rows() == {}
        assert listener.check_local_transaction(txn.message) is UNKNOW
        clock[0] += 31
        assert listener.check_local_transaction(txn.message) is ROLLBACK
