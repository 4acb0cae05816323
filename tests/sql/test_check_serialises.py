"""A ROLLBACK answer and the local transaction it judges cannot both win.

A check-back that finds no log row past the grace period answers ROLLBACK. If
the local transaction's COMMIT is slow (a synchronous standby, a deferred
constraint), its row is not visible yet: without more, the check answers
ROLLBACK and the COMMIT then succeeds, committed in the database and never
published. The answer is therefore written down (a rolled-back row for the
half) in a way that serialises with the local transaction's own row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from outbox import LocalTransactionState
from outbox.sql import LocalTransactionRolledBackByCheckError, SqlTransactionListener
from tests.sql.conftest import GROUP, Database, execute_as_send, message

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
GRACE = 30.0


@pytest.mark.postgres
@pytest.mark.parametrize("listener_kind", ["sync", "async"])
def test_a_check_during_a_slow_commit_waits_for_it_and_answers_commit(pg_database: Database):
    """The local transaction's COMMIT blocks in a deferred constraint trigger (held on an
    advisory lock by the test); a check-back past the grace period, from another session,
    must not answer ROLLBACK for a transaction about to commit."""
    database = pg_database
    orders = database.orders.name
    lock = 7_230_023
    with database.engine.begin() as connection:
        connection.execute(
            sa.text(
                f"CREATE FUNCTION {orders}_slow() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN PERFORM pg_advisory_xact_lock({lock}); RETURN NULL; END $$"
            )
        )
        connection.execute(
            sa.text(
                f"CREATE CONSTRAINT TRIGGER {orders}_slow AFTER INSERT ON {orders} "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {orders}_slow()"
            )
        )
    now = time.time()
    msg = message(born_ms=int(now * 1000))
    sender = database.listener(grace_seconds=GRACE, clock=lambda: now)
    checker = database.listener(grace_seconds=GRACE, clock=lambda: now + GRACE + 1)
    holder = database.engine.connect()
    try:
        holder.execute(sa.text(f"SELECT pg_advisory_lock({lock})"))
        with ThreadPoolExecutor(2) as pool:
            sent = pool.submit(execute_as_send, sender, msg, {"id": "o-1"})
            _wait_for_commit_blocked_on(database, lock)
            answer = pool.submit(checker.check_local_transaction, msg)
            time.sleep(0.5)  # room for a wrong answer to arrive before the commit ends
            holder.execute(sa.text(f"SELECT pg_advisory_unlock({lock})"))
            state, error = sent.result(30)
            assert (state, error) == (COMMIT, None)
            assert answer.result(30) is COMMIT
    finally:
        holder.close()
        with database.engine.begin() as connection:
            connection.execute(sa.text(f"DROP TRIGGER IF EXISTS {orders}_slow ON {orders}"))
            connection.execute(sa.text(f"DROP FUNCTION IF EXISTS {orders}_slow()"))
    assert database.order_rows() == {"o-1": msg.transaction_id}


def _wait_for_commit_blocked_on(database: Database, lock: int) -> None:
    deadline = time.monotonic() + 30
    query = sa.text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock "
        "AND NOT granted"
    )
    with database.engine.connect() as connection:
        while not connection.execute(query, {"lock": lock}).scalar():
            assert time.monotonic() < deadline, "the COMMIT never blocked"
            time.sleep(0.05)


def sync_checker(database: Database, clock: Callable[[], float]) -> SqlTransactionListener:
    """A producer of the group answering checks on another host (sync: callable from inside
    an async business function without waiting on its own event loop)."""
    return SqlTransactionListener(
        database.sessions, database.insert_order, group=GROUP, table=database.target.table,
        schema=database.target.schema, grace_seconds=GRACE, clock=clock,
    )  # fmt: skip


def test_a_local_transaction_after_a_rollback_answer_is_refused_and_says_so(database: Database):
    """The other order: the check (on a host whose clock runs ahead) answered ROLLBACK before
    the local transaction wrote its row. The local transaction must then fail, and the caller
    learn why, rather than commit a change whose event was rolled back."""
    now = time.time()
    msg = message(born_ms=int(now * 1000))
    checker = sync_checker(database, lambda: now + GRACE + 1)
    answered: list[LocalTransactionState] = []

    def business(session, message_, arg):
        answered.append(checker.check_local_transaction(message_))
        database.insert_order(session, message_, arg)

    sender = database.listener(business, grace_seconds=GRACE, clock=lambda: now)
    state, error = execute_as_send(sender, msg, {"id": "o-1"})
    assert answered == [ROLLBACK]
    assert state is ROLLBACK
    assert isinstance(error, LocalTransactionRolledBackByCheckError)
    assert "answered ROLLBACK" in str(error)
    assert database.order_rows() == {}
    assert checker.check_local_transaction(msg) is ROLLBACK  # and it stays so


def test_a_rollback_answer_after_the_business_functions_first_read_is_seen(database: Database):
    """MySQL's REPEATABLE READ answers a transaction's plain reads from its first snapshot:
    a business function that read before the check answered ROLLBACK must still be told
    the check's answer, not only be refused a duplicate key."""
    now = time.time()
    msg = message(born_ms=int(now * 1000))
    msg = msg.__class__(**{**msg.__dict__, "half_partition": 0, "half_offset": 5})
    checker = sync_checker(database, lambda: now + GRACE + 1)

    def business(session, message_, arg):
        session.execute(sa.select(database.orders)).all()  # the snapshot, on MySQL
        assert checker.check_local_transaction(message_) is ROLLBACK
        database.insert_order(session, message_, arg)

    sender = database.listener(business, grace_seconds=GRACE, clock=lambda: now)
    state, error = execute_as_send(sender, msg, {"id": "o-1"})
    assert state is ROLLBACK
    assert isinstance(error, LocalTransactionRolledBackByCheckError), error
    assert database.order_rows() == {}


def test_a_reused_key_may_commit_after_another_attempt_was_rolled_back(database: Database):
    """A rolled-back answer belongs to its half: a later attempt with the same key commits."""
    now = time.time()
    first = message("key-1", born_ms=int(now * 1000))
    first = first.__class__(**{**first.__dict__, "half_partition": 0, "half_offset": 3})
    checker = database.listener(grace_seconds=GRACE, clock=lambda: now + GRACE + 1)
    assert checker.check_local_transaction(first) is ROLLBACK
    second = first.__class__(**{**first.__dict__, "half_offset": 9})
    sender = database.listener(grace_seconds=GRACE, clock=lambda: now)
    assert execute_as_send(sender, second, {"id": "o-1"}) == (COMMIT, None)
    assert checker.check_local_transaction(second) is COMMIT
    assert checker.check_local_transaction(first) is ROLLBACK
    assert database.order_rows() == {"o-1": "key-1"}


def test_concurrent_checks_of_one_half_agree(database: Database):
    now = time.time()
    msg = message(born_ms=int(now * 1000))
    checker = database.listener(grace_seconds=GRACE, clock=lambda: now + GRACE + 1)
    start = threading.Barrier(4)

    def check() -> LocalTransactionState:
        start.wait()
        return checker.check_local_transaction(msg)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: check(), range(4)))
    assert answers == [ROLLBACK] * 4


def test_a_half_answered_rollback_stays_so_after_another_half_of_its_id_is_answered(
    database: Database,
):
    """Found by the protocol model. Two halves of a reused key are both answered ROLLBACK
    (the second answer is written over the first's); the first half's local transaction,
    late past its own time check (a clock stepped back, host skew), must still be refused:
    its ROLLBACK answer stands, or it commits in the database and is never published."""
    now = time.time()
    first = message("key-1", born_ms=int(now * 1000))
    first = first.__class__(**{**first.__dict__, "half_partition": 0, "half_offset": 3})
    second = first.__class__(**{**first.__dict__, "half_offset": 9})
    checker = database.listener(grace_seconds=GRACE, clock=lambda: now + GRACE + 1)
    assert checker.check_local_transaction(first) is ROLLBACK
    assert checker.check_local_transaction(second) is ROLLBACK
    late = database.listener(grace_seconds=GRACE, clock=lambda: now)
    state, error = execute_as_send(late, first, {"id": "o-1"})
    assert state is ROLLBACK, "a half answered ROLLBACK committed later"
    assert isinstance(error, LocalTransactionRolledBackByCheckError)
    assert database.order_rows() == {}
    assert checker.check_local_transaction(first) is ROLLBACK
    assert checker.check_local_transaction(second) is ROLLBACK
