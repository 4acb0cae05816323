"""execute_local_transaction: business row and log row commit together, or neither does."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from outbox import LocalTransactionState
from outbox.sql import (
    CommitOutcomeUnknownError,
    LocalTransactionMisuseError,
    LocalTransactionTooSlowError,
)
from tests.sql.conftest import (
    GROUP,
    Database,
    backend_killed_at_commit,
    execute_as_send,
    message,
)

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


def test_commit_writes_business_row_and_log_row(database: Database):
    msg = message()
    state, error = execute_as_send(database.listener(), msg, {"id": "o-1"})
    assert (state, error) == (COMMIT, None)
    assert database.order_rows() == {"o-1": msg.transaction_id}
    ((transaction_id, (group, created_at)),) = database.log_rows().items()
    assert (transaction_id, group) == (msg.transaction_id, GROUP)
    assert created_at is not None


def test_business_exception_rolls_back_and_is_kept(database: Database):
    failure = RuntimeError("out of stock")

    def business(session, msg, arg):
        database.insert_order(session, msg, {"id": "o-1"})  # written, then undone
        raise failure

    state, error = execute_as_send(database.listener(business), message(), None)
    assert (state, error) == (ROLLBACK, failure)
    assert database.order_rows() == {}
    assert database.log_rows() == {}


def test_failed_log_insert_undoes_the_business_row(database: Database):
    """A reused transaction id collides in the log: the second business row goes too."""
    listener = database.listener()
    first = message("same-id")
    assert execute_as_send(listener, first, {"id": "o-1"})[0] is COMMIT
    state, error = execute_as_send(listener, message("same-id"), {"id": "o-2"})
    assert state is ROLLBACK
    assert isinstance(error, sa.exc.IntegrityError)
    assert database.order_rows() == {"o-1": "same-id"}
    assert list(database.log_rows()) == ["same-id"]


def test_business_function_may_answer_rollback_without_an_error(database: Database):
    def business(session, msg, arg):
        database.insert_order(session, msg, {"id": "o-1"})
        return ROLLBACK

    assert execute_as_send(database.listener(business), message(), None) == (ROLLBACK, None)
    assert database.order_rows() == {}
    assert database.log_rows() == {}


def test_business_function_must_not_commit(database: Database):
    def business(session, msg, arg):
        session.commit()

    state, error = execute_as_send(database.listener(business), message(), None)
    assert state is ROLLBACK
    assert isinstance(error, LocalTransactionMisuseError)
    assert "remove the commit" in str(error)
    assert database.log_rows() == {}


def test_local_transaction_past_the_grace_period_is_not_committed(database: Database):
    """A check-back may already have answered ROLLBACK for a half that old."""
    now = time.time()
    listener = database.listener(grace_seconds=30, clock=lambda: now)
    old = message(born_ms=int((now - 31) * 1000))
    state, error = execute_as_send(listener, old, {"id": "o-1"})
    assert state is ROLLBACK
    assert isinstance(error, LocalTransactionTooSlowError)
    assert database.order_rows() == {}
    assert database.log_rows() == {}


def test_direct_call_outside_a_send_returns_the_state(database: Database):
    """Without a producer around it the helper still answers; the error is only logged."""
    listener = database.listener(lambda s, m, a: 1 / 0)
    assert listener.execute_local_transaction(message(), None) is ROLLBACK


def test_connection_lost_during_commit_is_unknown(server_database: Database):
    """COMMIT sent, connection gone: it may have committed, so UNKNOW; the check decides."""
    database = server_database
    listener = database.listener()
    msg = message()
    with backend_killed_at_commit(database.listener_engine, database.url) as terminated:
        state, error = execute_as_send(listener, msg, {"id": "o-1"})
    assert terminated, "the backend was not terminated before COMMIT"
    assert state is UNKNOW
    assert isinstance(error, CommitOutcomeUnknownError)
    assert isinstance(error.__cause__, sa.exc.DBAPIError)
    assert error.__cause__.connection_invalidated  # the lost connection, not some other error
    assert "may or may not have happened" in str(error)
    # Here the server died before committing; the check-back finds that out.
    assert database.log_rows() == {}
    assert listener.check_local_transaction(msg) is UNKNOW  # young: maybe still running


@pytest.mark.postgres
def test_commit_refused_by_a_deferred_constraint_is_rollback(pg_database: Database):
    """The server answered COMMIT with an error: definitely not committed, so ROLLBACK."""
    database = pg_database
    customers = f"{database.orders.name}_customers"
    with database.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE TABLE {customers} (id text PRIMARY KEY)"))
        connection.execute(
            sa.text(
                f"ALTER TABLE {database.orders.name} ADD FOREIGN KEY (id) "
                f"REFERENCES {customers} (id) DEFERRABLE INITIALLY DEFERRED"
            )
        )
    try:
        state, error = execute_as_send(database.listener(), message(), {"id": "nobody"})
        assert state is ROLLBACK
        assert isinstance(error, sa.exc.IntegrityError)
        assert database.order_rows() == {}
        assert database.log_rows() == {}
    finally:
        with database.engine.begin() as connection:
            connection.execute(sa.text(f"DROP TABLE {customers} CASCADE"))
