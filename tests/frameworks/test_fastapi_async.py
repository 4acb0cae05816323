"""FastAPI, asyncio: ``AsyncSession`` and ``async with producer.transaction(...)`` from async
``yield`` dependencies, the producer started in the app's lifespan.

As in the sync module, the block's dependency comes before the session's, so
the session ends (closed, rolled back if it was not committed) inside the
block. ``/orders/scoped`` joins an ``async_scoped_session`` (one session per
request task, the registry many asyncio services use) instead of the
dependency's session. Driven by ``TestClient``, whose lifespan starts the
producer once for the module's tests on each database.
"""

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session, async_sessionmaker

from outbox import AsyncTransactionProducer, Message, ProducerSettings
from outbox.caller_transaction import AsyncCallerTransaction
from outbox.sql import AsyncSqlTransactionListener, create_async_engine
from tests.frameworks.conftest import (
    assert_committed_once,
    assert_rolled_back,
    group_of,
    hold_id,
    new_order_id,
    order_model,
)
from tests.producer.conftest import OutboxTopics
from tests.sql.conftest import Database

pytestmark = pytest.mark.kafka


class OrderIn(BaseModel):
    id: str


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The request's session, an async yield dependency."""
    async with request.app.state.sessions() as session:
        yield session


async def outbox_transaction(
    order: OrderIn, request: Request
) -> AsyncIterator[AsyncCallerTransaction]:
    """The outbox block around the rest of the request (half before, decision after)."""
    state = request.app.state
    message = Message(state.topic, order.model_dump_json(), key=order.id)
    async with state.producer.transaction(message) as txn:
        state.transactions[order.id] = txn
        yield txn


# Declared in this order on each endpoint: the block first, so it ends last.
OutboxTransaction = Annotated[AsyncCallerTransaction, Depends(outbox_transaction)]
RequestSession = Annotated[AsyncSession, Depends(get_session)]


def create_app(database: Database, settings: ProducerSettings, group: str, topic: str) -> FastAPI:
    """An order service on ``database`` (its asyncio driver), publishing to ``topic``."""
    Order = order_model(database)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_async_engine(database.url)
        sessions = app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        app.state.scoped = async_scoped_session(sessions, scopefunc=asyncio.current_task)
        listener = AsyncSqlTransactionListener(
            sessions,
            None,  # no business function: the requests commit their own transactions
            group=group,
            table=database.target.table,
            schema=database.target.schema,
        )
        try:
            async with AsyncTransactionProducer(group, listener, settings) as producer:
                app.state.producer = producer
                yield
        finally:
            await engine.dispose()

    app = FastAPI(lifespan=lifespan)
    app.state.topic = topic
    app.state.transactions = {}

    @app.post("/orders")
    async def place_order(
        order: OrderIn, txn: OutboxTransaction, session: RequestSession
    ) -> dict[str, str]:
        session.add(Order(id=order.id, transaction_id=txn.transaction_id))
        await txn.join(session)
        await session.commit()
        return {"transaction_id": txn.transaction_id}

    @app.post("/orders/declined")
    async def decline_order(
        order: OrderIn, txn: OutboxTransaction, session: RequestSession
    ) -> dict[str, str]:
        session.add(Order(id=order.id, transaction_id=txn.transaction_id))
        await txn.join(session)
        async with session.begin_nested():  # released: says nothing about the outer one
            session.add(Order(id=hold_id(order.id), transaction_id=txn.transaction_id))
        raise HTTPException(402, "payment declined")

    @app.post("/orders/scoped")
    async def place_order_in_scoped_session(
        order: OrderIn, txn: OutboxTransaction, request: Request
    ) -> dict[str, str]:
        scoped: async_scoped_session[AsyncSession] = request.app.state.scoped
        try:
            scoped.add(Order(id=order.id, transaction_id=txn.transaction_id))
            await txn.join(scoped)
            await scoped.commit()
        finally:
            await scoped.remove()  # the task's session is closed before the block ends
        return {"transaction_id": txn.transaction_id}

    return app


@pytest.fixture(scope="module")
def client(framework_database: Database, framework_topics: OutboxTopics) -> Iterator[TestClient]:
    """One app, whose lifespan starts one producer, for the module's tests on one database."""
    group = group_of("fastapi-async", framework_database)
    app = create_app(
        framework_database, framework_topics.settings(), group, framework_topics.real_topic
    )
    with TestClient(app) as client:
        yield client


def transaction_of(client: TestClient, order_id: str) -> Any:
    return client.app.state.transactions[order_id]  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/orders", "/orders/scoped"])
def test_a_committed_order_is_published_once(
    client: TestClient, framework_database: Database, framework_topics: OutboxTopics,
    framework_relay: None, path: str,
) -> None:  # fmt: skip
    order_id = new_order_id()
    response = client.post(path, json={"id": order_id})
    assert response.status_code == 200, response.text
    txn = transaction_of(client, order_id)
    assert response.json() == {"transaction_id": txn.transaction_id}
    assert_committed_once(framework_database, framework_topics, txn.result, order_id)


def test_a_request_that_raises_after_a_released_savepoint_publishes_nothing(
    client: TestClient, framework_database: Database, framework_topics: OutboxTopics,
    framework_relay: None,
) -> None:  # fmt: skip
    order_id = new_order_id()
    response = client.post("/orders/declined", json={"id": order_id})
    assert response.status_code == 402, response.text
    txn = transaction_of(client, order_id)
    assert_rolled_back(framework_database, framework_topics, txn.result, order_id)
