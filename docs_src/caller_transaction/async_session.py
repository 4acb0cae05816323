import asyncio
import json
import os
import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import AsyncTransactionProducer, Message, TransactionSendResult
from outbox.sql import AsyncSqlTransactionListener, create_async_engine


class Base(DeclarativeBase):
    pass


class Order(Base):  # your ORM model
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(primary_key=True)
    total: Mapped[float]


engine = create_async_engine(os.environ.get("OUTBOX_DATABASE_URL", "sqlite:///shop.db"))
listener = AsyncSqlTransactionListener(async_sessionmaker(engine), None, group="order-service")
producer = AsyncTransactionProducer("order-service", listener)  # settings: OUTBOX_*


async def place_order(order: Order) -> TransactionSendResult | None:  # e.g. a FastAPI route
    payload = json.dumps({"id": order.id, "total": order.total})
    async with producer.transaction(Message("orders", payload, key=order.id)) as txn:
        print("half written:", txn.transaction_id)  # written and acknowledged
        async with AsyncSession(engine) as session, session.begin():
            session.add(order)
            await txn.join(session)
    return txn.result


async def main() -> None:
    async with engine.begin() as connection:  # your tables; the log is `outbox db upgrade`'s
        await connection.run_sync(Base.metadata.create_all)
    await producer.start()  # in a web service: at startup (FastAPI's lifespan)
    try:
        result = await place_order(Order(id=str(uuid.uuid4()), total=42.0))
        print(result.end_status if result else None)
    finally:
        await producer.shutdown()  # and at shutdown
        await engine.dispose()


asyncio.run(main())
