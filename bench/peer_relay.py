"""The polling outbox's relay, run by :mod:`bench.peer` as its own process.

faststream-outbox's standalone relay as its relay guide sets it up: an
``OutboxBroker`` on the service's PostgreSQL (asyncpg, so its fetch loop
``LISTEN``\\s for the ``pg_notify`` each publish sends), a subscriber on the
outbox queue with a FastStream Kafka publisher stacked on it, and one
``FastStream`` app that connects the Kafka broker at start-up. The handler
returns the row's body unchanged: the record the service wrote is the record
Kafka gets. ``--workers``, ``--fetch-batch`` and ``--flush-batch`` are the
subscriber's ``max_workers``, ``fetch_batch_size`` and ``terminal_flush_batch_size``
(the package's defaults: 1, 10 and 1). Its pooled connections carry
``--application-name``, so that the bench can wait for them to close.

Stopped by SIGTERM (FastStream's own shutdown: in-flight rows finish).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence

from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream_outbox import OutboxBroker, make_outbox_table
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine


def build_app(options: argparse.Namespace) -> FastStream:
    outbox_table = make_outbox_table(MetaData(), table_name=options.table)
    # One fetch connection and one per worker, as its connection budget asks.
    engine = create_async_engine(
        options.database_url,
        pool_size=options.workers + 2,
        connect_args={"server_settings": {"application_name": options.application_name}},
    )
    broker_outbox = OutboxBroker(engine, outbox_table=outbox_table, logger=None)
    broker_kafka = KafkaBroker(options.bootstrap_servers, logger=None)
    publisher_kafka = broker_kafka.publisher(options.topic)

    @publisher_kafka
    @broker_outbox.subscriber(
        options.queue,
        max_workers=options.workers,
        fetch_batch_size=options.fetch_batch,
        terminal_flush_batch_size=options.flush_batch,
    )
    async def relay(body: bytes) -> bytes:
        return body

    return FastStream(broker_outbox, on_startup=[broker_kafka.connect], logger=None)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_relay")
    parser.add_argument("--database-url", required=True, help="postgresql+asyncpg://...")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--fetch-batch", type=int, default=10)
    parser.add_argument("--flush-batch", type=int, default=1)
    parser.add_argument("--application-name", default="bench-peer-relay")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(build_app(parse_args(argv)).run())


if __name__ == "__main__":
    main()
