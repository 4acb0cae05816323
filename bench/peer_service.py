"""The order service of :mod:`bench.peer`, one side at one concurrency, as its own process.

Its own process so that its CPU is read from /proc apart from the bench's
reader of the real topic. Each request is ONE database transaction that inserts
an order row (``bench_peer_orders``) and publishes the order's event, 1 KiB whose
first 32 bytes are the order id; the commit is stamped (``time.monotonic()``,
one clock for every process of the host) right after the database's COMMIT
returns. The sides:

- ``peer``: faststream-outbox, ``await broker.publish(body, queue=..., session=session)``
  inside ``async with session.begin()`` (asyncpg), ``--concurrency`` asyncio tasks;
- ``outbox``: our caller's-transaction form, ``with producer.transaction(message) as
  txn:`` around the service's own ``Session`` and ``txn.join(session)``, in
  ``--concurrency`` threads;
- ``outbox-async``: the same with ``AsyncTransactionProducer``, asyncio tasks;
- ``outbox-sql``: ``send_message_in_transaction`` with a ``SqlTransactionListener``
  whose business function inserts the row (the commit stamped by the session's
  ``after_commit`` event), threads.

The protocol with the bench, one line each on stdout and stdin: ``--warmup``
seconds of requests, their ids written to ``--out``, every pooled connection's
statistics reported to the server, then ``ready``; on ``go``,
``--seconds`` of requests, the committed ids and their stamps written to ``--out``,
then ``done``; on ``exit`` (or end of input) it shuts down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from bench.peer_table import SIDES
from outbox import Message, TransactionProducer
from outbox.message import EndStatus
from outbox.settings import ProducerSettings
from outbox.sql import SqlTransactionListener, create_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

GROUP = "bench-peer"
LOG_TABLE = "bench_peer_log"
ORDERS_TABLE = "bench_peer_orders"
PEER_TABLE = "bench_peer_outbox"
PEER_QUEUE = "orders"
APPLICATION_NAME = "bench-peer-service"
RELAY_APPLICATION_NAME = "bench-peer-relay"
"""The ``application_name`` of the service's and of the peer's relay's connections: the
bench waits for them to close (their statistics reported) and for no other client."""
FLUSH_STATISTICS = sa.text("SELECT pg_stat_force_next_flush()")
"""A backend reports its statistics at most once a second, and may sit on them for 10 s
once idle; after this and its transaction, it reports them at once (PostgreSQL 15+)."""


def _pooled(engine: sa.Engine) -> range:
    """One per connection idle in ``engine``'s pool: checked out together, they are those."""
    return range(engine.pool.checkedin())  # type: ignore[attr-defined]


def orders_table(metadata: sa.MetaData | None = None) -> sa.Table:
    """The service's own table: an order row per request, tagged with its cell."""
    return sa.Table(
        ORDERS_TABLE,
        metadata or sa.MetaData(),
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("cell", sa.String(32), nullable=False),
        sa.Column("total", sa.Numeric(10, 2), nullable=False),
    )


def asyncpg_url(url: str) -> str:
    """The same database for SQLAlchemy's asyncpg dialect (faststream-outbox's LISTEN needs it)."""
    return sa.make_url(url).set(drivername="postgresql+asyncpg").render_as_string(False)


class Service:
    """Counts and stamps the requests of one phase (warm-up, then the measured one)."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.orders = orders_table()
        self.committed: dict[str, float] = {}
        self.errors = 0
        self.first_error: str | None = None
        self._lock = threading.Lock()

    def value(self, order_id: str) -> bytes:
        return order_id.encode().ljust(self.options.value_bytes, b"x")

    def row(self, order_id: str) -> dict[str, Any]:
        return {"id": order_id, "cell": self.options.cell, "total": 42}

    def stamp(self, order_id: str, at: float) -> None:
        self.committed[order_id] = at

    def failed(self, error: BaseException | str) -> None:
        with self._lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = error if isinstance(error, str) else repr(error)[:300]

    def new_phase(self) -> None:
        self.committed = {}
        self.errors = 0
        self.first_error = None


# --------------------------------------------------------------------------- the sides


def _sync_side(
    service: Service,
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """``outbox`` or ``outbox-sql``: a request function for threads, the statistics'
    flush (:func:`flush_statistics`) and the shutdown."""
    o = service.options
    engine = create_engine(
        o.database_url,
        pool_size=o.concurrency + 2,
        max_overflow=o.concurrency,
        connect_args={"application_name": APPLICATION_NAME},
    )
    settings = ProducerSettings(bootstrap_servers=o.bootstrap_servers, topic_prefix=o.prefix)
    factory = sessionmaker(engine)
    insert = service.orders.insert()

    if o.side == "outbox":
        listener = SqlTransactionListener(factory, None, group=GROUP, table=LOG_TABLE)
        producer = TransactionProducer(GROUP, listener, settings).start()

        def request() -> None:
            order_id = uuid.uuid4().hex
            message = Message(o.topic, service.value(order_id), key=order_id)
            with producer.transaction(message) as txn:
                with Session(engine) as session, session.begin():
                    session.execute(insert, service.row(order_id))
                    txn.join(session)
                committed_at = time.monotonic()
            if txn.result is not None and txn.result.end_status is EndStatus.COMMITTED:
                service.stamp(order_id, committed_at)
            else:
                service.failed(f"end status {txn.result and txn.result.end_status}")

    else:

        def business(session: Session, message: Message, order_id: str) -> None:
            session.execute(insert, service.row(order_id))
            session.info["order_id"] = order_id

        stamps: dict[str, float] = {}

        @sa.event.listens_for(factory, "after_commit")
        def committed(session: Session) -> None:
            order_id = session.info.pop("order_id", None)
            if order_id is not None:
                stamps[order_id] = time.monotonic()

        listener = SqlTransactionListener(factory, business, group=GROUP, table=LOG_TABLE)
        producer = TransactionProducer(GROUP, listener, settings).start()

        def request() -> None:
            order_id = uuid.uuid4().hex
            message = Message(o.topic, service.value(order_id), key=order_id)
            result = producer.send_message_in_transaction(message, order_id)
            at = stamps.pop(order_id, None)
            if result.end_status is EndStatus.COMMITTED and at is not None:
                service.stamp(order_id, at)
            else:
                service.failed(f"end status {result.end_status}")

    def flush() -> None:
        with contextlib.ExitStack() as stack:
            connections = [stack.enter_context(engine.connect()) for _ in _pooled(engine)]
            for connection in connections:
                connection.execute(FLUSH_STATISTICS)
                connection.commit()

    def close() -> None:
        producer.shutdown()
        engine.dispose()

    return request, flush, close


AsyncSide = tuple[
    Callable[[], Awaitable[None]], Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]
]


async def _async_flush(engine: AsyncEngine) -> None:
    """:func:`flush_statistics` on an asyncio engine's pooled connections."""
    async with contextlib.AsyncExitStack() as stack:
        connections = [
            await stack.enter_async_context(engine.connect()) for _ in _pooled(engine.sync_engine)
        ]
        for connection in connections:
            await connection.execute(FLUSH_STATISTICS)
            await connection.commit()


async def _async_side(service: Service) -> AsyncSide:
    """``peer`` or ``outbox-async``: a request coroutine for tasks, the statistics' flush
    and the shutdown."""
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    o = service.options
    insert = service.orders.insert()
    pool = {"pool_size": o.concurrency + 2, "max_overflow": o.concurrency}
    if o.side == "peer":
        from faststream_outbox import OutboxBroker, make_outbox_table
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(
            asyncpg_url(o.database_url),
            connect_args={"server_settings": {"application_name": APPLICATION_NAME}},
            **pool,
        )
        table = make_outbox_table(sa.MetaData(), table_name=PEER_TABLE)
        broker = OutboxBroker(engine, outbox_table=table, logger=None)
        session_factory = async_sessionmaker(engine, expire_on_commit=False)

        async def request() -> None:
            order_id = uuid.uuid4().hex
            async with session_factory() as session, session.begin():
                await session.execute(insert, service.row(order_id))
                await broker.publish(service.value(order_id), queue=PEER_QUEUE, session=session)
            service.stamp(order_id, time.monotonic())

        async def close() -> None:
            await engine.dispose()

        return request, lambda: _async_flush(engine), close

    from outbox import AsyncTransactionProducer
    from outbox.sql import AsyncSqlTransactionListener, create_async_engine

    async_engine = create_async_engine(
        o.database_url, connect_args={"application_name": APPLICATION_NAME}, **pool
    )
    settings = ProducerSettings(bootstrap_servers=o.bootstrap_servers, topic_prefix=o.prefix)
    listener = AsyncSqlTransactionListener(
        async_sessionmaker(async_engine), None, group=GROUP, table=LOG_TABLE
    )
    producer = AsyncTransactionProducer(GROUP, listener, settings)
    await producer.start()

    async def request_async() -> None:
        order_id = uuid.uuid4().hex
        message = Message(o.topic, service.value(order_id), key=order_id)
        async with producer.transaction(message) as txn:
            async with AsyncSession(async_engine) as session, session.begin():
                await session.execute(insert, service.row(order_id))
                await txn.join(session)
            committed_at = time.monotonic()
        if txn.result is not None and txn.result.end_status is EndStatus.COMMITTED:
            service.stamp(order_id, committed_at)
        else:
            service.failed(f"end status {txn.result and txn.result.end_status}")

    async def close_async() -> None:
        await producer.shutdown()
        await async_engine.dispose()

    return request_async, lambda: _async_flush(async_engine), close_async


# --------------------------------------------------------------------------- driving


def _threads(request: Callable[[], None], service: Service, seconds: float) -> float:
    """``--concurrency`` threads sending requests for ``seconds``; the wall time they took."""
    deadline = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < deadline:
            try:
                request()
            except Exception as exc:  # a failed request is counted, the worker goes on
                service.failed(exc)

    began = time.monotonic()
    workers = [threading.Thread(target=loop) for _ in range(service.options.concurrency)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.monotonic() - began


async def _tasks(request: Callable[[], Awaitable[None]], service: Service, seconds: float) -> float:
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        while time.monotonic() < deadline:
            try:
                await request()
            except Exception as exc:
                service.failed(exc)

    began = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(service.options.concurrency)))
    return time.monotonic() - began


def _write(service: Service, phase: str, wall: float) -> None:
    document = {
        "phase": phase,
        "committed": service.committed,
        "wall_seconds": wall,
        "errors": service.errors,
        "first_error": service.first_error,
    }
    Path(service.options.out).write_text(json.dumps(document))


def _say(line: str) -> None:
    print(line, flush=True)


def run(options: argparse.Namespace) -> None:
    """Warm-up, statistics flushed, ``ready``; on ``go`` the measured phase, ``done``;
    then wait for ``exit``."""
    service = Service(options)
    if options.side in ("outbox", "outbox-sql"):
        request, flush, close = _sync_side(service)
        try:
            _write(service, "warmup", _threads(request, service, options.warmup))
            flush()
            _say("ready")
            if sys.stdin.readline().strip() == "go":
                service.new_phase()
                _write(service, "measured", _threads(request, service, options.seconds))
                _say("done")
                sys.stdin.readline()
        finally:
            close()
        return

    async def main() -> None:
        request, flush, close = await _async_side(service)
        loop = asyncio.get_running_loop()
        try:
            _write(service, "warmup", await _tasks(request, service, options.warmup))
            await flush()
            _say("ready")
            # The protocol's blocking reads run beside the loop, which keeps serving the
            # producer's tasks meanwhile.
            if (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
                service.new_phase()
                _write(service, "measured", await _tasks(request, service, options.seconds))
                _say("done")
                await loop.run_in_executor(None, sys.stdin.readline)
        finally:
            await close()

    asyncio.run(main())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_service")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--prefix", required=True, help="our outbox's topic prefix")
    parser.add_argument("--topic", required=True, help="the real topic (ours)")
    parser.add_argument("--cell", required=True, help="the tag of the order rows")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run(parse_args())
