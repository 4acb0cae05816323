"""A small order service that publishes ``order-created`` events through the outbox.

Each order is placed in the service's own database transaction, as a web
service places it in its request's session: ``producer.transaction(message)``
writes the half, ``txn.join(session)`` puts the outbox's transaction-log row
into the session's transaction beside the order row, and the decision follows
what the database did with them (committed: published; rolled back: not). So a
check-back, whether this service or ``outbox checker --resolve-from-db``
answers it, is a lookup of that row, which ``SqlTransactionListener`` does.

Run it against a broker with the outbox topics and an ``orders`` topic::

    outbox dev kafka start
    outbox topics create --partitions 3
    python examples/order_service.py --bootstrap 127.0.0.1:PORT --topic orders

(`outbox topics create` does not create your own topics: create ``orders`` with
any Kafka tool, or pass ``--create-topic``.) Left out, ``--bootstrap``,
``--prefix`` and ``--database-url`` come from ``OUTBOX_BOOTSTRAP_SERVERS``,
``OUTBOX_TOPIC_PREFIX`` and ``OUTBOX_DATABASE_URL``, which is how
docker-compose.yml's ``demo`` service points it at the compose Kafka and
PostgreSQL; with no database URL at all it uses a throwaway SQLite database.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from outbox import Message, ProducerSettings, TransactionProducer, TransactionSendResult
from outbox.config import BOOTSTRAP_ENV
from outbox.protocol import DEFAULT_PREFIX
from outbox.sql import DATABASE_URL_ENV, SqlTransactionListener, create_engine, upgrade

GROUP = "order-service"
PREFIX_ENV = "OUTBOX_TOPIC_PREFIX"

# Rows are keyed by a generated id, not by the order's reference, so that a
# second run against a database that outlives the service (compose's PostgreSQL)
# places its orders again instead of failing on the first run's rows.
ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("reference", sa.String(64), nullable=False),
    sa.Column("total", sa.Float, nullable=False),
)


class OrderDeclined(Exception):
    """A business rule said no once the order was written: its transaction rolls back."""


def place_order(
    producer: TransactionProducer, engine: Engine, topic: str, order: dict[str, Any]
) -> TransactionSendResult:
    """Write the order and its event's log row in one transaction; publish if it commits.

    The half is written when the outer block is entered; the session's
    transaction ends (``session.begin()``: committed, or rolled back by the
    raise) before the block does, so the decision the block writes on its way
    out is the database's: COMMIT for a committed order, ROLLBACK for a declined one.
    """
    transaction = producer.transaction(Message(topic, json.dumps(order), key=order["id"]))
    try:
        with transaction as txn, Session(engine) as session, session.begin():
            session.execute(ORDERS.insert().values(reference=order["id"], total=order["total"]))
            txn.join(session)  # the log row, in this transaction
            if order["total"] <= 0:
                raise OrderDeclined(f"{order['id']}: the total must be positive")
    except OrderDeclined:
        pass  # rolled back, order and log row alike: the result says ROLLBACK
    assert transaction.result is not None  # the block ended: its decision is written
    return transaction.result


def build_parser(environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """The flags; each left out takes its outbox variable from ``environ``, if set."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    bootstrap = environ.get(BOOTSTRAP_ENV) or None
    parser.add_argument(
        "--bootstrap",
        default=bootstrap,
        required=bootstrap is None,
        help=f"Kafka bootstrap servers (default: ${BOOTSTRAP_ENV})",
    )
    parser.add_argument("--topic", default="orders")
    parser.add_argument(
        "--prefix",
        default=environ.get(PREFIX_ENV) or DEFAULT_PREFIX,
        help=f"outbox topic prefix (default: ${PREFIX_ENV}, else {DEFAULT_PREFIX})",
    )
    parser.add_argument(
        "--database-url",
        default=environ.get(DATABASE_URL_ENV) or None,
        help=f"SQLAlchemy URL of the orders and the transaction log (default: "
        f"${DATABASE_URL_ENV}, else a throwaway SQLite database)",
    )
    parser.add_argument("--create-topic", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    if args.create_topic:
        from confluent_kafka.admin import AdminClient

        from outbox.admin import TopicSpec, ensure_topics

        ensure_topics(
            AdminClient({"bootstrap.servers": args.bootstrap}), [TopicSpec(args.topic, 3)]
        )

    orders = [
        {"id": "o-1", "total": 42.0},
        {"id": "o-2", "total": 0.0},
        {"id": "o-3", "total": 7.5},
    ]
    settings = ProducerSettings(bootstrap_servers=args.bootstrap, topic_prefix=args.prefix)
    with tempfile.TemporaryDirectory() as scratch:
        engine = create_engine(args.database_url or f"sqlite:///{Path(scratch) / 'orders.db'}")
        upgrade(engine)  # the transaction-log table, by the outbox's migrations
        ORDERS.metadata.create_all(engine)  # the service's own table
        # No business function: the orders commit in place_order's own transactions, and
        # the listener answers the check-backs from the log table their rows went into.
        listener = SqlTransactionListener(sessionmaker(engine), None, group=GROUP)
        listener.verify()
        with TransactionProducer(GROUP, listener, settings) as producer:
            for order in orders:
                result = place_order(producer, engine, args.topic, order)
                print(
                    f"{order['id']}: {result.local_transaction_state.name} -> "
                    f"{result.end_status.name}"
                )
        engine.dispose()


if __name__ == "__main__":
    main()
