"""Fixtures for the SQL transaction log: a migrated database per test, SQLite and PostgreSQL.

Each test gets its own log and business table names, so PostgreSQL tests share
the session's server without seeing each other's rows. The log table is made
by the migrations (``upgrade``), as in production; only the test's own
business table comes from ``create_all``.

The listener's tests run twice (``listener_kind``): on
:class:`SqlTransactionListener`, and on :class:`AsyncSqlTransactionListener`
over aiosqlite or async psycopg, driven from the test's thread
(:class:`BlockingAsyncListener`), with the same business functions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from outbox import LocalTransactionState, Message, TransactionProducer
from outbox.send_flow import recorded_local_transaction_errors
from outbox.sql import (
    AsyncSqlTransactionListener,
    LogTarget,
    SqlTransactionListener,
    create_async_engine,
    create_engine,
    downgrade,
    upgrade,
)
from outbox.sql.log import transaction_log_table
from tests.producer.conftest import EventLoopThread, OnLoop, OutboxTopics, outbox_topics, relay

__all__ = ["OutboxTopics", "outbox_topics", "relay"]  # Kafka fixtures, for the producer tests here

GROUP = "orders"


def awaited_business(business: Callable[[Session, Message, Any], object]) -> Any:
    """A sync business function as an async one: the same work, on the AsyncSession's session."""

    async def run(session: AsyncSession, message: Message, arg: Any) -> object:
        return await session.run_sync(lambda sync_session: business(sync_session, message, arg))

    return run


class BlockingAsyncListener:
    """An :class:`AsyncSqlTransactionListener` with the sync listener's blocking methods."""

    def __init__(self, listener: AsyncSqlTransactionListener, loop: EventLoopThread) -> None:
        self.listener = listener
        self.grace_seconds = listener.grace_seconds
        self._loop = loop

    def verify(self) -> None:
        self._loop.run(self.listener.verify())

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return self._loop.run(self.listener.execute_local_transaction(message, arg))

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return self._loop.run(self.listener.check_local_transaction(message))


@dataclass
class Database:
    """One test's database: its engine, log table and a business ``orders`` table.

    ``kind`` says which listener :meth:`listener` makes: ``sync``, or ``async``
    (on ``async_engine``, the same database through the asyncio driver).
    """

    url: str
    engine: Engine
    target: LogTarget
    orders: sa.Table
    kind: str = "sync"
    _async: list[tuple[AsyncEngine, EventLoopThread]] = field(default_factory=list)

    @property
    def listener_engine(self) -> Engine:
        """The (sync) engine the listener's sessions use: events registered here see them."""
        return self.async_parts()[0].sync_engine if self.kind == "async" else self.engine

    def async_parts(self) -> tuple[AsyncEngine, EventLoopThread]:
        if not self._async:
            self._async.append((create_async_engine(self.url), EventLoopThread()))
        return self._async[0]

    def close_async(self) -> None:
        for engine, loop in self._async:
            loop.run(engine.dispose())
            loop.close()

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    @property
    def sessions(self) -> sessionmaker[Session]:
        return sessionmaker(self.engine)

    def log_rows(self) -> dict[str, tuple[str, Any]]:
        """transaction id -> (producer group, created at), of the committed rows."""
        table = transaction_log_table(self.target.table, self.target.schema)
        with self.engine.connect() as connection:
            rows = connection.execute(sa.select(table).where(~table.c.rolled_back)).all()
        return {row.transaction_id: (row.producer_group, row.created_at) for row in rows}

    def order_rows(self) -> dict[str, str]:
        """order id -> transaction id."""
        with self.engine.connect() as connection:
            rows = connection.execute(sa.select(self.orders)).all()
        return {row.id: row.transaction_id for row in rows}

    def listener(self, business: Callable[..., object] | None = None, **options: Any) -> Any:
        options = {"group": GROUP, "table": self.target.table, "schema": self.target.schema,
                   **options}  # fmt: skip
        if self.kind == "sync":
            return SqlTransactionListener(self.sessions, business or self.insert_order, **options)
        engine, loop = self.async_parts()
        listener = AsyncSqlTransactionListener(
            async_sessionmaker(engine), awaited_business(business or self.insert_order), **options
        )
        return BlockingAsyncListener(listener, loop)

    def producer(self, listener: Any, settings: Any) -> Any:
        """A producer of this database's kind for ``listener`` (made by :meth:`listener`)."""
        if self.kind == "sync":
            return TransactionProducer(GROUP, listener, settings)
        return OnLoop(GROUP, listener.listener, settings, loop=self.async_parts()[1])

    def insert_order(self, session: Session, message: Message, order: dict[str, Any]) -> None:
        """The business function of these tests: one order row, or the order's exception."""
        if isinstance(order.get("fail"), BaseException):
            raise order["fail"]
        session.execute(
            sa.insert(self.orders).values(id=order["id"], transaction_id=message.transaction_id)
        )


def unique_name(kind: str) -> str:
    return f"t{uuid.uuid4().hex[:10]}_{kind}"


_BACKENDS = {
    "sqlite": pytest.param("sqlite"),
    "postgres": pytest.param("postgres", marks=pytest.mark.postgres),
    "mariadb": pytest.param("mariadb", marks=pytest.mark.mariadb),
}


def database_url_on(*backends: str) -> Any:
    """A ``database_url`` fixture over ``backends`` (each ``<name>_url``'s database), for a
    module whose subject some backend does not have yet."""

    @pytest.fixture(params=[_BACKENDS[name] for name in backends])
    def database_url(request: pytest.FixtureRequest) -> str:
        return str(request.getfixturevalue(f"{request.param}_url"))

    return database_url


database_url = database_url_on(*_BACKENDS)
"""The same test on SQLite (the embedded default), a real PostgreSQL and a real MariaDB."""


@pytest.fixture(params=["sync", "async"])
def listener_kind(request: pytest.FixtureRequest) -> str:
    """Each listener test once per listener: SqlTransactionListener, AsyncSqlTransactionListener."""
    return str(request.param)


@pytest.fixture
def database(database_url: str, listener_kind: str) -> Iterator[Database]:
    yield from database_on(database_url, listener_kind)


@pytest.fixture
def pg_database(postgres_url: str, listener_kind: str) -> Iterator[Database]:
    """PostgreSQL only: for what SQLite cannot show (lost connections, real concurrency)."""
    yield from database_on(postgres_url, listener_kind)


@pytest.fixture(params=[_BACKENDS["postgres"], _BACKENDS["mariadb"]])
def server_database(request: pytest.FixtureRequest, listener_kind: str) -> Iterator[Database]:
    """A database server (PostgreSQL, MariaDB): what SQLite cannot show (lost connections)."""
    yield from database_on(str(request.getfixturevalue(f"{request.param}_url")), listener_kind)


def database_on(url: str, kind: str) -> Iterator[Database]:
    """A :class:`Database` of the test's own on ``url`` (its log and orders tables), dropped
    after: the fixtures' maker, for a test that needs one of a given kind."""
    engine = create_engine(url)
    target = LogTarget(unique_name("log"))
    upgrade(engine, target=target)
    orders = sa.Table(
        unique_name("orders"),
        sa.MetaData(),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("transaction_id", sa.String(128), nullable=False),
    )
    orders.create(engine)
    database = Database(url, engine, target, orders, kind)
    try:
        yield database
    finally:
        database.close_async()
        orders.drop(engine, checkfirst=True)
        downgrade(engine, "base", target=target)
        with engine.begin() as connection:
            connection.execute(sa.text(f"DROP TABLE IF EXISTS {target.version_table}"))
        engine.dispose()


def message(transaction_id: str | None = None, *, born_ms: int | None = None) -> Message:
    """A message as the producer hands it to the listener: id and birth time stamped."""
    return Message(
        "events",
        b"v",
        transaction_id=transaction_id or uuid.uuid4().hex,
        born_ms=int(time.time() * 1000) if born_ms is None else born_ms,
    )


def execute_as_send(
    listener: SqlTransactionListener, msg: Message, arg: Any
) -> tuple[LocalTransactionState, BaseException | None]:
    """Run execute_local_transaction as the producer does, collecting the recorded error."""
    with recorded_local_transaction_errors() as recorded:
        state = listener.execute_local_transaction(msg, arg)
    return state, (recorded[-1] if recorded else None)


def free_port() -> int:
    """A loopback port with nothing listening (just closed)."""
    from outbox_devtools.processes import free_port as pick

    return pick()


def _backend_alive(engine: Engine, pid: int) -> bool:
    """Asked in a transaction of its own: within one, PostgreSQL (15+, its default
    ``stats_fetch_consistency = cache``) answers pg_stat_activity from the transaction's
    first snapshot, so a backend seen once stays listed however long one waits."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
        else:
            query = sa.text("SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = :pid")
        return bool(connection.execute(query, {"pid": pid}).scalar())


def _server_process_of(connection: Any) -> int:
    """The server's process (PostgreSQL) or connection id (MySQL) behind ``connection``."""
    driver = connection.connection.driver_connection
    return int(
        driver.info.backend_pid if connection.dialect.name == "postgresql" else driver.thread_id()
    )


def _kill(other: Connection, pid: int) -> None:
    if other.dialect.name == "postgresql":
        other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    else:
        other.execute(sa.text(f"KILL CONNECTION {pid}"))


@contextmanager
def backend_killed_at_commit(engine: Engine, url: str) -> Iterator[list[int]]:
    """Each COMMIT of ``engine`` finds its server process (PostgreSQL) or connection
    (MySQL) killed just before it.

    Yields the ids killed (empty if the backend would not go: the test then fails).
    """
    killer = sa.create_engine(url)
    terminated: list[int] = []

    def terminate_backend(connection: Any) -> None:
        pid = _server_process_of(connection)
        with killer.begin() as other:
            _kill(other, pid)
        deadline = time.monotonic() + 60
        while _backend_alive(killer, pid):  # wait until the backend is really gone
            if time.monotonic() > deadline:
                return  # `terminated` stays empty: the test fails, not by accident
            time.sleep(0.05)
        terminated.append(pid)

    event.listen(engine, "commit", terminate_backend)
    try:
        yield terminated
    finally:
        event.remove(engine, "commit", terminate_backend)
        killer.dispose()
