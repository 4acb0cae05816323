import json
import os
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from outbox import Message, ProducerSettings, SendStatus, TransactionProducer
from outbox.sql import SqlTransactionListener, create_engine

engine = create_engine(os.environ.get("OUTBOX_DATABASE_URL", "sqlite:///shop.db"))
orders = sa.Table(
    "parked_orders_demo",
    sa.MetaData(),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("total", sa.Float, nullable=False),
)
orders.create(engine, checkfirst=True)  # your tables; the log table is `outbox db upgrade`'s


def place_order(session: Session, message: Message, order: dict) -> None:
    session.execute(orders.insert().values(**order))


listener = SqlTransactionListener(sessionmaker(engine), place_order, group="order-service")
# Or OUTBOX_PARK_WHEN_UNAVAILABLE=true and OUTBOX_PARK_AFTER_SECONDS=0.5 in the environment.
settings = ProducerSettings(park_when_unavailable=True, park_after_seconds=0.5)
with TransactionProducer("order-service", listener, settings) as producer:
    order = {"id": str(uuid.uuid4()), "total": 42.0}
    message = Message("orders", json.dumps(order), key=order["id"])
    result = producer.send_message_in_transaction(message, order)
    if result.send_status is SendStatus.PARKED:
        # Kafka did not acknowledge the half within 0.5 s: the order is committed and its
        # event waits in the transaction log; the checker publishes it when Kafka is back.
        print("parked:", result.transaction_id, result.end_status)
    else:
        print("sent:", result.transaction_id, result.end_status)
