import json
import os
import uuid

from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from outbox import Message, TransactionProducer
from outbox.sql import SqlTransactionListener, create_engine


class Base(DeclarativeBase):
    pass


class Order(Base):  # your ORM model
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(primary_key=True)
    total: Mapped[float]


engine = create_engine(os.environ.get("OUTBOX_DATABASE_URL", "sqlite:///shop.db"))
Base.metadata.create_all(engine)  # your tables; the log table is `outbox db upgrade`'s
# No business function: the listener answers the check-backs from its log table.
listener = SqlTransactionListener(sessionmaker(engine), None, group="order-service")
producer = TransactionProducer("order-service", listener).start()  # settings: OUTBOX_*

order = Order(id=str(uuid.uuid4()), total=42.0)
payload = json.dumps({"id": order.id, "total": order.total})
with producer.transaction(Message("orders", payload, key=order.id)) as txn:
    print("half written:", txn.transaction_id)  # written and acknowledged
    with Session(engine) as session, session.begin():
        session.add(order)
        txn.join(session)  # the transaction-log row goes into this session
# the decision follows what the database did
print(txn.result.end_status)
producer.shutdown()
