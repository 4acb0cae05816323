# ruff: noqa: SIM117 - the nesting a service writes: the outbox block, then its session
"""A process that commits its own database transaction inside ``producer.transaction(...)``
and is SIGKILLed before the decision: for tests/sql/test_caller_transaction.py.

Usage: ``caller_crash.py BOOTSTRAP PREFIX TOPIC DATABASE_URL LOG_TABLE ORDERS_TABLE``.
Prints ``COMMITTED <transaction id>`` once the database committed, then kills
itself with SIGKILL, still inside the ``with`` block: no op is ever written.
"""

from __future__ import annotations

import os
import signal
import sys

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from outbox import Message, ProducerSettings, TransactionProducer
from outbox.sql import SqlTransactionListener, create_engine


def main() -> None:
    bootstrap, prefix, topic, url, log_table, orders_table = sys.argv[1:7]
    engine = create_engine(url)
    orders = sa.Table(orders_table, sa.MetaData(), autoload_with=engine)
    listener = SqlTransactionListener(sessionmaker(engine), None, group="orders", table=log_table)
    settings = ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    with TransactionProducer("orders", listener, settings) as producer:
        with producer.transaction(Message(topic, b'{"id": "o-1"}', key="o-1")) as txn:
            with Session(engine) as session, session.begin():
                session.execute(
                    sa.insert(orders).values(id="o-1", transaction_id=txn.transaction_id)
                )
                txn.join(session)
            print(f"COMMITTED {txn.transaction_id}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
