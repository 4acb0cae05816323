"""A producer of the demo's order service that dies between its database commit and its end.

``python -m outbox_devtools.demo_crash BOOTSTRAP PREFIX TOPIC DATABASE_URL ORDER_ID``:
places one order through :class:`outbox.sql.SqlTransactionListener`, prints
``DB_COMMITTED <transaction id>`` once the database transaction has committed,
and hangs until it is killed, so its decision op is never written. The
checker's check-back (answered by a live producer of the group from the
transaction log) must decide it, and the relay publish the event. The demo and the tests use it.
"""

from __future__ import annotations

import logging
import sys
import threading

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from outbox.message import LocalTransactionState, Message
from outbox.producer import TransactionProducer
from outbox.settings import ProducerSettings
from outbox.sql import SqlTransactionListener, create_engine

GROUP = "order-service"


def log_errors_only() -> None:
    """The demo's logging: its screen is its own progress and tables; rolled-back
    orders log a warning each and librdkafka reconnects noisily, so errors only."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s %(message)s")


def place_order(session: Session, message: Message, order: dict[str, object]) -> None:
    """The business change: one row in ``orders``; a negative total is refused."""
    if float(order["total"]) < 0:  # type: ignore[arg-type]
        raise ValueError(f"order {order['id']}: a total cannot be negative")
    session.execute(
        sa.text("INSERT INTO orders (id, total) VALUES (:id, :total)"),
        {"id": order["id"], "total": order["total"]},
    )


class DiesAfterCommit(SqlTransactionListener):
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        state = super().execute_local_transaction(message, arg)
        if state is not LocalTransactionState.COMMIT_MESSAGE:
            print(f"NOT_COMMITTED {message.transaction_id} {state.name}", flush=True)
            return state
        print(f"DB_COMMITTED {message.transaction_id}", flush=True)
        threading.Event().wait()  # until SIGKILL
        raise AssertionError("unreachable")


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    bootstrap, prefix, topic, url, order_id = argv[1:6]
    log_errors_only()  # its stderr is the demo's screen
    listener = DiesAfterCommit(sessionmaker(create_engine(url)), place_order, group=GROUP)
    settings = ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    producer = TransactionProducer(GROUP, listener, settings).start()
    order = {"id": int(order_id), "total": 10.0}
    producer.send_message_in_transaction(
        Message(topic, f'{{"order": {order_id}}}', key=order_id), order
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
