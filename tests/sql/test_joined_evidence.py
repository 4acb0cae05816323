# ruff: noqa: SIM117 - the nesting a service writes: the outbox block, then its session
"""The joined form decides from what the database holds, for every way a service commits.

Each case is one a review found wrong when the decision came from SQLAlchemy's
session events (a phantom where the database holds nothing, or a committed
order never published), on SQLite, PostgreSQL and MariaDB, against a real broker and the
checker's relay:

- A / E: a savepoint released, then the block raises (the outer transaction
  rolls back), sync and asyncio;
- B: a savepoint released, then PostgreSQL refuses the COMMIT;
- C: the session bound to an outside ``conn.begin()``, ``session.commit()``, then
  the outer transaction rolled back (before and after the block ends);
- D: the rows committed through ``session.connection().commit()``;
- F: the block entered and left in two ``contextvars`` contexts (a FastAPI ``yield``
  dependency in a thread pool);
- G: a ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) and an
  ``async_scoped_session``;
- H: a retried id whose join took over an earlier attempt's ROLLBACK row, rolled back.
"""

from __future__ import annotations

import asyncio
import contextvars
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session, async_sessionmaker
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from outbox import EndStatus, Message, TransactionProducer
from outbox.protocol import Resolution
from tests.producer.test_check_back import ops_of, wait_for
from tests.sql.conftest import (
    GROUP,
    Database,
    OutboxTopics,
    database_on,
)
from tests.sql.test_caller_transaction import (
    committed_and_published,
    decided,
    events,
    message,
    order,
    rolled_back,
)

pytestmark = pytest.mark.kafka


class Declined(Exception):
    pass


@pytest.fixture
def db(database_url: str):
    yield from database_on(database_url, "sync")


@pytest.fixture
def producer(db: Database, outbox_topics: OutboxTopics):
    with TransactionProducer(GROUP, db.listener(), outbox_topics.settings()) as started:
        yield started


def test_a_savepoint_released_then_an_error_is_rolled_back(db, outbox_topics, relay, producer):
    """A: the release fired ``after_commit``; the outer transaction rolled back."""
    with pytest.raises(Declined):
        with producer.transaction(message(outbox_topics)) as txn:
            with Session(db.engine) as session, session.begin():
                session.execute(order(db, txn))
                txn.join(session)
                with session.begin_nested():
                    session.execute(order(db, txn, "o-2"))
                raise Declined("card declined")
    rolled_back(db, outbox_topics, txn)


@pytest.mark.postgres
def test_a_savepoint_released_then_a_refused_commit_is_rolled_back(
    postgres_url, outbox_topics, relay
):
    """B: PostgreSQL refuses the COMMIT (a deferred unique constraint) after a release."""
    for database in database_on(postgres_url, "sync"):
        with database.engine.begin() as connection:
            connection.exec_driver_sql(
                f"ALTER TABLE {database.orders.name} ADD CONSTRAINT {database.orders.name}_tx "
                "UNIQUE (transaction_id) DEFERRABLE INITIALLY DEFERRED"
            )
        with TransactionProducer(GROUP, database.listener(), outbox_topics.settings()) as producer:
            with pytest.raises(sa.exc.IntegrityError):
                with producer.transaction(message(outbox_topics)) as txn:
                    with Session(database.engine) as session, session.begin():
                        session.execute(order(database, txn))
                        txn.join(session)
                        with session.begin_nested():
                            session.execute(order(database, txn, "o-2"))  # same id: deferred
        rolled_back(database, outbox_topics, txn)


def test_an_outer_transaction_rolled_back_after_the_sessions_commit_is_rolled_back(
    db, outbox_topics, relay, producer
):
    """C: SQLAlchemy's "join an external transaction" recipe; the block ends after it."""
    with producer.transaction(message(outbox_topics)) as txn:
        with db.engine.connect() as connection:
            outer = connection.begin()
            with Session(bind=connection) as session:
                session.execute(order(db, txn))
                txn.join(session)
                session.commit()  # commits nothing: the outer transaction is the connection's
            outer.rollback()
    rolled_back(db, outbox_topics, txn)


def test_an_outer_transaction_still_open_at_the_end_is_left_to_the_check_back(
    db, outbox_topics, relay, producer
):
    """C, the block ending first: the row is in no committed transaction yet, so no
    decision; the outer transaction rolls back and the check-back answers ROLLBACK."""
    with db.engine.connect() as connection:
        outer = connection.begin()
        with producer.transaction(message(outbox_topics)) as txn:
            with Session(bind=connection) as session:
                session.execute(order(db, txn))
                txn.join(session)
                session.commit()
        outer.rollback()
    assert txn.result.end_status is EndStatus.LEFT_UNKNOWN
    assert ops_of(outbox_topics) == []
    assert db.order_rows() == {}
    listener = db.listener(clock=lambda: time.time() + 3600)  # the grace is over
    assert listener.check_local_transaction(txn.message).name == "ROLLBACK_MESSAGE"


def test_rows_committed_through_the_sessions_connection_are_committed_and_published(
    db, outbox_topics, relay, producer
):
    """D: ``session.connection().commit()`` fires no session event; the row is committed."""
    with producer.transaction(message(outbox_topics)) as txn:
        session = Session(db.engine)
        session.execute(order(db, txn))
        txn.join(session)
        session.connection().commit()
        session.close()
    committed_and_published(db, outbox_topics, txn)


def test_a_block_entered_and_left_in_two_contexts_decides_at_its_end(
    db, outbox_topics, relay, producer
):
    """F: a sync ``yield`` dependency of FastAPI: set-up and tear-down in two context copies."""
    block = producer.transaction(message(outbox_topics))
    txn = contextvars.copy_context().run(block.__enter__)
    with Session(db.engine) as session, session.begin():
        session.execute(order(db, txn))
        txn.join(session)
    contextvars.copy_context().run(block.__exit__, None, None, None)
    committed_and_published(db, outbox_topics, txn)


def test_a_scoped_session_is_joined(db, outbox_topics, relay, producer):
    """G: Flask-SQLAlchemy's ``db.session`` is a ``scoped_session``."""
    scoped = scoped_session(sessionmaker(db.engine))
    with producer.transaction(message(outbox_topics)) as txn:
        scoped.execute(order(db, txn))
        txn.join(scoped)
        scoped.commit()
    scoped.remove()
    committed_and_published(db, outbox_topics, txn)


def test_a_takeover_of_an_earlier_attempts_rollback_row_rolled_back_is_rolled_back(
    db, outbox_topics, producer
):
    """H: a retried id. Attempt 1 was answered ROLLBACK by a check-back (its row names its
    half); attempt 2's join takes that row over, then its transaction rolls back, so the
    row names attempt 1's half again. Attempt 2 is decided ROLLBACK from what the database
    holds (InnoDB: the row, no longer locked, is another half's), not left to a check-back."""
    txid = "order-retried"
    with producer.transaction(
        Message(outbox_topics.real_topic, b"1", transaction_id=txid)
    ) as first:
        pass  # died before its join, as far as the log can tell
    late = db.listener(clock=lambda: time.time() + 3600)  # the grace is over
    assert late.check_local_transaction(first.message).name == "ROLLBACK_MESSAGE"
    with pytest.raises(Declined):
        with producer.transaction(
            Message(outbox_topics.real_topic, b"2", transaction_id=txid)
        ) as txn:
            with Session(db.engine) as session, session.begin():
                session.execute(order(db, txn))
                txn.join(session)
                raise Declined("card declined")
    assert txn.result.local_transaction_state.name == "ROLLBACK_MESSAGE"
    assert txn.result.end_status is EndStatus.ROLLED_BACK
    assert db.order_rows() == {}


# ------------------------------------------------------------------ asyncio


@pytest.fixture
def adb(database_url: str):
    yield from database_on(database_url, "async")


@pytest.mark.parametrize("scoped", [False, True], ids=["AsyncSession", "async_scoped_session"])
def test_async_savepoint_released_then_an_error_is_rolled_back(
    adb: Database, outbox_topics, relay, scoped
):
    """E, and G for asyncio: the same decisions through the async driver."""
    engine, loop = adb.async_parts()
    producer = adb.producer(adb.listener(), outbox_topics.settings())
    producer.start()
    factory = async_sessionmaker(engine)
    transactions = []

    async def send(fail: bool, order_id: str) -> None:
        registry = async_scoped_session(factory, scopefunc=asyncio.current_task)
        async with producer.producer.transaction(message(outbox_topics)) as txn:
            transactions.append(txn)
            session = registry() if scoped else AsyncSession(engine)
            try:
                async with session.begin():
                    await session.execute(order(adb, txn, order_id))
                    await txn.join(registry if scoped else session)
                    async with session.begin_nested():
                        await session.execute(order(adb, txn, f"{order_id}-x"))
                    if fail:
                        raise Declined("card declined")
            finally:
                await session.close()

    try:
        with pytest.raises(Declined):
            loop.run(send(True, "o-0"))
        loop.run(send(False, "o-1"))
    finally:
        producer.shutdown()
    declined, placed = transactions
    assert declined.result.end_status is EndStatus.ROLLED_BACK
    assert decided(outbox_topics, declined) == [Resolution.ROLLBACK]
    assert placed.result.end_status is EndStatus.COMMITTED
    assert adb.order_rows() == {"o-1": placed.transaction_id, "o-1-x": placed.transaction_id}
    wait_for(lambda: len(events(outbox_topics)) == 1)
    assert [e.transaction_id for e in events(outbox_topics)] == [placed.transaction_id]
