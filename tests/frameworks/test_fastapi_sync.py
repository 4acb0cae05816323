"""FastAPI, sync: the session and the outbox block both come from sync ``yield`` dependencies.

This is the shape that crosses ``contextvars`` contexts: FastAPI runs a sync
generator dependency's setup and its teardown in two separate thread-pool calls
(``contextmanager_in_threadpool``; anyio's ``run_sync`` runs each in its own
``copy_context()``), so ``producer.transaction(...).__enter__`` and ``__exit__``
see different contexts. A request must still answer 200 with the decision
written, not fail in the teardown.

The block's dependency is declared before the session's: FastAPI ends
dependencies in reverse order, so the request's session is closed (rolled back
if it was not committed) inside the outbox block, and the decision at the
block's end reads a transaction that is over. Driven by ``TestClient``, which
returns once the app has finished, teardowns included.
"""

from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from outbox import Message, TransactionProducer
from outbox.caller_transaction import CallerTransaction
from outbox.sql import SqlTransactionListener
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


def get_session(request: Request) -> Iterator[Session]:
    """The request's session, as FastAPI's SQL guide writes it (a sync yield dependency)."""
    engine: Engine = request.app.state.engine
    with Session(engine) as session:
        yield session


def outbox_transaction(order: OrderIn, request: Request) -> Iterator[CallerTransaction]:
    """The outbox block around the rest of the request: the half is written before the
    endpoint runs, the decision when the request's dependencies end."""
    state = request.app.state
    message = Message(state.topic, order.model_dump_json(), key=order.id)
    with state.producer.transaction(message) as txn:
        state.transactions[order.id] = txn
        yield txn


# Declared in this order on each endpoint: the block first, so it ends last.
OutboxTransaction = Annotated[CallerTransaction, Depends(outbox_transaction)]
RequestSession = Annotated[Session, Depends(get_session)]


def create_app(producer: TransactionProducer, database: Database, topic: str) -> FastAPI:
    """An order service: ``/orders`` commits an order, ``/orders/declined`` declines one
    after its stock hold (a savepoint) was released."""
    app = FastAPI()
    app.state.producer = producer
    app.state.engine = database.engine
    app.state.topic = topic
    app.state.transactions = {}
    Order = order_model(database)

    @app.post("/orders")
    def place_order(
        order: OrderIn, txn: OutboxTransaction, session: RequestSession
    ) -> dict[str, str]:
        session.add(Order(id=order.id, transaction_id=txn.transaction_id))
        txn.join(session)
        session.commit()
        return {"transaction_id": txn.transaction_id}

    @app.post("/orders/declined")
    def decline_order(
        order: OrderIn, txn: OutboxTransaction, session: RequestSession
    ) -> dict[str, str]:
        session.add(Order(id=order.id, transaction_id=txn.transaction_id))
        txn.join(session)
        with session.begin_nested():  # released: says nothing about the outer transaction
            session.add(Order(id=hold_id(order.id), transaction_id=txn.transaction_id))
        raise HTTPException(402, "payment declined")

    return app


@pytest.fixture(scope="module")
def client(framework_database: Database, framework_topics: OutboxTopics) -> Iterator[TestClient]:
    """One app and one producer for the module's tests on one database."""
    database = framework_database
    group = group_of("fastapi-sync", database)
    listener = SqlTransactionListener(
        sessionmaker(database.engine),
        None,  # no business function: the requests commit their own transactions
        group=group,
        table=database.target.table,
        schema=database.target.schema,
    )
    with TransactionProducer(group, listener, framework_topics.settings()) as producer:
        app = create_app(producer, database, framework_topics.real_topic)
        with TestClient(app) as client:
            yield client


def transaction_of(client: TestClient, order_id: str) -> Any:
    return client.app.state.transactions[order_id]  # type: ignore[attr-defined]


def test_a_committed_order_is_published_once(
    client: TestClient, framework_database: Database, framework_topics: OutboxTopics,
    framework_relay: None,
) -> None:  # fmt: skip
    order_id = new_order_id()
    response = client.post("/orders", json={"id": order_id})
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
