"""check_local_transaction: the log row answers; without one, the age of the half does."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.orm import sessionmaker

from outbox import LocalTransactionState
from outbox.sql import SqlTransactionListener, create_engine
from tests.sql.conftest import Database, execute_as_send, free_port, message

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
GRACE = 60.0
NOW = 1_900_000_000.0


def born(seconds_ago: float) -> int:
    return int((NOW - seconds_ago) * 1000)


def test_committed_transaction_answers_commit(database: Database):
    listener = database.listener(grace_seconds=GRACE, clock=lambda: NOW)
    msg = message(born_ms=born(1))
    assert execute_as_send(listener, msg, {"id": "o-1"})[0] is COMMIT
    assert listener.check_local_transaction(msg) is COMMIT
    # Long after the grace period too: a row is a commit, whatever its age.
    late = database.listener(grace_seconds=GRACE, clock=lambda: NOW + 3600)
    assert late.check_local_transaction(msg) is COMMIT


@pytest.mark.parametrize(
    "seconds_ago,expected",
    [(GRACE + 1, ROLLBACK), (GRACE, ROLLBACK), (GRACE - 1, UNKNOW), (0, UNKNOW)],
    ids=["old", "at-grace", "young", "just-born"],
)
def test_missing_row_answers_by_age(database: Database, seconds_ago, expected):
    listener = database.listener(grace_seconds=GRACE, clock=lambda: NOW)
    assert listener.check_local_transaction(message(born_ms=born(seconds_ago))) is expected


def test_rolled_back_transaction_is_rolled_back_once_old(database: Database):
    clock = [NOW]
    listener = database.listener(lambda s, m, a: 1 / 0, grace_seconds=GRACE, clock=lambda: clock[0])
    msg = message(born_ms=born(0))
    assert execute_as_send(listener, msg, None)[0] is ROLLBACK
    assert listener.check_local_transaction(msg) is UNKNOW
    clock[0] += GRACE
    assert listener.check_local_transaction(msg) is ROLLBACK


def test_missing_born_ms_is_unknown(database: Database):
    msg = message()
    unborn = msg.__class__(msg.topic, msg.value, transaction_id=msg.transaction_id)
    assert database.listener().check_local_transaction(unborn) is UNKNOW


def unreachable_listener(url: str) -> SqlTransactionListener:
    return SqlTransactionListener(
        sessionmaker(create_engine(url)),
        lambda s, m, a: None,
        group="orders",
        grace_seconds=GRACE,
        clock=lambda: NOW,
    )


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"]
)
def test_unreachable_database_answers_unknown_never_rollback(backend, tmp_path):
    url = (
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/outbox"
        if backend == "postgres"
        else f"sqlite:///{tmp_path}/no/such/dir/outbox.db"
    )
    listener = unreachable_listener(url)
    started = time.monotonic()
    old = message(born_ms=born(GRACE * 10))
    assert listener.check_local_transaction(old) is UNKNOW
    assert time.monotonic() - started < 120  # no retry loop


@pytest.mark.postgres
def test_database_stopped_under_the_listener_answers_unknown():
    """A server that goes away after start-up: pooled connections die, the answer stays UNKNOW."""
    from outbox_devtools.postgres import LocalPostgres

    with LocalPostgres() as server:
        from outbox.sql import LogTarget, upgrade

        engine = create_engine(server.url)
        upgrade(engine, target=LogTarget())
        listener = SqlTransactionListener(
            sessionmaker(engine), lambda s, m, a: None, group="orders", clock=lambda: NOW
        )
        committed = message(born_ms=born(1))
        assert execute_as_send(listener, committed, None)[0] is COMMIT
        assert listener.check_local_transaction(committed) is COMMIT
        server.stop(grace_seconds=3)  # smart shutdown would wait for our pooled connection
        assert listener.check_local_transaction(committed) is UNKNOW
        assert listener.check_local_transaction(message(born_ms=born(GRACE * 10))) is UNKNOW
        engine.dispose()


def test_missing_table_answers_unknown(database_url, caplog):
    """Migrations not run: an error, not evidence of a rollback."""
    engine = create_engine(database_url)
    listener = SqlTransactionListener(
        sessionmaker(engine),
        lambda s, m, a: None,
        group="orders",
        table="never_migrated_log",
        clock=lambda: NOW,
    )
    try:
        assert listener.check_local_transaction(message(born_ms=born(GRACE * 10))) is UNKNOW
        assert "run `outbox db upgrade" in caplog.text  # the log says what to do
    finally:
        engine.dispose()
