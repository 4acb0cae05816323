"""A database user without the grants the log needs: one error naming the grant, nothing lost.

A service often runs as a user of its own, with the migrations run by another. When that
user may read the log table but not write it, every send must roll back with an error that
says which grant is missing and where (not a driver's code to look up), the order must not
be committed without its row, and a check-back must not answer ROLLBACK for what it could
not read. On a real PostgreSQL and a real MariaDB (SQLite has no users).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from outbox import LocalTransactionState
from outbox.sql import TransactionLogPrivilegeError, create_engine
from tests.sql.conftest import Database, database_on, execute_as_send, message

SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
]


@pytest.fixture(params=SERVERS)
def owned(request: pytest.FixtureRequest, listener_kind: str) -> Iterator[Database]:
    """The log and orders tables, made by the server's superuser (the migrations' user)."""
    yield from database_on(request.getfixturevalue(f"{request.param}_url"), listener_kind)


@pytest.fixture
def reader(owned: Database) -> Iterator[Database]:
    """The same tables through a user that may read the log and write orders, not the log."""
    user = f"svc_{uuid.uuid4().hex[:8]}"
    log, orders = owned.target.table, owned.orders.name
    mysql = owned.backend != "postgresql"
    grants = (
        [
            f"CREATE USER '{user}'@'%'",
            f"GRANT SELECT ON {log} TO '{user}'@'%'",
            f"GRANT SELECT ON {owned.target.rollback_table} TO '{user}'@'%'",
            f"GRANT SELECT, INSERT ON {orders} TO '{user}'@'%'",
        ]
        if mysql
        else [
            f"CREATE ROLE {user} LOGIN",
            f"GRANT SELECT ON {log}, {owned.target.rollback_table} TO {user}",
            f"GRANT SELECT, INSERT ON {orders} TO {user}",
        ]
    )
    with owned.engine.begin() as connection:
        for statement in grants:
            connection.execute(sa.text(statement))
    url = sa.make_url(owned.url).set(username=user).render_as_string(hide_password=False)
    restricted = dataclasses.replace(owned, url=url, engine=create_engine(url), _async=[])
    try:
        yield restricted
    finally:
        restricted.engine.dispose()
        with owned.engine.begin() as connection:
            if mysql:
                connection.execute(sa.text(f"DROP USER '{user}'@'%'"))
            else:
                connection.execute(sa.text(f"DROP OWNED BY {user}"))
                connection.execute(sa.text(f"DROP ROLE {user}"))


def test_a_send_without_the_insert_grant_names_it_and_commits_nothing(owned, reader):
    state, error = execute_as_send(reader.listener(), message(), {"id": "o-1"})
    assert state is LocalTransactionState.ROLLBACK_MESSAGE
    assert isinstance(error, TransactionLogPrivilegeError), repr(error)
    text = str(error)
    assert reader.target.table in text and "INSERT" in text.upper()
    assert "grant" in text.lower()
    assert owned.order_rows() == {} and owned.log_rows() == {}


def test_a_check_without_the_insert_grant_answers_unknow_not_rollback(owned, reader):
    """No row past the grace: the check would record ROLLBACK, and may not. It must not
    answer ROLLBACK it could not record (a late commit would then publish nothing)."""
    listener = reader.listener(clock=lambda: 4e9)  # long past the grace
    assert listener.check_local_transaction(message()) is LocalTransactionState.UNKNOW
