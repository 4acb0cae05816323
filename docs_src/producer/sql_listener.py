import json
import os
import uuid

from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from outbox import Message, ProducerSettings, TransactionProducer
from outbox.sql import SqlTransactionListener, create_engine


class Base(DeclarativeBase):
    pass


class Order(Base):  # your ORM model
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(primary_key=True)
    total: Mapped[float]


engine = create_engine(os.environ.get("OUTBOX_DATABASE_URL", "sqlite:///shop.db"))
Base.metadata.create_all(engine)  # your tables; the log table is `outbox db upgrade`'s


def create_order(session: Session, message: Message, order: dict) -> None:
    """Must not commit: the listener commits it together with the log row."""
    session.add(Order(id=order["id"], total=order["total"]))
    if order["total"] <= 0:
        raise ValueError("empty order")  # rolls back; kept as result.local_transaction_error


listener = SqlTransactionListener(sessionmaker(engine), create_order, group="order-service")
listener.verify()  # fails fast if the database or the table (`outbox db upgrade`) is missing
settings = ProducerSettings()  # OUTBOX_BOOTSTRAP_SERVERS=kafka:9092, or bootstrap_servers=...
order = {"id": str(uuid.uuid4()), "total": 42.0}
with TransactionProducer("order-service", listener, settings) as producer:
    result = producer.send_message_in_transaction(
        Message("orders", json.dumps(order), key=order["id"]), arg=order
    )
print(result.transaction_id, result.local_transaction_state, result.end_status)
