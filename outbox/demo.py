"""``outbox demo``: the main job, end to end on embedded defaults.

Today it proves the foundation: it starts a real local Kafka broker, creates the
outbox topics, writes one record of every protocol kind (the real record and
its op in one Kafka transaction, as a commit does), reads them all back with a
``read_committed`` consumer and decodes them. It exits non-zero if anything
does not round-trip. Later parts (producer, checker, sink) extend this job.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.console import make_console
from outbox.dev.kafka import LocalKafka, ensure_kafka_jars
from outbox.protocol import (
    CheckRequest,
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    OpRecord,
    OutgoingRecord,
    RawRecord,
    RealRecord,
    Resolution,
    TopicNames,
    half_partition_for,
    new_transaction_id,
)
from outbox.reading import read_topic

PARTITIONS = 3
GROUP = "demo-orders"
REAL_TOPIC = "demo.order-events"


@dataclass(frozen=True)
class Row:
    kind: str
    topic: str
    partition: int
    offset: int
    transaction_id: str
    ok: bool


def _now_ms() -> int:
    return int(time.time() * 1000)


def _step(console: Console, text: str) -> None:
    console.print(f"[bold cyan]==>[/] {text}")


def _produce(bootstrap: str, records: list[OutgoingRecord], transactional: bool) -> None:
    config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    if transactional:
        config["transactional.id"] = f"outbox-demo-{new_transaction_id()}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    for record in records:
        producer.produce(**record.produce_kwargs())
    if transactional:
        producer.commit_transaction(30)
    elif producer.flush(30) > 0:
        raise RuntimeError("records were not acknowledged within 30s")


def run(console: Console) -> int:
    topics = TopicNames("demo")
    _step(console, "resolving the Kafka broker jars (cached after the first run)")
    ensure_kafka_jars()
    _step(console, "starting a local Apache Kafka broker (KRaft, one node)")
    with LocalKafka() as kafka:
        bootstrap = kafka.bootstrap_servers
        console.print(f"    broker up at {bootstrap} in {kafka.last_start_seconds:.1f}s")
        _step(console, f"creating topics with prefix {topics.prefix!r}, {PARTITIONS} partitions")
        specs = [
            *plan_topics(topics, PARTITIONS, 1, (GROUP,)),
            TopicSpec(REAL_TOPIC, PARTITIONS, 1),
        ]
        ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), specs)

        _step(console, "writing one record of each kind")
        half = HalfRecord(
            transaction_id=new_transaction_id(),
            producer_group=GROUP,
            real_topic=REAL_TOPIC,
            key=b"order-1",
            value=b'{"order": 1, "total": 42}',
            born_ms=_now_ms(),
            user_headers=[("source", b"demo")],
        )
        partition = half_partition_for(half.key, half.transaction_id, PARTITIONS)
        _produce(bootstrap, [half.to_record(topics, partition)], transactional=False)
        half_raw = read_topic({"bootstrap.servers": bootstrap}, topics.half)[0]
        op = OpRecord(
            half.transaction_id, GROUP, partition, half_raw.offset, Resolution.COMMIT, _now_ms()
        )
        # A commit: the restored real record and its op, in one Kafka transaction.
        _produce(bootstrap, [half.to_real_record(), op.to_record(topics)], transactional=True)
        check = CheckRequest(half.put_back(), partition, half_raw.offset, _now_ms())
        discard = DiscardRecord.of_half(half_raw, DiscardReason.CHECK_MAX, _now_ms(), "demo")
        _produce(bootstrap, [check.to_record(topics), discard.to_record(topics)], False)

        _step(console, "reading everything back (read_committed) and decoding it")
        # Each kind decoded by its own decoder, down to the transaction id it carries.
        decoders: list[tuple[str, str, Callable[[RawRecord], str]]] = [
            ("half", topics.half, lambda r: HalfRecord.from_record(r).transaction_id),
            ("real", REAL_TOPIC, lambda r: RealRecord.from_record(r).transaction_id),
            ("op", topics.op, lambda r: OpRecord.from_record(r).transaction_id),
            (
                "check",
                topics.check(GROUP),
                lambda r: CheckRequest.from_record(r).half.transaction_id,
            ),
            (
                "discard",
                topics.discard,
                lambda r: DiscardRecord.from_record(r).original_half().transaction_id,
            ),
        ]
        rows = []
        for kind, topic, transaction_id_of in decoders:
            for raw in read_topic({"bootstrap.servers": bootstrap}, topic):
                txid = transaction_id_of(raw)
                ok = txid == half.transaction_id
                rows.append(Row(kind, topic, raw.partition, raw.offset, txid, ok))

    table = Table(title="records written and read back")
    for column in ("kind", "topic", "partition", "offset", "transaction id", "round trip"):
        table.add_column(column)
    for row in rows:
        mark = "[green]ok[/]" if row.ok else "[red]MISMATCH[/]"
        table.add_row(
            row.kind, row.topic, str(row.partition), str(row.offset), row.transaction_id, mark
        )
    console.print(table)
    kinds = {row.kind for row in rows if row.ok}
    passed = len(rows) == len(decoders) and kinds == {k for k, _, _ in decoders}
    console.print(
        f"demo: kinds={len(decoders)} written={len(decoders)} read_back={len(rows)} "
        f"round_trip={'ok' if passed else 'FAILED'}",
        highlight=False,
    )
    return 0 if passed else 1


def main() -> None:
    sys.exit(run(make_console()))
