"""``python -m bench.eos_copy``: plain Kafka's exactly-once copy loop, the relay's yardstick.

The relay publishes each committed decision with Kafka's consume → produce →
commit transaction. What Kafka itself allows for that path on a machine is
what the same loop costs with nothing of ours in it: this process reads one
topic (``read_committed``), writes each record to another and commits the
read offsets with the writes, one transaction per batch, with the relay's
transactional producer settings
(:func:`~outbox_checker.transactional.transactional_config`, ``linger.ms`` 1)
and batch (what is already fetched after the first record). It is
confluent-kafka's ``eos-transactions.py`` example, minus the transform.
:mod:`bench.visible` runs it as its own process, as it runs the checker, and
times a plain send to the source topic until the copy is visible (its
``plain`` mode).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from confluent_kafka import Consumer, Producer, TopicPartition

from outbox_checker.settings import CHECKER_DEFAULTS
from outbox_checker.transactional import transactional_config

BATCH = CHECKER_DEFAULTS.relay_batch
"""Most records read into one transaction: the relay's default batch."""


def copy(bootstrap: str, source: str, sink: str, group: str, stop: threading.Event) -> None:
    """Copy ``source`` to ``sink`` exactly once until ``stop`` is set."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer(
        transactional_config(
            {"bootstrap.servers": bootstrap},
            f"{group}-copier",
            linger_ms=1,
            transaction_timeout_ms=CHECKER_DEFAULTS.relay_transaction_timeout_ms,
        )
    )
    producer.init_transactions(30)
    consumer.subscribe([source])
    try:
        while not stop.is_set():
            first = consumer.poll(0.1)
            if first is None:
                continue
            batch = [first, *consumer.consume(BATCH - 1, timeout=0)]
            records = [m for m in batch if m.error() is None]
            if not records:
                continue
            producer.begin_transaction()
            for record in records:
                producer.produce(
                    sink, record.value(), record.key(), headers=record.headers() or None
                )
            after = {(r.topic(), r.partition()): r.offset() + 1 for r in records}
            producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in after.items()],
                consumer.consumer_group_metadata(),
                30,
            )
            producer.commit_transaction(30)
    finally:
        consumer.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eos_copy", description=__doc__)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--group", required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    copy(args.bootstrap_servers, args.source, args.sink, args.group, stop)


if __name__ == "__main__":
    main()
