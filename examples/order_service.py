"""A small order service that publishes ``order-created`` events through the outbox.

The local transaction is a SQLite transaction that inserts the order and records
the transaction id in the same database transaction, so the check-back is a
lookup: id recorded -> COMMIT, otherwise ROLLBACK (after a grace period, in a
real service, to let a slow transaction finish).

Run it against a broker with the outbox topics and an ``orders`` topic::

    outbox dev kafka start
    outbox topics create --partitions 3
    python examples/order_service.py --bootstrap 127.0.0.1:PORT --topic orders

(`outbox topics create` does not create your own topics: create ``orders`` with
any Kafka tool, or pass ``--create-topic``.)
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import threading

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer


class OrderListener:
    """Runs the order insert as the local transaction and answers check-backs."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._lock = threading.Lock()  # one sqlite connection, many sending threads
        with self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total REAL)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS outbox_log (transaction_id TEXT PRIMARY KEY)"
            )

    def execute_local_transaction(self, message: Message, order: dict) -> LocalTransactionState:
        if order["total"] <= 0:
            return LocalTransactionState.ROLLBACK_MESSAGE  # a business rule said no
        with self._lock, self._db:  # one database transaction: both rows or neither
            self._db.execute("INSERT INTO orders VALUES (?, ?)", (order["id"], order["total"]))
            self._db.execute("INSERT INTO outbox_log VALUES (?)", (message.transaction_id,))
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM outbox_log WHERE transaction_id = ?", (message.transaction_id,)
            ).fetchone()
        return (
            LocalTransactionState.COMMIT_MESSAGE if row else LocalTransactionState.ROLLBACK_MESSAGE
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--prefix", default="outbox")
    parser.add_argument("--db", default=":memory:")
    parser.add_argument("--create-topic", action="store_true")
    args = parser.parse_args()

    if args.create_topic:
        from confluent_kafka.admin import AdminClient

        from outbox.admin import TopicSpec, ensure_topics

        ensure_topics(
            AdminClient({"bootstrap.servers": args.bootstrap}), [TopicSpec(args.topic, 3, 1)]
        )

    settings = ProducerSettings(bootstrap_servers=args.bootstrap, topic_prefix=args.prefix)
    orders = [
        {"id": "o-1", "total": 42.0},
        {"id": "o-2", "total": 0.0},
        {"id": "o-3", "total": 7.5},
    ]
    with TransactionProducer("order-service", OrderListener(args.db), settings) as producer:
        for order in orders:
            message = Message(args.topic, json.dumps(order), key=order["id"])
            result = producer.send_message_in_transaction(message, order)
            print(
                f"{order['id']}: {result.local_transaction_state.name} -> {result.end_status.name}"
            )


if __name__ == "__main__":
    main()
