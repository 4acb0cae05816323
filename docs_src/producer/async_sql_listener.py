import asyncio
import json
import os
import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import AsyncTransactionProducer, Message
from outbox.sql import AsyncSqlTransactionListener, create_async_engine


class Base(DeclarativeBase):
    pass


class Order(Base):  # your ORM model
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(primary_key=True)
    total: Mapped[float]


engine = create_async_engine(os.environ.get("OUTBOX_DATABASE_URL", "sqlite:///shop.db"))


async def create_order(session: AsyncSession, message: Message, order: dict) -> None:
    """Must not commit: the listener commits it together with the log row."""
    session.add(Order(id=order["id"], total=order["total"]))
    if order["total"] <= 0:
        raise ValueError("empty order")  # rolls back; kept as result.local_transaction_error


async def main() -> None:
    async with engine.begin() as connection:  # your tables; the log is `outbox db upgrade`'s
        await connection.run_sync(Base.metadata.create_all)
    listener = AsyncSqlTransactionListener(
        async_sessionmaker(engine), create_order, group="order-service"
    )
    await listener.verify()
    order = {"id": str(uuid.uuid4()), "total": 42.0}
    async with AsyncTransactionProducer("order-service", listener) as producer:  # OUTBOX_*
        result = await producer.send_message_in_transaction(
            Message("orders", json.dumps(order), key=order["id"]), arg=order
        )
    print(result.transaction_id, result.local_transaction_state, result.end_status)
    await engine.dispose()


asyncio.run(main())
