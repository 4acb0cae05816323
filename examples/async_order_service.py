"""An asyncio order service: FastAPI's ``POST /orders`` places an order through the outbox.

The endpoint places the order in the request's own session (a FastAPI
dependency), as a service writes its other rows: ``producer.transaction(...)``
writes the half, the handler inserts the order and joins the session, so the
outbox's transaction-log row commits (or rolls back) with the order in one
SQLAlchemy asyncio transaction, and the decision written when the block ends
follows what the database did. Awaiting Kafka's acknowledgements leaves the
event loop free for the other requests. The ``order-created`` event reaches the
``orders`` topic through the checker's relay once the order is committed; a
check-back (answered on this service's loop by ``AsyncSqlTransactionListener``)
is a lookup of that row.

``POST /orders/via-listener`` places the same order the other way: the
listener runs the local transaction itself (``send_message_in_transaction``
with a business function), for code that has no session of its own at hand.

Run it against a broker with the outbox topics and an ``orders`` topic::

    pip install 'kafka-outbox[examples]'
    outbox dev kafka start
    outbox topics create --partitions 3
    export OUTBOX_BOOTSTRAP_SERVERS=127.0.0.1:PORT
    export OUTBOX_DATABASE_URL=postgresql+psycopg://USER:PASSWORD@HOST/DB  # or sqlite:///orders.db
    uvicorn examples.async_order_service:app
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"reference": "o-1", "total": 42.0}'

Every ``OUTBOX_*`` producer variable applies (``OUTBOX_TOPIC_PREFIX``, ...);
``ORDERS_TOPIC`` names the events' topic (default ``orders``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from outbox import (
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    ProducerSettings,
    TransactionSendResult,
)
from outbox.sql import (
    DATABASE_URL_ENV,
    AsyncSqlTransactionListener,
    create_async_engine,
    upgrade,
)

GROUP = "async-order-service"
TOPIC_ENV = "ORDERS_TOPIC"

ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("reference", sa.String(64), nullable=False),
    sa.Column("total", sa.Float, nullable=False),
    sa.Column("transaction_id", sa.String(128), nullable=False),
)


class Order(BaseModel):
    reference: str = Field(min_length=1, max_length=64)
    total: float


DECLINED = "declined: the total must be positive"


class OrderDeclined(Exception):
    """A business rule said no once the order was written: its transaction rolls back."""


def insert_order(order: Order, transaction_id: str) -> sa.Insert:
    return ORDERS.insert().values(
        reference=order.reference, total=order.total, transaction_id=transaction_id
    )


async def create_order(session: AsyncSession, message: Message, order: Order) -> object:
    """``/orders/via-listener``'s business change; the listener adds the log row and
    commits both, or neither."""
    if order.total <= 0:
        return LocalTransactionState.ROLLBACK_MESSAGE  # a business rule said no
    await session.execute(insert_order(order, message.transaction_id or ""))
    return None


async def request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The request's own database session, as a FastAPI dependency."""
    async with request.app.state.sessions() as session:
        yield session


RequestSession = Annotated[AsyncSession, Depends(request_session)]


def create_app(
    settings: ProducerSettings | None = None,
    database_url: str | None = None,
    topic: str | None = None,
) -> FastAPI:
    """The service; arguments left out come from the environment (see the module docs)."""
    url = database_url or os.environ.get(DATABASE_URL_ENV) or "sqlite:///orders.db"
    events_topic = topic or os.environ.get(TOPIC_ENV) or "orders"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(upgrade, url)  # the transaction-log table, by the migrations
        engine = create_async_engine(url)
        async with engine.begin() as connection:
            await connection.run_sync(ORDERS.metadata.create_all)  # the service's own table
        sessions = app.state.sessions = async_sessionmaker(engine)
        listener = AsyncSqlTransactionListener(sessions, create_order, group=GROUP)
        await listener.verify()
        try:
            async with AsyncTransactionProducer(GROUP, listener, settings) as producer:
                app.state.producer = producer
                yield
        finally:
            await engine.dispose()

    app = FastAPI(title="async order service", lifespan=lifespan)

    @app.post("/orders")
    async def place_order(order: Order, request: Request, session: RequestSession) -> JSONResponse:
        """The order and its event's log row in the request's session: one transaction.

        ``session.begin()`` ends (committed, or rolled back by the raise) inside
        the outbox block, so the decision written on the block's way out is
        what the database did: COMMIT for a committed order, ROLLBACK for a
        declined one, nothing (202, the check-back decides) if the COMMIT's
        answer was lost.
        """
        producer: AsyncTransactionProducer = request.app.state.producer
        message = Message(events_topic, order.model_dump_json(), key=order.reference)
        transaction = producer.transaction(message)
        declined = None
        try:
            async with transaction as txn, session.begin():
                await session.execute(insert_order(order, txn.transaction_id))
                await txn.join(session)  # the log row, in this transaction
                if order.total <= 0:
                    raise OrderDeclined(DECLINED)
        except OrderDeclined as refusal:
            declined = str(refusal)  # rolled back, order and log row alike
        assert transaction.result is not None  # the block ended: its decision is written
        return _response(transaction.result, declined)

    @app.post("/orders/via-listener")
    async def place_order_via_listener(order: Order, request: Request) -> JSONResponse:
        """The listener's form: it opens, commits or rolls back the session itself."""
        producer: AsyncTransactionProducer = request.app.state.producer
        message = Message(events_topic, order.model_dump_json(), key=order.reference)
        result = await producer.send_message_in_transaction(message, order)
        declined = DECLINED if order.total <= 0 else None
        return _response(result, declined)

    return app


def _response(result: TransactionSendResult, declined: str | None = None) -> JSONResponse:
    """201 placed, 422 declined by a business rule, 500 failed, 202 when unknown yet."""
    body: dict[str, Any] = {
        "transaction_id": result.transaction_id,
        "state": result.local_transaction_state.name,
        "end": result.end_status.name,
    }
    state = result.local_transaction_state
    if state is LocalTransactionState.COMMIT_MESSAGE:
        return JSONResponse(body, status_code=201)
    if result.local_transaction_error is not None:
        body["error"] = str(result.local_transaction_error)
    if state is LocalTransactionState.ROLLBACK_MESSAGE:
        if "error" not in body and declined is not None:
            body["declined"] = declined
        return JSONResponse(body, status_code=500 if "error" in body else 422)
    return JSONResponse(body, status_code=202)  # UNKNOW: the check-back will settle it


app = create_app()
"""For ``uvicorn examples.async_order_service:app``: configured from the environment at start-up."""
