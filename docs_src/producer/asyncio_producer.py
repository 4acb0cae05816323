import asyncio

from outbox import AsyncTransactionProducer, LocalTransactionState, Message, ProducerSettings


class OrderListener:
    async def execute_local_transaction(
        self, message: Message, order: dict
    ) -> LocalTransactionState:
        ...  # your database transaction, recording message.transaction_id
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        ...  # look message.transaction_id up
        return LocalTransactionState.UNKNOW


async def main() -> None:
    settings = ProducerSettings()  # OUTBOX_BOOTSTRAP_SERVERS and the other OUTBOX_* variables
    async with AsyncTransactionProducer("order-service", OrderListener(), settings) as producer:
        result = await producer.send_message_in_transaction(
            Message("orders", b'{"id": 1}', key="order-1"), arg={"id": 1}
        )
    print(result.transaction_id, result.end_status)


asyncio.run(main())
