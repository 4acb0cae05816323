from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer


class OrderListener:
    def execute_local_transaction(self, message: Message, order: dict) -> LocalTransactionState:
        # Your database transaction. Record message.transaction_id in it, and the
        # half it belongs to (message.half_partition, message.half_offset), so
        # that check_local_transaction can answer later: COMMIT only for that half.
        ...
        return LocalTransactionState.COMMIT_MESSAGE  # or ROLLBACK_MESSAGE, or UNKNOW

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        # Asked by the checker when the outcome never arrived: look it up.
        ...
        return LocalTransactionState.UNKNOW  # not known yet: asked again later


settings = ProducerSettings()  # OUTBOX_BOOTSTRAP_SERVERS and the other OUTBOX_* variables
order = {"id": 1}
with TransactionProducer("order-service", OrderListener(), settings) as producer:
    result = producer.send_message_in_transaction(
        Message("orders", b'{"id": 1}', key="order-1"), arg=order
    )
print(result.transaction_id, result.end_status)
