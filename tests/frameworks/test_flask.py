"""Flask with Flask-SQLAlchemy: ``txn.join(db.session)``, the request's ``scoped_session``.

``db.session`` is not a ``Session`` but a registry that hands each request (app
context) its own; a view passes it as it passes it everywhere else, and
``join`` uses the current session of the scope. ``/orders`` commits with
``db.session.commit()``; ``/orders/declined`` raises inside
``db.session.begin()`` after a savepoint was released, so the transaction is
rolled back before the outbox block ends. Driven by Flask's test client.
"""

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, request
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import sessionmaker

from outbox import Message, TransactionProducer
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


class PaymentDeclined(Exception):
    """A business refusal, answered 402 by the app's error handler (werkzeug has no 402)."""


def create_app(database: Database, topics: OutboxTopics) -> tuple[Flask, SQLAlchemy]:
    """An order service; its producer is started by :func:`client` within the app context
    (the listener's sessions use Flask-SQLAlchemy's engine, which needs it)."""
    app = Flask(__name__)
    app.config["TESTING"] = True  # a view's exception reaches the test, not a 500 page
    app.config["SQLALCHEMY_DATABASE_URI"] = database.url
    db = SQLAlchemy(app)
    Order = order_model(database)
    transactions: dict[str, Any] = {}
    app.extensions["outbox_transactions"] = transactions

    def message(order_id: str) -> Message:
        return Message(topics.real_topic, f'{{"id": "{order_id}"}}', key=order_id)

    @app.post("/orders")
    def place_order() -> dict[str, str]:
        order_id = request.get_json()["id"]
        with app.extensions["outbox_producer"].transaction(message(order_id)) as txn:
            transactions[order_id] = txn
            db.session.add(Order(id=order_id, transaction_id=txn.transaction_id))
            txn.join(db.session)
            db.session.commit()
        return {"transaction_id": txn.transaction_id}

    @app.post("/orders/declined")
    def decline_order() -> dict[str, str]:
        order_id = request.get_json()["id"]
        with (
            app.extensions["outbox_producer"].transaction(message(order_id)) as txn,
            db.session.begin(),  # rolls back on the way out of the raise below
        ):
            transactions[order_id] = txn
            db.session.add(Order(id=order_id, transaction_id=txn.transaction_id))
            txn.join(db.session)
            with db.session.begin_nested():  # released: says nothing about the outer one
                db.session.add(Order(id=hold_id(order_id), transaction_id=txn.transaction_id))
            raise PaymentDeclined(order_id)

    @app.errorhandler(PaymentDeclined)
    def declined(error: PaymentDeclined) -> tuple[dict[str, str], int]:
        return {"declined": str(error)}, 402

    return app, db


@pytest.fixture(scope="module")
def client(framework_database: Database, framework_topics: OutboxTopics) -> Iterator[FlaskClient]:
    """One app and one producer for the module's tests on one database."""
    app, db = create_app(framework_database, framework_topics)
    group = group_of("flask", framework_database)
    with app.app_context():
        engine = db.engine
    listener = SqlTransactionListener(
        sessionmaker(engine),
        None,  # no business function: the views commit their own transactions
        group=group,
        table=framework_database.target.table,
        schema=framework_database.target.schema,
    )
    with TransactionProducer(group, listener, framework_topics.settings()) as producer:
        app.extensions["outbox_producer"] = producer
        yield app.test_client()
    engine.dispose()  # before the module's tables are dropped


def transaction_of(client: FlaskClient, order_id: str) -> Any:
    return client.application.extensions["outbox_transactions"][order_id]


def test_a_committed_order_is_published_once(
    client: FlaskClient, framework_database: Database, framework_topics: OutboxTopics,
    framework_relay: None,
) -> None:  # fmt: skip
    order_id = new_order_id()
    response = client.post("/orders", json={"id": order_id})
    assert response.status_code == 200, response.text
    txn = transaction_of(client, order_id)
    assert response.get_json() == {"transaction_id": txn.transaction_id}
    assert_committed_once(framework_database, framework_topics, txn.result, order_id)


def test_a_request_that_raises_after_a_released_savepoint_publishes_nothing(
    client: FlaskClient, framework_database: Database, framework_topics: OutboxTopics,
    framework_relay: None,
) -> None:  # fmt: skip
    order_id = new_order_id()
    response = client.post("/orders/declined", json={"id": order_id})
    assert response.status_code == 402, response.text
    txn = transaction_of(client, order_id)
    assert_rolled_back(framework_database, framework_topics, txn.result, order_id)
